#!/usr/bin/env python
"""PolyBench/C kernels: polyad at 2 threads against gcc -O3 (sequential) and LLVM Polly.

    python benchmarks/polybench.py                 # bench sizes, median of 5
    python benchmarks/polybench.py --quick         # smaller sizes, median of 3
    python benchmarks/polybench.py --only atax floyd-warshall --repeat 9
    python benchmarks/polybench.py --check         # only compare outputs at small sizes

Each kernel is written twice for the project: in C (``tests/c_corpus/<name>.c``,
PolyBench/C 4.2's statements) and in the DSL (``tests/c_corpus/polybench_dsl.py``).
Three rows are reverse-mode derivatives (``pa.vjp`` with respect to an input)
against hand-written sequential C adjoints (``tests/c_corpus/polybench_adjoints.c``);
both write the cotangent into a preallocated array (polyad's ``d_<input>``).

Before timing, every row is checked at small sizes (and again at the timed sizes):
polyad's outputs must equal gcc's to a relative 1e-9 (the parallel build may
sum in another order). Columns (median, or --stat min, of --repeat runs; inputs
restored before every run, untimed):

  gcc      the C built by ``gcc -O3 -march=native`` (no OpenMP), one thread
  polly    the C built by ``clang-14 -O3 -march=native -mllvm -polly -mllvm
           -polly-parallel`` (LLVM's polyhedral optimizer, OpenMP), 2 threads;
           ``-`` when ``clang-14`` is not on PATH
  polyad   polyad's OpenMP build, 2 threads
  gcc/pa, polly/pa  speedups of polyad (above 1: polyad is faster)

The last line is the geometric mean of gcc/pa (and polly/pa).
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import shutil
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

os.environ.setdefault("OMP_NUM_THREADS", "2")  # Polly's runtime reads it; polyad too

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
if importlib.util.find_spec("polyad") is None:
    sys.path.insert(0, str(ROOT))

import cffi  # noqa: E402
import numpy as np  # noqa: E402

import polyad as pa  # noqa: E402
from c_corpus import polybench_dsl as dsl  # noqa: E402
from c_corpus.reference import gcc_build  # noqa: E402

CORPUS = ROOT / "tests" / "c_corpus"
POLLY = "clang-14"
POLLY_FLAGS = ["-O3", "-march=native", "-std=c99", "-fPIC", "-shared",
               "-mllvm", "-polly", "-mllvm", "-polly-parallel", "-lgomp"]
THREADS = 2

_ffi = cffi.FFI()
_ffi.cdef("void omp_set_num_threads(int); int omp_get_max_threads(void);")
_gomp = _ffi.dlopen("libgomp.so.1")


def _r(rng, *shape):
    return rng.standard_normal(shape)


def _spd(rng, n):
    b = rng.random((n, n))
    return b @ b.T / n + n * np.eye(n)


def _unit(rng, *shape):
    return rng.random(shape)


@dataclass
class Bench:
    """One row: a DSL kernel (or its vjp) and the C function it is checked and timed against.

    ``make(rng, d)``: the arguments by C parameter name (DSL parameters share the
    names; ``d`` the dimensions, C's int parameters among them). ``sizes``: DSL
    size -> dimension for sizes no array shape gives. ``defines``: C macros ->
    dimension (files that take sizes as #defines). ``wrt``: a vjp row, the input
    differentiated; its cotangents are the arguments ``<output>_bar`` and the C
    function leaves the result in ``<wrt>_bar``.
    """

    name: str
    kernel: str
    cfile: str
    cfunc: str
    make: Callable
    bench: dict
    quick: dict
    small: dict
    sizes: dict = field(default_factory=dict)
    defines: dict = field(default_factory=dict)
    wrt: Optional[str] = None

    def c_build(self, dims, cc="gcc", flags=None):
        return gcc_build(CORPUS / self.cfile, {m: dims[d] for m, d in self.defines.items()},
                         flags, cc)

    def size_keywords(self, dims) -> dict:
        return {s: dims[d] for s, d in self.sizes.items()}


def _gemm(g, d):
    return dict(ni=d["ni"], nj=d["nj"], nk=d["nk"], alpha=1.5, beta=1.2, C=_r(g, d["ni"], d["nj"]),
                A=_r(g, d["ni"], d["nk"]), B=_r(g, d["nk"], d["nj"]))


def _gemm_vjp(g, d):
    a = _gemm(g, d)
    a["C_bar"] = _r(g, d["ni"], d["nj"])
    a["A_bar"] = np.zeros((d["ni"], d["nk"]))
    return a


def _mvt(g, d):
    n = d["n"]
    return dict(n=n, x1=_r(g, n), x2=_r(g, n), y_1=_r(g, n), y_2=_r(g, n), A=_r(g, n, n))


def _mvt_vjp(g, d):
    a = _mvt(g, d)
    n = d["n"]
    a.update(x1_bar=_r(g, n), x2_bar=_r(g, n), A_bar=np.zeros((n, n)))
    return a


def _jacobi(g, d):
    n = d["n"]
    return dict(tsteps=d["tsteps"], n=n, A=_r(g, n, n), B=_r(g, n, n))


def _jacobi_vjp(g, d):
    a = _jacobi(g, d)
    n = d["n"]
    a.update(A_bar=_r(g, n, n), B_bar=_r(g, n, n))
    return a


BENCHES = [
    Bench("seidel-2d", "seidel_2d", "seidel-2d.c", "kernel_seidel_2d",
          lambda g, d: dict(tsteps=d["tsteps"], n=d["n"], A=_r(g, d["n"], d["n"])),
          dict(tsteps=40, n=2000), dict(tsteps=10, n=1000), dict(tsteps=3, n=9),
          sizes={"TSTEPS": "tsteps"}),
    Bench("lu", "lu", "lu.c", "kernel_lu", lambda g, d: dict(n=d["n"], A=_spd(g, d["n"])),
          dict(n=1200), dict(n=600), dict(n=8)),
    Bench("jacobi-2d", "jacobi_2d", "jacobi-2d.c", "kernel_jacobi_2d", _jacobi,
          dict(tsteps=100, n=1300), dict(tsteps=20, n=650), dict(tsteps=3, n=10),
          sizes={"TSTEPS": "tsteps"}, defines={"N": "n", "TSTEPS": "tsteps"}),
    Bench("gemm", "gemm", "gemm.c", "kernel_gemm", _gemm,
          dict(ni=1000, nj=1100, nk=1200), dict(ni=500, nj=550, nk=600), dict(ni=7, nj=6, nk=5)),
    Bench("2mm", "mm2", "2mm.c", "kernel_2mm",
          lambda g, d: dict(ni=d["ni"], nj=d["nj"], nk=d["nk"], nl=d["nl"], alpha=1.5, beta=1.2,
                            tmp=np.zeros((d["ni"], d["nj"])), A=_r(g, d["ni"], d["nk"]),
                            B=_r(g, d["nk"], d["nj"]), C=_r(g, d["nj"], d["nl"]),
                            D=_r(g, d["ni"], d["nl"])),
          dict(ni=800, nj=900, nk=1100, nl=1200), dict(ni=400, nj=450, nk=550, nl=600),
          dict(ni=5, nj=6, nk=7, nl=4)),
    Bench("syrk", "syrk", "syrk.c", "kernel_syrk",
          lambda g, d: dict(n=d["n"], m=d["m"], alpha=1.5, beta=1.2, C=_r(g, d["n"], d["n"]),
                            A=_r(g, d["n"], d["m"])),
          dict(n=1200, m=1000), dict(n=600, m=500), dict(n=7, m=5)),
    Bench("covariance", "covariance", "covariance.c", "kernel_covariance",
          lambda g, d: dict(m=d["m"], n=d["n"], float_n=float(d["n"]),
                            data=_r(g, d["n"], d["m"]), cov=np.zeros((d["m"], d["m"])),
                            mean=np.zeros(d["m"])),
          dict(m=800, n=1000), dict(m=400, n=500), dict(m=5, n=7)),
    Bench("cholesky", "cholesky", "cholesky.c", "kernel_cholesky",
          lambda g, d: dict(n=d["n"], A=_spd(g, d["n"])),
          dict(n=1600), dict(n=800), dict(n=8)),
    Bench("trisolv", "trisolv", "trisolv.c", "kernel_trisolv",
          lambda g, d: dict(n=d["n"], L=np.tril(_unit(g, d["n"], d["n"])) / d["n"]
                            + np.eye(d["n"]), x=np.zeros(d["n"]), b=_r(g, d["n"])),
          dict(n=6000), dict(n=3000), dict(n=9)),
    Bench("atax", "atax", "atax.c", "kernel_atax",
          lambda g, d: dict(m=d["m"], n=d["n"], A=_r(g, d["m"], d["n"]), x=_r(g, d["n"]),
                            y=np.zeros(d["n"]), tmp=np.zeros(d["m"])),
          dict(m=3800, n=4200), dict(m=1900, n=2100), dict(m=6, n=8)),
    Bench("bicg", "bicg", "bicg.c", "kernel_bicg",
          lambda g, d: dict(m=d["m"], n=d["n"], A=_r(g, d["n"], d["m"]), s=np.zeros(d["m"]),
                            q=np.zeros(d["n"]), p=_r(g, d["m"]), r=_r(g, d["n"])),
          dict(m=3800, n=4200), dict(m=1900, n=2100), dict(m=6, n=8)),
    Bench("mvt", "mvt", "mvt.c", "kernel_mvt", _mvt, dict(n=4000), dict(n=2000), dict(n=9)),
    Bench("gemver", "gemver", "gemver.c", "kernel_gemver",
          lambda g, d: dict(n=d["n"], alpha=1.5, beta=1.2, A=_r(g, d["n"], d["n"]),
                            **{v: _r(g, d["n"]) for v in ("u1", "v1", "u2", "v2", "w", "x", "y",
                                                          "z")}),
          dict(n=4000), dict(n=2000), dict(n=9)),
    Bench("doitgen", "doitgen", "doitgen.c", "kernel_doitgen",
          lambda g, d: dict(nr=d["nr"], nq=d["nq"], np=d["np"],
                            A=_r(g, d["nr"], d["nq"], d["np"]), C4=_r(g, d["np"], d["np"]),
                            sum=np.zeros(d["np"])),
          dict(nr=150, nq=140, np=160), dict(nr=75, nq=70, np=80), dict(nr=3, nq=4, np=5)),
    Bench("floyd-warshall", "floyd_warshall", "floyd-warshall.c", "kernel_floyd_warshall",
          lambda g, d: dict(n=d["n"], path=_unit(g, d["n"], d["n"]) * 10.0),
          dict(n=800), dict(n=400), dict(n=9)),
    Bench("heat-3d", "heat_3d", "heat-3d.c", "kernel_heat_3d",
          lambda g, d: dict(tsteps=d["tsteps"], n=d["n"], A=_r(g, d["n"], d["n"], d["n"]),
                            B=_r(g, d["n"], d["n"], d["n"])),
          dict(tsteps=100, n=120), dict(tsteps=20, n=60), dict(tsteps=3, n=6),
          sizes={"TSTEPS": "tsteps"}),
    Bench("fdtd-2d", "fdtd_2d", "fdtd-2d.c", "kernel_fdtd_2d",
          lambda g, d: dict(tmax=d["tmax"], nx=d["nx"], ny=d["ny"], ex=_r(g, d["nx"], d["ny"]),
                            ey=_r(g, d["nx"], d["ny"]), hz=_r(g, d["nx"], d["ny"]),
                            _fict_=_r(g, d["tmax"])),
          dict(tmax=100, nx=1000, ny=1200), dict(tmax=20, nx=500, ny=600),
          dict(tmax=3, nx=7, ny=8)),
    Bench("gemm vjp A", "gemm", "polybench_adjoints.c", "vjp_gemm_A", _gemm_vjp,
          dict(ni=1000, nj=1100, nk=1200), dict(ni=500, nj=550, nk=600),
          dict(ni=7, nj=6, nk=5), wrt="A"),
    Bench("mvt vjp A", "mvt", "polybench_adjoints.c", "vjp_mvt_A", _mvt_vjp,
          dict(n=4000), dict(n=2000), dict(n=9), wrt="A"),
    Bench("jacobi-2d vjp A", "jacobi_2d", "polybench_adjoints.c", "vjp_jacobi_2d_A", _jacobi_vjp,
          dict(tsteps=100, n=1300), dict(tsteps=20, n=650), dict(tsteps=3, n=10),
          sizes={"TSTEPS": "tsteps"}, wrt="A"),
]


def copy(args: dict) -> dict:
    return {n: v.copy() if isinstance(v, np.ndarray) else v for n, v in args.items()}


class Row:
    """The three implementations of one bench at one size, each ``run(args) -> outputs``."""

    def __init__(self, b: Bench, dims: dict, polly: bool, tile=None):
        self.b, self.dims = b, dims
        k = getattr(dsl, b.kernel)
        self.kernel = k
        self.kw = b.size_keywords(dims)
        gcc = b.c_build(dims)
        self.c = {"gcc": gcc}
        if polly:
            self.c["polly"] = b.c_build(dims, POLLY, POLLY_FLAGS)
        if b.wrt is None:
            self.outputs = [p.name for p in k.ir.params if p.is_array and p.intent != "in"]
            self.fn = k
            self.pa_args = [p.name for p in k.ir.params]
        else:
            outs = [p.name for p in k.ir.params if p.is_array and p.intent != "in"]
            self.outputs = [b.wrt + "_bar"]
            self.fn = pa.vjp(k, wrt=b.wrt)
            self.pa_args = [p.name for p in k.ir.params] + [o + "_bar" for o in outs]
        if tile is not None:
            self.fn = self.fn.compile(tile=tile)
        self.d_out = None

    def run_c(self, which: str, a: dict) -> dict:
        self.c[which].call(self.b.cfunc, a)
        return {o: a[o] for o in self.outputs}

    def run_polyad(self, a: dict) -> dict:
        if self.b.wrt is not None:
            # the cotangent goes into a preallocated array (polyad's output parameter
            # d_<wrt>), as the C adjoint writes its own: neither pays for allocating it.
            # The C's array itself, unless it is also an input (an in-out array's
            # cotangent, jacobi-2d's A_bar): then one array kept for all runs
            name = self.outputs[0]
            if name in self.pa_args:
                if self.d_out is None or self.d_out.shape != a[name].shape:
                    self.d_out = np.zeros_like(a[name])
                target = self.d_out
            else:
                target = a[name]
            out = {"d_" + self.b.wrt: target}
            return {name: self.fn(*[a[n] for n in self.pa_args], **self.kw, **out)}
        self.fn(*[a[n] for n in self.pa_args], **self.kw)
        return {o: a[o] for o in self.outputs}


def rel_err(x, y) -> float:
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    return float(np.max(np.abs(x - y)) / max(1e-300, float(np.max(np.abs(y)))))


def compare(row: Row, args: dict) -> dict:
    """Run every implementation once on ``args``: the largest relative difference from gcc."""
    ref = row.run_c("gcc", copy(args))
    errs = {"polyad": max(rel_err(v, ref[o]) for o, v in row.run_polyad(copy(args)).items())}
    if "polly" in row.c:
        errs["polly"] = max(rel_err(v, ref[o]) for o, v in row.run_c("polly", copy(args)).items())
    return errs


STAT = {"median": statistics.median, "min": min}


def timed(fn, args: dict, repeat: int, stat: str) -> float:
    times = []
    for _ in range(repeat):
        a = copy(args)
        t0 = time.perf_counter()
        fn(a)
        times.append(time.perf_counter() - t0)
    return STAT[stat](times)


TOLERANCE = 1e-9


def check(b: Bench, polly: bool, tile=None) -> dict:
    row = Row(b, b.small, polly, tile)
    errs = compare(row, b.make(np.random.default_rng(3), b.small))
    bad = {k: e for k, e in errs.items() if not e <= TOLERANCE}
    if bad:
        raise AssertionError(f"{b.name}: outputs differ from gcc's at {b.small}: {bad}")
    return errs


def measure(b: Bench, dims: dict, repeat: int, stat: str, polly: bool, tile=None) -> dict:
    row = Row(b, dims, polly, tile)
    args = b.make(np.random.default_rng(1), dims)
    errs = compare(row, args)  # also compiles polyad's kernel
    out = {"err": errs["polyad"]}
    _gomp.omp_set_num_threads(1)
    out["gcc"] = timed(lambda a: row.run_c("gcc", a), args, repeat, stat)
    _gomp.omp_set_num_threads(THREADS)
    if polly:
        out["polly"] = timed(lambda a: row.run_c("polly", a), args, repeat, stat)
    out["polyad"] = timed(row.run_polyad, args, repeat, stat)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes, median of 3")
    ap.add_argument("--check", action="store_true", help="only compare outputs at small sizes")
    ap.add_argument("--repeat", type=int, default=None, help="runs per median (default 5)")
    ap.add_argument("--stat", choices=sorted(STAT), default="median")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="these rows only (names as printed)")
    ap.add_argument("--no-polly", action="store_true", help="skip the Polly column")
    ap.add_argument("--tile", default=None, metavar="off|T,T,...",
                    help="polyad's tile option: off (tile=False) or sizes (default: the "
                         "cache model's)")
    args = ap.parse_args(argv)
    tile = (None if args.tile is None else False if args.tile == "off"
            else tuple(int(t) for t in args.tile.split(",")))
    polly = shutil.which(POLLY) is not None and not args.no_polly
    benches = [b for b in BENCHES if not args.only or b.name in args.only]
    for b in benches:
        check(b, polly, tile)
    print(f"checked {len(benches)} kernels against gcc at small sizes"
          f"{' (and Polly)' if polly else ''}: outputs equal to {TOLERANCE:g}")
    if args.check:
        return
    repeat = args.repeat or (3 if args.quick else 5)
    print(f"PolyBench: polyad ({THREADS} threads) vs gcc -O3 -march=native sequential"
          f"{' and clang-14 Polly (' + str(THREADS) + ' threads)' if polly else ' (no clang-14: no Polly column)'}; "
          f"{args.stat} of {repeat}; tile {args.tile or 'model'}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    head = (f"| {'kernel':<16} | {'sizes':<30} | {'gcc s':>8} | {'polly s':>8} | {'polyad s':>8} "
            f"| {'gcc/pa':>6} | {'polly/pa':>8} | {'err':>7} |")
    print(head)
    print("|" + "|".join("-" * (len(c)) for c in head.split("|")[1:-1]) + "|")
    speed_gcc, speed_polly = [], []
    for b in benches:
        dims = b.quick if args.quick else b.bench
        text = " ".join(f"{n}={v}" for n, v in dims.items())
        r = measure(b, dims, repeat, args.stat, polly, tile)
        speed_gcc.append(r["gcc"] / r["polyad"])
        pol = f"{r['polly']:8.4f}" if polly else f"{'-':>8}"
        pol_ratio = f"{r['polly'] / r['polyad']:8.2f}" if polly else f"{'-':>8}"
        if polly:
            speed_polly.append(r["polly"] / r["polyad"])
        print(f"| {b.name:<16} | {text:<30} | {r['gcc']:8.4f} | {pol} | {r['polyad']:8.4f} "
              f"| {r['gcc'] / r['polyad']:6.2f} | {pol_ratio} | {r['err']:7.1e} |", flush=True)

    def geo(xs):
        return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")
    print(f"geometric mean speedup of polyad: {geo(speed_gcc):.2f}x over gcc"
          + (f", {geo(speed_polly):.2f}x over Polly" if polly else ""))


if __name__ == "__main__":
    main()
