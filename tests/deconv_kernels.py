"""The deconvolution cost of ``benchmarks/kernels.py`` (a separable clamped 5-tap blur,
then its squared error), for the tests that assert decisions on its gradient."""

import polyad as pa

M, N = pa.sizes("M N")


def deconvolution(dtype: str, mode: str = "clamped"):
    """The ``deconv_cost`` kernel in ``dtype`` ("f32" or "f64"); ``mode``: the boundary
    mode of ``x`` and ``t`` (the benchmark's is clamped)."""
    T = pa.f32 if dtype == "f32" else pa.f64
    X = getattr(T[M, N], mode)

    @pa.kernel
    def deconv_cost(x: X, f: T[5], y: T[M, N]) -> T:
        t = pa.empty(X)
        for m in range(M):
            for n in range(N):
                t[m, n] = (f[0] * x[m, n - 2] + f[1] * x[m, n - 1] + f[2] * x[m, n]
                           + f[3] * x[m, n + 1] + f[4] * x[m, n + 2])
        C = 0.0
        for m in range(M):
            for n in range(N):
                r = (f[0] * t[m - 2, n] + f[1] * t[m - 1, n] + f[2] * t[m, n]
                     + f[3] * t[m + 1, n] + f[4] * t[m + 2, n]) - y[m, n]
                C += r * r
        return C
    return deconv_cost
