"""Producer-consumer fusion of loop nests through rolling row buffers.

The gradient of a separable blur runs four nests over the image, each a pass over
memory::

    for m, n:  t[m, n] = H(x)[m, n]                          (A: writes t)
    for m, n:  r = V(t)[m, n] - y[m, n];  d_r[m, n] = 2 r    (B: reads t[m - 2 .. m + 2])
    for m, n:  d_t[m, n] += V^T(d_r)[m, n];  d_f += ...      (C: reads d_r[m - 2 .. m + 2], t)

``t`` and ``d_r`` are temporaries that only later nests of the chain read, each
within a bounded window of rows around the reader's row. Fused, the nests run in
one loop over ``m`` where each producer runs ahead of its consumers by the window
(``B`` two rows ahead of ``C``, ``A`` two rows ahead of ``B``): a row of ``t`` is
read for the last time a few steps after it is written, so ``t`` shrinks to the
rows still live, a rolling buffer indexed by the row modulo its height. For
parallelism the loop over ``m`` is cut into chunks of ``CHUNK_ROWS`` rows; each
chunk has its own buffers (private to the thread that runs it) and first
recomputes the producer rows its first consumer rows read (the rows the previous
chunk also computes): the line-buffered loop a careful engineer writes by hand. Where
the chunks of a call's sizes would leave threads idle, a default compilation runs
finer chunks (where a chunk recomputes few rows) or the unfused schedule for that call
(``chunked_extents``, ``chunk_schedule``).

Inside a nest's outer loops, two sibling loops over rows linked by a temporary run
as one the same way, without chunks (the outer loops keep the parallelism):
``fuse_rows_inside``, the conv layer's ``d_x`` gather a row behind the rows of ``d_s``.

Buffer or recompute: a producer row is read by several consumer rows (five for a
5-tap window): recomputing it per reader repeats its work once per tap, a buffer
of ``W`` rows per thread costs ``W`` rows of memory that stay in cache. The pass
keeps buffers.

Legality (checked, not assumed). A chain is the nests ``P1, ..., Pk, Q`` at
consecutive top-level positions (statements outside loops between them touch
nothing the chain accesses) whose statements run in one outer loop, ascending with
step 1 over the same range, where each producer ``Pj``

- writes only temporaries that no statement outside the later members reads or
  writes and that the later members only read (not a kernel output, not
  zero-filled: the producer assigns every element the consumers read, and only it
  writes a buffer's rows) and scalars no statement outside ``Pj`` uses, and sums into
  kernel arrays that no member reads otherwise (the residual's ``d_f[k] += ...``):
  those run for the chunk's own rows only, never for the rows it recomputes, so each
  term is added once (in another order, as a parallel reduction's);
- reads nothing a later member writes.

So moving a producer's iterations earlier relative to its consumers changes no value
except through its temporaries, and recomputing a producer row at a chunk's start
writes only the chunk's buffers. The windows come from ISL: for every temporary, the
distances along the outer loop of its flow dependences between members give each
producer's lead (``shift``: its row ``m + shift`` runs at step ``m``) and how many
rows a chunk recomputes before its first row (every row a chunk reads is then written
in the chunk first); the rows each member writes and reads relative to its own row
(access relations) give the buffer height: the slot of row ``r`` is reused by row
``r + W`` only after the last read of ``r``. A window that ISL finds unbounded (a
consumer reading a whole column) stops the chain there. The chunk loop's parallelism
is then decided like any loop's, by ISL's dependence test on the fused nest
(``schedule.build``): a buffer is private to a loop that ISL proves runs one chunk
per iteration, and inside a chunk its memory-based dependences keep the row loop in
order. A dependence of the consumer's own between rows of two chunks (a clamped
border's scatter into row ``M - 1`` from rows ``M - 2`` and ``M - 1``, for the ``M``
where a chunk starts at ``M - 1``) is one the test sees like any other.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import islpy as isl

from .. import ir
from ..ad.exprs import affine_form
from ..ir import Binary, Condition, Const, Load, Loop, LoopVar, ScalarRef
from ..poly import PolyModel, dependences, maps_of, model_of
from .distribute import conflicts_across_iterations
from .gather import iterations_independent_but_sums, only_added_into
from .nests import common_depth, inner_loops, loop_nests, rows_selected_by_loops

CHUNK_ROWS = 64
# A chain whose chunks recompute at most FINE_LEAD_IN producer steps before their first
# row also has a schedule in chunks of FINE_CHUNK_ROWS rows (``fuse=FINE_CHUNK_ROWS``),
# for the calls whose chunks of CHUNK_ROWS rows leave a thread partly idle where the finer
# ones do not (``chunk_schedule``). The 3-D stencil gradient at 161^3 on 2 threads (3
# chunks of 64 planes: 97 planes for one thread, 64 for the other) ran in 0.875 (float32)
# and 0.95 (float64) of the time in chunks of 16 planes; at 256^3, balanced either way,
# in 1.02-1.03 (C built as polyad emits it, 21-31 interleaved rounds, AVX2). The finer
# chunks recompute their lead-in four times as often: they are taken where they keep the
# threads busier by more than FINE_COST. (The deconvolution gradient's chunks recompute 8
# steps: a fourth of a chunk of 16 rows, more than the balance would gain.)
FINE_CHUNK_ROWS = 16
FINE_LEAD_IN = 2
FINE_COST = 0.05
# A call runs a fused chain when its chunks keep every thread busy for at least this
# share of the busiest thread's time: fusing gained 10-30 % where the threads balance
# (the deconvolution gradient at 2048^2, the 3-D stencil's at 256^3), and lost 8-68 %
# with one thread idle or one running twice the others' chunks (64-192 planes of
# 256^2 doubles, images of 64-100 rows, on 2 threads; 2.3x with 8 planes of 4096^2).
BALANCED = 0.8
# ... and only a call of at least this many points (the product of the sizes) runs the
# unfused schedule, which costs a compilation (1-5 s) on first use: below it, where the
# fused call takes well under a millisecond, an idle thread costs less than that
# compilation would in thousands of calls.
UNFUSED_FROM_POINTS = 1 << 20
# The rows of a buffer of rows sit this many bytes more than a row apart. Where a row
# is a multiple of 4 KiB (N = 512 doubles, 1024 floats, ...), the rows that one step
# reads and writes (5 of t and 5 of d_r in the deconvolution gradient) fall into the
# same L1 sets and alias the loads on the stores: padded, the deconvolution gradient
# ran in 5.66 instead of 6.71 ms at 2048^2 f64, 22.9 instead of 25.9 at 4096^2, its
# forward in 2.69 instead of 3.15 ms at 2048^2. (Buffers of planes are not padded: the
# 3-D stencil's gradient ran no faster with its rows padded.)
ROW_PAD_BYTES = 128
# A rolling buffer inside a nest's outer loops (``fuse_rows_inside``) keeps at most this
# many rows: a few rows of each channel stay in cache, a wide window's would not.
ROLLING_ROWS = 8
# A row loop of a fused step (``jam_row_loops``) walks at most this many rows, each an
# address the C compiler keeps in a general register through the loop (``x[m + 4, n -
# 2]`` and ``x[m + 4, n + 2]``: one row). x86-64 has 16, less the stack pointer, the
# loop's iterator and bound and the scratch registers of the body. The deconvolution
# gradient's step jammed into one loop walked 13 rows, and gcc reloaded 4-6 of their
# addresses from the stack at every iteration; its d_t row (5 rows of d_r) in a loop of
# its own, 9 and 6 rows, ran in 0.84-0.93 of the time at 2048^2 and 4096^2 in float32,
# 0.96-0.97 in float64 (2 threads, C edited by hand, interleaved runs).
ROW_STREAMS = 10


def chunk_loop_vars(kernel: ir.Kernel) -> set:
    """The variables of the chunk loops of ``kernel``'s fused chains (those its row
    buffers are kept per iteration of)."""
    return {t.chunk for t in kernel.temps if t.role == "rows"}


def _chunk_loop(var: str, extent: ir.Expr, rows: int) -> Loop:
    """The loop over the ``ceil(extent / rows)`` chunks of a loop of ``extent`` rows."""
    return Loop(var, _i(0), Binary("//", _add(extent, _i(rows - 1)), _i(rows), ir.i64))


def _chunked_extent(chunk_loop: Loop) -> ir.Expr:
    """The ``extent`` of the loop ``_chunk_loop(var, extent)`` cuts into chunks."""
    return chunk_loop.hi.a.a


def chunk_schedule(extents: list, points: int, threads: int, small: bool = False,
                   fine: bool = False) -> str:
    """The schedule a call of ``points`` points (the product of its sizes) on ``threads``
    threads runs, where a default compilation fused chains whose chunked loops have
    ``extents`` rows: ``"fused"`` (chunks of ``CHUNK_ROWS`` rows), ``"fine"`` (chunks of
    ``FINE_CHUNK_ROWS`` rows, where the kernel has that schedule: ``fine``) or
    ``"unfused"``. A call of fewer than ``UNFUSED_FROM_POINTS`` points runs the fused
    chains; one with a size below its bound of the fused code's separated loops
    (``small``: the code runs its loops with the pieces as conditions inside,
    ``poly.large_sizes``) the unfused schedule; else the finer chunks where they keep
    every thread busy for at least ``BALANCED`` of the busiest one's time and more than
    ``1 + FINE_COST`` times the share the coarse ones do, the coarse chunks where they
    keep that ``BALANCED`` share, the unfused schedule where not."""
    if points < UNFUSED_FROM_POINTS:
        return "fused"
    if small:
        return "unfused"
    coarse = min((chunk_balance(e, threads, CHUNK_ROWS) for e in extents), default=1.0)
    if fine and extents:
        finer = min(chunk_balance(e, threads, FINE_CHUNK_ROWS) for e in extents)
        if finer >= BALANCED and finer > coarse * (1 + FINE_COST):
            return "fine"
    return "fused" if coarse >= BALANCED else "unfused"


def chunk_balance(extent: int, threads: int, rows: int) -> float:
    """The busy share of the threads in a loop of ``extent`` rows cut into chunks of
    ``rows`` rows and dealt to ``threads`` threads round-robin (``schedule(static, 1)``):
    the average thread's rows over the busiest thread's (1.0: none idle)."""
    if threads <= 1 or extent <= 0:
        return 1.0
    full, rest = divmod(extent, rows)
    busiest = max(rows * -(-(full - t) // threads) + (rest if t == full % threads else 0)
                  for t in range(min(threads, full + (rest > 0))))
    return extent / (threads * busiest)


def _i(v: int) -> Const:
    return Const(v, ir.i64)


def _add(a: ir.Expr, b: ir.Expr) -> ir.Expr:
    return Binary("+", a, b, ir.i64)


def _sub(a: ir.Expr, b: ir.Expr) -> ir.Expr:
    return Binary("-", a, b, ir.i64)


def _mul(a: ir.Expr, b: ir.Expr) -> ir.Expr:
    return Binary("*", a, b, ir.i64)


def _cmp(op: str, a: ir.Expr, b: ir.Expr) -> ir.Expr:
    return Binary(op, a, b, ir.boolean)


def _written_arrays(nest: list) -> set:
    return {st.target.array for st in nest if isinstance(st.target, Load)}


def _written_scalars(nest: list) -> set:
    return {st.target.name for st in nest if isinstance(st.target, ScalarRef)}


def _written(nest: list) -> set:
    """The arrays and scalars the statements of ``nest`` write."""
    return _written_arrays(nest) | _written_scalars(nest)


def _used(st: ir.Statement) -> set:
    return st.read_names() | {st.target_name}


def _outer_loop(nest: list) -> Optional[Loop]:
    """The loop every statement of the nest runs in, ascending with step 1, else None."""
    first = nest[0].loops[0]
    if first.step != 1 or any(st.loops[0] != first or st.position[:1] != nest[0].position[:1]
                              for st in nest):
        return None
    return first


def _same_range(a: Loop, b: Loop) -> bool:
    rename = {a.var: LoopVar(b.var)}
    return (ir.substitute(a.lo, rename), ir.substitute(a.hi, rename)) == (b.lo, b.hi)


def _producer_ok(kernel: ir.Kernel, nest: list, later: list, between: list) -> str:
    """'' when ``nest`` may produce for the ``later`` members (see the module docstring),
    else why not."""
    temps = {t.name: t for t in kernel.temps}
    names = {st.name for st in nest}
    later_names = {st.name for st in later}
    sums = _sums(kernel, nest, later)
    if not _written_arrays(nest) - sums:
        return "it writes no array for a later nest, only sums into kernel arrays"
    for v in sorted(_written_arrays(nest) - sums):
        t = temps.get(v)
        if t is None:
            return f"it writes {v!r}, a kernel parameter"
        if t.zero:
            return f"it adds into the zero-filled {v!r}"
        if t.role == "rows":
            return f"{v!r} is already a row buffer"
        if not any(st.reads_variable(v) for st in later):
            return f"no later nest reads {v!r}"
        # the windows and buffer heights follow the rows the producer writes and the
        # later members read; a later member's write of a row (an update in place of a
        # copied in-out array, at a row no window bounds) would go to whatever row the
        # slot holds then (fuzz seed 14518)
        rewritten = [st for st in later if st.target_name == v]
        if rewritten:
            return f"{rewritten[0].owner}, a later nest, writes {v!r} too"
        for st in kernel.statements:
            if st.name not in names and st.name not in later_names and st.accesses(v):
                return f"{v!r} is also used by {st.owner}, outside the chain"
    for s in sorted(_written_scalars(nest)):
        outside = [st for st in kernel.statements if st.name not in names and st.accesses(s)]
        if outside:
            return f"scalar {s!r} is also used by {outside[0].owner}"
    reads = set().union(*(st.read_names() for st in nest)) - sums
    for st in later + between:
        if isinstance(st.target, Load) and st.target.array in reads:
            return f"{st.owner} writes {st.target.array!r}, which it reads"
        if isinstance(st.target, ScalarRef) and st.target.name in reads:
            return f"{st.owner} writes {st.target.name!r}, which it reads"
    for st in between:
        if _used(st) & _written(nest):
            return f"{st.owner}, between the nests, uses what it writes"
    return ""


def _sums(kernel: ir.Kernel, nest: list, later: list) -> set:
    """Kernel arrays the producer ``nest`` only adds into, and that neither it nor the
    ``later`` members read otherwise (``d_f[k] += d_r * t[m + k - 2, n]``): each chunk
    runs those updates for its own rows only (``_rewrite``), so every term is added once,
    in another order (a sum's, as a parallel reduction's)."""
    params = {p.name for p in kernel.params if p.is_array}
    return {v for v in _written_arrays(nest) & params if only_added_into(v, nest + later)}


def _const_range(s: isl.Set) -> Optional[tuple[int, int]]:
    """(min, max) of a 1-d set over all parameter values, or None when unbounded/empty."""
    n = s.dim(isl.dim_type.param)
    s = s.move_dims(isl.dim_type.set, 1, isl.dim_type.param, 0, n) \
        .project_out(isl.dim_type.set, 1, n)
    if s.is_empty() or not s.is_bounded():
        return None
    return int(str(s.dim_min_val(0))), int(str(s.dim_max_val(0)))


def _join(ranges: list) -> Optional[tuple[int, int]]:
    if not ranges or any(r is None for r in ranges):
        return None
    return min(r[0] for r in ranges), max(r[1] for r in ranges)


def _row_offsets(model: PolyModel, st: ir.Statement, ld: Load, dim: int = 0,
                 depth: int = 0) -> Optional[tuple[int, int]]:
    """The range of (index ``dim`` of ``ld``) - (the loop at ``depth``) over the statement's
    domain (ISL), or None when unbounded: by default, the row of ``ld`` relative to the
    outer iterator."""
    acc = model.access_map(st, ld).intersect_domain(model.domain(st))
    n_out = acc.dim(isl.dim_type.out)
    rows = acc.project_out(isl.dim_type.out, dim + 1, n_out - dim - 1) \
        .project_out(isl.dim_type.out, 0, dim).reset_tuple_id(isl.dim_type.out)
    own = model.value_map(st, LoopVar(st.loops[depth].var))
    return _const_range(own.reverse().apply_range(rows).deltas())


def _outer_map(model: PolyModel, st: ir.Statement) -> isl.Map:
    """{ S[i0, i1, ...] -> [i0] } over the statement's domain."""
    return model.value_map(st, LoopVar(st.loops[0].var))


