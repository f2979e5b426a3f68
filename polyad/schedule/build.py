"""Program-order schedule, AST generation and the one dependence test (LoopFacts).

This stage states facts only (what may run in parallel, and which carried
dependences a parallel form must honour); which parallel form a target uses
is the target's plan (``polyad.target``).
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import Callable, Optional, Union

import islpy as isl

from .. import ir
from ..errors import CompileError
from ..progress import StageClock
from ..recent import Recent
from . import machine, nests
from .cleanup import (assign_first_updates, drop_zero_updates, forward_copies,
                      fuse_independent_nests, fuse_zero_initialization, remove_dead_statements,
                      updates_in_place, zero_rows_in_their_step)
from .distribute import distribute_after_scatters, expand_and_distribute
from .fusion import (BALANCED, CHUNK_ROWS, FINE_CHUNK_ROWS, FINE_COST, FINE_LEAD_IN,
                     UNFUSED_FROM_POINTS, chunk_lead_in, chunk_loop_vars, chunked_extents,
                     fuse_along_shared_loops, fuse_pipelines, fuse_rows_inside, jam_row_loops,
                     rows_per_iteration, slabs_per_iteration)
from .gather import ascending_order_free_nests, scatter_to_gather, small_target
from .split import split_conflicting_instances
from .strides import unit_stride_loops
from .tiling import tile_schedule
from .locality import has_strided_inner_loop, strided_inner_accesses, unit_stride_bands
from .machine import VectorUnit
from .loop_order import (add_decisions, block_sum_rows_in_registers, block_sums_in_registers,
                         expand_reduction_rows, interchange_for_reuse, jam_small_loops,
                         unit_stride_innermost)
from ..poly import (Dependences, PolyModel, SizeRequirement, check_bounds, dependences,
                    guard_requirements, isl_name, large_sizes, maps_of, operation_quota,
                    pairs_run_in_order, quota_spent, split_boundary_pieces,
                    statement_schedules, strided_ast_build_crashes, text_within_seconds,
                    values_without_divs)

_REDUCTION_OPS = {"+=": "+", "-=": "+", "*=": "*"}


@dataclass(frozen=True)
class ScatterFact:
    """Statements that update ``array`` with ``+=``/``-=`` across iterations of a loop.

    ``small``: the target is small next to the loop nest (each element receives
    many contributions, like a filter gradient; ``gather.small_target``);
    ``elements``: its flat size (an IR expression in the sizes).
    """

    array: str
    statements: frozenset
    small: bool
    elements: ir.Expr


@dataclass(frozen=True)
class LoopFacts:
    """What the dependence test proves about one generated loop (target-neutral).

    ``parallel``: iterations may run concurrently provided the carried
    dependences classified here are honoured: ``reductions`` (scalar name ->
    reduction operator '+' or '*', the scalar is only updated by it),
    ``private`` scalars (written before read in every iteration, not read
    after the loop), ``scatters`` (array name -> ScatterFact: ``+=`` updates
    of an array from several iterations), ``row_buffers`` (rolling row buffers of
    a fused nest, ``fusion``, that no flow dependence carries from one iteration
    to another and none enters or leaves the loop: each iteration, a chunk of
    rows, gets its own). ``why_not_parallel`` says why a loop
    is not parallel; ``carried``: some dependence is carried at all.
    ``trip_count_bound``: an upper bound on the iterations that holds for all
    sizes, or None when the count grows with the sizes. ``extent``: the number of
    values the loop's iterator takes over the whole run, as an ISL AST expression
    in the sizes (an upper bound on any one execution's trip count; None when
    ISL cannot express it). It is computed for innermost loops only, the ones a
    target plan asks about (is one loop's work per barrier worth threads): on the
    wavefront loops of time-skewed tiles ISL's parametric max and min take minutes.
    ``small_sizes``: the loop belongs to the AST's version for small sizes
    (``_size_versions``), which runs only where ``SMALL_SIZES`` is 1.
    """

    key: str
    depth: int
    statements: frozenset
    parallel: bool
    carried: bool
    reductions: dict = field(default_factory=dict)
    private: tuple = ()
    scatters: dict = field(default_factory=dict)
    why_not_parallel: str = ""
    row_buffers: tuple = ()
    trip_count_bound: Optional[int] = None
    extent: Optional[isl.AstExpr] = None
    small_sizes: bool = False

    @property
    def scatter_statements(self) -> frozenset:
        """Every statement that scatters across iterations of this loop."""
        return frozenset().union(*[f.statements for f in self.scatters.values()])


@dataclass(frozen=True)
class ScheduleCandidate:
    """One schedule of a (piece-split) kernel with its AST and the facts of every loop.

    ``loops``: AST annotation name (``loop_key``) -> LoopFacts. ``large_sizes``:
    ``((size, bound), ...)`` where the AST has two versions (``_size_versions``): loops
    separated per piece where every size is at least its bound, else one loop per band.
    """

    kernel: ir.Kernel
    schedule: isl.Schedule
    ast: isl.AstNode
    loops: dict
    large_sizes: tuple = ()
    # where the AST was checked for it (one loop nest per band): a dependence some loop of
    # the AST runs backwards, else "" (``_LoopAnalysis.backward_dependence``)
    runs_backwards: str = ""
    # the vector unit the kernel's register-resident sums are sized for (``machine``)
    vector_unit: Optional[VectorUnit] = None
    # one loop nest per band because the generation of a loop per piece ran past
    # ``AST_QUOTA`` (``_candidate``)
    unseparated: bool = False


@dataclass
class ScheduledKernel:
    """A scheduled kernel: piece-split IR, ISL model, dependences, the chosen AST and its loop facts."""

    kernel: ir.Kernel
    model: PolyModel
    deps: Dependences
    schedule: isl.Schedule
    ast: isl.AstNode
    loops: dict  # annotation name -> LoopFacts
    requirements: list
    gather_decisions: dict = field(default_factory=dict)
    schedule_origin: str = "program order"
    removed_statements: tuple = ()
    expansions: dict = field(default_factory=dict)
    fused_initializations: tuple = ()
    schedule_decisions: tuple = ()
    loop_orders: dict = field(default_factory=dict)  # statement -> loop order decision
    # The extents of the loops fused chains run in chunks, when fusing was the default's
    # choice (fuse=None): a call whose chunks leave threads idle runs finer chunks (where
    # ``fine_chunks``: the chains recompute few rows per chunk) or the unfused schedule.
    chunked_extents: tuple = ()
    fine_chunks: bool = False
    # ((size, bound), ...): the AST's versions for large and small sizes (ScheduleCandidate)
    large_sizes: tuple = ()
    # the vector unit the register-resident sums were sized for (``machine``; always set
    # by ``schedule_kernel``): the target's plan sizes its lanes of partial sums for it
    vector_unit: Optional[VectorUnit] = None

    def statement(self, name: str) -> ir.Statement:
        return self._by_name[name]

    def __post_init__(self):
        self._by_name = {s.name: s for s in self.kernel.statements}


def _flat_range(umap: isl.UnionMap) -> isl.UnionMap:
    """The schedule prefix with a flat range (ISL nests the spaces of successive bands)."""
    out = None
    for m in maps_of(umap):
        m = m.flatten_range()
        out = m.to_union_map() if out is None else out.union(m.to_union_map())
    return out


def _ungrouped(sched: isl.UnionMap) -> isl.UnionMap:
    """A schedule of AST statements as the schedule of the statements they run (the
    members of a group share its schedule)."""
    out = None
    for m in maps_of(sched):
        for name in m.get_tuple_name(isl.dim_type.in_).split(nests.STATEMENT_GROUP):
            one = m.set_tuple_name(isl.dim_type.in_, name).to_union_map()
            out = one if out is None else out.union(one)
    return out


def _names(uset) -> frozenset:
    out = []
    uset.foreach_set(lambda s: out.append(s.get_tuple_name()))
    return frozenset(out)


def _reduction_op(st: ir.Statement, var: str, reads_apart: bool = False) -> Optional[str]:
    """The reduction operator if ``st`` only updates ``var`` by ``+=``/``-=``/``*=``.

    ``reads_apart``: the statement's own reads of ``var`` never see an element
    that the loop updates (trisolv's ``x[i] -= L[i, j] * x[j]`` along j < i), so
    they may stay in the update's value.
    """
    if st.target_name != var or st.op not in _REDUCTION_OPS or (
            st.reads_variable(var) and not reads_apart):
        return None
    return _REDUCTION_OPS[st.op]


class _LoopAnalysis:
    """The dependence test run on every loop ISL generates (``after_each_for``)."""

    def __init__(self, sk_kernel: ir.Kernel, model: PolyModel, deps: Dependences,
                 small_sizes: Optional[isl.Set] = None, check_order: bool = False):
        self.kernel = sk_kernel
        # check_order: every loop's schedule (the AST's own) is tested for a dependence it
        # runs backwards; the first found is kept in ``runs_backwards``
        self.check_order = check_order
        self.runs_backwards = ""
        self.small_sizes = small_sizes  # the sizes of the version for small ones, if any
        self.model = model
        self.deps = deps
        self.by_name = {s.name: s for s in sk_kernel.statements}
        self.locals = dict(sk_kernel.locals)
        self.row_buffers = {t.name: t.chunk_loops for t in sk_kernel.temps if t.per_thread}
        self.loops: dict[str, LoopFacts] = {}
        self.error: Optional[BaseException] = None
        # (kind, variable) -> [(source statement, sink statement, map)]: a loop's test
        # looks only at the pairs of statements inside it (hundreds of loops of a
        # separated boundary stencil each hold a few of the pieces).
        self.pairs: dict[tuple, list] = {}
        # (kind, variable, statements) -> their pairs, one union map per pair of statements
        self.between: dict[tuple, list] = {}
        # depth -> the distances a loop at that depth carries: { [0, ..., 0, x] : x != 0 }
        self.apart_at: dict[int, isl.UnionSet] = {}
        # a loop carries a memory-based output dependence of an accumulator iff it
        # separates a pair of writes of one element (``Dependences.same_element``)
        for kind, var, umap in [(kind, var, umap) for kind in ("flow", "anti", "output")
                                for var, umap in getattr(deps, kind).items()] + [
                ("output", var, umap) for var, umap in deps.same_element.items()]:
            self.pairs[kind, var] = [(m.get_tuple_name(isl.dim_type.in_),
                                      m.get_tuple_name(isl.dim_type.out), m)
                                     for m in maps_of(umap)]
        self.ordered = [(kind, var, m) for kind in ("flow", "anti", "output")
                        for var, umap in sorted(getattr(deps, kind).items())
                        for m in maps_of(umap)] if check_order else []

    def carried(self, kind: str, var: str, stmts: frozenset, sched: isl.UnionMap,
                depth: int) -> bool:
        key = (kind, var, stmts)
        if key not in self.between:  # (the loops nested in one another share their pairs)
            self.between[key] = [m.to_union_map() for src, dst, m in self.pairs[kind, var]
                                 if src in stmts and dst in stmts]
        if depth not in self.apart_at:
            zeros = ", ".join(["0"] * depth + ["x"])
            self.apart_at[depth] = isl.UnionSet.read_from_str(
                self.model.ctx, f"{{ [{zeros}] : x != 0 }}")
        # pair by pair, the first one the loop carries decides (applying the loop's
        # schedule keeps only the pairs inside the loop: intersecting with the loop's
        # domain first costs more than the rest)
        for dep in self.between[key]:
            t = dep.apply_domain(sched).apply_range(sched)
            if not t.is_empty() and not t.deltas().intersect(self.apart_at[depth]).is_empty():
                return True
        return False

    def backward_dependence(self, sched: isl.UnionMap) -> str:
        """A dependence between statements of the loop whose sink the loop's schedule (the
        AST's, ``build.get_schedule()``) runs in an earlier iteration than its source, of
        the loop or of one around it ("flow dependence of 'v': S -> T"); else "".

        ISL's AST generation with atomic loops can place a statement in another
        iteration of a sequential loop than the schedule tree gives it (islpy 2026.2.2,
        fuzz seed 16020's vjp on CUDA: ``d_y0[i] = 0`` at iteration -1 of a band that
        maps it, and the scatters that read ``d_y0[i]`` first, to 1)."""
        # statement pair by statement pair (an accumulator's pairs of updates of one
        # element, ``same_element``, are unordered: not among these)
        schedules = statement_schedules(sched)
        for kind, var, m in self.ordered:
            src, dst = m.get_tuple_name(isl.dim_type.in_), m.get_tuple_name(isl.dim_type.out)
            if src in schedules and dst in schedules and not pairs_run_in_order(
                    m, schedules, backwards=True).is_empty():
                return f"{kind} dependence of {var!r}: {src} -> {dst}"
        return ""

    def reads_apart(self, users: list, var: str, sched: isl.UnionMap, depth: int) -> bool:
        """No statement of the loop reads (other than as its ``+=`` target) an element
        of array ``var`` that a statement of the loop writes in the same execution of
        the loop (equal outer loop iterators), in any iteration."""
        ldom = sched.domain()
        reads, writes = None, None
        for st in users:
            st_dom = self.model.domain(st).to_union_set().intersect(ldom)
            for ld in [ld for e in st.exprs() for ld in ir.loads(e) if ld.array == var]:
                m = self.model.access_map(st, ld).to_union_map().intersect_domain(st_dom)
                reads = m if reads is None else reads.union(m)
            if isinstance(st.target, ir.Load) and st.target.array == var:
                m = self.model.access_map(st, st.target).to_union_map().intersect_domain(st_dom)
                writes = m if writes is None else writes.union(m)
        if reads is None or writes is None:
            return True
        pairs = reads.apply_range(writes.reverse()).apply_domain(sched).apply_range(sched)
        if pairs.is_empty():
            return True
        outer = ", ".join(["0"] * depth + ["x"])
        same = isl.UnionSet.read_from_str(self.model.ctx, f"{{ [{outer}] }}")
        return pairs.deltas().intersect(same).is_empty()

    def keeps_chunks_whole(self, var: str, chunk: str, ldom: isl.UnionSet) -> bool:
        """Whether every instance of a statement accessing ``var`` whose ``chunk`` value
        some instance in the loop (domain ``ldom``) has is in the loop too: no access of
        the buffer of a chunk the loop runs lies outside it (where AST generation split
        off a piece of the last chunk, that piece would read another buffer)."""
        users = [st for st in self.kernel.statements if st.accesses(var)]
        if any(chunk not in st.loop_vars for st in users):
            return False
        chunk_of = _chunk_map(self.model, users, chunk)
        inside = chunk_of.intersect_domain(ldom)
        if inside.is_empty():
            return True
        every = chunk_of.intersect_range(inside.range()).domain()
        return every.is_subset(ldom)

    def iterates(self, stmts, var: str, chunk: str, sched: isl.UnionMap, depth: int) -> bool:
        """Whether one iteration of the loop (schedule dimension ``depth`` of ``sched``) is
        one value of the chunk loop variable ``chunk``, in every statement of the loop that
        accesses ``var``: the loop's schedule prefix and (the enclosing prefix, the chunk)
        determine each other (ISL)."""
        rel = None
        for name in sorted(stmts):
            st = self.by_name[name]
            if not st.accesses(var):
                continue
            if chunk not in st.loop_vars:
                return False
            dom = self.model.domain(st)
            mine = sched.intersect_domain(dom.to_union_set())
            if mine.is_empty():
                continue
            own = self.model.value_map(st, ir.LoopVar(chunk))
            m = isl.Map.from_union_map(mine)
            outer = m.project_out(isl.dim_type.out, depth, 1)
            pair = outer.flat_range_product(own)
            r = m.reverse().apply_range(pair)
            rel = r if rel is None else rel.union(r)
        return rel is not None and rel.is_single_valued() and rel.is_injective()

    def trip_count_bound(self, sched: isl.UnionMap, depth: int) -> Optional[int]:
        """The largest distance between two iterations of the loop over all sizes, or None."""
        rng = isl.Set.from_union_set(sched.range()).project_out(isl.dim_type.set, 0, depth)
        extent = isl.Map.from_domain_and_range(rng, rng).deltas()
        n = extent.dim(isl.dim_type.param)
        extent = extent.move_dims(isl.dim_type.set, 1, isl.dim_type.param, 0, n) \
            .project_out(isl.dim_type.set, 1, n)
        if extent.is_empty() or not extent.is_bounded():
            return None
        return max(int(str(extent.dim_max_val(0))), -int(str(extent.dim_min_val(0))))

    def extent(self, sched: isl.UnionMap, depth: int) -> Optional[isl.AstExpr]:
        """max - min + 1 of the loop's iterator over all its executions, in the sizes, or
        None. Of ``poly.values_without_divs`` of its values where they need existential
        variables: an upper bound, which is all the extent is for (a target decides from it
        how many iterations make its threads pay)."""
        rng = isl.Set.from_union_set(sched.range()).project_out(isl.dim_type.set, 0, depth) \
            .project_out(isl.dim_type.set, 1, depth_after(sched, depth))
        if rng.is_empty():
            return None
        rng = values_without_divs(rng)
        if rng is None:
            return None
        width = rng.dim_max(0).sub(rng.dim_min(0)).add_constant_val(
            isl.Val.one(self.model.ctx))
        if width.is_cst() or width.dim(isl.dim_type.param) == 0:
            return None
        return isl.AstBuild.from_context(self.model.context).expr_from_pw_aff(
            width.gist_params(self.model.context))

    def __call__(self, node: isl.AstNode, build: isl.AstBuild) -> isl.AstNode:
        try:
            return self.analyse(node, build)
        except BaseException as exc:  # an exception escaping an isl callback aborts the process
            self.error = exc
            return node

    def analyse(self, node, build):
        sched = _ungrouped(_flat_range(build.get_schedule()))
        ldom = sched.domain()
        depth = maps_of(sched)[0].dim(isl.dim_type.out) - 1
        stmts = _names(ldom)
        reductions: dict[str, str] = {}
        private: tuple = ()
        row_buffers: tuple = ()
        scatters: dict[str, ScatterFact] = {}
        reasons = []
        any_carried = False
        for var in sorted({v for _, v in self.pairs}):
            # An accumulator's memory-based flow dependences are some of its output ones
            # (every reader writes the element it reads) and its anti ones are empty: a
            # loop carries one of them iff it carries an output dependence.
            kinds = ("output",) if var in self.deps.memory_based else ("flow", "anti", "output")
            if var in self.row_buffers and any(
                    self.iterates(stmts, var, chunk, sched, depth)
                    and self.keeps_chunks_whole(var, chunk, ldom)
                    for chunk in self.row_buffers[var]):
                # its chunk loop: every chunk writes each row it reads before reading it
                # (fusion's proof; a sum row: each iteration of the loops around the row,
                # loop_order's), so each iteration gets its own buffer and no dependence
                # of the buffer crosses iterations, nor enters or leaves the loop
                row_buffers += (var,)
                continue
            carried = {kind: self.carried(kind, var, stmts, sched, depth)
                       for kind in kinds if (kind, var) in self.pairs}
            written = any(self.by_name[s].target_name == var for s in stmts)
            if not any(carried.values()) and not (written and var in self.locals):
                continue
            any_carried = any_carried or any(carried.values())
            if var in self.row_buffers:
                # inside a chunk the memory-based dependences decide
                if any(carried.values()):
                    reasons.append(f"row buffer {var!r} carries rows from one iteration "
                                   f"to the next")
                continue
            users = [self.by_name[s] for s in stmts if self.by_name[s].accesses(var)]
            apart = (var not in self.locals and any(s.reads_variable(var) for s in users)
                     and self.reads_apart(users, var, sched, depth))
            ops = {_reduction_op(s, var, apart) for s in users}
            if any(carried.values()) and len(ops) == 1 and None not in ops:
                if var in self.locals:
                    reductions[var] = ops.pop()
                elif ops == {"+"}:
                    scatters[var] = ScatterFact(
                        var, frozenset(s.name for s in users),
                        small_target(self.kernel, var, users),
                        _flat_size(self.kernel.array_type(var)))
                else:
                    reasons.append(f"{var!r} is updated by '*=' across iterations")
                continue
            if var in self.locals:
                escapes = self.deps.flow.get(var)
                if carried.get("flow"):
                    reasons.append(f"scalar {var!r} carries a value from one iteration to the next")
                elif escapes is not None and not escapes.intersect_domain(ldom) \
                        .subtract_range(ldom).is_empty():
                    reasons.append(f"scalar {var!r} is written in the loop and read after it")
                else:
                    private += (var,)
                continue
            kinds = [k for k, v in carried.items() if v]
            reasons.append(f"{var!r} has loop-carried {'/'.join(kinds)} dependences")
        if self.check_order and any_carried and not self.runs_backwards:
            # (a dependence the loop runs backwards is one it carries)
            self.runs_backwards = self.backward_dependence(sched)
        key = f"loop{len(self.loops)}"
        self.loops[key] = LoopFacts(
            key=key, depth=depth, statements=stmts, parallel=not reasons, carried=any_carried,
            reductions=reductions, private=private, scatters=scatters,
            why_not_parallel="; ".join(reasons), row_buffers=row_buffers,
            trip_count_bound=self.trip_count_bound(sched, depth),
            extent=(None if nests.contains_for(node.for_get_body())
                    else self.extent(sched, depth)),
            small_sizes=(self.small_sizes is not None
                         and ldom.params().is_subset(self.small_sizes)))
        return node.set_annotation(isl.Id(key, context=self.model.ctx))


def depth_after(sched: isl.UnionMap, depth: int) -> int:
    """Schedule dimensions after the loop's own (none: the prefix ends at the loop)."""
    return maps_of(sched)[0].dim(isl.dim_type.out) - depth - 1


def _flat_size(at: ir.ArrayType) -> ir.Expr:
    out = at.shape[0]
    for ext in at.shape[1:]:
        out = ir.Binary("*", out, ext, ir.i64)
    return out


def loop_key(node: isl.AstNode) -> Optional[str]:
    """The key of an AST for-node's LoopFacts (its annotation name); None for other nodes."""
    if node.get_type() != isl.ast_node_type.for_:
        return None
    try:
        return node.get_annotation().get_name()
    except isl.Error:
        return None


def schedule_kernel(kernel: ir.Kernel,
                    score: Callable[[ScheduleCandidate], tuple[int, int]],
                    clock: Optional[StageClock] = None,
                    unit_stride: bool = False,
                    tile=None,
                    fuse: Union[bool, int, None] = False,
                    vector_unit: Optional[VectorUnit] = None) -> ScheduledKernel:
    """Split, prove bounds, compute dependences, build the AST of ``kernel`` with loop facts.

    ``score(candidate) -> (parallel, looped)``: the parallel work a target
    gets from the candidate and the most it could get (the target's plan
    decides; this stage knows no target). The program order is kept
    unless it scores below the most and ISL's own schedule scores more.
    ``clock`` times the stages.
    ``unit_stride``: reorder permutable bands so that inner loops walk arrays
    along their rows (``locality.unit_stride_bands``; for targets where one
    thread runs a whole inner loop), kept when it scores as parallel; and
    when the program order walks an array down a column, ISL's schedule as it
    is when as parallel with fewer strided inner accesses
    (``locality.strided_inner_accesses``); and a nest reading a temporary the nest
    before it writes runs inside their shared outer loops
    (``fusion.fuse_along_shared_loops``), and a loop whose iterations read the same
    rows runs inside the loop that moves them (``loop_order.interchange_for_reuse``),
    and a temporary each iteration of a nest writes and reads one row of is kept as that
    row, one per thread (``fusion.rows_per_iteration``), two loops over rows inside a
    nest's outer loops run as one through a rolling buffer of the temporary linking them
    (``fusion.fuse_rows_inside``, unless ``fuse`` is False), and sums along a row run for
    several values of an outer loop per pass over the row
    (``loop_order.block_sums_in_registers``), after which a temporary each iteration of
    its users' shared loops writes and reads a slab of is kept as that slab
    (``fusion.slabs_per_iteration``).
    ``tile``: tile nests of three or more loops (``tiling.tile_schedule``) when the
    tiled schedule is legal and as parallel: None with the cache model's sizes, a
    tuple of sizes, False not at all.
    ``fuse``: fuse chains of producer and consumer nests through rolling row buffers
    (``fusion.fuse_pipelines``; for targets whose threads run whole chunks of a loop):
    True every chain, a positive integer every chain in chunks of that many rows (else
    ``fusion.CHUNK_ROWS``), None those where a producer runs ahead and whose chunks then
    run on threads with their own buffers (else the kernel is scheduled unfused; the
    result's ``chunked_extents`` name the chunked loops and ``fine_chunks`` whether finer
    chunks are an option, for the runtime's choice of finer chunks or the unfused
    schedule where the chunks leave threads idle), False none.
    ``vector_unit``: the registers the sums blocked along a row are sized for (None: the
    host's, ``machine.host_vector_unit``).
    """
    vector_unit = vector_unit or machine.host_vector_unit()
    scheduled = _schedule_kernel(kernel, score, clock, unit_stride, tile, fuse, vector_unit)
    if fuse is None:
        unowned = _buffers_no_loop_owns(scheduled)
        if unowned:
            plain = _schedule_kernel(kernel, score, clock, unit_stride, tile, False,
                                     vector_unit)
            why = (f"not fused: no chunk loop runs {', '.join(unowned)} per chunk (ISL's AST "
                   f"runs a piece of the last chunk after the chunk loop), so the chunks "
                   f"would run in order")
            return dataclasses.replace(
                plain, schedule_decisions=plain.schedule_decisions + (why,))
        extents = chunked_extents(scheduled.kernel)
        if extents:
            loops = " and of ".join(ir.expr_str(e) for e in extents)
            small = " and ".join(f"{size} >= {bound}" for size, bound in scheduled.large_sizes)
            when = (f"at run time, a call of 2^{UNFUSED_FROM_POINTS.bit_length() - 1} points "
                    f"or more whose chunks of {CHUNK_ROWS} rows of {loops} would keep a "
                    f"thread busy for less than {BALANCED:.0%} of the busiest one's time"
                    + (f", or whose sizes miss {small}," if small else "")
                    + " runs the unfused schedule (fuse=False), compiled on first use")
            fine = chunk_lead_in(scheduled.kernel) <= FINE_LEAD_IN
            if fine:
                when += (f"; before that, one whose chunks of {FINE_CHUNK_ROWS} rows keep "
                         f"every thread busy for at least {BALANCED:.0%} of the busiest "
                         f"one's time, and the threads busier than chunks of {CHUNK_ROWS} "
                         f"rows do by more than {FINE_COST:.0%}, runs chunks of "
                         f"{FINE_CHUNK_ROWS} rows (fuse={FINE_CHUNK_ROWS}), compiled on "
                         f"first use (a chunk recomputes at most {FINE_LEAD_IN} rows)")
            return dataclasses.replace(scheduled, chunked_extents=extents, fine_chunks=fine,
                                       schedule_decisions=scheduled.schedule_decisions + (when,))
    return scheduled


def chunk_rows(fuse) -> int:
    """The rows of a fused chain's chunk for the fusion mode ``fuse``: an integer's own
    (``fuse=16``), else ``CHUNK_ROWS``."""
    return fuse if isinstance(fuse, int) and not isinstance(fuse, bool) else CHUNK_ROWS


def _buffers_no_loop_owns(scheduled: "ScheduledKernel") -> list:
    """The rolling row buffers of fused nests that no loop keeps per iteration."""
    owned = {v for lp in scheduled.loops.values() for v in lp.row_buffers}
    return [t.name for t in scheduled.kernel.temps if t.role == "rows" and t.name not in owned]


def _schedule_kernel(kernel: ir.Kernel,
                     score: Callable[[ScheduleCandidate], tuple[int, int]],
                     clock: Optional[StageClock], unit_stride: bool, tile,
                     fuse: Union[bool, int, None], vector_unit: VectorUnit) -> "ScheduledKernel":
    """``schedule_kernel`` with the fusion mode ``fuse`` taken as it is."""
    clock = clock or StageClock(kernel.name)
    n = len(kernel.statements)
    # One model (one isl.Context) for the compilation; each pass's result gets the model
    # derived from it, which keeps the domains of the statements the pass kept.
    model = PolyModel(kernel)
    with clock.stage("boundary pieces", n):
        split = split_boundary_pieces(kernel, model)
    with clock.stage("bounds", len(split.statements)):
        # Bounds are proved on the program as written: a transformation (dead-code
        # elimination first of all) must not hide an out-of-bounds access from the user.
        written_requirements = check_bounds(split, model.for_kernel(split), written=kernel)
        written_requirements += _unseen(guard_requirements(kernel), written_requirements)
    with clock.stage("unit strides", len(split.statements)):
        split, strides = unit_stride_loops(split)
    with clock.stage("dead statements", len(split.statements)):
        split, in_place = updates_in_place(split)
        split, copies = forward_copies(split)
        split, zero_updates = drop_zero_updates(split)
        split, dead = remove_dead_statements(split, model)
        dead = zero_updates + dead
    with clock.stage("expansion", len(split.statements)):
        split, expansions = expand_and_distribute(split, model)
        split, splits = distribute_after_scatters(split, model)
        split = ascending_order_free_nests(split, model)
    with clock.stage("scatter to gather", len(split.statements)):
        split, gather_decisions = scatter_to_gather(split, model.for_kernel(split))
        split, fused = fuse_zero_initialization(split)
        split, first_updates = assign_first_updates(split, model)
        # (what assign_first_updates leaves of a zeroing may move row by row)
        split, fused_rows = fuse_zero_initialization(split)
        fused += fused_rows
        split, fusions = fuse_independent_nests(split, model)
    if fuse is not False:
        with clock.stage("pipeline fusion", len(split.statements)):
            split, pipelines = fuse_pipelines(split, model, every=fuse is not None,
                                              rows=chunk_rows(fuse))
            split, jams = jam_row_loops(split, model)
        fusions += pipelines + jams
    with clock.stage("loop order", len(split.statements)):
        split, loop_orders = expand_reduction_rows(split, model, per_thread=unit_stride)
        split, reordered = unit_stride_innermost(split)
        add_decisions(loop_orders, reordered)
        split, jammed = jam_small_loops(split)
        add_decisions(loop_orders, jammed)
        if unit_stride:
            split, shared = fuse_along_shared_loops(split, model)
            fusions += shared
            split, interchanged = interchange_for_reuse(split, model)
            add_decisions(loop_orders, interchanged)
            split, rows = rows_per_iteration(split)
            fusions += rows
            if fuse is not False:
                split, inside = fuse_rows_inside(split, model)
                fusions += inside
            split, blocked = block_sums_in_registers(split, vector_unit, model)
            add_decisions(loop_orders, blocked)
            split, slabs = slabs_per_iteration(split)
            fusions += slabs
            split, row_blocks = block_sum_rows_in_registers(split, vector_unit)
            add_decisions(loop_orders, row_blocks)
            split, zeroed_rows = zero_rows_in_their_step(split)
            fusions += zeroed_rows
    with clock.stage("unit strides", len(split.statements)):
        # the loops the passes above block step by 2 or 4 (``co`` of the conv layer's
        # filter sums). Over their iteration numbers, ISL's sets of their statements have
        # no existential variable, which slowed the dependence analyses and AST builds and
        # made each build wait for a forked probe (``strided_ast_build_crashes``): the
        # conv gradient compiled in 4.4 s instead of 5.6, deterministic in 7.6 instead of 13
        split, blocked_strides = unit_stride_loops(split)
        strides += blocked_strides
    with clock.stage("index-set splitting", len(split.statements)):
        split, index_splits = split_conflicting_instances(split, model)
    n = len(split.statements)
    model = model.for_kernel(split)
    with clock.stage("bounds", n):
        requirements: list[SizeRequirement] = written_requirements + _unseen(
            check_bounds(split, model), written_requirements)
    scalars = frozenset(n for n, _ in split.locals)
    with clock.stage("dependences", n):
        # Scalars are private or reductions; which one only their flow decides. The loop
        # test asks of an array only whether a loop carries its dependences, on which
        # memory-based ones agree for accumulators (poly.accumulator_arrays).
        deps = dependences(model, flow_only=scalars, memory_based_accumulators=True)
    with clock.stage("ast", n):
        chosen = _candidate(_program_order_schedule(model), split, model, deps,
                            vector_unit=vector_unit, unseparated_fallback=True,
                            ast_schedule=_program_order_tree(model,
                                                             _adjacent_equal_domains(model)))
    if chosen is None:
        raise ast_generation_error(kernel)
    origin = "program order"
    parallel, looped = score(chosen)
    isl_schedule = None
    strided = unit_stride and has_strided_inner_loop(split)
    if parallel < looped or strided:
        # some loop nest runs sequentially, or walks an array against its layout: ask
        # ISL for a schedule (which the unit-stride pass below can then reorder)
        with clock.stage("isl scheduler", n):
            # The scheduler may reorder anything: it needs every dependence, scalars' too.
            # The arrays' are those above (on a clamped stencil's adjoint they are most of
            # the analysis time); only the scalars' anti and output ones are missing, and
            # the value-based ones of accumulators (memory-based ones are as valid, but
            # ISL's proximity objective could choose another schedule with them).
            extra = dependences(model, variables=scalars | deps.memory_based,
                                flow_only=frozenset())
            isl_schedule, why = _isl_schedule(model, Dependences(
                {**deps.flow, **extra.flow}, {**deps.anti, **extra.anti},
                {**deps.output, **extra.output}))
        if isl_schedule is None:
            origin = f"program order (the ISL scheduler gave up: {why})"
        elif parallel < looped:
            with clock.stage("ast", n):
                other = _candidate(isl_schedule, split, model, deps, vector_unit=vector_unit)
            if other is None:
                origin = (f"program order (ISL's generation of the loops of its schedule ran "
                          f"past {AST_QUOTA:_} operations)")
            elif score(other)[0] > parallel:
                chosen = other
                origin = "ISL scheduler (more parallel than the program order)"
            else:
                origin = "program order (the ISL schedule is not more parallel)"
    decisions: list = []
    isl_chosen = origin.startswith("ISL")
    if unit_stride and isl_schedule is not None and (strided or isl_chosen):
        base = chosen.schedule if isl_chosen else isl_schedule
        with clock.stage("unit stride", n):
            local, decisions = unit_stride_bands(base, split)
        if decisions:
            with clock.stage("ast", n):
                other = _candidate(local, split, model, deps, vector_unit=vector_unit)
            if other is not None and score(other)[0] >= score(chosen)[0]:
                chosen = other
                origin = ("ISL scheduler, bands reordered for unit stride (as parallel as "
                          "the " + ("ISL schedule)" if isl_chosen else "program order)"))
            else:
                decisions = []
    if strided and isl_schedule is not None and not origin.startswith("ISL"):
        # ISL's schedule may walk rows innermost as it is (syrk: i, j, k, a dot product
        # of two rows of A along k, where the program order's inner j walks a column)
        with clock.stage("ast", n):
            other = _candidate(isl_schedule, split, model, deps, vector_unit=vector_unit)
        before = strided_inner_accesses(chosen.ast, split)
        after = None if other is None else strided_inner_accesses(other.ast, split)
        if after is not None and after < before and score(other)[0] >= score(chosen)[0]:
            chosen = other
            origin = "ISL scheduler (as parallel as the program order, fewer strided accesses)"
            decisions.append(
                f"unit stride: ISL's schedule kept as it is: its innermost loops make "
                f"{after} strided access{'' if after == 1 else 'es'} in the deepest "
                f"statements, the program order {before}")
    if tile is not False:
        with clock.stage("tiling", n):
            tiled, tiling = tile_schedule(chosen.schedule, split, model, deps,
                                          tile if isinstance(tile, tuple) else None)
        if tiled is not None:
            with clock.stage("ast", n):
                other = _candidate(tiled, split, model, deps, vector_unit=vector_unit)
            if other is None:
                decisions.append(f"not tiled: ISL's generation of the tiled loops ran past "
                                 f"{AST_QUOTA:_} operations")
            elif score(other)[0] >= score(chosen)[0]:
                chosen = other
                decisions += tiling
            else:
                decisions.append("not tiled: the tiled schedule is less parallel")
        else:
            decisions += tiling
    if chosen.unseparated:
        decisions.append(f"one loop nest per band, the pieces as conditions inside: ISL's "
                         f"generation of a loop per piece ran past {AST_QUOTA:_} operations")
    if chosen.large_sizes:
        decisions.append(
            "loops separated per piece where " + " and ".join(
                f"{size} >= {bound}" for size, bound in chosen.large_sizes)
            + "; below, one loop per band with the pieces as conditions inside "
              "(fewer lines of C, for a few elements)")
    return ScheduledKernel(split, model, deps, chosen.schedule, chosen.ast, chosen.loops,
                           requirements, gather_decisions, origin, dead, expansions, fused,
                           tuple(strides + _in_place_decisions(in_place) + copies + splits + first_updates
                                 + fusions + index_splits + decisions),
                           loop_orders, large_sizes=chosen.large_sizes,
                           vector_unit=vector_unit)


def _unseen(found: list, known: list) -> list:
    """The requirements of ``found`` whose sizes no requirement of ``known`` already bars
    (the call checks each once)."""
    return [r for r in found if all(not r.bad_params.is_equal(k.bad_params) for k in known)]


def _in_place_decisions(names: tuple) -> list:
    if not names:
        return []
    return [f"x = x + e written as the update x += e (the same sum bit for bit): "
            f"{', '.join(names)}"]


def _program_order_schedule(model: PolyModel) -> isl.Schedule:
    """The program order as one band (the 2d+1 map ``PolyModel.schedule_map``)."""
    schedule = isl.Schedule.from_domain(model.union_domain())
    if model.max_depth > 0 or len(model.kernel.statements) > 1:
        schedule = schedule.insert_partial_schedule(
            isl.MultiUnionPwAff.from_union_map(model.schedule_map()))
    return schedule


def _program_order_tree(model: PolyModel, groups: dict[str, str]) -> isl.Schedule:
    """The program order as a tree (``PolyModel.schedule_tree``: sequence nodes, a band per
    loop) with each group of ``groups`` (``_adjacent_equal_domains``) as one statement,
    to build the AST from: the same order as ``_program_order_schedule``, whose one band
    of 2d+1 members (the positions among them) costs ISL's AST generation two to three
    times as much (energy27's gradient: the AST stage 0.57 -> 0.34 s)."""
    kept = [st for st in model.kernel.statements  # a group's first member stands for it
            if groups.get(st.name, st.name) == st.name
            or groups[st.name].startswith(st.name + nests.STATEMENT_GROUP)]
    return model.schedule_tree({st.name: groups.get(st.name, st.name) for st in kept}, kept)


def _adjacent_equal_domains(model: PolyModel) -> dict[str, str]:
    """Statement name -> the name of its group, for statements that the program order
    runs one right after the other at every point of one domain.

    Such statements sit in the same loops at adjacent positions (``S8_k`` at ``(.., 5, 0)``
    and ``S9_k`` at ``(.., 5, 1)``: the two updates of a clamped stencil's adjoint, piece
    by piece) and have equal domains, and the pieces at each of the two positions have
    disjoint domains (not so the pieces of a gather, several of which add into a border
    element at one point): at each point at most one statement of each position runs,
    so the group runs them in program order. AST generation separating loops over
    pieces costs with the number of statements (a group is one), and the emitted code is
    the same: the group's statements in order. Not in the chunk loops of fused nests
    (``fusion``): there ISL separates a group's loops differently from its statements'.
    """
    chunks = chunk_loop_vars(model.kernel)
    at: dict[tuple, list] = {}
    for st in model.kernel.statements:
        if not chunks & set(st.loop_vars):
            at.setdefault(st.position, []).append(st)
    disjoint: dict[tuple, bool] = {}

    def pieces_disjoint(position: tuple) -> bool:
        if position not in disjoint:
            doms = [model.domain(st).set_tuple_name("P") for st in at[position]]
            disjoint[position] = all(a.is_disjoint(b) for a, b in itertools.combinations(doms, 2))
        return disjoint[position]

    group: dict[str, list] = {}  # first member's name -> members
    first: dict[str, str] = {}
    for position, here in sorted(at.items()):
        before_at = position[:-1] + (position[-1] - 1,)
        before = at.get(before_at, [])
        if not before or not pieces_disjoint(position) or not pieces_disjoint(before_at):
            continue
        for st in here:
            prev = [b for b in before if b.loops == st.loops and model.domain(b).is_equal(
                model.domain(st).set_tuple_name(b.name))]
            if len(prev) == 1:
                head = first.get(prev[0].name, prev[0].name)
                group.setdefault(head, [prev[0]]).append(st)
                first[st.name] = head
    out: dict[str, str] = {}
    for members in group.values():
        name = nests.STATEMENT_GROUP.join(st.name for st in members)
        out.update({st.name: name for st in members})
    return out


# Bound on ISL's scheduler work (isl "operations"); past it we keep program order.
SCHEDULER_QUOTA = 2_000_000
# Bound on its wall time, for work the quota does not count (poly.text_within_seconds):
# the scheduler runs in a child process, killed past it. The test suite's and the
# benchmarks' schedules take well under a second.
SCHEDULER_SECONDS = 20.0


# ISL's answers in this process (the schedule as text, or None and why there is none), by
# the text of the constraints it was given and its bounds: a kernel's default and
# deterministic builds ask it for the same schedule, and where it ran past
# SCHEDULER_SECONDS for one it would again for the other (fuzz seed 19715's vjp: 20 s for
# each build the fuzzer checks).
recent_schedules = Recent(64)


def _isl_schedule(model: PolyModel, deps: Dependences) -> tuple[Optional[isl.Schedule], str]:
    """ISL's own schedule (validity = coincidence = proximity = all dependences), or None
    and why not."""
    all_deps = deps.all(model.context.get_space())
    sc = (isl.ScheduleConstraints.on_domain(model.union_domain())
          .set_context(model.context).set_validity(all_deps)
          .set_coincidence(all_deps).set_proximity(all_deps))
    ctx = model.ctx
    ctx.set_schedule_outer_coincidence(1)
    ctx.set_schedule_max_coefficient(4)

    def compute() -> str:
        with operation_quota(ctx, SCHEDULER_QUOTA):
            return sc.compute_schedule().to_str()
    text, why = recent_schedules.get_or_make(
        (sc.to_str(), SCHEDULER_QUOTA, SCHEDULER_SECONDS),
        lambda: text_within_seconds(compute, SCHEDULER_SECONDS))
    if text is None:
        return None, why
    try:
        return isl.Schedule.read_from_str(ctx, text), ""
    except isl.Error:
        # ISL prints a schedule tree its own reader rejects: a ``set`` node without
        # children (``child: { set }``, fuzz seed 15269's vjp)
        return None, "ISL could not read back the schedule it printed"


# Bound on the ISL operations of one AST generation (with the loop analysis its
# callbacks make). Unbounded, a fuzz kernel's vjp whose first-reached elements made a
# condition of 28 pieces (seed 19650, before cleanup.FIRST_UPDATE_PIECES) generated its
# loops for more than ten minutes; 10 million operations stopped it in 6 s. The test
# suite's and the benchmarks' generations (primal, gradient, deterministic, CUDA) all stay
# below 10 million; the deconvolution gradient's, the heaviest, needs more than 6 million.
AST_QUOTA = 20_000_000


def _candidate(schedule: isl.Schedule, kernel: ir.Kernel, model: PolyModel,
               deps: Dependences, separate: bool = True,
               ast_schedule: Optional[isl.Schedule] = None,
               vector_unit: Optional[VectorUnit] = None,
               unseparated_fallback: bool = False) -> Optional[ScheduleCandidate]:
    """The AST of ``schedule`` with the dependence test's facts on every loop; None where
    ISL's AST generation made more than ``AST_QUOTA`` operations (with
    ``unseparated_fallback``: separated, and then again as one loop nest per band).

    ``separate``: a loop per piece (interior loops without border conditions);
    else one loop nest per band with the pieces as conditions inside.
    ``ast_schedule``: the same order as ``schedule``, to build the AST from (the program
    order as a tree, groups of statements as single statements).
    ``vector_unit``: the candidate's, for the target's plan (``ScheduleCandidate``; None:
    the host's, ``machine.host_vector_unit``).
    ``unseparated_fallback``: for the schedule the kernel cannot do without (the program
    order's); another candidate past the quota is dropped at once, since the second
    generation can take minutes before it reaches the quota too (a checkpoint segment of
    fuzz seed 19715: 10 s separated, then 67 s as one nest per band, for each of two
    candidates).
    """
    built = _built_candidate(schedule, kernel, model, deps, separate, ast_schedule,
                             vector_unit)
    if built is not None or not separate or not unseparated_fallback:
        return built
    # the separation is the costly part of the generation (a loop per piece of every
    # statement's domain); one loop nest per band asks for none
    built = _built_candidate(schedule, kernel, model, deps, False, ast_schedule, vector_unit)
    if built is None or built.runs_backwards:
        # (ISL's one loop nest per band can run a dependence backwards: fuzz seed 16020)
        return None
    return dataclasses.replace(built, unseparated=True)


def ast_generation_error(kernel: ir.Kernel) -> CompileError:
    """The error of a kernel whose loops ISL could not generate within ``AST_QUOTA``."""
    return CompileError(
        f"{kernel.filename}:{kernel.line}: kernel {kernel.name!r}: ISL's generation of its "
        f"loops ran past its quota of {AST_QUOTA:_} operations, with a loop per piece and "
        f"with one loop nest per band: the conditions on its statements' instances "
        f"(boundary pieces, strided loops, conditions on loop variables) make too many "
        f"pieces. Split the kernel into smaller kernels, or write its border rows and "
        f"columns as loops of their own.")


def _built_candidate(schedule, kernel, model, deps, separate, ast_schedule,
                     vector_unit) -> Optional[ScheduleCandidate]:
    """``_candidate``'s AST generation once, with ``separate`` as given; None past
    ``AST_QUOTA``."""
    # fused chains only: elsewhere the cases of small sizes are fewer and a second version
    # costs more than it saves or sends common sizes to the slow one (the conv layer's
    # gradient, with its rows fused inside the loop over images: 9.1 -> 7.4 s cold, but
    # the blocked filter sums' bound CO >= 4 would run every layer of 1-3 output channels
    # with the pieces as conditions inside its loops)
    bounds = large_sizes(model) if separate and chunk_loop_vars(kernel) else ()
    context = model.context
    if bounds:
        context = context.intersect(isl.Set.read_from_str(
            model.ctx, f"[{SMALL_SIZES}] -> {{ : 0 <= {SMALL_SIZES} <= 1 }}"))
    ast_schedule = ast_schedule or schedule
    tree = _size_versions(ast_schedule, model, bounds) if separate \
        else _atomic_loops(ast_schedule)
    # a separation that crashes ISL (fuzz seed 13148): one loop per band instead
    if separate and strided_ast_build_crashes(context, tree):
        bounds, context, tree = (), model.context, _atomic_loops(ast_schedule)
    analysis = _LoopAnalysis(kernel, model, deps, _small_sizes(model) if bounds else None,
                             check_order=not separate)
    build = isl.AstBuild.from_context(context)
    build, handle = build.set_after_each_for(analysis)
    try:
        with operation_quota(model.ctx, AST_QUOTA):
            ast = build.node_from_schedule(tree)
            if isinstance(analysis.error, isl.Error):
                # (the quota ran out in the loop analysis of a callback)
                raise analysis.error
    except isl.Error as exc:
        if not quota_spent(exc):
            raise
        return None
    finally:
        del handle
    if analysis.error is not None:
        raise analysis.error
    return ScheduleCandidate(kernel, schedule, ast, analysis.loops, bounds,
                             analysis.runs_backwards,
                             vector_unit or machine.host_vector_unit())


def guarded_pieces(scheduled: ScheduledKernel) -> ScheduledKernel:
    """``scheduled`` with the AST of the same schedule built as one loop nest per band.

    Boundary pieces become conditions inside the nest instead of loops of
    their own: ``for m { for n { if (n == 0) border; interior } }`` rather
    than ``for m { border; for n { interior } }``. A GPU target maps the
    perfect nest onto a 2-D grid (guarded threads at the border). The loop
    facts are those of the new AST's loops (same dependence test). Where that AST
    runs a dependence backwards (``_LoopAnalysis.backward_dependence``), ``scheduled``
    keeps its AST of a loop per piece, with a decision saying why.
    """
    cand = _candidate(scheduled.schedule, scheduled.kernel, scheduled.model, scheduled.deps,
                      separate=False, vector_unit=scheduled.vector_unit)
    if cand is None:
        return dataclasses.replace(scheduled, schedule_decisions=scheduled.schedule_decisions + (
            f"pieces kept in loops of their own: ISL's generation of one loop nest per band "
            f"ran past its quota of {AST_QUOTA:_} operations",))
    if cand.runs_backwards:
        # a fault of ISL's atomic loops (fuzz seed 16020): the AST of a loop per piece,
        # the one the schedule was chosen with, stays
        return dataclasses.replace(scheduled, schedule_decisions=scheduled.schedule_decisions + (
            f"pieces kept in loops of their own: ISL's one loop nest per band would run "
            f"the {cand.runs_backwards} backwards",))
    return dataclasses.replace(scheduled, ast=cand.ast, loops=cand.loops, large_sizes=())


def why_parts_not_apart(scheduled: ScheduledKernel, parts: list) -> str:
    """Why the body of a loop, split into consecutive ``parts`` (lists of statement names,
    in the body's order), may not run as one copy of the loop per part, the copies in
    that order (loop distribution); "" when it may.

    Distribution runs every instance of an earlier part before every instance of a later
    one. Instances of one iteration keep their order, and so do those of one part; what
    changes is that a later part's instance in an iteration now follows an earlier part's
    instances of later iterations. So it is legal when no dependence runs from a
    statement of a later part to one of an earlier part (for the accumulators, whose
    dependences are unordered pairs of updates, ``Dependences.accumulator_order``).
    One further condition is conservative: no scalar is accessed in two parts (a value
    the loop's threads keep privately would not survive from one copy to the next).
    (``distribute.conflicts_across_iterations``, the IR passes' test, asks about loops of
    the IR; an AST loop of ISL's schedule need not be one.)
    """
    part_of = {name: k for k, names in enumerate(parts) for name in names}
    by_name = {st.name: st for st in scheduled.kernel.statements}
    scalars = {n for n, _ in scheduled.kernel.locals}
    deps = scheduled.deps
    parts_of: dict = {}
    for name, k in part_of.items():
        st = by_name[name]
        for var in st.read_names() | {st.target_name}:
            parts_of.setdefault(var, set()).add(k)
    for var, ks in sorted(parts_of.items()):
        if len(ks) > 1 and var in scalars:
            return f"the scalar {var!r} is accessed in two of the parts"
    relations = [(kind, var, umap) for kind in ("flow", "anti", "output")
                 for var, umap in getattr(deps, kind).items()]
    relations += [("output", var, deps.accumulator_order(var)) for var in deps.same_element
                  if var not in deps.output and len(parts_of.get(var, ())) > 1]
    for kind, var, umap in relations:
        for m in maps_of(umap):
            src = part_of.get(m.get_tuple_name(isl.dim_type.in_))
            dst = part_of.get(m.get_tuple_name(isl.dim_type.out))
            if src is not None and dst is not None and src > dst and not m.is_empty():
                article = "a" if kind == "flow" else "an"
                return (f"{article} {kind} dependence on {var!r} runs from a later part to an "
                        f"earlier one")
    return ""


def _atomic_loops(schedule: isl.Schedule) -> isl.Schedule:
    """Ask for one loop per band member, whatever the pieces (conditions inside)."""

    def visit(node: isl.ScheduleNode) -> isl.ScheduleNode:
        if node.get_type() == isl.schedule_node_type.band:
            for k in range(node.band_n_member()):
                node = node.band_member_set_ast_loop_type(k, isl.ast_loop_type.atomic)
        return node

    return schedule.map_schedule_node_bottom_up(visit)


# The ISL parameter that tells the two versions of ``_size_versions`` apart: 1 where some
# size is below its bound (``large_sizes``). The emitter defines it from the sizes.
SMALL_SIZES = "pa_small_sizes"


def _size_versions(schedule: isl.Schedule, model: PolyModel, bounds: tuple) -> isl.Schedule:
    """``schedule`` with separate loops per piece (``_separate_loops``) where every size is
    at least its bound in ``bounds`` (``large_sizes``), and one loop per band
    (``_atomic_loops``) where ``SMALL_SIZES`` is 1.

    Separating the pieces of the loops of a fused nest at every size ISL can tell apart
    prints a case for each small size at which border pieces and a chunk's first and
    last rows meet or vanish (``N == 1``, ``N == 2 && M >= 3``, ...): most of a fused
    gradient's C (the deconvolution's: 4467 lines, 1561 for large sizes) and of its C
    compiler's time. The versions run the same statement instances in the same order.
    The small one is told apart by a parameter of its own, not by its sizes: ISL builds
    the AST of a domain whose sizes are a union of cases (``M < 10 or N < 6``) several
    times slower."""
    separated = _separate_loops(schedule, model)
    if not bounds:
        return separated
    domain = schedule.get_domain()
    large = " and ".join(f"{isl_name(size)} >= {bound}" for size, bound in bounds)
    params = ", ".join([SMALL_SIZES] + [isl_name(size) for size, _ in bounds])
    big = isl.Set.read_from_str(model.ctx, f"[{params}] -> {{ : {SMALL_SIZES} = 0 and {large} }}")
    return separated.intersect_domain(domain.intersect_params(big)).sequence(
        _atomic_loops(schedule).intersect_domain(domain.intersect_params(_small_sizes(model))))


def _small_sizes(model: PolyModel) -> isl.Set:
    """The parameters of ``_size_versions``' version for small sizes."""
    return isl.Set.read_from_str(model.ctx, f"[{SMALL_SIZES}] -> {{ : {SMALL_SIZES} = 1 }}")


def _separate_loops(schedule: isl.Schedule, model: PolyModel) -> isl.Schedule:
    """Ask for separate loops per piece so interior loops carry no border conditions,
    except for the chunk loops of fused nests (``fusion``), which stay one loop with the
    pieces of the first and last chunks inside: separating them costs most of the
    compile time of a fused gradient (the deconvolution's AST: 4.3 -> 1.1 s) for code
    that runs once per chunk."""
    chunk_of = _chunk_loop_maps(model)

    def visit(node: isl.ScheduleNode) -> isl.ScheduleNode:
        if node.get_type() == isl.schedule_node_type.band:
            members = node.band_get_partial_schedule()
            for k in range(node.band_n_member()):
                member = isl.UnionMap.from_union_pw_aff(members.get_union_pw_aff(k))
                chunk = any(member.intersect_domain(m.domain()).is_equal(m) for m in chunk_of)
                node = node.band_member_set_ast_loop_type(
                    k, isl.ast_loop_type.atomic if chunk else isl.ast_loop_type.separate)
        return node

    return schedule.map_schedule_node_bottom_up(visit)


def _chunk_loop_maps(model: PolyModel) -> list:
    """Per chunk loop of a fused nest: its statements' instances -> their chunk."""
    out = []
    for chunk in sorted(chunk_loop_vars(model.kernel)):
        inside = [st for st in model.kernel.statements if chunk in st.loop_vars]
        if inside:
            out.append(_chunk_map(model, inside, chunk))
    return out


def _chunk_map(model: PolyModel, statements: list, chunk: str) -> isl.UnionMap:
    """Instance of each of ``statements`` (all inside the loop over ``chunk``) -> the
    value of ``chunk`` it runs at."""
    out = None
    for st in statements:
        own = model.value_map(st, ir.LoopVar(chunk)).to_union_map()
        out = own if out is None else out.union(own)
    return out
