"""A PyTorch layer whose forward and backward are polyad kernels.

``Stencil1d`` is an ``nn.Module`` with a learnable 5-tap filter applied with
clamped borders, then a smooth nonlinearity; ``polyad.torch.function`` turns
the kernel into an autograd function, so the layer trains with any torch
optimizer. ``python examples/torch_layer.py`` fits the filter to data made
by a known one and prints the loss.
"""

import numpy as np
import torch

import polyad as pa
import polyad.torch

N = pa.sizes("N")


@pa.kernel
def stencil_softplus(x: pa.f64[N].clamped, w: pa.f64[5], y: pa.Out(pa.f64[N])):
    for i in range(N):
        s = 0.0
        for t in range(5):
            s += w[t] * x[i + t - 2]
        y[i] = pa.log(1.0 + pa.exp(s))


class Stencil1d(torch.nn.Module):
    """y = softplus(w * x) with a learnable 5-tap filter ``w`` (clamped borders)."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.full((5,), 0.2, dtype=torch.float64))
        self.apply_kernel = polyad.torch.function(stencil_softplus, wrt=["x", "w"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.apply_kernel(x, self.weight)


def train(steps: int = 200, seed: int = 0) -> tuple[float, float]:
    """Fit the layer to signals filtered by a known filter; returns (first, last) loss."""
    rng = np.random.default_rng(seed)
    truth = torch.tensor([0.1, -0.5, 1.2, 0.4, -0.2], dtype=torch.float64)
    xs = torch.from_numpy(rng.standard_normal((8, 64)))
    with torch.no_grad():
        target = [Stencil1d().apply_kernel(x, truth) for x in xs]
    layer = Stencil1d()
    opt = torch.optim.Adam(layer.parameters(), lr=0.05)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = sum(((layer(x) - t) ** 2).mean() for x, t in zip(xs, target))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses[0], losses[-1]


if __name__ == "__main__":
    first, last = train()
    print(f"loss {first:.4g} -> {last:.4g}")
