"""Register blocking: unroll-and-jam of taps and output channels into the vector loop.

After ``loop_order`` a convolution's nests end in a unit-stride vector loop
over a row. Two kinds of contraction (an update ``T[..] += e`` whose
innermost loop runs over a size, the vector loop ``v``) get blocked:

Row updates (``T`` walks ``v``): the forward sum and the input gradient

    for b, co, h, ci, kh, kw:  for v:  s_rows[b, co, h, v] += w[co, ci, kh, kw] * x[b, ci, h + kh - 1, v + kw - 1]

load and store their accumulator ``s_rows[..v]`` once per multiply-add.
The tap loop right outside ``v`` (``kw``: a constant trip of at most
``MAX_TAPS`` that ``T`` does not use) is unrolled fully and its copies
jammed into ``v``:

    for b, co, h, ci, kh:  for v:  s_rows[..v] += w[.., 0] * x[.., v - 1];  s_rows[..v] += w[.., 1] * x[.., v];  ..

so the element stays in a register across its taps (one load and store per
three multiply-adds). The copies of one element keep their order (kw = 0,
1, 2, as before).

Sums along ``v`` (``T`` does not use ``v``: per-lane partial sums, the
filter gradient)

    for b, co, h, ci, kh, kw:  for v:  d_w[co, ci, kh, kw] += d_s[b, co, h, v] * x[b, ci, h + kh - 1, v + kw - 1]

load ``d_s`` and ``x`` for each multiply-add. Unrolling an output-channel
loop (``ci``: it indexes ``T``, not in its last dimension, and a load of
the value does not depend on it) by ``B`` and jamming the copies into ``v``
computes ``B`` channels per iteration, each with its own lane accumulators:

    for b, co, h, ci in range(0, CI - 3, 4), kh, kw:  for v:
        d_w[co, ci, kh, kw] += d_s[..v] * x[b, ci, ..];  ..;  d_w[co, ci + 3, kh, kw] += d_s[..v] * x[b, ci + 3, ..]
    for ci in range(4 * (CI // 4), CI):  (the remainder: the nest as it was)

so the load of ``d_s`` is reused from a register by ``B`` accumulators.
The loop must start at a constant, step by 1, end at a constant or a size,
and no loop inside it may have bounds that use it. Row updates do not get
channel blocks: their accumulators live in memory (the rows), so a block
saves one shared load but adds ``B`` store streams whole planes apart
(4 KiB-aliased in L1 when a plane is a multiple of 4 KiB); measured slower
on the conv layer (forward 10 -> 13 ms, gradient 32 -> 47 ms).

Legality (ISL), for both: the copies of iterations ``c < c'`` of the
unrolled loop run in the same iteration of the loops inside it, copy ``c``
first. A dependence between statements of the unrolled loop's subtree from
``c`` to ``c'`` (same outer iterations) is kept when both statements are
in one innermost body and the sink's inner iteration is not before the
source's (lexicographically): ``_reversed`` asks ISL for the pairs that
would run backwards (flow, anti and output dependences of arrays). For a
channel loop no dependence is carried at all; for taps the dependences of
the accumulator stay within one iteration of ``v``. A scalar written in
the subtree must either be a sum (only ``+=``/``-=`` updates that do not
read it: the copies add their terms in another fixed order, as a reduction
clause does) or carry its value only inside one iteration of one innermost
body. Array elements receive their terms in the same order as before.

How many (B). A simple register model (``RegisterModel``, given by the
target): each copy keeps its lane accumulators (``lane_sum`` registers)
and its own load in vector registers, the reused load once for all. B is
the largest power of two with ``B * (lane_sum + 1) + 1`` registers, at
most ``MAX_BLOCK``, and at most the trip count of the loop when constant.

The decisions (owner statement -> text) are shown by ``pa.explain``
("register block: ci by 4 in S8 ...", "register block: taps kw unrolled (3) ...").
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from .. import ir
from ..ir import Binary, Const, Load, LoopVar, ScalarRef, SizeVar
from .nests import loop_nests

# At most this many channels per block: small channel counts (4 in the benchmark's
# conv layer) would otherwise run only in the remainder loop.
MAX_BLOCK = 4

# Tap loops (right outside the vector loop, not indexing the updated row) of at most this
# many iterations are unrolled fully into it: a 3x3 filter's row.
MAX_TAPS = 4

ORIGIN_KIND = "register block"


@dataclass(frozen=True)
class RegisterModel:
    """What a target's vector unit holds: ``vector_registers`` registers, of which a
    per-lane partial sum along the vector loop takes ``lane_sum`` (its lanes span
    several vectors)."""

    vector_registers: int
    lane_sum: int


def register_block(kernel: ir.Kernel, registers: RegisterModel, model=None
                   ) -> tuple[ir.Kernel, dict[str, str]]:
    """``kernel`` with the taps and the channel loop of each contraction nest unrolled and
    jammed into its vector loop (see the module docstring), and the decisions (owner
    statement name -> text)."""
    decisions: dict[str, str] = {}
    pos = 0
    while True:
        later = [p for p in sorted(loop_nests(kernel)) if p >= pos]
        if not later:
            return kernel, decisions
        kernel, pos = _block_nest(kernel, later[0], registers, model, decisions)


def _block_nest(kernel: ir.Kernel, pos: int, registers: RegisterModel, model,
                decisions: dict) -> tuple[ir.Kernel, int]:
    """The nest at top-level position ``pos`` with its taps, then its channel loop jammed
    when legal; and the position of the next nest."""
    from ..poly import dependences, model_of

    deps = None

    def legal(subtree, d):
        nonlocal deps
        if deps is None:
            # only dependences between statements of the nest matter: analyse the nest alone
            nest = loop_nests(kernel)[pos]
            deps = dependences(model_of(dataclasses.replace(kernel, statements=tuple(nest)),
                                        model),
                               variables={st.target_name for st in nest},
                               flow_only=frozenset(n for n, _ in kernel.locals))
        return not _reversed(subtree, d, deps, kernel)

    nxt = pos + 1
    for tap in _tap_candidates(kernel, loop_nests(kernel)[pos]):
        d, c, subtree, contractions = tap
        if not legal(subtree, d):
            continue
        trip = _trip(c)
        kernel = _drop_empty(_apply(kernel, subtree, d, c, trip, "t"), kernel, model)
        deps = None
        if d == 0:
            pos, nxt = 2 * pos, 2 * pos + 1
        for owner in dict.fromkeys(st.owner for st in contractions):
            _decide(decisions, owner, (
                f"register block: taps {c.var} unrolled ({trip}) and jammed into "
                f"{contractions[0].loops[-1].var} in {owner} (each element of "
                f"{contractions[0].target.array} takes its {trip} terms in one iteration, "
                f"in their order: it stays in a register between them; ISL: no dependence "
                f"runs against {c.var} inside it)"))
        break
    best = None  # (block, depth, loop, subtree, contractions)
    for d, c, subtree, contractions in _candidates(kernel, loop_nests(kernel)[pos]):
        block = _block_size(contractions, c, registers)
        if block < 2 or (best is not None and block <= best[0]):
            continue
        if legal(subtree, d):
            best = (block, d, c, subtree, contractions)
    if best is None:
        return kernel, nxt
    block, d, c, subtree, contractions = best
    kernel = _drop_empty(_apply(kernel, subtree, d, c, block, "c"), kernel, model)
    whole = _trip(c) is not None and _trip(c) % block == 0
    if d == 0:
        nxt = 2 * pos + (1 if whole else 2)
    reused = sorted({ir.expr_str(ld) for st in contractions
                     for ld in _reused_loads(st, c.var)})
    rest = "" if whole else f"; the {c.var} after the last whole block run as before"
    for owner in dict.fromkeys(st.owner for st in contractions):
        _decide(decisions, owner, (
            f"register block: {c.var} by {block} in {owner} ({block} output channels per "
            f"iteration of {contractions[0].loops[-1].var}: each load of "
            f"{', '.join(reused)} serves {block} accumulators{rest}; ISL: {c.var} carries "
            f"no dependence of the nest)"))
    return kernel, nxt


def _decide(decisions: dict, owner: str, text: str) -> None:
    decisions[owner] = f"{decisions[owner]}; {text}" if owner in decisions else text


def _trip(lp: ir.Loop) -> Optional[int]:
    if isinstance(lp.lo, Const) and isinstance(lp.hi, Const):
        return max(0, -(-(lp.hi.value - lp.lo.value) // lp.step))
    return None


def _uses(e: ir.Expr, var: str) -> bool:
    return any(isinstance(x, LoopVar) and x.name == var for x in ir.walk(e))


def _is_contraction(st: ir.Statement) -> bool:
    """An update of an array element with an innermost loop over a size (the vector loop)."""
    return (isinstance(st.target, Load) and st.op in ("+=", "-=") and len(st.loops) >= 2
            and _trip(st.loops[-1]) is None and st.loops[-1].step == 1)


def _reused_loads(st: ir.Statement, c: str) -> list:
    """The loads of ``st``'s value that walk the vector loop but not the channel ``c``."""
    v = st.loops[-1].var
    return [ld for ld in dict.fromkeys(ir.loads(st.expr))
            if _uses_index(ld, v) and not _uses_index(ld, c)]