def _flow_distances(model: PolyModel, flow: isl.UnionMap, src: list, dst: list) \
        -> Optional[tuple[int, int]]:
    """The range of (sink outer iterator) - (source outer iterator) of the flow dependences
    from statements ``src`` to ``dst``; None when there are none or it is unbounded."""
    outer = {st.name: _outer_map(model, st) for st in src + dst}
    ranges = []
    for m in maps_of(flow):
        a, b = m.get_tuple_name(isl.dim_type.in_), m.get_tuple_name(isl.dim_type.out)
        if a in outer and b in outer and a in {s.name for s in src} \
                and b in {s.name for s in dst}:
            d = m.apply_domain(outer[a]).apply_range(outer[b]).deltas()
            if not d.is_empty():
                ranges.append(_const_range(d))
    return _join(ranges) if ranges else None


def _chain(kernel: ir.Kernel, nests: dict, order: list, q: int) -> tuple[list, str]:
    """The members (positions, first producer first, ``q`` last) of the longest chain ending
    at nest ``q``, and why it stops where the nest before it writes an array the chain
    reads ('' otherwise)."""
    members, between, why = [q], [], ""
    loop = _outer_loop(nests[q])
    if loop is None or len(nests[q][0].loops) < 2:
        return members, why
    k = order.index(q)
    while k > 0:
        k -= 1
        p = order[k]
        if p not in nests:
            between = [st for st in kernel.statements if st.position[0] == p] + between
            continue
        nest = nests[p]
        later = [st for m in members for st in nests[m]]
        feeds = any(st.reads_variable(v) for v in _written_arrays(nest) for st in later)
        ploop = _outer_loop(nest)
        if ploop is None or not _same_range(ploop, loop):
            why = f"the nest of {_owners(nest)} runs in another outer loop" if feeds else ""
            break
        reason = _producer_ok(kernel, nest, later, between)
        if reason:
            why = f"the nest of {_owners(nest)} is no producer: {reason}" if feeds else ""
            break
        members.insert(0, p)
    return members, why


