"""Kernels for the argument-binding tests (kept in a file: polyad reads kernel source)."""

import polyad as pa

M, N, K = pa.sizes("M N K")


@pa.kernel
def axpy(x: pa.f64[N], y: pa.f64[N], a: pa.f64):
    for i in range(N):
        y[i] += a * x[i]


@pa.kernel
def ssq(x: pa.f64[N]) -> pa.f64:
    s = 0.0
    for i in range(N):
        s += x[i] * x[i]
    return s


@pa.kernel
def ssq32(x: pa.f32[N]) -> pa.f32:
    s = 0.0
    for i in range(N):
        s += x[i] * x[i]
    return s


@pa.kernel
def two_outs(x: pa.f64[M, N], lo: pa.Out(pa.f64[M]), hi: pa.Out(pa.f64[N])) -> pa.f64:
    t = 0.0
    for m in range(M):
        for n in range(N):
            lo[m] += x[m, n]
            hi[n] += x[m, n]
            t += x[m, n]
    return t


@pa.kernel
def odd_extent(x: pa.f64[2 * N + 1], y: pa.Out(pa.f64[N])):
    for i in range(N):
        y[i] = x[2 * i + 1]


@pa.kernel
def pad_k(x: pa.f64[N], y: pa.Out(pa.f64[N + K])):
    for i in range(N):
        y[i] = x[i]
    for j in range(K):
        y[N + j] = 1.0


@pa.kernel
def first_n(x: pa.f64[N].clamped, n: pa.i32, y: pa.Out(pa.f64[N].zero)):
    t = pa.zeros(pa.f64[N].zero)
    for i in range(n):
        t[i] = 2.0 * x[i]
    for i in range(n):
        y[i] = t[i]


@pa.kernel
def count_up(c: pa.i64[N], step: pa.i64):
    for i in range(N):
        c[i] += step


@pa.kernel
def wrap3(x: pa.f64[N].circular, y: pa.Out(pa.f64[N])):
    for i in range(N):
        y[i] = x[i - 3] + x[i + 3]


@pa.kernel
def blur2d(u: pa.f64[M, N].clamped, v: pa.Out(pa.f64[M, N])):
    for m in range(M):
        for n in range(N):
            v[m, n] = u[m - 1, n] + u[m, n - 1] + u[m, n]


@pa.kernel
def taps2d(x: pa.f64[M, N].circular, z: pa.f64[M, N].mirror, y: pa.Out(pa.f64[M, N])):
    for m in range(M):
        for n in range(N):
            y[m, n] = x[m - 2, n + 1] + z[m + 1, n - 3]


@pa.kernel
def mixed_extents(a: pa.f64[2 * N + 1], b: pa.f64[N + K], c: pa.Out(pa.f64[K, M])):
    for k in range(K):
        for m in range(M):
            c[k, m] = a[2 * N] + b[N + k]
