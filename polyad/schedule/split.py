"""Index-set splitting: run the few instances that carry a nest's in-iteration
dependences first, and the rest as one parallel nest.

floyd-warshall's ``for k: for i: for j: path[i, j] = min(path[i, j], path[i, k] +
path[k, j])`` is sequential inside one ``k`` iteration only because of row ``k``
and column ``k``: the instances ``i == k`` and ``j == k`` write the elements that
the other instances of the same ``k`` read. In program order an instance reads the
updated value of some of them (written earlier in the iteration) and the old value
of others (written later). Splitting gives, per ``k``:

    path_k_j[i] = path[i, k]            (column k before its update)
    path_k_i[j] = path[k, j]            (row k before its update)
    S for i == k or j == k              (in program order)
    S for the rest, in pieces by i < k / i > k and j < k / j > k, each read of row or
      column k from the array (its value-based source is the update earlier in the
      iteration) or from the copy (its source is an earlier iteration)

Legality (checked with ISL on the statement ``S`` of a nest of one statement,
outer loop ``o``, inner loops ``x1..xn``, writing ``A[x_p1, .., x_pn]`` (a
permutation of the inner iterators: one write per element per ``o`` iteration)):
``B`` is the union of ``x == o`` over the inner iterators ``x`` whose equality
subset holds a source of a flow dependence of ``A`` inside one ``o`` iteration,
and every such source lies in ``B``; ``R`` is the rest. Then (1) no instance of
``R`` is the source of a dependence to ``B`` or ``R`` in its iteration (no flow
by the choice of ``B``, no output by the one write per element, and no two
different instances of ``R`` read and write one element: checked), so ``B`` may
run before ``R`` and ``R``'s inner loops are parallel; (2) ``B`` keeps its program
order, and reads nothing ``R`` writes earlier in the iteration (that would be a
flow from ``R``); (3) a read in ``R`` whose exact source is in ``B`` in the same
iteration reads the array after ``B`` (the source is the element's only write of
the iteration); one whose source is earlier, of an element that ``B`` writes in
the iteration, reads the copy of that element taken before ``B`` (the value from
the iteration's start, which nothing else in the iteration writes); any other read
sees an element nobody writes in the iteration. The copies cost one pass over the
lower-dimensional image of ``B``'s write per ``o`` iteration.

Limits: one statement in the nest, an assignment ``=`` without guard or
conditions, unit-step loops whose bounds do not read the inner iterators, every
copy buffer rectangular from 0. Other nests keep their statements as they are.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Optional

import islpy as isl

from .. import ir
from ..ir import Condition, Load, LoopVar
from ..poly import PolyModel, isl_name, maps_of, model_of, param_exprs, set_to_condition
from .distribute import _expansion_shape
from .nests import fresh_statement_name, loop_nests


def split_conflicting_instances(kernel: ir.Kernel, model: Optional[PolyModel] = None) \
        -> tuple[ir.Kernel, list]:
    """Split the instances carrying a nest's in-iteration dependences off it (module doc).

    Returns the new kernel and the decisions (one line per split nest).
    """
    decisions: list = []
    for pos, nest in sorted(loop_nests(kernel).items(), reverse=True):
        if len(nest) != 1 or not _candidate(nest[0]):
            continue
        model = model_of(kernel, model)
        found = _split(kernel, model, nest[0])
        if found is None:
            continue
        statements, temps, decision = found
        at = kernel.statements.index(nest[0])
        kernel = dataclasses.replace(
            kernel, statements=kernel.statements[:at] + statements + kernel.statements[at + 1:],
            temps=kernel.temps + temps)
        decisions.append(decision)
    return kernel, decisions[::-1]


def _candidate(st: ir.Statement) -> bool:
    """The syntactic limits of the module doc."""
    if len(st.loops) < 2 or st.op != "=" or st.guard is not None or st.conditions \
            or not isinstance(st.target, Load):
        return False
    inner = set(st.loop_vars[1:])
    if any(lp.step != 1 for lp in st.loops) or any(
            isinstance(x, LoopVar) and x.name in inner
            for lp in st.loops for b in (lp.lo, lp.hi) for x in ir.walk(b)):
        return False
    index = st.target.index
    if not all(isinstance(e, LoopVar) for e in index) \
            or sorted(e.name for e in index) != sorted(inner):
        return False
    outer = st.loops[0].var
    # some read of the written array at an index that names the outer iterator
    return any(ld.array == st.target.array and any(
        isinstance(x, LoopVar) and x.name == outer for e in ld.index for x in ir.walk(e))
        for ld in ir.loads(st.expr))


def _same_outer(space_map: isl.Map) -> isl.Map:
    return space_map.equate(isl.dim_type.in_, 0, isl.dim_type.out, 0)


def _flow(model: PolyModel, st: ir.Statement, ld: Load, dom: isl.Set) -> isl.Map:
    """{source -> sink}: the value-based sources of ``ld``'s reads in ``st`` (``st`` is
    the only writer of the array in its nest, and its nest runs in program order)."""
    write = model.access_map(st, st.target).intersect_domain(dom)
    read = model.access_map(st, ld).intersect_domain(dom)
    tree = isl.Schedule.from_domain(dom.to_union_set()).insert_partial_schedule(
        isl.MultiUnionPwAff.from_union_map(model.schedule_map().intersect_domain(
            dom.to_union_set())))
    ai = isl.UnionAccessInfo.from_sink(read.to_union_map()) \
        .set_must_source(write.to_union_map()).set_schedule(tree)
    deps = maps_of(ai.compute_flow().get_may_dependence())
    return deps[0] if deps else isl.Map.empty(
        isl.Space.map_from_domain_and_range(dom.get_space(), dom.get_space()))


def _split(kernel: ir.Kernel, model: PolyModel, st: ir.Statement):
    dom = model.domain(st)
    outer, inner = st.loop_vars[0], st.loop_vars[1:]
    loads = [ld for ld in ir.loads(st.expr) if ld.array == st.target.array]
    flows = {id(ld): _flow(model, st, ld, dom) for ld in loads}
    sources = None
    for m in flows.values():
        inside = m.intersect(_same_outer(isl.Map.universe(m.get_space()))) \
            .subtract(isl.Map.identity(m.get_space()))
        s = inside.domain()
        sources = s if sources is None else sources.union(s)
    if sources is None or sources.is_empty():
        return None
    # the equality subsets x == o that hold a source
    equal = {}
    for x in inner:
        e = dom.intersect(model.set(model.tuple_text(st), f"{isl_name(x)} = {isl_name(outer)}"))
        if not e.intersect(sources).is_empty():
            equal[x] = e
    for x in list(equal):  # the fewest: drop an equality whose sources others hold
        others = [e for y, e in equal.items() if y != x]
        if others and sources.is_subset(_union(others)):
            del equal[x]
    if not equal:
        return None
    split_off = _union(list(equal.values()))
    if not sources.is_subset(split_off):
        return None
    rest = dom.subtract(split_off)
    if rest.is_empty():
        return None
    # (1) two different instances of the rest never touch one element in one iteration
    write = model.access_map(st, st.target)
    rest_write = write.intersect_domain(rest)
    for ld in loads:
        touch = model.access_map(st, ld).intersect_domain(rest).apply_range(rest_write.reverse())
        touch = touch.intersect(_same_outer(isl.Map.universe(touch.get_space()))) \
            .subtract(isl.Map.identity(touch.get_space()))
        if not touch.is_empty():
            return None
    # the copies: for x == o, the elements it writes, indexed by the other target indices
    params = param_exprs(kernel)
    names = [isl_name(v) for v in st.loop_vars]
    target_vars = [e.name for e in st.target.index]
    copies, temps, buffers = [], [], {}
    for slot, x in enumerate(equal):
        keep = [lp for lp in st.loops[1:] if lp.var != x]
        shape = _expansion_shape([next(lp for lp in st.loops if lp.var == v)
                                  for v in target_vars if v != x])
        if shape is None:
            return None
        buf = _fresh(kernel, f"{st.target.array}_{outer}_{x}")
        buffers[x] = buf
        dtype = st.target.dtype
        temps.append(ir.Temp(buf, ir.ArrayType(dtype, shape), zero=False, role="copy",
                             holds=f"{st.target.array} where {x} == {outer}, before "
                                   f"{st.name} updates it in iteration {outer}"))
        source_index = tuple(LoopVar(outer) if v == x else LoopVar(v) for v in target_vars)
        copy = ir.Statement(
            name=fresh_statement_name(kernel, f"{st.name}_copy_{x}"),
            loops=(st.loops[0],) + tuple(keep),
            position=(st.position[0], slot) + (0,) * len(keep),
            conditions=(), guard=None,
            target=Load(buf, tuple(LoopVar(v) for v in target_vars if v != x), dtype),
            op="=", expr=Load(st.target.array, source_index, dtype),
            line=st.line, source=st.source)
        # only where x == o lies in the domain (x's range may not hold every o)
        cm = model.for_kernel(dataclasses.replace(kernel, statements=(copy,)))
        image = equal[x].project_out(isl.dim_type.set, st.loop_vars.index(x), 1) \
            .set_tuple_name(copy.name)
        extra = image.gist(cm.domain(copy))
        if not extra.plain_is_universe():
            copy = dataclasses.replace(copy, conditions=(Condition(set_to_condition(
                extra, [isl_name(v) for v in copy.loop_vars], params)),))
        copies.append(copy)
    base = len(equal)
    split_cond = set_to_condition(split_off.gist(dom), names, params)
    # one statement for the split-off instances keeps their program order (the row and
    # the column of floyd-warshall meet at (k, k): neither may run wholly before the other)
    first = dataclasses.replace(
        st.split("index set", 0, fresh_statement_name(kernel, f"{st.name}_split")),
        position=(st.position[0], base) + st.position[2:], conditions=(Condition(split_cond),))
    # (3) each read of the rest: from the copy of x where its element is one x == o writes
    # and its source is no write earlier in the iteration
    choices = []
    for ld in loads:
        m = flows[id(ld)]
        new = m.intersect(_same_outer(isl.Map.universe(m.get_space()))) \
            .intersect_domain(split_off).range()
        old = rest.subtract(new)
        read = model.access_map(st, ld).intersect_domain(old)
        options, taken = [], None
        for x in equal:
            hits = read.apply_range(write.intersect_domain(equal[x]).reverse())
            hits = hits.intersect(_same_outer(isl.Map.universe(hits.get_space()))).domain()
            if taken is not None:
                hits = hits.subtract(taken)
            if hits.is_empty():
                continue
            taken = hits if taken is None else taken.union(hits)
            options.append((x, hits))
        if options:
            choices.append((ld, options, taken))
    pieces = []
    for combo in itertools.product(*[[*opts, (None, taken)] for _, opts, taken in choices]):
        cell, conditions, reads = rest, [Condition(split_cond, positive=False)], {}
        for (ld, _, _), (x, s) in zip(choices, combo):
            if x is None:
                cell = cell.subtract(s)
                conditions.append(Condition(set_to_condition(s.gist(rest), names, params),
                                            positive=False))
            else:
                cell = cell.intersect(s)
                conditions.append(Condition(set_to_condition(s.gist(rest), names, params)))
                reads[ld] = x
        if cell.is_empty():
            continue
        pieces.append((tuple(conditions), reads))
    out = []
    for index, (conditions, reads) in enumerate(pieces):
        def fn(e, reads=reads):
            for ld, x in reads.items():
                if e == ld:
                    return Load(buffers[x], tuple(i for v, i in zip(target_vars, ld.index)
                                                  if v != x), ld.dtype)
            return None
        out.append(dataclasses.replace(
            st.split("index set", index + 1, fresh_statement_name(kernel, f"{st.name}_rest{index}")),
            position=(st.position[0], base + 1) + st.position[2:],
            conditions=conditions, expr=ir.map_expr(st.expr, fn)))
    eqs = ", ".join(f"{x} == {outer}" for x in equal)
    decision = (f"split {eqs} off loop {outer}'s nest of {st.name} (line {st.line}): they carry "
                f"its dependences inside one {outer} iteration; "
                f"{' and '.join(f'{st.target.array} where {x} == {outer}' for x in equal)} "
                f"copied before their update ({', '.join(buffers.values())}), the rest "
                f"({len(out)} piece{'s' if len(out) != 1 else ''}) runs after them, "
                f"parallel")
    return tuple(copies) + (first,) + tuple(out), tuple(temps), decision


def _union(sets: list) -> isl.Set:
    out = sets[0]
    for s in sets[1:]:
        out = out.union(s)
    return out


def _fresh(kernel: ir.Kernel, name: str) -> str:
    return ir.fresh_name(name, {p.name for p in kernel.params} | {t.name for t in kernel.temps}
                         | {n for n, _ in kernel.locals})
