"""Program-order schedule, AST generation and the one parallelism test."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import islpy as isl

from .. import ir
from .cleanup import fuse_zero_initialization, remove_dead_statements
from .distribute import expand_and_distribute
from .gather import ascending_order_free_nests, scatter_to_gather, small_target
from ..poly import (Dependences, PolyModel, SizeRequirement, check_bounds, dependences,
                    split_boundary_pieces)

_REDUCTION_OPS = {"+=": "+", "-=": "+", "*=": "*"}

# Loops with at most this many iterations, whatever the sizes (filter taps,
# channels of a fixed-size layer), are never made 'omp parallel for': a thread
# team costs more than they do.
SMALL_LOOP = 64


@dataclass
class LoopInfo:
    """What the dependence test says about one generated loop.

    ``parallel``: iterations may run concurrently once ``reductions`` (scalar
    name -> C reduction operator) get a reduction clause, ``private`` scalars
    a private copy, ``privatized`` arrays (name -> flat size; small targets of
    ``+=`` scatters, like a filter gradient) a per-thread copy summed at the
    end, and ``atomic`` statements (other array ``+=`` scatters) are made
    atomic. ``reason`` says why a loop is not parallel; ``mapping`` says what
    the OpenMP mapping pass made of a parallel loop and why (``pa.explain``
    prints both).
    """

    depth: int
    statements: frozenset
    parallel: bool = False
    reductions: dict = field(default_factory=dict)
    private: tuple = ()
    atomic: frozenset = frozenset()
    privatized: dict = field(default_factory=dict)
    reason: str = ""
    carried: bool = True
    # decided by the mapping pass
    omp_parallel: bool = False
    simd: bool = False
    small: bool = False
    mapping: str = ""


@dataclass
class ScheduledKernel:
    """A kernel ready for emission: piece-split IR, ISL model, AST and loop decisions."""

    kernel: ir.Kernel
    model: PolyModel
    deps: Dependences
    schedule: isl.Schedule
    ast: isl.AstNode
    loops: dict
    requirements: list
    gather_decisions: dict = field(default_factory=dict)
    schedule_origin: str = "program order"
    removed_statements: tuple = ()
    expansions: dict = field(default_factory=dict)
    fused_initializations: tuple = ()

    def statement(self, name: str) -> ir.Statement:
        return self._by_name[name]

    def __post_init__(self):
        self._by_name = {s.name: s for s in self.kernel.statements}


def _maps(umap: isl.UnionMap) -> list:
    out = []
    umap.foreach_map(out.append)
    return out


def _flat_range(umap: isl.UnionMap) -> isl.UnionMap:
    """The schedule prefix with a flat range (ISL nests the spaces of successive bands)."""
    out = None
    for m in _maps(umap):
        m = m.flatten_range()
        out = m.to_union_map() if out is None else out.union(m.to_union_map())
    return out


def _names(uset) -> frozenset:
    out = []
    uset.foreach_set(lambda s: out.append(s.get_tuple_name()))
    return frozenset(out)


def _reduction_op(st: ir.Statement, var: str) -> Optional[str]:
    """The reduction operator if ``st`` only updates ``var`` by ``+=``/``-=``/``*=``."""
    if st.target_name != var or st.op not in _REDUCTION_OPS or st.reads_variable(var):
        return None
    return _REDUCTION_OPS[st.op]


class _LoopAnalysis:
    """The dependence test run on every loop ISL generates (``after_each_for``)."""

    def __init__(self, sk_kernel: ir.Kernel, model: PolyModel, deps: Dependences):
        self.kernel = sk_kernel
        self.model = model
        self.deps = deps
        self.by_name = {s.name: s for s in sk_kernel.statements}
        self.locals = dict(sk_kernel.locals)
        self.loops: dict[str, LoopInfo] = {}
        self.error: Optional[BaseException] = None

    def carried(self, dep: isl.UnionMap, sched: isl.UnionMap, ldom: isl.UnionSet, depth: int) -> bool:
        d = dep.intersect_domain(ldom).intersect_range(ldom)
        if d.is_empty():
            return False
        t = d.apply_domain(sched).apply_range(sched)
        zeros = ", ".join(["0"] * depth + ["x"])
        cond = isl.UnionSet.read_from_str(self.model.ctx, f"{{ [{zeros}] : x != 0 }}")
        return not t.deltas().intersect(cond).is_empty()

    def small_trip_count(self, sched: isl.UnionMap, depth: int) -> bool:
        """True if the loop runs at most SMALL_LOOP iterations whatever the sizes."""
        rng = isl.Set.from_union_set(sched.range()).project_out(isl.dim_type.set, 0, depth)
        extent = isl.Map.from_domain_and_range(rng, rng).deltas()
        n = extent.dim(isl.dim_type.param)
        extent = extent.move_dims(isl.dim_type.set, 1, isl.dim_type.param, 0, n) \
            .project_out(isl.dim_type.set, 1, n)
        limit = isl.Set.read_from_str(self.model.ctx,
                                      f"{{ [x] : -{SMALL_LOOP} <= x <= {SMALL_LOOP} }}")
        return extent.is_subset(limit)

    def __call__(self, node: isl.AstNode, build: isl.AstBuild) -> isl.AstNode:
        try:
            return self.analyse(node, build)
        except BaseException as exc:  # an exception escaping an isl callback aborts the process
            self.error = exc
            return node

    def analyse(self, node, build):
        sched = _flat_range(build.get_schedule())
        ldom = sched.domain()
        depth = _maps(sched)[0].dim(isl.dim_type.out) - 1
        stmts = _names(ldom)
        info = LoopInfo(depth=depth, statements=stmts)
        reasons = []
        any_carried = False
        for var in sorted(set(self.deps.flow) | set(self.deps.anti) | set(self.deps.output)):
            carried = {kind: self.carried(getattr(self.deps, kind)[var], sched, ldom, depth)
                       for kind in ("flow", "anti", "output") if var in getattr(self.deps, kind)}
            written = any(self.by_name[s].target_name == var for s in stmts)
            if not any(carried.values()) and not (written and var in self.locals):
                continue
            any_carried = any_carried or any(carried.values())
            users = [self.by_name[s] for s in stmts if self.by_name[s].accesses(var)]
            ops = {_reduction_op(s, var) for s in users}
            if any(carried.values()) and len(ops) == 1 and None not in ops:
                if var in self.locals:
                    info.reductions[var] = ops.pop()
                elif ops == {"+"} and small_target(self.kernel, var, users):
                    info.privatized[var] = _flat_size(self.kernel.array_type(var))
                elif ops == {"+"}:
                    info.atomic |= frozenset(s.name for s in users)
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
                    info.private += (var,)
                continue
            kinds = [k for k, v in carried.items() if v]
            reasons.append(f"{var!r} has loop-carried {'/'.join(kinds)} dependences")
        info.parallel = not reasons
        info.carried = any_carried
        info.small = self.small_trip_count(sched, depth)
        info.reason = "; ".join(reasons)
        key = f"loop{len(self.loops)}"
        self.loops[key] = info
        return node.set_annotation(isl.Id(key, context=self.model.ctx))


def _flat_size(at: ir.ArrayType) -> ir.Expr:
    out = at.shape[0]
    for ext in at.shape[1:]:
        out = ir.Binary("*", out, ext, ir.i64)
    return out


def ast_children(node: isl.AstNode) -> list:
    """The child nodes of an ISL AST node (for walkers)."""
    t = node.get_type()
    if t == isl.ast_node_type.for_:
        return [node.for_get_body()]
    if t == isl.ast_node_type.if_:
        kids = [node.if_get_then_node()]
        if node.if_has_else_node():
            kids.append(node.if_get_else_node())
        return kids
    if t == isl.ast_node_type.block:
        ch = node.block_get_children()
        return [ch.get_at(k) for k in range(ch.n_ast_node())]
    if t == isl.ast_node_type.mark:
        return [node.mark_get_node()]
    return []


def loop_info(node: isl.AstNode, loops: dict) -> Optional[LoopInfo]:
    """The LoopInfo attached to an AST for-node (None for other nodes)."""
    if node.get_type() != isl.ast_node_type.for_:
        return None
    try:
        return loops.get(node.get_annotation().get_name())
    except isl.Error:
        return None


def _order_dependent(info: LoopInfo, kernel: ir.Kernel) -> str:
    """Why running ``info``'s loop in parallel could change float results bit-wise, or ''."""
    floats = [v for v in info.reductions if kernel.scalar_dtype(v).is_float]
    floats += [a for a in info.privatized if kernel.array_type(a).dtype.is_float]
    if info.atomic:
        floats.append("atomic updates")
    return ", ".join(floats)


