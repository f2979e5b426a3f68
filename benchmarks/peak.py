"""The machine's multiply-add peak, run in the same process as the benchmarks.

``measure()`` builds ``peak.c`` with polyad's flags, its chains sized for the host's
vector unit (``polyad.schedule.machine.host_vector_unit``: half its registers, each a
vector of lanes), and reports the best-of-N rate in GFLOP/s (a multiply-add counts as
two operations) of float32 and float64 multiply-adds on every thread. The conv layer's
kernels make more multiply-adds than memory traffic; ``run.py`` gives their share of
this peak beside their share of the STREAM triad.

Run directly: ``python benchmarks/peak.py``.
"""

from __future__ import annotations

import time

import cbuild
from polyad.schedule.machine import host_vector_unit

CDEF = """
int peak_threads(void);
double peak_f32(int64_t n);
double peak_f64(int64_t n);
"""

BITS = {"f32": 32, "f64": 64}

_built = None


def lanes() -> dict:
    """The independent chains per thread, by dtype: half the host's vector registers,
    each a vector of lanes (8 vectors of 8 floats on AVX2)."""
    unit = host_vector_unit()
    return {dt: unit.registers // 2 * max(1, unit.bits // bits) for dt, bits in BITS.items()}


def _peak_lib() -> tuple:
    """(``peak.c`` built for the host and loaded, its chains per thread by dtype), once
    per process."""
    global _built
    if _built is None:
        n = lanes()
        _built = (cbuild.CLib(cbuild.HERE / "peak.c", CDEF, defines=(
            f"PEAK_LANES_F32={n['f32']}", f"PEAK_LANES_F64={n['f64']}")).lib, n)
    return _built


def threads() -> int:
    """The threads ``measure`` runs its chains on (OpenMP's)."""
    return _peak_lib()[0].peak_threads()


def measure(repeats: int = 5, seconds: float = 0.05) -> dict:
    """Best-of-``repeats`` GFLOP/s of multiply-adds on every thread; keys 'f32', 'f64'.
    Each repeat runs about ``seconds``."""
    lib, n = _peak_lib()
    best = {}
    for dt, fn in (("f32", lib.peak_f32), ("f64", lib.peak_f64)):
        steps = 1000
        while True:  # enough steps for a measurable time
            t = time.perf_counter()
            fn(steps)
            elapsed = time.perf_counter() - t
            if elapsed > seconds / 4 or steps > 1 << 34:
                break
            steps *= 4
        rates = []
        chains = n[dt] * threads()
        for _ in range(repeats):
            t = time.perf_counter()
            fn(steps)
            rates.append(2 * steps * chains / (time.perf_counter() - t) / 1e9)
        best[dt] = max(rates)
    return best


if __name__ == "__main__":
    rates = measure()
    n = lanes()
    print(f"multiply-add peak, {threads()} threads, {n['f32']} float32 / "
          f"{n['f64']} float64 chains per thread ({host_vector_unit()}): float32 "
          f"{rates['f32']:.1f} GFLOP/s, float64 {rates['f64']:.1f} GFLOP/s")
