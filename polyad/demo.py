"""``polyad demo``: compile the TV cost kernel of DESIGN §1 and its gradient, check, time.

The kernel is defined here, in a real module, so its source (which the
frontend reads) and therefore its compiled library are the same on every run.
"""

from __future__ import annotations

import inspect
import time

import numpy as np

from . import api, derivatives
from .ir import f64

M, N = api.sizes("M N")


@api.kernel
def tv_cost(g: f64[M, N].clamped, b: f64[M, N], lam: f64) -> f64:
    C = 0.0
    for m in range(M):
        for n in range(N):
            C += (g[m, n] - b[m, n]) ** 2
            C += lam * abs(g[m, n - 1] - g[m, n])
            C += lam * abs(g[m - 1, n] - g[m, n])
    return C


def tv_cost_numpy(g, b, lam):
    """The same cost in numpy (clamped borders = 'edge' padding)."""
    gp = np.pad(g, 1, mode="edge")
    return (((g - b) ** 2).sum() + lam * np.abs(gp[1:-1, :-2] - g).sum()
            + lam * np.abs(gp[:-2, 1:-1] - g).sum())


def tv_grad_numpy(g, b, lam):
    """The gradient derived by hand, in numpy (sign(0) = 0, clamped borders)."""
    gp = np.pad(g, 1, mode="edge")
    sx = np.sign(g - gp[1:-1, :-2])          # d/dg[m, n] of |g[m, n-1] - g[m, n]|
    sy = np.sign(g - gp[:-2, 1:-1])
    d = 2 * (g - b) + lam * (sx + sy)
    d[:, :-1] -= lam * sx[:, 1:]             # the same terms seen from n + 1 ...
    d[:-1, :] -= lam * sy[1:, :]             # ... and from m + 1
    return d


def _median_time(fn, repeat=7) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def run_demo(size: int = 1024) -> int:
    """Print the kernel, compile it and its gradient, check both against numpy, time them."""
    print("polyad demo: total-variation cost (DESIGN §1)\n")
    print(inspect.getsource(tv_cost.__wrapped__))
    t = time.perf_counter()
    compiled = api.compile(tv_cost)
    print(f"compiled tv_cost to OpenMP C in {time.perf_counter() - t:.2f} s -> {compiled.library}")
    t = time.perf_counter()
    dtv = derivatives.grad(tv_cost, wrt="g")
    dtv.compile()
    print(f"derived and compiled its gradient in {time.perf_counter() - t:.2f} s\n")
    print("generated C of the gradient:\n" + dtv.source)
    rng = np.random.default_rng(0)
    g = rng.random((size, size))
    b = g + 0.1 * rng.standard_normal((size, size))
    lam = 0.1
    c, ref = tv_cost(g, b, lam), tv_cost_numpy(g, b, lam)
    dg, dref = dtv(g, b, lam), tv_grad_numpy(g, b, lam)
    cost_err = abs(c - ref) / abs(ref)
    grad_err = float(np.abs(dg - dref).max() / np.abs(dref).max())
    print(f"tv_cost({size}x{size}) = {c:.10g}   numpy: {ref:.10g}   relative difference "
          f"{cost_err:.1e}")
    print(f"gradient: max difference to the hand-derived numpy gradient {grad_err:.1e} "
          f"(relative to its largest entry)")
    t_f, t_g = _median_time(lambda: tv_cost(g, b, lam)), _median_time(lambda: dtv(g, b, lam))
    t_nf = _median_time(lambda: tv_cost_numpy(g, b, lam))
    t_ng = _median_time(lambda: tv_grad_numpy(g, b, lam))
    print(f"median times: cost {t_f * 1e3:.2f} ms (numpy {t_nf * 1e3:.2f} ms, "
          f"{t_nf / t_f:.1f}x), gradient {t_g * 1e3:.2f} ms (numpy {t_ng * 1e3:.2f} ms, "
          f"{t_ng / t_g:.1f}x), gradient / cost = {t_g / t_f:.2f}")
    ok = cost_err <= 1e-9 and grad_err <= 1e-9
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1
