"""``pa.linear_operator`` and ``polyad.solvers`` (CG, gradient descent, nonlinear CG,
Newton-CG with ``pa.hvp``, Adam) on small problems with known solutions."""

from __future__ import annotations

import numpy as np
import pytest

import polyad as pa
from polyad import solvers
from tv_kernel import tv_cost

M, N, B, D = pa.sizes("M N B D")


@pa.kernel
def blur(x: pa.f64[M, N].clamped, f: pa.f64[5], y: pa.Out(pa.f64[M, N])):
    for m in range(M):
        for n in range(N):
            y[m, n] = (f[0] * x[m, n - 2] + f[1] * x[m, n - 1] + f[2] * x[m, n]
                       + f[3] * x[m, n + 1] + f[4] * x[m, n + 2])


@pa.kernel
def grad2d(x: pa.f64[M, N].clamped, gx: pa.Out(pa.f64[M, N])):
    for m in range(M):
        for n in range(N):
            gx[m, n] = x[m, n + 1] - x[m, n] + x[m + 1, n] - x[m, n]


@pa.kernel
def ridge_logreg(X: pa.f64[B, D], y: pa.f64[B], w: pa.f64[D], lam: pa.f64) -> pa.f64:
    loss = 0.0
    for i in range(B):
        z = 0.0
        for j in range(D):
            z += X[i, j] * w[j]
        loss += pa.log(1.0 + pa.exp(-y[i] * z))
    for j in range(D):
        loss += lam * w[j] * w[j]
    return loss


@pa.kernel
def quad2(a: pa.f64[D], b: pa.f64[D], c: pa.f64[D]) -> pa.f64:
    s = 0.0
    for j in range(D):
        s += (a[j] - c[j]) ** 2 + 3.0 * (b[j] + c[j]) ** 2
    return s


F = np.array([1.0, 4.0, 6.0, 4.0, 1.0]) / 16


def _matrix(op, shape):
    cols = []
    for j in range(int(np.prod(shape))):
        e = np.zeros(int(np.prod(shape)))
        e[j] = 1
        cols.append(np.asarray(op(e.reshape(shape))).ravel())
    return np.stack(cols, axis=1)


def test_linear_operator_forward_transpose_shape(rng):
    A = pa.linear_operator(blur, wrt="x", f=F, M=4, N=5)
    assert A.shape == (20, 20) and A.dtype == np.float64
    x, y = rng.standard_normal((4, 5)), rng.standard_normal((4, 5))
    assert np.sum(A(x) * y) == pytest.approx(np.sum(x * A.T(y)), rel=1e-12)
    Am = _matrix(A, (4, 5))
    np.testing.assert_allclose(_matrix(A.T, (4, 5)), Am.T, rtol=1e-12, atol=1e-14)
    assert A.T.T is A and A.T.shape == (20, 20)


def test_linear_operator_shape_known_after_first_call(rng):
    A = pa.linear_operator(blur, wrt="x", f=F)
    with pytest.raises(pa.ShapeError, match="M=...|call the operator once"):
        A.shape
    A(rng.standard_normal((3, 7)))
    assert A.shape == (21, 21)


def test_linear_operator_errors():
    with pytest.raises(pa.NotLinearError):
        pa.linear_operator(tv_cost, wrt="g", b=np.zeros((2, 2)), lam=0.1)
    with pytest.raises(pa.ArgumentError, match="bind f"):
        pa.linear_operator(blur, wrt="x")
    with pytest.raises(pa.ArgumentError, match="cannot bind"):
        pa.linear_operator(blur, wrt="x", f=F, g=1)


def test_aslinearoperator_with_scipy_solvers(rng):
    sla = pytest.importorskip("scipy.sparse.linalg")
    A = pa.linear_operator(blur, wrt="x", f=F, M=6, N=8)
    L = A.aslinearoperator()
    x = rng.standard_normal((6, 8))
    np.testing.assert_allclose(L.matvec(x.ravel()), A(x).ravel(), rtol=1e-14)
    np.testing.assert_allclose(L.rmatvec(x.ravel()), A.T(x).ravel(), rtol=1e-14)
    sol = sla.lsqr(L, A(x).ravel(), atol=1e-14, btol=1e-14, iter_lim=2000)[0]
    np.testing.assert_allclose(L.matvec(sol), A(x).ravel(), atol=1e-8)


def test_cg_regularised_least_squares_matches_dense_solution(rng):
    A = pa.linear_operator(blur, wrt="x", f=F, M=5, N=6)
    R = pa.linear_operator(grad2d, wrt="x", M=5, N=6)
    y = rng.standard_normal((5, 6))
    lam = 0.05
    seen = []
    x, info = solvers.cg(A, y, lam=lam, R=R, tol=1e-12,
                         callback=lambda k, xk, r: seen.append(r) and False)
    Am, Rm = _matrix(A, (5, 6)), _matrix(R, (5, 6))
    ref = np.linalg.solve(Am.T @ Am + lam * Rm.T @ Rm, Am.T @ y.ravel())
    np.testing.assert_allclose(x.ravel(), ref, rtol=1e-8, atol=1e-10)
    assert info.converged and info.residuals[-1] <= 1e-12
    assert info.iterations == len(info.residuals) - 1 == len(seen)
    assert info.iterations <= 30


