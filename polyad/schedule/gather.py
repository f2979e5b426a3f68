"""Scatter-to-gather: re-index injective ``+=`` scatters by the element they write.

The adjoint of a stencil read is a scatter such as ``d_g[m, n - 1] += e(m, n)``:
iterations ``n`` and ``n + 1`` write neighbouring elements, so the loops carry
dependences and a parallel loop would need atomics. When the write access is
injective, ISL inverts it and the statement becomes a gather over the
target's domain, ``d_g[m, n] += e(m, n + 1)`` (one piece per piece of the
inverse, so boundary pieces stay separate): every iteration writes only its
own element, and the loop is parallel without atomics (PerforAD / Halide's
transformation). A clamped border's piece that adds into one edge element from
a few iterations of a loop (``d_t[0, n] += ...`` for m in {0, 1}) is cut into
one piece per value of that loop first, each injective.

The rewrite changes the order in which the statement's instances run, so it
is only applied when that cannot change a result: inside the statement's
outermost loop nest the target array is only ever updated by ``+=``/``-=``
(a sum, whose order does not matter) and never read, and nothing the
statement reads is written there. Under a sequential loop (an adjoint's
reversed time loop, whose other sweeps read the target) the same test is made
inside one iteration of the outer loops instead: the gather keeps them as its
outer loops and reorders instances only within one of their iterations, so
the test covers the statements of the loop that iteration runs the
statement in.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Optional

import islpy as isl

from .. import ir
from ..ir import Condition, Load, Loop, LoopVar
from ..poly import (PolyModel, aff_to_expr, approximate, dependences, few_values,
                    inverse_pieces, maps_of, model_of, param_exprs, projected_accesses,
                    set_to_condition, within_outer_iterations)
from .nests import common_depth, fresh_statement_name, loop_nests


def _is_identity_write(st: ir.Statement) -> bool:
    t = st.target
    return (len(t.index) == len(st.loops)
            and all(isinstance(e, LoopVar) and e.name == lp.var
                    for e, lp in zip(t.index, st.loops)))


def _legal(st: ir.Statement, nest: list) -> str:
    """Empty if re-ordering ``st``'s instances is safe inside its nest, else why not."""
    if st.op not in ("+=", "-="):
        return f"it assigns with '{st.op}'"
    target = st.target_name
    for other in nest:
        if other.target_name == target and other.op not in ("+=", "-="):
            return f"{target!r} is also assigned in the loop nest (line {other.line})"
        if other.reads_variable(target):
            return f"{target!r} is read in the loop nest (line {other.line})"
    written = {o.target_name for o in nest}
    clash = (st.read_names() - {target}) & written
    if clash:
        return f"it reads {', '.join(sorted(clash))}, written in the same loop nest"
    return ""


def only_added_into(array: str, nest: list) -> bool:
    """Is every access to ``array`` in ``nest`` the target of a ``+=``/``-=``?"""
    return all((st.target_name != array or st.op in ("+=", "-="))
               and not st.reads_variable(array) for st in nest)


def _ascending(lp: Loop) -> Loop:
    """The same iterations as ``lp``, visited in increasing order."""
    if lp.step > 0:
        return lp
    s = -lp.step
    i64 = ir.i64
    one = ir.Const(1, i64)
    span = ir.Binary("-", ir.Binary("-", lp.lo, lp.hi, i64), one, i64)
    first = lp.lo if s == 1 else ir.Binary(
        "-", lp.lo, ir.Binary("*", ir.Const(s, i64), ir.Binary("//", span, ir.Const(s, i64), i64),
                              i64), i64)
    lo = ir.Binary("+", lp.hi, one, i64) if s == 1 else first
    return Loop(lp.var, ir.fold_integer_constants(lo),
                ir.fold_integer_constants(ir.Binary("+", lp.lo, one, i64)), s)