def _map_openmp(node: isl.AstNode, loops: dict, kernel: ir.Kernel, deterministic: bool,
                enclosing: Optional[LoopInfo] = None) -> bool:
    """Choose ``omp parallel for`` / ``simd`` loops; returns True if a for-node is below.

    With ``deterministic``, loops whose parallel form reorders floating-point
    sums (reduction clauses, privatized copies, atomics) stay sequential, so
    results are bit-for-bit the same on every run and thread count.
    ``enclosing`` is the 'omp parallel for' loop around ``node``, if any.
    """
    info = loop_info(node, loops)
    inside_parallel = enclosing is not None
    order = _order_dependent(info, kernel) if info is not None and deterministic else ""
    if info is not None and info.parallel and order:
        info.mapping = f"left sequential (deterministic=True): parallel form reorders {order}"
    elif info is not None and info.parallel and info.small:
        info.mapping = f"left sequential: at most {SMALL_LOOP} iterations, too few for threads"
    elif info is not None and info.parallel:
        if inside_parallel:
            info.mapping = "runs inside an enclosing 'omp parallel for' loop"
        elif not info.atomic or not _has_clean_parallel(node.for_get_body(), loops):
            info.omp_parallel = True
            info.mapping = "outermost parallel loop: 'omp parallel for'"
        else:
            info.mapping = ("left sequential: it needs atomics, and an inner loop is "
                            "parallel without them")
    below = False
    for child in ast_children(node):
        below |= _map_openmp(child, loops, kernel, deterministic,
                             info if info is not None and info.omp_parallel else enclosing)
    if info is not None:
        # 'omp simd' on innermost loops whose only carried dependences are
        # reductions (the clause lets the sum be vectorized: 5x on the TV cost),
        # never with private scalars: gcc 12 miscompiles 'parallel for simd
        # private(...)' (tests/test_ad_primal_values.py::two_writers).
        # Privatized sums (a filter gradient d_f[k] += ...) get an array-section
        # reduction clause on the simd loop too: per-lane partial sums. Its final
        # combine writes the whole section, so inside a thread loop the section
        # must be that loop's private copy too (else threads race on it).
        shared = set(info.privatized) - set(enclosing.privatized if enclosing else ())
        if (not below and info.parallel and not info.private and not info.atomic
                and not (inside_parallel and shared)):
            info.simd = True
            info.mapping += ("; innermost loop: 'omp simd'" + (
                " with the reduction clause" if info.reductions or info.privatized else ""))
        return True
    return below


