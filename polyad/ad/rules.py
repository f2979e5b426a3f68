"""Derivative rules: one registry entry per intrinsic and per arithmetic operator.

A rule maps a node to the *local partial derivatives* of the node with
respect to each of its operands, as IR expressions in the primal values::

    partials(Call("exp", (x,)))  ->  (exp(x),)
    partials(Binary("/", a, b))  ->  (1 / b, -(a / (b * b)))

``None`` means "exactly zero" (the operand does not influence the value, or
only through a piecewise-constant function such as ``floor``). Reverse mode
multiplies the incoming adjoint by these partials; forward mode (``tangent``
below: kernels' tangent statements and the derivatives of device functions)
multiplies the operand tangents by the same partials - one table serves both.

Conventions (documented, tested):

* ``abs'(x) = sign(x)`` with ``sign(0) = 0`` (Quasar's choice; JAX and Halide
  take 1 at 0).
* ``min`` / ``max`` follow the taken side, with the interpreter's tie rule
  (``max(a, b) = a if a >= b else b``: at a tie the whole adjoint goes to ``a``).
* ``x ** n``: for an exponent that does not depend on active data the rule is
  ``n * x ** (n - 1)`` (``n = 0`` gives 0, also at ``x = 0``); for an active
  exponent ``d/dn = log(x) * x ** n`` (0 where ``x == 0``).
* ``floor``, ``ceil``, ``sign`` have derivative 0 (piecewise constant).

``RULES`` holds the intrinsic rules (name -> rule), ``OP_RULES`` the operator
rules; every name of ``polyad.intrinsics.INTRINSICS`` has a rule (a test
checks it). User rules for device functions live in ``FUNC_RULES``, filled by
``pa.derivative``; they take precedence over the derivative polyad derives
from the function body.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

from .. import ir
from ..ir import Binary, Call, Cast, Expr, Load, ScalarRef, Select, Unary
from .exprs import (add, call, cast, compare, div, fconst, mul, neg, power, select, sub)

Partials = tuple  # tuple[Optional[Expr], ...], one per operand


def _dt(e: Expr) -> ir.DType:
    return e.dtype if e.dtype.is_float else ir.f64


def _one(e):
    return fconst(1, _dt(e))


def _sq(x):
    return mul(x, x)


def _c(v, e):
    return fconst(v, _dt(e))


# --------------------------------------------------------------------------
# intrinsics
# --------------------------------------------------------------------------

RULES: dict[str, Callable[[Call], Partials]] = {}


def rule(*names):
    def deco(fn):
        for n in names:
            RULES[n] = fn
        return fn
    return deco


@rule("abs")
def _abs(e):
    (x,) = e.args
    return (call("sign", (x,), x.dtype),)


@rule("sign", "floor", "ceil")
def _piecewise_constant(e):
    return (None,) * len(e.args)


@rule("max")
def _max(e):
    a, b = e.args
    taken_a = compare(">=", a, b)
    return (select(taken_a, _one(e), None), select(taken_a, None, _one(e)))


@rule("min")
def _min(e):
    a, b = e.args
    taken_a = compare("<=", a, b)
    return (select(taken_a, _one(e), None), select(taken_a, None, _one(e)))


@rule("exp")
def _exp(e):
    return (e,)


@rule("exp2")
def _exp2(e):
    return (mul(_c(math.log(2.0), e), e),)


@rule("log")
def _log(e):
    (x,) = e.args
    return (div(_one(e), x),)


@rule("log2")
def _log2(e):
    (x,) = e.args
    return (div(_one(e), mul(x, _c(math.log(2.0), e))),)


@rule("log10")
def _log10(e):
    (x,) = e.args
    return (div(_one(e), mul(x, _c(math.log(10.0), e))),)


@rule("sin")
def _sin(e):
    (x,) = e.args
    return (call("cos", (x,), e.dtype),)


@rule("cos")
def _cos(e):
    (x,) = e.args
    return (neg(call("sin", (x,), e.dtype)),)


@rule("tan")
def _tan(e):
    return (add(_one(e), _sq(e)),)


@rule("sinh")
def _sinh(e):
    (x,) = e.args
    return (call("cosh", (x,), e.dtype),)


@rule("cosh")
def _cosh(e):
    (x,) = e.args
    return (call("sinh", (x,), e.dtype),)


@rule("tanh")
def _tanh(e):
    return (sub(_one(e), _sq(e)),)


@rule("asin")
def _asin(e):
    (x,) = e.args
    return (div(_one(e), call("sqrt", (sub(_one(e), _sq(x)),), e.dtype)),)


@rule("acos")
def _acos(e):
    (x,) = e.args
    return (neg(div(_one(e), call("sqrt", (sub(_one(e), _sq(x)),), e.dtype))),)


@rule("atan")
def _atan(e):
    (x,) = e.args
    return (div(_one(e), add(_one(e), _sq(x))),)


@rule("asinh")
def _asinh(e):
    (x,) = e.args
    return (div(_one(e), call("sqrt", (add(_sq(x), _one(e)),), e.dtype)),)


@rule("acosh")
def _acosh(e):
    (x,) = e.args
    return (div(_one(e), call("sqrt", (sub(_sq(x), _one(e)),), e.dtype)),)


@rule("atanh")
def _atanh(e):
    (x,) = e.args
    return (div(_one(e), sub(_one(e), _sq(x))),)


@rule("sqrt")
def _sqrt(e):
    return (div(_c(0.5, e), e),)


@rule("rsqrt")
def _rsqrt(e):
    # d/dx x^(-1/2) = -1/2 x^(-3/2) = -1/2 * rsqrt(x)^3
    return (mul(_c(-0.5, e), mul(e, _sq(e))),)


@rule("erf")
def _erf(e):
    (x,) = e.args
    return (mul(_c(2.0 / math.sqrt(math.pi), e), call("exp", (neg(_sq(x)),), e.dtype)),)


@rule("erfc")
def _erfc(e):
    (x,) = e.args
    return (mul(_c(-2.0 / math.sqrt(math.pi), e), call("exp", (neg(_sq(x)),), e.dtype)),)


@rule("atan2")
def _atan2(e):
    y, x = e.args
    r2 = add(_sq(x), _sq(y))
    return (div(x, r2), neg(div(y, r2)))


@rule("pow")
def _pow(e):
    a, b = e.args
    return _power_partials(e, a, b)


# --------------------------------------------------------------------------
# operators
# --------------------------------------------------------------------------


def _power_partials(e: Expr, a: Expr, b: Expr, b_active: bool = True) -> Partials:
    dt = _dt(e)
    # d/da a**b = b * a**(b-1)
    if isinstance(b, ir.Const):
        if b.value == 0:
            da = None
        else:
            nb = fconst(b.value - 1, b.dtype)
            da = mul(fconst(b.value, dt), power(a, nb))
    else:
        bm1 = sub(b, fconst(1, b.dtype))
        da = mul(b if b.dtype.is_float else ir.Cast(b, dt), power(a, bm1))
        if not b.dtype.is_float:
            # n == 0 gives exactly 0 (also at a == 0, where a ** -1 is inf)
            da = select(compare("==", b, fconst(0, b.dtype)), None, da)
    # d/db a**b = log(a) * a**b   (0 where a == 0)
    db = None
    if b_active and b.dtype.is_float and not isinstance(b, ir.Const):
        db = select(compare("==", a, fconst(0, a.dtype)), None,
                    mul(call("log", (a,), dt), e))
    return (da, db)


def _op_add(e):
    return (_one(e), _one(e))


def _op_sub(e):
    return (_one(e), _c(-1, e))


def _op_mul(e):
    return (e.b, e.a)


def _op_div(e):
    return (div(_one(e), e.b), neg(div(e.a, mul(e.b, e.b))))


def _op_pow(e):
    return _power_partials(e, e.a, e.b)


def _op_mod(e):
    # a % b = a - b * floor(a / b)
    return (_one(e), neg(call("floor", (div(e.a, e.b),), e.dtype)))


def _op_floordiv(e):
    return (None, None)


OP_RULES: dict[str, Callable[[Expr], Partials]] = {
    "+": _op_add,
    "-": _op_sub,
    "*": _op_mul,
    "/": _op_div,
    "**": _op_pow,
    "%": _op_mod,
    "//": _op_floordiv,
    "neg": lambda e: (_c(-1, e),),
}


# --------------------------------------------------------------------------
# user rules for device functions (pa.derivative)
# --------------------------------------------------------------------------

#: FuncDef of a device function -> {parameter name: FuncDef computing d f / d param}
FUNC_RULES: dict[ir.FuncDef, dict[str, tuple[ir.FuncDef, tuple[ir.FuncDef, ...]]]] = {}


def register_func_rule(fdef: ir.FuncDef, param: str, deriv: ir.FuncDef,
                       deps: tuple[ir.FuncDef, ...] = ()) -> None:
    """Use ``deriv`` (same parameters as ``fdef``) as the partial derivative d fdef / d param."""
    names = [p for p, _ in fdef.params]
    if param not in names:
        raise ValueError(f"{fdef.name}() has no parameter {param!r} (parameters: {names})")
    if len(deriv.params) != len(fdef.params):
        raise ValueError(f"the derivative {deriv.name}() must take the same {len(names)} "
                         f"parameter(s) as {fdef.name}(): {', '.join(names)}")
    FUNC_RULES.setdefault(fdef, {})[param] = (deriv, tuple(deps))


def partials(e: Expr) -> Optional[Partials]:
    """Local partials of an intrinsic call or operator node (None: no rule)."""
    if isinstance(e, Call):
        r = RULES.get(e.func)
        return None if r is None else r(e)
    if isinstance(e, Binary):
        r = OP_RULES.get(e.op)
        return None if r is None else r(e)
    if isinstance(e, Unary) and e.op == "neg":
        return OP_RULES["neg"](e)
    return None


def tangent(e: Expr, leaf_tangent: Callable[[Expr], Optional[Expr]],
            funcs=None) -> Optional[Expr]:
    """The forward-mode derivative (tangent) of ``e``; None is an exact zero.

    ``leaf_tangent(x)`` gives the tangent of a read ``x`` (a ``Load`` or a
    ``ScalarRef``; None when it is not varied). Every other node combines its
    operands' tangents with the *same* partials reverse mode uses
    (``partials``): ``d e = sum_k (d e / d operand_k) * d operand_k``.
    ``funcs`` (an ``ad.funcs.FuncLibrary``, or any object with ``get(name)`` and
    ``partial_call(call, k)``) resolves calls of device functions through their
    partial functions. Only float values have tangents.
    """

    def rec(x: Expr) -> Optional[Expr]:
        if not x.dtype.is_float:
            return None
        if isinstance(x, (Load, ScalarRef)):
            return leaf_tangent(x)
        if isinstance(x, Select):
            return select(x.cond, rec(x.a), rec(x.b))
        if isinstance(x, Cast):
            return cast(rec(x.a), x.dtype)
        if isinstance(x, Call) and funcs is not None and funcs.get(x.func) is not None:
            out = None
            for k, a in enumerate(x.args):
                ta = rec(a)
                if ta is not None:
                    out = add(out, mul(funcs.partial_call(x, k), ta))
            return out
        kids = x.children()
        if not kids:
            return None
        ts = [rec(k) for k in kids]
        if all(t is None for t in ts):
            return None
        ps = partials(x)
        if ps is None:
            raise TypeError(f"no derivative rule for {ir.expr_str(x)}")
        out = None
        for p, t in zip(ps, ts):
            if p is not None and t is not None:
                out = add(out, mul(t, p))
        return out

    return rec(e)
