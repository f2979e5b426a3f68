#!/usr/bin/env python
"""polyad's kernels compiled with its C flags against the same C with a flag left out or
added: forward and gradient times, interleaved in one process.

    python benchmarks/flags.py --without=-fno-trapping-math [--bench conv deconv]
        [--sizes 2048] [--dtype f32 f64] [--rounds 15]
    python benchmarks/flags.py --with=-fno-tree-vectorize

(A flag is given with ``=``, since it starts with ``-``; each option may repeat.)

The generated C is the same for both builds (the pipeline runs once); only the C
compiler's command line differs (``polyad.runtime.toolchain.arithmetic_flags``, which
the compiled libraries' cache keys include). For each case (``benchmarks/suite.py``'s,
the inputs ``run.py`` times) it checks that both builds give bit-identical results, then
prints the median of ``--rounds`` interleaved rounds of each build, their ratio (the
changed build's time over polyad's as it is) and the gradient/forward ratio of each.
On a shared, noisy machine, differences of a few percent are within the noise; a case
whose machine code does not change at all shows how large it is.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
if importlib.util.find_spec("polyad") is None:  # a plain checkout, not pip-installed
    sys.path.insert(0, str(HERE.parent))

import polyad as pa  # noqa: E402
from polyad.runtime import toolchain  # noqa: E402
import kernels  # noqa: E402
import suite  # noqa: E402

BENCHES = ("tv", "deconv", "conv", "stencil3d")


def builds(case: suite.Case, changed_flags) -> dict:
    """{"as it is": (forward, gradient), "changed": (forward, gradient)}: compiled
    callables of the case's kernel and gradient, the second pair with the C compiler's
    arithmetic flags ``changed_flags(deterministic)``."""
    k = kernels.kernel(case.kernel, case.dtype)
    out = {}
    original = toolchain.arithmetic_flags
    for name, flags in (("as it is", original), ("changed", changed_flags)):
        toolchain.arithmetic_flags = flags
        try:
            # new Kernel objects: each compiles again (the pipeline's result comes from its
            # cache; the C compiler's command line keys the library)
            primal = pa.Kernel(ir_kernel=k.ir)
            gradient = pa.Kernel(ir_kernel=pa.grad(k, wrt=case.wrt_arg).ir)
            out[name] = (primal.compile(), gradient.compile())
        finally:
            toolchain.arithmetic_flags = original
    return out


def time_case(case: suite.Case, changed_flags, rounds: int) -> dict:
    """Median seconds {build: (forward, gradient)}, after checking both builds agree."""
    built = builds(case, changed_flags)
    outputs = {f"d_{w}": np.empty_like(case.inputs[i])
               for w, i in zip(case.wrt, case.wrt_index)}

    def grad_of(g):
        got = g(*case.inputs, **outputs)
        return [np.array(a, copy=True) for a in (got if isinstance(got, tuple) else (got,))]
    (f0, g0), (f1, g1) = built.values()
    same = f0(*case.inputs) == f1(*case.inputs) and all(
        np.array_equal(a, b) for a, b in zip(grad_of(g0), grad_of(g1)))
    if not same:
        print(f"  {case.bench} {case.shape} {case.dtype}: the builds' results differ")
    calls = {}
    for name, (f, g) in built.items():
        calls[name, "forward"] = lambda f=f: f(*case.inputs)
        calls[name, "gradient"] = lambda g=g: g(*case.inputs, **outputs)
    times = suite.Timer(rounds, budget_s=float("inf")).run(calls)
    return {name: (times[name, "forward"][0], times[name, "gradient"][0]) for name in built}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--without", action="append", default=[], metavar="FLAG",
                    help="a flag of polyad's arithmetic flags to leave out (--without=FLAG)")
    ap.add_argument("--with", dest="extra", action="append", default=[], metavar="FLAG",
                    help="a flag to add (--with=FLAG)")
    ap.add_argument("--bench", nargs="+", choices=BENCHES, default=list(BENCHES))
    ap.add_argument("--sizes", nargs="+", type=int, default=[2048])
    ap.add_argument("--dtype", nargs="+", choices=("f32", "f64"), default=["f32", "f64"])
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args(argv)
    if not args.without and not args.extra:
        ap.error("name a flag to leave out (--without) or to add (--with)")
    original = toolchain.arithmetic_flags
    missing = [f for f in args.without if f not in original(False)]
    if missing:
        ap.error(f"not among polyad's arithmetic flags {original(False)}: {missing}")

    def changed(deterministic: bool) -> tuple:
        return tuple(f for f in original(deterministic) if f not in args.without) \
            + tuple(args.extra)
    change = " ".join([f"without {f}" for f in args.without] + [f"with {f}" for f in args.extra])
    print(f"polyad's flags: {' '.join(original(False))}; changed: {change}")
    print(f"median of {args.rounds} interleaved rounds; ratio: changed / as it is")
    print(f"{'case':34s} {'fwd ms':>8s} {'ratio':>6s} {'grad ms':>8s} {'ratio':>6s} "
          f"{'g/f':>5s} {'g/f chg':>7s}")
    for size in args.sizes:
        for dtype in args.dtype:
            for bench in args.bench:
                case = suite.make_case(bench, size, dtype)
                t = time_case(case, changed, args.rounds)
                (f0, g0), (f1, g1) = t["as it is"], t["changed"]
                print(f"{bench + ' ' + case.shape + ' ' + dtype:34s} {f0 * 1e3:8.2f} "
                      f"{f1 / f0:6.2f} {g0 * 1e3:8.2f} {g1 / g0:6.2f} {g0 / f0:5.2f} "
                      f"{g1 / f1:7.2f}", flush=True)


if __name__ == "__main__":
    main()
