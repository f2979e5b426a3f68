"""Total-variation denoising by gradient descent (the Quasar AD manual's first application).

A synthetic piecewise-constant image plus Gaussian noise is denoised by
minimising ``sum (g - b)^2 + lam * sum sqrt(|grad g|^2 + eps)`` with
``polyad.solvers.gradient_descent``; the gradient is polyad's reverse mode.
Prints the PSNR before and after and writes noisy | denoised | clean as a PNG.

    python examples/tv_denoise.py [--size 256] [--png build/tv_denoise.png]
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import polyad as pa  # noqa: E402
from _common import psnr, shapes_image, side_by_side, write_png  # noqa: E402

M, N = pa.sizes("M N")


@pa.kernel
def tv_smooth_cost(g: pa.f64[M, N].clamped, b: pa.f64[M, N], lam: pa.f64) -> pa.f64:
    C = 0.0
    for m in range(M):
        for n in range(N):
            dx = g[m, n + 1] - g[m, n]
            dy = g[m + 1, n] - g[m, n]
            C += (g[m, n] - b[m, n]) ** 2 + lam * pa.sqrt(dx * dx + dy * dy + 1e-4)
    return C


def main(size: int = 256, sigma: float = 0.1, lam: float = 0.12, iters: int = 300,
         png: str | None = "build/tv_denoise.png", progress=None) -> dict:
    """Denoise a ``size x size`` image; returns the numbers it prints."""
    clean = shapes_image(size)
    rng = np.random.default_rng(1)
    noisy = clean + sigma * rng.standard_normal(clean.shape)
    cost = pa.solvers.Objective(tv_smooth_cost, "g", b=noisy, lam=lam)
    g, info = pa.solvers.gradient_descent(cost, noisy.copy(), step=0.1, tol=1e-6, maxiter=iters,
                                          progress=progress)
    out = dict(size=size, psnr_noisy=psnr(noisy, clean), psnr_denoised=psnr(g, clean),
               iterations=info.iterations, cost_start=info.history[0], cost_end=info.history[-1])
    print(f"TV denoising {size}x{size}, sigma {sigma}, lam {lam}: PSNR {out['psnr_noisy']:.2f} dB "
          f"-> {out['psnr_denoised']:.2f} dB after {info.iterations} gradient-descent iterations "
          f"(cost {out['cost_start']:.4g} -> {out['cost_end']:.4g})")
    if png:
        out["png"] = str(write_png(png, side_by_side(noisy, g, clean)))
        print(f"wrote {out['png']} (noisy | denoised | clean)")
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--png", default="build/tv_denoise.png")
    a = ap.parse_args()
    main(size=a.size, iters=a.iters, png=a.png)
