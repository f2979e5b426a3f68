"""Dead-statement elimination.

A statement is dead when it writes a scalar local (not the returned value)
or a temporary array and no later statement reads what it wrote (it has no
outgoing flow dependence). Derived kernels produce such statements, e.g. a
forward sweep recomputing a loop-local value that the adjoint sweep
recomputes again where it needs it.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import islpy as isl

from .. import ir
from ..ir import Load
from ..poly import PolyModel, dependences, model_of
from .nests import common_depth


def _flow_edges(deps) -> set[tuple[str, str]]:
    edges: set[tuple[str, str]] = set()
    for umap in deps.flow.values():
        umap.foreach_map(lambda m: edges.add((m.get_tuple_name(isl.dim_type.in_),
                                              m.get_tuple_name(isl.dim_type.out))))
    return edges


def remove_dead_statements(kernel: ir.Kernel, model: Optional[PolyModel] = None) \
        -> tuple[ir.Kernel, tuple[str, ...]]:
    """The kernel without dead statements, and the names of those removed.

    Live: statements that write a parameter array or the returned value, and
    every statement whose value flows (transitively) into a live one.
    """
    temps = {t.name for t in kernel.temps}
    result = kernel.result[0] if kernel.result is not None else None

    def is_root(st: ir.Statement) -> bool:
        t = st.target
        return t.array not in temps if isinstance(t, Load) else t.name == result

    live = {st.name for st in kernel.statements if is_root(st)}
    if len(live) == len(kernel.statements):
        return kernel, ()
    # Only values of locals and temporaries can be dead: their flow is all we need.
    private = temps | {n for n, _ in kernel.locals}
    edges = _flow_edges(dependences(model_of(kernel, model), variables=private,
                                    flow_only=frozenset(private)))
    changed = True
    while changed:
        changed = False
        for src, sink in edges:
            if sink in live and src not in live:
                live.add(src)
                changed = True
    removed = tuple(st.name for st in kernel.statements if st.name not in live)
    if not removed:
        return kernel, ()
    return dataclasses.replace(
        kernel, statements=tuple(st for st in kernel.statements if st.name in live)), removed


def _is_identity_over(st: ir.Statement, loops) -> bool:
    t = st.target
    return (isinstance(t, Load) and len(t.index) <= len(loops)
            and all(isinstance(e, ir.LoopVar) and e.name == lp.var
                    for e, lp in zip(t.index, loops)))


def _covers(loops, shape) -> bool:
    """Loops ``for v in range(0, E)`` with E the array's extents, in order."""
    return len(loops) == len(shape) and all(
        lp.step == 1 and isinstance(lp.lo, ir.Const) and lp.lo.value == 0 and lp.hi == ext
        for lp, ext in zip(loops, shape))


def fuse_zero_initialization(kernel: ir.Kernel) -> tuple[ir.Kernel, tuple[str, ...]]:
    """Move ``T[i, j] = 0`` loops into the loop nest that then accumulates into T.

    Adjoint arrays are zeroed in a nest of their own and then summed into;
    when the summing nest visits each element of T in exactly one iteration
    of its outer loops (every access is ``T[i, j] += ...`` on those loops),
    zeroing the element at the start of that iteration is the same, and saves
    a pass over memory: the compiler turns "store 0, add, add" into one store.
    Returns the new kernel and the names of the moved statements.
    """
    statements = list(kernel.statements)
    moved = []
    for z in list(statements):
        t = z.target
        if not (isinstance(t, Load) and z.loops and z.op == "=" and z.guard is None
                and not z.conditions and isinstance(z.expr, ir.Const)):
            continue
        shape = kernel.array_type(t.array).shape
        if not (_covers(z.loops, shape) and _is_identity_over(z, z.loops)):
            continue
        if sum(1 for s in statements if s.position[0] == z.position[0]) != 1:
            continue
        later = [s for s in statements if s.position[0] > z.position[0] and s.accesses(t.array)]
        if not later:
            continue
        pos2 = min(s.position[0] for s in later)
        nest = [s for s in statements if s.position[0] == pos2]
        users = [s for s in nest if s.accesses(t.array)]
        d = len(shape)
        head = nest[0]
        if common_depth(nest) < d:
            continue
        if not _covers(head.loops[:d], shape):
            continue
        if not all(s.op in ("+=", "-=") and _is_identity_over(s, head.loops[:d])
                   and len(s.target.index) == d
                   and not s.reads_variable(t.array) for s in users):
            continue
        first = min(s.position[d] for s in nest)
        index = tuple(ir.LoopVar(lp.var) for lp in head.loops[:d])
        new_z = dataclasses.replace(z, loops=head.loops[:d],
                                    position=head.position[:d] + (first - 1,),
                                    target=Load(t.array, index, t.dtype))
        statements[statements.index(z)] = new_z
        moved.append(z.name)
    if not moved:
        return kernel, ()
    statements.sort(key=lambda s: s.position)
    return dataclasses.replace(kernel, statements=tuple(statements)), tuple(moved)
