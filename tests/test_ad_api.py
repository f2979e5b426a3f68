"""The user-facing AD API: grad / value_and_grad / vjp shapes and conventions,
boundary-mode scatters, in-out arrays, differentiating derived kernels again,
device-function derivatives, custom rules, check_grad, tape accounting and
the structure of the derived IR (reverse order, recomputation, tapes)."""

from __future__ import annotations

import numpy as np
import pytest

import polyad as pa
from polyad import ad, ir
from polyad.ad.pretty import format_kernel
from polyad.testing import interpret

from ad_helpers import (assert_close, check_against_fd, check_grad, check_vjp_against_fd,
                        custom_vjp, derivative, fd_grad, grad, run, scalar_fn,
                        value_and_grad, vjp)
from tv_kernel import tv_cost

M, N = pa.sizes("M N")
(K,) = pa.sizes("K")


def _tv_numpy(g, b, lam):
    gp = np.pad(g, 1, mode="edge")
    return (((g - b) ** 2).sum() + lam * np.abs(gp[1:-1, :-2] - g).sum()
            + lam * np.abs(gp[:-2, 1:-1] - g).sum())


@pytest.fixture
def tv_args(rng):
    return rng.standard_normal((4, 5)), rng.standard_normal((4, 5)), 0.25


# ---- result shapes -------------------------------------------------------------------


def test_grad_single_name_returns_array(tv_args):
    g, b, lam = tv_args
    dg = run(grad(tv_cost, wrt="g"), g, b, lam)
    assert isinstance(dg, np.ndarray) and dg.shape == g.shape and dg.dtype == np.float64
    f = lambda a: _tv_numpy(a["g"], b, lam)  # noqa: E731
    assert_close(dg, fd_grad(f, {"g": g}, "g"), 1e-6, 1e-7)


def test_grad_list_returns_tuple_and_scalar_is_float(tv_args):
    g, b, lam = tv_args
    res = run(grad(tv_cost, wrt=["g", "lam"]), g, b, lam)
    assert isinstance(res, tuple) and len(res) == 2
    dg, dlam = res
    assert isinstance(dlam, float)
    gp = np.pad(g, 1, mode="edge")
    expect = np.abs(gp[1:-1, :-2] - g).sum() + np.abs(gp[:-2, 1:-1] - g).sum()
    assert dlam == pytest.approx(expect, rel=1e-12)
    assert dg.shape == g.shape


def test_grad_dict_returns_dict(tv_args):
    g, b, lam = tv_args
    res = run(grad(tv_cost, wrt={"image": "g", "weight": "lam"}), g, b, lam)
    assert isinstance(res, dict) and set(res) == {"image", "weight"}
    ref = run(grad(tv_cost, wrt=["g", "lam"]), g, b, lam)
    assert_close(res["image"], ref[0], 1e-12, 1e-12)
    assert res["weight"] == pytest.approx(ref[1], rel=1e-12)


def test_value_and_grad(tv_args):
    g, b, lam = tv_args
    C, dg = run(value_and_grad(tv_cost, "g"), g, b, lam)
    assert C == pytest.approx(_tv_numpy(g, b, lam), rel=1e-12)
    C2, (dg2, dl) = run(value_and_grad(tv_cost, ["g", "lam"]), g, b, lam)
    assert C2 == pytest.approx(C, rel=1e-12)
    assert_close(dg2, dg, 1e-12, 1e-12)
    assert isinstance(dl, float)


def test_keyword_arguments(tv_args):
    g, b, lam = tv_args
    d1 = run(grad(tv_cost, "g"), g, b, lam)
    d2 = run(grad(tv_cost, "g"), b=b, lam=lam, g=g)
    assert_close(d1, d2, 0, 0)


