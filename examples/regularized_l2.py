"""A regularised L2 problem solved with conjugate gradients and a generated adjoint:
2x super-resolution.

The observation averages each 2x2 block of the unknown high-resolution image
(``downsample``: strided reads ``x[2 m + a, 2 n + b]``) and adds noise. The
estimate minimises ``||y - D x||^2 + lam ||grad x||^2`` with
``polyad.solvers.cg``; ``D^T`` and ``grad^T`` are the kernels ``pa.adjoint``
generates (``pa.linear_operator`` calls them as ``A.T``). When scipy is
installed the same problem is also solved by ``scipy.sparse.linalg.lsqr`` on
``A.aslinearoperator()`` as a cross-check. Prints the PSNR against pixel
replication and writes replicated | CG | clean as a PNG.

    python examples/regularized_l2.py [--size 128] [--png build/regularized_l2.png]
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
def downsample(x: pa.f64[2 * M, 2 * N], y: pa.Out(pa.f64[M, N])):
    for m in range(M):
        for n in range(N):
            y[m, n] = 0.25 * (x[2 * m, 2 * n] + x[2 * m + 1, 2 * n] + x[2 * m, 2 * n + 1]
                              + x[2 * m + 1, 2 * n + 1])


@pa.kernel
def gradient(x: pa.f64[M, N].clamped, gx: pa.Out(pa.f64[M, N]), gy: pa.Out(pa.f64[M, N])):
    for m in range(M):
        for n in range(N):
            gx[m, n] = x[m, n + 1] - x[m, n]
            gy[m, n] = x[m + 1, n] - x[m, n]


def main(size: int = 128, sigma: float = 0.01, lam: float = 0.02, tol: float = 1e-8,
         png: str | None = "build/regularized_l2.png", progress=None) -> dict:
    """Recover a ``size x size`` image from its 2x-downsampled noisy version."""
    clean = shapes_image(size)
    rng = np.random.default_rng(4)
    D = pa.linear_operator(downsample, wrt="x", M=size // 2, N=size // 2)
    R = pa.linear_operator(gradient, wrt="x", M=size, N=size)
    y = D(clean) + sigma * rng.standard_normal((size // 2, size // 2))
    x, info = pa.solvers.cg(D, y, lam=lam, R=R, tol=tol, maxiter=5000, progress=progress)
    replicated = np.kron(y, np.ones((2, 2)))
    out = dict(size=size, iterations=info.iterations, converged=info.converged,
               residual=info.residuals[-1], psnr_replicated=psnr(replicated, clean),
               psnr_cg=psnr(x, clean))
    print(f"2x super-resolution {size}x{size}, sigma {sigma}, lam {lam}: CG {info.iterations} "
          f"iterations, relative residual {out['residual']:.2e} ({info.message})")
    print(f"  PSNR pixel replication {out['psnr_replicated']:.2f} dB, CG {out['psnr_cg']:.2f} dB")
    try:
        from scipy.sparse.linalg import LinearOperator, lsqr
    except ImportError:
        print("  (scipy not installed: no lsqr cross-check)")
    else:
        Dl, Rl = D.aslinearoperator(), R.aslinearoperator()
        s = np.sqrt(lam)
        stacked = LinearOperator((Dl.shape[0] + Rl.shape[0], Dl.shape[1]),
                                 matvec=lambda v: np.concatenate([Dl.matvec(v), s * Rl.matvec(v)]),
                                 rmatvec=lambda w: Dl.rmatvec(w[:Dl.shape[0]])
                                 + s * Rl.rmatvec(w[Dl.shape[0]:]))
        rhs = np.concatenate([y.ravel(), np.zeros(Rl.shape[0])])
        ref = lsqr(stacked, rhs, atol=1e-12, btol=1e-12, iter_lim=20000)[0].reshape(x.shape)
        out["lsqr_difference"] = float(np.max(np.abs(ref - x)))
        print(f"  scipy lsqr on A.aslinearoperator(): max |x_lsqr - x_cg| = "
              f"{out['lsqr_difference']:.2e}")
    if png:
        out["png"] = str(write_png(png, side_by_side(replicated, x, clean)))
        print(f"wrote {out['png']} (pixel replication | CG | clean)")
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--png", default="build/regularized_l2.png")
    a = ap.parse_args()
    main(size=a.size, png=a.png)
