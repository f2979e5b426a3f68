"""Tiling of loop nests whose deepest statements run in three or more loops: rectangular,
or time-skewed for stencils.

A matrix product ``C[i, j] += A[i, k] * B[k, j]`` in i, k, j order streams all of
``B`` once per row of ``C``; cut into tiles of ``T x T x T`` iterations, a tile of
``B`` is reused for ``T`` rows while it is in cache. The tiled schedule of a nest
prefixes its loop dimensions with the tile coordinates ``floor(v / T)`` (the
dimensions that order statements, a position in a loop body, are copied), so that
the point loops of one tile run inside the tile loops (ISL's ``band_tile`` on the
flattened schedule). The tiles run in the order of the original loops, which is
legal exactly when every dependence still goes forward in the tiled schedule: that
is checked, with every dependence of the nest, instead of assumed (a time loop
around a stencil fails it: rectangular tiles would run a later step's points before
an earlier one's neighbours).

A stencil's time loop fails that check, but its dependences have bounded distances:
skewing each space dimension by the time, ``i + s * tau`` (``tau = P * t + p``, the
``p``-th of the ``P`` statements of a time step; the least ``s`` that makes every
dependence distance non-negative, computed by ISL from the distances), makes the band
permutable. Its rectangular tiles (parallelograms in the original space) are legal,
and a dependence only joins tiles whose coordinates have a larger sum: the tiles run
in wavefronts (that sum, a sequential loop), the tiles of one wavefront in a parallel
loop (the time tile coordinate, which the wavefront fixes, is dropped). The tiled
schedule is checked like a rectangular one.

Where tiles pay: the innermost loop walks the rows the deepest statements write (a
product in i, k, j order; a dot product along the innermost loop already runs in
per-lane sums, and tiling it only cut the lanes short in measurements: syrk, the
gemm gradient), and some access stays on one element along a tiled loop (reuse
for the tile to keep; a zeroing nest has none).

Tile sizes come from a cache model: ``T`` for the outer loops and ``4 T`` for the
innermost (long unit-stride rows), ``T`` the largest power of two from 128 down to
32 for which a tile's footprint (for each array access of the deepest statements,
the tile size of the loop each index moves with) takes at most half of one core's
L2 cache; no tiling when even 32 does not fit (nests of many loops, a
convolution's). The ``tile`` option of ``pa.compile`` overrides the sizes.
"""

from __future__ import annotations

from typing import Optional

import islpy as isl

from .. import ir
from ..ir import Load, LoopVar
from ..poly import Dependences, PolyModel, maps_of, statement_schedules

DEFAULT_L2_BYTES = 1 << 20
LARGEST_TILE = 128
SMALLEST_TILE = 32
MIN_TILED_LOOPS = 3
INNER_FACTOR = 4
MAX_SKEW = 4


def l2_cache_bytes() -> int:
    """One core's L2 cache size (Linux sysfs), or 1 MiB when it cannot be read."""
    try:
        text = open("/sys/devices/system/cpu/cpu0/cache/index2/size").read().strip()
    except OSError:
        return DEFAULT_L2_BYTES
    scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:].upper(), 1)
    try:
        return int(text.rstrip("KkMm")) * scale
    except ValueError:
        return DEFAULT_L2_BYTES


def _deepest(nest: list) -> list:
    depth = max(len(st.loops) for st in nest)
    return [st for st in nest if len(st.loops) == depth]