def test_cg_callback_stops(rng):
    A = pa.linear_operator(blur, wrt="x", f=F, M=5, N=6)
    x, info = solvers.cg(A, rng.standard_normal((5, 6)), lam=0.1, tol=1e-14,
                         callback=lambda k, xk, r: k >= 3)
    assert info.iterations == 3 and not info.converged and "callback" in info.message


def _logreg_problem(rng):
    X = rng.standard_normal((30, 4))
    y = np.sign(X @ np.array([1.0, -2.0, 0.5, 0.0]) + 0.3 * rng.standard_normal(30))
    return solvers.Objective(ridge_logreg, "w", X=X, y=y, lam=0.1)


@pytest.mark.parametrize("method", ["gradient_descent", "nonlinear_cg", "newton_cg"])
def test_smooth_solvers_reach_the_minimiser(method, rng):
    obj = _logreg_problem(rng)
    ref, _ = solvers.newton_cg(obj, np.zeros(4), tol=1e-12, maxiter=50)
    x, info = getattr(solvers, method)(obj, np.zeros(4), tol=1e-8)
    assert info.converged, info.message
    np.testing.assert_allclose(x, ref, rtol=1e-5, atol=1e-6)
    assert np.linalg.norm(obj(x)[1]) < 1e-6
    assert info.history[-1] <= info.history[0]


def test_newton_needs_fewer_iterations_than_gradient_descent(rng):
    obj = _logreg_problem(rng)
    _, gd = solvers.gradient_descent(obj, np.zeros(4), tol=1e-8)
    _, nt = solvers.newton_cg(obj, np.zeros(4), tol=1e-8)
    assert nt.iterations < gd.iterations


def test_adam_over_a_dict_of_parameters(rng):
    c = rng.standard_normal(5)
    obj = solvers.Objective(quad2, {"first": "a", "second": "b"}, c=c)
    params, info = solvers.adam(obj, {"first": np.zeros(5), "second": np.zeros(5)}, lr=0.05,
                                steps=600)
    assert set(params) == {"first", "second"}
    np.testing.assert_allclose(params["first"], c, atol=1e-3)
    np.testing.assert_allclose(params["second"], -c, atol=1e-3)
    assert info.history[-1] < 1e-4 * info.history[0]


def test_progress_line(capsys, rng):
    A = pa.linear_operator(blur, wrt="x", f=F, M=5, N=6)
    solvers.cg(A, rng.standard_normal((5, 6)), lam=0.1, progress=True)
    err = capsys.readouterr().err
    assert "cg: iteration" in err and "residual" in err and "converged" in err


@pa.kernel
def grad_pair(x: pa.f64[M, N].clamped, gx: pa.Out(pa.f64[M, N]), gy: pa.Out(pa.f64[M, N])):
    for m in range(M):
        for n in range(N):
            gx[m, n] = x[m, n + 1] - x[m, n]
            gy[m, n] = x[m + 1, n] - x[m, n]


def test_operator_with_several_outputs(rng):
    R = pa.linear_operator(grad_pair, wrt="x", M=4, N=5)
    assert R.shape == (40, 20) and R.out_shapes == [(4, 5), (4, 5)]
    x = rng.standard_normal((4, 5))
    a, b = rng.standard_normal((4, 5)), rng.standard_normal((4, 5))
    gx, gy = R(x)
    assert np.sum(gx * a) + np.sum(gy * b) == pytest.approx(np.sum(x * R.T((a, b))), rel=1e-12)
    with pytest.raises(pa.ArgumentError, match="tuple of 2"):
        R.T(a)
    pytest.importorskip("scipy.sparse.linalg")
    L = R.aslinearoperator()
    v = rng.standard_normal(40)
    assert np.dot(L.matvec(x.ravel()), v) == pytest.approx(np.dot(x.ravel(), L.rmatvec(v)))
    # and as a regulariser in CG: the dense normal equations agree
    A = pa.linear_operator(blur, wrt="x", f=F, M=4, N=5)
    y = rng.standard_normal((4, 5))
    xs, info = solvers.cg(A, y, lam=0.1, R=R, tol=1e-12)
    Am = _matrix(A, (4, 5))
    Rm = np.concatenate([_matrix(lambda z: R(z)[0], (4, 5)), _matrix(lambda z: R(z)[1], (4, 5))])
    ref = np.linalg.solve(Am.T @ Am + 0.1 * Rm.T @ Rm, Am.T @ y.ravel())
    np.testing.assert_allclose(xs.ravel(), ref, rtol=1e-8, atol=1e-10)
