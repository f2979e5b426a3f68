"""Kernels the PyTorch and JAX bridge tests share: a returned scalar and an output
array, an in-out array, an integer input and a size the inputs do not fix."""

import polyad as pa

N = pa.sizes("N")
K = pa.sizes("K")


@pa.kernel
def blur_energy(x: pa.f64[N].clamped, w: pa.f64[3], s: pa.f64,
                y: pa.Out(pa.f64[N])) -> pa.f64:
    e = 0.0
    for i in range(N):
        y[i] = s * (w[0] * x[i - 1] + w[1] * x[i] + w[2] * x[i + 1])
        e += y[i] * pa.tanh(y[i])
    return e


@pa.kernel
def square_in_place(x: pa.f64[N], a: pa.f64):
    for i in range(N):
        x[i] = a * x[i] * x[i]


@pa.kernel
def shifted_sum(x: pa.f64[N], shift: pa.i64, y: pa.Out(pa.f64[K])):
    for k in range(K):
        y[k] = 0.0
        for i in range(N):
            y[k] += x[i] * (k + shift)
