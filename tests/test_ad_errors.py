"""Every AD error case: what is raised, and that it names the DSL line."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import polyad as pa
from polyad import ad, ir
from polyad.ad import NoGradientPathWarning
from polyad.ir import Cast, Load, ScalarRef

from ad_helpers import grad, run, value_and_grad, vjp

(N,) = pa.sizes("N")


@pa.kernel
def scaled(x: pa.f64[N], n: pa.i32, xi: pa.i64[N], y: pa.Out(pa.f64[N])) -> pa.f64:
    C = 0.0
    for i in range(N):
        k = x[i] * 2.0
        y[i] = k * float(xi[i])
        C += y[i] * k * float(n)
    return C


def test_integer_scalar_wrt():
    with pytest.raises(pa.NotDifferentiableError, match="integer parameter 'n'") as ei:
        grad(scaled, "n")
    assert ei.value.line == scaled.ir.line and ei.value.filename == scaled.ir.filename
    assert f":{scaled.ir.line}:" in str(ei.value)


def test_integer_array_wrt():
    with pytest.raises(pa.NotDifferentiableError, match=r"integer parameter 'xi' \(i64\)"):
        grad(scaled, ["x", "xi"])


def test_unknown_wrt():
    with pytest.raises(pa.NotDifferentiableError, match="no parameter 'z'"):
        vjp(scaled, "z")


def test_wrt_an_output():
    with pytest.raises(pa.NotDifferentiableError, match="'y' is an output"):
        vjp(scaled, "y")


def test_wrt_twice_and_bad_types():
    with pytest.raises(pa.NotDifferentiableError, match="twice"):
        grad(scaled, ["x", "x"])
    with pytest.raises(TypeError):
        grad(scaled, 3)
    with pytest.raises(TypeError):
        grad(scaled, [None])
    with pytest.raises(pa.NotDifferentiableError):
        grad(scaled, [])


@pa.kernel
def no_result(x: pa.f64[N], y: pa.Out(pa.f64[N])):
    for i in range(N):
        y[i] = x[i] * x[i]


def test_grad_needs_a_scalar_result():
    with pytest.raises(pa.NotDifferentiableError, match="pa.vjp"):
        grad(no_result, "x")
    with pytest.raises(pa.NotDifferentiableError, match="returns no scalar"):
        value_and_grad(no_result, "x")
    vjp(no_result, "x")  # fine


def _replace_stmt(k: ir.Kernel, index: int, **kw) -> ir.Kernel:
    sts = list(k.statements)
    sts[index] = dataclasses.replace(sts[index], **kw)
    return dataclasses.replace(k, statements=tuple(sts))


def test_active_index_names_the_line():
    # The frontend only accepts affine indices, so an active index can only come from
    # IR built by other means: C += y[i] * k  becomes  C += y[int(k)] * k.
    k = scaled.ir
    st = k.statements[3]
    kk = ScalarRef("k", ir.f64)
    bad = ir.map_expr(st.expr, lambda e: Load("y", (Cast(kk, ir.i64),), ir.f64)
                      if isinstance(e, Load) and e.array == "y" else None)
    kernel = _replace_stmt(k, 3, expr=bad)
    with pytest.raises(pa.NotDifferentiableError, match="active index") as ei:
        ad.grad_kernel(kernel, "x")
    assert ei.value.line == st.line
    assert "depends on k" in str(ei.value)


def test_active_index_of_target_and_loop_bound():
    k = scaled.ir
    st = k.statements[2]           # y[i] = k * float(xi[i])
    kk = ScalarRef("k", ir.f64)
    kernel = _replace_stmt(k, 2, target=Load("y", (Cast(kk, ir.i64),), ir.f64))
    with pytest.raises(pa.NotDifferentiableError, match="active index") as ei:
        ad.grad_kernel(kernel, "x")
    assert ei.value.line == st.line
    # a loop bound computed from active data
    lp = dataclasses.replace(k.statements[1].loops[0], hi=Cast(kk, ir.i64))
    kernel = k
    for j in (1, 2, 3):
        kernel = _replace_stmt(kernel, j, loops=(lp,))
    with pytest.raises(pa.NotDifferentiableError, match="active loop bound") as ei:
        ad.grad_kernel(kernel, "x")
    assert ei.value.line in {k.statements[j].line for j in (1, 2, 3)}  # a line inside the loop


def test_index_read_from_array_rejected_by_frontend():
    with pytest.raises(pa.DSLError, match="not affine"):
        @pa.kernel
        def gather(x: pa.f64[N], idx: pa.i64[N]) -> pa.f64:
            C = 0.0
            for i in range(N):
                C += x[idx[i]]
            return C


def test_integer_data_dependence_is_not_an_error(rng):
    # int(x) used as a *value* is piecewise constant: derivative 0, no error
    @pa.kernel
    def stairs(x: pa.f64[N]) -> pa.f64:
        C = 0.0
        for i in range(N):
            C += float(int(x[i] * 3.0)) + x[i]
        return C

    dx = run(grad(stairs, "x"), rng.standard_normal(5))
    assert np.array_equal(dx, np.ones(5))


def test_no_path_warning_vjp_and_zero_result(rng):
    @pa.kernel
    def floors(x: pa.f64[N], w: pa.f64[N], y: pa.Out(pa.f64[N])):
        for i in range(N):
            y[i] = pa.floor(x[i]) * w[i]

    with pytest.warns(NoGradientPathWarning, match="'x' has no influence on any output") as rec:
        k = vjp(floors, ["x", "w"])
    assert rec[0].filename == __file__          # points at the caller, not into polyad
    x, w, ybar = rng.standard_normal((3, 4))
    dx, dw = run(k, x, w, ybar)
    assert np.array_equal(dx, np.zeros(4))
    np.testing.assert_allclose(dw, np.floor(x) * ybar)


def test_derived_parameter_name_clash():
    @pa.kernel
    def clash(x: pa.f64[N], d_x: pa.f64[N]) -> pa.f64:
        C = 0.0
        for i in range(N):
            C += x[i] * d_x[i]
        return C

    with pytest.raises(pa.NotDifferentiableError, match="named 'd_x'"):
        grad(clash, "x")
    grad(clash, "d_x")   # d_d_x is free