def _independent_iterations(nest: list, c: int, deps, locals_: set) -> bool:
    """True if the c shared loops carry none of ``deps``' flow dependences and no array
    anti/output one (``ascending_order_free_nests`` passes the scalars' flow only).

    (Anti and output dependences on scalars are then only reuse of a private
    temporary, which any iteration order respects.)
    """
    names = {st.name for st in nest}
    for kind in ("flow", "anti", "output"):
        for var, umap in getattr(deps, kind).items():
            if kind != "flow" and var in locals_:
                continue
            for m in maps_of(umap):
                if m.get_tuple_name(isl.dim_type.in_) not in names or \
                        m.get_tuple_name(isl.dim_type.out) not in names:
                    continue
                if not within_outer_iterations(m, c):
                    return False
    return True


def array_conflicts_carried(model: PolyModel, nest: list, c: int, arrays: set) -> bool:
    """True if two accesses to one element of one of ``arrays``, at least one a write,
    lie in different iterations of the nest's ``c`` shared loops.

    This memory-based test is exactly "some flow, anti or output dependence of the
    array is carried by those loops": between two such accesses, the chain of
    next-write / last-write links (each a dependence) must cross iterations
    somewhere. It needs no value-based analysis, which on the piecewise scatters of a
    clamped stencil's adjoint (27 pieces of ``d_u[i + a - 1, ...] += ...``) took
    minutes: each access is projected onto the shared loops, so one relation per
    array is checked.
    """
    for array in arrays:
        writes, touches = projected_accesses(model, nest, c, {array})
        if writes is None:
            continue
        # (one map, or none where no instance runs)
        for pairs in maps_of(writes.apply_range(touches.reverse())):
            if not pairs.is_subset(isl.Map.identity(pairs.get_space())):
                return True
    return False


def accessed_names(nest: list) -> set:
    """Arrays and scalars the statements of a nest access."""
    names = set()
    for st in nest:
        names |= st.read_names() | {st.target_name}
    return names


def iterations_independent_but_sums(kernel: ir.Kernel, model: Optional[PolyModel], nest: list,
                                    c: int, scalar_sums: bool = False) -> bool:
    """Do the ``c`` outer loops of ``nest`` carry no dependence but the sums' (arrays
    only added into, read nowhere in the nest; with ``scalar_sums``, scalars too)?

    Scalars: exact flow (a private temporary's reuse is no obstacle); arrays: any
    conflicting access across iterations (the same as a carried dependence), but for
    the buffers each thread keeps its own copy of (``Temp.per_thread``).
    """
    locals_ = set(dict(kernel.locals))
    used = accessed_names(nest)
    nest_model = model_of(kernel, model)
    sums = {st.target_name for st in nest if only_added_into(st.target_name, nest)}
    scalars = used & locals_ - (sums if scalar_sums else set())
    deps = dependences(nest_model, variables=scalars, flow_only=frozenset(scalars))
    own = {t.name for t in kernel.temps if t.per_thread}
    return _independent_iterations(nest, c, deps, locals_) and not array_conflicts_carried(
        nest_model, nest, c, used - locals_ - sums - own)


def ascending_order_free_nests(kernel: ir.Kernel, model: Optional[PolyModel] = None) \
        -> ir.Kernel:
    """Run backward loop nests in ascending order where the order cannot matter.

    Reverse-mode AD runs adjoint loops backwards. When every statement of a
    nest only adds into a target nothing else in the nest reads (sums), all
    its loops may run forwards; when the nest's shared outer loops carry no
    dependence (independent iterations) but the sums' (an array only added into,
    and read nowhere in the nest: the order of a sum changes its rounding, as a
    parallel reduction does, not its value), those loops may. Ascending loops give
    unit-stride, vectorizable code.
    """
    nests = loop_nests(kernel)
    flip: dict[int, int] = {}  # nest position -> how many outer loops to flip
    for pos, nest in nests.items():
        if not any(lp.step < 0 for st in nest for lp in st.loops):
            continue
        if all(not _legal(st, nest) for st in nest):
            flip[pos] = max(len(st.loops) for st in nest)
            continue
        c = common_depth(nest)
        if c and iterations_independent_but_sums(kernel, model, nest, c):
            flip[pos] = c
    if not flip:
        return kernel
    out = []
    for st in kernel.statements:
        if st.loops and st.position[0] in flip:
            n = flip[st.position[0]]
            st = dataclasses.replace(st, loops=tuple(_ascending(lp) if k < n else lp
                                                     for k, lp in enumerate(st.loops)))
        out.append(st)
    return dataclasses.replace(kernel, statements=tuple(out))


