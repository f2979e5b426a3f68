"""Checkpointing of a long sequential loop in reverse mode (issue 19, part 2).

A kernel whose tapes are indexed by an outer loop (a time loop ``for t in
range(steps)``, the outer ``k`` of a factorization) needs tape memory in
proportion to that loop's trip count. ``split_loop`` cuts such a kernel into
three ordinary kernels, each differentiable by ``vjp_kernel``:

* ``before``: the statements before the loop;
* ``segment``: the loop, run for ``t`` in ``[t0, t1)`` (``t0``/``t1`` are new
  integer parameters; the loop keeps its bounds as affine conditions, so the
  bounds proofs still hold, and its tapes are ``t1 - t0`` steps long);
* ``after``: the statements after the loop (the scalar the kernel returns);
* ``step``: iteration ``t0`` of the loop alone (``t0`` a parameter, the loop gone), for
  the vjp of one step: state arrays every read of the step sees at their entry value
  are written into ``<name>_next`` (the vjp reads the entry state: no tape, no forward
  sweep for them), temporaries the step rewrites before reading them are its own, and
  the argument of a transcendental call that reads several array elements is computed
  into a per-point temporary in a nest of its own (the adjoint evaluates ``tanh'`` once
  per point instead of once per element read, and gathers without atomics).

Every array of the kernel (parameters and temporaries) is a parameter of the
pieces that use it, in-out where the piece writes it. The *state* is the set
of arrays the loop writes whose value at the start of an iteration may be
read in it (ISL: a read not preceded by a write of the same element in the same
iteration); a snapshot of the state at step ``t`` lets the segment kernel
recompute steps ``t, t + 1, ...``. Temporaries the loop overwrites before it
reads them (``U`` of ``U = f(A); A = U``) are not state.

The reverse sweep is driven step by step (``polyad.checkpointing``): the
vjp of the ``step`` kernel reverses one iteration, recording that step's tapes only
(none where the state is renamed).
Which states to keep is the binomial (revolve) schedule of Griewank and
Walther: with ``c`` snapshots besides the start, ``l`` steps are reversed with
the fewest forward steps, ``r * l - beta(c + 1, r - 1)`` where ``beta(c, r) =
C(c + r, c)`` and ``r`` is the least repetition count with ``l <= beta(c, r)``
(``revolve_actions``, ``advances``).
"""

from __future__ import annotations

import dataclasses
from math import comb
from typing import Optional

import islpy as isl

from .. import ir
from ..ir import Binary, Condition, Load, Loop, LoopVar, ScalarRef, Statement
from ..looptree import Node, build_tree
from . import exprs as X
from ..poly import PolyModel, boundary_access_map, isl_name
from .recorded import analysable_error_types
from .reverse import Names
from .tape import written_inside

#: names of the segment bounds (made unique against the kernel's own names)
SEGMENT_START, SEGMENT_STOP = "seg_t0", "seg_t1"


@dataclasses.dataclass(frozen=True)
class LoopSplit:
    """A kernel cut around its checkpointed loop (see the module docstring)."""

    kernel: ir.Kernel                  # the primal kernel
    loop: Loop                         # the checkpointed loop (as in the primal)
    line: int                          # its DSL line
    before: Optional[ir.Kernel]        # None: no statement before the loop
    segment: ir.Kernel
    step: ir.Kernel                    # iteration ``t0`` of the loop alone, for its vjp
    renamed: dict                      # state array -> the array ``step`` writes it into
    after: Optional[ir.Kernel]         # None: no statement after the loop
    start: str                         # the segment kernel's ``t0`` parameter
    stop: str                          # its ``t1``
    state: tuple[str, ...]             # arrays snapshot at checkpoints
    arrays: dict                       # every array of the kernel -> ArrayType
    temps: tuple[ir.Temp, ...]         # the kernel's temporaries (the driver allocates them)


class NotCheckpointable(ValueError):
    """Why a kernel's loop cannot be checkpointed (the message says)."""


