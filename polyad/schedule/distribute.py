"""Scalar expansion + loop distribution, so that scatters can become gathers.

The adjoint of a convolution-like cost reads, in one loop nest,

    for m, n:  s = ...; d_s = ...;  for k: d_x[m, n + k - 2] += d_s * f[k]

The scatter cannot be re-indexed in place: it reads ``d_s``, which the same
nest writes. When ``d_s`` carries no value from one (m, n) iteration to
another, it can live in an array ``d_s_expanded[m, n]`` instead, and the
scatters can then run in a nest of their own after the first one:

    for m, n:  s = ...; d_s_expanded[m, n] = ...
    for m, n, k:  d_x[m, n + k - 2] += d_s_expanded[m, n] * f[k]

where ``scatter_to_gather`` turns them into the gather a careful engineer
writes (``d_x[m, j] = sum_k f[k] * d_s_expanded[m, j - k + 2]``).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import islpy as isl

from .. import ir
from ..ir import Load, LoopVar, ScalarRef
from ..poly import (Dependences, PolyModel, dependences, maps_of, model_of, projected_accesses,
                    within_outer_iterations)
from .nests import common_depth, loop_nests, selected_by_loops


def _private_to_iterations(var: str, names: set, c: int, deps: Dependences) -> bool:
    """No value of ``var`` flows into, out of, or across the c outer iterations of the nest."""
    if var not in deps.flow:
        return True
    for m in maps_of(deps.flow[var]):
        src = m.get_tuple_name(isl.dim_type.in_)
        dst = m.get_tuple_name(isl.dim_type.out)
        if (src in names) != (dst in names):
            return False  # flows into the nest from before it, or out of it
        if src in names and not within_outer_iterations(m, c):
            return False
    return True


def _read_then_overwritten(kernel: ir.Kernel, model: Optional[PolyModel], scatters: list,
                           rest: list, expand: set) -> str:
    """Why the scatters may not run after the whole nest ("" if they may): a statement of
    the rest writes what a scatter read in an earlier iteration (an anti dependence the
    move would reverse: the scatter would read the later value; fuzz seed 3265, where
    ``y0[j + 3] += ... + t0[1, j]`` went behind the iterations that write ``t0[1, j]``).
    The expanded scalars keep their value per iteration."""
    read = set().union(*[st.read_names() for st in scatters]) - expand
    overlap = read & {st.target_name for st in rest}
    if not overlap:
        return ""
    deps = dependences(model_of(kernel, model), variables=overlap)
    moved, others = {st.name for st in scatters}, {st.name for st in rest}
    for v in sorted(overlap):
        for m in maps_of(deps.anti[v]) if v in deps.anti else []:
            if (m.get_tuple_name(isl.dim_type.in_) in moved
                    and m.get_tuple_name(isl.dim_type.out) in others):
                return f"the scatters read {v!r}, which later iterations of the nest write"
    return ""


def _expansion_shape(loops) -> tuple | None:
    """Extents of an array indexed by the loop variables, or None if not rectangular from 0."""
    shape = []
    for lp in loops:
        for b in (lp.lo, lp.hi):
            if any(isinstance(x, LoopVar) for x in ir.walk(b)):
                return None
        if lp.step > 0 and isinstance(lp.lo, ir.Const) and lp.lo.value >= 0:
            shape.append(lp.hi)
        elif lp.step < 0 and isinstance(lp.hi, ir.Const) and lp.hi.value >= -1:
            shape.append(ir.fold_integer_constants(
                ir.Binary("+", lp.lo, ir.Const(1, ir.i64), ir.i64)))
        else:
            return None
    return tuple(shape)


def expand_and_distribute(kernel: ir.Kernel, model: Optional[PolyModel] = None) \
        -> tuple[ir.Kernel, dict[str, str]]:
    """Move ``+=`` scatters that read nest-local scalars into a nest of their own.

    Sums into one fixed element that read those scalars stay (they need no gather),
    unless they touch an array a moved scatter touches.

    Returns the new kernel and decisions (scalar -> what happened to it).
    """
    nests = loop_nests(kernel)
    locals_ = dict(kernel.locals)
    result = kernel.result[0] if kernel.result else None
    decisions: dict[str, str] = {}
    for pos in sorted(nests, reverse=True):  # later nests first: positions shift behind us
        nest = [st for st in kernel.statements if st.loops and st.position[0] == pos]
        written_scalars = {st.target.name for st in nest if isinstance(st.target, ScalarRef)}
        updates = [st for st in nest
                   if isinstance(st.target, Load) and st.op in ("+=", "-=")
                   and st.scalar_reads() & written_scalars]
        scatters = [st for st in updates if selected_by_loops(st.target)]
        if not scatters:
            continue
        # Sums into one fixed element (a filter gradient's d_f[0] += d_r * t[m - 2, n]) need
        # no gather: they stay where the scalar and what they multiply it by are at hand
        # (a moved copy would read both again from memory), unless they touch what a
        # moved scatter touches (then their order against it would change).
        scatter_arrays = set().union(*[_arrays(st) for st in scatters])
        kept = {st.name for st in updates
                if not selected_by_loops(st.target) and not _arrays(st) & scatter_arrays}
        scatters += [st for st in updates
                     if not selected_by_loops(st.target) and st.name not in kept]
        scatter_targets = {st.target.array for st in scatters}
        # Other updates of a scatter target that read nothing the nest writes (an
        # adjoint's d_u[i, j, k] += f(u) beside the scatter d_u[i + a - 1, ...] += d_s * w)
        # go along: the nest only adds to the target, so their order against the rest
        # does not matter, and left behind they would keep the scatters in the nest.
        written = {st.target_name for st in nest}
        scatters += [st for st in nest
                     if st not in scatters and isinstance(st.target, Load)
                     and st.op in ("+=", "-=") and st.target.array in scatter_targets
                     and not (st.read_names() - {st.target.array}) & written]
        moved = {st.name for st in scatters}
        rest = [st for st in nest if st.name not in moved]
        c = common_depth(nest)
        why = ""
        if c == 0 or not rest:
            why = "the scatters share no loop with the statements they read from"
        elif max(st.position[c] for st in rest if st.name not in kept) \
                >= min(st.position[c] for st in scatters):
            why = "other statements follow the scatters in the loop body"
        elif any(st.target_name in scatter_targets and st.name not in moved for st in nest) or any(
                t in (ld.array for e in st.exprs() for ld in ir.loads(e))
                for st in nest for t in scatter_targets):
            why = "the scatter targets are also read or assigned in the nest"
        expand = set().union(*[st.scalar_reads() & written_scalars for st in scatters])
        if not why and expand & {result}:
            why = "the scatters read the returned value"
        shape = _expansion_shape(nest[0].loops[:c]) if not why else None
        if not why and shape is None:
            why = "the shared loops do not start at 0 with size-only bounds"
        if not why:
            deps = dependences(model_of(kernel, model), variables=expand, flow_only=frozenset(expand))
            names = {st.name for st in nest}
            for v in sorted(expand):
                if not _private_to_iterations(v, names, c, deps):
                    why = f"scalar {v!r} carries a value between iterations"
        if not why:
            why = _read_then_overwritten(kernel, model, scatters, rest, expand)
        if why:
            for v in sorted(expand):
                decisions[v] = "kept scalar: " + why
            continue
        kernel = _apply(kernel, pos, c, moved, expand, shape, locals_)
        for v in sorted(expand):
            decisions[v] = f"expanded to an array over the {c} shared loop(s); scatters moved " \
                           f"to a nest of their own"
    return kernel, decisions


def _arrays(st: ir.Statement) -> set:
    """The arrays ``st`` reads or writes."""
    return {ld.array for ld in st.reads()} | (
        {st.target.array} if isinstance(st.target, Load) else set())


def _apply(kernel: ir.Kernel, pos: int, c: int, moved: set, expand: set, shape: tuple,
           locals_: dict) -> ir.Kernel:
    taken = {p.name for p in kernel.params} | {t.name for t in kernel.temps} | set(locals_)
    arrays = {}
    temps = list(kernel.temps)
    for v in sorted(expand):
        name = f"{v}_expanded"
        while name in taken:
            name = "_" + name
        taken.add(name)
        arrays[v] = name
        temps.append(ir.Temp(name, ir.ArrayType(locals_[v], shape), zero=False, role="expansion",
                             holds=f"the scalar {v} per iteration of the shared loops"))
    out = []
    for st in kernel.statements:
        if st.position and st.position[0] > pos:
            st = dataclasses.replace(st, position=(st.position[0] + 1,) + st.position[1:])
        elif st.loops and st.position[0] == pos:
            index = tuple(LoopVar(lp.var) for lp in st.loops[:c])

            def fn(x, index=index):
                if isinstance(x, ScalarRef) and x.name in arrays:
                    return Load(arrays[x.name], index, x.dtype)
                return None

            t = st.target
            if isinstance(t, ScalarRef) and t.name in arrays:
                t = Load(arrays[t.name], index, t.dtype)
            st = dataclasses.replace(
                st, target=t, expr=ir.map_expr(st.expr, fn),
                guard=None if st.guard is None else ir.map_expr(st.guard, fn),
                position=((pos + 1,) + st.position[1:]) if st.name in moved else st.position)
        out.append(st)
    return dataclasses.replace(kernel, statements=tuple(out), temps=tuple(temps))


def _is_scatter(st: ir.Statement) -> bool:
    """An update ``x[f(i)] += e`` whose index is not the loop variables themselves."""
    t = st.target
    return bool(st.loops) and isinstance(t, Load) and st.op in ("+=", "-=") and not (
        len(t.index) == len(st.loops)
        and all(isinstance(e, LoopVar) and e.name == lp.var for e, lp in zip(t.index, st.loops)))


def _in_loop(kernel: ir.Kernel, st: ir.Statement, depth: int) -> list:
    """The statements inside ``st``'s loop at ``depth`` (0: its outermost loop)."""
    return [o for o in kernel.statements
            if len(o.loops) > depth and o.position[:depth + 1] == st.position[:depth + 1]]


