"""Loops of step other than +-1 rewritten as loops over their iteration numbers.

``for i in range(lo, hi, s)`` becomes ``for i_iter in range(0, T)`` with
``i = lo + s * i_iter`` substituted in everything the loop encloses (indices, values,
guards, conditions, inner bounds). ``T`` is the trip count where the bounds are
constants; otherwise ``T`` is ``hi - lo`` (for ``s > 0``; ``lo - hi`` for ``s < 0``),
which bounds the trip count from above, with the condition ``lo + s * i_iter < hi``
(``> hi``) cutting the domain to the loop's iterations exactly.

A loop that runs another one backwards, as reverse-mode AD writes it
(``ad.reverse.reverse_loop``: ``range(lo + s * ((hi - lo - 1) // s), lo - 1, -s)`` for
``range(lo, hi, s)``), would keep that floor in its domain. It becomes the loop over the
other one's iteration numbers, downwards: ``for i_iter in range(hi - lo - 1, -1, -1)``
with ``s * i_iter <= hi - lo - 1`` and ``i = lo + s * i_iter``.

Why: ISL writes the domain of a strided loop with a ``mod`` constraint, an existential
variable per strided loop in every set and map of its statements. Dependence analysis,
scheduling and AST generation of such sets cost minutes on kernels of a dozen lines
(fuzz seeds 14634 and 14822) and once crashed ISL (seed 14125). The rewritten domain
``{ [i_iter] : 0 <= i_iter < hi - lo and lo + s i_iter < hi }`` is the same set of
iterations without one. (Conditions such as ``i % 2 == 0``, and the gathers that
``scatter_to_gather`` makes of strided scatters, keep theirs.)

Legality: a bijection between the old and new iterations, the same order (``i_iter``
moves one way as ``i`` moves by ``s``), and every expression of
``i`` rewritten by substitution: the statements run the same instances in the same
order on the same elements. The step is +-1 after it.

It runs after the bounds proof of the program as written, whose messages name the
DSL's loop variables, and again after the loop-order passes, whose register blocking
steps a loop by 2 or 4 (``loop_order.block_sums_in_registers``): those passes see
their blocked loops as loops of a step, ISL sees no step other than +-1.
"""

from __future__ import annotations

import dataclasses

from .. import ir
from ..ad.exprs import affine_form, from_affine, simplify_int
from ..ad.reverse import kernel_names
from ..ir import Binary, Condition, Const, Loop, LoopVar

_ONE = (1, -1)


def unit_stride_loops(kernel: ir.Kernel) -> tuple[ir.Kernel, list[str]]:
    """``kernel`` with every loop of step other than +-1 rewritten as a loop over its
    iteration numbers (module docstring). Returns the kernel (``kernel`` itself
    when no loop has such a step) and one decision line per loop rewritten."""
    if all(lp.step in _ONE for st in kernel.statements for lp in st.loops):
        return kernel, []
    taken = kernel_names(kernel)
    renamed: dict[str, str] = {}  # loop variable -> its iteration-number variable
    decisions: dict[tuple, str] = {}  # (position prefix, variable) -> decision
    statements = []
    for st in kernel.statements:
        values: dict[str, ir.Expr] = {}
        loops, conditions = [], []
        for depth, lp in enumerate(st.loops):
            lo, hi = ir.substitute(lp.lo, values), ir.substitute(lp.hi, values)
            if lp.step in _ONE:
                loops.append(Loop(lp.var, lo, hi, lp.step))
                continue
            name = renamed.get(lp.var)
            if name is None:
                name = renamed[lp.var] = _fresh(f"{lp.var}_iter", taken)
            loop, condition, value = _iteration_loop(name, lo, hi, lp.step)
            key = (st.position[:depth + 1], lp.var)
            if key not in decisions:
                decisions[key] = (f"loop {lp.var} (step {lp.step}, line {st.line}) runs over "
                                  f"its iteration numbers {name}: {lp.var} = "
                                  f"{ir.expr_str(value)}")
            loops.append(loop)
            if condition is not None:
                conditions.append(Condition(condition))
            values[lp.var] = value
        counters = {lp.var for lp in loops} - set(st.loop_vars)
        substituted = st.map_exprs(lambda e: _substituted(e, values, counters))
        statements.append(dataclasses.replace(
            substituted, loops=tuple(loops),
            conditions=tuple(conditions) + substituted.conditions))
    return dataclasses.replace(kernel, statements=tuple(statements)), list(decisions.values())