def _names_in(st: Statement) -> tuple[set, set, set, set]:
    """(arrays read, arrays written, scalars read, scalars written) by ``st``."""
    arr_r = {ld.array for ld in st.reads()}
    for lp in st.loops:
        for e in (lp.lo, lp.hi):
            arr_r |= {ld.array for ld in ir.loads(e)}
    sc_r = set(st.scalar_reads())
    for lp in st.loops:
        for e in (lp.lo, lp.hi):
            sc_r |= {x.name for x in ir.walk(e) if isinstance(x, ScalarRef)}
    for c in st.conditions:
        sc_r |= {x.name for x in ir.walk(c.expr) if isinstance(x, ScalarRef)}
    if isinstance(st.target, Load):
        return arr_r, {st.target.array}, sc_r, set()
    return arr_r, set(), sc_r, {st.target.name}


def _piece(k: ir.Kernel, name: str, stmts: list, arrays: dict, temps: dict,
           extra_ints=(), result=None, outs=()) -> ir.Kernel:
    """A kernel of ``stmts`` whose arrays (``k``'s parameters and temporaries) are all
    parameters, in-out where ``stmts`` write them (``outs``: outputs)."""
    read, written, sc = set(), set(), set()
    for st in stmts:
        ar, aw, sr, sw = _names_in(st)
        read |= ar
        written |= aw
        sc |= sr | sw
    order = [p.name for p in k.params if p.is_array] + list(temps)
    params = []
    for n in order:
        if n in read or n in written:
            intent = "out" if n in outs else "inout" if n in written else "in"
            params.append(ir.Param(n, arrays[n], intent))
    ints = []
    for p in k.params:
        if not p.is_array and p.name in sc:
            params.append(ir.Param(p.name, p.type, "in"))
            if p.name in k.int_params:
                ints.append(p.name)
    for n in extra_ints:
        params.append(ir.Param(n, ir.i64, "in"))
        ints.append(n)
    locals_ = tuple((n, dt) for n, dt in k.locals if n in sc)
    return ir.Kernel(name=name, params=tuple(params), sizes=k.sizes, locals=locals_, temps=(),
                     statements=tuple(stmts), result=result, funcs=k.funcs,
                     filename=k.filename, line=k.line, int_params=tuple(ints))


def candidate_loop(k: ir.Kernel) -> Optional[tuple[Node, int]]:
    """The top-level loop of ``k`` to checkpoint (the one holding the most statements) and
    its key (the ``position[0]`` of its statements); None when ``k`` has no loop."""
    root, _ = build_tree(k.statements)
    loops = [(c, key) for c, key in zip(root.children, root.keys) if isinstance(c, Node)]
    if not loops:
        return None

    def count(n: Node) -> int:
        return sum(count(c) if isinstance(c, Node) else 1 for c in n.children)

    return max(loops, key=lambda p: count(p[0]))