def _uses_index(ld: Load, var: str) -> bool:
    return any(_uses(e, var) for e in ld.index)


def _channel_loops(st: ir.Statement) -> list:
    """Depths of the loops of contraction ``st`` that can be blocked, deepest first: none
    when ``st`` updates a row along its vector loop (see the module docstring)."""
    out = []
    if any(_uses(e, st.loops[-1].var) for e in st.target.index):
        return out
    for d in range(len(st.loops) - 2, -1, -1):
        lp = st.loops[d]
        if not (isinstance(lp.lo, Const) and lp.step == 1
                and isinstance(lp.hi, (Const, SizeVar))):
            continue
        if _trip(lp) is not None and _trip(lp) < 2:
            continue
        index = st.target.index
        if not any(_uses(e, lp.var) for e in index[:-1]) or _uses(index[-1], lp.var):
            continue
        if not _reused_loads(st, lp.var):
            continue
        out.append(d)
    return out


def _candidates(kernel: ir.Kernel, nest: list):
    """(depth, loop, subtree statements, its contractions) that could be blocked, the
    deepest loop first."""
    seen = set()
    for st in nest:
        if not _is_contraction(st):
            continue
        for d in _channel_loops(st):
            key = (st.position[:d + 1], d)
            if key in seen:
                continue
            seen.add(key)
            lp = st.loops[d]
            subtree = [s for s in kernel.statements
                       if len(s.loops) > d and s.position[:d + 1] == st.position[:d + 1]]
            if any(s.loops[:d + 1] != st.loops[:d + 1] for s in subtree):
                continue
            if any(_uses(b, lp.var) for s in subtree for inner in s.loops[d + 1:]
                   for b in (inner.lo, inner.hi)):
                continue
            if not _bodies_of_statements(subtree):
                continue
            contractions = [s for s in subtree if _is_contraction(s)
                            and d in _channel_loops(s)]
            yield d, lp, subtree, contractions


