"""Forward (no derivatives) kernels compiled by polyad, each checked against an
independent numpy reference written next to it."""

import re

import numpy as np
import pytest

import polyad as pa
from npref import python_erf, python_erfc, shifted
from polyad.ir import Size

M, N = pa.sizes("M N")
(K,) = pa.sizes("K")
L, P = pa.sizes("L P")


def close64(actual, expected):
    np.testing.assert_allclose(actual, expected, rtol=1e-12, atol=1e-12)


def close32(actual, expected):
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------
# API basics
# ---------------------------------------------------------------------------


def test_sizes_one_name_is_one_size_several_a_tuple():
    one = pa.sizes("Q")
    assert isinstance(one, Size) and repr(one) == "Q"
    (same,) = one                              # the 1-tuple spelling still unpacks
    assert same is one
    two = pa.sizes("A B")
    assert isinstance(two, tuple) and len(two) == 2


def test_kernel_on_a_single_size_compiles_and_runs():
    Q = pa.sizes("Q")

    @pa.kernel
    def double(x: pa.f64[Q], y: pa.Out(pa.f64[Q])):
        for i in range(Q):
            y[i] = 2.0 * x[i]

    x = np.arange(5.0)
    np.testing.assert_array_equal(double(x), 2.0 * x)


# ---------------------------------------------------------------------------
# Stencils
# ---------------------------------------------------------------------------


@pa.kernel
def smooth1d(x: pa.f64[N].clamped, y: pa.Out(pa.f64[N])):
    for i in range(N):
        y[i] = 0.25 * x[i - 1] + 0.5 * x[i] + 0.25 * x[i + 1]


@pytest.mark.parametrize("n", [1, 2, 5, 12])
def test_smooth1d_clamped(rng, n):
    x = rng.standard_normal(n)
    y = smooth1d(x)
    ref = 0.25 * shifted(x, [-1], "clamped") + 0.5 * x + 0.25 * shifted(x, [1], "clamped")
    assert y.shape == (n,) and y.dtype == np.float64
    close64(y, ref)


@pa.kernel
def blur(x: pa.f64[M, N].clamped, y: pa.Out(pa.f64[M, N])):
    for m in range(M):
        for n in range(N):
            y[m, n] = (x[m, n - 1] + x[m, n] + x[m, n + 1]) / 3.0


def test_blur_doc_example(rng):
    x = rng.standard_normal((5, 7))
    ref = (shifted(x, [0, -1], "clamped") + x + shifted(x, [0, 1], "clamped")) / 3.0
    close64(blur(x), ref)


def test_out_passed_explicitly(rng):
    x = rng.standard_normal((6, 9))
    ref = (shifted(x, [0, -1], "clamped") + x + shifted(x, [0, 1], "clamped")) / 3.0
    y = np.zeros_like(x)
    r = blur(x, y)  # positional
    assert r is y
    close64(y, ref)
    y2 = np.full_like(x, 7.0)
    r2 = blur(x, y=y2)  # keyword
    assert r2 is y2
    close64(y2, ref)
    y3 = np.zeros_like(x)
    assert blur(y=y3, x=x) is y3  # all by keyword
    close64(y3, ref)
    close64(blur(x=x), ref)


@pa.kernel
def box3x3(x: pa.f64[M, N].clamped, y: pa.Out(pa.f64[M, N])):
    for m in range(M):
        for n in range(N):
            s = 0.0
            for dm in range(-1, 2):
                for dn in range(-1, 2):
                    s += x[m + dm, n + dn]
            y[m, n] = s / 9.0


@pytest.mark.parametrize("shape", [(5, 5), (7, 4), (1, 9), (13, 6)])
def test_box3x3_scalar_local(rng, shape):
    x = rng.standard_normal(shape)
    ref = sum(shifted(x, [a, b], "clamped") for a in (-1, 0, 1) for b in (-1, 0, 1)) / 9.0
    close64(box3x3(x), ref)


@pa.kernel
def laplace3d(x: pa.f64[P, M, N].clamped, y: pa.Out(pa.f64[P, M, N])):
    for p in range(P):
        for m in range(M):
            for n in range(N):
                y[p, m, n] = (
                    x[p - 1, m, n] + x[p + 1, m, n]
                    + x[p, m - 1, n] + x[p, m + 1, n]
                    + x[p, m, n - 1] + x[p, m, n + 1]
                    - 6.0 * x[p, m, n]
                )


def test_laplace3d(rng):
    x = rng.standard_normal((5, 6, 7))
    ref = -6.0 * x
    for ax in range(3):
        for d in (-1, 1):
            off = [0, 0, 0]
            off[ax] = d
            ref = ref + shifted(x, off, "clamped")
    close64(laplace3d(x), ref)


@pa.kernel
def central_diff_interior(x: pa.f64[N], y: pa.Out(pa.f64[N])):
    # unchecked arrays: the loop keeps every access in bounds
    for i in range(1, N - 1):
        y[i] = 0.5 * (x[i + 1] - x[i - 1])


@pytest.mark.parametrize("n", [3, 8, 11])
def test_central_diff_interior_unchecked(rng, n):
    x = rng.standard_normal(n)
    y = np.zeros(n)
    central_diff_interior(x, y)
    ref = np.zeros(n)
    ref[1:-1] = 0.5 * (x[2:] - x[:-2])
    close64(y, ref)


