"""In-place loop programs whose gradients need tapes (issue 19): factorizations,
shortest paths, explicit time stepping, a recurrent cell, scalars updated in
triangular loops (packed tapes). Used by tests/test_ad_recorded.py and
benchmarks/memory.py.

Each cost reads the in-place result through a weight array ``W`` (so every
element of the result matters) and returns a scalar; ``make_args(name, n, rng,
steps)`` builds well-conditioned inputs (a symmetric positive definite matrix
for cholesky, diagonally dominant for lu, positive distances for
floyd-warshall).
"""

from __future__ import annotations

import numpy as np

import polyad as pa

N, T = pa.sizes("N T")


@pa.kernel
def cholesky_cost(A: pa.f64[N, N], W: pa.f64[N, N]) -> pa.f64:
    for i in range(N):
        for j in range(i):
            for k in range(j):
                A[i, j] -= A[i, k] * A[j, k]
            A[i, j] /= A[j, j]
        for k in range(i):
            A[i, i] -= A[i, k] * A[i, k]
        A[i, i] = pa.sqrt(A[i, i])
    C = 0.0
    for i in range(N):
        for j in range(i + 1):
            C += W[i, j] * A[i, j]
    return C


@pa.kernel
def lu_cost(A: pa.f64[N, N], W: pa.f64[N, N]) -> pa.f64:
    for i in range(N):
        for j in range(i):
            for k in range(j):
                A[i, j] -= A[i, k] * A[k, j]
            A[i, j] /= A[j, j]
        for j in range(i, N):
            for k in range(i):
                A[i, j] -= A[i, k] * A[k, j]
    C = 0.0
    for i in range(N):
        for j in range(N):
            C += W[i, j] * A[i, j]
    return C


@pa.kernel
def floyd_warshall_cost(P: pa.f64[N, N], W: pa.f64[N, N]) -> pa.f64:
    for k in range(N):
        for i in range(N):
            for j in range(N):
                P[i, j] = pa.min(P[i, j], P[i, k] + P[k, j])
    C = 0.0
    for i in range(N):
        for j in range(N):
            C += W[i, j] * P[i, j]
    return C


@pa.kernel
def seidel_2d_cost(A: pa.f64[N, N], W: pa.f64[N, N], steps: pa.i64) -> pa.f64:
    for t in range(steps):
        for i in range(1, N - 1):
            for j in range(1, N - 1):
                A[i, j] = (A[i - 1, j - 1] + A[i - 1, j] + A[i - 1, j + 1]
                           + A[i, j - 1] + A[i, j] + A[i, j + 1]
                           + A[i + 1, j - 1] + A[i + 1, j] + A[i + 1, j + 1]) / 9.0
    C = 0.0
    for i in range(N):
        for j in range(N):
            C += W[i, j] * A[i, j]
    return C


@pa.kernel
def diffusion_cost(A: pa.f64[N, N], W: pa.f64[N, N], steps: pa.i64) -> pa.f64:
    U = pa.zeros(pa.f64[N, N])
    for t in range(steps):
        for i in range(1, N - 1):
            for j in range(1, N - 1):
                U[i, j] = A[i, j] + 0.1 * pa.tanh(A[i - 1, j] + A[i + 1, j] + A[i, j - 1]
                                                  + A[i, j + 1] - 4.0 * A[i, j])
        for i in range(1, N - 1):
            for j in range(1, N - 1):
                A[i, j] = U[i, j]
    C = 0.0
    for i in range(N):
        for j in range(N):
            C += W[i, j] * A[i, j] * A[i, j]
    return C


@pa.kernel
def rnn_cost(x: pa.f64[T, N], Wh: pa.f64[N, N], h: pa.f64[N], W: pa.f64[N]) -> pa.f64:
    hn = pa.zeros(pa.f64[N])
    for t in range(T):
        for j in range(N):
            s = 0.0
            for k in range(N):
                s += Wh[j, k] * h[k]
            hn[j] = pa.tanh(s + x[t, j])
        for j in range(N):
            h[j] = hn[j]
    C = 0.0
    for j in range(N):
        C += W[j] * h[j]
    return C


@pa.kernel
def triangles_cost(x: pa.f64[N], A: pa.f64[N, N], B: pa.f64[N, N]) -> pa.f64:
    """Scalars updated nonlinearly in triangular loops: their tapes are a lower triangle
    ``j < i``, an upper one ``i < j < N`` and a tetrahedron ``k < j < i``; the branch
    flags of a ``max`` updating ``B`` in place below its diagonal (all packed)."""
    C = 0.0
    for i in range(N):
        for j in range(i):
            B[i, j] = pa.max(B[i, j], x[j] * B[j, i])
            C += B[i, j] * B[i, j]
    for i in range(N):
        s = x[i]
        for j in range(i):
            s = s * pa.cos(A[i, j] * s)
        t = x[i]
        for j in range(i + 1, N):
            t = pa.sin(t + A[i, j] * t)
        for j in range(i):
            u = A[j, i]
            for k in range(j):
                u = u * pa.cos(x[k] * u)
            C += u
        C += s * t
    return C


KERNELS = {"cholesky": (cholesky_cost, "A"), "lu": (lu_cost, "A"),
           "floyd-warshall": (floyd_warshall_cost, "P"), "seidel-2d": (seidel_2d_cost, "A"),
           "diffusion": (diffusion_cost, "A"), "rnn": (rnn_cost, ["x", "Wh", "h"]),
           "triangles": (triangles_cost, ["x", "A"])}


def make_args(name: str, n: int, rng, steps: int = 3) -> dict:
    """Inputs of kernel ``name`` at size ``n`` (``steps`` time steps where it has them)."""
    W = rng.standard_normal((n, n))
    if name == "cholesky":
        B = rng.standard_normal((n, n))
        return dict(A=B @ B.T + n * np.eye(n), W=W)
    if name == "lu":
        return dict(A=rng.standard_normal((n, n)) + 2 * n * np.eye(n), W=W)
    if name == "floyd-warshall":
        return dict(P=rng.uniform(1.0, 2.0, (n, n)), W=W)
    if name in ("seidel-2d", "diffusion"):
        return dict(A=rng.standard_normal((n, n)), W=W, steps=steps)
    if name == "triangles":
        return dict(x=rng.standard_normal(n), A=0.5 * rng.standard_normal((n, n)),
                    B=rng.standard_normal((n, n)))
    if name == "rnn":
        return dict(x=rng.standard_normal((steps, n)),
                    Wh=rng.standard_normal((n, n)) / max(n, 1) ** 0.5,
                    h=rng.standard_normal(n), W=rng.standard_normal(n))
    raise KeyError(name)

