"""STREAM-like bandwidth measurement, run in the same process as the benchmarks.

``measure()`` builds ``stream.c`` (OpenMP, same flags as the baselines),
allocates three float64 arrays much larger than the last-level cache,
initialises them in parallel (first touch), and reports the best-of-N
bandwidth in GB/s (1e9 bytes/s) of the triad ``a = b + s*c`` (24 bytes per
element, STREAM's convention: write-allocate traffic not counted), and also
of copy (16 B/elt) and a read-only sum (8 B/elt).

``Triad(nbytes)`` is one triad over three arrays of ``nbytes`` in all, a callable that
``run.py`` times in the same interleaved rounds as a case's kernels: the bandwidth the
memory system gave while they ran, where ``measure()`` gives its best at other moments.

Run directly: ``python benchmarks/stream.py [--mib 256]``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import cbuild

CDEF = """
void stream_init(double *a, double *b, double *c, int64_t n);
void stream_triad(double *a, const double *b, const double *c, double s, int64_t n);
void stream_copy(double *a, const double *b, int64_t n);
double stream_sum(const double *b, int64_t n);
"""


_lib = None


def _stream_lib() -> cbuild.CLib:
    """``stream.c``, built and loaded once per process."""
    global _lib
    if _lib is None:
        _lib = cbuild.CLib(cbuild.HERE / "stream.c", CDEF)
    return _lib


class Triad:
    """One STREAM triad ``a = b + 3 c`` per call, over three float64 arrays of ``nbytes``
    bytes in all (rounded down to whole elements, at least one each), initialised in
    parallel (first touch). ``nbytes`` is counted as STREAM counts it: no write-allocate
    traffic, as a case's minimal traffic is."""

    def __init__(self, nbytes: int):
        lib = _stream_lib()
        self.n = max(1, nbytes // 24)
        self.nbytes = 24 * self.n
        self.a, self.b, self.c = (np.empty(self.n) for _ in range(3))
        self.lib = lib.lib
        self.ptrs = tuple(lib.ptr(v, "double") for v in (self.a, self.b, self.c))
        self.lib.stream_init(*self.ptrs, self.n)

    def __call__(self) -> None:
        self.lib.stream_triad(*self.ptrs, 3.0, self.n)

    def gbs(self, seconds: float) -> float:
        """The bandwidth (GB/s) of a triad that took ``seconds``."""
        return self.nbytes / seconds / 1e9


def measure(mib_per_array: int = 256, repeats: int = 10) -> dict:
    """Best-of-``repeats`` GB/s for triad, copy and sum; keys 'triad', 'copy', 'sum'."""
    triad = Triad(3 * mib_per_array * (1 << 20))
    lib, (pa_, pb, _), n = triad.lib, triad.ptrs, triad.n
    best = {"triad": 0.0, "copy": 0.0, "sum": 0.0}
    for _ in range(repeats):
        for name, call, nbytes in (
                ("triad", triad, 24 * n),
                ("copy", lambda: lib.stream_copy(pa_, pb, n), 16 * n),
                ("sum", lambda: lib.stream_sum(pb, n), 8 * n)):
            t = time.perf_counter()
            call()
            dt = time.perf_counter() - t
            best[name] = max(best[name], nbytes / dt / 1e9)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256, help="MiB per array (default 256)")
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    bw = measure(args.mib, args.repeats)
    print("  ".join(f"{k} {v:.1f} GB/s" for k, v in bw.items()))


if __name__ == "__main__":
    main()
