#!/usr/bin/env python
"""The C corpus (tests/c_corpus, issue 11): polyad's parallel build of each C
function against gcc's sequential build of the same file, and the cost of its
derivative.

    python benchmarks/c_corpus.py                 # every corpus function, bench sizes
    python benchmarks/c_corpus.py --quick         # sizes / 4 per dimension, 3 repeats
    python benchmarks/c_corpus.py --only kernel_gemm tv_cost

Columns (medians, or --stat min, of --repeat runs; inputs restored before every run,
untimed):
  gcc       the .c file compiled by ``gcc -O3 -march=native`` (no OpenMP), via cffi
  1T, 2T    polyad's OpenMP build run with 1 and 2 threads (omp_set_num_threads)
  x1T, x2T  speedup over gcc: gcc time / polyad time
  grad      pa.grad of a scalar function (wrt the case's parameter), else
            pa.vjp with respect to its first read-only floating-point array (else its
            first read one), cotangents random, 1 thread
  grad/pr   grad time / polyad 1T time of the same function (one thread each: the
            ratio of work, undisturbed by how well two threads get scheduled)
  err       max relative difference of polyad's results from gcc's
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
if importlib.util.find_spec("polyad") is None:
    sys.path.insert(0, str(ROOT))

import cffi  # noqa: E402
import numpy as np  # noqa: E402

import polyad as pa  # noqa: E402
from c_corpus.cases import CASES  # noqa: E402
from c_corpus.reference import gcc_build  # noqa: E402

_ffi = cffi.FFI()
_ffi.cdef("void omp_set_num_threads(int); int omp_get_max_threads(void);")
_gomp = _ffi.dlopen("libgomp.so.1")


def copy(args):
    return {n: v.copy() if isinstance(v, np.ndarray) else v for n, v in args.items()}


STAT = {"median": statistics.median, "min": min}


def timed(fn, args, repeat, stat="median"):
    times = []
    for _ in range(repeat):
        a = copy(args)
        t0 = time.perf_counter()
        fn(a)
        times.append(time.perf_counter() - t0)
    return STAT[stat](times)


def derivative(case, k, args):
    """The derivative run timed for a case: (kernel, positional args builder, label)."""
    if case.wrt:
        return pa.grad(k, wrt=case.wrt), (lambda a: [a[p.name] for p in k.ir.params]), "grad"
    read = {ld.array for st in k.ir.statements for ld in st.reads()}
    candidates = [p for p in k.ir.params if p.is_array and p.type.dtype.is_float
                  and p.name in read]
    wrt = next((p for p in candidates if p.intent == "in"), candidates[0]).name
    outs = [p for p in k.ir.params if p.is_array and p.intent != "in"]
    rng = np.random.default_rng(9)
    bars = {p.name: rng.standard_normal(args[p.name].shape).astype(args[p.name].dtype)
            for p in outs}

    def positional(a):
        return [a[p.name] for p in k.ir.params] + [bars[p.name] for p in outs]
    return pa.vjp(k, wrt=wrt), positional, f"vjp {wrt}"


def rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(1e-300, float(np.max(np.abs(b)))))


def run_case(case, dims, repeat, stat):
    args = case.make(np.random.default_rng(1), dims)
    ref = gcc_build(case.path, case.defines(dims))
    k = pa.from_c(case.path, case.func, sizes=case.macros or None)
    kw = case.size_keywords(dims)

    def polyad_call(a):
        return k(*[a[p.name] for p in k.ir.params], **kw)

    def gcc_call(a):
        return ref.call(case.func, a)

    ra, pa_args = copy(args), copy(args)
    r_ref, r_pa = gcc_call(ra), polyad_call(pa_args)  # also compiles
    err = rel_err(r_pa, r_ref) if r_ref is not None else 0.0
    for n, v in ra.items():
        if isinstance(v, np.ndarray):
            err = max(err, rel_err(pa_args[n], v))
    row = {"gcc": timed(gcc_call, args, repeat, stat)}
    for threads in (1, 2):
        _gomp.omp_set_num_threads(threads)
        row[f"{threads}T"] = timed(polyad_call, args, repeat, stat)
    dk, positional, label = derivative(case, k, args)
    dk(*positional(copy(args)), **kw)  # compile
    _gomp.omp_set_num_threads(1)
    row["grad"] = timed(lambda a: dk(*positional(a), **kw), args, repeat, stat)
    row["label"], row["err"] = label, err
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="sizes / 4 per dimension, 3 repeats")
    ap.add_argument("--repeat", type=int, default=None, help="runs per median (default 7)")
    ap.add_argument("--only", nargs="+", metavar="FUNCTION", help="these corpus functions only")
    ap.add_argument("--stat", choices=sorted(STAT), default="median",
                    help="median (default) or min of the runs (min: on a machine shared with "
                         "other work, the run least disturbed by it)")
    args = ap.parse_args(argv)
    repeat = args.repeat or (3 if args.quick else 7)
    cases = [c for c in CASES if not args.only or c.func in args.only]
    print(f"C corpus: polyad (OpenMP) vs gcc -O3 -march=native sequential; "
          f"{args.stat} of {repeat}; omp max threads {_gomp.omp_get_max_threads()}; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    head = (f"{'function':<20} {'dims':<34} {'gcc ms':>9} {'1T ms':>9} {'2T ms':>9} "
            f"{'x1T':>6} {'x2T':>6} {'grad1T ms':>9} {'grad/pr':>8}  {'err':>8}  derivative")
    print(head)
    print("-" * len(head))
    for case in cases:
        dims = dict(case.bench)
        if args.quick:
            dims = {n: (v if n in ("tsteps", "tmax") else max(4, v // 4)) for n, v in dims.items()}
        dim_text = " ".join(f"{n}={v}" for n, v in dims.items())
        try:
            r = run_case(case, dims, repeat, args.stat)
        except pa.PolyadError as exc:
            print(f"{case.func:<20} {dim_text:<34} FAILED: {str(exc).splitlines()[0]}")
            continue
        print(f"{case.func:<20} {dim_text:<34} {r['gcc'] * 1e3:9.2f} {r['1T'] * 1e3:9.2f} "
              f"{r['2T'] * 1e3:9.2f} {r['gcc'] / r['1T']:6.2f} {r['gcc'] / r['2T']:6.2f} "
              f"{r['grad'] * 1e3:9.2f} {r['grad'] / r['1T']:8.2f}  {r['err']:8.1e}  {r['label']}",
              flush=True)


if __name__ == "__main__":
    main()