def _owners(nest: list) -> str:
    return ", ".join(sorted({st.owner for st in nest}, key=_natural))


def _natural(name: str):
    digits = "".join(ch for ch in name if ch.isdigit())
    return (len(digits), digits, name)


def fuse_pipelines(kernel: ir.Kernel, model: Optional[PolyModel] = None,
                   every: bool = True, rows: int = CHUNK_ROWS) -> tuple[ir.Kernel, list]:
    """Fuse chains of producer and consumer nests through rolling row buffers (module
    docstring). ``every=False`` (the default mode of ``pa.compile``): only chains where a
    producer runs ahead (a row read in the step that writes it is what
    ``fuse_along_shared_loops`` and ``rows_per_iteration`` keep as one row, without
    chunks). Buffers of planes are fused too: the 3-D stencil gradient with 3 planes per
    thread ran 14-25 % faster at 256^3 and 512^3 (at 512^3 f64, 6 MiB of planes per
    thread, past the L2), and where a fused chain's chunks would leave threads idle the
    call runs the unfused schedule (``chunked_extents``). ``rows``: the rows of a chunk.
    Returns the kernel and one line per fused chain, or per chain not fused, saying why."""
    decisions = []
    done: set = set()
    while True:
        nests = loop_nests(kernel)
        order = sorted({st.position[0] for st in kernel.statements})
        for q in reversed(order):
            if q not in nests or q in done:
                continue
            done.add(q)
            members, why = _chain(kernel, nests, order, q)
            if why:  # (where the chain stops, whether or not it has a producer)
                decisions.append(f"not fused: {why}")
            if len(members) < 2:
                continue
            fused, text = _fuse(kernel, model, [nests[p] for p in members], every, rows)
            if fused is None:
                decisions.append(text)
                continue
            kernel = fused
            decisions.append(text)
            break
        else:
            return kernel, decisions


def _fuse(kernel: ir.Kernel, model: Optional[PolyModel], chain: list, every: bool,
          rows: int):
    """(fused kernel, decision) or (None, why not) for the nests ``chain`` (producers
    first, the consumer last); ``every``: also where no producer runs ahead; ``rows``: the
    rows of a chunk (``fuse_pipelines``)."""
    pm = model_of(kernel, model)
    # what each producer writes for the later members (its sums into kernel arrays aside)
    sums = [_sums(kernel, n, [st for b in chain[j + 1:] for st in b])
            for j, n in enumerate(chain[:-1])] + [set()]
    produced = [_written_arrays(n) - sums[j] for j, n in enumerate(chain[:-1])]
    temps = sorted(set().union(*produced))
    flat = [v for v in temps if len(kernel.array_type(v).shape) < 2]
    if flat:
        return None, f"not fused: {flat[0]!r} has no rows (one dimension)"
    deps = dependences(pm, variables=set(temps), flow_only=frozenset(temps))
    writer = {v: j for j, written in enumerate(produced) for v in written}
    k = len(chain)
    # flow distances along the outer loop, per (producer j, reader b)
    dist: dict = {}
    for v in temps:
        flow = deps.flow.get(v)
        j = writer[v]
        for b in range(j + 1, k):
            readers = [st for st in chain[b] if st.reads_variable(v)]
            if not readers:
                continue
            d = None if flow is None else _flow_distances(pm, flow, chain[j], readers)
            if d is None:
                return None, (f"not fused: the nest of {_owners(chain[b])} reads {v!r} outside the "
                              f"window ISL can bound along the outer loop")
            dist[j, b] = _join([dist[j, b], d]) if (j, b) in dist else d
    shift = [0] * k
    back = [0] * k
    for j in range(k - 2, -1, -1):
        leads = [shift[b] - d[0] for (a, b), d in dist.items() if a == j]
        backs = [back[b] + d[1] for (a, b), d in dist.items() if a == j]
        shift[j] = max([0] + leads)
        back[j] = max([0] + backs)
    lead_in = max(back[j] + shift[j] for j in range(k))
    if lead_in == 0 and not every:
        return None, ("not fused: every row is read in the step that writes it, which needs "
                      "no rolling buffer (fuse=True fuses it)")
    # buffer heights: the slot of row r is reused by row r + W after r's last read
    heights = {}
    for v in temps:
        j = writer[v]
        w = _join([_row_offsets(pm, st, st.target) for st in chain[j]
                   if isinstance(st.target, Load) and st.target.array == v])
        need = []
        for b in range(j + 1, k):
            for st in chain[b]:
                for ld in [ld for e in st.exprs() for ld in ir.loads(e) if ld.array == v]:
                    need.append((b, _row_offsets(pm, st, ld)))
        if w is None or any(r is None for _, r in need):
            return None, f"not fused: the rows of {v!r} written or read are not bounded"
        heights[v] = max(shift[j] + w[1] - shift[b] - r[0] for b, r in need) + 1
    return _rewrite(kernel, chain, temps, shift, back, lead_in, heights, sums, rows)