def split_loop(k: ir.Kernel) -> LoopSplit:
    """Cut ``k`` around its checkpointed loop; ``NotCheckpointable`` says why it cannot."""
    found = candidate_loop(k)
    if found is None:
        raise NotCheckpointable(f"{k.name}() has no loop to checkpoint")
    node, top = found
    lp = node.loop
    where = f"the loop over {lp.var!r}"
    if lp.step != 1:
        raise NotCheckpointable(f"{where} has step {lp.step}; checkpointing takes loops of step 1")
    before = [st for st in k.statements if st.position[0] < top]
    inside = [st for st in k.statements if st.position[0] == top]
    after = [st for st in k.statements if st.position[0] > top]
    # scalar locals live in one piece only (the driver carries arrays, not scalars)
    local_names = {n for n, _ in k.locals}
    users: dict[str, set] = {}
    for label, group in (("before", before), ("loop", inside), ("after", after)):
        for st in group:
            _, _, sr, sw = _names_in(st)
            for n in (sr | sw) & local_names:
                users.setdefault(n, set()).add(label)
    crossing = sorted(n for n, u in users.items() if len(u) > 1)
    if crossing:
        raise NotCheckpointable(
            f"the scalar(s) {', '.join(crossing)} of {k.name}() carry values into or out of "
            f"{where}; checkpointing carries arrays only (keep such values in a one-element "
            f"array)")
    if k.result is not None and users.get(k.result[0], {"after"}) != {"after"}:
        raise NotCheckpointable(f"{k.name}() computes its result {k.result[0]!r} before the end "
                                f"of {where}")
    bound_names = {x.name for e in (lp.lo, lp.hi) for x in ir.walk(e) if isinstance(x, ScalarRef)}
    if bound_names - set(k.int_params) - {p.name for p in k.params}:
        raise NotCheckpointable(f"the bounds of {where} read values computed by the kernel")

    used = set(local_names) | {p.name for p in k.params} | {t.name for t in k.temps} \
        | set(k.sizes) | {v for st in k.statements for v in st.loop_vars}
    bound_vars = Names(used)
    start = bound_vars.fresh(SEGMENT_START)
    stop = bound_vars.fresh(SEGMENT_STOP)
    arrays = {p.name: p.type for p in k.params if p.is_array}
    arrays.update({t.name: t.type for t in k.temps})
    temps = {t.name: t for t in k.temps}
    var = LoopVar(lp.var)
    seg_loop = Loop(lp.var, ScalarRef(start, ir.i64), ScalarRef(stop, ir.i64), 1)
    bounds = (Condition(Binary(">=", var, lp.lo, ir.boolean)),
              Condition(Binary("<", var, lp.hi, ir.boolean)))
    seg_stmts = [dataclasses.replace(st, loops=(seg_loop,) + st.loops[1:],
                                     conditions=bounds + st.conditions) for st in inside]
    seg = _piece(k, f"{k.name}_segment", seg_stmts, arrays, temps, (start, stop))
    pre = _piece(k, f"{k.name}_before", before, arrays, temps) if before else None
    post = _piece(k, f"{k.name}_after", after, arrays, temps, result=k.result) if after else None
    written = [p.name for p in seg.params if p.intent == "inout"]
    flow = {n: _reads_before_writes(seg, n) for n in written}
    state = tuple(n for n in written if flow[n] != "none")
    line = _first_line(inside)
    read_after = {n for st in after for n in _names_in(st)[0]}
    local = {n for n in written if n in temps and n not in state and n not in read_after}
    renamed_base = [n for n in state if flow[n] == "entry"]
    step, renamed = _step_kernel(k, inside, lp, start, arrays, temps, renamed_base, local, used)
    return LoopSplit(k, lp, line, pre, seg, step, renamed, post, start, stop, state, arrays,
                     tuple(k.temps))


#: intrinsics whose derivative costs about as much as the call itself
TRANSCENDENTAL = frozenset({"exp", "exp2", "log", "log2", "log10", "sin", "cos", "tan", "sinh",
                            "cosh", "tanh", "asin", "acos", "atan", "asinh", "acosh", "atanh",
                            "erf", "erfc", "pow", "atan2"})


