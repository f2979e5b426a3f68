#!/usr/bin/env python
"""Overhead of the PyTorch and JAX bridges (issue 12) over calling polyad directly.

    python benchmarks/bridges.py [--size 512] [--repeats 30] [--threads N]

For the TV cost of examples/tv.py on an N x N float64 image it prints the
median time of: the forward kernel and pa.vjp called directly on numpy
arrays (the baseline), polyad.torch.function forward and forward+backward,
polyad.jax.primitive under jax.jit forward and jax.jit(jax.grad). Ratios are
to the direct calls measured in the same run.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if importlib.util.find_spec("polyad") is None:  # a plain checkout, not pip-installed
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import polyad as pa  # noqa: E402

spec = importlib.util.spec_from_file_location("tv_example", ROOT / "examples" / "tv.py")
tv = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tv)


def median_time(fn, repeats: int) -> float:
    fn()                                        # warm up (compile, trace, cache)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=None,
                        help="OpenMP threads per kernel call (default: all cores)")
    args = parser.parse_args()
    with pa.num_threads(args.threads):
        run(args)


def run(args) -> None:
    rng = np.random.default_rng(0)
    g = rng.random((args.size, args.size))
    b = rng.random((args.size, args.size))
    vjp = pa.vjp(tv.tv_cost, wrt="g")
    rows = [("polyad direct: forward", median_time(lambda: tv.tv_cost(g, b, 0.1), args.repeats)),
            ("polyad direct: forward + vjp",
             median_time(lambda: (tv.tv_cost(g, b, 0.1), vjp(g, b, 0.1, 1.0)), args.repeats))]
    import torch
    import polyad.torch
    tf = polyad.torch.function(tv.tv_cost, wrt="g")
    tb = torch.from_numpy(b)

    def torch_grad():
        gt = torch.from_numpy(g).requires_grad_()
        tf(gt, tb, 0.1).backward()

    rows += [("torch bridge: forward", median_time(lambda: tf(torch.from_numpy(g), tb, 0.1),
                                                  args.repeats)),
             ("torch bridge: forward + backward", median_time(torch_grad, args.repeats))]
    import jax
    jax.config.update("jax_enable_x64", True)
    import polyad.jax
    jf = polyad.jax.primitive(tv.tv_cost, wrt="g")
    jg, jb = jax.numpy.asarray(g), jax.numpy.asarray(b)
    fwd = jax.jit(lambda g, b: jf(g, b, 0.1))
    grad = jax.jit(jax.grad(lambda g, b: jf(g, b, 0.1)))
    rows += [("jax bridge (jit): forward",
              median_time(lambda: fwd(jg, jb).block_until_ready(), args.repeats)),
             ("jax bridge (jit): grad",
              median_time(lambda: grad(jg, jb).block_until_ready(), args.repeats))]
    base = {"forward": rows[0][1], "grad": rows[1][1]}
    print(f"TV cost, {args.size}x{args.size} float64, median of {args.repeats}, "
          f"{args.threads or 'all'} thread(s)")
    print(f"{'contender':36s} {'median ms':>10s} {'vs direct':>10s}")
    for name, t in rows:
        ref = base["forward"] if name.endswith("forward") else base["grad"]
        print(f"{name:36s} {t * 1e3:10.3f} {t / ref:10.2f}")


if __name__ == "__main__":
    main()