def jam_row_loops(kernel: ir.Kernel, model: Optional[PolyModel] = None) \
        -> tuple[ir.Kernel, list[str]]:
    """Run consecutive loops of a fused chain's row step as one loop.

    ``fuse_pipelines`` leaves each member's loop over the row (``n``) apart inside the
    step over ``m``: the deconvolution gradient's step computes row ``m + 4`` of ``t``
    from ``x``, then row ``m + 2`` of ``r`` and ``d_r`` from ``t``, then row ``m`` of
    ``d_t`` from ``d_r``, each a pass over the row buffers. Run as one loop over ``n``,
    each value is used while in a register, the reads of ``x`` and ``y`` (the two
    streams from memory) overlap each other and the arithmetic, and the row buffers
    are walked once: the loop a careful engineer writes by hand.

    Legality: two consecutive loops of a chunked step (the same loop, ascending, with
    nothing between them), whose statements share no scalar, are run as one when no
    element both touch (one of them writing it) is touched in different iterations of
    the loop within one step (``distribute.conflicts_across_iterations``,
    memory-based): every dependence between the two then joins instances of the same
    iteration, where the first's statements still run before the second's, and each
    loop's own instances keep their order. The ``d_x`` loop, which reads ``d_t`` two
    columns either side, stays a loop of its own.

    A second loop that cannot join whole may give up part of its body
    (``_jammable_part``): the statements that touch no element of the second loop's other
    statements (one of them writing it) and, taken alone, meet the test above join the
    first loop. The deconvolution gradient's ``d_f`` sums, ``d_f[k] += d_t[n] * x[m, n +
    k - 2]``, read ``d_t`` in the iteration that writes it; with the ``d_t`` row they use
    its value while in a register and walk ``x``'s row in the same pass, where in the
    ``d_x`` loop they loaded both again (at 4096 x 4096 in float32 the gradient ran in
    0.90-0.91 of the time). Legality: the moved statements keep their order among
    themselves, and run before the rest of their loop where they ran in between; no
    element passes between the two parts, so each sees what it saw before. Returns the
    kernel and one line per joined pair.

    Two innermost loops that would walk more than ``ROW_STREAMS`` rows together stay
    apart (a decision line says so): the addresses of their rows would not fit the
    general registers. (Row loops around inner loops are joined without that limit:
    their inner loops stay apart, each walking its own rows.)
    """
    decisions = []
    locals_ = {n for n, _ in kernel.locals}
    chunk_loops = chunk_loop_vars(kernel)
    declined: set = set()
    while True:
        for first, second in _adjacent_row_loops(kernel, chunk_loops):
            if _names(first) & _names(second) & locals_:
                continue
            rest: list = []
            if conflicts_across_iterations(model_of(kernel, model), first, second, 2, 3):
                second, rest = _jammable_part(model_of(kernel, model), first, second)
                if not second:
                    continue
            where = f"(loop {first[0].loops[2].var} inside {first[0].loops[1].var})"
            innermost = all(len(st.loops) == 3 for st in first + second)
            rows = len(row_streams(first + second)) if innermost else 0
            if rows > ROW_STREAMS:
                pair = (_owners(first), _owners(second))
                if pair not in declined:
                    declined.add(pair)
                    decisions.append(
                        f"kept the row loop of {pair[1]} apart from that of {pair[0]} {where}: "
                        f"as one loop they would walk {rows} rows, more than the "
                        f"{ROW_STREAMS} whose addresses stay in registers")
                continue
            kernel = _fused_at(kernel, first, second, 3)
            kept = (f"; {_owners(rest)} keep their own loop (reading what it writes in other "
                    f"iterations) and share nothing with the statements moved" if rest else "")
            decisions.append(
                f"jammed the row loop of {_owners(second)} into that of {_owners(first)} "
                f"{where}: what one reads of the other is accessed in the same iteration"
                + kept)
            break
        else:
            return kernel, decisions


def _jammable_part(model: PolyModel, first: list, second: list) -> tuple[list, list]:
    """(the statements of ``second`` that may join ``first``'s row loop without the rest
    of ``second``, the rest) for ``jam_row_loops``: the rest is the statements whose
    accesses meet ``first``'s in different iterations of the row loop, and every
    statement that shares an array or a scalar with the rest, one of them writing it
    (the ``d_x`` gather's pieces, and with them the zeroing of ``d_x``); ([], second)
    when nothing is left to move."""
    rest = [st for st in second if conflicts_across_iterations(model, first, [st], 2, 3)]
    part = [st for st in second if st not in rest]
    while True:
        written, used = _written(rest), _names(rest)
        tied = [st for st in part if _used(st) & written or _written([st]) & used]
        if not tied:
            break
        rest += tied
        part = [st for st in part if st not in tied]
    if not part or not rest:
        return [], second
    return part, [st for st in second if st in rest]


def row_streams(statements: list) -> set:
    """The rows that a step's loop over the statements' row loop (their third and
    innermost loop, inside the step loop, their second) walks: an array's elements
    whose indices other than those naming the row loop's variable are the same affine
    values (``t_rows[(m + 4) % 5, n - 1]``, ``t_rows[(m + 2 + 2) % 5, n]`` and
    ``t_rows[(m - 1) % 5, n]`` are one row).
    A row fixed along the step (``t_rows[0, n]``, ``t_rows[(M - 1) % 5, n]``) counts
    only where no access walks the array's rows with the step (``d_t_rows[0, n]``, a
    buffer of one row): beside moving rows, it is a clamped border's, read by the border
    pieces in the steps where it stands for a moving row."""
    moving, fixed = set(), set()
    for st in statements:
        var, step = st.loops[2].var, st.loops[1].var
        accesses = st.reads() + ([st.target] if isinstance(st.target, Load) else [])
        for access in accesses:
            along = [ir.uses_loop_vars(ix, {var}) for ix in access.index]
            if not any(along):
                continue
            row = (access.array, tuple(None if a else _affine_key(ix)
                                       for ix, a in zip(access.index, along)))
            moves = any(ir.uses_loop_vars(ix, {step})
                        for ix, a in zip(access.index, along) if not a)
            (moving if moves else fixed).add(row)
    walked = {array for array, _ in moving}
    return moving | {row for row in fixed if row[0] not in walked}


