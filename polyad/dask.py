"""Run polyad kernels and their derivatives tile by tile on dask arrays.

``map_kernel(kernel, *args)`` returns lazy dask arrays; dask schedules the
tiles over threads, processes or a cluster (``dask.distributed``)::

    import dask.array as da
    from polyad import dask as pdask

    y = pdask.map_kernel(blur, x, f)                          # like blur(x, f)
    c = pdask.map_kernel(tv_cost, g, b, 0.1)                  # a 0-d dask array
    dg = pdask.map_kernel(pa.grad(tv_cost, wrt="g"), g, b, 0.1)

How a kernel is cut (every decision is derived from the kernel, none from
the user):

- **Tiled sizes.** A size symbol (``M``, ``N``) along which some dask
  argument has more than one chunk. Every array dimension whose extent is that
  symbol is cut at the same places (arguments are rechunked to agree).
- **Halo from ISL.** ``polyad.poly.tile_footprint`` follows the kernel's
  dataflow from each result a tile owns to every input element it needs; each
  tile runs the compiled kernel on its chunk grown by that many cells per side
  and keeps only the elements it owns. Chunks smaller than the halo are fine:
  a tile's window gathers as many neighbouring chunks as it needs.
- **Boundary modes at the true border only.** A window is never padded at
  the array's true border: there the tile's edge *is* the array's edge and
  the kernel applies its own mode, exactly as the untiled call does (this is
  what makes adjoints right too: a clamped or mirror gradient folds the
  contributions of the reads beyond the edge back into the edge cells, which
  padding and cropping would lose). Along a size whose arrays are
  ``.circular`` the windows wrap around instead (dask's ``periodic``).
- **Reductions.** A returned scalar, and an output array with no tiled
  dimension (a filter's gradient, a scalar parameter's gradient), is summed
  from per-tile partial results: each tile runs only the contributions at the
  loop positions it owns, and dask adds the partials up.
- **Refusals.** An output element that depends on inputs an unbounded
  distance away along a tiled size (a prefix sum, a matrix product over a cut
  dimension, a global mean used elementwise) raises ``TilingError`` naming the
  size and the dependence; rechunk that size to a single chunk.

Each tile calls the compiled kernel (the same cached library) with
``omp_threads`` OpenMP threads (default 1: dask already runs one tile per
worker thread).
"""

from __future__ import annotations

import dataclasses
import itertools
import operator
import threading
from typing import Optional

import dask.array as da
import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph

from . import ir
from .api import Kernel
from .errors import ArgumentError, DTypeError, TilingError
from .ir import Cast, Condition, Const, Load, LoopVar, ScalarRef, SizeVar
from .poly import loop_position_vars, tile_footprint
from .runtime.threads import num_threads
from .callconv import bind_args, infer_sizes

__all__ = ["map_kernel", "TilingError"]

# Loop positions no tile reaches: the first and last tiles own everything
# before and after their cuts.
_FAR = 1 << 40


def map_kernel(kernel, *args, omp_threads: Optional[int] = 1, **kwargs):
    """Run ``kernel`` tile by tile on dask arrays; returns what the kernel returns, lazily.

    Arguments are passed as to the kernel itself: arrays (dask or numpy),
    scalars, and sizes as keywords when the shapes do not determine them.
    ``pa.Out`` arrays are left out (each tile allocates its own). The result
    mirrors the kernel call: output arrays as dask arrays chunked like the
    inputs, a returned scalar as a 0-d dask array, a ``pa.grad`` /
    ``pa.value_and_grad`` / ``pa.vjp`` kernel's derivatives shaped like its
    ``wrt``. ``omp_threads``: OpenMP threads per tile (None: the OpenMP default).
    """
    if not isinstance(kernel, Kernel):
        raise TypeError(f"map_kernel() runs a @pa.kernel (or pa.grad(...) of one), "
                        f"got {kernel!r}")
    if omp_threads is not None and (not isinstance(omp_threads, int) or omp_threads < 1):
        raise ArgumentError(f"map_kernel(): omp_threads must be a positive integer or None, "
                          f"got {omp_threads!r}")
    plan = _plan(kernel.ir, args, kwargs)
    raw = _build(plan, omp_threads)
    return _package(kernel, raw)


