"""Kernels calling kernels: the callee is inlined, so scheduling and AD see one kernel."""

import numpy as np
import pytest

import polyad as pa

M, N, P = pa.sizes("M N P")


@pa.kernel
def blur_rows(x: pa.f64[M, N].clamped, y: pa.Out(pa.f64[M, N])):
    for m in range(M):
        for n in range(N):
            y[m, n] = (x[m, n - 1] + x[m, n] + x[m, n + 1]) / 3.0


@pa.kernel
def sum_squares(x: pa.f64[M, N]) -> pa.f64:
    s = 0.0
    for m in range(M):
        for n in range(N):
            s += x[m, n] ** 2
    return s


@pa.kernel
def scale_rows(x: pa.f64[M, N], k: pa.i64, w: pa.f64, y: pa.Out(pa.f64[M, N])):
    for m in range(M):
        for n in range(k, N):
            y[m, n] = w * x[m, n]


@pa.kernel
def blurred_energy(a: pa.f64[P, P].clamped, w: pa.f64) -> pa.f64:
    t = pa.zeros(pa.f64[P, P])
    blur_rows(a, t)
    c = sum_squares(t)
    return w * c


@pa.kernel
def per_row_calls(a: pa.f64[P, P], out: pa.Out(pa.f64[P, P])):
    for m in range(P):
        for n in range(P):
            out[m, n] = 0.0
    scale_rows(a, 1, 3.0, out)


def _blur_rows_np(x):
    xp = np.pad(x, ((0, 0), (1, 1)), mode="edge")
    return (xp[:, :-2] + xp[:, 1:-1] + xp[:, 2:]) / 3.0


def test_called_kernels_compute_what_they_compute_alone(rng):
    a = rng.standard_normal((6, 6))
    np.testing.assert_allclose(blurred_energy(a, 0.5), 0.5 * (_blur_rows_np(a) ** 2).sum(),
                               rtol=1e-12)


def test_scalar_and_integer_arguments(rng):
    a = rng.standard_normal((5, 5))
    want = 3.0 * a
    want[:, 0] = 0.0
    np.testing.assert_allclose(per_row_calls(a), want, rtol=1e-14)


def test_gradient_follows_the_call_graph(rng):
    a = rng.standard_normal((5, 5))
    dg = pa.grad(blurred_energy, wrt="a")(a, 0.5)
    eps = 1e-6
    for idx in [(0, 0), (2, 3), (4, 4)]:
        e = np.zeros_like(a)
        e[idx] = eps
        fd = (blurred_energy(a + e, 0.5) - blurred_energy(a - e, 0.5)) / (2 * eps)
        assert dg[idx] == pytest.approx(fd, rel=1e-6, abs=1e-8)


def test_call_errors_name_the_line():
    with pytest.raises(pa.DSLError, match="boundary mode 'clamped'") as ei:
        @pa.kernel
        def unchecked_caller(a: pa.f64[P, P], out: pa.Out(pa.f64[P, P])):
            blur_rows(a, out)  # <<mode-mismatch
    marker = next(k for k, line in enumerate(open(__file__), 1) if "# <<mode-mismatch" in line)
    assert ei.value.line == marker
    with pytest.raises(pa.DSLError, match="takes 2 positional arguments"):
        @pa.kernel
        def too_few(a: pa.f64[P, P].clamped):
            blur_rows(a)
    with pytest.raises(pa.DSLError, match="must be a statement of its own"):
        @pa.kernel
        def in_expression(a: pa.f64[P, P]) -> pa.f64:
            s = 2.0 * sum_squares(a)
            return s
    with pytest.raises(pa.DSLError, match="extent"):
        @pa.kernel
        def mismatched(a: pa.f64[P, P].clamped, out: pa.Out(pa.f64[P, P + 1])):
            blur_rows(a, out)
