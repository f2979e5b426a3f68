#!/usr/bin/env python
"""A gradient's time with its outputs allocated by the call vs passed by the caller.

    python benchmarks/fresh_outputs.py [--size 4096] [--rounds 5] [--calls 8]

For the deconvolution gradient (``benchmarks/kernels.py``, wrt ``x`` and ``f``) in
float32 and float64: rounds of ``--calls`` calls that omit ``d_x`` and ``d_f``
(each result dropped before the next call, as a loop that replaces its gradient
does), alternating with rounds that pass the same two arrays every time. Prints the
median time of each and their ratio. Omitted outputs the kernel assigns entirely are
made on recycled memory (``polyad.runtime.output_pool``), so the ratio is near 1;
before that, fresh memory cost 1.3-1.5x at 4096² (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
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
import kernels  # noqa: E402


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=8)
    args = ap.parse_args(argv)
    n = args.size
    print(f"deconvolution gradient wrt x, f at {n}x{n}: median of {args.rounds} x "
          f"{args.calls} calls each, alternating")
    print(f"{'dtype':6} {'outputs allocated':>18} {'outputs passed':>15} {'ratio':>6}")
    for dtype in ("f32", "f64"):
        np_dtype = np.float32 if dtype == "f32" else np.float64
        grad = pa.grad(kernels.kernel("deconv_cost", dtype), wrt=("x", "f"))
        rng = np.random.default_rng(0)
        x = rng.standard_normal((n, n)).astype(np_dtype)
        y = rng.standard_normal((n, n)).astype(np_dtype)
        f = np.array([0.1, 0.2, 0.4, 0.2, 0.1], np_dtype)
        d_x, d_f = np.empty_like(x), np.empty_like(f)
        grad(x, f, y)
        grad(x, f, y, d_x=d_x, d_f=d_f)
        allocated, passed = [], []
        for _ in range(args.rounds):
            for times, call in ((allocated, lambda: grad(x, f, y)),
                                (passed, lambda: grad(x, f, y, d_x=d_x, d_f=d_f))):
                for _ in range(args.calls):
                    start = time.perf_counter()
                    result = call()
                    times.append(time.perf_counter() - start)
                    del result
        a, p = np.median(allocated), np.median(passed)
        print(f"{dtype:6} {a * 1e3:15.2f} ms {p * 1e3:12.2f} ms {a / p:6.2f}", flush=True)


if __name__ == "__main__":
    main()