# --------------------------------------------------------------------------
# the plan: tiled sizes, chunks, halos, which results are tiled or summed
# --------------------------------------------------------------------------


@dataclasses.dataclass
class _Plan:
    kernel: ir.Kernel          # the kernel each tile runs (owned-position limits added)
    arrays: dict               # parameter name -> dask array (every array argument)
    scalars: dict              # parameter name -> Python value
    sizes: dict                # every size of the whole problem
    axes: list                 # tiled sizes, in order of first appearance
    chunks: dict               # tiled size -> chunk lengths
    halo: dict                 # tiled size -> cells per side
    periodic: dict             # tiled size -> windows wrap around (circular arrays)
    tiled_outputs: list        # output names cut like the inputs
    summed_outputs: list       # output names (and the result) summed over tiles
    limits: dict               # tiled size -> (lo, hi) int parameter names of owned positions


def _axis_dims(at: ir.ArrayType, axis: str) -> list[int]:
    return [d for d, e in enumerate(at.shape) if isinstance(e, SizeVar) and e.name == axis]


def _plan(k: ir.Kernel, args, kwargs) -> _Plan:
    bound, given_sizes = bind_args(k, args, kwargs)
    for p in k.params:
        if p.intent == "out" and p.name in bound:
            raise TilingError(f"map_kernel({k.name}): leave out the output {p.name!r}; "
                              f"each tile allocates its part and the result is returned")
    arrays, scalars = {}, {}
    for p in k.params:
        if p.name not in bound:
            continue
        v = bound[p.name]
        if p.is_array:
            if not isinstance(v, (da.Array, np.ndarray)):
                raise DTypeError(f"map_kernel({k.name}): argument {p.name!r} must be a dask "
                                 f"or numpy array, got {type(v).__name__}")
            if v.dtype != p.type.dtype.np:
                raise DTypeError(f"map_kernel({k.name}): argument {p.name!r} has dtype "
                                 f"{v.dtype}, expected {p.type.dtype.np_name}")
            arrays[p.name] = v
        else:
            scalars[p.name] = v
    sizes = infer_sizes(k, arrays, given_sizes)

    axes: list[str] = []
    chunks: dict[str, tuple] = {}
    for name, v in arrays.items():
        if not isinstance(v, da.Array):
            continue
        at = k.param(name).type
        for d, (e, c) in enumerate(zip(at.shape, v.chunks)):
            if len(c) <= 1:
                continue
            if not isinstance(e, SizeVar) or len(_axis_dims(at, e.name)) != 1:
                raise TilingError(
                    f"map_kernel({k.name}): {name!r} is cut into chunks along its dimension "
                    f"{d} (extent {ir.expr_str(e)}), but polyad tiles only dimensions whose "
                    f"extent is a single size symbol that appears once in the array's type; "
                    f"rechunk it to one chunk: {name}.rechunk({{{d}: -1}})")
            if e.name not in chunks:
                axes.append(e.name)
                chunks[e.name] = c
    for name, v in list(arrays.items()):
        at = k.param(name).type
        want = {}
        for d, e in enumerate(at.shape):
            want[d] = chunks[e.name] if isinstance(e, SizeVar) and e.name in chunks else -1
        arrays[name] = (v if isinstance(v, da.Array) else da.from_array(v)).rechunk(want)

    for p in k.params:
        if p.intent == "inout":
            raise TilingError(f"map_kernel({k.name}): {p.name!r} is updated in place, which "
                              f"tiles cannot do on dask arrays; write the result to a pa.Out "
                              f"array instead")
    outputs = [p for p in k.params if p.intent == "out" and p.is_array]
    tiled, summed = [], []
    for p in outputs:
        present = [a for a in axes if len(_axis_dims(p.type, a)) == 1]
        if len(present) == len(axes):
            tiled.append(p.name)
        elif not present:
            summed.append(p.name)
        else:
            missing = [a for a in axes if a not in present]
            raise TilingError(
                f"map_kernel({k.name}): output {p.name!r} ({p.type!r}) has no dimension along "
                f"{', '.join(missing)}, which the inputs are cut along: each of its elements "
                f"combines values from all of {', '.join(missing)} (a matrix product or a "
                f"partial reduction over a cut dimension); rechunk the inputs to a single "
                f"chunk along {', '.join(missing)}")
    if k.result is not None:
        summed.append(k.result[0])

    sum_vars, owned_sinks = _summed_variables(k, axes, summed)
    references = {}
    for st in k.statements:
        if isinstance(st.target, Load) and st.target.array in tiled:
            at = k.array_type(st.target.array)
            references[st.name] = {a: st.target.index[_axis_dims(at, a)[0]] for a in axes}
    for st in owned_sinks:
        pos = loop_position_vars(st, axes)
        references[st.name] = {a: LoopVar(pos[a]) for a in axes}
    values = {s: v for s, v in sizes.items() if s not in axes}
    values.update({n: int(scalars[n]) for n in k.int_params})
    reach = tile_footprint(k, axes, references, values, reductions=frozenset(sum_vars))
    for a in axes:
        if reach[a].halo is None:
            raise TilingError(
                f"map_kernel({k.name}): cannot tile along {a}: {reach[a].why} (a prefix sum, "
                f"a recurrence or a global reduction used elementwise); rechunk the inputs "
                f"to a single chunk along {a}")

    periodic = {a: _periodic(k, a, reach[a].full) for a in axes}
    limits = {a: (f"_tile_lo_{a}", f"_tile_hi_{a}") for a in axes} if owned_sinks else {}
    return _Plan(_limit_to_owned(k, owned_sinks, axes, limits), arrays, scalars, sizes, axes,
                 chunks, {a: reach[a].halo for a in axes}, periodic, tiled, summed, limits)