def _affine_key(e: ir.Expr):
    """A value equal for equal affine integer expressions (``ad.exprs.affine_form``; the
    constant term of a ``%``'s operand taken modulo the divisor, as the value is), else
    ``e``."""
    form = affine_form(e)
    if form is None:
        return e
    terms, const = form
    return frozenset((_atom_key(atom), c) for atom, c in terms.items()), const


def _atom_key(atom: ir.Expr):
    """An atom of ``affine_form``: a variable, or ``//`` / ``%`` of an affine operand by a
    constant, keyed by that operand's form."""
    if not (isinstance(atom, Binary) and atom.op in ("//", "%")):
        return atom
    terms, const = affine_form(atom.a)
    divisor = atom.b.value
    return (atom.op, frozenset((_atom_key(t), c) for t, c in terms.items()),
            const % divisor if atom.op == "%" else const, divisor)


def _adjacent_row_loops(kernel: ir.Kernel, chunk_loops: set) -> list:
    """Pairs of statement groups, each the statements at one position of a chunked nest's
    step (chunk loop, step loop) that run in loops over one range at depth 3 (a zeroing
    loop of its own variable among them: the schedule runs loops at one position as one),
    the second right after the first in the step."""
    steps: dict = {}
    for st in kernel.statements:
        if st.loops and st.loops[0].var in chunk_loops and len(st.loops) >= 2:
            steps.setdefault(st.position[:2], {}).setdefault(st.position[2], []).append(st)
    pairs = []
    for members in steps.values():
        order = sorted(members)
        for a, b in zip(order, order[1:]):
            first, second = members[a], members[b]
            loop = first[0].loops[2] if len(first[0].loops) > 2 else None
            if (loop is not None and loop.step > 0
                    and all(len(st.loops) > 2 and st.loops[2].step == loop.step
                            and _same_range(st.loops[2], loop) for st in first + second)):
                pairs.append((first, second))
    return pairs


def _fresh(kernel: ir.Kernel, name: str) -> str:
    """``name``, or it with underscores in front, used by no name of ``kernel`` (arrays
    and statements share ISL's tuple names; scalars, sizes and loops the C scope)."""
    taken = ({p.name for p in kernel.params} | {t.name for t in kernel.temps}
             | {n for n, _ in kernel.locals} | set(kernel.sizes)
             | {lp.var for st in kernel.statements for lp in st.loops}
             | {st.name for st in kernel.statements})
    while name in taken:
        name = "_" + name
    return name


def _rewrite(kernel: ir.Kernel, chain: list, temps: list, shift: list, back: list,
             lead_in: int, heights: dict, sums: list, rows: int):
    """The kernel with the nests of ``chain`` in one nest of chunks of ``rows`` rows at the
    consumer's position (module docstring), and the decision text. ``sums[j]``: the kernel
    arrays member ``j`` only adds into (``_sums``), whose updates run for the chunk's own
    rows only."""
    consumer = chain[-1]
    loop = consumer[0].loops[0]
    m = loop.var
    chunk = _fresh(kernel, f"{m}_chunk")
    rows_name = {v: _fresh(kernel, f"{v}_rows") for v in temps}
    c, step = LoopVar(chunk), LoopVar(m)
    extent = loop.hi if loop.lo == _i(0) else _sub(loop.hi, loop.lo)
    ch = _i(rows)
    start = _mul(c, ch)                                    # first row of the chunk - lo
    chunk_loop = _chunk_loop(chunk, extent, rows)
    step_loop = Loop(m, _sub(_add(loop.lo, start), _i(lead_in)), _add(_add(loop.lo, start), ch))
    position = consumer[0].position[0]
    out = {}
    base = 0
    for j, nest in enumerate(chain):
        var = nest[0].loops[0].var
        row = _add(step, _i(shift[j])) if shift[j] else step
        own = _sub(row, loop.lo)
        conds = (Condition(_cmp(">=", own, _sub(start, _i(back[j])))),
                 Condition(_cmp(">=", own, _i(0))),
                 Condition(_cmp("<", row, loop.hi)))
        # a producer's sums into kernel arrays: the chunk's own rows only (the rows before
        # them are the previous chunk's, recomputed here for the buffers)
        own_rows = (Condition(_cmp(">=", own, start)), Condition(_cmp("<", own, _add(start, ch))))
        rename = {var: row}
        width = max(st.position[1] for st in nest) + 1 if len(nest[0].position) > 1 else 1

        def to_rows(x, rename=rename):
            # (bottom-up: the index is already renamed)
            if isinstance(x, Load) and x.array in rows_name:
                # (a buffer of one row: its only slot, not the row modulo 1)
                head = (Binary("%", x.index[0], _i(heights[x.array]), ir.i64)
                        if heights[x.array] > 1 else _i(0))
                return Load(rows_name[x.array], (head,) + x.index[1:], x.dtype)
            if isinstance(x, LoopVar) and x.name in rename:
                return rename[x.name]
            return None

        for st in nest:
            inner = tuple(Loop(lp.var, ir.map_expr(lp.lo, to_rows), ir.map_expr(lp.hi, to_rows),
                               lp.step) for lp in st.loops[1:])
            mapped = st.map_exprs(to_rows)
            out[st.name] = dataclasses.replace(
                mapped, loops=(chunk_loop, step_loop) + inner,
                position=(position, 0, base + st.position[1]) + st.position[2:],
                conditions=mapped.conditions + conds
                + (own_rows if st.target_name in sums[j] else ()))
        base += width
    statements = tuple(sorted((out.get(st.name, st) for st in kernel.statements),
                              key=lambda s: s.position))
    new_temps = []
    for t in kernel.temps:
        if t.name in rows_name:
            shape, padded = (_i(heights[t.name]),) + t.type.shape[1:], ""
            dtype = t.type.dtype
            if heights[t.name] > 1 and len(shape) == 2 and not dtype.packed:
                pad = ROW_PAD_BYTES // dtype.np.itemsize
                shape, padded = (shape[0], _add(shape[1], _i(pad))), f", {pad} elements of padding"
            new_temps.append(ir.Temp(
                rows_name[t.name], dataclasses.replace(t.type, shape=shape), zero=False,
                role="rows", holds=f"rows of {t.name} (row r in slot r mod {heights[t.name]}"
                                   f"{padded}) for a chunk of {rows} rows of {m}",
                chunk=chunk))
        else:
            new_temps.append(t)
    fused = dataclasses.replace(kernel, statements=statements, temps=tuple(new_temps))
    producers = "; ".join(f"{_owners(n)} {shift[j]} row{'s' * (shift[j] != 1)} ahead"
                          for j, n in enumerate(chain[:-1]))
    kept = ", ".join(f"{v} kept as {heights[v]} row{'s' * (heights[v] != 1)} per thread "
                     f"({rows_name[v]})" for v in temps)
    why = ("buffered, not recomputed per reading row: each buffered row is read by several "
           "rows" if any(heights[v] > 1 for v in temps) else "each row is read in the step "
           "that writes it")
    text = (f"fused the nests of {', '.join(_owners(n) for n in chain[:-1])} into the nest of "
            f"{_owners(consumer)} at depth 1 (loop {m}; {producers}): {kept}; the loop over {m} "
            f"runs in chunks of {rows} rows, each recomputing the {lead_in} producer "
            f"steps before its first row; {why}")
    return fused, text


