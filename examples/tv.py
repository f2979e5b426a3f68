"""Total-variation denoising cost of DESIGN §1: the kernel the demo compiles."""

import polyad as pa

M, N = pa.sizes("M N")


@pa.kernel
def tv_cost(g: pa.f64[M, N].clamped, b: pa.f64[M, N], lam: pa.f64) -> pa.f64:
    C = 0.0
    for m in range(M):
        for n in range(N):
            C += (g[m, n] - b[m, n]) ** 2
            C += lam * abs(g[m, n - 1] - g[m, n])
            C += lam * abs(g[m - 1, n] - g[m, n])
    return C


def tv_cost_numpy(g, b, lam):
    """The same cost in numpy (clamped borders = 'edge' padding)."""
    import numpy as np
    gp = np.pad(g, 1, mode="edge")
    return (((g - b) ** 2).sum() + lam * np.abs(gp[1:-1, :-2] - g).sum()
            + lam * np.abs(gp[:-2, 1:-1] - g).sum())
