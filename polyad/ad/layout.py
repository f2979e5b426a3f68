"""Packed tape layouts: a tape whose stored elements form a triangle is allocated as one.

A tape is indexed by loop variables (shifted to start at 0): the loops around the
point it is stored at, or, for a tape shared per array element, the outer loops
and the element read. When the bound of an inner loop is affine in an outer
one (``for j in range(i)``), the bounding box allocates about twice the elements
stored (a triangle), six times for a tetrahedron. ``packed_layout`` computes the
*nest layout* instead: the stored elements row after row, lexicographically,
element ``x`` at the number of elements of the nest that precede it. For a nest
whose bounds are affine in the outer indices that number is a polynomial
(nested sums of polynomials, Faulhaber's formulas): ``i * (i - 1) / 2 + j`` for
``j < i``. It is exact integer arithmetic (a polynomial that is integral at
integer points, divided by the common denominator of its coefficients).

The count of a row is a polynomial only while it is not negative, so a nest is
packed only where each inner extent (``upper - lower``) is provably at least 0
over the bounding box of the outer indices (a constant lower bound there).
Loops with steps other than +-1, and bounds with ``min``/``max``/``//`` or
depending on a dimension the tape drops, keep the bounding box (a decision:
the triangles and trapezoids of factorizations and triangular solves are
affine; the general case would need ISL's counting of quasi-polynomials,
which islpy's build here lacks).
"""

from __future__ import annotations

from fractions import Fraction
from math import comb, lcm
from typing import Optional

from .. import ir
from ..ir import Binary, Const, Expr, LoopVar, ScalarRef, SizeVar
from . import exprs as X


class Poly:
    """A polynomial with rational coefficients over IR atoms (``LoopVar``, ``SizeVar``,
    integer ``ScalarRef``): ``{monomial: coefficient}``, a monomial being a sorted tuple
    of ``(atom, exponent)``."""

    def __init__(self, terms=None):
        self.terms: dict[tuple, Fraction] = {m: c for m, c in (terms or {}).items() if c != 0}

    @staticmethod
    def const(c) -> "Poly":
        return Poly({(): Fraction(c)})

    @staticmethod
    def atom(a: Expr) -> "Poly":
        return Poly({((a, 1),): Fraction(1)})

    def __add__(self, other: "Poly") -> "Poly":
        out = dict(self.terms)
        for m, c in other.terms.items():
            out[m] = out.get(m, 0) + c
        return Poly(out)

    def __neg__(self) -> "Poly":
        return Poly({m: -c for m, c in self.terms.items()})

    def __sub__(self, other: "Poly") -> "Poly":
        return self + (-other)

    def __mul__(self, other: "Poly") -> "Poly":
        out: dict = {}
        for m1, c1 in self.terms.items():
            for m2, c2 in other.terms.items():
                exps = dict(m1)
                for a, e in m2:
                    exps[a] = exps.get(a, 0) + e
                m = tuple(sorted(exps.items(), key=lambda p: _atom_key(p[0])))
                out[m] = out.get(m, 0) + c1 * c2
        return Poly(out)

    def power(self, k: int) -> "Poly":
        out = Poly.const(1)
        for _ in range(k):
            out = out * self
        return out

    def by_power_of(self, a: Expr) -> dict[int, "Poly"]:
        """``{k: c_k}`` with ``self = sum c_k * a**k`` and no ``a`` in the ``c_k``."""
        out: dict[int, Poly] = {}
        for m, c in self.terms.items():
            k = dict(m).get(a, 0)
            rest = tuple(p for p in m if p[0] != a)
            out[k] = out.get(k, Poly()) + Poly({rest: c})
        return out

    def atoms(self) -> set:
        return {a for m in self.terms for a, _ in m}

    def to_expr(self, division: str) -> Expr:
        """The polynomial as an IR integer expression: the terms with integral coefficients,
        plus those with fractional ones over their common denominator (``division``: ``"/"``
        for C's exact integer division, ``"//"`` for Python's)."""
        den = lcm(*(c.denominator for c in self.terms.values())) if self.terms else 1
        whole = {m: c for m, c in self.terms.items() if c.denominator == 1}
        parts = {m: c * den for m, c in self.terms.items() if c.denominator != 1}
        out = _sum_expr(parts)
        if out is not None:
            out = Binary(division, out, Const(den, ir.i64), ir.i64)
        rest = _sum_expr(whole)
        if out is None:
            return rest if rest is not None else Const(0, ir.i64)
        if rest is None:
            return out
        return _plus(out, rest)


def _atom_key(a: Expr):
    return (0 if isinstance(a, LoopVar) else 1, a.name)


def _monomial_key(m):
    return (-sum(e for _, e in m), [(_atom_key(a), -e) for a, e in m])


def _plus(a: Expr, b: Expr) -> Expr:
    if isinstance(b, Binary) and b.op == "*" and isinstance(b.a, Const) and b.a.value < 0:
        return Binary("-", a, _term(-b.a.value, b.b), ir.i64)
    if isinstance(b, Const) and b.value < 0:
        return Binary("-", a, Const(-b.value, ir.i64), ir.i64)
    return Binary("+", a, b, ir.i64)


def _term(c: int, rest: Optional[Expr]) -> Expr:
    if rest is None:
        return Const(c, ir.i64)
    return rest if c == 1 else Binary("*", Const(c, ir.i64), rest, ir.i64)