def chunked_extents(kernel: ir.Kernel) -> tuple:
    """The extents (IR expressions of the sizes) of the loops that fused chains of
    ``kernel`` run in chunks of ``CHUNK_ROWS`` rows, one per chunk loop. A chunk loop has
    ``ceil(extent / CHUNK_ROWS)`` iterations, one thread each: where that leaves threads
    idle (a 3-D stencil of 100 planes, a 2-D image of 64 rows, on 2 threads) the default
    compilation runs finer chunks or the unfused schedule instead, for calls of
    ``UNFUSED_FROM_POINTS`` points or more (``chunk_schedule``, ``runtime.loader``)."""
    chunks = chunk_loop_vars(kernel)
    extents = {st.loops[0].var: _chunked_extent(st.loops[0]) for st in kernel.statements
               if st.loops and st.loops[0].var in chunks}
    return tuple(extents[c] for c in sorted(extents))


def chunk_lead_in(kernel: ir.Kernel) -> int:
    """The most producer steps a chunk of ``kernel``'s fused chains recomputes before its
    first row (its step loop starts at ``lo + start - lead_in``, ``_rewrite``)."""
    chunks = chunk_loop_vars(kernel)
    return max((st.loops[1].lo.b.value for st in kernel.statements
                if st.loops and st.loops[0].var in chunks), default=0)


def fuse_along_shared_loops(kernel: ir.Kernel, model: Optional[PolyModel] = None) \
        -> tuple[ir.Kernel, list[str]]:
    """Run a loop nest inside the outer loops it shares with the nest before it.

    The conv layer's gradient computes ``d_s_expanded[b, co, h, :]`` (a row) in one nest
    over ``b, co, h`` and sums the filter gradient over it in the next, also over
    ``b, co, h``: the second reads the row from memory, with the rows of ``x`` the first
    already read. Fused along the shared loops, the second nest's statements run in the
    same iteration, after the first's, while the rows are in cache: the hand-written
    pass a careful engineer writes.

    Two nests at consecutive top-level positions, the second reading a temporary the first
    writes (kernel arrays are left to the schedule: PolyBench's 2mm keeps its nests,
    which tiling serves better), whose statements all share the same
    ``c`` outer loops (ascending, the same variables and bounds), are fused at the
    deepest ``c`` where no element both nests touch (one of them writing it) is touched
    in different iterations of those loops (``distribute.conflicts_across_iterations``,
    memory-based): then every dependence between the two nests stays inside one
    iteration, where the first's statements still run before the second's, and each
    nest's own instances keep their order. They share no scalar. Both nests' outermost
    loop must carry no dependence but sums' (``gather.iterations_independent_but_sums``),
    so the fused loop is as parallel as each was. For targets whose threads run whole
    loops (the fused loop's iterations then hold both nests' work for one thread).
    Returns the kernel and one line per fusion.
    """
    decisions = []
    locals_ = {n for n, _ in kernel.locals}
    temps = {t.name for t in kernel.temps}
    while True:
        nests = loop_nests(kernel)
        order = sorted(nests)
        for p, q in zip(order, order[1:]):
            first, second = nests[p], nests[q]
            if any(p < st.position[0] < q for st in kernel.statements):
                continue  # a statement outside loops between them
            if _names(first) & _names(second) & locals_:
                continue
            if not _written_arrays(first) & temps & {n for st in second for n in st.read_names()}:
                continue  # it reads no temporary the first writes: no row to find in cache
            c = min(common_depth(first), common_depth(second))
            loops = first[0].loops
            while c and loops[:c] != second[0].loops[:c]:
                c -= 1
            if not c or any(lp.step <= 0 for lp in loops[:c]):
                continue
            nest_model = model_of(kernel, model)
            while c and conflicts_across_iterations(nest_model, first, second, 0, c):
                c -= 1
            if not c or not all(iterations_independent_but_sums(kernel, model, nest, 1)
                                for nest in (first, second)):
                continue
            kernel = _fused_at(kernel, first, second, c)
            decisions.append(
                f"fused the nest of {', '.join(sorted({st.owner for st in second}))} into that "
                f"of {', '.join(sorted({st.owner for st in first}))} inside the loops "
                f"{', '.join(lp.var for lp in loops[:c])}: what it reads of the first is "
                f"written in the same iteration (still in cache)")
            break
        else:
            return kernel, decisions


def _names(nest: list) -> set:
    return set().union(*[_used(st) for st in nest])


def _fused_at(kernel: ir.Kernel, first: list, second: list, c: int) -> ir.Kernel:
    """``second``'s statements moved into ``first``'s ``c`` outer loops, after its body."""
    offset = max(st.position[c] for st in first) + 1 - min(st.position[c] for st in second)
    moved = {st.name: dataclasses.replace(
        st, position=first[0].position[:c] + (st.position[c] + offset,) + st.position[c + 1:])
        for st in second}
    return dataclasses.replace(kernel, statements=tuple(sorted(
        (moved.get(st.name, st) for st in kernel.statements), key=lambda s: s.position)))


def rows_per_iteration(kernel: ir.Kernel) -> tuple[ir.Kernel, list[str]]:
    """Keep a temporary that each iteration of a nest's outer loops writes and reads only
    one row of as that row, one per thread.

    Once the deconvolution gradient's ``d_t`` pass and ``d_x`` pass share the loop over
    rows (``fuse_along_shared_loops``, with ``d_t``'s border rows gathered and zeroed in
    their iterations), iteration ``m`` writes row ``m`` of ``d_t`` and reads it back at
    once: the full image ``d_t`` is written to memory and read into cache for nothing.
    A temporary (not zero-filled: its contents before the nest are never read) every
    access of which lies in one nest and indexes all its dimensions but the last by the
    nest's outer loops becomes ``T_row[n]`` (a ``row`` temporary, one per thread; not a
    slab of several dimensions, which would not stay in cache): different iterations
    touch different rows, so no value passes from one iteration to another through
    ``T``, and nothing outside the nest reads it. The loop test (``schedule.build``) gives each thread its own row
    where a thread runs whole iterations of those loops; elsewhere the row's
    memory-based dependences keep the iterations apart, as for a ``sum row``. For
    targets whose threads run whole loops. Returns the kernel and one line per
    temporary.
    """
    decisions = []
    nests = loop_nests(kernel)
    for t in kernel.temps:
        users = _users_in_one_nest(kernel, t)
        if users is None:
            continue
        nest = nests[users[0].position[0]]
        c = t.type.ndim - 1  # one row: a slab of rows per thread would not stay in cache
        if common_depth(nest) < c or not rows_selected_by_loops(users, t.name, c):
            continue
        outer = [lp.var for lp in nest[0].loops[:c]]
        kernel, name = _kept_per_iteration(kernel, t, users, outer, range(c, t.type.ndim),
                                           "row", f"the row of {t.name}")
        decisions.append(f"{t.name} kept as one row per thread ({name}): each iteration of "
                         f"{', '.join(outer)} writes and reads only its own row of it")
    return kernel, decisions


def _accesses_of(st: ir.Statement, array: str) -> list:
    """The loads of ``array`` in ``st``, its target among them when it writes ``array``."""
    return [ld for e in list(st.exprs()) + [st.target] for ld in ir.loads(e)
            if ld.array == array]


def _users_in_one_nest(kernel: ir.Kernel, t: ir.Temp) -> Optional[list]:
    """The statements accessing temporary ``t``, when it may be kept per iteration of
    loops around them: not zero-filled, not a buffer already, of two dimensions or more,
    accessed inside loops of one nest only; else None."""
    if t.per_thread or t.zero or t.type.ndim < 2:
        return None
    users = [st for st in kernel.statements if st.accesses(t.name)]
    if not users or len({st.position[0] for st in users}) != 1 or not users[0].loops:
        return None
    return users