def _summed_variables(k: ir.Kernel, axes, summed) -> tuple[set, list]:
    """Variables that are sums over loop positions, and the statements adding to them.

    A summed output (or result) ``V`` is written only by: ``V = 0`` outside the
    tiled loops (its start), ``V += e`` / ``V -= e`` inside every tiled loop
    (the contributions, which tiles split among themselves), or ``V = W`` /
    ``V += W`` outside them where ``W`` is a scalar local that is itself such a
    sum. Then the sum of the tiles' partial values is the untiled value.
    """
    local_names = {n for n, _ in k.locals}
    todo, found, sinks = list(summed), set(), []
    while todo:
        var = todo.pop()
        if var in found:
            continue
        found.add(var)
        for st in k.statements:
            if st.target_name != var:
                continue
            pos = loop_position_vars(st, axes)
            source = st.expr.a if isinstance(st.expr, Cast) else st.expr
            if st.op in ("+=", "-=") and len(pos) == len(axes):
                if st.reads_variable(var):
                    raise _not_a_sum(k, var, st)
                sinks.append(st)
            elif not pos and st.op == "=" and isinstance(source, Const) and source.value == 0:
                continue
            elif not pos and st.op in ("=", "+=") and isinstance(source, ScalarRef) \
                    and source.name in local_names:
                todo.append(source.name)
            else:
                raise _not_a_sum(k, var, st)
    for st in k.statements:
        if st.target_name not in found and any(st.reads_variable(v) for v in found):
            used = next(v for v in found if st.reads_variable(v))
            raise TilingError(
                f"map_kernel({k.name}): line {st.line} ({st.source.strip() or st.name}) uses "
                f"{used!r}, a sum over the whole array that each tile only knows in part; "
                f"rechunk the inputs to a single chunk")
    return found, sinks


def _not_a_sum(k: ir.Kernel, var: str, st: ir.Statement) -> TilingError:
    return TilingError(
        f"map_kernel({k.name}): {var!r} is not a sum of contributions at the tiled loop "
        f"positions (line {st.line}: {st.source.strip() or st.name}), so it cannot be "
        f"combined from per-tile partial sums; rechunk the inputs to a single chunk")