def _tap_candidates(kernel: ir.Kernel, nest: list):
    """(depth, loop, subtree, contractions) for the loop right outside the vector loop of
    a row update (its target walks the vector loop) when it is a few taps: a constant trip
    of at most ``MAX_TAPS`` that the target does not use."""
    for st in nest:
        if not _is_contraction(st) or len(st.loops) < 2:
            continue
        v = st.loops[-1].var
        if not any(_uses(e, v) for e in st.target.index):
            continue
        d = len(st.loops) - 2
        lp = st.loops[d]
        trip = _trip(lp)
        if trip is None or not 2 <= trip <= MAX_TAPS or lp.step != 1 or any(
                _uses(e, lp.var) for e in st.target.index):
            continue
        subtree = [s for s in kernel.statements
                   if len(s.loops) > d and s.position[:d + 1] == st.position[:d + 1]]
        if any(s.loops[:d + 1] != st.loops[:d + 1] or len(s.loops) != d + 2
               or not _is_contraction(s) for s in subtree):
            continue
        if any(_uses(b, lp.var) for s in subtree for b in (s.loops[-1].lo, s.loops[-1].hi)):
            continue
        if not _bodies_of_statements(subtree):
            continue
        yield d, lp, subtree, subtree


def _bodies_of_statements(subtree: list) -> bool:
    """Is every statement in a loop body that holds only statements (no loop beside
    it)? The copies are interleaved there (``_apply``)."""
    for st in subtree:
        body = st.position[:-1]
        if any(len(s.position) > len(st.position) and s.position[:len(body)] == body
               for s in subtree):
            return False
    return True


