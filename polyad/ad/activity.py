"""Activity analysis: which variables carry derivatives.

A variable (scalar local, array, parameter - analysed by name) is

* *varied* when it depends differentiably on a ``wrt`` parameter: data flow
  through arithmetic and differentiable intrinsics; comparisons, conversions
  to integers, ``//``, ``floor``/``ceil``/``sign`` and control flow (guards,
  ternary conditions) cut the dependence (piecewise-constant);
* *useful* when it influences an output (the returned scalar, or the output
  arrays for ``vjp``) through such data flow;
* *active* when both. Only active variables get adjoints and only statements
  writing active variables get adjoint statements.

``tainted`` is the dependence through *any* data flow (integer conversions
included): an index or loop bound reading a tainted value cannot be
differentiated (an "active index").
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import ir
from ..ir import Binary, Call, Cast, Expr, Load, ScalarRef, Select, Unary
from .rules import RULES

_ZERO_DERIVATIVE = {"sign", "floor", "ceil"}


def diff_reads(e: Expr, funcs: dict) -> set[str]:
    """Names read by ``e`` through differentiable positions (float values only)."""
    out: set[str] = set()

    def rec(x: Expr):
        if not x.dtype.is_float:
            return
        if isinstance(x, ScalarRef):
            out.add(x.name)
        elif isinstance(x, Load):
            out.add(x.array)
        elif isinstance(x, Unary):
            if x.op == "neg":
                rec(x.a)
        elif isinstance(x, Binary):
            if x.op in ("+", "-", "*", "/", "**", "%"):
                rec(x.a)
                rec(x.b)
        elif isinstance(x, Select):
            rec(x.a)
            rec(x.b)
        elif isinstance(x, Cast):
            rec(x.a)
        elif isinstance(x, Call):
            if x.func in funcs or (x.func in RULES and x.func not in _ZERO_DERIVATIVE):
                for a in x.args:
                    rec(a)

    rec(e)
    return out


def all_reads(e: Expr) -> set[str]:
    """Every scalar and array name ``e`` reads (indices included)."""
    out = set()
    for x in ir.walk(e):
        if isinstance(x, ScalarRef):
            out.add(x.name)
        elif isinstance(x, Load):
            out.add(x.array)
    return out


def target_name(st: ir.Statement) -> str:
    t = st.target
    return t.array if isinstance(t, Load) else t.name


@dataclass
class Activity:
    varied: set
    useful: set
    tainted: set

    @property
    def active(self) -> set:
        return self.varied & self.useful

    def is_active(self, name: str) -> bool:
        return name in self.varied and name in self.useful


def analyze(statements, wrt, roots, funcs: dict) -> Activity:
    """Fixpoints over ``statements`` (any order: loops make data flow cyclic)."""
    varied = set(wrt)
    tainted = set(wrt)
    changed = True
    while changed:
        changed = False
        for st in statements:
            t = target_name(st)
            if st.target.dtype.is_float and t not in varied:
                if diff_reads(st.expr, funcs) & varied:
                    varied.add(t)
                    changed = True
            if t not in tainted:
                reads = all_reads(st.expr)
                if reads & tainted:
                    tainted.add(t)
                    changed = True
    useful = set(roots)
    changed = True
    while changed:
        changed = False
        for st in statements:
            if target_name(st) in useful:
                new = diff_reads(st.expr, funcs) - useful
                if new:
                    useful |= new
                    changed = True
    return Activity(varied, useful, tainted)
