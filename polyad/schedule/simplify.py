"""Algebraic simplification of the statements of one block before they are emitted.

Boundary pieces substitute constant iterators into derived statements, so the
clamped TV gradient's corner code reads ``lam * sign(g[0] - g[0])``, and
the adjoint terms of one element come out interleaved with updates of other
arrays (``d_t[i] += ...; d_f[0] += ...; d_t[i] += ...``), which keeps
``schedule.merge`` from merging them. This pass rewrites a run of consecutive
statements of one AST block (iterators substituted, as ``merge_updates``
takes them) so that the emitted C carries neither.

Rules on expressions (each states why it is legal):

- **Constant folding**: ``+ - * /`` of two float literals of the operation's
  own type is computed in that type (numpy float32/float64 arithmetic is the
  IEEE arithmetic C uses: one correctly rounded operation), unless the result
  is not finite; ``-c`` of a literal; ``sign``/``abs`` of a literal; a
  ``Select`` on a literal condition. Integer index arithmetic is already
  folded by ``ir.fold_integer_constants``.
- **sign(a - a) = 0** where both operands are the same expression (the same
  array element after substitution: the clamped neighbour of a border pixel
  is the pixel itself). Exact for every value of ``a``: ``a - a`` is 0 or
  NaN, and ``sign`` is defined as ``(x > 0) - (x < 0)``, which is 0 for NaN,
  in the C helper and in the reference interpreter alike.
  A bare ``a - a`` is *not* folded (it is NaN for infinite ``a``).
- **Symbolic zero**: a product with a literal zero factor, and a quotient
  with a literal zero numerator, is zero. This is the rule the AD already
  applies when it builds derivatives (``ad.exprs.mul`` drops a term whose
  factor is an exact zero, as JAX's symbolic zeros do): a derivative term
  that is structurally zero contributes nothing, even where IEEE would turn
  ``0 * inf`` into NaN. It only ever removes such terms, which are zero for
  every finite input.
- **Neutral elements**: ``a + 0``, ``0 + a``, ``a - 0`` are ``a`` and
  ``0 - a`` is ``-a`` (exact up to the sign of a zero result, which no
  comparison or later sum can tell apart); ``-(-a)`` is ``a``.

Rules on the run:

- An update ``x += 0`` / ``x -= 0`` is dropped (it changes nothing).
- **Grouping**: an update ``+=``/``-=`` of an element moves up to just after
  an earlier update of the same element, so that ``merge_updates`` merges
  them, when it may move past every statement in between: the statements
  execute one after another with nothing else in between, so exchanging two
  adjacent statements is legal when neither writes an array or scalar the
  other reads or writes (compared by name; distinct arrays do not overlap,
  which the C ``restrict`` qualifiers already promise). Atomic statements
  and guarded ones stay where they are. The moved statement keeps its own
  comment line, so the C still names each term's DSL line.

Not done here: a common subexpression shared by the terms of one element
is left to the C compiler (the operands are ``restrict`` loads and pure
helpers, so gcc computes it once); the two ``sign`` of one stencil pair
belong to neighbouring elements, a reuse across iterations, not within one.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from .. import ir
from ..ir import Binary, Call, Const, Expr, Load, Select, Unary


def simplify_expr(e: Expr, device_funcs: frozenset = frozenset()) -> Expr:
    """``e`` with the expression rules of the module docstring applied bottom-up;
    ``device_funcs``: names of the kernel's device functions (never taken for
    intrinsics of the same name)."""
    def rewrite(x: Expr):
        out = None
        while (y := _rewrite(x, device_funcs)) is not None:  # a rewrite may enable another
            out = x = y
        return out

    return ir.map_expr(e, rewrite)


def simplify_run(run: list[ir.Statement], atomic: frozenset = frozenset(),
                 device_funcs: frozenset = frozenset()) -> list[ir.Statement]:
    """The statements of ``run`` (consecutive in one block, iterators substituted)
    simplified, updates that add zero dropped and updates of one element
    grouped (see the module docstring); ``atomic``: names of statements the
    plan executes atomically."""
    out: list[ir.Statement] = []
    for st in run:
        st = _simplified_statement(st, device_funcs)
        if st.op in ("+=", "-=") and is_zero(st.expr):
            continue
        at = _group_position(out, st, atomic)
        out.insert(len(out) if at is None else at, st)
    return out


def _simplified_statement(st: ir.Statement, device_funcs: frozenset) -> ir.Statement:
    expr = simplify_expr(st.expr, device_funcs)
    guard = simplify_expr(st.guard, device_funcs) if st.guard is not None else None
    if expr is st.expr and guard is st.guard:
        return st
    return dataclasses.replace(st, expr=expr, guard=guard)


def _group_position(out: list[ir.Statement], st: ir.Statement, atomic: frozenset):
    """Where ``st`` may be inserted right after an earlier update of its element, or None."""
    if not _movable(st, atomic):
        return None
    for k in range(len(out) - 1, -1, -1):
        prev = out[k]
        if prev.target == st.target:
            if k == len(out) - 1 or not _movable(prev, atomic):
                return None
            return k + 1
        if not (_movable(prev, atomic) and _commute(prev, st)):
            return None
    return None


def _movable(st: ir.Statement, atomic: frozenset) -> bool:
    return (isinstance(st.target, Load) and st.guard is None and st.name not in atomic
            and st.op in ("=", "+=", "-="))


def _commute(a: ir.Statement, b: ir.Statement) -> bool:
    """May adjacent statements ``a; b`` run as ``b; a``? (by array and scalar names)"""
    wa, wb = a.target_name, b.target_name
    return (wa != wb and wa not in b.read_names() and wb not in a.read_names())


def is_zero(e: Expr) -> bool:
    """Is ``e`` a numeric literal zero?"""
    return isinstance(e, Const) and e.dtype != ir.boolean and e.value == 0


def _zero(dt: ir.DType) -> Const:
    return Const(0.0 if dt.is_float else 0, dt)


def _as(e: Expr, dt: ir.DType) -> Expr:
    """``e`` as a value of type ``dt`` (a literal retyped, anything else cast)."""
    if e.dtype == dt:
        return e
    if isinstance(e, Const):
        return Const(float(e.value) if dt.is_float else int(e.value), dt)
    return ir.Cast(e, dt)


def _float_value(value, dt: ir.DType):
    return np.float32(value) if dt == ir.f32 else np.float64(value)


def _fold(op: str, a: Const, b: Const, dt: ir.DType):
    """``a op b`` computed in the float type ``dt``, or None when not finite or not foldable."""
    x, y = _float_value(a.value, dt), _float_value(b.value, dt)
    if op == "/" and y == 0:
        return None
    with np.errstate(all="ignore"):
        v = {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.divide}[op](x, y)
    return Const(float(v), dt) if math.isfinite(float(v)) else None


def _rewrite(x: Expr, device_funcs: frozenset):
    if isinstance(x, Unary) and x.op == "neg" and x.dtype.is_float:
        if isinstance(x.a, Const) and x.a.dtype == x.dtype:
            return Const(-float(x.a.value), x.dtype)
        if isinstance(x.a, Unary) and x.a.op == "neg":
            return x.a.a
        return None
    if isinstance(x, Binary) and x.dtype.is_float and x.op in ("+", "-", "*", "/"):
        return _rewrite_arith(x)
    if isinstance(x, Call) and x.func not in device_funcs and x.dtype.is_float \
            and x.func in ("sign", "abs") and len(x.args) == 1:
        (a,) = x.args
        if isinstance(a, Binary) and a.op == "-" and a.a == a.b and x.func == "sign":
            return _zero(x.dtype)
        if isinstance(a, Const) and a.dtype.is_float and math.isfinite(float(a.value)):
            v = float(a.value)
            return Const(abs(v) if x.func == "abs" else float((v > 0) - (v < 0)), x.dtype)
        return None
    if isinstance(x, Select) and isinstance(x.cond, Const):
        return _as(x.a if x.cond.value else x.b, x.dtype)
    return None


def _rewrite_arith(x: Binary):
    op, a, b, dt = x.op, x.a, x.b, x.dtype
    if op == "*" and (is_zero(a) or is_zero(b)) or op == "/" and is_zero(a):
        return _zero(dt)
    if op in ("+", "-") and is_zero(b):
        return _as(a, dt)
    if op == "+" and is_zero(a):
        return _as(b, dt)
    if op == "-" and is_zero(a):
        return Unary("neg", _as(b, dt), dt)
    if isinstance(a, Const) and isinstance(b, Const) and a.dtype == b.dtype == dt:
        return _fold(op, a, b, dt)
    return None