@pa.kernel
def diff_with_branches(x: pa.f64[N], y: pa.Out(pa.f64[N])):
    # affine conditions keep the unchecked accesses in bounds
    for i in range(N):
        if i == 0:
            y[i] = x[i + 1] - x[i]
        elif i == N - 1:
            y[i] = x[i] - x[i - 1]
        else:
            y[i] = 0.5 * (x[i + 1] - x[i - 1])


@pytest.mark.parametrize("n", [2, 3, 10])
def test_diff_affine_if_elif_else(rng, n):
    x = rng.standard_normal(n)
    close64(diff_with_branches(x), np.gradient(x))


# ---------------------------------------------------------------------------
# Index transforms, affine extents, quasi-affine indices
# ---------------------------------------------------------------------------


@pa.kernel
def transform_2d(x: pa.f64[2 * K + 21, 4 * L], y: pa.Out(pa.f64[K, L])):
    for k in range(K):
        for l in range(5, L):
            y[k, l] = x[2 * k + 20, 4 * l - 20]


@pytest.mark.parametrize("k,l", [(3, 7), (4, 5), (6, 9)])
def test_index_transform_shift_and_scale(rng, k, l):
    x = rng.standard_normal((2 * k + 21, 4 * l))
    y = np.zeros((k, l))
    r = transform_2d(x, y)
    assert r is y
    ref = np.zeros((k, l))
    for a in range(k):
        for b in range(5, l):
            ref[a, b] = x[2 * a + 20, 4 * b - 20]
    close64(y, ref)


@pa.kernel
def subsample_2d(x: pa.f64[2 * K + 21, 4 * L], y: pa.Out(pa.f64[K, L])):
    for k in range(K):
        for l in range(L):
            y[k, l] = x[2 * k + 20, 4 * l + 3]


def test_index_transform_sizes_inferred_from_affine_extents(rng):
    x = rng.standard_normal((2 * 5 + 21, 4 * 3))
    y = subsample_2d(x)  # K, L solved from 2*K + 21 == 31 and 4*L == 12
    assert y.shape == (5, 3)
    close64(y, x[20:29:2, 3::4])


@pa.kernel
def transpose(x: pa.f64[M, N], y: pa.Out(pa.f64[N, M])):
    for m in range(M):
        for n in range(N):
            y[n, m] = x[m, n]


def test_transpose(rng):
    x = rng.standard_normal((4, 7))
    y = transpose(x)
    assert y.shape == (7, 4)
    close64(y, x.T)


@pa.kernel
def pairwise_sum3(x: pa.f64[2 * N + 1], y: pa.Out(pa.f64[N])):
    for i in range(N):
        y[i] = x[2 * i] + x[2 * i + 1] + x[2 * i + 2]


def test_affine_extent_downsample(rng):
    x = rng.standard_normal(2 * 6 + 1)
    ref = x[0:-1:2][:6] + x[1::2][:6] + x[2::2][:6]
    close64(pairwise_sum3(x), ref)