def test_derived_kernels_are_cached_kernels():
    k1 = grad(tv_cost, "g")
    assert k1 is grad(tv_cost, "g")
    assert k1 is not grad(tv_cost, ["g"])
    assert isinstance(k1, pa.Kernel)
    assert isinstance(k1.ir, ir.Kernel)
    assert k1.ir.name == "tv_cost_grad_g"
    assert [p.name for p in k1.ir.params] == ["g", "b", "lam", "d_g"]
    assert k1.ir.param("d_g").intent == "out"
    assert k1.ir.param("d_g").type.mode == "clamped"
    assert k1.ir.result is None
    vg = value_and_grad(tv_cost, "g").ir
    assert vg.result is not None
    assert "for m in range(M - 1, -1, -1):" in format_kernel(k1.ir)


def test_source_names_dsl_lines():
    src = grad(tv_cost, "g").source
    assert "adjoint of: C += lam * abs(g[m, n - 1] - g[m, n])" in src
    line = tv_cost.ir.statements[2].line
    assert f"line {line}" in src


# ---- boundary modes: adjoint scatters land where the reads did -------------------------


@pa.kernel
def shifted_sum_clamped(x: pa.f64[N].clamped) -> pa.f64:
    C = 0.0
    for i in range(N):
        C += x[i - 1] + 2.0 * x[i + 2]
    return C


@pa.kernel
def shifted_sum_circular(x: pa.f64[N].circular) -> pa.f64:
    C = 0.0
    for i in range(N):
        C += x[i - 1] + 2.0 * x[i + 2]
    return C


@pa.kernel
def shifted_sum_mirror(x: pa.f64[N].mirror) -> pa.f64:
    C = 0.0
    for i in range(N):
        C += x[i - 1] + 2.0 * x[i + 2]
    return C


@pa.kernel
def shifted_sum_zero(x: pa.f64[N].zero) -> pa.f64:
    C = 0.0
    for i in range(N):
        C += x[i - 1] + 2.0 * x[i + 2]
    return C


def _mode_index(i, n, mode):
    if 0 <= i < n:
        return i
    if mode == "clamped":
        return min(max(i, 0), n - 1)
    if mode == "circular":
        return i % n
    if mode == "mirror":
        return -i if i < 0 else 2 * (n - 1) - i
    return None


@pytest.mark.parametrize("mode,kernel", [("clamped", shifted_sum_clamped),
                                         ("circular", shifted_sum_circular),
                                         ("mirror", shifted_sum_mirror),
                                         ("zero", shifted_sum_zero)])
def test_boundary_mode_scatter(mode, kernel, rng):
    n = 6
    expect = np.zeros(n)
    for i in range(n):
        for off, w in ((-1, 1.0), (2, 2.0)):
            j = _mode_index(i + off, n, mode)
            if j is not None:
                expect[j] += w
    dx = run(grad(kernel, "x"), rng.standard_normal(n))
    assert_close(dx, expect, 0, 1e-14, what=mode)
    if mode == "clamped":
        assert dx[0] == 2.0   # x[-1] (i = 0) and x[0] (i = 1) both land on dx[0]
    assert grad(kernel, "x").ir.param("d_x").type.mode == mode


# ---- vjp ---------------------------------------------------------------------------------


@pa.kernel
def blur(x: pa.f64[M, N].clamped, f: pa.f64[3], y: pa.Out(pa.f64[M, N])):
    for m in range(M):
        for n in range(N):
            y[m, n] = f[0] * x[m, n - 1] + f[1] * x[m, n] + f[2] * x[m, n + 1]


def test_vjp_blur(rng):
    x, f, ybar = rng.standard_normal((4, 5)), rng.standard_normal(3), rng.standard_normal((4, 5))
    xbar = run(vjp(blur, wrt="x"), x, f, ybar)
    # explicit transpose of the clamped blur
    expect = np.zeros_like(x)
    for m in range(4):
        for n in range(5):
            for k, off in enumerate((-1, 0, 1)):
                expect[m, min(max(n + off, 0), 4)] += f[k] * ybar[m, n]
    assert_close(xbar, expect, 1e-12, 1e-12)
    xbar2, fbar = run(vjp(blur, wrt=["x", "f"]), x, f, ybar)
    assert_close(xbar2, expect, 1e-12, 1e-12)
    xp = np.pad(x, ((0, 0), (1, 1)), mode="edge")
    fexp = [np.sum(xp[:, k:k + 5] * ybar) for k in range(3)]
    assert_close(fbar, fexp, 1e-12, 1e-12)
    assert [p.name for p in vjp(blur, "x").ir.params] == ["x", "f", "y_bar", "d_x"]


