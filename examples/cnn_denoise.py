"""A small convolutional network trained with Adam to denoise images.

Two 3x3 convolution layers (1 -> C channels, ReLU, C -> 1), mean squared
error against the clean image, written as one polyad kernel ``cnn_loss``
(valid convolutions on pre-padded inputs, so every access is provably in
bounds). ``polyad.solvers.Objective`` with a dict ``wrt`` gives the loss
and the gradients with respect to all weights as a dict; ``polyad.solvers.adam``
trains them. Prints the loss before and after (and the PSNR of the network's
output) and writes noisy | network output | clean as a PNG.

    python examples/cnn_denoise.py [--size 32] [--steps 300] [--png build/cnn_denoise.png]
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import polyad as pa  # noqa: E402
from _common import psnr, shapes_image, side_by_side, write_png  # noqa: E402

B, C, H, W = pa.sizes("B C H W")


@pa.kernel
def cnn_forward(x: pa.f64[B, H + 4, W + 4], w1: pa.f64[C, 3, 3], b1: pa.f64[C],
                w2: pa.f64[C, 3, 3], b2: pa.f64[1], out: pa.Out(pa.f64[B, H, W])):
    h = pa.zeros(pa.f64[B, C, H + 2, W + 2])
    for b in range(B):
        for c in range(C):
            for m in range(H + 2):
                for n in range(W + 2):
                    s = b1[c]
                    for i in range(3):
                        for j in range(3):
                            s += w1[c, i, j] * x[b, m + i, n + j]
                    h[b, c, m, n] = max(s, 0.0)
    for b in range(B):
        for m in range(H):
            for n in range(W):
                o = b2[0]
                for c in range(C):
                    for i in range(3):
                        for j in range(3):
                            o += w2[c, i, j] * h[b, c, m + i, n + j]
                out[b, m, n] = o


@pa.kernel
def cnn_loss(x: pa.f64[B, H + 4, W + 4], clean: pa.f64[B, H, W], w1: pa.f64[C, 3, 3],
             b1: pa.f64[C], w2: pa.f64[C, 3, 3], b2: pa.f64[1]) -> pa.f64:
    # cnn_forward, then the error (a call of cnn_forward cannot bind its affine extents yet)
    h = pa.zeros(pa.f64[B, C, H + 2, W + 2])
    for b in range(B):
        for c in range(C):
            for m in range(H + 2):
                for n in range(W + 2):
                    s = b1[c]
                    for i in range(3):
                        for j in range(3):
                            s += w1[c, i, j] * x[b, m + i, n + j]
                    h[b, c, m, n] = max(s, 0.0)
    L = 0.0
    for b in range(B):
        for m in range(H):
            for n in range(W):
                o = b2[0]
                for c in range(C):
                    for i in range(3):
                        for j in range(3):
                            o += w2[c, i, j] * h[b, c, m + i, n + j]
                L += (o - clean[b, m, n]) ** 2
    return L / (B * H * W)


def make_data(batch: int, size: int, sigma: float, rng):
    """Noisy crops of the shapes image (padded by 2 for the two valid convolutions)."""
    big = shapes_image(4 * size)
    clean = np.empty((batch, size, size))
    for k in range(batch):
        r, c = rng.integers(0, 3 * size, 2)
        clean[k] = big[r:r + size, c:c + size] if k % 2 else big[r:r + size, c:c + size].T
    noisy = clean + sigma * rng.standard_normal(clean.shape)
    return np.pad(noisy, ((0, 0), (2, 2), (2, 2)), mode="edge"), clean


def main(size: int = 32, batch: int = 4, channels: int = 4, steps: int = 300, lr: float = 0.02,
         sigma: float = 0.1, png: str | None = "build/cnn_denoise.png", progress=None) -> dict:
    """Train on ``batch`` noisy ``size x size`` crops; returns the numbers it prints."""
    rng = np.random.default_rng(3)
    x, clean = make_data(batch, size, sigma, rng)
    params = {"w1": 0.3 * rng.standard_normal((channels, 3, 3)), "b1": np.zeros(channels),
              "w2": 0.3 * rng.standard_normal((channels, 3, 3)), "b2": np.zeros(1)}
    loss = pa.solvers.Objective(cnn_loss, {k: k for k in params}, x=x, clean=clean)
    params, info = pa.solvers.adam(loss, params, lr=lr, steps=steps, progress=progress)
    final = loss(params)[0]
    y = cnn_forward(x, params["w1"], params["b1"], params["w2"], params["b2"])
    out = dict(loss_start=info.history[0], loss_end=final, steps=info.iterations,
               ratio=info.history[0] / final, psnr_noisy=psnr(x[:, 2:-2, 2:-2], clean),
               psnr_network=psnr(y, clean))
    print(f"CNN denoiser (2 conv layers, {channels} channels, ReLU, MSE), batch {batch} x "
          f"{size}x{size}, Adam lr {lr}: loss {out['loss_start']:.4g} -> {final:.4g} "
          f"({out['ratio']:.1f}x lower) in {info.iterations} steps")
    print(f"  PSNR noisy {out['psnr_noisy']:.2f} dB, network output {out['psnr_network']:.2f} dB")
    if png:
        out["png"] = str(write_png(png, side_by_side(x[0, 2:-2, 2:-2], y[0], clean[0])))
        print(f"wrote {out['png']} (noisy | network output | clean)")
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--png", default="build/cnn_denoise.png")
    a = ap.parse_args()
    main(size=a.size, steps=a.steps, png=a.png)
