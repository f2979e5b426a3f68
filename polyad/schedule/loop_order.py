"""Loop order of order-free nests: the unit-stride loop innermost, small constant loops outside it.

The adjoint of a convolution ends in nests like

    for b, ci, h, v, co, kh, kw:  d_x[b, ci, h, v] += d_s[b, co, h - kh + 1, v - kw + 1] * w[...]
    for b, co, h, v, ci, kh, kw:  d_w[co, ci, kh, kw] += d_s[b, co, h, v] * x[b, ci, h + kh - 1, v + kw - 1]

whose innermost loop runs over 3 filter taps, so nothing vectorizes along
the pixel row ``v``. This pass moves the unit-stride loop innermost:

    for b, ci, h, co, kh, kw, v:  d_x[b, ci, h, v] += ...   (a vector loop over a row)
    for b, co, h, ci, kh, kw, v:  d_w[co, ci, kh, kw] += ... (a vector sum into one element)

Legality. A nest is *order-free* when every statement adds (``+=``/``-=``)
into an array element and no statement of the nest reads an array the nest
writes (nor a scalar it writes: it writes none). Then every instance only
adds a value computed from data the nest does not change, so any order of
the instances gives the same sums. Moving one loop inward past others keeps
the relative order of all the other loops, so the terms that one element
receives still arrive in the same order (the loops that enumerate them keep
their order): results are the same bit for bit, not just up to rounding.
A loop moves only when its bounds do not use the loops it passes and theirs
do not use it. Each statement of a rewritten nest gets a nest of its own
(distribution: legal for the same reason), unless two of them write one
array, when the nest is left alone (their terms would interleave
differently). A statement that only sets each element before the nest adds into
it (a gather's zeroing, ``_initializations``) is not part of that rule: it runs
as a nest of its own before the others.

When. The innermost loop has a small constant trip count (at most
``SMALL_TRIP``: filter taps), and another loop whose trip count grows with
the sizes indexes the last (unit-stride) dimension of the target, or of
most reads, with coefficient 1 and no other dimension of that access. That
loop becomes innermost.

Also here: per-point sums kept in a row (``expand_reduction_rows``), small
tap loops unrolled into the row loop (``jam_small_loops``), two loops
interchanged so that rows read by every iteration of one are reused from cache
(``interchange_for_reuse``), and sums along a row computed for several values of
an outer loop in one pass over the row (``block_sums_in_registers``).

The decisions (statement name -> text) are kept in
``ScheduledKernel.loop_orders`` and shown by ``pa.explain``.
"""

from __future__ import annotations

import dataclasses

from .. import ir
from ..ir import Binary, Const, Load, LoopVar, ScalarRef, Unary, uses_loop_vars
from ..poly import model_of
from .distribute import conflicts_across_iterations, split_loop
from .gather import iterations_independent_but_sums
from .machine import VectorUnit
from .nests import common_depth, fresh_statement_name, inner_loops, loop_nests

# Innermost loops with at most this many iterations (whatever the sizes) are not worth
# keeping innermost when a loop over a row of the data could be.
SMALL_TRIP = 16


def unit_stride_innermost(kernel: ir.Kernel) -> tuple[ir.Kernel, dict[str, str]]:
    """``kernel`` with the order-free nests reordered (see the module docstring), and the
    decisions (owner statement name -> what was done and why)."""
    decisions: dict[str, str] = {}
    new_order: dict[str, tuple] = {}  # piece name -> its loops, reordered
    placed: dict[str, tuple] = {}  # statement name -> (loops, position), nest kept whole
    for pos, nest in sorted(loop_nests(kernel).items()):
        inits = _initializations(nest)
        updates = [st for st in nest if st not in inits]
        owners = list(dict.fromkeys(st.owner for st in updates))
        why = _not_order_free(updates, {z.target.array for z in inits})
        if why:
            for st in updates:
                if _reordered(st)[0] is not None:
                    decisions.setdefault(st.owner, f"loop order kept: {why}")
            continue
        moved = {}
        for st in updates:
            loops, text = _reordered(st)
            if loops is not None:
                moved[st.name] = loops
                decisions.setdefault(st.owner, text)
        if not moved:
            continue
        writers: dict[str, set] = {}
        for st in updates:
            writers.setdefault(st.target.array, set()).add(st.owner)
        if len(owners) > 1 and any(len(w) > 1 for w in writers.values()):
            for owner in owners:
                decisions.pop(owner, None)
            continue
        rows = _initialized_rows(inits, updates, moved) if inits else None
        if rows is not None:
            placed.update(rows)
            for z in inits:
                add_decisions(decisions, {z.owner: f"{z.name} runs along the loop "
                                                   f"{z.loops[-1].var} before the updates of "
                                                   "the elements it sets, in the iteration of "
                                                   "the loops they share (their loops "
                                                   "reordered)"})
            continue
        for z in inits:
            add_decisions(decisions, {z.owner: f"{z.name} moved to a nest of its own before the "
                                               "updates of the elements it sets (their loops "
                                               "reordered)"})
        new_order.update(moved)
    if not new_order and not placed:
        return kernel, {}
    if placed:
        kernel = dataclasses.replace(kernel, statements=tuple(
            dataclasses.replace(st, loops=placed[st.name][0], position=placed[st.name][1])
            if st.name in placed else st for st in kernel.statements))
    return (_apply(kernel, new_order) if new_order else kernel), decisions


def _initialized_rows(inits: list, updates: list, moved: dict):
    """{name: (loops, position)} keeping the initializations in their nest, each as a loop
    of its own inside the loops it shares with the reordered updates, before them; None
    when that does not apply (then they get nests of their own).

    Applies when every update moved and they have one owner (they stay in one nest), and
    the loops in front of the one each moved are the same ``k`` loops, all of them loops
    of every initialization, which has more. The initializations' loops are a prefix of
    the updates' (``_initializations``), whose targets are theirs: every update instance
    adds into an element that an initialization sets in the same iteration of those ``k``
    loops, where the initializations now run first."""
    if len({st.owner for st in updates}) != 1 or set(moved) != {st.name for st in updates}:
        return None
    depths = set()
    for st in updates:
        new = moved[st.name]
        depths.add(next(k for k, (a, b) in enumerate(zip(st.loops, new)) if a != b))
    if len(depths) != 1:
        return None
    (k,) = depths
    if any(len(z.loops) <= k for z in inits):
        return None
    out = {}
    for slot, z in enumerate(sorted(inits, key=lambda z: z.position)):
        out[z.name] = (z.loops, z.position[:k] + (slot,) + (0,) * (len(z.loops) - k))
    for st in updates:
        loops = moved[st.name]
        out[st.name] = (loops, st.position[:k] + (len(inits),) + (0,) * (len(loops) - k))
    return out