def footprint_bytes(statements: list, size_of_var: dict) -> int:
    """Bytes one tile touches: for each distinct array access of ``statements``, the
    product over its indices of the tile size of the loop variables the index uses
    (``size_of_var``; 1 for an index that uses none). Accesses of one array whose
    indices use the same loop variables (a stencil's neighbours, ``A[i - 1, j]`` and
    ``A[i, j]``) count once: their tiles overlap but for a border."""
    seen = set()
    total = 0
    for st in statements:
        accesses = list(st.reads())
        if isinstance(st.target, Load):
            accesses.append(st.target)
        for ld in accesses:
            index_vars = tuple(frozenset(x.name for x in ir.walk(e) if isinstance(x, LoopVar))
                               for e in ld.index)
            key = (ld.array, index_vars)
            if key in seen:
                continue
            seen.add(key)
            n = 1
            for names in index_vars:
                n *= max([size_of_var.get(v, 1) for v in names], default=1)
            total += n * max(1, ld.dtype.bits // 8)
    return total


def model_sizes(statements: list, loop_vars: list, l2_bytes: int) -> dict:
    """Tile size per loop variable (``loop_vars`` outermost first): ``T`` for the outer
    ones and ``INNER_FACTOR * T`` for the innermost (long unit-stride rows), with ``T``
    the largest power of two (LARGEST_TILE at most) whose footprint fits half of L2;
    None when that is below SMALLEST_TILE (many loops: the point loops would be
    too short to pay for the tile loops)."""
    t = LARGEST_TILE
    while t >= SMALLEST_TILE:
        sizes = {v: t for v in loop_vars}
        sizes[loop_vars[-1]] = INNER_FACTOR * t
        if footprint_bytes(statements, sizes) <= l2_bytes // 2:
            return sizes
        t //= 2
    return None


def _functions(m: isl.Map) -> list:
    """The output dimensions of a single-valued schedule map as PwAffs."""
    pma = isl.PwMultiAff.from_map(m)
    return [pma.get_pw_aff(k) for k in range(pma.dim(isl.dim_type.out))]


def _vars_of(f: isl.PwAff, st: ir.Statement) -> list:
    """The loop variables of ``st`` a schedule dimension ``f`` of it depends on."""
    used = set()

    def piece(_, aff: isl.Aff):
        used.update(k for k in range(len(st.loops))
                    if not aff.get_coefficient_val(isl.dim_type.in_, k).is_zero())

    f.foreach_piece(piece)
    return [lp.var for k, lp in enumerate(st.loops) if k in used]


def _reused(statements: list, loop_vars: set) -> bool:
    """Some array access of ``statements`` stays on one element along a tiled loop."""
    for st in statements:
        accesses = list(st.reads()) + ([st.target] if isinstance(st.target, Load) else [])
        for ld in accesses:
            used = {x.name for e in ld.index for x in ir.walk(e) if isinstance(x, LoopVar)}
            if loop_vars - used:
                return True
    return False


def _target_vars(st: ir.Statement) -> set:
    """The loop variables the element a statement writes depends on."""
    if not isinstance(st.target, Load):
        return set()
    return {x.name for e in st.target.index for x in ir.walk(e) if isinstance(x, LoopVar)}


def _bands(funcs: dict, by_name: dict, kernel: ir.Kernel) -> list:
    """Groups of statements the schedule's outermost dimension does not separate (a
    top-level nest of the program order, a fused band of ISL's), each with statements
    in MIN_TILED_LOOPS loops or more and no scalar local (a scalar carried across the
    loops would need its anti dependences, which the schedule's dependences leave out)."""
    locals_ = {name for name, _ in kernel.locals}
    groups: dict = {}
    for name, f in funcs.items():
        pieces = f[0].get_pieces() if f and f[0].is_cst() else []
        key = pieces[0][1].get_constant_val().to_python() if pieces else None
        groups.setdefault(key, []).append(by_name[name])
    out = []
    for group in groups.values():
        if max(len(st.loops) for st in group) < MIN_TILED_LOOPS:
            continue
        if any(isinstance(st.target, ir.ScalarRef) or st.scalar_reads() & locals_
               for st in group):
            continue
        out.append(group)
    return out


def tile_schedule(schedule: isl.Schedule, kernel: ir.Kernel, model: PolyModel,
                  deps: Dependences, sizes: Optional[tuple] = None,
                  l2_bytes: Optional[int] = None) -> tuple[Optional[isl.Schedule], list[str]]:
    """``schedule`` with the nests of three or more loops tiled, and one decision per nest.

    ``sizes``: tile sizes for the loop dimensions of every tiled nest, outermost first
    (the last repeats for deeper ones); None: the cache model's. Returns (None, reasons)
    when no nest is tiled.
    """
    if max((len(st.loops) for st in kernel.statements), default=0) < MIN_TILED_LOOPS:
        return None, []
    l2_bytes = l2_bytes or l2_cache_bytes()
    flat = schedule.get_map()
    per_statement = statement_schedules(flat)
    width = next(iter(per_statement.values())).dim(isl.dim_type.out)
    funcs = {name: _functions(m) for name, m in per_statement.items()}
    tiled: dict[str, tuple[int, int, dict]] = {}  # statement -> (first dim, end dim, T per dim)
    decisions: list[str] = []
    by_name = {st.name: st for st in kernel.statements}
    for group in _bands(funcs, by_name, kernel):
        deepest = _deepest(group)
        moving = [k for k in range(width)
                  if any(not funcs[st.name][k].is_cst() for st in deepest)]
        if not moving:  # every loop of the band runs once here (pieces at fixed points)
            continue
        dims = {st.name: [_vars_of(funcs[st.name][k], st) for k in moving] for st in deepest}
        if any(len(vs) != 1 for st in deepest for vs in dims[st.name]):
            decisions.append(f"not tiled ({deepest[0].name}): a schedule dimension is not "
                             f"one loop")
            continue
        # tiles pay where the innermost loop walks the written rows (a product's
        # C[i, j] += A[i, k] * B[k, j] in i, k, j order); a dot product along the
        # innermost loop already runs in lanes: tiled only when sizes are given
        rows = [st for st in deepest if dims[st.name][-1][0] in _target_vars(st)] or (
            deepest if sizes else [])
        if not rows:
            decisions.append(f"not tiled ({', '.join(st.name for st in deepest)}): the "
                             f"innermost loop sums into one element (lanes keep it in "
                             f"registers)")
            continue
        dim_vars = [vs[0] for vs in dims[rows[0].name]]
        if not sizes and not _reused(rows, set(dim_vars)):
            decisions.append(f"not tiled ({', '.join(st.name for st in rows)}): every access "
                             f"moves with every loop (no reuse for a tile to keep in cache)")
            continue
        if sizes:
            size_of_var = {v: int(sizes[min(n, len(sizes) - 1)]) for n, v in enumerate(dim_vars)}
            how = "sizes given"
        else:
            size_of_var = model_sizes(rows, dim_vars, l2_bytes)
            if size_of_var is None:
                decisions.append(f"not tiled ({', '.join(st.name for st in rows)}): no tile "
                                 f"of {SMALLEST_TILE} or more per loop fits half of the "
                                 f"{l2_bytes >> 10} KiB L2")
                continue
            how = (f"cache model: a tile's accesses take "
                   f"{footprint_bytes(rows, size_of_var) >> 10} KiB, at most half of the "
                   f"{l2_bytes >> 10} KiB L2")
        size_of = {k: size_of_var[v] for k, v in zip(moving, dim_vars)}
        plan = {st.name: (moving[0], moving[-1] + 1, size_of, False) for st in group}
        sizes_text = 'x'.join(str(size_of[k]) for k in moving)
        if _respects(_tiled_map(per_statement, funcs, plan), deps, model):
            tiled.update(plan)
            decisions.append(f"tiled {sizes_text} (loops {', '.join(dim_vars)} of "
                             f"{', '.join(st.name for st in rows)}; {how}; the outer tile "
                             f"loop parallel)")
            continue
        skew = (_time_skew(group, per_statement, funcs, moving, deps, model)
                if len(deepest) == len(group) else None)
        if skew is None:
            decisions.append(f"not tiled ({', '.join(st.name for st in rows)}): a dependence "
                             f"would run backwards between tiles, and no skew of the space "
                             f"by the time (at most {MAX_SKEW} per step, every statement in "
                             f"all the loops) makes every distance non-negative")
            continue
        skewed, factors = skew
        plan = {st.name: (moving[0], moving[-1] + 1, size_of, True) for st in group}
        if not _respects(_tiled_map(per_statement, {**funcs, **skewed}, plan), deps, model):
            decisions.append(f"not tiled ({', '.join(st.name for st in rows)}): a dependence "
                             f"would run backwards between time-skewed tiles")
            continue
        funcs.update(skewed)
        tiled.update(plan)
        steps = len({_position(funcs[st.name], moving) for st in group})
        time = dim_vars[0] if steps == 1 else f"{steps}*{dim_vars[0]} + statement"
        decisions.append(
            f"time-skewed tiled {sizes_text} (loops {', '.join(dim_vars)} of "
            f"{', '.join(st.name for st in rows)}; space skewed by the time "
            f"{time}: " + ", ".join(f"{v} + {s}*({time})" for v, s in zip(dim_vars[1:], factors))
            + f", factors from the dependence distances; {how}; parallelogram tiles run in "
            f"wavefronts (the sum of the tile coordinates), the tile loop inside a wavefront "
            f"parallel)")
    if not tiled:
        return None, decisions
    # groups are ordered by the schedule's outermost dimension, which tiling keeps:
    # each group legal alone makes them legal together
    out = _tiled_map(per_statement, funcs, tiled)
    tiled_schedule = isl.Schedule.from_domain(schedule.get_domain()).insert_partial_schedule(
        isl.MultiUnionPwAff.from_union_map(out))
    return tiled_schedule, decisions


def _tiled_map(per_statement: dict, funcs: dict, tiled: dict) -> isl.UnionMap:
    """The flat schedule with the tile coordinates ``floor(d / T)`` of dimensions
    ``[first, end)`` inserted before them for each statement in ``tiled`` (statement ->
    (first, end, T per dimension, wavefront)), padded with zeros to one width.

    Without wavefront, constant dimensions are copied among the tile coordinates. With
    wavefront (time-skewed tiles), the tile coordinates are the wavefront, the sum of
    the moving dimensions' tile coordinates, then those of every moving dimension but
    the first (the time, which the wavefront and the others determine): the tiles of
    one wavefront run in a loop of their own."""
    extra = max(end - first for first, end, _, _ in tiled.values())
    out = None
    for name, m in per_statement.items():
        f = funcs[name]
        dims = list(f)
        pad = extra
        if name in tiled:
            first, end, size_of, wavefront = tiled[name]
            tiles = [f[k].scale_down_val(isl.Val.int_from_si(f[k].get_ctx(), size_of[k])).floor()
                     if k in size_of and not f[k].is_cst() else f[k]
                     for k in range(first, end)]
            if wavefront:
                moving = [tiles[k - first] for k in sorted(size_of)]
                front = moving[0]
                for tile in moving[1:]:
                    front = front.add(tile)
                tiles = [front] + moving[1:]
            dims = f[:first] + tiles + f[first:]
            pad -= len(tiles)
        dims += [f[0].scale_val(isl.Val.zero(f[0].get_ctx()))] * pad
        tiled_map = isl.Map.from_pw_aff(dims[0])
        for d in dims[1:]:
            tiled_map = tiled_map.flat_range_product(isl.Map.from_pw_aff(d))
        piece = tiled_map.intersect_domain(m.domain()).to_union_map()
        out = piece if out is None else out.union(piece)
    return out


def _position(f: list, moving: list) -> tuple:
    """A statement's place in the body of the time loop: its constant schedule
    dimensions between the first two moving ones."""
    return tuple(f[k].get_pieces()[0][1].get_constant_val().to_python()
                 for k in range(moving[0] + 1, moving[1]))


def _time_skew(group: list, per_statement: dict, funcs: dict, moving: list,
               deps: Dependences, model: PolyModel) -> Optional[tuple[dict, list]]:
    """The schedule functions of ``group`` with each space dimension (the moving ones
    after the first, the time loop) skewed by the time: ``d + s * tau``, ``tau = P * t
    + p`` with ``p`` a statement's place among the ``P`` places in the time loop's body
    (jacobi's two statements per step: B from A at 2t, A from B at 2t + 1), and the
    factors ``s``; None when no factor up to MAX_SKEW makes every dependence of the
    group go forward (or stay) along every skewed dimension.

    The factor of a dimension is the least ``s`` with ``delta d + s * delta tau >= 0``
    over the dependence distances (ISL computes them); with every distance
    non-negative along the time and the skewed dimensions, the band is permutable:
    rectangular tiles of it are legal, and no dependence joins two tiles whose
    coordinates have the same sum (one wavefront)."""
    if len(moving) < 2 or any(f[k].is_cst() for st in group for f in [funcs[st.name]]
                              for k in moving):
        return None
    if any(not funcs[st.name][k].is_cst() for st in group
           for k in range(moving[0] + 1, moving[1])):
        return None
    places = sorted({_position(funcs[st.name], moving) for st in group})
    steps = len(places)
    taus = {}
    for st in group:
        f = funcs[st.name]
        taus[st.name] = f[moving[0]].scale_val(isl.Val.int_from_si(f[0].get_ctx(), steps)) \
            .add_constant_val(isl.Val.int_from_si(f[0].get_ctx(),
                                                  places.index(_position(f, moving))))
    time_space = None
    for st in group:
        f = funcs[st.name]
        m = isl.Map.from_pw_aff(taus[st.name])
        for k in moving[1:]:
            m = m.flat_range_product(isl.Map.from_pw_aff(f[k]))
        piece = m.intersect_domain(per_statement[st.name].domain()).to_union_map()
        time_space = piece if time_space is None else time_space.union(piece)
    all_deps = deps.all(model.context.get_space())
    distances = all_deps.apply_domain(time_space).apply_range(time_space).deltas()
    if distances.is_empty():
        return None
    names = [f"d{n}" for n in range(len(moving))]
    ctx = model.context.get_ctx()

    def empty(condition: str) -> bool:
        bad = isl.UnionSet.read_from_str(ctx, f"{{ [{', '.join(names)}] : {condition} }}")
        return distances.intersect(bad).is_empty()

    if not empty("d0 < 0"):
        return None
    factors = []
    for n in range(1, len(moving)):
        factor = next((s for s in range(MAX_SKEW + 1) if empty(f"d{n} + {s} * d0 < 0")), None)
        if factor is None:
            return None
        factors.append(factor)
    skewed = {}
    for st in group:
        f = list(funcs[st.name])
        for k, s in zip(moving[1:], factors):
            f[k] = f[k].add(taus[st.name].scale_val(isl.Val.int_from_si(f[0].get_ctx(), s)))
        skewed[st.name] = f
    return skewed, factors


def _respects(schedule_map: isl.UnionMap, deps: Dependences, model: PolyModel) -> bool:
    """Every dependence goes from an earlier to a later point of ``schedule_map``."""
    all_deps = deps.all(model.context.get_space())
    if all_deps.is_empty():
        return True
    between = all_deps.apply_domain(schedule_map).apply_range(schedule_map)
    return all(m.is_subset(isl.Map.lex_lt(m.get_space().domain())) for m in maps_of(between))
