"""Small, typed expression builders with light simplification, for derived code.

Derivative expressions are built mechanically (chain rule), so they are full of
``x * 1``, ``0 + y`` and ``-(-z)``. The builders here fold those on the fly,
so that the generated C reads like hand-written code. ``None`` stands for an
exact zero in the arithmetic builders (``add(None, x) is x``,
``mul(None, x) is None``), which lets the chain rule skip dead branches.

Integer index arithmetic (loop bounds of reversed loops, tape indices and
extents) goes through ``simplify_int``, which puts affine expressions into a
canonical form.
"""

from __future__ import annotations

from typing import Optional

from .. import ir
from ..ir import Binary, Call, Cast, Const, Expr, Load, LoopVar, ScalarRef, Select, SizeVar, Unary

# --------------------------------------------------------------------------
# predicates
# --------------------------------------------------------------------------


def is_const(e: Optional[Expr], value=None) -> bool:
    if not isinstance(e, Const):
        return False
    return value is None or e.value == value


def is_zero(e: Optional[Expr]) -> bool:
    return e is None or is_const(e, 0)


def fconst(value, dt: ir.DType) -> Const:
    """A literal of type ``dt`` (float or int)."""
    if dt == ir.boolean:
        return Const(int(bool(value)), ir.boolean)
    return Const(float(value) if dt.is_float else int(value), dt)


def float_type(*exprs: Optional[Expr]) -> ir.DType:
    """The float type arithmetic on ``exprs`` happens in (f64 unless all floats are f32)."""
    dts = [e.dtype for e in exprs if e is not None and e.dtype.is_float]
    if not dts:
        return ir.f64
    out = dts[0]
    for d in dts[1:]:
        out = ir.promote(out, d)
    return out


def cast(e: Optional[Expr], dt: ir.DType) -> Optional[Expr]:
    if e is None or e.dtype == dt:
        return e
    if isinstance(e, Const):
        return fconst(e.value, dt)
    return Cast(e, dt)


# --------------------------------------------------------------------------
# arithmetic with folding (None = 0)
# --------------------------------------------------------------------------


def _num(e: Expr):
    return e.value if isinstance(e, Const) and e.dtype != ir.boolean else None


def _result_type(a: Expr, b: Expr) -> ir.DType:
    dt = ir.promote(a.dtype, b.dtype)
    return dt


def neg(a: Optional[Expr]) -> Optional[Expr]:
    if a is None:
        return None
    if isinstance(a, Const):
        return fconst(-a.value, a.dtype)
    if isinstance(a, Unary) and a.op == "neg":
        return a.a
    return Unary("neg", a, a.dtype)


def add(a: Optional[Expr], b: Optional[Expr]) -> Optional[Expr]:
    if is_zero(a):
        return b if b is None or a is None else cast(b, _result_type(a, b))
    if is_zero(b):
        return a if b is None else cast(a, _result_type(a, b))
    dt = _result_type(a, b)
    if _num(a) is not None and _num(b) is not None:
        return fconst(a.value + b.value, dt)
    if isinstance(b, Unary) and b.op == "neg":
        return Binary("-", cast(a, dt), cast(b.a, dt), dt)
    if isinstance(b, Const) and b.value < 0:
        return Binary("-", cast(a, dt), fconst(-b.value, dt), dt)
    return Binary("+", cast(a, dt), cast(b, dt), dt)


def sub(a: Optional[Expr], b: Optional[Expr]) -> Optional[Expr]:
    if is_zero(b):
        return a if b is None or a is None else cast(a, _result_type(a, b))
    if is_zero(a):
        return neg(b) if a is None else cast(neg(b), _result_type(a, b))
    dt = _result_type(a, b)
    if _num(a) is not None and _num(b) is not None:
        return fconst(a.value - b.value, dt)
    if isinstance(b, Unary) and b.op == "neg":
        return Binary("+", cast(a, dt), cast(b.a, dt), dt)
    return Binary("-", cast(a, dt), cast(b, dt), dt)


def mul(a: Optional[Expr], b: Optional[Expr]) -> Optional[Expr]:
    if a is None or b is None or is_const(a, 0) or is_const(b, 0):
        return None
    dt = _result_type(a, b)
    if _num(a) is not None and _num(b) is not None:
        return fconst(a.value * b.value, dt)
    if is_const(a, 1):
        return cast(b, dt)
    if is_const(b, 1):
        return cast(a, dt)
    if is_const(a, -1):
        return neg(cast(b, dt))
    if is_const(b, -1):
        return neg(cast(a, dt))
    # pull negations out: (-a) * b = -(a * b)
    if isinstance(a, Unary) and a.op == "neg":
        return neg(mul(a.a, b))
    if isinstance(b, Unary) and b.op == "neg":
        return neg(mul(a, b.a))
    return Binary("*", cast(a, dt), cast(b, dt), dt)


def div(a: Optional[Expr], b: Expr) -> Optional[Expr]:
    if a is None or is_const(a, 0):
        return None
    dt = _result_type(a, b)
    if not dt.is_float:
        dt = ir.f64
    if is_const(b, 1):
        return cast(a, dt)
    if isinstance(a, Unary) and a.op == "neg":
        return neg(div(a.a, b))
    return Binary("/", cast(a, dt), cast(b, dt), dt)


def power(a: Expr, b: Expr) -> Expr:
    """``a ** b`` (float result) with ``a ** 1 = a`` and ``a ** 0 = 1``."""
    dt = a.dtype if a.dtype.is_float else ir.f64
    if is_const(b, 1):
        return cast(a, dt)
    if is_const(b, 0):
        return fconst(1, dt)
    return Binary("**", cast(a, dt), b, dt)


def call(name: str, args, dt: ir.DType) -> Expr:
    return Call(name, tuple(args), dt)