def _has_clean_parallel(node: isl.AstNode, loops: dict) -> bool:
    info = loop_info(node, loops)
    if info is not None and info.parallel and not info.atomic and not info.small:
        return True
    return any(_has_clean_parallel(c, loops) for c in ast_children(node))


def schedule_kernel(kernel: ir.Kernel, deterministic: bool = False) -> ScheduledKernel:
    """Split, prove bounds, compute dependences, build and annotate the AST of ``kernel``.

    ``deterministic=True`` keeps loops sequential where the parallel form would
    reorder floating-point sums (see ``_map_openmp``).
    """
    split, dead = remove_dead_statements(split_boundary_pieces(kernel))
    split, expansions = expand_and_distribute(split)
    split = ascending_order_free_nests(split)
    split, gather_decisions = scatter_to_gather(split, PolyModel(split))
    split, fused = fuse_zero_initialization(split)
    model = PolyModel(split)
    requirements: list[SizeRequirement] = check_bounds(split, model)
    # Scalars are private or reductions; which one only their flow decides.
    deps = dependences(model, flow_only=frozenset(n for n, _ in split.locals))
    program_order = _program_order_schedule(model)
    ast, loops = _build_ast(program_order, split, model, deps, deterministic)
    schedule, origin = program_order, "program order"
    parallel, looped = _parallel_score(ast, loops)
    if parallel < looped:  # some loop nest runs sequentially: ask ISL for a better schedule
        # The scheduler may reorder anything: it needs every dependence, scalars' too.
        isl_schedule = _isl_schedule(model, dependences(model))
        if isl_schedule is None:
            origin = "program order (the ISL scheduler gave up within its operation quota)"
        else:
            ast2, loops2 = _build_ast(isl_schedule, split, model, deps, deterministic)
            if _parallel_score(ast2, loops2)[0] > parallel:
                schedule, ast, loops = isl_schedule, ast2, loops2
                origin = "ISL scheduler (more parallel than the program order)"
            else:
                origin = "program order (the ISL schedule is not more parallel)"
    return ScheduledKernel(split, model, deps, schedule, ast, loops, requirements,
                           gather_decisions, origin, dead, expansions, fused)