def _invert(st: ir.Statement, at: ir.ArrayType, model: PolyModel, outer: int = 0):
    """(free loop indices, inverse pieces) for a gather form of ``st``, or None.

    The ``outer`` outermost loops stay loops around the gather (each of their
    iterations gathers what it scattered). With as many other loops as target
    dimensions the access itself must be injective. With more loops, some loops
    stay as inner "free" loops of the gather (``d_x[m, n + k - 2] += ...`` over
    m, n, k becomes, for each element (m, j), a sum over k): the innermost
    choice that makes the access plus the free loops injective wins. Free
    loops must have bounds that depend on no loop but the outer ones.
    """
    depth, ndim = len(st.loops), at.ndim
    if ndim > depth - outer or approximate(st.target):
        return None  # (an over-approximated write relation's inverse is no gather)
    access = model.access_map(st, st.target)
    kept_vars = {lp.var for lp in st.loops[:outer]}
    for free in itertools.combinations(reversed(range(outer, depth)), depth - outer - ndim):
        free = tuple(sorted(free))
        if any(isinstance(x, LoopVar) and x.name not in kept_vars for k in free
               for b in (st.loops[k].lo, st.loops[k].hi) for x in ir.walk(b)):
            continue
        pieces = inverse_pieces(access, tuple(range(outer)) + free)
        if pieces is not None:
            return free, pieces
    return None


def _target_dim_names(st: ir.Statement, outer: int, free: tuple) -> list[str]:
    """Loop variable names for the target's dimensions: the one original loop
    variable an index uses when there is one, else the loop at the same depth
    below the ``outer`` loops, else ``j<dim>``; equal names keep pieces of one
    nest in one loop nest."""
    taken = {st.loops[k].var for k in tuple(range(outer)) + free}
    names = []
    for d, e in enumerate(st.target.index):
        used = [x.name for x in ir.walk(e) if isinstance(x, LoopVar)]
        if len(set(used)) == 1 and used[0] not in taken:
            name = used[0]
        elif d + outer < len(st.loops) and d + outer not in free \
                and st.loops[d + outer].var not in taken:
            name = st.loops[d + outer].var  # e.g. a border piece d_g[0, n]: keep the loop's name
        else:
            name = f"j{d}"
        while name in taken:
            name = "_" + name
        taken.add(name)
        names.append(name)
    return names


def _sizes_in(exprs) -> set:
    return {x.name for e in exprs for x in ir.walk(e) if isinstance(x, ir.SizeVar)}


def small_target(kernel: ir.Kernel, var: str, users: list) -> bool:
    """A scatter target is 'small' when at least two of its loops' sizes are not its extents.

    E.g. ``d_f[k] += ...`` inside loops over M, N and K: each element receives
    M*N contributions, so per-thread private copies are cheap to combine and
    far cheaper than M*N*K atomics; ``dx[i - 1] += ...`` over i < N is not
    small, nor is the input gradient of a convolution (each element receives
    only a filter's worth of contributions per output channel).
    """
    extents = _sizes_in(kernel.array_type(var).shape)
    loops = _sizes_in([b for st in users for lp in st.loops for b in (lp.lo, lp.hi)])
    return extents <= loops and len(loops - extents) >= 2