@pa.kernel
def center(x: pa.f64[N], c: pa.Out(pa.f64[N])) -> pa.f64:
    s = 0.0
    for i in range(N):
        s += x[i]
    mu = s / float(N)
    for i in range(N):
        c[i] = (x[i] - mu) ** 2
    return mu * mu


def test_vjp_with_result_and_out(rng):
    x = rng.standard_normal(5)
    cbar = rng.standard_normal(5)
    params = [p.name for p in vjp(center, "x").ir.params]
    assert params == ["x", "c_bar", "result_bar", "d_x"]
    check_vjp_against_fd(center, "x", {"x": x}, {"c": cbar, "result": 0.7})
    check_vjp_against_fd(center, "x", {"x": x}, {"c": cbar, "result": 0.0})


@pa.kernel
def deinterleave(x: pa.f64[2 * N], even: pa.Out(pa.f64[N]), odd: pa.Out(pa.f64[N])):
    for i in range(2 * N):
        if i % 2 == 0:
            even[i // 2] = pa.sin(x[i])
        else:
            odd[i // 2] = x[i] * x[i]


def test_vjp_two_outputs_affine_condition(rng):
    x = rng.standard_normal(8)
    check_vjp_against_fd(deinterleave, "x", {"x": x},
                         {"even": rng.standard_normal(4), "odd": rng.standard_normal(4)})


@pa.kernel
def exclusive_cumsum(x: pa.f64[N], y: pa.Out(pa.f64[N])):
    for i in range(N):
        y[i] = 0.0
        for j in range(i):
            y[i] += x[j] * x[i]


def test_vjp_triangular_out(rng):
    x = rng.standard_normal(5)
    check_vjp_against_fd(exclusive_cumsum, "x", {"x": x}, {"y": rng.standard_normal(5)})


# ---- in-out arrays -------------------------------------------------------------------------


@pa.kernel
def prefix_sum_inplace(x: pa.f64[N]):
    for i in range(1, N):
        x[i] += x[i - 1]


@pa.kernel
def gauss_seidel_sweep(x: pa.f64[N], w: pa.f64):
    for i in range(1, N - 1):
        x[i] = w * (x[i - 1] + x[i + 1]) + (1.0 - w) * x[i] * x[i]


def test_vjp_inout_does_not_touch_input(rng):
    x0 = rng.standard_normal(6)
    x = x0.copy()
    xbar = rng.standard_normal(6)
    dx = run(vjp(prefix_sum_inplace, "x"), x, xbar)
    assert np.array_equal(x, x0)
    assert_close(dx, np.cumsum(xbar[::-1])[::-1], 1e-12, 1e-12)
    k = vjp(prefix_sum_inplace, "x").ir
    assert all(p.intent != "inout" for p in k.params)
    assert [p.name for p in k.params] == ["x", "x_bar", "d_x"]


def test_vjp_gauss_seidel_inplace_tape(rng):
    x = rng.standard_normal(6)
    check_vjp_against_fd(gauss_seidel_sweep, ["x", "w"], {"x": x, "w": 0.4},
                         {"x": rng.standard_normal(6)})
    k = vjp(gauss_seidel_sweep, "x").ir
    assert ad.tape_arrays(k), "x[i] * x[i] is overwritten in place: it must be taped"


def test_check_grad_inout_vjp(rng):
    res = check_grad(gauss_seidel_sweep, ["x", "w"], rng.standard_normal(6), 0.3)
    assert res.ok, str(res)


# ---- differentiating derived kernels again ------------------------------------------------


@pa.kernel
def energy(x: pa.f64[N].clamped, a: pa.f64) -> pa.f64:
    C = 0.0
    for i in range(N):
        C += a * pa.exp(x[i] * x[i - 1]) + x[i] ** 4
    return C


def test_hessian_vector_product_by_vjp_of_grad(rng):
    x, v = rng.standard_normal(5), rng.standard_normal(5)
    gk = grad(energy, "x")
    hvp = vjp(gk, "x")
    assert [p.name for p in hvp.ir.params] == ["x", "a", "d_x_bar", "d_x"]
    hv = run(hvp, x, 0.3, v)
    eps = 1e-6
    fd = (run(gk, x + eps * v, 0.3) - run(gk, x - eps * v, 0.3)) / (2 * eps)
    assert_close(hv, fd, 1e-6, 1e-7)


def test_grad_of_value_and_grad_kernel(rng):
    x = rng.standard_normal(5)
    vg = value_and_grad(energy, "x")
    again = grad(vg, "x")            # the value it returns, differentiated again
    assert_close(run(again, x, 0.3), run(grad(energy, "x"), x, 0.3), 1e-12, 1e-12)


def test_mixed_second_derivative(rng):
    x = rng.standard_normal(4)
    # d/da of <grad_x E, v> = sum_i v_i * d^2E / dx_i da
    gk = grad(energy, "x")
    v = rng.standard_normal(4)
    da = run(vjp(gk, "a"), x, 0.3, v)
    xp = np.pad(x, 1, mode="edge")[:-2]
    e = np.exp(x * xp)
    dEdx_da = e * xp            # d/dx_i of exp(x_i x_{i-1}) (first factor)
    dEdx_da2 = np.zeros(4)
    for i in range(4):
        dEdx_da2[max(i - 1, 0)] += e[i] * x[i]
    assert da == pytest.approx(float(v @ (dEdx_da + dEdx_da2)), rel=1e-10)


# ---- device functions and custom rules ------------------------------------------------------


@pa.func
def softplus(z: pa.f64) -> pa.f64:
    return pa.log(1.0 + pa.exp(z))


@pa.func
def gate(z: pa.f64, t: pa.f64) -> pa.f64:
    s = softplus(z - t)
    if s > 0.5:
        s = s * s
    return s * t


@pa.kernel
def gated(x: pa.f64[N], t: pa.f64) -> pa.f64:
    C = 0.0
    for i in range(N):
        C += gate(x[i], t) + softplus(x[i])
    return C


def test_device_function_derivatives_are_device_functions(rng):
    k = grad(gated, ["x", "t"]).ir
    names = [f.name for f in k.funcs]
    for f in ("gate", "softplus", "gate_d_z", "gate_d_t", "softplus_d_z"):
        assert f in names
    assert names.index("softplus_d_z") < names.index("gate_d_z")   # callees first
    d = k.func("gate_d_z")
    assert [p for p, _ in d.params] == ["z", "t"]
    check_against_fd(gated, ["x", "t"], {"x": rng.standard_normal(5) * 2, "t": 0.4})


def test_device_function_derived_once_and_cached():
    k1 = ad.grad_kernel(gated.ir, "x")
    k2 = ad.grad_kernel(gated.ir, "t")
    assert k1.func("softplus_d_z") is k2.func("softplus_d_z")


def test_device_function_differentiated_twice(rng):
    x, v = rng.standard_normal(4), rng.standard_normal(4)
    gk = grad(gated, "x")
    hv = run(vjp(gk, "x"), x, 0.4, v)
    assert "softplus_d_z_d_z" in [f.name for f in vjp(gk, "x").ir.funcs]
    eps = 1e-6
    fd = (run(gk, x + eps * v, 0.4) - run(gk, x - eps * v, 0.4)) / (2 * eps)
    assert_close(hv, fd, 1e-6, 1e-7)


@pa.func
def cube(z: pa.f64) -> pa.f64:
    return z * z * z


@pa.func
def cube_rule_scaled(z: pa.f64) -> pa.f64:
    return 30.0 * z * z        # 10x the true derivative: detectably used


@pa.kernel
def cube_sum(x: pa.f64[N]) -> pa.f64:
    C = 0.0
    for i in range(N):
        C += cube(x[i])
    return C


def test_custom_derivative_overrides_builtin_rule(rng):
    x = rng.standard_normal(4)
    builtin = run(grad(cube_sum, "x"), x)
    assert_close(builtin, 3 * x * x, 1e-12, 1e-12)
    try:
        derivative(cube)(cube_rule_scaled)
        custom = run(grad(cube_sum, "x"), x)
        assert_close(custom, 30 * x * x, 1e-12, 1e-12)
        # check_grad must notice the wrong rule
        res = check_grad(cube_sum, "x", x)
        assert not res.ok and res.max_rel_error > 0.5
        assert "FAILED" in str(res) and set(res.direction) == {"x"}
    finally:
        from polyad.ad import funcs, rules
        rules.FUNC_RULES.pop(cube.__polyad_func__, None)
        funcs.clear_cache()
        from polyad import derivatives
        derivatives._RULES_VERSION[0] += 1
    assert_close(run(grad(cube_sum, "x"), x), 3 * x * x, 1e-12, 1e-12)


@pa.func
def hinge2(z: pa.f64, m: pa.f64) -> pa.f64:
    return max(m - z, 0.0) ** 2


@pa.kernel
def hinge_loss(x: pa.f64[N], m: pa.f64) -> pa.f64:
    C = 0.0
    for i in range(N):
        C += hinge2(x[i], m)
    return C


def test_custom_vjp_correct_rules_pass_check(rng):
    @pa.func
    def hinge2_dz(z: pa.f64, m: pa.f64) -> pa.f64:
        return -2.0 * max(m - z, 0.0)

    def hinge2_dm(z: pa.f64, m: pa.f64) -> pa.f64:   # a plain function is fine too
        return 2.0 * max(m - z, 0.0)

    try:
        custom_vjp(hinge2, z=hinge2_dz, m=hinge2_dm)
        k = grad(hinge_loss, ["x", "m"]).ir
        assert k.func("hinge2_d_z").body == hinge2_dz.__polyad_func__.body
        res = check_grad(hinge_loss, ["x", "m"], rng.standard_normal(6), 0.5)
        assert res.ok, str(res)
        check_against_fd(hinge_loss, ["x", "m"], {"x": rng.standard_normal(6), "m": 0.5})
    finally:
        from polyad.ad import funcs, rules
        rules.FUNC_RULES.pop(hinge2.__polyad_func__, None)
        funcs.clear_cache()


def test_derivative_needs_wrt_for_multi_parameter_function():
    with pytest.raises(TypeError, match="wrt"):
        derivative(hinge2)
    with pytest.raises(ValueError, match="no parameter"):
        derivative(hinge2, wrt="q")(cube_rule_scaled)


# ---- check_grad ------------------------------------------------------------------------------


def test_check_grad_reports(tv_args):
    g, b, lam = tv_args
    res = check_grad(tv_cost, ["g", "lam"], g, b, lam, directions=4)
    assert res.ok and res.max_rel_error < 1e-7, str(res)
    assert len(res.errors) == 4
    assert set(res.direction) == {"g", "lam"}
    assert np.shape(res.direction["g"]) == g.shape
    assert "OK" in str(res)


def test_check_grad_array_valued_kernel(rng):
    res = check_grad(blur, ["x", "f"], rng.standard_normal((3, 4)), rng.standard_normal(3))
    assert res.ok, str(res)


# ---- activity, recomputation and tapes --------------------------------------------------------


@pa.kernel
def conv1d(x: pa.f64[N].clamped, w: pa.f64[K], b: pa.f64[N]) -> pa.f64:
    junk = 0.0
    for i in range(N):
        junk += b[i] * b[i]          # inactive: depends on b only
    C = 0.0
    for i in range(N):
        s = 0.0
        for k in range(K):
            s += w[k] * x[i + k - 1]
        C += pa.tanh(s) * b[i] + junk
    return C


def test_loop_local_accumulator_is_recomputed_not_taped(rng):
    k = grad(conv1d, ["x", "w"]).ir
    assert not ad.tape_arrays(k)
    sources = [st.source for st in k.statements]
    assert "recompute: s += w[k] * x[i + k - 1]" in sources
    assert "recompute: s = 0.0" in sources
    # inactive code is not differentiated: nothing about junk or b's adjoint
    assert "adjoint of: junk += b[i] * b[i]" not in sources
    assert "junk += b[i] * b[i]" not in sources        # not needed by the gradient: removed
    assert not any(p.name == "d_b" for p in k.params)
    assert all("d_junk" not in n for n, _ in k.locals)
    assert ad.tape_bytes(k, {"N": 100, "K": 5}) == 0
    check_against_fd(conv1d, ["x", "w"], {"x": rng.standard_normal(6), "w": rng.standard_normal(3),
                                          "b": rng.standard_normal(6)}, sizes={})


@pa.kernel
def prod_vec(x: pa.f64[N]) -> pa.f64:
    p = 1.0
    for i in range(N):
        p = p * x[i]
    return p


def test_overwritten_scalar_is_taped():
    k = grad(prod_vec, "x").ir
    tapes = ad.tape_arrays(k)
    assert len(tapes) == 1 and tapes[0].type.shape == (ir.SizeVar("N"),)
    assert ad.tape_bytes(k, {"N": 1000}) == 8000
    assert grad(prod_vec, "x").tape_bytes(N=10) == 80
    (rep,) = ad.tape_report(k, {"N": 7})
    assert rep["type"] == "f64[N]" and rep["bytes"] == 56
    assert rep["what"] == "p read by: p = p * x[i] (line 520)"


@pa.kernel
def user_tape_named(x: pa.f64[N]) -> pa.f64:
    tape_x = pa.zeros(pa.f64[N])
    for i in range(N):
        tape_x[i] = x[i] * x[i]
    s = 0.0
    for i in range(N):
        s += tape_x[i] * x[i]
    return s


def test_temporaries_carry_their_role_not_a_name_convention():
    """A user array named like a tape is no tape; the derived kernel's temporaries say
    what made them."""
    k = grad(user_tape_named, "x").ir
    assert not ad.tape_arrays(k) and ad.tape_bytes(k, {"N": 10}) == 0
    roles = {t.name: t.role for t in k.temps}
    assert roles["tape_x"] == "user" and roles["d_tape_x"] == "adjoint"
    assert {t.role for t in grad(prod_vec, "x").ir.temps} == {"tape"}


@pa.kernel
def outer_invariant(x: pa.f64[M], y: pa.f64[N]) -> pa.f64:
    a = 1.0
    C = 0.0
    for i in range(M):
        a = a * x[i]
        for j in range(N):
            C += pa.sin(a * y[j])
    return C


def test_tape_at_outermost_constant_level(rng):
    k = grad(outer_invariant, ["x", "y"]).ir
    tapes = ad.tape_arrays(k)
    # a changes once per i: one tape of the i loop for the old value (a = a * x[i]) and one
    # for the value read in the j loop, both of extent M - not M * N
    assert tapes and all(t.type.shape == (ir.SizeVar("M"),) for t in tapes)
    check_against_fd(outer_invariant, ["x", "y"], {"x": rng.uniform(0.5, 1.5, 3),
                                                   "y": rng.standard_normal(4)})


def test_adjoint_statement_structure():
    k = grad(prod_vec, "x").ir
    names = [st.name for st in k.statements]
    assert names == [f"S{i}" for i in range(len(names))]
    adj = [st for st in k.statements if st.source.startswith("adjoint of: p = p * x[i]")]
    assert adj and all(st.loops[0].step == -1 for st in adj)
    assert all(st.line == prod_vec.ir.statements[1].line for st in adj)
    # explicit zeroing of the gradient output comes first
    first = k.statements[0]
    assert first.target.array == "d_x" and first.op == "=" and first.expr.value == 0.0


@pa.kernel
def two_scalars(x: pa.f64[N], y: pa.f64[N]) -> pa.f64:
    C = 0.0
    for i in range(N):
        C += x[i] * y[i]
    return C


def test_no_path_gives_zeros_and_warning(rng):
    from polyad.derivatives import NoGradientPathWarning

    @pa.kernel
    def ignores_y(x: pa.f64[N], y: pa.f64[N]) -> pa.f64:
        C = 0.0
        unused = 0.0
        for i in range(N):
            C += x[i] * x[i]
            unused += y[i]
        return C

    with pytest.warns(NoGradientPathWarning, match="'y' has no influence"):
        k = grad(ignores_y, ["x", "y"])
    x, y = rng.standard_normal(4), rng.standard_normal(4)
    dx, dy = run(k, x, y)
    assert_close(dx, 2 * x, 1e-12, 1e-12)
    assert np.array_equal(dy, np.zeros(4))


def test_interpret_runs_derived_kernels_directly(rng):
    x, y = rng.standard_normal(4), rng.standard_normal(4)
    k = ad.value_and_grad_kernel(two_scalars.ir, ["x", "y"])
    r, arrays = interpret(k, {"x": x, "y": y}, {"N": 4})
    assert r == pytest.approx(float(x @ y))
    assert_close(arrays["d_x"], y, 0, 0)
    assert_close(arrays["d_y"], x, 0, 0)


def test_scalar_fn_helper_consistency(tv_args):
    g, b, lam = tv_args
    f = scalar_fn(tv_cost, {"g": g, "b": b, "lam": lam})
    assert f({"g": g, "b": b, "lam": lam}) == pytest.approx(_tv_numpy(g, b, lam), rel=1e-12)


# ---- second order through tapes; returned value recomputed in the reverse sweep -------------


@pa.kernel
def logsumexp(x: pa.f64[N]) -> pa.f64:
    m = x[0]
    for i in range(1, N):
        m = max(m, x[i])
    s = 0.0
    for i in range(N):
        s += pa.exp(x[i] - m)
    return m + pa.log(s)


@pytest.mark.parametrize("kernel", [prod_vec, logsumexp], ids=["prod", "logsumexp"])
def test_hvp_through_tapes(kernel, rng):
    x, v = rng.uniform(0.5, 1.5, 5), rng.standard_normal(5)
    gk = grad(kernel, "x")
    assert ad.tape_arrays(gk.ir)          # the gradient kernel has a tape ...
    hvp = vjp(gk, "x")                    # ... and is differentiated again through it
    hv = run(hvp, x, v)
    eps = 1e-6
    fd = (run(gk, x + eps * v) - run(gk, x - eps * v)) / (2 * eps)
    assert_close(hv, fd, 1e-6, 1e-7)
    if kernel is logsumexp:
        p = np.exp(x - x.max()) / np.exp(x - x.max()).sum()
        assert_close(hv, p * v - p * (p @ v), 1e-9, 1e-10)   # softmax Jacobian


@pa.kernel
def last_value(x: pa.f64[N]) -> pa.f64:
    t = 0.0
    acc = 0.0
    for i in range(N):
        t = pa.exp(x[i]) * x[i]
        acc += t * t
    return t + acc


def test_value_and_grad_returns_forward_value_when_recomputed(rng):
    x = rng.standard_normal(5)
    k = value_and_grad(last_value, "x")
    assert k.ir.result[0] != "t"          # t is recomputed in the reverse sweep: a copy
    val, dx = run(k, x)
    t = np.exp(x) * x
    assert val == pytest.approx(t[-1] + np.sum(t * t), rel=1e-12)
    check_against_fd(last_value, "x", {"x": x})
