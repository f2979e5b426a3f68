#!/usr/bin/env python
"""Gradients with their large outputs stored past the caches vs stored as written.

    python benchmarks/streaming.py [--rounds 25] [--dtype f32 f64]

For the gradients of ``benchmarks/kernels.py`` whose output rows polyad stores with
streaming stores where the output is large (``LoopPlan.stream``: the deconvolution's
``d_x``, the 3-D stencil's ``d_x``, TV's ``d_g``): the default build, and the same
kernel under another name planned with the threshold out of reach (its loops as
written), called in alternation on the same inputs with the outputs passed. Prints
the median of each and their ratio (below 1: the streaming stores pay), and checks
that both give the same values.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
if importlib.util.find_spec("polyad") is None:  # a plain checkout, not pip-installed
    sys.path.insert(0, str(HERE.parent))

import polyad as pa  # noqa: E402
from polyad.target import openmp  # noqa: E402
import kernels  # noqa: E402

# (kernel, wrt, sizes)
CASES = [("deconv_cost", ("x", "f"), [2048, 4096]),
         ("tv_cost", ("g",), [2048, 4096]),
         ("stencil3d_cost", ("x",), [161, 256])]


def inputs(name: str, size: int, dtype, rng) -> tuple:
    """The kernel's arguments and its gradient's outputs, passed by the caller."""
    if name == "deconv_cost":
        x, f, y = (rng.standard_normal((size, size)), rng.standard_normal(5),
                   rng.standard_normal((size, size)))
        return (x.astype(dtype), f.astype(dtype), y.astype(dtype)), dict(
            d_x=np.empty((size, size), dtype), d_f=np.empty(5, dtype))
    if name == "tv_cost":
        g, b = rng.standard_normal((size, size)), rng.standard_normal((size, size))
        return (g.astype(dtype), b.astype(dtype), dtype(0.1)), dict(
            d_g=np.empty((size, size), dtype))
    x, y = rng.standard_normal((size,) * 3), rng.standard_normal((size,) * 3)
    return (x.astype(dtype), y.astype(dtype)), dict(d_x=np.empty((size,) * 3, dtype))


def builds(name: str, wrt: tuple, dtype: str):
    """(the default build of the gradient, the build whose streamed branch never runs)."""
    k = kernels.kernel(name, dtype)
    streamed = pa.compile(pa.grad(k, wrt=wrt))
    real = openmp.last_level_cache_bytes
    openmp.last_level_cache_bytes = lambda: 1 << 60
    try:
        plain_kernel = pa.Kernel(ir_kernel=dataclasses.replace(k.ir, name=f"{name}_as_written"))
        plain = pa.compile(pa.grad(plain_kernel, wrt=wrt))
    finally:
        openmp.last_level_cache_bytes = real
    return streamed, plain


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=25)
    ap.add_argument("--dtype", nargs="+", choices=("f32", "f64"), default=["f32", "f64"])
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    print(f"{'gradient':<16s} {'dtype':<5s} {'size':>5s} {'streamed ms':>12s} "
          f"{'as written ms':>14s} {'ratio':>6s}")
    for name, wrt, sizes in CASES:
        for dtype in args.dtype:
            streamed, plain = builds(name, wrt, dtype)
            if "pa_stream_" not in streamed.source:
                print(f"{name:<16s} {dtype:<5s} no streamed loop on this host")
                continue
            for size in sizes:
                call_args, outs = inputs(name, size, np.float32 if dtype == "f32"
                                         else np.float64, rng)
                first = streamed(*call_args, **outs)
                first = [np.array(a) for a in (first if isinstance(first, tuple) else (first,))]
                second = plain(*call_args, **outs)
                second = second if isinstance(second, tuple) else (second,)
                same = all(np.array_equal(a, b) for a, b in zip(first, second))
                times: dict = {"streamed": [], "plain": []}
                for _ in range(args.rounds):
                    for label, build in (("streamed", streamed), ("plain", plain)):
                        t = time.perf_counter()
                        build(*call_args, **outs)
                        times[label].append(time.perf_counter() - t)
                s, p = np.median(times["streamed"]), np.median(times["plain"])
                print(f"{name:<16s} {dtype:<5s} {size:>5d} {s * 1e3:>12.2f} {p * 1e3:>14.2f} "
                      f"{s / p:>6.3f}" + ("" if same else "  (values differ)"))


if __name__ == "__main__":
    main()