def _reversed(subtree: list, d: int, deps, kernel: ir.Kernel) -> str:
    """Why unrolling the loop at depth ``d`` of ``subtree`` and jamming its copies into the
    innermost loops is not legal, or ''.

    The copies of iterations ``c < c'`` run in the same iteration of the loops inside
    ``c``; a dependence from ``c`` to ``c'`` is kept when its sink's inner iteration is
    not before its source's (lexicographically; equal: copy ``c`` runs first). Both must
    be in one innermost body (the copies are interleaved there)."""
    from ..poly import maps_of
    import islpy as isl

    names = {st.name: st for st in subtree}
    scalars = {n for n, _ in kernel.locals}
    sums = {n for n in scalars if _is_sum(n, subtree)}
    for kind in (deps.flow, deps.anti, deps.output):
        for var, umap in kind.items():
            if var in sums:
                continue
            for m in maps_of(umap):
                src = names.get(m.get_tuple_name(isl.dim_type.in_))
                dst = names.get(m.get_tuple_name(isl.dim_type.out))
                if src is None or dst is None:
                    continue
                if var in scalars:
                    if (src.loops != dst.loops or src.position[:-1] != dst.position[:-1]
                            or not _within(m, len(src.loops), len(src.loops))):
                        return f"{var} carries a value between iterations"
                    continue
                carried = m
                for k in range(d):
                    carried = carried.equate(isl.dim_type.in_, k, isl.dim_type.out, k)
                carried = carried.order_lt(isl.dim_type.in_, d, isl.dim_type.out, d)
                if carried.is_empty():
                    continue
                if src.loops != dst.loops or src.position[:-1] != dst.position[:-1]:
                    return f"{var}: {d} carries a dependence from {src.name} to {dst.name}"
                for p in range(d + 1, len(src.loops)):
                    if not carried.order_gt(isl.dim_type.in_, p, isl.dim_type.out, p).is_empty():
                        return f"{var}: a dependence from {src.name} to {dst.name} runs back"
                    carried = carried.equate(isl.dim_type.in_, p, isl.dim_type.out, p)
    return ""


def _within(m, outer: int, depth: int) -> bool:
    """Do the pairs of ``m`` that share the first ``outer`` iterators share ``depth``?"""
    import islpy as isl

    same = m
    for k in range(outer):
        same = same.equate(isl.dim_type.in_, k, isl.dim_type.out, k)
    inner = same
    for k in range(outer, depth):
        inner = inner.equate(isl.dim_type.in_, k, isl.dim_type.out, k)
    return same.is_subset(inner)


def _is_sum(name: str, subtree: list) -> bool:
    """Is scalar ``name`` only summed into in ``subtree`` (and written there at all)?"""
    writes = [st for st in subtree if isinstance(st.target, ScalarRef)
              and st.target.name == name]
    return bool(writes) and all(st.op in ("+=", "-=") for st in writes) and not any(
        st.reads_variable(name) for st in subtree)