def _kept_per_iteration(kernel: ir.Kernel, t: ir.Temp, users: list, outer: list, kept,
                        suffix: str, what: str) -> tuple[ir.Kernel, str]:
    """``kernel`` with ``t`` replaced, in its ``users``, by a per-thread buffer (``row``
    role, one per iteration of the loops ``outer``) of its dimensions ``kept``, and the
    buffer's name; ``what`` says in DSL terms what one iteration keeps in it."""
    kept = list(kept)
    name = _fresh(kernel, f"{t.name}_{suffix}")
    buffer = ir.Temp(name, ir.ArrayType(t.type.dtype, tuple(t.type.shape[k] for k in kept)),
                     zero=False, role="row", chunk=" ".join(outer),
                     holds=f"{what} one iteration of {', '.join(outer)} writes and reads, "
                           f"per thread")

    def to_buffer(e):
        if isinstance(e, Load) and e.array == t.name:
            return Load(name, tuple(e.index[k] for k in kept), e.dtype)
        return None

    named = {st.name for st in users}
    statements = tuple(st.map_exprs(to_buffer) if st.name in named else st
                       for st in kernel.statements)
    temps = tuple(buffer if x is t else x for x in kernel.temps)
    return dataclasses.replace(kernel, statements=statements, temps=temps), name


def fuse_rows_inside(kernel: ir.Kernel, model: Optional[PolyModel] = None) \
        -> tuple[ir.Kernel, list[str]]:
    """Run two loops over rows, siblings inside a nest's outer loops, as one loop, the
    second a few rows behind the first, with the temporary that links them kept as a
    rolling buffer of rows per iteration of the outer loops.

    The conv layer's gradient (after ``fuse_along_shared_loops`` and
    ``loop_order.interchange_for_reuse``) runs, per image ``b``::

        for h:  for co:  ...; d_s[b, co, h, v] = ...              (P: writes row h)
        for h:  for ci, co:  d_x[b, ci, h, v] += d_s[b, co, h + 1, v + 1] * w[co, ci, 0, 0]
                             ... (9 taps: rows h - 1 .. h + 1 of d_s)   (Q)

    ``d_s`` (8 MiB per image at 512x512 float32, 8 channels) goes to memory and comes
    back. Fused, step ``h`` runs P's row ``h`` and then Q's row ``h - 1``, whose rows of
    ``d_s`` were written in this step and the two before: ``d_s`` shrinks to 3 rows per
    channel (``d_s_rows[co, h % 3, v]``), one buffer per thread, in cache.

    When. Two loops at consecutive positions below the outer loops (depth at least 1:
    the outer loops keep the nest's parallelism), over the same range with step 1; a
    temporary (not zero-filled, not already a buffer) that P's statements assign and Q's
    read (P may read its own rows back, none it has not yet written: the filter
    gradient's sums read row ``h`` of ``d_s``), which no other statement accesses, each
    access indexing it by the outer loops'
    variables themselves (the same dimensions), by the row loop in one other dimension
    (with a constant offset range from ISL, the access relations over the domains) and
    by neither in the rest. Nothing else links the loops: no array or scalar that one
    writes is accessed by the other (P's sums into kernel arrays included).

    Legality. Only the temporary carries values from P to Q, and Q's instances move
    earlier, each after the P rows it reads: Q's row ``h`` reads rows up to
    ``h + r1`` (``r1``: its largest read offset), the last of them written by P's row
    ``h + r1 - w0`` (``w0``: its smallest write offset), so Q runs ``lag = r1 - w0`` rows
    behind. The slot of row ``r`` is written again by row ``r + height`` only after Q's
    last read of ``r`` and P's: ``height = max(lag + w1 - r0, w1 - p0) + 1`` (``p0``: P's
    smallest read offset). Each iteration of the outer loops
    writes every row of the buffer it reads (the temporary's elements for those outer
    values), so the buffer is private to the iteration (``Temp.chunk_loops``; the loop
    test, ``schedule.build``, checks it on the schedule). For targets whose threads run
    whole loops. Returns the kernel and one line per fusion.
    """
    decisions = []
    while True:
        found = _row_loop_pair(kernel, model)
        if found is None:
            return kernel, decisions
        kernel, text = _rows_fused_inside(kernel, *found)
        decisions.append(text)


def _row_loop_pair(kernel: ir.Kernel, model: Optional[PolyModel]):
    """(P, Q, depth, temporary, row dimension, outer dimensions, lag, height) of the first
    pair of sibling row loops that ``fuse_rows_inside`` fuses, or None."""
    temps = {t.name: t for t in kernel.temps}
    for nest in loop_nests(kernel).values():
        for d, loops_at in inner_loops(nest):
            for key, first in loops_at.items():
                second = loops_at.get(key[:-1] + (key[-1] + 1,))
                if not second:
                    continue
                found = _linked_rows(kernel, model, temps, first, second, d)
                if found is not None:
                    return (first, second, d) + found
    return None


def _linked_rows(kernel: ir.Kernel, model: Optional[PolyModel], temps: dict, first: list,
                 second: list, d: int):
    """(temporary, row dimension, outer dimensions, lag, height) when the loops at depth
    ``d`` of ``first`` (P) and ``second`` (Q) may run as one (``fuse_rows_inside``)."""
    loop = first[0].loops[d]
    outer = first[0].loops[:d]
    if loop.step != 1 or any(st.loops[d] != loop or st.loops[:d] != outer
                             for st in first + second):
        return None
    names = {st.name for st in first + second}
    linked = [v for v in _written_arrays(first) & set(temps)
              if any(st.reads_variable(v) for st in second)]
    if len(linked) != 1:
        return None
    (v,) = linked
    t = temps[v]
    if t.zero or t.per_thread or any(st.accesses(v) for st in kernel.statements
                                     if st.name not in names):
        return None
    if v in _written_arrays(second):
        return None
    if any(_used(st) & _written(first) - {v}
           for st in second) or \
            any(_used(st) & _written(second)
                for st in first):
        return None
    outer_vars = [lp.var for lp in outer]
    accesses = [(st, ld) for st in first + second for ld in _accesses_of(st, v)]
    dims = _row_dims(accesses, outer_vars, loop.var)
    if dims is None:
        return None
    row_dim, outer_dims = dims
    pm = model_of(kernel, model)
    in_first = {st.name for st in first}
    writes = _join([_row_offsets(pm, st, st.target, row_dim, d) for st in first
                    if isinstance(st.target, Load) and st.target.array == v])
    own = [_row_offsets(pm, st, ld, row_dim, d) for st, ld in accesses
           if st.name in in_first and ld is not st.target]
    reads = _join([_row_offsets(pm, st, ld, row_dim, d) for st, ld in accesses
                   if st.name not in in_first])
    own_reads = _join(own) if own else (writes[0], writes[0]) if writes else None
    if writes is None or reads is None or own_reads is None or own_reads[1] > writes[0]:
        return None  # unbounded, or P reading a row before it writes it
    lag = max(0, reads[1] - writes[0])
    height = max(lag + writes[1] - reads[0], writes[1] - own_reads[0]) + 1
    if height > ROLLING_ROWS:
        return None
    return t, row_dim, outer_dims, lag, height