def _initializations(nest: list) -> list:
    """The statements of ``nest`` that set each element of an array the rest only adds into,
    before those additions: ``d_x[b, ci, h, v] = 0`` in the loops ``b, h, ci, v``, which
    ``cleanup.fuse_zero_initialization`` put ahead of ``d_x[b, ci, h, v] += ...`` in the
    loops ``b, h, ci, v, co, kh, kw``.

    Such a statement ``Z`` may run as a nest of its own before the others (which then
    reorder freely) when: its target's indices are its loop variables, each once, so each
    iteration sets its own element; every other statement touching that array adds into
    the element ``Z`` sets in the same iteration of ``Z``'s loops (the same loops and
    target, after ``Z`` there); ``Z`` reads nothing the nest writes; and its owner owns
    none of those additions (``_apply`` gives each owner a nest of its own). Every
    element is then set before any term arrives, as before.
    """
    written = {st.target.array if isinstance(st.target, Load) else st.target.name
               for st in nest}
    found = []
    for z in nest:
        t = z.target
        if z.op != "=" or not isinstance(t, Load) or z.guard is not None:
            continue
        names = [e.name for e in t.index if isinstance(e, LoopVar)]
        if len(names) != len(t.index) or sorted(names) != sorted(z.loop_vars):
            continue
        if any(isinstance(x, Load) and x.array in written or isinstance(x, ScalarRef)
               and x.name in written for x in ir.walk(z.expr)):
            continue
        d = len(z.loops)
        users = [st for st in nest if st is not z and st.accesses(t.array)]
        if users and all(st.op in ("+=", "-=") and st.target == t and st.owner != z.owner
                         and st.loops[:d] == z.loops and st.position[:d] == z.position[:d]
                         and st.position[d] > z.position[d] for st in users):
            found.append(z)
    return found


def _not_order_free(nest: list, initialized: set = frozenset()) -> str:
    """Why the nest is not order-free, or ''. ``initialized`` names arrays the nest only adds
    into once an initialization kept out of ``nest`` has set them (``_initializations``)."""
    written = set(initialized)
    for st in nest:
        if not isinstance(st.target, Load) or st.op not in ("+=", "-="):
            return f"{st.name} is not an update '+=' of an array element"
        written.add(st.target.array)
    for st in nest:
        if any(isinstance(x, Load) and x.array in written or isinstance(x, ScalarRef)
               and x.name in written for e in st.exprs() for x in ir.walk(e)):
            return f"{st.name} reads an array the nest writes"
        if any(lp.step <= 0 for lp in st.loops):
            return f"{st.name} has a descending loop"
    return ""


