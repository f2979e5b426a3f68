"""Per-call overhead of cached polyad kernels on tiny arrays (issue 20).

Every kernel here is compiled (and cached) before timing starts; what is
timed is the Python side of a call: binding and checking the arguments,
allocating omitted outputs, the cffi call and packaging the result. The
arrays have 16 elements, so the C work itself is a few nanoseconds.
Baselines, in the same run: the same C function of ``axpy`` called through
cffi with pointers cast once (``raw cffi, pre-cast``) and with
``ffi.from_buffer`` per call, and ``numpy.dot(x, x)``.

Run: ``python benchmarks/overhead.py [--threads 1] [--calls 20000] [--repeats 7]
[--clock cpu|wall]``. ``--threads`` sets ``OMP_NUM_THREADS`` before any kernel
library loads (default 1: the fork/join of a parallel region over 16 elements
is not the Python side's cost). ``--clock cpu`` (the default with one thread)
times with this thread's CPU time, which other processes on a shared machine
barely disturb; ``wall`` (the default with more threads, whose work a
thread's CPU clock misses) uses ``time.perf_counter``. Prints the median over
repeats of the time per call, and its ratio to the raw cffi call.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path


def _parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS (default 1)")
    ap.add_argument("--calls", type=int, default=20000, help="calls per timed repeat")
    ap.add_argument("--repeats", type=int, default=7, help="timed repeats (median reported)")
    ap.add_argument("--clock", choices=("cpu", "wall"), default=None,
                    help="cpu: this thread's CPU time (default with --threads 1); wall")
    args = ap.parse_args()
    if args.clock is None:
        args.clock = "cpu" if args.threads == 1 else "wall"
    return args


ARGS = _parse() if __name__ == "__main__" else None
if ARGS is not None:
    # libgomp reads it once, when the first kernel library is loaded.
    os.environ["OMP_NUM_THREADS"] = str(ARGS.threads)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import cffi  # noqa: E402
import numpy as np  # noqa: E402

import polyad as pa  # noqa: E402
from polyad.runtime.loader import c_prototype  # noqa: E402

M, N = pa.sizes("M N")


@pa.kernel
def axpy(x: pa.f64[N], y: pa.f64[N], a: pa.f64):
    for i in range(N):
        y[i] += a * x[i]


@pa.kernel
def ssq(x: pa.f64[N]) -> pa.f64:
    s = 0.0
    for i in range(N):
        s += x[i] * x[i]
    return s


@pa.kernel
def laplace(u: pa.f64[M, N].circular, v: pa.f64[M, N]):
    for m in range(M):
        for n in range(N):
            v[m, n] = u[m - 1, n] + u[m + 1, n] + u[m, n - 1] + u[m, n + 1] - 4.0 * u[m, n]


@pa.kernel
def scaled(x: pa.f64[N], y: pa.Out(pa.f64[N]), a: pa.f64):
    for i in range(N):
        y[i] = a * x[i]


CLOCKS = {"cpu": time.thread_time, "wall": time.perf_counter}


def per_call_us(call, calls: int, repeats: int, clock) -> float:
    """Median over ``repeats`` of the mean time of ``calls`` calls, in microseconds."""
    for _ in range(min(calls, 1000)):
        call()
    times = []
    for _ in range(repeats):
        t = clock()
        for _ in range(calls):
            call()
        times.append((clock() - t) / calls * 1e6)
    return statistics.median(times)


def rows(calls: int, repeats: int, clock=time.perf_counter) -> list[tuple[str, float]]:
    """(label, microseconds per call) for every entry of the table."""
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal(16), rng.standard_normal(16)
    u, v = rng.standard_normal((4, 4)), np.zeros((4, 4))
    out = np.zeros(16)
    grad_ssq = pa.grad(ssq, "x")

    compiled = pa.compile(axpy)
    ffi = cffi.FFI()
    ffi.cdef(c_prototype(compiled.signature))
    lib = ffi.dlopen(str(compiled.library))
    c_axpy = getattr(lib, compiled.signature.name)
    px, py = ffi.cast("double *", x.ctypes.data), ffi.cast("double *", y.ctypes.data)
    double_array = ffi.typeof("double[]")

    # Each polyad entry is checked against numpy once, so a fast wrong call cannot pass.
    y0 = y.copy()
    axpy(x, y, 0.5)
    assert np.allclose(y, y0 + 0.5 * x)
    assert np.isclose(ssq(x), x @ x)
    assert np.allclose(grad_ssq(x), 2 * x)
    laplace(u, v)
    assert np.allclose(v, sum(np.roll(u, s, axis) for s in (1, -1) for axis in (0, 1)) - 4 * u)
    assert np.allclose(scaled(x, a=2.0), 2 * x)

    entries = [
        ("axpy(x, y, a)", lambda: axpy(x, y, 1e-9)),
        ("axpy(x, y=y, a=a) (keywords)", lambda: axpy(x, y=y, a=1e-9)),
        ("ssq(x) -> float", lambda: ssq(x)),
        ("pa.grad(ssq, 'x')(x)", lambda: grad_ssq(x)),
        ("laplace(u, v) 4x4, circular", lambda: laplace(u, v)),
        ("scaled(x, a=2.0), pa.Out allocated", lambda: scaled(x, a=2.0)),
        ("scaled(x, out, 2.0), pa.Out given", lambda: scaled(x, out, 2.0)),
        ("raw cffi axpy, pre-cast pointers", lambda: c_axpy(px, py, 1e-9, 16)),
        ("cffi axpy, from_buffer per call",
         lambda: c_axpy(ffi.from_buffer(double_array, x), ffi.from_buffer(double_array, y),
                        1e-9, 16)),
        ("numpy.dot(x, x)", lambda: np.dot(x, x)),
    ]
    return [(label, per_call_us(call, calls, repeats, clock)) for label, call in entries]


def main() -> None:
    table = rows(ARGS.calls, ARGS.repeats, CLOCKS[ARGS.clock])
    raw = dict(table)["raw cffi axpy, pre-cast pointers"]
    print(f"per-call time ({ARGS.clock} clock), 16-element arrays, "
          f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}, median of {ARGS.repeats} x "
          f"{ARGS.calls} calls")
    width = max(len(label) for label, _ in table)
    print(f"{'call':<{width}}  {'us/call':>8}  {'x raw cffi':>10}")
    for label, us in table:
        print(f"{label:<{width}}  {us:8.2f}  {us / raw:10.1f}")


if __name__ == "__main__":
    main()