def scatter_to_gather(kernel: ir.Kernel, model: PolyModel) -> tuple[ir.Kernel, dict[str, str]]:
    """Rewrite injective ``+=`` scatters as gathers.

    Returns the new kernel and, per original statement name that was a
    scatter, the decision taken ("gather" or why it stays a scatter).
    """
    params = param_exprs(kernel)
    decisions: dict[str, str] = {}
    out = []
    after_nest: set[str] = set()  # border scatters moved behind their nest
    for st in kernel.statements:
        t = st.target
        if (not st.loops or not isinstance(t, Load) or st.op not in ("+=", "-=")
                or _is_identity_write(st)):
            out.append(st)
            continue
        at = kernel.array_type(t.array)
        # The fewest outer loops to keep for which re-ordering is legal (0: the whole
        # nest); when none is, the whole nest's reason is reported.
        outer = 0
        why = whole_nest = _legal(st, _inside_loops(kernel, st, 0))
        while why and outer + 1 + at.ndim <= len(st.loops):
            outer += 1
            why = _legal(st, _inside_loops(kernel, st, outer))
        if why:
            outer, why = 0, whole_nest
        found = None
        if not why and at.ndim < len(st.loops) - outer and small_target(kernel, t.array, [st]):
            why = f"{t.array!r} is small next to the loops: per-thread copies are cheaper"
            if not outer and _shares_inner_loop(kernel, st):
                # beside statements of other bounds in those loops (a gather's, a border
                # piece's faces) AST generation splits the loops for every combination
                after_nest.add(st.name)
                why += " (it runs in a nest of its own after this one)"
        parts, unrolled = [], ""
        if not why:
            found = _invert(st, at, model, outer)
            if found is not None:
                parts = [(st, found)]
            else:
                parts, unrolled = _one_piece_per_value(kernel, st, at, model, outer)
            if not parts:
                why = f"several iterations write the same element of {t.array!r}"
                if st.on_border and not outer:
                    after_nest.add(st.name)
                    why += " (a border piece: it runs in a nest of its own after this one)"
        if not parts:
            decisions[st.name] = "scatter: " + why
            out.append(st)
            continue
        for part, (free, pieces) in parts:
            out += _gather_pieces(part, at, outer, free, pieces, params)
        decisions[st.name] = "gather" if not outer else (
            f"gather inside loop{'s' if outer > 1 else ''} "
            f"{', '.join(lp.var for lp in st.loops[:outer])} (each iteration gathers what it "
            f"scattered: the statement's instances are reordered only within one)")
        decisions[st.name] += unrolled
    return (dataclasses.replace(kernel, statements=tuple(_after_their_nests(out, after_nest))),
            decisions)


def _gather_pieces(st: ir.Statement, at: ir.ArrayType, outer: int, free: tuple, pieces: list,
                   params: dict) -> list:
    """The gather form of ``st`` (loops over its target's elements, then the ``free``
    loops), one statement per piece of the inverse of its write access."""
    t = st.target
    kept = tuple(range(outer)) + free
    names = _target_dim_names(st, outer, free)
    loops = st.loops[:outer]
    loops += tuple(Loop(v, ir.Const(0, ir.i64), ext, 1) for v, ext in zip(names, at.shape))
    loops += tuple(st.loops[k] for k in free)
    new_target = Load(t.array, tuple(LoopVar(v) for v in names), t.dtype)
    all_names = names + [st.loops[k].var for k in kept]
    out = []
    for k, (piece_set, affs) in enumerate(pieces):
        values = {lp.var: aff_to_expr(a, all_names, params)
                  for lp, a in zip(st.loops, affs)}
        cond = set_to_condition(piece_set, all_names, params)
        piece = st if len(pieces) == 1 else st.split("gather", k, f"{st.name}_g{k}")
        out.append(dataclasses.replace(
            piece, loops=loops,
            conditions=(Condition(cond),), target=new_target,
            expr=ir.fold_integer_constants(ir.substitute(st.expr, values)),
            guard=None if st.guard is None else ir.substitute(st.guard, values)))
    return out


# At most this many values of one loop are split into pieces of their own (below).
MAX_VALUES_SPLIT = 4