def _step_kernel(k, inside, lp, start, arrays, temps, entry, local, used):
    """The loop's iteration ``t0`` alone, shaped for a cheap vjp: a state array no read of
    the step sees written (every read sees the step's entry value) is copied into a new
    output ``<name>_next`` and written there instead, so the vjp reads the entry state and
    needs neither tape nor forward sweep for it (the copy's adjoint passes the cotangent
    of the elements the step leaves alone); and the
    argument of a transcendental call reading several array elements is computed into a
    per-point temporary first, so the adjoint evaluates the call's derivative once per
    point, not once per element read (``tanh(laplacian(A))``: once, not five times).
    ``entry``: the state arrays whose reads all see the step's entry value; ``local``:
    temporaries the step rewrites before it reads them and nothing after the loop reads:
    temporaries of the step kernel (no cotangent travels with them)."""
    names = Names(set(used) | set(arrays))
    renamed = {n: names.fresh(f"{n}_next") for n in entry}
    # the loop variable becomes the parameter t0: the step's loop nests are top-level
    # nests (the adjoint can gather from one nest into the next), its bounds conditions
    t0 = ScalarRef(start, ir.i64)

    def at_t0(e):
        return ir.map_expr(e, lambda x: t0 if isinstance(x, LoopVar) and x.name == lp.var
                           else None)

    bounds = (Condition(Binary(">=", t0, lp.lo, ir.boolean)),
              Condition(Binary("<", t0, lp.hi, ir.boolean)))
    stmts, new_temps = [], {}
    for c, (n, nxt) in enumerate(renamed.items()):
        at = arrays[n]
        vs = [names.fresh(f"{n.lower()}_i{d}") for d in range(at.ndim)]
        ix = tuple(LoopVar(v) for v in vs)
        stmts.append(Statement(f"copy_{n}", tuple(Loop(v, X.ic(0), ext, 1)
                                                  for v, ext in zip(vs, at.shape)),
                               (c,) + (0,) * at.ndim, bounds, None, Load(nxt, ix, at.dtype),
                               "=", Load(n, ix, at.dtype), _first_line(inside),
                               f"{nxt} = {n} (the state the step updates)"))
    first = len(renamed)
    written_types = {**arrays, **{nxt: arrays[n] for n, nxt in renamed.items()}}
    for st in inside:
        st = dataclasses.replace(
            st, loops=tuple(Loop(q.var, at_t0(q.lo), at_t0(q.hi), q.step) for q in st.loops[1:]),
            conditions=bounds + tuple(Condition(at_t0(c.expr), c.positive)
                                      for c in st.conditions),
            guard=None if st.guard is None else at_t0(st.guard), target=at_t0(st.target),
            expr=at_t0(st.expr), position=tuple(2 * p + 1 + first for p in st.position[1:]))
        t = st.target
        if isinstance(t, Load) and t.array in renamed:
            expr = st.expr if st.op == "=" else Binary(st.op[0], t, st.expr, t.dtype)
            st = dataclasses.replace(st, target=Load(renamed[t.array], t.index, t.dtype), op="=",
                                     expr=expr)
        arg_stmt = _argument_temp(st, names, new_temps, written_types)
        if arg_stmt is not None:
            stmts.append(arg_stmt[0])
            st = arg_stmt[1]
        stmts.append(st)
    step_arrays = dict(arrays)
    for n, nxt in renamed.items():
        step_arrays[nxt] = arrays[n]
    piece = _piece(k, f"{k.name}_step", stmts, step_arrays,
                   {**{n: t for n, t in temps.items() if n not in local},
                    **{nxt: None for nxt in renamed.values()}}, (start,),
                   outs=set(renamed.values()))
    own = tuple(temps[n] for n in temps if n in local) + tuple(new_temps.values())
    return dataclasses.replace(piece, temps=own), renamed


def _first_line(stmts) -> int:
    """The DSL line of the first of ``stmts`` (for statements made for them)."""
    return min(st.line for st in stmts)


