"""Newton-Raphson in one dimension with forward-mode derivatives.

Finds a root of ``f(x) = -x^4 + 6 x^2 + 4 x`` (roots 0, -2 and 1 +- sqrt(3))
by ``x <- x - f(x) / f'(x)``, where ``f'`` is ``pa.grad(f, "x", mode="forward")``:
one tangent sweep, the cheap direction for a scalar input. Also finds the
stationary point next to it (a root of ``f'``) with ``f''`` from ``pa.hessian``
(forward over reverse). Prints the iterates and writes a plot of ``f`` with
them as a PNG.

    python examples/newton1d.py [--x0 3.0] [--png build/newton1d.png]
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import polyad as pa  # noqa: E402
from _common import write_png  # noqa: E402


@pa.kernel
def f(x: pa.f64) -> pa.f64:
    return -x ** 4 + 6.0 * x ** 2 + 4.0 * x


ROOT = 1.0 + math.sqrt(3.0)   # the root Newton reaches from x0 = 3


def newton(fun, dfun, x0: float, tol: float = 1e-14, maxiter: int = 50):
    """Newton-Raphson iterates of ``fun`` from ``x0`` (stops when the step is below ``tol``)."""
    xs = [x0]
    x = x0
    for _ in range(maxiter):
        step = fun(x) / dfun(x)
        x -= step
        xs.append(x)
        if abs(step) <= tol * max(1.0, abs(x)):
            break
    return x, xs


def plot(xs, lo=-2.6, hi=3.2, width=360, height=240) -> np.ndarray:
    """A white image with the curve of f (black), the zero line (gray), iterates (dark)."""
    img = np.ones((height, width))
    t = np.linspace(lo, hi, width * 4)
    ft = -t ** 4 + 6 * t ** 2 + 4 * t
    fmin, fmax = float(ft.min()), float(ft.max())

    def row(v):
        return int(round((fmax - v) / (fmax - fmin) * (height - 1)))

    def col(v):
        return int(round((v - lo) / (hi - lo) * (width - 1)))
    img[row(0.0), :] = 0.7
    for a, b in zip(t, ft):
        img[row(b), col(a)] = 0.0
    for x in xs:
        if lo <= x <= hi:
            c, r = col(x), row(0.0)
            img[max(r - 4, 0):r + 5, max(c - 1, 0):c + 2] = 0.35
    return img


def main(x0: float = 3.0, png: str | None = "build/newton1d.png") -> dict:
    """Run Newton from ``x0``; returns the numbers it prints."""
    df = pa.grad(f, "x", mode="forward")
    d2f = pa.hessian(f, "x")
    root, xs = newton(f, df, x0)
    stat, ys = newton(df, d2f, root)
    out = dict(x0=x0, root=root, iterations=len(xs) - 1, error=abs(root - ROOT),
               stationary=stat, stationary_iterations=len(ys) - 1, f_at_root=f(root))
    print(f"Newton-Raphson on f(x) = -x^4 + 6x^2 + 4x from x0 = {x0}:")
    for k, x in enumerate(xs):
        print(f"  x{k} = {x:.16f}")
    print(f"root {root:.16f} after {out['iterations']} iterations; |x - (1 + sqrt 3)| = "
          f"{out['error']:.2e}, f(root) = {out['f_at_root']:.2e}")
    print(f"stationary point (f' = 0, f'' from pa.hessian) next to it: {stat:.12f} "
          f"after {out['stationary_iterations']} iterations")
    if png:
        out["png"] = str(write_png(png, plot(xs)))
        print(f"wrote {out['png']}")
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--x0", type=float, default=3.0)
    ap.add_argument("--png", default="build/newton1d.png")
    a = ap.parse_args()
    main(x0=a.x0, png=a.png)