def select(cond: Expr, a: Optional[Expr], b: Optional[Expr]) -> Optional[Expr]:
    """``a if cond else b``; None (zero) branches become typed zeros."""
    if a is None and b is None:
        return None
    if isinstance(cond, Const):
        return a if cond.value else b
    dt = float_type(a, b)
    a = fconst(0, dt) if a is None else cast(a, dt)
    b = fconst(0, dt) if b is None else cast(b, dt)
    return Select(cond, a, b, dt)


def compare(op: str, a: Expr, b: Expr) -> Expr:
    return Binary(op, a, b, ir.boolean)


# --------------------------------------------------------------------------
# reading expressions
# --------------------------------------------------------------------------


def scalar_names(e: Expr) -> set[str]:
    return {x.name for x in ir.walk(e) if isinstance(x, ScalarRef)}


def array_names(e: Expr) -> set[str]:
    return {x.array for x in ir.walk(e) if isinstance(x, Load)}


def loop_var_names(e: Expr) -> set[str]:
    return {x.name for x in ir.walk(e) if isinstance(x, LoopVar)}


def conjuncts(g: Optional[Expr]) -> list[Expr]:
    """The and-chain of a guard, flattened."""
    if g is None:
        return []
    if isinstance(g, Binary) and g.op == "and":
        return conjuncts(g.a) + conjuncts(g.b)
    return [g]


# --------------------------------------------------------------------------
# integer affine expressions: canonical form
# --------------------------------------------------------------------------


def affine_form(e: Expr) -> Optional[tuple[dict, int]]:
    """``e`` as ``({atom: coeff}, const)`` when it is affine in atoms.

    Atoms are LoopVar, SizeVar, integer ScalarRef nodes, and floor-division /
    modulo subterms (kept opaque). Returns None for anything else.
    """
    if isinstance(e, Const):
        if e.dtype.is_float and float(e.value) != int(e.value):
            return None
        return {}, int(e.value)
    if isinstance(e, (LoopVar, SizeVar)) or (isinstance(e, ScalarRef) and not e.dtype.is_float):
        return {e: 1}, 0
    if isinstance(e, Cast) and not e.dtype.is_float:
        return affine_form(e.a)
    if isinstance(e, Unary) and e.op == "neg":
        f = affine_form(e.a)
        if f is None:
            return None
        return {k: -v for k, v in f[0].items()}, -f[1]
    if isinstance(e, Binary) and e.op in ("+", "-"):
        fa, fb = affine_form(e.a), affine_form(e.b)
        if fa is None or fb is None:
            return None
        s = -1 if e.op == "-" else 1
        terms = dict(fa[0])
        for k, v in fb[0].items():
            terms[k] = terms.get(k, 0) + s * v
        return {k: v for k, v in terms.items() if v != 0}, fa[1] + s * fb[1]
    if isinstance(e, Binary) and e.op == "*":
        fa, fb = affine_form(e.a), affine_form(e.b)
        if fa is None or fb is None:
            return None
        if not fa[0]:
            c = fa[1]
            return {k: c * v for k, v in fb[0].items() if c * v != 0}, c * fb[1]
        if not fb[0]:
            c = fb[1]
            return {k: c * v for k, v in fa[0].items() if c * v != 0}, c * fa[1]
        return None
    if isinstance(e, Binary) and e.op in ("//", "%") and not e.dtype.is_float:
        fb = affine_form(e.b)
        if fb is None or fb[0] or fb[1] <= 0:
            return None
        fa = affine_form(e.a)
        if fa is None:
            return None
        if not fa[0]:
            v = fa[1] // fb[1] if e.op == "//" else fa[1] % fb[1]
            return {}, v
        inner = from_affine(fa, ir.i64)
        atom = Binary(e.op, inner, Const(fb[1], ir.i64), ir.i64)
        return {atom: 1}, 0
    return None


def from_affine(form: tuple[dict, int], dt: ir.DType = ir.i64) -> Expr:
    """Build ``sum(c * atom) + const`` (positive terms first, constant last)."""
    terms, c0 = form
    out: Optional[Expr] = None
    items = sorted(terms.items(), key=lambda kv: kv[1] < 0)
    for atom, c in items:
        a = cast(atom, dt)
        if out is None:
            if c == 1:
                out = a
            elif c == -1:
                out = Unary("neg", a, dt)
            else:
                out = Binary("*", Const(c, dt), a, dt)
            continue
        mag = abs(c)
        t = a if mag == 1 else Binary("*", Const(mag, dt), a, dt)
        out = Binary("+" if c > 0 else "-", out, t, dt)
    if out is None:
        return Const(c0, dt)
    if c0 > 0:
        out = Binary("+", out, Const(c0, dt), dt)
    elif c0 < 0:
        out = Binary("-", out, Const(-c0, dt), dt)
    return out


def simplify_int(e: Expr) -> Expr:
    """Canonical form of an integer affine expression (unchanged when not affine)."""
    f = affine_form(e)
    if f is None:
        return e
    return from_affine(f, e.dtype if not e.dtype.is_float and e.dtype != ir.boolean else ir.i64)


def iadd(a: Expr, b: Expr) -> Expr:
    return simplify_int(Binary("+", a, b, ir.i64))


def isub(a: Expr, b: Expr) -> Expr:
    return simplify_int(Binary("-", a, b, ir.i64))


def imul(c: int, a: Expr) -> Expr:
    return simplify_int(Binary("*", Const(c, ir.i64), a, ir.i64))


def ifloordiv(a: Expr, c: int) -> Expr:
    return simplify_int(Binary("//", a, Const(c, ir.i64), ir.i64))


def ic(v: int) -> Const:
    return Const(int(v), ir.i64)