def _argument_temp(st: Statement, names: Names, new_temps: dict, array_types: dict):
    """(``Z[i, j] = arg`` in a loop nest of its own, ``st`` reading ``Z[i, j]`` instead of
    ``arg``) for the first
    transcendental call of ``st`` whose argument reads two or more array elements; None
    when there is none or its loops are not plain boxes
    (constant start >= 0, end free of loop variables, step 1). ``Z`` is computed only
    where ``st``'s write lands (``tape.written_inside``, ``array_types`` the arrays'
    types): a write outside a ``.zero`` array is dropped with the reads of its
    statement, which must not ask the sizes for reads that never run (fuzz seed 19191:
    the mirror read in the argument of a dropped write refused sizes the kernel takes)."""
    inner = st.loops
    if not inner:
        return None
    for lp in inner:
        lo = ir.eval_integer(lp.lo, {})
        if lp.step != 1 or lo is None or lo < 0 or any(
                isinstance(x, LoopVar) for x in ir.walk(lp.hi)):
            return None
    for call in ir.walk(st.expr):
        if not (isinstance(call, ir.Call) and call.func in TRANSCENDENTAL):
            continue
        for a, arg in enumerate(call.args):
            if not arg.dtype.is_float or len(set(ir.loads(arg))) < 2:
                continue
            z = names.fresh(f"{st.name}_arg")
            at = ir.ArrayType(arg.dtype, tuple(lp.hi for lp in inner))
            new_temps[z] = ir.Temp(z, at, False, "user",
                                   holds=f"the argument of {call.func} in: {st.source}")
            ref = Load(z, tuple(LoopVar(lp.var) for lp in inner), arg.dtype)
            args = call.args[:a] + (ref,) + call.args[a + 1:]
            new_call = dataclasses.replace(call, args=args)
            expr = ir.map_expr(st.expr, lambda x: new_call if x is call else None)
            # a loop nest of its own, just before the statement's: the adjoint's gathers
            # from the argument's adjoint then run after it is complete (no atomics)
            pos = (st.position[0] - 1,) + st.position[1:]
            z_stmt = dataclasses.replace(st, name=f"{st.name}_arg", position=pos, target=ref,
                                         op="=", expr=arg,
                                         conditions=st.conditions
                                         + written_inside(array_types, st.target),
                                         source=f"argument of {call.func} in: {st.source}")
            return z_stmt, dataclasses.replace(st, expr=expr)
    return None


def _reads_before_writes(seg: ir.Kernel, array: str) -> str:
    """How the reads of ``array`` (written in the segment's loop) relate to its writes in
    the same iteration: ``"none"`` when every read reads an element an unguarded write of
    the same iteration wrote before (no value flows from one iteration to the next: no
    snapshot), ``"entry"`` when no read does (every read sees the iteration's entry
    value), ``"mixed"`` otherwise or when ISL cannot model an access."""
    named = [dataclasses.replace(st, name=f"S{n}") for n, st in enumerate(seg.statements)]
    kern = dataclasses.replace(seg, statements=tuple(named))
    try:
        model = PolyModel(kern)
        sched = model.schedule_map()
        same = _same_outer(model, named)
        writes = must = None
        for st in named:
            if isinstance(st.target, Load) and st.target.array == array:
                w = boundary_access_map(model, st, st.target).to_union_map()
                writes = w if writes is None else writes.union(w)
                if st.guard is None:
                    must = w if must is None else must.union(w)
        covered_all, covered_none = True, True
        for st in named:
            for ld in st.reads():
                if ld.array != array:
                    continue
                read = boundary_access_map(model, st, ld).to_union_map()
                dom = model.domain(st).to_union_set()
                # S(i) -> W(j): W writes the element S reads, earlier in program order,
                # in the same iteration of the loop (the first dimension)
                earlier = sched.intersect_domain(dom).lex_gt_union_map(sched).intersect(same)
                if writes is not None and not read.apply_range(writes.reverse()).intersect(
                        earlier).is_empty():
                    covered_none = False
                if must is None or not dom.subtract(read.apply_range(must.reverse()).intersect(
                        earlier).domain()).is_empty():
                    covered_all = False
        return "none" if covered_all else "entry" if covered_none else "mixed"
    except analysable_error_types():   # ISL cannot model an access
        return "mixed"


def _same_outer(model: PolyModel, stmts) -> isl.UnionMap:
    """``{ S[t, ...] -> S'[t', ...] : t = t' }`` over the segment's statements."""
    out = None
    for a in stmts:
        for b in stmts:
            va = [isl_name(v) for v in a.loop_vars]
            vb = [f"{isl_name(v)}__b" for v in b.loop_vars]
            text = (f"{model.param_prefix}{{ {a.name}[{', '.join(va)}] -> "
                    f"{b.name}[{', '.join(vb)}] : {va[0]} = {vb[0]} }}")
            m = isl.UnionMap.read_from_str(model.ctx, text)
            out = m if out is None else out.union(m)
    return out