def _program_order_schedule(model: PolyModel) -> isl.Schedule:
    schedule = isl.Schedule.from_domain(model.union_domain())
    if model.max_depth > 0 or len(model.kernel.statements) > 1:
        mupa = isl.MultiUnionPwAff.from_union_map(model.schedule_map())
        schedule = schedule.insert_partial_schedule(mupa)
    return schedule


# Bound on ISL's scheduler work (isl "operations"); past it we keep program order.
SCHEDULER_QUOTA = 2_000_000


def _isl_schedule(model: PolyModel, deps: Dependences) -> Optional[isl.Schedule]:
    """ISL's own schedule (validity = coincidence = proximity = all dependences), or None."""
    all_deps = deps.all(model.context.get_space())
    sc = (isl.ScheduleConstraints.on_domain(model.union_domain())
          .set_context(model.context).set_validity(all_deps)
          .set_coincidence(all_deps).set_proximity(all_deps))
    ctx = model.ctx
    ctx.set_schedule_outer_coincidence(1)
    ctx.set_schedule_max_coefficient(4)
    ctx.reset_operations()
    ctx.set_max_operations(SCHEDULER_QUOTA)
    try:
        return sc.compute_schedule()
    except isl.Error:
        return None
    finally:
        ctx.set_max_operations(0)
        ctx.reset_operations()


def _build_ast(schedule: isl.Schedule, kernel: ir.Kernel, model: PolyModel, deps: Dependences,
               deterministic: bool):
    analysis = _LoopAnalysis(kernel, model, deps)
    build = isl.AstBuild.from_context(model.context)
    build, handle = build.set_after_each_for(analysis)
    ast = build.node_from_schedule(_separate_loops(schedule))
    del handle
    if analysis.error is not None:
        raise analysis.error
    _map_openmp(ast, analysis.loops, kernel, deterministic)
    return ast, analysis.loops


def _parallel_score(ast: isl.AstNode, loops: dict) -> tuple[int, int]:
    """(statements under an 'omp parallel for', statements under any loop) of an AST."""
    parallel, looped = set(), set()

    def walk(node, in_loop, in_parallel):
        info = loop_info(node, loops)
        in_loop = in_loop or info is not None
        in_parallel = in_parallel or (info is not None and info.omp_parallel)
        if node.get_type() == isl.ast_node_type.user:
            name = node.user_get_expr().get_op_arg(0).get_id().get_name()
            if in_loop:
                looped.add(name)
            if in_parallel:
                parallel.add(name)
        for c in ast_children(node):
            walk(c, in_loop, in_parallel)

    walk(ast, False, False)
    return len(parallel), len(looped)


def _separate_loops(schedule: isl.Schedule) -> isl.Schedule:
    """Ask for separate loops per piece so interior loops carry no border conditions."""

    def visit(node: isl.ScheduleNode) -> isl.ScheduleNode:
        if node.get_type() == isl.schedule_node_type.band:
            for k in range(node.band_n_member()):
                node = node.band_member_set_ast_loop_type(k, isl.ast_loop_type.separate)
        return node

    return schedule.map_schedule_node_bottom_up(visit)