def conflicts_across_iterations(model: PolyModel, first: list, second: list, outer: int,
                                c: int) -> bool:
    """True if an access of ``first`` and one of ``second`` to the same element, at least
    one a write, lie in the same iteration of the ``outer`` loops but in different
    iterations of the ``c`` loops all of them share (memory-based, like
    ``gather.array_conflicts_carried``)."""
    arrays = set()
    for st in first + second:
        arrays |= {ld.array for ld in st.reads()}
        if isinstance(st.target, Load):
            arrays.add(st.target.array)
    w1, t1 = projected_accesses(model, first, c, arrays)
    w2, t2 = projected_accesses(model, second, c, arrays)
    pairs = None
    for w, t in ((w1, t2), (w2, t1)):
        if w is not None and t is not None:
            p = w.apply_range(t.reverse())
            pairs = p if pairs is None else pairs.union(p)
    if pairs is None:
        return False
    for m in maps_of(pairs):
        same_outer = m
        for k in range(outer):
            same_outer = same_outer.equate(isl.dim_type.in_, k, isl.dim_type.out, k)
        if not within_outer_iterations(same_outer, c):
            return True
    return False


def distribute_after_scatters(kernel: ir.Kernel, model: Optional[PolyModel] = None) \
        -> tuple[ir.Kernel, list[str]]:
    """Split a loop after its scatters when later statements of its body write what they read.

    An adjoint sweep reads a cotangent, scatters it and then zeroes it, in one body:

        for t:  for i, j:  d_B[i, j - 1] += 0.2 * d_A[i, j]; ...; d_A[i, j] = 0

    ``scatter_to_gather`` cannot re-index those scatters in place (a gather reads
    ``d_A[i, j + 1]``, which iteration ``j + 1`` zeroes). Splitting the loop, the
    scatters first and the trailing statements in a loop of their own after them,
    keeps every result when no element is accessed by a scatter and a trailing
    statement (at least once written) in different iterations of the loops the two
    share (the split loop and the loops inside it around both) within one iteration
    of the loops around the split one: each part then sees, at each element, what it
    saw before. The outermost such loop is split (here ``i``, inside ``t``: splitting
    ``t`` would run every zeroing after every scatter). Returns the new kernel
    and one decision per split.
    """
    decisions: list[str] = []
    done: set = set()
    changed = True
    while changed:
        changed = False
        for st in kernel.statements:
            if not _is_scatter(st) or st.name in done:
                continue
            done.add(st.name)
            for depth in range(len(st.loops)):
                split = _split_point(kernel, st, depth, model)
                if split is not None:
                    prefix, suffix = split
                    kernel = split_loop(kernel, st.position[:depth + 1], suffix)
                    decisions.append(
                        f"loop {st.loops[depth].var} (line {st.line}) split after its scatters "
                        f"({', '.join(o.name for o in prefix if _is_scatter(o))}): "
                        f"{', '.join(o.name for o in suffix)} write what they read and run in a "
                        f"loop of their own after them (no element is shared between the two "
                        f"parts across iterations)")
                    changed = True
                    break
            if changed:
                break
    return kernel, decisions