# --------------------------------------------------------------------------
# the binomial (revolve) schedule
# --------------------------------------------------------------------------


def beta(c: int, r: int) -> int:
    """The most steps ``c`` stored states (the start's included) reverse with each step
    advanced at most ``r`` times."""
    return comb(c + r, c)


def repetitions(steps: int, stored: int) -> int:
    """The least ``r`` with ``steps <= beta(stored, r)`` (``stored >= 2``)."""
    r = 0
    while beta(stored, r) < steps:
        r += 1
    return r


def advances(steps: int, snapshots: int) -> int:
    """Forward steps the binomial schedule runs to reverse ``steps`` steps, with
    ``snapshots`` stored states besides the start's (the fewest possible)."""
    if steps <= 1:
        return 0
    if snapshots == 0:
        return steps * (steps - 1) // 2
    c = snapshots + 1
    r = repetitions(steps, c)
    return r * steps - beta(c + 1, r - 1)


def _split(steps: int, snapshots: int) -> int:
    """Where the binomial schedule puts its next snapshot: steps to advance first. Optimal
    splits ``m`` (Griewank and Walther) satisfy ``beta(c, r - 2) <= m <= beta(c, r - 1)``
    and ``beta(c - 1, r - 1) <= steps - m <= beta(c - 1, r)``; the smallest is taken."""
    c = snapshots + 1
    r = repetitions(steps, c)
    low = beta(c, r - 2) if r >= 2 else 1
    return max(1, low, steps - beta(c - 1, r))


def revolve_actions(steps: int, snapshots: int) -> list[tuple]:
    """The binomial checkpointing schedule reversing steps ``0 .. steps - 1`` with
    ``snapshots`` free slots (plus slot 0, which holds the start): a list of

    * ``("store", slot, t)``: copy the state (at step ``t``) into ``slot``;
    * ``("restore", slot, t)``: copy ``slot`` (holding step ``t``) back;
    * ``("advance", t0, t1)``: run steps ``t0 .. t1 - 1`` forward;
    * ``("reverse", t)``: the vjp of step ``t`` (the state holds step ``t``).
    """
    out: list[tuple] = [("store", 0, 0)] if steps else []

    def rec(t0: int, t1: int, slot: int, free: int, fresh: bool):
        # the state holds step t0 when ``fresh``; slot ``slot`` holds step t0 in any case
        while t1 - t0 > 0:
            if not fresh:
                out.append(("restore", slot, t0))
            if t1 - t0 == 1:
                out.append(("reverse", t0))
                return
            if free == 0:
                out.append(("advance", t0, t1 - 1))
                out.append(("reverse", t1 - 1))
                t1 -= 1
                fresh = False
                continue
            m = t0 + _split(t1 - t0, free)
            out.append(("advance", t0, m))
            out.append(("store", slot + 1, m))
            rec(m, t1, slot + 1, free - 1, True)
            t1 = m
            fresh = False

    if steps:
        rec(0, steps, 0, snapshots, True)
    return out


def schedule_counts(actions: list[tuple]) -> dict:
    """``advances`` (forward steps run), ``reversed`` (steps reversed), ``stores``,
    ``restores`` and ``snapshots`` (the most slots in use) of a ``revolve_actions`` list."""
    adv = sum(a[2] - a[1] for a in actions if a[0] == "advance")
    slots = {a[1] for a in actions if a[0] == "store"}
    return {"advances": adv, "reversed": sum(1 for a in actions if a[0] == "reverse"),
            "stores": sum(1 for a in actions if a[0] == "store"),
            "restores": sum(1 for a in actions if a[0] == "restore"),
            "snapshots": len(slots)}