def _one_piece_per_value(kernel: ir.Kernel, st: ir.Statement, at: ir.ArrayType,
                         model: PolyModel, outer: int) -> tuple[list, str]:
    """([(piece, inverse)], how) for a scatter that writes one element from several
    iterations only through a loop that takes a few values, else ([], "").

    A clamped filter's border piece ``d_t[0, n] += d_r[m, n] * f[0]`` for m in {0, 1}
    adds into row 0 from two iterations of ``m``; left a scatter, it runs in a nest of
    its own after the gathered interior (``_after_their_nests``), so row 0 is complete
    only after the whole nest. With one piece per value of ``m`` (``m == 0`` and
    ``m == 1``; ``m == M - 1`` and ``m == M - 2`` at the other edge), each an injective
    write, every piece gathers into the element it writes: the element's whole sum then
    runs in the iteration of that element, as the interior's does. The instances are
    the same, reordered; legal under the same test as any gather (``_legal``), which
    the caller has made.
    """
    dom = model.domain(st)
    params = param_exprs(kernel)
    for k in range(outer, len(st.loops)):
        few = few_values(dom, k, MAX_VALUES_SPLIT)
        if few is None:
            continue
        end, direction, count = few
        end_expr = aff_to_expr(end, [], params)
        var = st.loops[k].var
        parts, taken, shown = [], set(), []
        for i in range(count):
            value = ir.fold_integer_constants(ir.Binary(
                "+", end_expr, ir.Const(direction * i, ir.i64), ir.i64))
            shown.append(ir.expr_str(value))
            name = fresh_statement_name(kernel, f"{st.name}_{var}{i}", frozenset(taken))
            taken.add(name)
            piece = dataclasses.replace(
                st.split("gather", i, name),
                conditions=st.conditions + (Condition(ir.Binary(
                    "==", LoopVar(var), value, ir.boolean)),))
            found = _invert(piece, at, model, outer)
            if found is None:
                break
            parts.append((piece, found))
        else:
            return parts, f" (one piece per value of {var}: {', '.join(shown)})"
    return [], ""


def _after_their_nests(statements: list, moved: set) -> list:
    """``statements`` with those named in ``moved`` in a top-level nest of their own right
    after the one they were in (later nests shift by one).

    For the border piece of a scatter (``Statement.on_border``) that stays a scatter
    beside its gathered interior: its iterations conflict, so in the interior's nest it
    would make the nest's outer loop sequential; on its own the interior's loop stays
    parallel and the thin border runs after it. Legal where the whole nest may reorder
    the piece's instances (``_legal`` with no outer loop kept): the nest only adds to its
    target and reads nothing the nest writes.
    """
    if not moved:
        return statements
    nests = {st.position[0] for st in statements if st.name in moved}
    out = []
    for first, group in itertools.groupby(statements, key=lambda st: st.position[0]):
        group = list(group)
        at = first + sum(1 for n in nests if n < first)
        for behind in (False, True):
            out += [dataclasses.replace(st, position=(at + behind,) + st.position[1:])
                    for st in group if (st.name in moved) == behind]
    return out


def _shares_inner_loop(kernel: ir.Kernel, st: ir.Statement) -> bool:
    """Does ``st`` share a loop with another statement of its nest below the loops all of
    the nest's statements share?"""
    nest = _inside_loops(kernel, st, 0)
    c = common_depth(nest)
    return len(st.loops) > c and any(
        o is not st and len(o.loops) > c and o.position[:c + 1] == st.position[:c + 1]
        for o in nest)


def _inside_loops(kernel: ir.Kernel, st: ir.Statement, outer: int) -> list:
    """The statements that run inside one iteration of ``st``'s ``outer`` outermost loops
    and share its next loop: those the gather may reorder ``st``'s instances against
    (``outer`` 0: its whole loop nest)."""
    return [o for o in kernel.statements
            if len(o.loops) > outer and o.position[:outer + 1] == st.position[:outer + 1]]