def _row_dims(accesses: list, outer_vars: list, row: str):
    """(the dimension the row loop indexes, the dimensions indexed by the outer loops'
    variables themselves) when every access of ``accesses`` has the outer loops' at the
    same places, uses the row loop in that one other dimension if at all (a clamped
    border's piece reads row 0 itself) and neither kind of variable elsewhere; else
    None."""
    outer_places, row_dims = set(), set()
    for _, ld in accesses:
        places = []
        for k, e in enumerate(ld.index):
            used = [x for x in outer_vars if ir.uses_loop_vars(e, {x})]
            if used:
                if len(used) > 1 or not (isinstance(e, LoopVar) and e.name == used[0]):
                    return None
                places.append((k, e.name))
            elif ir.uses_loop_vars(e, {row}):
                row_dims.add(k)
        if sorted(x for _, x in places) != sorted(outer_vars):
            return None
        outer_places.add(tuple(places))
    if len(outer_places) != 1 or len(row_dims) != 1:
        return None
    return row_dims.pop(), tuple(k for k, _ in outer_places.pop())


def _rows_fused_inside(kernel: ir.Kernel, first: list, second: list, d: int, t: ir.Temp,
                       row_dim: int, outer_dims: tuple, lag: int, height: int):
    """The kernel with ``second``'s loop at depth ``d`` run ``lag`` rows behind inside
    ``first``'s, ``t`` kept as ``height`` rows per iteration of the outer loops."""
    loop = first[0].loops[d]
    row = LoopVar(loop.var)
    fused = Loop(loop.var, loop.lo, _add(loop.hi, _i(lag)) if lag else loop.hi, loop.step)
    name = _fresh(kernel, f"{t.name}_rows")
    kept = [k for k in range(len(t.type.shape)) if k not in outer_dims]
    shape = tuple(_i(height) if k == row_dim else t.type.shape[k] for k in kept)
    padded = ""
    if height > 1 and len(shape) >= 2 and kept[-1] != row_dim and not t.type.dtype.packed:
        pad = ROW_PAD_BYTES // t.type.dtype.np.itemsize
        shape, padded = shape[:-1] + (_add(shape[-1], _i(pad)),), f", {pad} elements of padding"
    outer = [lp.var for lp in first[0].loops[:d]]
    buffer = ir.Temp(name, dataclasses.replace(t.type, shape=shape), zero=False, role="row",
                     holds=f"rows of {t.name} (row r in slot r mod {height}{padded}), per "
                           f"iteration of {', '.join(outer)}", chunk=" ".join(outer))

    def to_rows(x):
        if isinstance(x, Load) and x.array == t.name:
            index = tuple(Binary("%", x.index[k], _i(height), ir.i64) if k == row_dim
                          else x.index[k] for k in kept)
            return Load(name, index, x.dtype)
        return None

    behind = {loop.var: _sub(row, _i(lag))} if lag else {}
    width = max(st.position[d + 1] for st in first) + 1
    prefix = first[0].position[:d + 1]
    out = {}
    for st in first:
        cond = (Condition(_cmp("<", row, loop.hi)),) if lag else ()
        st = st.map_exprs(to_rows)
        out[st.name] = dataclasses.replace(
            st, loops=st.loops[:d] + (fused,) + st.loops[d + 1:],
            conditions=st.conditions + cond)
    for st in second:
        inner = tuple(Loop(lp.var, ir.substitute(lp.lo, behind), ir.substitute(lp.hi, behind),
                           lp.step) for lp in st.loops[d + 1:]) if lag else st.loops[d + 1:]
        moved = st.map_exprs(
            lambda x: behind.get(x.name) if isinstance(x, LoopVar) else None).map_exprs(to_rows)
        cond = (Condition(_cmp(">=", _sub(row, _i(lag)), loop.lo)),) if lag else ()
        out[st.name] = dataclasses.replace(
            moved, loops=st.loops[:d] + (fused,) + inner,
            position=prefix + (width + st.position[d + 1],) + st.position[d + 2:],
            conditions=moved.conditions + cond)
    statements = []
    for st in kernel.statements:
        if st.name in out:
            statements.append(out[st.name])
        elif st.position[:d] == prefix[:-1] and len(st.position) > d \
                and st.position[d] > prefix[-1] + 1:  # later siblings: one place earlier
            statements.append(dataclasses.replace(
                st, position=st.position[:d] + (st.position[d] - 1,) + st.position[d + 1:]))
        else:
            statements.append(st)
    temps = tuple(buffer if x is t else x for x in kernel.temps)
    fused_kernel = dataclasses.replace(
        kernel, statements=tuple(sorted(statements, key=lambda s: s.position)), temps=temps)
    text = (f"fused the loop {loop.var} of {_owners(second)} into that of {_owners(first)} "
            f"inside the loops {', '.join(outer)} ({lag} row{'s' * (lag != 1)} behind): "
            f"{t.name} kept as {height} rows per thread ({name}) instead of "
            f"{'x'.join(ir.expr_str(e) for e in t.type.shape)} elements")
    return fused_kernel, text


def slabs_per_iteration(kernel: ir.Kernel) -> tuple[ir.Kernel, list[str]]:
    """Keep a temporary that each iteration of its users' shared outer loops writes and
    reads only its own slab of (the elements whose indices those loops fix) as that slab,
    one per thread.

    Once the conv layer's filter-gradient sums run for two output channels per pass
    (``loop_order.block_sums_in_registers``), the gradient wrt ``w`` alone runs, per
    ``b, h``, a loop over ``co`` writing ``d_s_expanded[b, co, h, :]`` and then the
    blocked loop over ``co`` reading it: one iteration of ``b, h`` writes and reads the
    ``CO x W`` elements with its own ``b`` and ``h`` (16 KiB at 8 channels of 512
    floats), while the full ``B x CO x H x W`` temporary went to memory and back. A
    temporary (not zero-filled: its contents before the nest are never read) every
    access of which lies in one nest, inside the outer loops all its users share, each
    of those loops' variables indexing it in one dimension by itself, the same dimension
    in every access, becomes the slab of its other dimensions: different iterations of
    those loops touch different elements, so no value passes from one iteration to
    another through it, and nothing outside the nest reads it. The loop test
    (``schedule.build``) gives each thread its own slab where a thread runs whole
    iterations of those loops (``Temp.chunk_loops``). ``rows_per_iteration`` runs first
    and keeps the case of one row, in the order of the loops. For targets whose threads
    run whole loops. Returns the kernel and one line per temporary.
    """
    decisions = []
    for t in kernel.temps:
        users = _users_in_one_nest(kernel, t)
        if users is None:
            continue
        c = common_depth(users)
        outer = [lp.var for lp in users[0].loops[:c]]
        accesses = [ld for st in users for ld in _accesses_of(st, t.name)]
        places = {tuple(next((k for k, e in enumerate(ld.index)
                              if isinstance(e, LoopVar) and e.name == v), None) for v in outer)
                  for ld in accesses}
        if not outer or len(places) != 1:
            continue
        fixed = places.pop()
        if None in fixed or len(fixed) == t.type.ndim or any(
                ir.uses_loop_vars(e, outer) for ld in accesses
                for k, e in enumerate(ld.index) if k not in fixed):
            continue
        kept = [k for k in range(t.type.ndim) if k not in fixed]
        kernel, name = _kept_per_iteration(kernel, t, users, outer, kept, "slab",
                                           f"the elements of {t.name}")
        shape = "x".join(ir.expr_str(t.type.shape[k]) for k in kept)
        decisions.append(f"{t.name} kept as {shape} elements per thread ({name}): each "
                         f"iteration of {', '.join(outer)} writes and reads only its own of "
                         f"them")
    return kernel, decisions
