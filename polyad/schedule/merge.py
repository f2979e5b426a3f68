"""Update merging: consecutive updates of one array element become one update.

``x = 0; x += a; x -= b`` (one iteration of one block of the scheduled
program) becomes ``x = a - b``: the compiler then loads and stores the
element once (gcc does not merge the read-modify-writes of a vectorized
loop). Each term keeps the statement it came from, so the printed C keeps one
term per line with that statement's DSL line.

Legality: the statements of a run execute one after another for the same
iteration with nothing in between (they are consecutive statements of one
block of the AST, with the iterators substituted), so merging reorders no
dependence when

- every statement writes the same element (the targets are identical
  expressions), under no guard (a guard may skip one term);
- the first is ``=``, ``+=`` or ``-=`` and the others ``+=`` or ``-=``
  (``x = a; x += b`` is ``x = a + b``; a ``*=`` does not distribute);
- no statement after the first reads the target array (it would see the
  partial sums the merged update no longer stores);
- no statement of the run is executed atomically: an atomic update stays its
  own statement (which statements are atomic is the target's plan).
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import ir
from ..ir import Load


@dataclass(frozen=True)
class Term:
    """One term of a merged update: ``sign`` (``+`` or ``-``) ``expr``, from ``statement``."""

    sign: str
    expr: ir.Expr
    statement: ir.Statement


@dataclass(frozen=True)
class MergedUpdate:
    """``target op term0 term1 ...`` (``op``: ``=`` or ``+=``) replacing ``statements``.

    No terms means ``target = 0`` (``x = 0`` with nothing added); ``statements[0]``
    then names the line.
    """

    target: Load
    op: str
    terms: tuple[Term, ...]
    statements: tuple[ir.Statement, ...]


def merge_updates(run: list[ir.Statement], atomic: frozenset = frozenset()) \
        -> list[ir.Statement | MergedUpdate]:
    """The statements of ``run`` (consecutive in one block, iterators substituted) with each
    maximal group of mergeable updates of one element replaced by a ``MergedUpdate``
    (see the module docstring for the conditions); ``atomic``: names of statements the
    plan executes atomically."""
    out: list[ir.Statement | MergedUpdate] = []
    k = 0
    while k < len(run):
        st = run[k]
        group = [st]
        if _mergeable(st, first=True) and st.name not in atomic:
            while k + len(group) < len(run):
                nxt = run[k + len(group)]
                if (nxt.name in atomic or not _mergeable(nxt, first=False)
                        or nxt.target != st.target
                        or any(g.reads_variable(st.target.array) for g in group[1:] + [nxt])):
                    break
                group.append(nxt)
        out.append(_merged(group) if len(group) > 1 else st)
        k += len(group)
    return out


def _mergeable(st: ir.Statement, first: bool) -> bool:
    return (isinstance(st.target, Load) and st.guard is None
            and st.op in (("=", "+=", "-=") if first else ("+=", "-=")))


def _merged(group: list[ir.Statement]) -> MergedUpdate:
    first = group[0]
    terms = []
    if first.op == "=":
        op, rest = "=", group[1:]
        if not (isinstance(first.expr, ir.Const) and first.expr.value == 0):
            terms.append(Term("+", first.expr, first))
    else:
        op, rest = "+=", group
    for st in rest:
        sign, e = ("-" if st.op == "-=" else "+"), st.expr
        if isinstance(e, ir.Unary) and e.op == "neg":  # x += -(a)  ->  ... - a
            sign, e = ("+" if sign == "-" else "-"), e.a
        terms.append(Term(sign, e, st))
    return MergedUpdate(first.target, op, tuple(terms), tuple(group))