def _periodic(k: ir.Kernel, axis: str, full: bool) -> bool:
    """Windows along ``axis`` wrap around when the arrays along it are circular."""
    arrays = [p.type for p in k.params if p.is_array] + [t.type for t in k.temps]
    modes = {at.mode for at in arrays if _axis_dims(at, axis)}
    if "circular" not in modes:
        return False
    others = sorted(m for m in modes - {"circular", None})
    if others or not full:
        why = (f"others are {', '.join(others)}" if others else
               "some loops along it stop short of its ends")
        raise TilingError(
            f"map_kernel({k.name}): along {axis} some arrays are circular and {why}: a tile "
            f"cannot both wrap around and stop at the border; rechunk the inputs to a single "
            f"chunk along {axis}")
    return True


def _limit_to_owned(k: ir.Kernel, sinks, axes, limits) -> ir.Kernel:
    """``k`` with each summed contribution restricted to the loop positions a tile owns."""
    if not sinks:
        return k
    taken = {p.name for p in k.params} | {n for n, _ in k.locals} | set(k.sizes)
    new_params = []
    for a in axes:
        for n in limits[a]:
            if n in taken:
                raise TilingError(f"map_kernel({k.name}): the kernel already uses the name "
                                  f"{n!r} that polyad.dask needs; rename it")
            new_params.append(ir.Param(n, ir.i64))
    names = {st.name for st in sinks}
    statements = []
    for st in k.statements:
        if st.name in names:
            pos = loop_position_vars(st, axes)
            conds = []
            for a in axes:
                lo, hi = (ScalarRef(n, ir.i64) for n in limits[a])
                v = LoopVar(pos[a])
                conds.append(Condition(ir.Binary(">=", v, lo, ir.boolean)))
                conds.append(Condition(ir.Binary("<", v, hi, ir.boolean)))
            st = dataclasses.replace(st, conditions=st.conditions + tuple(conds))
        statements.append(st)
    return dataclasses.replace(k, params=k.params + tuple(new_params),
                               int_params=k.int_params + tuple(p.name for p in new_params),
                               statements=tuple(statements))


# --------------------------------------------------------------------------
# the graph: one task per tile, windows gathered from neighbouring chunks
# --------------------------------------------------------------------------


def _cuts(chunks) -> list[tuple[int, int]]:
    bounds = np.concatenate([[0], np.cumsum(chunks)]).astype(int)
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


def _pieces(lo: int, hi: int, cuts: list) -> list[tuple[int, slice]]:
    """``[lo, hi)`` of a dimension cut at ``cuts`` as (chunk, slice in the chunk) pieces,
    in order; a range that leaves ``[0, size)`` wraps around the ends."""
    size = cuts[-1][1]
    out = []
    start = lo
    while start < hi:
        base = start % size
        stop = min(hi - start + base, size)
        for c, (a, b) in enumerate(cuts):
            if a < stop and b > base:
                out.append((c, slice(max(a, base) - a, min(b, stop) - a)))
        start += stop - base
    return out


_window_buffers = threading.local()


def _assemble(slot: int, blocks: list, slices: list, grid: tuple) -> np.ndarray:
    """One C-contiguous window from the pieces of neighbouring chunks (row-major ``grid``).

    The window goes into this thread's buffer for argument ``slot``, reused from
    tile to tile: a fresh array for every window would cost a page fault per
    page, as much as the kernel's own work on a memory-bound stencil.
    """
    parts = [b[s] for b, s in zip(blocks, slices)]
    if len(parts) == 1:
        return np.ascontiguousarray(parts[0])
    strides = [int(np.prod(grid[d + 1:])) for d in range(len(grid))]
    starts = [np.concatenate([[0], np.cumsum([parts[k * strides[d]].shape[d]
                                              for k in range(n)])]) for d, n in enumerate(grid)]
    shape = tuple(int(st[-1]) for st in starts)
    pool = getattr(_window_buffers, "pool", None)
    if pool is None:
        pool = _window_buffers.pool = {}
    out = pool.get(slot)
    if out is None or out.shape != shape or out.dtype != parts[0].dtype:
        out = pool[slot] = np.empty(shape, parts[0].dtype)
    for flat, part in enumerate(parts):
        pos = np.unravel_index(flat, grid)
        out[tuple(slice(starts[d][i], starts[d][i] + part.shape[d])
                  for d, i in enumerate(pos))] = part
    return out