def _sum_expr(terms: dict) -> Optional[Expr]:
    """``sum c * monomial`` (integral ``c``), highest degree first; None when empty."""
    out: Optional[Expr] = None
    for m in sorted(terms, key=_monomial_key):
        c = int(terms[m])
        factors = [a for a, e in m for _ in range(e)]
        prod: Optional[Expr] = None
        for f in factors:
            prod = f if prod is None else Binary("*", prod, f, ir.i64)
        if out is None:
            out = _term(c, prod) if c > 0 or prod is None else ir.Unary("neg", _term(-c, prod),
                                                                         ir.i64)
        else:
            out = _plus(out, _term(c, prod))
    return out


def _bernoulli(n: int) -> list[Fraction]:
    """B_0 .. B_n with B_1 = -1/2."""
    b = [Fraction(1)]
    for m in range(1, n + 1):
        b.append(-sum(comb(m + 1, j) * b[j] for j in range(m)) / (m + 1))
    return b


def _power_sum(k: int, n: Poly) -> Poly:
    """``sum(t**k for t in range(n))`` as a polynomial of ``n`` (Faulhaber)."""
    b = _bernoulli(k)
    out = Poly()
    for j in range(k + 1):
        out = out + Poly.const(Fraction(comb(k + 1, j)) * b[j] / (k + 1)) * n.power(k + 1 - j)
    return out


def sum_over(p: Poly, var: Expr, lo: Poly, hi: Poly) -> Poly:
    """``sum(p for var in range(lo, hi))`` (``lo``, ``hi`` may contain ``var`` itself: the
    summation variable is bound, theirs is free)."""
    out = Poly()
    for k, c in p.by_power_of(var).items():
        out = out + c * (_power_sum(k, hi) - _power_sum(k, lo))
    return out


def affine_poly(e: Expr, subst: dict) -> Optional[Poly]:
    """``e`` (affine in loop variables and sizes) as a polynomial, loop variables replaced
    by ``subst``'s polynomials; None when ``e`` is not affine in those, or uses a loop
    variable ``subst`` does not give."""
    f = X.affine_form(e)
    if f is None:
        return None
    out = Poly.const(f[1])
    for a, c in f[0].items():
        if isinstance(a, LoopVar):
            if a.name not in subst:
                return None
            term = subst[a.name]
        elif isinstance(a, (SizeVar, ScalarRef)):
            term = Poly.atom(a)
        else:
            return None
        out = out + Poly.const(c) * term
    return out


def packed_layout(dims) -> Optional[ir.PackedLayout]:
    """The nest layout of a tape whose dimension ``d`` is ``var_d - shift_d`` for a loop
    ``var_d in range(lower_d, upper_d)`` (``dims``: ``(var, shift, lower, upper, extent)``
    per dimension, the bounds affine in the sizes and the earlier ``var``s, ``extent``
    the bounding box's); None when the bounding box is as small (no bound depends on an
    outer index) or the nest is not one ``packed_layout`` handles (module docstring)."""
    subst: dict[str, Poly] = {}
    names, lower, upper, extents = [], [], [], []
    for var, shift, lo, hi, extent in dims:
        s = affine_poly(shift, {})
        lo_p, hi_p = affine_poly(lo, subst), affine_poly(hi, subst)
        if s is None or lo_p is None or hi_p is None:
            return None
        coord = Poly.atom(LoopVar(var))
        subst[var] = coord + s
        names.append(var)
        lower.append(lo_p - s)
        upper.append(hi_p - s)
        extents.append(extent)
    coords = {LoopVar(v) for v in names}
    if not any((lo.atoms() | hi.atoms()) & coords for lo, hi in zip(lower, upper)):
        return None
    if not all(_nonnegative_over_box(hi - lo, names[:d], extents[:d])
               for d, (lo, hi) in enumerate(zip(lower, upper)) if d > 0):
        return None
    below = Poly.const(1)          # elements of the nest below a prefix of the indices
    offset = Poly()
    for d in reversed(range(len(names))):
        x = LoopVar(names[d])
        offset = offset + sum_over(below, x, lower[d], Poly.atom(x))
        below = sum_over(below, x, lower[d], upper[d])
    return ir.PackedLayout(tuple(names), tuple(lo.to_expr("//") for lo in lower),
                           tuple(hi.to_expr("//") for hi in upper),
                           offset.to_expr("/"), below.to_expr("//"))


def _nonnegative_over_box(p: Poly, names: list[str], extents: list[Expr]) -> bool:
    """Is the affine ``p`` at least 0 wherever each ``names[k]`` is in ``range(extents[k])``?"""
    if any(sum(e for _, e in m) > 1 for m in p.terms):
        return False
    low = Poly.const(p.terms.get((), 0))
    for m, c in p.terms.items():
        if not m:
            continue
        ((a, _),) = m
        if isinstance(a, LoopVar) and a.name in names:
            if c < 0:
                ext = affine_poly(extents[names.index(a.name)], {})
                if ext is None:
                    return False
                low = low + Poly.const(c) * (ext - Poly.const(1))
        else:
            low = low + Poly({m: c})
    return all(not m for m in low.terms) and low.terms.get((), Fraction(0)) >= 0
