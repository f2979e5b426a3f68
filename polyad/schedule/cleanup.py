"""Dead-statement elimination.

A statement is dead when it writes a scalar local (not the returned value)
or a temporary array and no later statement reads what it wrote (it has no
outgoing flow dependence). Derived kernels produce such statements, e.g. a
forward sweep recomputing a loop-local value that the adjoint sweep
recomputes again where it needs it.
"""

from __future__ import annotations

import dataclasses

import islpy as isl

from .. import ir
from ..ir import Load
from ..poly import PolyModel, dependences


def _flow_edges(deps) -> set[tuple[str, str]]:
    edges: set[tuple[str, str]] = set()
    for umap in deps.flow.values():
        umap.foreach_map(lambda m: edges.add((m.get_tuple_name(isl.dim_type.in_),
                                              m.get_tuple_name(isl.dim_type.out))))
    return edges


def remove_dead_statements(kernel: ir.Kernel) -> tuple[ir.Kernel, tuple[str, ...]]:
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
    edges = _flow_edges(dependences(PolyModel(kernel), variables=private,
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