def _partial(result: tuple, i: int) -> np.ndarray:
    """Output ``i`` of a tile as one block of the stack of per-tile partial sums."""
    return np.asarray(result[i])[np.newaxis]


class _TileProgram:
    """What a tile task runs: picklable (the IR travels; each process compiles once)."""

    _kernels: dict = {}
    _lock = threading.Lock()

    def __init__(self, plan: _Plan, omp_threads: Optional[int]):
        self.kernel = plan.kernel
        self.omp_threads = omp_threads
        self.array_names = list(plan.arrays)
        self.scalars = dict(plan.scalars)
        self.sizes = {s: v for s, v in plan.sizes.items() if s not in plan.axes}
        self.tiled = list(plan.tiled_outputs)
        self.summed = list(plan.summed_outputs)
        self.crops = {n: {d: a for a in plan.axes
                          for d in _axis_dims(plan.kernel.param(n).type, a)}
                      for n in self.tiled}
        self.limits = plan.limits
        self.axes = list(plan.axes)

    def compiled(self):
        with _TileProgram._lock:
            k = _TileProgram._kernels.get(self.kernel)
            if k is None:
                k = _TileProgram._kernels[self.kernel] = Kernel(ir_kernel=self.kernel)
                k.compile()
            return k

    def __call__(self, owned: dict, limits: dict, *windows):
        args = dict(zip(self.array_names, windows))
        args.update(self.scalars)
        for a, (lo, hi) in limits.items():
            args[self.limits[a][0]], args[self.limits[a][1]] = lo, hi
        with num_threads(self.omp_threads):
            raw = self.compiled()(**args, **self.sizes)
        k = self.kernel
        outs = [p.name for p in k.params if p.intent == "out"]
        raw = raw if isinstance(raw, tuple) else (raw,)
        named = dict(zip(([k.result[0]] if k.result else []) + outs, raw))
        results = []
        for n in self.tiled:
            idx = [slice(None)] * np.ndim(named[n])
            for d, a in self.crops[n].items():
                idx[d] = slice(*owned[a])
            results.append(named[n][tuple(idx)])
        results += [np.asarray(named[n]) for n in self.summed]
        return tuple(results)


