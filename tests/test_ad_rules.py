"""Derivative rules of every intrinsic and operator, at several points.

Each rule is checked three ways: against an independent closed-form
derivative written here in numpy, against central finite differences, and
through a whole kernel. Single-rule kernels are built directly as IR and run
in the reference interpreter (the rules are AD logic, not compiler logic);
one DSL kernel using every intrinsic runs through ``ad_helpers.run``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import polyad as pa
from polyad import ir
from polyad.ad import NoGradientPathWarning, grad_kernel
from polyad.ad.rules import OP_RULES, RULES
from polyad.intrinsics import INTRINSICS
from polyad.ir import (ArrayType, Binary, Call, Const, Kernel, Load, Loop, LoopVar, Param,
                       ScalarRef, SizeVar, Statement, Unary, f64, i64)
from polyad.testing import interpret

from ad_helpers import assert_close, grad, run

_erf = np.vectorize(math.erf)
_SQPI = 2.0 / math.sqrt(math.pi)

# name -> (points, closed-form derivative)
UNARY = {
    "abs": ([-2.0, -0.3, 0.0, 0.4, 3.0], np.sign),
    "sign": ([-2.0, -0.3, 0.4, 3.0], lambda x: 0 * x),
    "floor": ([-2.5, -0.3, 0.4, 3.7], lambda x: 0 * x),
    "ceil": ([-2.5, -0.3, 0.4, 3.7], lambda x: 0 * x),
    "exp": ([-2.0, 0.0, 0.5, 1.5], np.exp),
    "exp2": ([-2.0, 0.0, 0.5, 1.5], lambda x: np.log(2.0) * 2.0 ** x),
    "log": ([0.1, 0.5, 1.0, 4.0], lambda x: 1 / x),
    "log2": ([0.1, 0.5, 1.0, 4.0], lambda x: 1 / (x * np.log(2.0))),
    "log10": ([0.1, 0.5, 1.0, 4.0], lambda x: 1 / (x * np.log(10.0))),
    "sin": ([-2.0, 0.0, 0.7, 3.0], np.cos),
    "cos": ([-2.0, 0.0, 0.7, 3.0], lambda x: -np.sin(x)),
    "tan": ([-1.2, 0.0, 0.7, 1.3], lambda x: 1 / np.cos(x) ** 2),
    "sinh": ([-2.0, 0.0, 0.7, 2.0], np.cosh),
    "cosh": ([-2.0, 0.0, 0.7, 2.0], np.sinh),
    "tanh": ([-2.0, 0.0, 0.7, 2.0], lambda x: 1 / np.cosh(x) ** 2),
    "asin": ([-0.9, -0.2, 0.0, 0.5, 0.95], lambda x: 1 / np.sqrt(1 - x * x)),
    "acos": ([-0.9, -0.2, 0.0, 0.5, 0.95], lambda x: -1 / np.sqrt(1 - x * x)),
    "atan": ([-3.0, -0.2, 0.0, 0.5, 4.0], lambda x: 1 / (1 + x * x)),
    "asinh": ([-3.0, -0.2, 0.0, 0.5, 4.0], lambda x: 1 / np.sqrt(1 + x * x)),
    "acosh": ([1.1, 1.5, 3.0, 10.0], lambda x: 1 / np.sqrt(x * x - 1)),
    "atanh": ([-0.9, -0.2, 0.0, 0.5, 0.95], lambda x: 1 / (1 - x * x)),
    "sqrt": ([0.05, 0.5, 1.0, 9.0], lambda x: 0.5 / np.sqrt(x)),
    "rsqrt": ([0.05, 0.5, 1.0, 9.0], lambda x: -0.5 * x ** -1.5),
    "erf": ([-2.0, -0.5, 0.0, 0.3, 1.7], lambda x: _SQPI * np.exp(-x * x)),
    "erfc": ([-2.0, -0.5, 0.0, 0.3, 1.7], lambda x: -_SQPI * np.exp(-x * x)),
}

BINARY = {
    # name -> (x points, y points, d/dx, d/dy)
    "pow": ([0.5, 1.5, 2.0, 3.0], [2.0, -1.5, 0.5, 3.0],
            lambda x, y: y * x ** (y - 1), lambda x, y: np.log(x) * x ** y),
    "atan2": ([0.5, -1.5, 2.0, -0.1], [1.0, -0.5, -2.0, 3.0],
              lambda y, x: x / (x * x + y * y), lambda y, x: -y / (x * x + y * y)),
    "max": ([0.5, -1.5, 2.0, 3.0], [1.0, -2.5, 2.0, 3.5],
            lambda a, b: (a >= b) * 1.0, lambda a, b: (a < b) * 1.0),
    "min": ([0.5, -1.5, 2.0, 3.0], [1.0, -2.5, 2.0, 3.5],
            lambda a, b: (a <= b) * 1.0, lambda a, b: (a > b) * 1.0),
}

_N = SizeVar("N")
_VEC = ArrayType(f64, (_N,))


def _x(name="x"):
    return Load(name, (LoopVar("i"),), f64)


def _sum_kernel(name, expr, params=("x",)):
    """C = sum_i expr(i) as hand-built IR."""
    loop = (Loop("i", Const(0, i64), _N, 1),)
    st0 = Statement("S0", (), (0,), (), None, ScalarRef("C"), "=", Const(0.0, f64))
    st1 = Statement("S1", loop, (1, 0), (), None, ScalarRef("C"), "+=", expr, line=7,
                    source=f"C += {ir.expr_str(expr)}")
    return Kernel(name=name, params=tuple(Param(p, _VEC) for p in params), sizes=("N",),
                  locals=(("C", f64),), temps=(), statements=(st0, st1), result=("C", f64))


def _grads(k, wrt, arrays):
    n = len(next(iter(arrays.values())))
    flat = k.statements[-1].expr
    if isinstance(flat, Call) and flat.func in ("sign", "floor", "ceil") or \
            isinstance(flat, Binary) and flat.op == "//":
        # piecewise constant: no derivative path, zeros and a warning
        with pytest.warns(NoGradientPathWarning):
            dk = grad_kernel(k, wrt)
    else:
        dk = grad_kernel(k, wrt)
    _, out = interpret(dk, {a: np.array(v, dtype=np.float64) for a, v in arrays.items()},
                       {"N": n})
    return [out[f"d_{w}"] for w in wrt]


def _fd(k, arrays, name, eps=1e-7):
    n = len(arrays[name])
    g = np.zeros(n)
    for i in range(n):
        p = {a: np.array(v, dtype=np.float64) for a, v in arrays.items()}
        m = {a: np.array(v, dtype=np.float64) for a, v in arrays.items()}
        p[name][i] += eps
        m[name][i] -= eps
        g[i] = (interpret(k, p, {"N": n})[0] - interpret(k, m, {"N": n})[0]) / (2 * eps)
    return g


def test_every_intrinsic_has_a_rule():
    assert set(INTRINSICS) <= set(RULES), set(INTRINSICS) - set(RULES)
    assert isinstance(RULES, dict) and all(callable(r) for r in RULES.values())
    for op in ir.ARITH_OPS:
        assert op in OP_RULES


def test_every_intrinsic_is_tested_here():
    assert set(INTRINSICS) == set(UNARY) | set(BINARY)


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_rule(name):
    pts, deriv = UNARY[name]
    x = np.array(pts, dtype=np.float64)
    k = _sum_kernel(f"d_{name}", Call(name, (_x(),), f64))
    (dx,) = _grads(k, ["x"], {"x": x})
    assert_close(dx, deriv(x), 1e-12, 1e-12, what=f"{name}' vs closed form")
    smooth = np.ones(len(x), bool) if name != "abs" else x != 0
    assert_close(dx[smooth], _fd(k, {"x": x}, "x")[smooth], 1e-6, 1e-7,
                 what=f"{name}' vs finite differences")


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_rule(name):
    xs, ys, dfx, dfy = BINARY[name]
    x, y = np.array(xs), np.array(ys)
    k = _sum_kernel(f"d_{name}", Call(name, (_x("x"), _x("y")), f64), ("x", "y"))
    dx, dy = _grads(k, ["x", "y"], {"x": x, "y": y})
    assert_close(dx, dfx(x, y), 1e-12, 1e-12, what=f"d{name}/dx")
    assert_close(dy, dfy(x, y), 1e-12, 1e-12, what=f"d{name}/dy")
    ok = x != y  # min/max ties: one-sided derivative
    assert_close(dx[ok], _fd(k, {"x": x, "y": y}, "x")[ok], 1e-6, 1e-7, what=f"{name} FD x")
    assert_close(dy[ok], _fd(k, {"x": x, "y": y}, "y")[ok], 1e-6, 1e-7, what=f"{name} FD y")


def test_abs_derivative_at_zero_is_zero():
    k = _sum_kernel("a", Call("abs", (_x(),), f64))
    (dx,) = _grads(k, ["x"], {"x": np.array([0.0, -0.0, 1e-300, -1e-300])})
    assert list(dx) == [0.0, 0.0, 1.0, -1.0]


def test_max_min_tie_goes_to_first_argument():
    x = np.array([1.0, 2.0])
    kmax = _sum_kernel("m", Call("max", (_x("x"), _x("y")), f64), ("x", "y"))
    dx, dy = _grads(kmax, ["x", "y"], {"x": x, "y": x.copy()})
    assert list(dx) == [1.0, 1.0] and list(dy) == [0.0, 0.0]
    kmin = _sum_kernel("m", Call("min", (_x("x"), _x("y")), f64), ("x", "y"))
    dx, dy = _grads(kmin, ["x", "y"], {"x": x, "y": x.copy()})
    assert list(dx) == [1.0, 1.0] and list(dy) == [0.0, 0.0]


def test_erf_and_acos_formulas():
    """The two formulas the issue spells out."""
    x = np.array([-0.7, 0.0, 0.4])
    (d,) = _grads(_sum_kernel("e", Call("erf", (_x(),), f64)), ["x"], {"x": x})
    assert_close(d, 2 / np.sqrt(np.pi) * np.exp(-x ** 2), 1e-14, 0)
    (d,) = _grads(_sum_kernel("a", Call("acos", (_x(),), f64)), ["x"], {"x": x})
    assert_close(d, -1 / np.sqrt(1 - x ** 2), 1e-14, 0)


# ---- operators -----------------------------------------------------------------

OPS = {
    "add": (lambda a, b: Binary("+", a, b, f64), lambda x, y: (1 + 0 * x, 1 + 0 * y)),
    "sub": (lambda a, b: Binary("-", a, b, f64), lambda x, y: (1 + 0 * x, -1 + 0 * y)),
    "mul": (lambda a, b: Binary("*", a, b, f64), lambda x, y: (y, x)),
    "div": (lambda a, b: Binary("/", a, b, f64), lambda x, y: (1 / y, -x / y ** 2)),
    "pow_active_exponent": (lambda a, b: Binary("**", a, b, f64),
                            lambda x, y: (y * x ** (y - 1), np.log(x) * x ** y)),
    "mod": (lambda a, b: Binary("%", a, b, f64), lambda x, y: (1 + 0 * x, -np.floor(x / y))),
    "floordiv": (lambda a, b: Binary("//", a, b, f64), lambda x, y: (0 * x, 0 * y)),
    "neg": (lambda a, b: Binary("*", Unary("neg", a, f64), b, f64), lambda x, y: (-y, -x)),
}


@pytest.mark.parametrize("op", sorted(OPS))
def test_operator_rule(op):
    build, deriv = OPS[op]
    x = np.array([0.7, 1.9, 2.5, 4.2])
    y = np.array([1.3, 0.6, 2.1, 1.1])
    k = _sum_kernel(op, build(_x("x"), _x("y")), ("x", "y"))
    dx, dy = _grads(k, ["x", "y"], {"x": x, "y": y})
    ex, ey = deriv(x, y)
    assert_close(dx, ex, 1e-12, 1e-12, what=f"{op} d/dx")
    assert_close(dy, ey, 1e-12, 1e-12, what=f"{op} d/dy")
    assert_close(dx, _fd(k, {"x": x, "y": y}, "x"), 1e-6, 1e-7)
    assert_close(dy, _fd(k, {"x": x, "y": y}, "y"), 1e-6, 1e-7)


@pytest.mark.parametrize("n", [0, 1, 2, 3, -2])
def test_integer_power_constant(n):
    x = np.array([-1.5, -0.5, 0.0, 0.5, 2.0]) if n >= 0 else np.array([-1.5, 0.5, 2.0])
    k = _sum_kernel("p", Binary("**", _x(), Const(float(n), f64), f64))
    (dx,) = _grads(k, ["x"], {"x": x})
    assert_close(dx, n * x ** (n - 1) if n != 0 else 0 * x, 1e-12, 1e-12)
    assert np.all(np.isfinite(dx))  # 0 ** (n - 1) never appears for n in {0, 1}


@pytest.mark.parametrize("e", [0.5, 1.5, 2.5, -0.7])
def test_real_power_constant(e):
    x = np.array([0.3, 1.0, 2.5])
    k = _sum_kernel("p", Binary("**", _x(), Const(e, f64), f64))
    (dx,) = _grads(k, ["x"], {"x": x})
    assert_close(dx, e * x ** (e - 1), 1e-12, 1e-12)
    assert_close(dx, _fd(k, {"x": x}, "x"), 1e-6, 1e-7)


(Q,) = pa.sizes("Q")


@pa.kernel
def int_param_power(x: pa.f64[Q], n: pa.i32) -> pa.f64:
    C = 0.0
    for i in range(Q):
        C += x[i] ** n
    return C


@pytest.mark.parametrize("n", [0, 1, 2, 3])
def test_integer_power_int_param(n):
    x = np.array([-1.5, 0.0, 0.5, 2.0])
    dk = grad_kernel(int_param_power.ir, "x")
    _, out = interpret(dk, {"x": x.copy(), "n": n}, {"Q": 4})
    assert_close(out["d_x"], n * x ** (n - 1) if n else 0 * x, 1e-12, 1e-12)
    assert np.all(np.isfinite(out["d_x"]))


# ---- every intrinsic in one DSL kernel (compiled when available) --------------

(Z,) = pa.sizes("Z")


@pa.kernel
def all_intrinsics(u: pa.f64[Z], p: pa.f64[Z], c: pa.f64[Z], y: pa.f64[Z]) -> pa.f64:
    """u: unrestricted, p: positive, c: in (-1, 1), y: in (1, 3)."""
    C = 0.0
    for i in range(Z):
        C += abs(u[i]) + pa.sign(u[i]) + pa.floor(u[i]) + pa.ceil(u[i]) + pa.exp(u[i])
        C += pa.exp2(u[i]) + pa.log(p[i]) + pa.log2(p[i]) + pa.log10(p[i]) + pa.sin(u[i])
        C += pa.cos(u[i]) + pa.tan(c[i]) + pa.sinh(u[i]) + pa.cosh(u[i]) + pa.tanh(u[i])
        C += pa.asin(c[i]) + pa.acos(c[i]) + pa.atan(u[i]) + pa.asinh(u[i]) + pa.acosh(y[i])
        C += pa.atanh(c[i]) + pa.sqrt(p[i]) + pa.rsqrt(p[i]) + pa.erf(u[i]) + pa.erfc(u[i])
        C += pa.pow(p[i], u[i]) + pa.atan2(u[i], p[i]) + max(u[i], c[i]) + min(u[i], c[i])
    return C


def test_all_intrinsics_in_one_kernel(rng):
    n = 5
    u = rng.uniform(-1.5, 1.5, n)
    p = rng.uniform(0.2, 3.0, n)
    c = rng.uniform(-0.9, 0.9, n)
    y = rng.uniform(1.1, 3.0, n)
    du, dp, dc, dy = run(grad(all_intrinsics, ["u", "p", "c", "y"]), u, p, c, y)
    ln2, ln10 = np.log(2.0), np.log(10.0)
    eu = (np.sign(u) + np.exp(u) + ln2 * 2 ** u + np.cos(u) - np.sin(u) + np.cosh(u)
          + np.sinh(u) + 1 / np.cosh(u) ** 2 + 1 / (1 + u * u) + 1 / np.sqrt(1 + u * u)
          + _SQPI * np.exp(-u * u) - _SQPI * np.exp(-u * u) + np.log(p) * p ** u
          + p / (p * p + u * u) + (u >= c) + (u <= c))
    ep = (1 / p + 1 / (p * ln2) + 1 / (p * ln10) + 0.5 / np.sqrt(p) - 0.5 * p ** -1.5
          + u * p ** (u - 1) - u / (p * p + u * u))
    ec = (1 / np.cos(c) ** 2 + 1 / np.sqrt(1 - c * c) - 1 / np.sqrt(1 - c * c)
          + 1 / (1 - c * c) + (u < c) + (u > c))
    ey = 1 / np.sqrt(y * y - 1)
    assert_close(du, eu, 1e-10, 1e-10, what="d/du")
    assert_close(dp, ep, 1e-10, 1e-10, what="d/dp")
    assert_close(dc, ec, 1e-10, 1e-10, what="d/dc")
    assert_close(dy, ey, 1e-10, 1e-10, what="d/dy")
