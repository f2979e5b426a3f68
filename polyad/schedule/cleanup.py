"""Clean-ups of derived kernels: dead statements, saved-and-restored elements, zero
initializations and independent nests fused into the nests that follow them.

Dead-statement elimination: a statement is dead when it writes a scalar local
(not the returned value) or a temporary array and no later statement reads what
it wrote (it has no outgoing flow dependence). Derived kernels produce such statements, e.g. a
forward sweep recomputing a loop-local value that the adjoint sweep
recomputes again where it needs it.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import islpy as isl

from .. import ir
from ..ir import Load, Loop
from ..poly import (PolyModel, approximate, coalesced, constant_value, dependences,
                    lower_dimensional, model_of, offset_from_size, operation_quota,
                    param_exprs, same_element, set_has_existentials, set_to_condition,
                    union_of)
from .gather import array_conflicts_carried, accessed_names
from .nests import (common_depth, fresh_statement_name, loop_nests, rows_selected_by_loops,
                    selected_by_loops)
from .simplify import is_zero, simplify_expr


def _flow_edges(deps) -> set[tuple[str, str]]:
    edges: set[tuple[str, str]] = set()
    for umap in deps.flow.values():
        umap.foreach_map(lambda m: edges.add((m.get_tuple_name(isl.dim_type.in_),
                                              m.get_tuple_name(isl.dim_type.out))))
    return edges


def drop_zero_updates(kernel: ir.Kernel) -> tuple[ir.Kernel, tuple[str, ...]]:
    """The kernel without the updates that add a symbolic zero, and their names.

    A zero-padded read outside the array is the literal 0, so the boundary piece of
    ``s += w[k] * x[v + k - 1]`` that reads it adds ``w[k] * 0.0``, and its adjoint
    ``d_w[k] += d_s[v] * 0.0``. By ``schedule.simplify``'s symbolic-zero rule such a
    term is zero, and the emitter drops the update (``x += 0`` changes nothing); removed
    here, before the schedule, it costs no dependence analysis, and no loop is split
    where it starts or ends.
    """
    funcs = frozenset(f.name for f in kernel.funcs)
    zero = [st.op in ("+=", "-=") and is_zero(simplify_expr(st.expr, funcs))
            for st in kernel.statements]
    if not any(zero):
        return kernel, ()
    return (dataclasses.replace(kernel, statements=tuple(
        st for st, z in zip(kernel.statements, zero) if not z)),
        tuple(st.name for st, z in zip(kernel.statements, zero) if z))


def remove_dead_statements(kernel: ir.Kernel, model: Optional[PolyModel] = None) \
        -> tuple[ir.Kernel, tuple[str, ...]]:
    """The kernel without dead statements, and the names of those removed.

    Live: statements that run (a nonempty domain) and write a parameter array or the
    returned value, and every statement whose value flows (transitively) into a live
    one. A statement that never runs (``if i % 2 == 0`` in a loop over odd ``i``) is
    dead whatever it writes: no schedule of it exists to build.
    """
    temps = {t.name for t in kernel.temps}
    result = kernel.result[0] if kernel.result is not None else None
    model = model_of(kernel, model)

    def is_root(st: ir.Statement) -> bool:
        t = st.target
        return t.array not in temps if isinstance(t, Load) else t.name == result

    runs = {st.name for st in kernel.statements if not model.domain(st).is_empty()}
    live = {st.name for st in kernel.statements if is_root(st) and st.name in runs}
    if len(live) == len(kernel.statements):
        return kernel, ()
    # Only values of locals and temporaries can be dead: their flow is all we need.
    private = temps | {n for n, _ in kernel.locals}
    edges = _flow_edges(dependences(model, variables=private, flow_only=frozenset(private)))
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


def _sets_whole_array(kernel: ir.Kernel, z: ir.Statement) -> bool:
    """Is ``z`` ``T[i, j, ...] = c`` (a constant) over all of T, alone in its top-level nest?"""
    return not z.conditions and _sets_array(kernel, z)


def _sets_array(kernel: ir.Kernel, z: ir.Statement) -> bool:
    """Is ``z`` ``T[i, j, ...] = c`` (a constant) over T's shape, where its affine
    conditions hold, alone in its top-level nest?"""
    t = z.target
    return (isinstance(t, Load) and bool(z.loops) and z.op == "=" and z.guard is None
            and isinstance(z.expr, ir.Const)
            and ir.loops_cover(z.loops, kernel.array_type(t.array).shape)
            and _is_identity_over(z, z.loops) and len(t.index) == len(z.loops)
            and sum(1 for s in kernel.statements if s.position[0] == z.position[0]) == 1)


def fuse_zero_initialization(kernel: ir.Kernel) -> tuple[ir.Kernel, tuple[str, ...]]:
    """Move ``T[i, j] = 0`` loops into the loop nest that then accumulates into T.

    Adjoint arrays are zeroed in a nest of their own and then summed into;
    when the summing nest visits each element of T in exactly one iteration
    of its outer loops (every access is ``T[i, j] += ...`` on those loops),
    zeroing the element at the start of that iteration is the same, and saves
    a pass over memory: the compiler turns "store 0, add, add" into one store.

    The same holds row by row: when every access to T in the nest (a write of any kind
    or a read) is to a row ``T[m, :]`` (all dimensions but the last) selected by the
    nest's outer loops, zeroing that row (what the zeroing sets of it, its conditions
    kept) at the start of iteration ``m`` comes before all of them, and nothing between
    the zeroing and the nest touches T. A zeroing left with the edge rows by
    ``assign_first_updates`` moves so (the deconvolution gradient's ``d_t``), and the
    temporary is then written and read only inside that nest
    (``fusion.rows_per_iteration``).
    Returns the new kernel and the names of the moved statements.
    """
    statements = list(kernel.statements)
    moved = []
    for z in list(statements):
        if not _sets_array(kernel, z):
            continue
        t = z.target
        shape = kernel.array_type(t.array).shape
        later = [s for s in statements if s.position[0] > z.position[0] and s.accesses(t.array)]
        if not later:
            continue
        pos2 = min(s.position[0] for s in later)
        nest = [s for s in statements if s.position[0] == pos2]
        users = [s for s in nest if s.accesses(t.array)]
        d = len(shape)
        head = nest[0]
        if (not z.conditions and common_depth(nest) >= d and ir.loops_cover(head.loops[:d], shape)
                and all(s.op in ("+=", "-=") and _is_identity_over(s, head.loops[:d])
                        and len(s.target.index) == d
                        and not s.reads_variable(t.array) for s in users)):
            c = d
        else:
            # one row per iteration (a zeroing of several dimensions in an outer loop would
            # cut the nest's shared loops, which the loop-order passes need, for no reuse)
            c = d - 1
            if not (c and common_depth(nest) >= c and ir.loops_cover(head.loops[:c], shape[:c])
                    and rows_selected_by_loops(nest, t.array, c)):
                continue
        first = min(s.position[c] for s in nest)
        rename = {lp.var: ir.LoopVar(new.var) for lp, new in zip(z.loops, head.loops[:c])}
        loops = head.loops[:c] + z.loops[c:]
        new_z = dataclasses.replace(
            z.map_exprs(lambda e: rename.get(e.name) if isinstance(e, ir.LoopVar) else None),
            loops=loops, position=head.position[:c] + (first - 1,) + (0,) * (d - c))
        statements[statements.index(z)] = new_z
        moved.append(z.name)
    if not moved:
        return kernel, ()
    statements.sort(key=lambda s: s.position)
    return dataclasses.replace(kernel, statements=tuple(statements)), tuple(moved)


def zero_rows_in_their_step(kernel: ir.Kernel) -> tuple[ir.Kernel, list[str]]:
    """Move a whole-array zeroing ``T[...] = 0`` into the nest that next sums into T, row
    by row, where the loop order has made that nest gather each row in one step.

    ``fuse_zero_initialization`` moves a zeroing where the summing nest's statements index
    T by its loops as they are before the loop order; the conv gradient's input gather
    ``d_x[b, ci, h - 1, v] += ...`` reaches its form only there (a scatter before the
    gather, then a row one step behind its producers, in the loops ``b, h, ci`` of the
    fused nest), and its zeroing stayed a pass of its own, whose rows the gather then read
    back from memory. Here the statements of the nest that touch T must all be ``+=`` or
    ``-=`` (no guard, T read nowhere else in them), with the same index on every dimension
    but the last, each of those a loop of their shared outer loops plus a constant, every
    one of those outer loops down to the deepest one used indexing one dimension, and
    those loops' ranges covering T's rows. Each row is then reached in one iteration of
    those loops; a zeroing of the row (all of its last dimension) at the start of that
    iteration, before everything else there, comes before every access to it after the
    old zeroing, and nothing between the old zeroing and the nest touches T. Returns the
    new kernel and one decision per moved zeroing."""
    statements = list(kernel.statements)
    decisions = []
    for z in kernel.statements:
        if not (_sets_whole_array(kernel, z) and is_zero(z.expr)):
            continue
        array = z.target.array
        shape = kernel.array_type(array).shape
        later = [s for s in statements if s.position[0] > z.position[0] and s.accesses(array)]
        if not later or len(shape) < 2:
            continue
        pos2 = min(s.position[0] for s in later)
        users = [s for s in statements if s.position[0] == pos2 and s.accesses(array)]
        lead = users[0].target.index[:-1] if isinstance(users[0].target, Load) else None
        if lead is None or not all(
                isinstance(s.target, Load) and s.target.array == array and s.op in ("+=", "-=")
                and s.guard is None and not s.reads_variable(array)
                and s.target.index[:-1] == lead for s in users):
            continue
        rows = _rows_by_outer_loops(lead, users[0].loops[:common_depth(users)], shape,
                                    kernel.sizes)
        if rows is None:
            continue
        c, conditions = rows
        head = users[0]
        first = min(s.position[c] for s in statements
                    if s.position[0] == pos2 and len(s.position) > c
                    and s.position[:c] == head.position[:c])
        last = z.loops[-1]
        if any(lp.var == last.var for lp in head.loops[:c]):
            continue
        row = dataclasses.replace(
            z, target=dataclasses.replace(z.target, index=lead + (ir.LoopVar(last.var),)),
            loops=head.loops[:c] + (last,), conditions=conditions,
            position=head.position[:c] + (first - 1, 0))
        statements[statements.index(z)] = row
        decisions.append(f"{array}: zeroed row by row in the step of the loops "
                         f"{', '.join(lp.var for lp in head.loops[:c])} that sums into the row "
                         f"({', '.join(u.name for u in users)}), not in a pass of its own")
    if not decisions:
        return kernel, decisions
    statements.sort(key=lambda s: s.position)
    return dataclasses.replace(kernel, statements=tuple(statements)), decisions


def _rows_by_outer_loops(lead: tuple, loops: tuple, shape: tuple, sizes):
    """``(c, conditions)`` where the row index ``lead`` (all dimensions but the last) is
    one of the first ``c`` of ``loops`` plus a constant in each dimension, each of those
    loops in one dimension, and their ranges cover the rows of ``shape`` (``conditions``:
    the iterations whose row is in bounds); None otherwise. ``sizes``: the kernel's."""
    dims = {}
    for d, e in enumerate(lead):
        names = {x.name for x in ir.walk(e) if isinstance(x, ir.LoopVar)}
        var = names.pop() if len(names) == 1 else None
        offset = offset_from_size(e, var) if var is not None else None
        if offset is None or var in dims:
            return None
        dims[var] = (d, offset, e)
    c = next((k for k, lp in enumerate(loops) if lp.var not in dims), len(loops))
    if c == 0 or any(lp.var in dims for lp in loops[c:]) or len(dims) != c:
        return None
    conditions = []
    for lp in loops[:c]:
        d, offset, row = dims[lp.var]
        shift = ir.Const(offset, ir.i64)
        lo = constant_value(ir.Binary("+", lp.lo, shift, ir.i64), sizes)
        hi = constant_value(ir.Binary("-", ir.Binary("+", lp.hi, shift, ir.i64), shape[d],
                                      ir.i64), sizes)
        if lp.step != 1 or lo is None or hi is None or lo > 0 or hi < 0:
            return None
        if lo < 0:
            conditions.append(ir.Condition(ir.Binary(">=", row, ir.Const(0, ir.i64), ir.boolean)))
        if hi > 0:
            conditions.append(ir.Condition(ir.Binary("<", row, shape[d], ir.boolean)))
    return c, tuple(conditions)


def forward_copies(kernel: ir.Kernel) -> tuple[ir.Kernel, list]:
    """Drop the restore of an element the adjoint saved and zeroed, and read it in place.

    The adjoint of a self-update ``x[i] = x[i] + A[j, i] * y[j]`` saves the
    cotangent of its target, zeroes it (the overwrite) and adds the saved value
    back (the read of ``x[i]``), in one loop body::

        t = d_x[i];  d_x[i] = 0;  d_x[i] += t;  d_A[j, i] += t * y[j]

    The middle pair leaves ``d_x[i]`` as it was (``0 + t`` is ``t``, up to the
    sign of a zero, which no later sum or comparison tells apart), so it is
    dropped; then ``d_x[i]`` still holds ``t`` wherever the body reads ``t``
    before anything writes ``d_x`` or ``t`` again, and those reads read
    ``d_x[i]`` itself. The save ``t = d_x[i]`` is then dead when nothing else
    reads ``t`` (``remove_dead_statements``), and the nest only adds into
    ``d_A`` from values it does not change: an order-free sum the later passes
    can reorder (ascending loops, gather, unit stride, lane sums).

    Only statements of one innermost loop body (same loops and conditions, no
    nested loop in the body, no guards) are rewritten; the save, the zeroing and
    the restore must follow each other. Returns the kernel and one line per
    rewritten body.
    """
    bodies: dict[tuple, list] = {}
    for st in kernel.statements:
        bodies.setdefault(st.position[:-1], []).append(st)
    drop: set = set()
    replace: dict = {}
    decisions = []
    for prefix, body in bodies.items():
        body = sorted(body, key=lambda s: s.position)
        if any(len(s.position) != len(prefix) + 1 or s.loops != body[0].loops
               or s.conditions != body[0].conditions or s.guard is not None
               for s in body) or any(len(s.position) > len(prefix) + 1
                                     and s.position[:len(prefix)] == prefix
                                     for s in kernel.statements):
            continue
        for k in range(len(body) - 2):
            save, zero, restore = body[k:k + 3]
            if not (isinstance(save.target, ir.ScalarRef) and save.op == "="
                    and isinstance(save.expr, Load) and zero.target == save.expr
                    and zero.op == "=" and isinstance(zero.expr, ir.Const)
                    and zero.expr.value == 0 and restore.target == save.expr
                    and restore.op == "+=" and restore.expr == save.target):
                continue
            t, elem = save.target, save.expr
            drop |= {zero.name, restore.name}
            readers = []
            for later in body[k + 3:]:
                if later.target_name in (t.name, elem.array):
                    break
                base = replace.get(later.name, later)
                new_expr = ir.map_expr(base.expr, lambda x: elem if x == t else None)
                if new_expr is not base.expr:
                    replace[later.name] = dataclasses.replace(base, expr=new_expr)
                    readers.append(later.name)
            decisions.append(
                f"restore of {ir.expr_str(elem)} after its save in {t.name} dropped "
                f"({zero.name}, {restore.name}: zeroed, then {t.name} added back)"
                + (f"; {', '.join(readers)} read {ir.expr_str(elem)} in place of {t.name}"
                   if readers else ""))
    if not drop:
        return kernel, []
    statements = tuple(replace.get(s.name, s) for s in kernel.statements if s.name not in drop)
    return dataclasses.replace(kernel, statements=statements), decisions


def fuse_independent_nests(kernel: ir.Kernel, model: Optional[PolyModel] = None) \
        -> tuple[ir.Kernel, list]:
    """Fuse consecutive perfect loop nests over the same loops whose iterations are independent.

    The gradient of mvt writes ``d_A`` in two nests, ``d_A[j, i] = d_x2[i] * y_2[j]``
    (a gather, after ``forward_copies``) and ``d_A[i, j] += d_x1[i] * y_1[j]``: two
    passes over an N x N array where one does. Two nests at consecutive top-level
    positions that write a common array are fused (the second's loop variables
    renamed to the first's, its statements after the first's in each iteration) when
    both are perfect nests (statements only in the innermost body) with the same
    ascending loops, neither writes a scalar, and in the fused nest no two accesses to one array element, one
    of them a write, lie in different iterations (``gather.array_conflicts_carried``).
    Then every conflict is between instances of one iteration, which run in their
    program order, so the results are the same bit for bit; and the fused loops are
    as parallel as the two nests were. Returns the kernel and one line per fusion.
    """
    locals_ = {n for n, _ in kernel.locals}
    decisions = []
    while True:
        nests = loop_nests(kernel)
        order = sorted({st.position[0] for st in kernel.statements})
        for p, q in zip(order, order[1:]):
            if p not in nests or q not in nests:
                continue
            fused = _fused(nests[p], nests[q], locals_)
            if fused is None:
                continue
            candidate = dataclasses.replace(kernel, statements=tuple(sorted(
                (fused.get(st.name, st) for st in kernel.statements),
                key=lambda s: s.position)))
            nest = [fused.get(st.name, st) for st in nests[p] + nests[q]]
            depth = len(nest[0].loops)
            if array_conflicts_carried(model_of(candidate, model), nest, depth,
                                        accessed_names(nest) - locals_):
                continue
            kernel = candidate
            first = sorted({st.owner for st in nests[p]})
            second = sorted({st.owner for st in nests[q]})
            decisions.append(
                f"fused the loop nest of {', '.join(second)} into that of "
                f"{', '.join(first)} (loops {', '.join(lp.var for lp in nest[0].loops)}): "
                f"no dependence between different iterations, one pass over memory")
            break
        else:
            return kernel, decisions


def _fused(first: list, second: list, locals_: set) -> Optional[dict]:
    """The statements of ``second`` renamed into the loops of ``first`` and placed after its
    statements (name -> new statement), when both are perfect nests over the same
    ascending loops that write no scalar and a common array; else None."""
    loops = first[0].loops
    d = len(loops)
    for nest in (first, second):
        for st in nest:
            if (len(st.loops) != d or len(st.position) != d + 1
                    or any(x != 0 for x in st.position[1:d]) or st.target_name in locals_
                    or any(lp.step != 1 for lp in st.loops)):
                return None
        if any(st.loops != nest[0].loops for st in nest):
            return None
    if not {st.target_name for st in first} & {st.target_name for st in second}:
        return None
    rename = {lp.var: ir.LoopVar(mine.var) for lp, mine in zip(second[0].loops, loops)}
    renamed = tuple(Loop(mine.var, ir.substitute(lp.lo, rename), ir.substitute(lp.hi, rename),
                         1) for lp, mine in zip(second[0].loops, loops))
    if renamed != loops:
        return None
    after = max(st.position[-1] for st in first) + 1
    out = {}
    for st in second:
        out[st.name] = dataclasses.replace(
            st, loops=loops, position=first[0].position[:d] + (after + st.position[-1],),
            target=ir.substitute(st.target, rename), expr=ir.substitute(st.expr, rename),
            guard=None if st.guard is None else ir.substitute(st.guard, rename),
            conditions=tuple(dataclasses.replace(c, expr=ir.substitute(c.expr, rename))
                             for c in st.conditions))
    return out


def updates_in_place(kernel: ir.Kernel) -> tuple[ir.Kernel, tuple]:
    """``x = x + e`` (or ``e + x``) as ``x += e``, and ``x = x - e`` as ``x -= e``, for array
    elements ``x`` (operands of the target's type).

    PolyBench writes its dot products as ``q[i] = q[i] + A[i, j] * p[j]``; as an update
    the loop facts see a sum along ``j`` (a reduction the plan can run in lanes).
    The value is the same bit for bit: C evaluates ``x += e`` as ``x = x + e``, and
    IEEE addition is commutative. Returns the kernel and the names of the statements
    rewritten.
    """
    out, changed = [], []
    for st in kernel.statements:
        e = st.expr
        inc = None
        if (st.op == "=" and st.guard is None and isinstance(st.target, Load)
                and isinstance(e, ir.Binary) and e.dtype == st.target.dtype
                and e.a.dtype == e.b.dtype == e.dtype):
            if e.op == "+" and e.a == st.target:
                inc, op = e.b, "+="
            elif e.op == "+" and e.b == st.target:
                inc, op = e.a, "+="
            elif e.op == "-" and e.a == st.target:
                inc, op = e.b, "-="
        if inc is None:
            out.append(st)
            continue
        out.append(dataclasses.replace(st, op=op, expr=inc))
        changed.append(st.name)
    if not changed:
        return kernel, ()
    return dataclasses.replace(kernel, statements=tuple(out)), tuple(changed)


# Bound on ISL's work (its operations) finding one array's first updates. The analysis
# only saves a pass over the zeroed elements, and it grows with the pieces of every access
# to the array: a fuzz kernel's vjp (seed 18067, a strided loop with circular and clamped
# pieces) spent 42 s in it. Past the bound the updates stay as they are (``pa.explain``
# says so).
FIRST_UPDATES_QUOTA = 2_000_000


def assign_first_updates(kernel: ir.Kernel, model: Optional[PolyModel] = None) \
        -> tuple[ir.Kernel, list[str]]:
    """Write the updates that reach an element first after its zeroing as ``=``.

    Adjoint arrays are zeroed (a nest ``T[i, j] = 0`` of their own, or a zero-filled
    temporary) and then summed into. Where ``fuse_zero_initialization`` cannot move the
    zeroing into the summing nest (the border pieces of a clamped filter's adjoint add
    into the edge elements from several iterations), the zeroing and the reads of the
    ``+=`` cost two passes over memory. For each update ``U`` of ``T`` (``+=``/``-=``, no
    guard, an exact access writing each element once, ``T`` read nowhere else in it),
    the instances whose element no other access after the zeroing reaches before them
    become ``T = e`` (``T = -e`` for ``-=``): ``0 + e`` is ``e``. The zeroing skips their
    elements (a zero-filled temporary gets a zeroing statement of its own for the rest).
    An update only some of whose instances qualify is split in two pieces (lineage kind
    ``first``).

    Legality, in program order: an element's zero is read only by its first access after
    the zeroing (the update, which no longer needs it); every other access of the element
    comes after that update, which leaves the same value as before; accesses before the
    zeroing see nothing that changed. Two instances at the same point of the program
    order (pieces at one position) are not ordered, so neither counts as first. Later
    passes and the scheduler see the ``=`` (a plain write, with its value-based
    dependences). Returns the new kernel and decision texts.
    """
    model = model_of(kernel, model)
    params = param_exprs(kernel)
    replaced: dict[str, list[ir.Statement]] = {}  # statement name -> what replaces it
    temps = list(kernel.temps)
    added: list[ir.Statement] = []
    decisions: list[str] = []
    schedule = None
    for array, zeroing in _zeroings(kernel).items():
        after = [st for st in kernel.statements if st is not zeroing and st.accesses(array)
                 and (zeroing is None or st.position[0] > zeroing.position[0])]
        candidates = [st for st in after if _update_candidate(st, array)]
        if not candidates:
            continue
        if schedule is None:
            schedule = model.schedule_map()
        try:
            with operation_quota(model.ctx, FIRST_UPDATES_QUOTA):
                firsts = _first_instances(model, schedule, after, candidates, array)
        except isl.Error:
            decisions.append(f"{array}: its updates stay updates after its zeroing: finding "
                             f"the instances that reach their elements first ran past ISL's "
                             f"quota of {FIRST_UPDATES_QUOTA:_} operations")
            continue
        if not firsts:
            continue
        elements = None
        for st, first in firsts:
            reached = model.access_map(st, st.target).intersect_domain(first).range()
            elements = reached if elements is None else elements.union(reached)
        elements = coalesced(elements)
        tangled = [s for s in [elements] + [first.gist(model.domain(st)) for st, first in firsts]
                   if not _plain_condition(s)]
        if tangled:
            decisions.append(f"{array}: its updates stay updates after its zeroing: the "
                             f"elements they reach first make a condition of "
                             f"{tangled[0].n_basic_set()} pieces or with divisions, which "
                             f"would cost each iteration more than the zeroing's pass saves")
            continue
        for st, first in firsts:
            replaced[st.name] = _first_pieces(kernel, model, st, first, params)
        if zeroing is None:  # a zero-filled temporary: zeroed by a statement of its own now
            t = next(t for t in temps if t.name == array)
            temps[temps.index(t)] = dataclasses.replace(t, zero=False)
            zeroing = _zeroing_statement(kernel, t, added)
            added.append(zeroing)
        skip = set_to_condition(elements, list(zeroing.loop_vars), params)
        kept = dataclasses.replace(zeroing, conditions=zeroing.conditions
                                   + (ir.Condition(skip, positive=False),))
        if zeroing in added:
            added[added.index(zeroing)] = kept
        else:
            replaced[zeroing.name] = [kept]
        names = ", ".join(st.name for st, _ in firsts)
        decisions.append(f"{array}: the updates {names} assign (=) the elements they reach "
                         f"first after the zeroing of {array}, which skips those elements")
    if not replaced:
        return kernel, decisions
    # the zeroing statements of temporaries run first, one top-level nest each
    out = [dataclasses.replace(z, position=(j,) + z.position[1:]) for j, z in enumerate(added)]
    for st in kernel.statements:
        for piece in replaced.get(st.name, [st]):
            out.append(dataclasses.replace(piece, position=(piece.position[0] + len(added),)
                                           + piece.position[1:]) if added and piece.position
                       else piece)
    out.sort(key=lambda s: s.position)
    return dataclasses.replace(kernel, statements=tuple(out), temps=tuple(temps)), decisions


# Most pieces (disjuncts) of a condition ``assign_first_updates`` writes. The corpora's
# conditions have one to four; a fuzz kernel's vjp (seed 19650: strided loops, zero-mode
# reads at offsets) had 28 with 85 existential variables, and ISL's AST generation of
# its statements so split ran for more than ten minutes.
FIRST_UPDATE_PIECES = 8


def _plain_condition(s: isl.Set) -> bool:
    """Whether ``s`` makes a condition worth testing in each iteration: at most
    ``FIRST_UPDATE_PIECES`` pieces, none with existential variables (a ``mod`` or
    ``floor`` test)."""
    return s.n_basic_set() <= FIRST_UPDATE_PIECES and not set_has_existentials(s)


def _zeroings(kernel: ir.Kernel) -> dict:
    """Array -> the statement that zeroes all of it in a nest of its own, or None for a
    zero-filled temporary (the caller zeroes it); arrays zeroed more than once left out."""
    found: dict[str, list] = {}
    for z in kernel.statements:
        if _sets_whole_array(kernel, z) and z.expr.value == 0:
            found.setdefault(z.target.array, []).append(z)
    out = {name: zs[0] for name, zs in found.items() if len(zs) == 1}
    for t in kernel.temps:
        if t.zero and not t.per_thread and t.name not in found:
            out[t.name] = None
    return out


def _update_candidate(st: ir.Statement, array: str) -> bool:
    """An update of ``array`` whose first instances may be assignments: no guard, an
    exact access selected by its loops (a sum into one element, ``d_f[0] += ...``, is a
    reduction a border piece's single instance should not start), ``array`` not read."""
    t = st.target
    return (isinstance(t, Load) and t.array == array and st.op in ("+=", "-=")
            and st.guard is None and not approximate(t) and not st.reads_variable(array)
            and selected_by_loops(t))


def _first_instances(model: PolyModel, schedule: isl.UnionMap, after: list,
                     candidates: list, array: str) -> list:
    """(update, the instances of it that reach their element first among ``after``'s
    accesses to ``array``) for the candidates with some such instance."""
    space = model.context.get_space()
    accesses = union_of([model.access_map(st, ld).to_union_map() for st in after
                         for ld in st.reads() + [st.target]
                         if isinstance(ld, Load) and ld.array == array],
                        isl.UnionMap.empty(space))
    domains = union_of([model.domain(st).to_union_set() for st in after],
                       isl.UnionSet.empty(space))
    order = schedule.intersect_domain(domains)
    before = order.lex_lt_union_map(order)
    out = []
    for st in candidates:
        dom = model.domain(st)
        write = model.access_map(st, st.target)
        if not write.is_injective():
            continue  # a sum of many instances per element (a filter's gradient): its
            # first instances are few, and split off they would cost the sum its loops
        others = same_element(write.to_union_map(), accesses).subtract(
            isl.Map.identity(write.domain().get_space().map_from_set()).to_union_map())
        late = others.subtract(before).domain()
        first = coalesced(dom.subtract(late.extract_set(dom.get_space())))
        # elements on a face of the array only (an edge column, one element) are left
        # to the zeroing: their own piece would cost more than the pass it saves
        if not first.is_empty() and not lower_dimensional(write.intersect_domain(first).range()):
            out.append((st, first))
    return out


def _first_pieces(kernel: ir.Kernel, model: PolyModel, st: ir.Statement, first: isl.Set,
                  params: dict) -> list:
    """``st`` as an assignment on ``first``, and as it was on the rest of its domain."""
    value = st.expr if st.op == "+=" else ir.Unary("neg", st.expr, st.expr.dtype)
    if first.is_equal(model.domain(st)):
        return [dataclasses.replace(st, op="=", expr=value)]
    cond = set_to_condition(first.gist(model.domain(st)), list(st.loop_vars), params)
    names = [fresh_statement_name(kernel, f"{st.name}_{suffix}") for suffix in ("first", "rest")]
    return [dataclasses.replace(st.split("first", 0, names[0]), op="=", expr=value,
                                conditions=st.conditions + (ir.Condition(cond),)),
            dataclasses.replace(st.split("first", 1, names[1]),
                                conditions=st.conditions + (ir.Condition(cond, positive=False),))]


def _zeroing_statement(kernel: ir.Kernel, temp: ir.Temp, added: list) -> ir.Statement:
    """``temp[i0, i1, ...] = 0`` over its shape (placed first in the kernel by the caller)."""
    name = fresh_statement_name(kernel, f"zero_{temp.name}", frozenset(s.name for s in added))
    at = temp.type
    loops = tuple(Loop(f"i{d}", ir.Const(0, ir.i64), ext) for d, ext in enumerate(at.shape))
    return ir.Statement(name=name, loops=loops, position=(0,) * (len(loops) + 1),
                        conditions=(), guard=None,
                        target=Load(temp.name, tuple(ir.LoopVar(lp.var) for lp in loops),
                                    at.dtype),
                        op="=", expr=ir.Const(0.0, at.dtype), line=kernel.line,
                        source=f"zero {temp.name}")