def _build(plan: _Plan, omp_threads: Optional[int]) -> dict:
    """name -> dask array for each output (and the result), from one task per tile.

    The graph is written out directly: each tile's task takes the pieces of
    its windows from the input chunks' own keys, so an input chunk is computed
    once however many windows share it.
    """
    k = plan.kernel
    program = _TileProgram(plan, omp_threads)
    token = tokenize(k, plan.scalars, plan.axes, plan.chunks, plan.halo, omp_threads,
                     *plan.arrays.values())
    tile_name = f"{k.name}-tile-{token}"
    out_names = {n: f"{k.name}-{n}-{token}" for n in plan.tiled_outputs + plan.summed_outputs}
    cuts = {a: _cuts(plan.chunks[a]) for a in plan.axes}
    grid = [len(cuts[a]) for a in plan.axes]
    ntiles = int(np.prod(grid))
    out_types = {p.name: p.type for p in k.params if p.is_array}
    if k.result is not None:
        out_types[k.result[0]] = ir.ArrayType(k.result[1], ())
    tiles = {}
    outputs = {n: {} for n in out_names}
    for flat, tile in enumerate(np.ndindex(*grid)):
        ranges, owned, limits = {}, {}, {}
        for a, t in zip(plan.axes, tile):
            lo, hi = cuts[a][t]
            h, size = plan.halo[a], plan.sizes[a]
            w_lo, w_hi = (lo - h, hi + h) if plan.periodic[a] else (max(0, lo - h),
                                                                    min(size, hi + h))
            ranges[a] = (w_lo, w_hi)
            owned[a] = (lo - w_lo, hi - w_lo)
            # Along a wrapping size, the window's ends repeat the far tiles' positions.
            first = t == 0 and not plan.periodic[a]
            last = t == len(cuts[a]) - 1 and not plan.periodic[a]
            limits[a] = (-_FAR if first else owned[a][0], _FAR if last else owned[a][1])
        # Each window is assembled inside its tile's task (a nested task): a window
        # exists only while its tile runs, never all of them at once.
        windows = []
        for slot, (name, x) in enumerate(plan.arrays.items()):
            at = k.param(name).type
            per_dim = []
            for d in range(x.ndim):
                a = next((a for a in plan.axes if d in _axis_dims(at, a)), None)
                per_dim.append(_pieces(*ranges[a], cuts[a]) if a else
                               [(0, slice(None))])
            combos = list(itertools.product(*per_dim))
            windows.append((_assemble, slot, [(x.name, *(c for c, _ in combo)) for combo in combos],
                            [tuple(sl for _, sl in combo) for combo in combos],
                            tuple(len(p) for p in per_dim)))
        tile_key = (tile_name, *tile)
        tiles[tile_key] = (program, owned, limits if plan.limits else {}, *windows)
        for i, n in enumerate(plan.tiled_outputs):
            at = out_types[n]
            block = tuple(tile[plan.axes.index(a)] if a else 0 for a in _dim_axes(at, plan.axes))
            outputs[n][(out_names[n], *block)] = (operator.getitem, tile_key, i)
        for i, n in enumerate(plan.summed_outputs, start=len(plan.tiled_outputs)):
            ndim = out_types[n].ndim
            outputs[n][(out_names[n], flat, *(0,) * ndim)] = (_partial, tile_key, i)
    layers = {}
    deps = {}
    for x in plan.arrays.values():
        layers.update(x.dask.layers)
        deps.update(x.dask.dependencies)
    layers[tile_name] = tiles
    deps[tile_name] = {x.name for x in plan.arrays.values()}
    for n, tasks in outputs.items():
        layers[out_names[n]] = tasks
        deps[out_names[n]] = {tile_name}
    graph = HighLevelGraph(layers, deps)
    out = {}
    for n in plan.tiled_outputs:
        at = out_types[n]
        chunks = tuple(plan.chunks[a] if a else (ir.eval_integer(e, plan.sizes),)
                       for a, e in zip(_dim_axes(at, plan.axes), at.shape))
        out[n] = da.Array(graph, out_names[n], chunks, dtype=at.dtype.np,
                          meta=np.empty((0,) * at.ndim, at.dtype.np))
    for n in plan.summed_outputs:
        at = out_types[n]
        shape = tuple(ir.eval_integer(e, plan.sizes) for e in at.shape)
        stack = da.Array(graph, out_names[n], ((1,) * ntiles, *((s,) for s in shape)),
                         dtype=at.dtype.np, meta=np.empty((0,) * (at.ndim + 1), at.dtype.np))
        out[n] = stack.sum(axis=0)
    return out


def _dim_axes(at: ir.ArrayType, axes) -> list:
    """The tiled size of each dimension of ``at`` (None for a dimension that is not cut)."""
    return [next((a for a in axes if d in _axis_dims(at, a)), None) for d in range(at.ndim)]


def _package(kernel: Kernel, raw: dict):
    """Arrange the outputs as the kernel's own call would."""
    k = kernel.ir
    outs = [raw[p.name] for p in k.params if p.intent == "out"]
    value = raw[k.result[0]] if k.result is not None else None
    kind = getattr(kernel, "kind", None)
    if kind in ("grad", "value_and_grad", "vjp"):
        primal = kernel.primal.ir
        grads = [o if primal.param(n).is_array else o.reshape(-1)[0]
                 for n, o in zip(kernel.wrt_names, outs)]
        if isinstance(kernel.wrt, str):
            g = grads[0]
        elif isinstance(kernel.wrt, dict):
            g = dict(zip(kernel.wrt.keys(), grads))
        else:
            g = tuple(grads)
        return (value, g) if kind == "value_and_grad" else g
    if value is not None:
        return (value, *outs) if outs else value
    return outs[0] if len(outs) == 1 else tuple(outs)