@pa.kernel
def upsample(x: pa.f64[N], y: pa.Out(pa.f64[2 * N])):
    for i in range(2 * N):
        y[i] = x[i // 2]


def test_quasi_affine_floordiv_index(rng):
    x = rng.standard_normal(7)
    y = upsample(x)
    assert y.shape == (14,)
    close64(y, np.repeat(x, 2))


@pa.kernel
def rotate4(x: pa.f64[4], y: pa.Out(pa.f64[N])):
    for i in range(N):
        y[i] = x[(i + 1) % 4] + 10.0 * x[i % 4]


def test_quasi_affine_mod_index_size_keyword(rng):
    # N appears only in the shape of the omitted Out array -> passed as keyword
    x = rng.standard_normal(4)
    y = rotate4(x, N=9)
    assert y.shape == (9,)
    i = np.arange(9)
    close64(y, x[(i + 1) % 4] + 10.0 * x[i % 4])


def test_quasi_affine_mod_index_out_given(rng):
    x = rng.standard_normal(4)
    n = 11
    y = np.zeros(n)
    rotate4(x, y)
    i = np.arange(n)
    close64(y, x[(i + 1) % 4] + 10.0 * x[i % 4])


@pa.kernel
def deinterleave(x: pa.f64[2 * N], even: pa.Out(pa.f64[N]), odd: pa.Out(pa.f64[N])):
    for i in range(2 * N):
        if i % 2 == 0:
            even[i // 2] = x[i]
        else:
            odd[i // 2] = x[i]


def test_quasi_affine_condition_two_outs(rng):
    x = rng.standard_normal(10)
    res = deinterleave(x)
    assert isinstance(res, tuple) and len(res) == 2
    even, odd = res
    close64(even, x[0::2])
    close64(odd, x[1::2])


# ---------------------------------------------------------------------------
# Triangular and strided loops
# ---------------------------------------------------------------------------


@pa.kernel
def exclusive_cumsum(x: pa.f64[N], y: pa.Out(pa.f64[N])):
    for i in range(N):
        y[i] = 0.0
        for j in range(i):
            y[i] += x[j]


@pa.kernel
def suffix_sum(x: pa.f64[N], y: pa.Out(pa.f64[N])):
    for i in range(N):
        s = 0.0
        for j in range(i, N):
            s += x[j]
        y[i] = s


def test_triangular_loops(rng):
    x = rng.standard_normal(9)
    close64(exclusive_cumsum(x), np.concatenate([[0.0], np.cumsum(x)[:-1]]))
    close64(suffix_sum(x), np.cumsum(x[::-1])[::-1])


@pa.kernel
def lower_tri_matvec(A: pa.f64[N, N], x: pa.f64[N], y: pa.Out(pa.f64[N])):
    for i in range(N):
        s = 0.0
        for j in range(i + 1):
            s += A[i, j] * x[j]
        y[i] = s


def test_lower_triangular_matvec(rng):
    A = rng.standard_normal((7, 7))
    x = rng.standard_normal(7)
    close64(lower_tri_matvec(A, x), np.tril(A) @ x)


@pa.kernel
def strided_signs(x: pa.f64[N], y: pa.Out(pa.f64[N])):
    for i in range(0, N, 2):
        y[i] = x[i]
    for i in range(1, N, 2):
        y[i] = -x[i]


@pytest.mark.parametrize("n", [1, 6, 9])
def test_strided_step2(rng, n):
    x = rng.standard_normal(n)
    ref = x.copy()
    ref[1::2] *= -1
    close64(strided_signs(x), ref)


@pa.kernel
def every_third(x: pa.f64[N], y: pa.Out(pa.f64[N])):
    for i in range(1, N, 3):
        y[i] = 2.0 * x[i]


@pytest.mark.parametrize("n", [1, 2, 7, 13])
def test_strided_step3(rng, n):
    x = rng.standard_normal(n)
    y = np.zeros(n)
    every_third(x, y)
    ref = np.zeros(n)
    ref[1::3] = 2.0 * x[1::3]
    close64(y, ref)


@pa.kernel
def reverse(x: pa.f64[N], y: pa.Out(pa.f64[N])):
    for i in range(N - 1, -1, -1):
        y[N - 1 - i] = x[i]


@pa.kernel
def negative_step2(x: pa.f64[N], y: pa.Out(pa.f64[N])):
    for i in range(N - 1, 0, -2):
        y[i] = x[i] + 1.0


@pytest.mark.parametrize("n", [1, 5, 8])
def test_negative_step(rng, n):
    x = rng.standard_normal(n)
    close64(reverse(x), x[::-1])
    y = np.zeros(n)
    negative_step2(x, y)
    ref = np.zeros(n)
    idx = list(range(n - 1, 0, -2))
    ref[idx] = x[idx] + 1.0
    close64(y, ref)


@pa.kernel
def strided_triangular(x: pa.f64[N], y: pa.Out(pa.f64[N]), z: pa.Out(pa.f64[N])):
    for i in range(N):
        y[i] = 0.0
        for j in range(i, N, 2):
            y[i] += x[j]
    for i in range(N):
        z[i] = 0.0
    for i in range(N - 1, -1, -3):
        for j in range(i + 1):
            z[i] += float(j + 1) * x[j]


@pytest.mark.parametrize("n", [1, 5, 10])
def test_strided_triangular(rng, n):
    x = rng.standard_normal(n)
    y, z = strided_triangular(x)
    close64(y, [x[i::2].sum() for i in range(n)])
    zref = np.zeros(n)
    for i in range(n - 1, -1, -3):
        zref[i] = (np.arange(1, i + 2) * x[: i + 1]).sum()
    close64(z, zref)


@pa.kernel
def param_range(x: pa.f64[N].clamped, lo: pa.i32, hi: pa.i32, y: pa.Out(pa.f64[N].zero)):
    for i in range(lo, hi):
        y[i] = x[i] + 1.0


@pytest.mark.parametrize("lo,hi", [(0, 7), (2, 5), (-2, 3), (4, 11), (5, 2)])
def test_param_loop_bounds(rng, lo, hi):
    x = rng.standard_normal(7)
    y = np.zeros(7)
    param_range(x, lo, hi, y)
    ref = np.zeros(7)
    for i in range(max(lo, 0), min(hi, 7)):
        ref[i] = x[i] + 1.0
    close64(y, ref)


# ---------------------------------------------------------------------------
# Reductions to scalars
# ---------------------------------------------------------------------------


@pa.kernel
def total(x: pa.f64[N]) -> pa.f64:
    s = 0.0
    for i in range(N):
        s += x[i]
    return s


@pytest.mark.parametrize("n", [1, 7, 13])
def test_sum_returns_scalar(rng, n):
    x = rng.standard_normal(n)
    r = total(x)
    assert np.ndim(r) == 0 and not isinstance(r, np.ndarray)
    assert float(r) == pytest.approx(x.sum(), rel=1e-12, abs=1e-12)


@pa.kernel
def total2d_f32(x: pa.f32[M, N]) -> pa.f32:
    s = 0.0
    for m in range(M):
        for n in range(N):
            s += x[m, n]
    return s


def test_sum_float32(rng):
    x = rng.random((5, 9)).astype(np.float32)
    r = total2d_f32(x)
    assert float(r) == pytest.approx(float(x.astype(np.float64).sum()), rel=1e-5)


@pa.kernel
def mean_var(x: pa.f64[N]) -> pa.f64:
    s = 0.0
    for i in range(N):
        s += x[i]
    mu = s / N
    v = 0.0
    for i in range(N):
        v += (x[i] - mu) ** 2
    return v / float(N)


@pa.kernel
def center(x: pa.f64[N], c: pa.Out(pa.f64[N])) -> pa.f64:
    s = 0.0
    for i in range(N):
        s += x[i]
    mu = s / float(N)
    for i in range(N):
        c[i] = x[i] - mu
    return mu


def test_mean_and_variance(rng):
    x = rng.standard_normal(11) + 3.0
    assert float(mean_var(x)) == pytest.approx(np.var(x), rel=1e-12)
    res = center(x)
    assert isinstance(res, tuple) and len(res) == 2  # (scalar, out)
    mu, c = res
    assert float(mu) == pytest.approx(x.mean(), rel=1e-12)
    close64(c, x - x.mean())


@pa.kernel
def dot_scaled(x: pa.f64[N], y: pa.f64[N], a: pa.f64) -> pa.f64:
    s = 0.0
    for i in range(N):
        s += a * x[i] * y[i]
    return s


def test_dot_with_scalar_param(rng):
    x, y = rng.standard_normal((2, 10))
    assert float(dot_scaled(x, y, 0.5)) == pytest.approx(0.5 * (x @ y), rel=1e-12, abs=1e-12)
    assert float(dot_scaled(x, y, a=2)) == pytest.approx(2 * (x @ y), rel=1e-12, abs=1e-12)


@pa.kernel
def max_abs(x: pa.f64[N]) -> pa.f64:
    s = 0.0
    for i in range(N):
        s = max(s, abs(x[i]))
    return s


def test_max_reduction(rng):
    x = rng.standard_normal(13)
    assert float(max_abs(x)) == np.abs(x).max()


# ---------------------------------------------------------------------------
# Linear algebra
# ---------------------------------------------------------------------------


@pa.kernel
def matvec(A: pa.f64[M, N], x: pa.f64[N], y: pa.Out(pa.f64[M])):
    for m in range(M):
        s = 0.0
        for n in range(N):
            s += A[m, n] * x[n]
        y[m] = s


@pa.kernel
def matmul(A: pa.f64[M, K], B: pa.f64[K, N], C: pa.Out(pa.f64[M, N])):
    for m in range(M):
        for n in range(N):
            C[m, n] = 0.0
            for k in range(K):
                C[m, n] += A[m, k] * B[k, n]


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (5, 3, 7), (8, 9, 4)])
def test_matvec_matmul(rng, m, k, n):
    A = rng.standard_normal((m, k))
    B = rng.standard_normal((k, n))
    x = rng.standard_normal(k)
    close64(matvec(A, x), A @ x)
    C = matmul(A, B)
    assert C.shape == (m, n)
    close64(C, A @ B)


@pa.kernel
def matmul_f32(A: pa.f32[M, K], B: pa.f32[K, N], C: pa.Out(pa.f32[M, N])):
    for m in range(M):
        for n in range(N):
            acc = 0.0
            for k in range(K):
                acc += A[m, k] * B[k, n]
            C[m, n] = acc


def test_matmul_float32(rng):
    A = rng.standard_normal((6, 5)).astype(np.float32)
    B = rng.standard_normal((5, 7)).astype(np.float32)
    C = matmul_f32(A, B)
    assert C.dtype == np.float32
    close32(C, A.astype(np.float64) @ B.astype(np.float64))


# ---------------------------------------------------------------------------
# In-place updates (sequential semantics)
# ---------------------------------------------------------------------------


@pa.kernel
def double_inplace(x: pa.f64[N]):
    for i in range(N):
        x[i] = 2 * x[i]


@pa.kernel
def prefix_sum_inplace(x: pa.f64[N]):
    for i in range(1, N):
        x[i] += x[i - 1]


@pa.kernel
def suffix_sum_inplace(x: pa.f64[N]):
    for i in range(N - 2, -1, -1):
        x[i] += x[i + 1]


def test_inplace_updates(rng):
    x0 = rng.standard_normal(9)
    x = x0.copy()
    assert double_inplace(x) is None
    close64(x, 2 * x0)
    x = x0.copy()
    assert prefix_sum_inplace(x) is None
    close64(x, np.cumsum(x0))
    x = x0.copy()
    suffix_sum_inplace(x)
    close64(x, np.cumsum(x0[::-1])[::-1])


@pa.kernel
def gauss_seidel_sweep(x: pa.f64[N]):
    for i in range(1, N - 1):
        x[i] = 0.5 * (x[i - 1] + x[i + 1])


def test_inplace_gauss_seidel_sequential(rng):
    x0 = rng.standard_normal(10)
    ref = x0.copy()
    for i in range(1, len(ref) - 1):
        ref[i] = 0.5 * (ref[i - 1] + ref[i + 1])
    x = x0.copy()
    gauss_seidel_sweep(x)
    close64(x, ref)


@pa.kernel
def column_cumsum_inplace(x: pa.f64[M, N]):
    for m in range(1, M):
        for n in range(N):
            x[m, n] += x[m - 1, n]


def test_inplace_2d_carried_dependence(rng):
    x0 = rng.standard_normal((7, 5))
    x = x0.copy()
    column_cumsum_inplace(x)
    close64(x, np.cumsum(x0, axis=0))


@pa.kernel
def augmented_ops(x: pa.f64[N], w: pa.f64[N], y: pa.Out(pa.f64[N])) -> pa.f64:
    p = 1.0
    for i in range(N):
        y[i] = x[i]
        y[i] -= 0.5 * w[i]
        y[i] *= w[i]
        y[i] /= 1.0 + w[i] * w[i]
        p *= 1.0 + 0.1 * x[i]
        p /= 1.0 + 0.05 * w[i]
        p -= 0.01
    return p


def test_augmented_assignments(rng):
    x, w = rng.standard_normal((2, 9))
    p, y = augmented_ops(x, w)
    close64(y, (x - 0.5 * w) * w / (1.0 + w * w))
    ref = 1.0
    for a, b in zip(x, w):
        ref = (ref * (1.0 + 0.1 * a)) / (1.0 + 0.05 * b) - 0.01
    assert float(p) == pytest.approx(ref, rel=1e-12)


@pa.kernel
def piecewise(x: pa.f64[N], y: pa.Out(pa.f64[N])):
    for i in range(N):
        if x[i] < -1.0:
            y[i] = -1.0
        elif x[i] < 0.0:
            y[i] = x[i] * x[i]
        elif x[i] < 1.0 and i % 2 == 0:
            y[i] = 2.0 * x[i]
        else:
            y[i] = x[i] + float(i)


def test_data_dependent_if_elif_else(rng):
    x = rng.uniform(-2.0, 2.0, 13)
    i = np.arange(13)
    ref = np.where(x < -1.0, -1.0,
                   np.where(x < 0.0, x * x,
                            np.where((x < 1.0) & (i % 2 == 0), 2.0 * x, x + i)))
    close64(piecewise(x), ref)


# ---------------------------------------------------------------------------
# Device functions, conditionals
# ---------------------------------------------------------------------------


@pa.func
def huber(r: pa.f64, delta: pa.f64) -> pa.f64:
    a = abs(r)
    if a <= delta:
        return 0.5 * r * r
    else:
        return delta * (a - 0.5 * delta)


@pa.func
def soft_threshold(v: pa.f64, t: pa.f64) -> pa.f64:
    if v > t:
        return v - t
    elif v < -t:
        return v + t
    else:
        return 0.0


@pa.func
def clip01(v: pa.f64) -> pa.f64:
    return 0.0 if v < 0.0 else (1.0 if v > 1.0 else v)


@pa.kernel
def apply_funcs(x: pa.f64[N], lam: pa.f64, h: pa.Out(pa.f64[N]), s: pa.Out(pa.f64[N]),
                c: pa.Out(pa.f64[N])):
    for i in range(N):
        h[i] = huber(x[i], lam)
        s[i] = soft_threshold(x[i], lam)
        c[i] = clip01(x[i])


@pa.kernel
def huber_loss(x: pa.f64[N], delta: pa.f64) -> pa.f64:
    s = 0.0
    for i in range(N):
        s += huber(x[i], delta)
    return s


def test_device_functions(rng):
    x = np.concatenate([rng.uniform(-3, 3, 11), [0.0, 0.7, -0.7, 1.0]])
    lam = 0.7
    h, s, c = apply_funcs(x, lam)
    a = np.abs(x)
    href = np.where(a <= lam, 0.5 * x * x, lam * (a - 0.5 * lam))
    close64(h, href)
    close64(s, np.sign(x) * np.maximum(a - lam, 0.0))
    close64(c, np.clip(x, 0.0, 1.0))
    assert float(huber_loss(x, lam)) == pytest.approx(href.sum(), rel=1e-12)


@pa.kernel
def leaky_relu_mask(x: pa.f64[N], w: pa.f64[N], y: pa.Out(pa.f64[N]), z: pa.Out(pa.f64[N])):
    for i in range(N):
        y[i] = x[i] if x[i] > 0.0 else 0.1 * x[i]
        if (x[i] > -0.5 and x[i] < 0.5) or not (w[i] > 0.0):
            z[i] = 1.0
        else:
            z[i] = 0.0


def test_ternary_and_boolean_ops(rng):
    x, w = rng.standard_normal((2, 12))
    y, z = leaky_relu_mask(x, w)
    close64(y, np.where(x > 0, x, 0.1 * x))
    close64(z, (((x > -0.5) & (x < 0.5)) | ~(w > 0)).astype(float))


# ---------------------------------------------------------------------------
# Scalars: params, sizes and loop variables as values, arithmetic
# ---------------------------------------------------------------------------


@pa.kernel
def axpb(x: pa.f64[N], a: pa.f64, b: pa.f64, y: pa.Out(pa.f64[N])):
    for i in range(N):
        y[i] = a * x[i] + b


def test_scalar_params(rng):
    x = rng.standard_normal(8)
    close64(axpb(x, 1.5, -2.0), 1.5 * x - 2.0)
    close64(axpb(x, 2, 3), 2 * x + 3)  # Python ints for float params
    close64(axpb(x, b=0.25, a=-1.0), -x + 0.25)


@pa.kernel
def first_n(x: pa.f64[N], n: pa.i32, y: pa.Out(pa.f64[N])):
    for i in range(n):
        if i < N:
            y[i] = x[i] * n


@pytest.mark.parametrize("n", [0, 3, 9, 12])
def test_int_param_loop_bound_and_value(rng, n):
    x = rng.standard_normal(9)
    y = np.zeros(9)
    first_n(x, n, y)
    ref = np.zeros(9)
    ref[: min(n, 9)] = x[: min(n, 9)] * n
    close64(y, ref)


@pa.kernel
def scale_first_n_modes(x: pa.f64[N].clamped, n: pa.i64, y: pa.Out(pa.f64[N].zero)):
    for i in range(n):
        y[i] = 3.0 * x[i]


def test_int_param_loop_bound_with_modes(rng):
    x = rng.standard_normal(6)
    y = np.zeros(6)
    scale_first_n_modes(x, 4, y)
    close64(y, np.concatenate([3.0 * x[:4], [0.0, 0.0]]))
    y = np.zeros(6)
    scale_first_n_modes(x, 9, y)  # writes beyond N are dropped (zero mode)
    close64(y, 3.0 * x)


@pa.kernel
def index_values(x: pa.f64[N], y: pa.Out(pa.f64[N])):
    for i in range(N):
        y[i] = float(N) * x[i] + float(i) - i / N


def test_sizes_and_loop_vars_as_values(rng):
    x = rng.standard_normal(7)
    i = np.arange(7)
    close64(index_values(x), 7.0 * x + i - i / 7)


@pa.kernel
def scale_by_free_size(x: pa.f64[N], y: pa.Out(pa.f64[N])):
    for i in range(N):
        s = 0.0
        for k in range(K):
            s += x[i]
        y[i] = s + float(K)


def test_size_passed_as_keyword(rng):
    x = rng.standard_normal(5)
    close64(scale_by_free_size(x, K=3), 3 * x + 3.0)
    close64(scale_by_free_size(x, K=0), np.zeros(5))


class dims:
    """Sizes reached through an attribute (``dims.K``), as a module of sizes is used."""
    N, K = N, K


@pa.kernel
def scale_by_attribute_size(x: pa.f64[dims.N], y: pa.Out(pa.f64[dims.N])):
    for t in range(dims.K):
        for i in range(dims.N):
            y[i] += x[i]


def test_size_reached_through_an_attribute_only_in_a_loop_bound(rng):
    # dims.K appears in no array type: the loop bound alone makes it a size of the kernel
    # (it was left out of the ISL parameters: an ISL syntax error at the first call)
    x = rng.standard_normal(5)
    assert "K" in scale_by_attribute_size.ir.sizes
    close64(scale_by_attribute_size(x, K=3), 3 * x)


@pa.kernel
def arith(x: pa.f64[N], w: pa.f64[N], y: pa.Out(pa.f64[6, N])):
    for i in range(N):
        y[0, i] = x[i] + w[i] * 2.0 - 1.0
        y[1, i] = x[i] / w[i]
        y[2, i] = x[i] ** 2 + x[i] ** 3
        y[3, i] = abs(x[i]) ** 0.5
        y[4, i] = -x[i] * (w[i] - x[i])
        y[5, i] = 2.0 ** w[i]


def test_float_arithmetic(rng):
    x = rng.standard_normal(9)
    w = rng.uniform(0.5, 2.0, 9)
    y = arith(x, w)
    ref = np.stack([x + 2 * w - 1, x / w, x**2 + x**3, np.abs(x) ** 0.5, -x * (w - x), 2.0**w])
    close64(y, ref)


@pa.kernel
def float_floordiv_mod(x: pa.f64[N], y: pa.Out(pa.f64[2, N])):
    for i in range(N):
        y[0, i] = x[i] // 0.5
        y[1, i] = x[i] % 0.75


def test_float_floordiv_mod_python_semantics(rng):
    x = rng.uniform(-4, 4, 13)
    y = float_floordiv_mod(x)
    close64(y[0], np.floor_divide(x, 0.5))
    close64(y[1], np.mod(x, 0.75))


@pa.kernel
def int_true_division(x: pa.i32[N], y: pa.Out(pa.f64[N])):
    for i in range(N):
        y[i] = x[i] / 2


def test_int_true_division():
    x = np.array([3, -3, 4, 7, -1, 0], dtype=np.int32)
    close64(int_true_division(x), x / 2)


@pa.kernel
def truncate(x: pa.f64[N], y: pa.Out(pa.i64[N])):
    for i in range(N):
        y[i] = int(x[i] * 10.0)


def test_int_conversion_truncates_toward_zero(rng):
    x = rng.uniform(-2, 2, 11)
    y = truncate(x)
    assert y.dtype == np.int64
    np.testing.assert_array_equal(y, np.trunc(x * 10.0).astype(np.int64))


# ---------------------------------------------------------------------------
# Integer arrays
# ---------------------------------------------------------------------------


@pa.kernel
def int_ops32(x: pa.i32[N], d: pa.i32[N], y: pa.Out(pa.i32[5, N])):
    for i in range(N):
        y[0, i] = x[i] * 3 - 7
        y[1, i] = x[i] // 3
        y[2, i] = x[i] % 4
        y[3, i] = x[i] // d[i]
        y[4, i] = x[i] % d[i]


@pa.kernel
def int_ops64(x: pa.i64[N], d: pa.i64[N], y: pa.Out(pa.i64[5, N])):
    for i in range(N):
        y[0, i] = x[i] * 3 - 7
        y[1, i] = x[i] // 3
        y[2, i] = x[i] % 4
        y[3, i] = x[i] // d[i]
        y[4, i] = x[i] % d[i]


@pytest.mark.parametrize("kern,dt", [(int_ops32, np.int32), (int_ops64, np.int64)])
def test_integer_arrays_floor_semantics(rng, kern, dt):
    x = rng.integers(-20, 21, 13).astype(dt)
    d = rng.choice([-5, -3, -2, -1, 1, 2, 3, 7], 13).astype(dt)
    y = kern(x, d)
    assert y.dtype == dt
    ref = np.stack([x * 3 - 7, x // 3, x % 4, x // d, x % d])  # numpy == Python semantics
    np.testing.assert_array_equal(y, ref)


@pa.kernel
def int_sum(x: pa.i64[N]) -> pa.i64:
    s = 0
    for i in range(N):
        s += x[i]
    return s


@pa.kernel
def int_stencil(x: pa.i32[N].circular, y: pa.Out(pa.i32[N])):
    for i in range(N):
        y[i] = x[i - 1] - 2 * x[i] + x[i + 1]


def test_integer_reduction_and_stencil(rng):
    x = rng.integers(-1000, 1000, 11)
    r = int_sum(x.astype(np.int64))
    assert int(r) == int(x.sum())
    x32 = x.astype(np.int32)
    y = int_stencil(x32)
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, np.roll(x32, 1) - 2 * x32 + np.roll(x32, -1))


# ---------------------------------------------------------------------------
# Temporaries
# ---------------------------------------------------------------------------


@pa.kernel
def separable_blur(x: pa.f64[M, N].clamped, y: pa.Out(pa.f64[M, N])):
    # the temporary holds the horizontally blurred rows plus one edge row on each side
    t = pa.zeros(pa.f64[M + 2, N])
    for m in range(M):
        for n in range(N):
            t[m + 1, n] = (x[m, n - 1] + x[m, n] + x[m, n + 1]) / 3.0
    for n in range(N):
        t[0, n] = t[1, n]
        t[M + 1, n] = t[M, n]
    for m in range(M):
        for n in range(N):
            y[m, n] = (t[m, n] + t[m + 1, n] + t[m + 2, n]) / 3.0


def _separable_ref(x):
    t = (shifted(x, [0, -1], "clamped") + x + shifted(x, [0, 1], "clamped")) / 3.0
    return (shifted(t, [-1, 0], "clamped") + t + shifted(t, [1, 0], "clamped")) / 3.0


@pytest.mark.parametrize("shape", [(5, 7), (9, 4), (1, 3)])
def test_separable_blur_through_temporary(rng, shape):
    x = rng.standard_normal(shape)
    close64(separable_blur(x), _separable_ref(x))


@pytest.mark.parametrize("shape", [(5, 7), (1, 3)])
def test_temporary_with_boundary_mode(rng, shape):
    @pa.kernel
    def separable_blur_mode_temp(x: pa.f64[M, N].clamped, y: pa.Out(pa.f64[M, N])):
        t = pa.empty(pa.f64[M, N].clamped)  # a boundary mode on a temporary
        for m in range(M):
            for n in range(N):
                t[m, n] = (x[m, n - 1] + x[m, n] + x[m, n + 1]) / 3.0
        for m in range(M):
            for n in range(N):
                y[m, n] = (t[m - 1, n] + t[m, n] + t[m + 1, n]) / 3.0

    x = rng.standard_normal(shape)
    close64(separable_blur_mode_temp(x), _separable_ref(x))


@pa.kernel
def two_pass_empty(x: pa.f64[N], y: pa.Out(pa.f64[N])):
    t = pa.empty(pa.f64[N])
    for i in range(N):
        t[i] = x[i] * x[i]
    y[0] = t[0]
    for i in range(1, N):
        y[i] = t[i] + t[i - 1]


@pa.kernel
def zeros_accumulate(x: pa.f64[M, N], y: pa.Out(pa.f64[N])):
    t = pa.zeros(pa.f64[N])
    for m in range(M):
        for n in range(N):
            t[n] += x[m, n]
    for n in range(N):
        y[n] = 2.0 * t[n]


def test_temporaries_empty_and_zeros(rng):
    x = rng.standard_normal(8)
    sq = x * x
    close64(two_pass_empty(x), np.concatenate([[sq[0]], sq[1:] + sq[:-1]]))
    X = rng.standard_normal((5, 6))
    close64(zeros_accumulate(X), 2.0 * X.sum(axis=0))


# ---------------------------------------------------------------------------
# Intrinsics on both dtypes
# ---------------------------------------------------------------------------


@pa.kernel
def intrinsics64(x: pa.f64[N], w: pa.f64[N], y: pa.Out(pa.f64[14, N])):
    for i in range(N):
        y[0, i] = pa.exp(x[i])
        y[1, i] = pa.log(x[i])
        y[2, i] = pa.sqrt(x[i])
        y[3, i] = pa.sin(w[i])
        y[4, i] = pa.cos(w[i])
        y[5, i] = pa.tanh(w[i])
        y[6, i] = pa.erf(w[i])
        y[7, i] = pa.pow(x[i], 2.5)
        y[8, i] = pa.floor(w[i])
        y[9, i] = pa.sign(w[i])
        y[10, i] = abs(w[i])
        y[11, i] = min(x[i], w[i])
        y[12, i] = max(x[i], w[i])
        y[13, i] = pa.rsqrt(x[i])


@pa.kernel
def intrinsics32(x: pa.f32[N], w: pa.f32[N], y: pa.Out(pa.f32[14, N])):
    for i in range(N):
        y[0, i] = pa.exp(x[i])
        y[1, i] = pa.log(x[i])
        y[2, i] = pa.sqrt(x[i])
        y[3, i] = pa.sin(w[i])
        y[4, i] = pa.cos(w[i])
        y[5, i] = pa.tanh(w[i])
        y[6, i] = pa.erf(w[i])
        y[7, i] = pa.pow(x[i], 2.5)
        y[8, i] = pa.floor(w[i])
        y[9, i] = pa.sign(w[i])
        y[10, i] = abs(w[i])
        y[11, i] = min(x[i], w[i])
        y[12, i] = max(x[i], w[i])
        y[13, i] = pa.rsqrt(x[i])


def _intrinsics_ref(x, w):
    x = x.astype(np.float64)
    w = w.astype(np.float64)
    return np.stack([
        np.exp(x), np.log(x), np.sqrt(x), np.sin(w), np.cos(w), np.tanh(w), python_erf(w),
        x**2.5, np.floor(w), np.sign(w), np.abs(w), np.minimum(x, w), np.maximum(x, w),
        1.0 / np.sqrt(x),
    ])


@pytest.mark.parametrize("kern,dt", [(intrinsics64, np.float64), (intrinsics32, np.float32)])
def test_intrinsics(rng, kern, dt):
    n = 13
    x = rng.uniform(0.1, 3.0, n).astype(dt)
    w = np.concatenate([rng.uniform(-2.5, 2.5, n - 3), [0.0, -1.0, 2.0]]).astype(dt)
    y = kern(x, w)
    assert y.dtype == dt and y.shape == (14, n)
    ref = _intrinsics_ref(x, w)
    if dt == np.float64:
        np.testing.assert_allclose(y, ref, rtol=1e-13, atol=1e-14)
    else:
        close32(y, ref)


@pa.kernel
def intrinsics_table(x: pa.f64[N], y: pa.Out(pa.f64[14, N])):
    for i in range(N):
        y[0, i] = pa.exp2(x[i])
        y[1, i] = pa.log2(x[i])
        y[2, i] = pa.log10(x[i])
        y[3, i] = pa.tan(x[i])
        y[4, i] = pa.sinh(x[i])
        y[5, i] = pa.cosh(x[i])
        y[6, i] = pa.asin(x[i])
        y[7, i] = pa.acos(x[i])
        y[8, i] = pa.atan(x[i])
        y[9, i] = pa.asinh(x[i])
        y[10, i] = pa.acosh(1.0 + x[i])
        y[11, i] = pa.atanh(x[i])
        y[12, i] = pa.erfc(x[i])
        y[13, i] = pa.abs(x[i] - 0.5)


def test_intrinsics_quasar_table(rng):
    x = rng.uniform(0.05, 0.95, 11)
    ref = np.stack([
        np.exp2(x), np.log2(x), np.log10(x), np.tan(x), np.sinh(x), np.cosh(x), np.arcsin(x),
        np.arccos(x), np.arctan(x), np.arcsinh(x), np.arccosh(1.0 + x), np.arctanh(x),
        python_erfc(x), np.abs(x - 0.5),
    ])
    np.testing.assert_allclose(intrinsics_table(x), ref, rtol=1e-13, atol=1e-14)


# ---------------------------------------------------------------------------
# float32 stencil
# ---------------------------------------------------------------------------


@pa.kernel
def smooth2d_f32(x: pa.f32[M, N].mirror, a: pa.f32, y: pa.Out(pa.f32[M, N])):
    for m in range(M):
        for n in range(N):
            y[m, n] = a * x[m, n] + (1.0 - a) * 0.25 * (
                x[m - 1, n] + x[m + 1, n] + x[m, n - 1] + x[m, n + 1])


def test_float32_stencil(rng):
    x = rng.standard_normal((6, 5)).astype(np.float32)
    y = smooth2d_f32(x, 0.5)
    assert y.dtype == np.float32
    x64 = x.astype(np.float64)
    nb = sum(shifted(x64, o, "mirror") for o in ([-1, 0], [1, 0], [0, -1], [0, 1]))
    close32(y, 0.5 * x64 + 0.5 * 0.25 * nb)


# ---------------------------------------------------------------------------
# pa.compile and the generated C
# ---------------------------------------------------------------------------


def test_compile_returns_callable_with_source(rng):
    c = pa.compile(blur, target="openmp")
    assert isinstance(c.source, str)
    assert "#pragma omp parallel for" in c.source
    assert blur.source == c.source
    x = rng.standard_normal((5, 6))
    ref = (shifted(x, [0, -1], "clamped") + x + shifted(x, [0, 1], "clamped")) / 3.0
    close64(c(x), ref)
    y = np.zeros_like(x)
    assert c(x, y=y) is y
    close64(y, ref)


def test_source_comments_name_dsl_lines():
    # the statement of `blur` (the kernel object itself need not be inspectable)
    stmt = "y[m, n] = (x[m, n - 1] + x[m, n] + x[m, n + 1]) / 3.0"
    with open(__file__) as f:
        hits = [k + 1 for k, t in enumerate(f.read().splitlines()) if t.strip() == stmt]
    assert len(hits) == 1
    src = pa.compile(blur).source
    comments = re.findall(r"/\*.*?\*/|//[^\n]*", src, flags=re.S)
    numbers = {int(v) for c in comments for v in re.findall(r"\d+", c)}
    assert hits[0] in numbers, "no C comment names the DSL line of the statement"
