"""The TV cost of DESIGN §1, shared by the test files that need a realistic kernel."""

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