def _block_size(contractions: list, c: ir.Loop, registers: RegisterModel) -> int:
    """The number of copies: registers per copy from the model (see the module docstring)."""
    bodies: dict = {}  # innermost body -> owner -> registers (pieces of one owner are
    for st in contractions:  # disjoint: they never run in one iteration together)
        need = registers.lane_sum + 1
        owners = bodies.setdefault(st.position, {})
        owners[st.owner] = max(owners.get(st.owner, 0), need)
    per_copy = max(sum(owners.values()) for owners in bodies.values())
    block = 1
    while (block * 2 <= MAX_BLOCK
           and block * 2 * per_copy + 1 <= registers.vector_registers):
        block *= 2
    trip = _trip(c)
    if trip is not None:
        while block > trip:
            block //= 2
    return block


def _apply(kernel: ir.Kernel, subtree: list, d: int, c: ir.Loop, block: int,
           tag: str) -> ir.Kernel:
    """The subtree's loop ``c`` stepping by ``block`` with ``block`` copies of every
    statement jammed into its innermost body, then the remainder loop as it was."""
    prefix = subtree[0].position[:d]
    slot = subtree[0].position[d]
    members = {st.name for st in subtree}
    width = 1 + max(st.position[-1] for st in subtree)
    lo, hi = c.lo, c.hi
    main = ir.Loop(c.var, lo, ir.fold_integer_constants(
        Binary("-", hi, Const(block - 1, ir.i64), ir.i64)), block)
    start = ir.fold_integer_constants(Binary("+", lo, Binary("*", Const(block, ir.i64), Binary(
        "//", Binary("-", hi, lo, ir.i64), Const(block, ir.i64), ir.i64), ir.i64), ir.i64))
    rest = ir.Loop(c.var, start, hi, 1)
    whole = (isinstance(start, Const) and isinstance(hi, Const)
             and start.value >= hi.value)
    out = []
    for st in kernel.statements:
        if len(st.position) > d and st.position[:d] == prefix:
            st = dataclasses.replace(
                st, position=st.position[:d] + (2 * st.position[d],) + st.position[d + 1:])
        if st.name not in members:
            out.append(st)
            continue
        for j in range(block):
            copy = _shifted(st, c.var, j)
            loops = st.loops[:d] + (main,) + st.loops[d + 1:]
            position = st.position[:-1] + (j * width + st.position[-1],)
            out.append(dataclasses.replace(
                copy.split(ORIGIN_KIND, j, f"{st.name}_{tag}{j}"), loops=loops,
                position=position))
        if not whole:
            out.append(dataclasses.replace(
                st.split(ORIGIN_KIND, block, f"{st.name}_rem"),
                loops=st.loops[:d] + (rest,) + st.loops[d + 1:],
                position=st.position[:d] + (2 * slot + 1,) + st.position[d + 1:]))
    return dataclasses.replace(kernel, statements=tuple(out))


def _drop_empty(kernel: ir.Kernel, before: ir.Kernel, model) -> ir.Kernel:
    """``kernel`` without the copies (new since ``before``) whose domain is empty: a
    boundary piece of one tap that no iteration of the jammed loop reaches, a block or a
    remainder that no size reaches."""
    from ..poly import model_of

    old = {st.name for st in before.statements}
    new = [st for st in kernel.statements if st.name not in old]
    if not new:
        return kernel
    m = model_of(dataclasses.replace(kernel, statements=tuple(new)), model)
    empty = {st.name for st in new if m.domain(st).is_empty()}
    return dataclasses.replace(kernel, statements=tuple(
        st for st in kernel.statements if st.name not in empty))


def _shifted(st: ir.Statement, var: str, j: int) -> ir.Statement:
    """``st`` with loop variable ``var`` replaced by ``var + j``."""
    if j == 0:
        return st
    shifted = Binary("+", LoopVar(var), Const(j, ir.i64), ir.i64)

    def fn(x):
        return shifted if isinstance(x, LoopVar) and x.name == var else None

    target = st.target
    if isinstance(target, Load):
        target = dataclasses.replace(target, index=tuple(ir.map_expr(e, fn)
                                                         for e in target.index))
    return dataclasses.replace(
        st, target=target, expr=ir.map_expr(st.expr, fn),
        guard=None if st.guard is None else ir.map_expr(st.guard, fn),
        conditions=tuple(dataclasses.replace(cd, expr=ir.map_expr(cd.expr, fn))
                         for cd in st.conditions))