def _substituted(e: ir.Expr, values: dict, counters: set):
    """``map_expr`` callback: a strided loop's variable -> its value; an index of the
    iteration numbers in canonical form (``x[2 * i_iter]``, not ``x[1 + 2 * i_iter - 1]``)."""
    if isinstance(e, LoopVar):
        return values.get(e.name)
    if isinstance(e, ir.Load) and any(ir.uses_loop_vars(i, counters) for i in e.index):
        return dataclasses.replace(e, index=tuple(simplify_int(i) for i in e.index))
    return None


def _value(base: ir.Expr, step: int, counter: ir.Expr) -> ir.Expr:
    """``base + step * counter``, in canonical form."""
    return simplify_int(Binary("+", base, Binary("*", Const(step, ir.i64), counter, ir.i64),
                               ir.i64))


def _iteration_loop(name: str, lo: ir.Expr, hi: ir.Expr, step: int):
    """``(loop, condition, value)``: the loop over the iteration numbers of ``range(lo,
    hi, step)``, the condition that cuts it to them (None where the loop's bounds are
    exact) and the value of the old loop variable at iteration number ``name``."""
    counter, zero = LoopVar(name), Const(0, ir.i64)
    if isinstance(lo, Const) and isinstance(hi, Const):
        trips = max(0, -(-(hi.value - lo.value) // step))
        return Loop(name, zero, Const(trips, ir.i64), 1), None, _value(lo, step, counter)
    reversal = _reversal(lo, hi, step)
    if reversal is not None:
        # the numbers of the loop it reverses, from the last down: the loop's first value
        # is that loop's last, ``edge - step * (span // |step|)``, a floor in the domain
        edge, span = reversal
        inside = Binary("<=", Binary("*", Const(abs(step), ir.i64), counter, ir.i64), span,
                        ir.boolean)
        return Loop(name, span, Const(-1, ir.i64), -1), inside, _value(edge, -step, counter)
    span = Binary("-", hi, lo, ir.i64) if step > 0 else Binary("-", lo, hi, ir.i64)
    value = _value(lo, step, counter)
    inside = Binary("<" if step > 0 else ">", value, hi, ir.boolean)
    return Loop(name, zero, simplify_int(span), 1), inside, value


def _reversal(first: ir.Expr, end: ir.Expr, step: int):
    """``(edge, span)`` where ``range(first, end, step)`` is ``range(edge, edge - step *
    (span + 1), -step)`` backwards, written as ``ad.reverse.reverse_loop`` writes it:
    ``end = edge + sign(step)`` and ``first = edge - step * (span // |step|)``; None for
    other bounds."""
    sign = 1 if step > 0 else -1
    edge = affine_form(Binary("-", end, Const(sign, ir.i64), ir.i64))
    top = affine_form(first)
    if edge is None or top is None or top[1] != edge[1]:
        return None
    rest = {a: top[0].get(a, 0) - edge[0].get(a, 0) for a in {*top[0], *edge[0]}}
    rest = {a: c for a, c in rest.items() if c}
    if len(rest) != 1:
        return None
    (atom, coeff), = rest.items()
    if coeff != -step or not (isinstance(atom, Binary) and atom.op == "//"
                              and atom.b == Const(abs(step), ir.i64)):
        return None
    return from_affine(edge), atom.a


def _fresh(base: str, taken: set) -> str:
    """``base``, or it with a number from 2 appended, not in ``taken``; added to it."""
    name = ir.fresh_name(base, taken, first=2)
    taken.add(name)
    return name