def _split_point(kernel: ir.Kernel, st: ir.Statement, depth: int,
                 model: Optional[PolyModel]) -> Optional[tuple[list, list]]:
    """(scatters' part, trailing part) of ``st``'s loop at ``depth`` if splitting it is
    worthwhile (the trailing part writes something a scatter reads) and legal."""
    body = _in_loop(kernel, st, depth)
    last = max(o.position[depth + 1:] for o in body if _is_scatter(o))
    prefix = [o for o in body if o.position[depth + 1:] <= last]
    suffix = [o for o in body if o.position[depth + 1:] > last]
    if not suffix:
        return None
    read = set().union(*[{ld.array for ld in o.reads()} for o in prefix if _is_scatter(o)])
    if not any(isinstance(o.target, Load) and o.target.array in read for o in suffix):
        return None
    if any(isinstance(o.target, ScalarRef) or o.scalar_reads() for o in body):
        return None  # scalars: expand_and_distribute's business
    # The split runs each trailing statement after every scatter of the same iteration
    # of the loops outside the split one, so it reorders any two of their instances in
    # different iterations of the loops the pair shares: the split loop and those inside
    # it that both are in (fuzz seed 15941: the zeroing of d_y0[e] in each iteration of
    # an inner loop over j ran after all of that loop's scatters reading d_y0[e]). So the
    # loops of each pair count, not only those the whole body shares.
    model = model_of(kernel, model)
    for a in prefix:
        by_depth: dict = {}
        for b in suffix:
            by_depth.setdefault(common_depth([a, b]), []).append(b)
        if any(conflicts_across_iterations(model, [a], shared, depth, c)
               for c, shared in by_depth.items()):
            return None
    return prefix, suffix


def split_loop(kernel: ir.Kernel, loop_position: tuple, suffix: list) -> ir.Kernel:
    """Move ``suffix`` (statements of the loop at ``loop_position``) into a copy of that
    loop right after it; later siblings move one position down."""
    depth = len(loop_position) - 1
    moved = {o.name for o in suffix}
    out = []
    for st in kernel.statements:
        p = st.position
        if len(p) > depth and p[:depth] == loop_position[:depth] and (
                p[depth] > loop_position[depth] or st.name in moved):
            p = p[:depth] + (p[depth] + 1,) + p[depth + 1:]
            st = dataclasses.replace(st, position=p)
        out.append(st)
    return dataclasses.replace(kernel, statements=tuple(out))