def _trip(lp: ir.Loop):
    """The constant trip count of ``lp``, or None when it depends on sizes or loops."""
    if isinstance(lp.lo, Const) and isinstance(lp.hi, Const):
        return max(0, -(-(lp.hi.value - lp.lo.value) // lp.step))
    return None


def _reordered(st: ir.Statement):
    """(new loops, decision text) moving the unit-stride loop of ``st`` innermost, or (None, '')."""
    if len(st.loops) < 2:
        return None, ""
    inner = st.loops[-1]
    trip = _trip(inner)
    if trip is None or trip > SMALL_TRIP:
        return None, ""
    unit, where = _unit_stride_loop(st)
    if unit is None:
        return None, ""
    k = st.loop_vars.index(unit)
    lp = st.loops[k]
    passed = st.loops[k + 1:]
    passed_vars = {p.var for p in passed}
    if any(uses_loop_vars(b, passed_vars) for b in (lp.lo, lp.hi)) or \
            any(uses_loop_vars(b, {unit}) for p in passed for b in (p.lo, p.hi)):
        return None, ""
    loops = st.loops[:k] + passed + (lp,)
    small = [p.var for p in passed if _trip(p) is not None and _trip(p) <= SMALL_TRIP]
    text = (f"loop {unit} moved innermost (unit stride in {where}); "
            f"{', '.join(p.var for p in passed)} now outside it "
            f"({', '.join(small)}: at most {SMALL_TRIP} iterations); "
            "order-free nest: the sums keep their order")
    return loops, text


def _unit_stride_loop(st: ir.Statement):
    """(loop variable, access text) of the loop that walks the last dimension of the target,
    or else of most reads, with coefficient 1; (None, '') when there is none."""
    sized = {lp.var for lp in st.loops if _trip(lp) is None}
    var = _unit_var(st.target, sized) if isinstance(st.target, Load) else None
    if var is not None:
        return var, ir.expr_str(st.target)
    votes: dict[str, list] = {}
    for ld in dict.fromkeys(ir.loads(st.expr)):
        v = _unit_var(ld, sized)
        if v is not None:
            votes.setdefault(v, []).append(ir.expr_str(ld))
    if not votes:
        return None, ""
    var = max(votes, key=lambda v: (len(votes[v]), -st.loop_vars.index(v)))
    return var, ", ".join(votes[var])


def _unit_var(ld: Load, candidates: set):
    """The candidate loop variable that the last index of ``ld`` adds with coefficient 1
    and no other index uses, or None."""
    if not ld.index:
        return None
    last = ld.index[-1]
    for v in sorted(candidates):
        if _plain_term(last, v) and not any(uses_loop_vars(e, {v}) for e in ld.index[:-1]):
            return v
    return None


def _plain_term(e: ir.Expr, var: str, sign: int = 1) -> bool:
    """Is ``e`` a sum in which ``var`` occurs once, as a term added with sign +?"""
    if isinstance(e, LoopVar):
        return e.name == var and sign == 1
    if isinstance(e, Binary) and e.op in ("+", "-"):
        a, b = uses_loop_vars(e.a, {var}), uses_loop_vars(e.b, {var})
        if a and b:
            return False
        if a:
            return _plain_term(e.a, var, sign)
        if b:
            return _plain_term(e.b, var, sign if e.op == "+" else -sign)
        return False
    if isinstance(e, Unary) and e.op == "neg":
        return _plain_term(e.a, var, -sign)
    return False


def _apply(kernel: ir.Kernel, new_order: dict) -> ir.Kernel:
    """Each rewritten nest split into one nest per owner statement, with the new loops."""
    nests = loop_nests(kernel)
    shift: dict[int, int] = {}  # old nest position -> first new position
    owner_at: dict[tuple, int] = {}  # (old position, owner) -> new position
    nxt = 0
    for pos in sorted(set(st.position[0] for st in kernel.statements)):
        shift[pos] = nxt
        nest = nests.get(pos, [])
        if any(st.name in new_order for st in nest):
            for k, owner in enumerate(dict.fromkeys(st.owner for st in nest)):
                owner_at[(pos, owner)] = nxt + k
            nxt += len({st.owner for st in nest})
        else:
            nxt += 1
    out = []
    for st in kernel.statements:
        pos = st.position[0]
        if (pos, st.owner) in owner_at:
            loops = new_order.get(st.name, st.loops)
            st = dataclasses.replace(st, loops=loops,
                                     position=(owner_at[(pos, st.owner)],) + (0,) * len(loops))
        else:
            st = dataclasses.replace(st, position=(shift[pos],) + st.position[1:])
        out.append(st)
    return dataclasses.replace(kernel, statements=tuple(out))


# A small loop is unrolled into the row loop below it while the row loop's body then
# holds at most this many statements: the 9 taps of a 3x3 filter (and the taps of a
# clamped stencil's boundary pieces), one load and store of the updated element per
# row point instead of one per tap. The conv layer's gradient runs 11 % (f32) and 21 %
# (f64) faster than with one filter row (3); ISL separates the outer loops by the taps'
# domains, which costs compile time: the conv layer's 1.5 -> 4.2 s, energy27's
# 2.0 -> 4.4 s (primal + gradient, cold).
JAM_STATEMENTS = 9


def jam_small_loops(kernel: ir.Kernel) -> tuple[ir.Kernel, dict[str, str]]:
    """Unroll small constant loops into the row loop they enclose: the taps of a filter
    row in one pass over the row.

    After ``unit_stride_innermost`` a convolution's sums read::

        for ci, kh, kw:  for v:  s_rows[v] += w[ci, kh, kw] * x[ci, h + kh - 1, v + kw - 1]

    one pass over the row per tap, each loading and storing ``s_rows[v]``. When every
    statement inside one iteration of the small loop (``kw``: constant trip count) sits
    in the one row loop below it (``v``), the small loop is unrolled into the row loop,
    one statement per value (``kw`` replaced by the constant), as long as the row
    loop's body then holds at most ``JAM_STATEMENTS`` statements (pieces included)::

        for ci, kh:  for v:  s_rows[v] += w[ci, kh, 0] * x[ci, h + kh - 1, v - 1]
                             s_rows[v] += w[ci, kh, 1] * x[ci, h + kh - 1, v]
                             s_rows[v] += w[ci, kh, 2] * x[ci, h + kh - 1, v + 1]

    and then the next loop out, ``kh`` (nine taps of the filter per pass over the row,
    where the zero-padded rows' pieces allow it).

    ISL then peels the row loop where the taps' domains differ (zero-padded borders)
    and the updates of one element merge into one (``schedule.merge``).

    Legality: the unrolled statements run for each ``v`` in the order of the small
    loop's values, where they ran for each value of the small loop in the order of
    ``v``. Every statement of the group adds (``+=``/``-=``) into an array element and
    none reads an array or scalar the group writes, so only the order of the terms
    that one element receives could change. Each statement's target uses exactly one
    of the two loops: two instances writing one element then share the value of that
    loop and differ in the other, and they arrive in the order of the other loop, as
    before. The sums are the same bit for bit. Returns the kernel and decisions
    (owner statement name -> text).
    """
    decisions: dict[str, str] = {}
    while True:
        group = _jammable_group(kernel)
        if group is None:
            return kernel, decisions
        kernel, text = _jam(kernel, group)
        add_decisions(decisions, {st.owner: text for st in group})


def add_decisions(decisions: dict[str, str], more: dict[str, str]) -> None:
    """Add ``more`` (owner statement name -> text) to ``decisions`` in place, after the
    text an owner already has."""
    for owner, text in more.items():
        decisions[owner] = f"{decisions[owner]}; {text}" if owner in decisions else text


def _jammable_group(kernel: ir.Kernel):
    """The statements of one iteration of a small loop that can be jammed, or None."""
    seen = set()
    for st in kernel.statements:
        if len(st.loops) < 2:
            continue
        k = len(st.loops) - 2
        key = (st.position[:k + 1], st.loops[:k + 1])
        if key in seen:
            continue
        seen.add(key)
        small, row = st.loops[k], st.loops[k + 1]
        trip = _trip(small)
        if trip is None or trip < 2 or _trip(row) is not None or small.step <= 0 \
                or uses_loop_vars(row.lo, {small.var}) \
                or uses_loop_vars(row.hi, {small.var}):
            continue
        group = [s for s in kernel.statements if len(s.loops) > k
                 and s.loops[:k + 1] == key[1] and s.position[:k + 1] == key[0]]
        if any(len(s.loops) != k + 2 or s.loops[k + 1] != row for s in group):
            continue
        if len(group) * trip > JAM_STATEMENTS or _not_order_free(group):
            continue
        if all(_uses_one_of(s.target, small.var, row.var) for s in group):
            return group
    return None


def _uses_one_of(target: Load, a: str, b: str) -> bool:
    """Does the index of ``target`` use exactly one of the loop variables ``a``, ``b``?"""
    return sum(any(uses_loop_vars(e, {v}) for e in target.index) for v in (a, b)) == 1


def _jam(kernel: ir.Kernel, group: list) -> tuple[ir.Kernel, str]:
    """``kernel`` with the small loop of ``group`` unrolled into its row loop."""
    k = len(group[0].loops) - 2
    small, row = group[0].loops[k], group[0].loops[k + 1]
    values = list(range(small.lo.value, small.hi.value, small.step))
    order = sorted({(t, s.position[k + 1], s.position[k + 2])
                    for t in range(len(values)) for s in group})
    rank = {key: n for n, key in enumerate(order)}
    names = {s.name for s in kernel.statements}
    jammed: dict[str, list] = {}
    for st in group:
        copies = []
        for t, value in enumerate(values):
            const = {small.var: Const(value, ir.i64)}

            def put(e):
                return ir.fold_integer_constants(ir.substitute(e, const))

            name = f"{st.name}_{small.var}{t}"
            while name in names:
                name = "_" + name
            names.add(name)
            target = st.target
            if isinstance(target, Load):
                target = dataclasses.replace(target, index=tuple(put(e) for e in target.index))
            copies.append(dataclasses.replace(
                st.split("jam", t, name), loops=st.loops[:k] + (row,),
                position=st.position[:k + 1] + (rank[t, st.position[k + 1],
                                                     st.position[k + 2]],),
                conditions=tuple(dataclasses.replace(c, expr=put(c.expr))
                                 for c in st.conditions),
                guard=None if st.guard is None else put(st.guard),
                target=target, expr=put(st.expr)))
        jammed[st.name] = copies
    copies = sorted((c for cs in jammed.values() for c in cs), key=lambda s: s.position)
    out = []
    for st in kernel.statements:
        if st.name not in jammed:
            out.append(st)
        elif copies:  # all of them where the first of the group was
            out.extend(copies)
            copies = []
    text = (f"loop {small.var} unrolled into the loop {row.var} ({len(values)} copies, "
            f"{small.var} = {', '.join(map(str, values))}: one pass over the row for all "
            f"of them); order-free: each element keeps the order of its terms")
    return dataclasses.replace(kernel, statements=tuple(out)), text


def expand_reduction_rows(kernel: ir.Kernel, model=None, per_thread: bool = False) \
        -> tuple[ir.Kernel, dict[str, str]]:
    """Vectorize a per-point sum over small constant loops along the row it is computed for.

    A convolution computes, for each output point of a row, a scalar sum over its taps::

        for b, co, h, v:  s = 0;  for ci, kh, kw: s += w[...] * x[..., v + kw - 1];  r = f(s) ...

    The innermost loop runs over 3 taps. When ``s`` carries no value between
    iterations of the shared loops (``b, co, h, v``), it can live in an array
    ``s_rows[b, co, h, v]``; the body of ``v`` then splits into three loops
    over ``v`` (what comes before the sum, the sum, what comes after), and in
    the sum's nest ``v`` moves innermost::

        for b, co, h:  for v: s_rows[..] = 0;  for ci, kh, kw: for v: s_rows[..] += ...;
                       for v: r = f(s_rows[..]) ...

    Legality: the three parts only communicate through ``s`` (now
    ``s_rows``, one element per iteration of the shared loops): every other
    scalar or array the nest writes is used by one part only, and the sum
    reads nothing the nest writes. So running each part for the whole row
    before the next changes no value; inside the sum's nest the terms of one
    element keep their order (``ci, kh, kw``), so the sums are the same bit
    for bit. Only nests with at least two shared loops (the split stays
    inside the nest) and a sum whose innermost loop is small and constant
    (the case where the row is worth it) are rewritten. Returns the kernel and
    decisions (owner statement name -> text).

    ``per_thread`` (targets whose threads run whole loops): the sums live in one row
    ``s_rows[v]`` (a ``sum row`` temporary) that each thread keeps, reused by every
    iteration of the shared loops around the row, instead of an array of the
    whole iteration space that the caller allocates and the kernel streams through
    memory. Each iteration of those loops assigns every element of the row (the
    ``s = ...`` before the sum, for each ``v``) before the sum and what follows read
    it, so any one of those loops may run its iterations on copies of their own; the
    loop test gives the buffer to the loop that threads run (``schedule.build``), and
    the row's memory-based dependences keep every other schedule from interleaving
    two iterations. Only where each statement of the nest is one piece: the
    memory-based pairs of a row reused across iterations multiply with the boundary
    pieces (a clamped stencil's), and the loop test over them costs compile time. (Such
    an array is still shrunk to one row per iteration of the loops around the row's
    loop, later, by ``fusion.rows_per_iteration``, where its nest holds all its accesses:
    the 27-point energy's primal compiles in 0.49 s instead of 0.27 s and runs 7 %
    faster.)
    """
    from ..poly import dependences, model_of
    from .distribute import _expansion_shape, _private_to_iterations

    decisions: dict[str, str] = {}
    locals_ = dict(kernel.locals)
    result = kernel.result[0] if kernel.result else None
    for pos, nest in sorted(loop_nests(kernel).items()):
        c = common_depth(nest)
        if c < 2:
            continue
        plan = _row_split(nest, c, result)
        if plan is None:
            continue
        s, sums = plan
        shape = _expansion_shape(nest[0].loops[:c])
        if shape is None:
            continue
        deps = dependences(model_of(kernel, model), variables={s}, flow_only=frozenset({s}))
        if not _private_to_iterations(s, {st.name for st in nest}, c, deps):
            continue
        taken = ({p.name for p in kernel.params} | {t.name for t in kernel.temps}
                 | set(locals_))
        name = f"{s}_rows"
        while name in taken:
            name = "_" + name
        owners = [st.owner for st in nest]
        if per_thread and len(set(owners)) == len(owners):
            shape, index_loops = shape[-1:], nest[0].loops[c - 1:c]
            temp = ir.Temp(name, ir.ArrayType(locals_[s], shape), zero=False, role="sum row",
                           holds=f"the scalar {s} along one row, per thread",
                           chunk=" ".join(lp.var for lp in nest[0].loops[:c - 1]))
        else:
            index_loops = nest[0].loops[:c]
            temp = ir.Temp(name, ir.ArrayType(locals_[s], shape), zero=False, role="expansion",
                           holds=f"the scalar {s} per iteration of the loops around its sum")
        kernel = _apply_rows(kernel, pos, c, s, temp, index_loops, sums)
        owner = sums[0].owner
        loops = ", ".join(lp.var for lp in index_loops)
        where = " (one row per thread)" if temp.per_thread else ""
        decisions[owner] = (
            f"scalar {s} kept per point in {name}[{loops}]{where}: the loop over "
            f"{nest[0].loops[c - 1].var} runs three times (before, the sum, after), and in "
            f"the sum the loop {nest[0].loops[c - 1].var} is innermost (the sum's own loops "
            f"{', '.join(lp.var for lp in sums[0].loops[c:])} outside it); the terms of each "
            f"sum keep their order")
    return kernel, decisions


def _row_split(nest: list, c: int, result):
    """(scalar, sum statements) when the nest has the row-sum shape, else None."""
    inner = [st for st in nest if len(st.loops) > c]
    if not inner:
        return None
    targets = {st.target.name if isinstance(st.target, ScalarRef) else None for st in inner}
    slots = {st.position[c] for st in inner}
    if len(targets) != 1 or None in targets or len(slots) != 1:
        return None
    (s,) = targets
    (slot,) = slots
    if s == result or any(st.op not in ("+=", "-=") or st.guard is not None
                          or st.reads_variable(s) for st in inner):
        return None
    u = nest[0].loops[c - 1]
    if _trip(u) is not None or u.step <= 0:
        return None
    for st in inner:
        trip = _trip(st.loops[-1])
        if trip is None or trip > SMALL_TRIP:
            return None
        if any(uses_loop_vars(b, {u.var}) for lp in st.loops[c:] for b in (lp.lo, lp.hi)):
            return None
    before = [st for st in nest if len(st.loops) == c and st.position[c] < slot]
    after = [st for st in nest if len(st.loops) == c and st.position[c] > slot]
    if len(before) + len(after) + len(inner) != len(nest):
        return None
    if not any(st.target == ScalarRef(s, st.target.dtype) and st.op == "="
               for st in before if isinstance(st.target, ScalarRef)):
        return None  # s must start from a value assigned in each iteration
    parts = [before, inner, after]

    def used(st):
        return st.read_names() | {st.target_name}

    for k, part in enumerate(parts):
        written = {st.target_name for st in part} - {s}
        others = [st for j, p in enumerate(parts) if j != k for st in p]
        if any(written & used(st) for st in others):
            return None
    return s, inner


def _apply_rows(kernel: ir.Kernel, pos: int, c: int, s: str, temp: ir.Temp,
                index_loops: tuple, sums: list) -> ir.Kernel:
    """``kernel`` with the scalar ``s`` of nest ``pos`` replaced by ``temp`` indexed by
    the variables of ``index_loops``, and the nest split into its three parts."""
    row = Load(temp.name, tuple(LoopVar(lp.var) for lp in index_loops), temp.type.dtype)
    sum_names = {st.name for st in sums}
    out = []
    for st in kernel.statements:
        if not (st.loops and st.position[0] == pos):
            out.append(st)
            continue

        def fn(x):
            return row if isinstance(x, ScalarRef) and x.name == s else None

        target = row if isinstance(st.target, ScalarRef) and st.target.name == s else st.target
        part = 1 if st.name in sum_names else (0 if st.position[c] < sums[0].position[c] else 2)
        position = st.position[:c - 1] + (3 * st.position[c - 1] + part,) + st.position[c:]
        loops = st.loops
        if st.name in sum_names:
            loops = st.loops[:c - 1] + st.loops[c:] + (st.loops[c - 1],)
        out.append(dataclasses.replace(
            st, target=target, expr=ir.map_expr(st.expr, fn), loops=loops, position=position,
            guard=None if st.guard is None else ir.map_expr(st.guard, fn)))
    return dataclasses.replace(kernel, statements=tuple(out), temps=kernel.temps + (temp,))


def interchange_for_reuse(kernel: ir.Kernel, model=None) -> tuple[ir.Kernel, dict[str, str]]:
    """Interchange two nested loops so that rows read at every iteration of the outer one
    are reused from cache by the inner one.

    The conv layer's gradient (after ``fusion.fuse_along_shared_loops``) runs::

        for b:  for co:  for h:  ... x[b, ci, h + kh - 1, v + kw - 1] ...   (rows of x)
                for ci:  for h:  ... d_s[b, co, h - kh + 1, v - kw + 1] ... (rows of d_s)

    For each ``co`` the first part streams all of ``x[b]`` (several MB) through the
    cache again, while the rows one ``h`` reads do not depend on ``co``. With ``h``
    outside ``co`` the rows ``x[b, :, h - 1 .. h + 1, :]`` stay in cache for all the
    output channels: the loop order a careful engineer writes (``for b, h: for co``).

    When. A loop ``A`` whose body is a single loop ``B`` (every statement below ``A``
    also runs in ``B``), below a nest's outermost loop (the one threads share out),
    is moved inside ``B`` when more of the accesses that read or write a row per
    iteration (their last index uses a loop below ``B`` whose trip count grows with the
    sizes; a thread's own buffers not counted) do not depend on ``A`` but on ``B``
    than the other way round.

    Legality. The loops down to ``B`` carry no dependence but the sums'
    (``gather.iterations_independent_but_sums``: every other element and scalar the
    statements use is private to one iteration), so any order of those iterations
    gives the same values up to the order of the sums' terms. Each array element a sum
    adds into is selected by ``A`` or by ``B`` (its index uses one of them), so its
    terms still arrive in the same order: the same bits. A scalar sum (the forward
    conv layer's cost, ``C += r * r`` over every loop) gets its terms in another fixed
    order: a reduction, as a reduction clause reorders it, and as repeatable
    (``deterministic=True`` stays bit for bit the same on every run). ``B``'s bounds
    do not use ``A``, and both run ascending. Returns the kernel and decisions (owner
    statement name -> text).
    """
    decisions: dict[str, str] = {}
    own = {t.name for t in kernel.temps if t.per_thread}
    changed = True
    while changed:
        changed = False
        for nest in loop_nests(kernel).values():
            for group, d in _loop_pairs(nest):
                a, b = group[0].loops[d], group[0].loops[d + 1]
                gain, rows = _reuse_gain(group, d, own)
                if gain <= 0 or not _order_of_sums_kept(group, a.var, b.var) \
                        or not iterations_independent_but_sums(kernel, model, group, d + 2,
                                                               scalar_sums=True):
                    continue
                kernel = _interchanged(kernel, {st.name for st in group}, d)
                text = (f"loops {a.var} and {b.var} interchanged ({b.var} outside): "
                        f"{', '.join(rows)} (a row per iteration, the same for every "
                        f"{a.var}) reused from cache; independent iterations but sums, "
                        f"each element's terms in their order")
                add_decisions(decisions, {owner: text for owner in
                                          dict.fromkeys(st.owner for st in group)})
                changed = True
                break
            if changed:
                break
    return kernel, decisions


def _loop_pairs(nest: list):
    """(statements below loop ``A``, depth of ``A``) for each loop ``A`` below the nest's
    outermost whose body is one loop ``B``, both ascending, ``B``'s bounds free of ``A``."""
    for d, nodes in inner_loops(nest):
        for group in nodes.values():
            a = group[0].loops[d]
            if any(len(st.loops) <= d + 1 or st.loops[d:d + 2] != group[0].loops[d:d + 2]
                   or st.position[d + 1] != group[0].position[d + 1] for st in group):
                continue
            b = group[0].loops[d + 1]
            if a.step > 0 and b.step > 0 and not uses_loop_vars(b.lo, {a.var}) \
                    and not uses_loop_vars(b.hi, {a.var}):
                yield group, d


def _reuse_gain(group: list, d: int, own: set) -> tuple[int, list]:
    """(accesses reused across ``A`` if ``B`` were outside it, minus the other way round;
    the texts of the first kind), over the accesses that walk a row per iteration."""
    a, b = group[0].loops[d].var, group[0].loops[d + 1].var
    gain, rows = 0, []
    for st in group:
        below = {lp.var for lp in st.loops[d + 2:] if _trip(lp) is None}
        accesses = list(dict.fromkeys(st.reads() + ([st.target] if isinstance(st.target, Load)
                                                    else [])))
        for ld in accesses:
            if ld.array in own or not ld.index or not uses_loop_vars(ld.index[-1], below):
                continue
            uses_a, uses_b = (any(uses_loop_vars(e, {v}) for e in ld.index) for v in (a, b))
            if uses_b and not uses_a:
                gain += 1
                rows.append(ir.expr_str(ld))
            elif uses_a and not uses_b:
                gain -= 1
    return gain, list(dict.fromkeys(rows))


def _order_of_sums_kept(group: list, a: str, b: str) -> bool:
    """Does every array sum of the group (a target only added into, read by no statement
    of the group) add into elements selected by ``a`` or ``b``? (A scalar sum, a cost
    over the whole nest, is a reduction: threads already split it.)"""
    read = {n for st in group for n in st.read_names() if st.reads_variable(n)}
    for st in group:
        if st.op in ("+=", "-=") and st.target_name not in read:
            if isinstance(st.target, Load) and \
                    not any(uses_loop_vars(e, {a, b}) for e in st.target.index):
                return False
    return True


def _interchanged(kernel: ir.Kernel, names: set, d: int) -> ir.Kernel:
    """The statements ``names`` with their loops at depths ``d`` and ``d + 1`` swapped."""
    out = []
    for st in kernel.statements:
        if st.name in names:
            loops = st.loops[:d] + (st.loops[d + 1], st.loops[d]) + st.loops[d + 2:]
            st = dataclasses.replace(st, loops=loops)
        out.append(st)
    return dataclasses.replace(kernel, statements=tuple(out))


# The sums of one pass over a row live in vector registers (a target's per-lane partial
# sums): a block of copies gets at most ``VectorUnit.sum_registers`` of them (the host's,
# ``machine``), the rest of the registers left to the row's loads, and at most this many
# copies of the loop's body per pass.
SUM_BLOCK = 4


def block_sums_in_registers(kernel: ir.Kernel, unit: VectorUnit,
                            model=None) -> tuple[ir.Kernel, dict[str, str]]:
    """Compute the sums along a row for several values of an outer loop in one pass over
    the row, so that the reads those values share are loaded once.

    The conv layer's filter gradient (after ``jam_small_loops`` and the fusion of its
    nest with the forward's recompute) reads::

        for b, h:  for co:  ...; d_s[b, co, h, v] = ...      (the rest of co's body)
                            for ci:  for v:
                                d_w[co, ci, 0, 0] += d_s[b, co, h, v] * x[b, ci, h - 1, v - 1]
                                ... (9 taps: 9 sums along v)

    Every pass over ``v`` loads 9 values of ``x`` and one of ``d_s`` for 9 multiply-adds,
    and the next ``co`` loads the same 9 values of ``x`` again. Here the sums leave
    ``co``'s body for a loop ``co`` of their own after it, which steps by ``R`` with its
    next values unrolled into the row loop, the copy for ``co + q`` (``q > 0``) under
    the condition ``co + q < CO`` (ISL peels the last block where ``CO`` is no multiple
    of ``R``)::

        for b, h:  for co:  ...; d_s[b, co, h, v] = ...
                   for co in range(0, CO, R):  for ci:  for v:
                       d_w[co, ci, 0, 0] += d_s[b, co, h, v] * x[b, ci, h - 1, v - 1]
                       d_w[co + 1, ci, 0, 0] += d_s[b, co + 1, h, v] * x[b, ci, h - 1, v - 1]
                       ...

    so each load of ``x`` serves ``R`` multiply-adds from a register. ``R`` is the largest
    number up to ``SUM_BLOCK`` whose copies keep at most ``unit.sum_registers`` sums (the
    vector unit the C is compiled for, ``machine``: 2 for 9 taps on AVX-512's 32
    registers; on AVX2's 16, none: 9 sums already take 9 of its 12, and blocked, their
    accumulators spilled and the gradient ran 10-14 % slower); the blocked loop is the one
    whose copies share the most reads. A row loop left unblocked for want of registers
    gets a decision saying so.

    When: the statements of a row loop (innermost, trip count growing with the sizes,
    step 1) all add (``+=``/``-=``, no guard) into elements of kernel arrays whose index
    does not use the row loop (sums along the row), and none reads what they write
    (order-free, ``_not_order_free``). The blocked loop ``L`` encloses them below the
    nest's outermost loop (threads share that one), steps by 1 with at least ``2 * R``
    iterations where its trip count is constant, bounds no inner loop and has bounds
    free of the inner loops; each target's index uses ``L`` as a plain term in exactly
    one dimension, and more distinct reads do not use ``L`` than do.

    Legality. Moving the sums out of ``L``'s body (``distribute.split_loop``) runs them
    after the rest of the body's iterations of ``L`` where they ran in between: allowed
    when no element is accessed by both parts, once written, in different iterations
    of ``L`` within one iteration of the loops around it
    (``distribute.conflicts_across_iterations``, on ISL's access relations). In the
    blocked loop, instances with different values of ``L`` add into different elements
    (``L`` is a plain term of every target's index) and nothing in the loop reads them,
    so only the order of the terms that one element receives could change; all of them
    come from one value of ``L`` and arrive in the order of the inner loops, as before:
    the sums are the same bit for bit. Returns the kernel and the decisions (owner
    statement name -> text).
    """
    decisions: dict[str, str] = {}
    unblocked: dict[str, str] = {}
    while True:
        found = _sum_block(kernel, model, unit, unblocked)
        if found is None:
            add_decisions(decisions, unblocked)
            return kernel, decisions
        group, depth, width, rest = found
        if rest:
            at = group[0].position[:depth + 1]
            kernel = split_loop(kernel, at, group)
            moved = {st.name for st in group}
            group = [st for st in kernel.statements if st.name in moved]
        kernel, text = _blocked(kernel, group, depth, width)
        if rest:
            text = (f"sums moved out of the body of loop {group[0].loops[depth].var} into a "
                    f"loop of their own after it (no element shared with "
                    f"{', '.join(dict.fromkeys(st.owner for st in rest))} across its "
                    f"iterations); " + text)
        add_decisions(decisions, {st.owner: text for st in group})


def _sum_block(kernel: ir.Kernel, model, unit: VectorUnit, unblocked: dict):
    """(group, depth of the loop to block, copies per pass, the rest of that loop's body)
    of the first row loop whose sums qualify, or None. A row loop whose sums qualify but
    leave no room in ``unit``'s registers for a second copy gets its decision in
    ``unblocked`` (owner -> text)."""
    seen = set()
    for st in kernel.statements:
        key = (st.position[:-1], st.loops)
        if len(st.loops) < 3 or key in seen:
            continue
        seen.add(key)
        group = [s for s in kernel.statements if (s.position[:-1], s.loops) == key]
        if any(sp.kind == "block" for s in group for sp in s.origin):
            continue  # blocked already
        if len(group) != sum(1 for s in kernel.statements
                             if s.position[:len(key[0])] == key[0]):
            continue  # the row loop holds other loops or statements of other loops
        if not _sums_along_row(kernel, group):
            continue
        best = None
        for depth in range(1, len(st.loops) - 1):
            shared = _blockable_sums(group, depth)
            if shared is not None and (best is None or shared >= best[1]):
                best = (depth, shared)
        if best is None:
            continue
        depth = best[0]
        elements = len({s.target for s in group})
        width = min(SUM_BLOCK, unit.sum_registers // elements)
        trip = _trip(st.loops[depth])
        if width < 2:
            text = (f"loop {st.loops[depth].var} not blocked into the loop {st.loops[-1].var}: "
                    f"its {elements} sums per pass over the row leave no room for a second "
                    f"copy in the {unit.sum_registers} of {unit} that sums may take")
            unblocked.update({s.owner: text for s in group})
            continue
        if trip is not None and trip < 2 * width:
            continue
        at = st.position[:depth + 1]
        rest = [s for s in kernel.statements
                if s.position[:depth + 1] == at and s not in group]
        if rest and (any(s.position[depth + 1:] > st.position[depth + 1:] for s in rest)
                     or conflicts_across_iterations(model_of(kernel, model), rest, group,
                                                    depth, depth + 1)):
            continue
        return group, depth, width, rest
    return None


def _sums_along_row(kernel: ir.Kernel, group: list) -> bool:
    """Does every statement add (no guard) into an element of a kernel array that the row
    loop (innermost, trip count growing with the sizes, step 1) does not select, no
    statement reading what the group writes?"""
    row = group[0].loops[-1]
    if _trip(row) is not None or row.step != 1 or _not_order_free(group):
        return False
    params = {p.name for p in kernel.params if p.is_array}
    return all(st.guard is None and st.target.array in params
               and not any(uses_loop_vars(e, {row.var}) for e in st.target.index)
               for st in group)


def _blockable_sums(group: list, depth: int):
    """How many distinct reads of ``group`` the copies of the loop at ``depth`` would share,
    or None when that loop cannot be blocked (``block_sums_in_registers``)."""
    first = group[0]
    lp = first.loops[depth]
    inner = {p.var for p in first.loops[depth + 1:]}
    if lp.step != 1 or any(uses_loop_vars(b, inner) for b in (lp.lo, lp.hi)) or \
            any(uses_loop_vars(b, {lp.var})
                for p in first.loops[depth + 1:] for b in (p.lo, p.hi)):
        return None
    for st in group:
        dims = [e for e in st.target.index if uses_loop_vars(e, {lp.var})]
        if len(dims) != 1 or not _plain_term(dims[0], lp.var):
            return None
    reads = list(dict.fromkeys(ld for st in group for ld in ir.loads(st.expr)))
    shared = sum(1 for ld in reads if not uses_loop_vars(ld, {lp.var}))
    return shared if shared > len(reads) - shared else None


def _blocked(kernel: ir.Kernel, group: list, depth: int, width: int) -> tuple[ir.Kernel, str]:
    """``kernel`` with the loop at ``depth`` of ``group`` (its whole body) stepping by
    ``width`` and its next values unrolled into the row loop, the copy for value
    ``L + q`` under the condition ``L + q < hi`` (where the trip count is no multiple of
    ``width``, the last block runs fewer copies)."""
    lp = group[0].loops[depth]
    var = LoopVar(lp.var)
    loops = group[0].loops[:depth] + (dataclasses.replace(lp, step=width),) \
        + group[0].loops[depth + 1:]
    slots = max(s.position[-1] for s in group) + 1
    taken: set = set()

    def fresh(name):
        name = fresh_statement_name(kernel, name, frozenset(taken))
        taken.add(name)
        return name

    copies = []
    for q in range(width):
        value = Binary("+", var, Const(q, ir.i64), ir.i64)
        shifted = {lp.var: value}

        def put(e):
            return ir.substitute(e, shifted) if q else e

        within = (ir.Condition(Binary("<", value, lp.hi, ir.boolean)),) if q else ()
        for st in group:
            copies.append(dataclasses.replace(
                st.split("block", q, fresh(f"{st.name}_{lp.var}{q}")), loops=loops,
                position=st.position[:-1] + (q * slots + st.position[-1],),
                conditions=tuple(dataclasses.replace(c, expr=put(c.expr))
                                 for c in st.conditions) + within,
                target=dataclasses.replace(st.target,
                                           index=tuple(put(e) for e in st.target.index)),
                expr=put(st.expr)))
    members = {s.name for s in group}
    out = [st for st in kernel.statements if st.name not in members]
    out = sorted(out + copies, key=lambda s: s.position)
    shared = ", ".join(dict.fromkeys(ir.expr_str(ld) for s in group for ld in ir.loads(s.expr)
                                     if not uses_loop_vars(ld, {lp.var})))
    text = (f"loop {lp.var} blocked by {width} into the loop {group[0].loops[-1].var} "
            f"({width} values of {lp.var} per pass over the row, each read of {shared} used "
            f"{width} times from a register; the copies for values past the loop's end "
            f"skipped); order-free: each element keeps the order of its terms")
    return dataclasses.replace(kernel, statements=tuple(out)), text


def block_sum_rows_in_registers(kernel: ir.Kernel,
                                unit: VectorUnit) -> tuple[ir.Kernel, dict[str, str]]:
    """Compute the per-point sums of a row for several values of an outer loop in one pass
    over the row, so that the reads those values share are loaded once.

    The conv layer (after ``expand_reduction_rows``, ``jam_small_loops`` and
    ``interchange_for_reuse``) computes each output row into a row ``s_rows`` that each
    thread keeps::

        for b, h:  for co:  for v: s_rows[v] = 0
                            for ci:  for v:  s_rows[v] += w[co, ci, 0, 0] * x[b, ci, h - 1, v - 1]
                                             ... (9 taps)
                            for v: r = max(s_rows[v], 0) - y[b, co, h, v]; C += r * r

    Every pass over ``v`` loads 9 values of ``x`` for 9 multiply-adds into one row, and
    the next ``co`` loads the same 9 again. Here the row becomes ``R = unit.row_block`` rows
    ``s_rows[q, v]`` (the kernel as written uses row 0) and the temporary names ``co`` as
    its ``block`` loop: the emitter runs ``co`` in blocks of ``R`` values, the sums of a
    block in one pass over the row (the copy for ``co + q`` on row ``q``), what comes
    before and after the sums for each value in turn, and the values left over after the
    whole blocks as written::

        for b, h:  for co in blocks of R:  for v: s_rows[0, v] = 0 ... s_rows[R - 1, v] = 0
                   for ci:  for v:  s_rows[0, v] += w[co, ci, 0, 0] * x[b, ci, h - 1, v - 1]
                                    s_rows[1, v] += w[co + 1, ci, 0, 0] * x[b, ci, h - 1, v - 1]
                                    ...
                   for v: r = max(s_rows[0, v], 0) - y[b, co, h, v]; C += r * r
                   for v: r = max(s_rows[1, v], 0) - y[b, co + 1, h, v]; C += r * r  ...

    so each load of ``x`` serves ``R`` multiply-adds from a register. (The copies are
    the emitter's, not statements of the kernel: ISL's dependence analysis and AST
    generation see the loop as written, and their cost does not grow with ``R``; made
    as statements, 4 copies took the conv layer's cold compile from 1.7 to 11 s.)

    When: a ``sum row`` temporary (``expand_reduction_rows``) whose users all lie in the
    body of one loop ``L`` below the nest's outermost loop (threads share that one), a
    body made of three parts in this order: statements that assign the row, the sums
    (one row loop, innermost, step 1, whose statements all add into the row, no guard,
    reading it only through their own target) and statements after them that do not
    write the row, none of them a row loop of sums along the row (a target keeps those in
    lanes of partial sums, which the copies of a block would not follow: the conv
    gradient's filter sums where the vector unit leaves no room to block them out of
    ``L``'s body, ``block_sums_in_registers``). ``L`` steps by 1 with at least ``2 * R``
    iterations where its trip count is constant, bounds no inner loop, has bounds free of
    the inner loops, and no condition of the body's statements uses it; the sums' reads
    that vary along the row are more often shared by the values of ``L`` (not using it)
    than not.

    Legality. Within a block, the assignments and sums of ``L + q`` run before the sums
    and the after part of ``L``: each value of the block has its own row, and neither
    the assignments nor the sums read anything the body writes but that row, so each
    sees what it saw before. Each after part runs in the order of ``L``, after all the
    sums of its block, and reads its own row, which holds what it held before: the
    after parts keep their order (a reduction such as ``C`` receives its terms in the
    same order), and each row element receives its terms in the order of the sums'
    loops, as before; results are the same bit for bit. Returns the kernel and the
    decisions (owner statement name -> text).
    """
    decisions: dict[str, str] = {}
    for temp in kernel.temps:
        if temp.role != "sum row" or temp.type.ndim != 1:
            continue
        found = _sum_row_body(kernel, temp, unit.row_block)
        if found is not None:
            kernel, text = _rows_per_block(kernel, temp, unit.row_block, *found)
            add_decisions(decisions, {st.owner: text for st in found[2]})
    return kernel, decisions


def _sum_row_body(kernel: ir.Kernel, temp: ir.Temp, width: int):
    """(depth of ``L``, the statements of ``L``'s body, the sums) when ``temp``'s users
    have the shape ``block_sum_rows_in_registers`` blocks in blocks of ``width``, else
    None."""
    users = [st for st in kernel.statements
             if st.target_name == temp.name or temp.name in st.read_names()]
    if not users:
        return None
    depth = common_depth(users) - 1
    if depth < 1:
        return None
    at = users[0].position[:depth + 1]
    body = [st for st in kernel.statements if st.position[:depth + 1] == at]
    children: dict[int, list] = {}
    for st in body:
        if len(st.position) < depth + 2 or len(st.loops) <= depth:
            return None
        children.setdefault(st.position[depth + 1], []).append(st)

    def writes_row(st, ops):
        return st.target_name == temp.name and st.op in ops and not st.reads_variable(temp.name)

    kinds = []
    for k in sorted(children):
        part = children[k]
        if all(writes_row(st, ("=",)) for st in part):
            kinds.append("assign")
        elif all(writes_row(st, ("+=", "-=")) and st.guard is None for st in part):
            kinds.append("sums")
        elif all(st.target_name != temp.name for st in part):
            kinds.append("after")
        else:
            return None
    order = {"assign": 0, "sums": 1, "after": 2}
    if kinds.count("sums") != 1 or [order[k] for k in kinds] != sorted(order[k] for k in kinds):
        return None
    sums = children[sorted(children)[kinds.index("sums")]]
    after = [st for k, kind in zip(sorted(children), kinds) if kind == "after"
             for st in children[k]]
    if any(_sums_along_row(kernel, [s for s in after if (s.position[:-1], s.loops) == key])
           for key in {(st.position[:-1], st.loops) for st in after if len(st.loops) > depth + 1}):
        # sums along a row after them (the conv gradient's filter sums, where the vector
        # unit leaves no room to block them out of this body): a target keeps those in
        # lanes of partial sums, which the copies of a block would not follow
        return None
    first = sums[0]
    if any(st.loops != first.loops or st.position[:-1] != first.position[:-1] for st in sums):
        return None
    row = first.loops[-1]
    if len(first.loops) < depth + 2 or _trip(row) is not None or row.step != 1:
        return None
    written = {st.target_name for st in body} - {temp.name}
    ahead = [st for k, kind in zip(sorted(children), kinds) if kind != "after"
             for st in children[k]]
    if any((st.read_names() - {temp.name}) & written for st in ahead):
        return None
    lp = first.loops[depth]
    trip = _trip(lp)
    inner = {p.var for st in body for p in st.loops[depth + 1:]}
    if lp.step != 1 or (trip is not None and trip < 2 * width) or \
            any(uses_loop_vars(b, inner) for b in (lp.lo, lp.hi)) or \
            any(uses_loop_vars(b, {lp.var}) for st in body for p in st.loops[depth + 1:]
                for b in (p.lo, p.hi)) or \
            any(uses_loop_vars(c.expr, {lp.var}) for st in body for c in st.conditions):
        return None
    along_row = [ld for ld in dict.fromkeys(ld for st in sums for ld in ir.loads(st.expr))
                 if uses_loop_vars(ld, {row.var})]
    shared = sum(1 for ld in along_row if not uses_loop_vars(ld, {lp.var}))
    if shared <= len(along_row) - shared:
        return None
    return depth, body, sums


def _rows_per_block(kernel: ir.Kernel, temp: ir.Temp, width: int, depth: int, body: list,
                    sums: list) -> tuple[ir.Kernel, str]:
    """``kernel`` with ``temp`` made ``width`` rows, every access on row 0, and the
    loop at ``depth`` named its ``block`` loop (``block_sum_rows_in_registers``)."""
    lp = body[0].loops[depth]
    zero = Const(0, ir.i64)

    def on_row_0(e):
        return ir.map_expr(e, lambda x: Load(x.array, (zero,) + x.index, x.dtype)
                           if isinstance(x, Load) and x.array == temp.name else None)

    statements = tuple(dataclasses.replace(
        st, target=on_row_0(st.target), expr=on_row_0(st.expr),
        guard=None if st.guard is None else on_row_0(st.guard))
        if st in body else st for st in kernel.statements)
    rows = dataclasses.replace(
        temp, type=dataclasses.replace(temp.type, shape=(Const(width, ir.i64),)
                                       + temp.type.shape),
        holds=f"{temp.holds}, a row per value of {lp.var} in a block of {width}",
        block=lp.var)
    temps = tuple(rows if t.name == temp.name else t for t in kernel.temps)
    row = sums[0].loops[-1].var
    shared = ", ".join(dict.fromkeys(
        ir.expr_str(ld) for st in sums for ld in ir.loads(st.expr)
        if uses_loop_vars(ld, {row}) and not uses_loop_vars(ld, {lp.var})))
    text = (f"loop {lp.var} run in blocks of {width}: the sums into {temp.name} for the "
            f"{width} values of a block in one pass over the row {row} ({temp.name} "
            f"kept as {width} rows, each read of {shared} used {width} times from a "
            f"register), what comes before and after the sums for each value in turn, the "
            f"values after the whole blocks as written; each element keeps the order of its "
            f"terms")
    return dataclasses.replace(kernel, statements=statements, temps=temps), text
