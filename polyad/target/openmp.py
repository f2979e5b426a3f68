"""The OpenMP target: today's mapping of loop facts to OpenMP, and its C source.

``plan`` is the only place an OpenMP strategy is chosen: per loop, whether it
becomes ``omp parallel for``, ``omp simd``, both or neither; how each carried
dependence the schedule stage classified is honoured (scalar reductions by a
reduction clause, private scalars by ``private``, scatters into small targets
by an array-section reduction (privatized copies), other scatters by
``omp atomic``); and the C name of every loop iterator. The emitter and
``pa.explain`` only read the plan (``LoopPlan.pragma`` and
``LoopPlan.decision`` render the same typed entries).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional

import islpy as isl

from .. import ir
from ..ad.exprs import affine_form
from ..emit.c_openmp import cname, dsl_c_names, emit_c, signature
from ..emit.cexpr import C99, ast_expr_c, unparen
from ..runtime.loader import CompiledKernel
from ..schedule import LoopFacts, ast_children, loop_key
from ..schedule.nests import ast_expr_uses, loop_vars_along, user_nodes, user_statements
from ..schedule.locality import strided_accesses
from ..schedule.machine import host_is_x86_64, last_level_cache_bytes

# Loops with at most this many iterations, whatever the sizes (filter taps,
# channels of a fixed-size layer), are never made 'omp parallel for': a thread
# team costs more than they do.
SMALL_LOOP = 64

# A parallel innermost loop inside this many sequential loops is left sequential: the
# threads would synchronize (fork/join, or a barrier inside a parallel region) once per
# iteration of the enclosing loops, that is O(N^2) times, for O(N) work each time
# (floyd-warshall's anti-diagonal wavefront inside its k loop: 1.3 million barriers at
# N = 800, against a sequential nest that gcc runs at memory speed).
THIN_DEPTH = 2

# An output at least this large is stored past the caches (``LoopPlan.stream``): half the
# host's last cache level. A kernel that writes such an array reads at least as much
# (its inputs), so the array's lines would leave the cache before anyone read them: a
# normal store reads each line from memory first (a read for ownership) and writes it
# back later, a streaming store only writes it. The deconvolution gradient's d_x row at
# 2048^2 float64 (32 MiB) ran in 0.86-0.89 of the time (2 threads, C edited by hand,
# interleaved runs, AVX-512).
STREAM_SHARE_OF_CACHE = 0.5
# ... by a loop of at least this many vectors: a shorter row spends a larger share in its
# scalar head and tail, the lines at its ends stored the usual way. The 3-D stencil's
# gradient at 256^3 float32 (rows of 254 elements, 16 floats a vector) ran in 1.09-1.17x
# the time with its rows streamed, at 256^3 float64 and 161^3 in 0.98-1.01x; the
# deconvolution's and TV's gradients (rows of 2048 and 4096) in 0.88-0.99x.
STREAM_ROW_VECTORS = 32

# A parallel region whose shared loops are all innermost synchronizes its threads once
# per innermost loop (trisolv: a barrier per row for one row's work); it runs in
# threads only when such a loop can have this many iterations (an 'if' clause on the
# sizes), a barrier costing about what a few thousand streamed elements do.
THIN_WORK = 8192

@dataclass(frozen=True)
class LoopPlan:
    """What the OpenMP target does with one loop (a typed plan entry).

    ``facts``: the schedule stage's LoopFacts; ``iterator``: the loop
    variable's C name (the report uses it too); ``threads``: ``omp parallel
    for``; ``simd``: ``omp simd`` (with ``threads``: ``parallel for simd``);
    ``privatized``: scatter targets (array -> element count) given per-thread
    copies through an array-section reduction clause; ``atomic``: statements
    whose scatters are made ``omp atomic`` when they run in threads;
    ``mapping``: why the loop got this mapping (``pa.explain`` prints it).
    ``region``: its part in a parallel region that spans a sequential loop
    (one thread team for all its iterations instead of a fork per iteration):
    ``"open"`` (a sequential loop that opens ``omp parallel``; every thread
    runs its iterations), ``"team"`` (a sequential loop inside such a region,
    run by every thread), ``"for"`` (a ``threads`` loop inside one: a
    worksharing ``omp for``), or ``""`` (none). ``cyclic``: the work of an
    iteration grows or shrinks with the iteration (inner loop bounds depend on
    it: triangular nests), so iterations are dealt round-robin
    (``schedule(static, 1)``) instead of in one block per thread.
    ``region_if``: for an ``"open"`` region whose shared loops are all innermost
    (one loop's work between two barriers), their extents (ISL AST expressions in
    the sizes): the region runs in threads only when one reaches ``THIN_WORK``;
    ``lane_sums``: the loop only adds into elements that do not change along
    it (a privatized filter gradient ``d_w[co, ci, kh, kw] += ...`` over a
    pixel row): the emitter runs it in blocks of this many iterations, each
    lane summing into its own partial accumulator (a vector register), and
    adds the lanes to the element once after the loop (0: not this form).
    ``register_sums``: privatized arrays of an 'omp simd' loop that its statements only
    add into, at elements invariant along it (``d_f[0] += ...`` beside other work along a
    row): each element sums in a scalar of its own under the simd reduction clause and
    is updated once after the loop, instead of an array-section reduction (which gcc 12
    sets up and combines element by element on every entry of the loop, and does not
    vectorize well).
    ``value_blocks``: (width, row temporary or '', statement names) for a sequential loop
    whose values the emitter runs in blocks of ``width``: the children of its body holding
    the named statements once, with the copies of those statements for the block's values
    side by side (one pass over their rows shares their reads), the other children once
    per value in turn; each value on its own row of the temporary, if any
    (``schedule.loop_order.block_sum_rows_in_registers``); the values left over after
    the whole blocks as written (``_Planner.value_blocks``). () otherwise.
    ``stream``: (array, lanes, elements, iterations) for an 'omp simd' loop whose
    statements only assign one element of a kernel output that the kernel never reads, one
    element per iteration along the array's last dimension: where the array has at least
    ``elements`` elements (``STREAM_SHARE_OF_CACHE`` of the last-level cache: it does not
    stay in the caches) and the loop at least ``iterations`` iterations, the emitter
    computes the values ``lanes`` at a time and stores each vector with a streaming store
    (past the caches, without reading the line first). () otherwise.
    """

    facts: LoopFacts
    iterator: str
    threads: bool = False
    simd: bool = False
    privatized: dict = field(default_factory=dict)
    atomic: frozenset = frozenset()
    mapping: str = ""
    region: str = ""
    cyclic: bool = False
    region_if: tuple = ()
    lane_sums: int = 0
    register_sums: tuple = ()
    value_blocks: tuple = ()
    stream: tuple = ()

    @property
    def reductions(self) -> dict:
        return self.facts.reductions

    @property
    def private(self) -> tuple:
        return self.facts.private

    @property
    def buffers_per_thread(self) -> bool:
        """A thread loop outside any region whose iterations each own row buffers
        (``facts.row_buffers``: each iteration writes every row it reads before reading
        it): the emitter opens the parallel region around the loop, allocates the buffers
        there once per thread and shares the iterations out with 'omp for', so a thread's
        iterations reuse its buffers. (Allocated in every iteration, a buffer's pages went
        back to the system at each free and were faulted in again by the next malloc:
        the deconvolution gradient at 2048^2 float64 spent about a tenth of its time so,
        32 chunks a call.)"""
        return self.threads and self.region == "" and bool(self.facts.row_buffers)

    def directive(self) -> Optional[str]:
        """``parallel for``, ``for`` (inside a region), with `` simd``; ``simd``;
        ``parallel`` (a sequential loop opening a region); or None."""
        if self.threads:
            return ("for" if self.region == "for" else "parallel for") + (
                " simd" if self.simd else "")
        if self.region == "open":
            return "parallel"
        return "simd" if self.simd else None

    def clauses(self) -> list[tuple[str, str, list]]:
        """The data clauses as (kind, operator, items): kind ``reduction`` (scalars),
        ``privatized`` (array sections, items (array, elements)), ``private``."""
        out = []
        by_op: dict[str, list[str]] = {}
        for var, op in sorted(self.reductions.items()):
            by_op.setdefault(op, []).append(var)
        out += [("reduction", op, names) for op, names in by_op.items()]
        if self.privatized:
            out.append(("privatized", "+", sorted(self.privatized.items())))
        if self.private:
            out.append(("private", "", sorted(self.private)))
        return out

    def pragma(self, names: dict, size_text, ast_text=None) -> Optional[str]:
        """The ``#pragma omp`` line of the loop (None when it has none).

        ``names``: DSL name -> C name; ``size_text(expr)``: C text of a size;
        ``ast_text(ast_expr)``: C text of an ISL AST expression in the sizes.
        """
        head = self.directive()
        if head is None:
            return None
        if self.region == "open":
            return "#pragma omp parallel" + self.if_clause(ast_text or _ast_c)
        if self.threads:
            head += self.schedule_clause()
        return f"#pragma omp {head}" + self.data_clauses(names, size_text)

    def schedule_clause(self) -> str:
        return " schedule(static, 1)" if self.cyclic else " schedule(static)"

    def data_clauses(self, names: dict, size_text) -> str:
        """The reduction and private clauses of the loop's directive, each after a space."""
        parts = []
        for kind, op, items in self.clauses():
            if kind == "reduction":
                parts.append(f"reduction({op}:{', '.join(names[v] for v in items)})")
            elif kind == "privatized":
                empty = dict(self.sections_maybe_empty())
                parts.append("reduction(+:" + ", ".join(
                    f"{names[a]}[0:pa_imax({size_text(n)}, 1)]" if a in empty
                    else f"{names[a]}[0:{size_text(n)}]" for a, n in items) + ")")
            else:
                parts.append(f"private({', '.join(names[v] for v in items)})")
        return "".join(" " + p for p in parts)

    def thread_region_pragmas(self, names: dict, size_text) -> tuple[str, str]:
        """The two ``#pragma omp`` lines of a loop whose row buffers are allocated once per
        thread (``buffers_per_thread``): the region's, with the data clauses (a reduction
        on the region sums each thread's private copy, which the worksharing loop inside
        updates), and the worksharing loop's, with the schedule."""
        loop = "for simd" if self.simd else "for"
        return (f"#pragma omp parallel{self.data_clauses(names, size_text)}",
                f"#pragma omp {loop}{self.schedule_clause()}")

    def sections_maybe_empty(self) -> list:
        """The privatized array sections ``(array, elements)`` of a thread loop whose
        element count is not a positive constant. gcc 12 initializes and combines a
        private copy with loops that run at least once, so a section of no elements had
        one element written past it (the conv gradient's filter sums with no input
        channel: a segmentation fault); the clause gives such a section at least one
        element and the emitter points the array at one element of the stack where it is
        empty (``emit.c_openmp``). A worksharing loop inside a region is left alone: its
        pointers there would be the threads' own."""
        if not self.threads or self.region == "for":
            return []
        return [(a, n) for a, n in sorted(self.privatized.items())
                if not (isinstance(n, ir.Const) and n.value >= 1)]

    def if_clause(self, ast_text) -> str:
        """`` if(...)`` of a region that pays only from THIN_WORK iterations on, or ''."""
        if not self.region_if:
            return ""
        return " if(" + " || ".join(f"{unparen(ast_text(e))} >= {THIN_WORK}"
                                    for e in self.region_if) + ")"

    def decision(self) -> str:
        """One line for people: the directive and its clauses, by DSL name."""
        head = self.directive()
        if self.region == "team":
            return "sequential, run by every thread of the enclosing parallel region"
        if self.lane_sums:
            return f"per-lane partial sums: {self.lane_sums} lanes, 'omp simd' across the lanes"
        if head is None:
            return ("parallel, runs sequentially" if self.facts.parallel else "sequential") + (
                ", " + self.block_decision if self.value_blocks else "")
        if self.region == "open":
            return ("omp parallel" + self.if_clause(_ast_c) + ": one thread team around "
                    "this sequential loop, every thread runs its iterations")
        parts = []
        for kind, op, items in self.clauses():
            if kind == "reduction":
                parts.append(f"reduction({op}: {', '.join(items)})")
            elif kind == "privatized":
                parts.append("privatized(" + ", ".join(f"{a}[0:{ir.expr_str(n)}]"
                                                       for a, n in items) + ")")
            else:
                parts.append(f"private({', '.join(items)})")
        if self.atomic and self.threads:
            parts.append(f"atomic {', '.join(sorted(self.atomic))}")
        if self.register_sums:
            parts.append(f"sums of {', '.join(self.register_sums)} in scalars (one per "
                         f"element, in the reduction clause)")
        if self.buffers_per_thread:
            parts.append(f"own row buffers {', '.join(self.facts.row_buffers)} per iteration, "
                         f"allocated once per thread in the parallel region around the loop")
        elif self.facts.row_buffers:
            parts.append(f"own row buffers {', '.join(self.facts.row_buffers)} per iteration")
        if self.cyclic and self.threads:
            parts.append("schedule(static, 1)")
        if self.stream:
            array, lanes, elements, iterations = self.stream
            parts.append(f"{array} stored past the caches, {lanes} elements per streaming "
                         f"store, where it has at least {elements} elements and the loop "
                         f"at least {iterations} iterations")
        return "omp " + head + "".join(" " + p for p in parts)

    @property
    def block_decision(self) -> str:
        """What running the loop in blocks does, or ''."""
        if not self.value_blocks:
            return ""
        width, row, _ = self.value_blocks
        if row:
            return (f"run in blocks of {width} values (each on its own row of {row}, the sums "
                    f"of a block in one pass over the row), the values left over as written")
        return (f"run in blocks of {width} values (no dependence carried: the copies of a "
                f"block in one pass over their rows, sharing their reads), the values left "
                f"over as written")


@dataclass(frozen=True)
class OpenMPPlan:
    """The OpenMP plan of a scheduled kernel: a LoopPlan per AST loop (by LoopFacts key)
    and the C name of every DSL name."""

    scheduled: object  # a ScheduledKernel or a ScheduleCandidate
    loops: dict
    names: dict

    def loop(self, node: isl.AstNode) -> Optional[LoopPlan]:
        """The plan of an AST for-node (None for other nodes)."""
        key = loop_key(node)
        return None if key is None else self.loops.get(key)

    def shares_work(self, node: isl.AstNode) -> bool:
        """Inside a parallel region: whether ``node`` holds a worksharing loop (then every
        thread of the team runs it; else one thread does, in 'omp single')."""
        lp = self.loop(node)
        if lp is not None and lp.region in ("team", "for"):
            return True
        return any(self.shares_work(c) for c in ast_children(node))

    def score(self) -> tuple[int, int]:
        """(parallel work, the most it could be) over the deepest statements.

        Deepest: the statements with the most loops around them in the kernel, whose
        instances grow fastest with the sizes (the leading term of the work: a copy
        loop that another schedule makes parallel does not outweigh them). Each scores
        2 under an 'omp parallel for' that pays, 1 under one in a region that runs in
        threads only from THIN_WORK iterations on (``region_if``: one loop's work per
        barrier) or in a vector loop (simd, per-lane partial sums) outside threads that
        walks its arrays at unit stride, and 0 otherwise; the most is 2 per deepest
        statement under a loop. A border piece (``Statement.on_border``) is not deepest:
        its instances lie on a face of its statement's domain.
        """
        parallel, looped = {}, set()
        deepest = max((len(st.loops) for st in self.scheduled.kernel.statements), default=0)
        by_name = {st.name: st for st in self.scheduled.kernel.statements}

        def walk(node, in_loop, threads, thin, vector):
            lp = self.loop(node)
            if lp is not None:
                in_loop = True
                thin = thin or bool(lp.region_if)
                threads = threads or lp.threads
                vector = node.for_get_iterator().get_id().get_name() \
                    if lp.simd or lp.lane_sums else None
            if node.get_type() == isl.ast_node_type.user:
                for st, call in user_statements(node, by_name):
                    if len(st.loops) == deepest and in_loop and not st.on_border:
                        looped.add(st.name)
                        work = 2 if threads and not thin else 1 if threads or (
                            vector is not None and _unit_stride_along(st, call, vector)) else 0
                        parallel[st.name] = max(parallel.get(st.name, 0), work)
            for c in ast_children(node):
                walk(c, in_loop, threads, thin, vector)

        walk(self.scheduled.ast, False, False, False, None)
        return sum(parallel.values()), 2 * len(looped)


def _unit_stride_along(st: ir.Statement, call: isl.AstExpr, iterator: str) -> bool:
    """The AST loop ``iterator`` runs over one loop of ``st``, along which every access of
    ``st`` has unit stride."""
    uses = loop_vars_along(st, call, iterator)
    return len(uses) == 1 and strided_accesses(st, uses[0]) == 0


def _order_dependent(facts: LoopFacts, kernel: ir.Kernel) -> str:
    """Why running the loop in parallel could change float results bit-wise, or ''."""
    floats = [v for v in facts.reductions if kernel.scalar_dtype(v).is_float]
    floats += [a for a, s in facts.scatters.items()
               if s.small and kernel.array_type(a).dtype.is_float]
    if any(not s.small for s in facts.scatters.values()):
        floats.append("atomic updates")
    return ", ".join(floats)


def _is_multiple_of(expr: isl.AstExpr, iterator: str) -> bool:
    """``expr`` is ``T * iterator`` for an integer ``T``."""
    if expr.get_type() != isl.ast_expr_type.op or expr.get_op_type() != isl.ast_expr_op_type.mul:
        return False
    a, b = expr.get_op_arg(0), expr.get_op_arg(1)
    if a.get_type() != isl.ast_expr_type.int:
        a, b = b, a
    return (a.get_type() == isl.ast_expr_type.int and b.get_type() == isl.ast_expr_type.id
            and b.get_id().get_name() == iterator)


def _bounds_use(node: isl.AstNode, iterator: str) -> bool:
    """Some for-node at or below ``node`` has bounds that use ``iterator``."""
    if node.get_type() == isl.ast_node_type.for_:
        for e in (node.for_get_init(), node.for_get_cond()):
            if ast_expr_uses(e, iterator):
                return True
    return any(_bounds_use(c, iterator) for c in ast_children(node))


def _ast_c(e: isl.AstExpr) -> str:
    return ast_expr_c(e, {})


def _has_loop(node: isl.AstNode) -> bool:
    """A for-node at or below ``node``."""
    return loop_key(node) is not None or any(_has_loop(c) for c in ast_children(node))


def _flat_body(node: isl.AstNode) -> list:
    """The nodes of a loop body, nested blocks (mere sequences) spliced in."""
    if node.get_type() != isl.ast_node_type.block:
        return [node]
    return [n for kid in ast_children(node) for n in _flat_body(kid)]


def _adds_along(st: ir.Statement, call, it: str, arrays: set) -> bool:
    """Does ``st`` (AST call ``call``) add (``+=``/``-=``) into an element of one of
    ``arrays`` that stays the same along the AST loop ``it`` (its index uses none of the
    statement's loop variables that the loop changes)?"""
    along = set(loop_vars_along(st, call, it))
    return (isinstance(st.target, ir.Load) and st.target.array in arrays
            and st.op in ("+=", "-=")
            and not any(isinstance(x, ir.LoopVar) and x.name in along
                        for ix in st.target.index for x in ir.walk(ix)))


def _iterator_arg(call: isl.AstExpr, k: int, iterators: set) -> bool:
    """Is the value of the statement's loop variable ``k`` in the AST call ``call`` one of
    ``iterators`` (an iterator of a loop around it, not an expression)?"""
    arg = call.get_op_arg(k + 1)
    return arg.get_type() == isl.ast_expr_type.id and arg.get_id().get_name() in iterators


def _for_nodes(node: isl.AstNode) -> list:
    """The for-nodes at or below ``node``."""
    here = [node] if loop_key(node) is not None else []
    return here + [n for c in ast_children(node) for n in _for_nodes(c)]


def _control_uses(node: isl.AstNode, it: str) -> bool:
    """Whether a loop bound, step or ``if`` condition at or below ``node`` uses ``it``."""
    t = node.get_type()
    if t == isl.ast_node_type.for_:
        if any(ast_expr_uses(e, it) for e in (node.for_get_init(), node.for_get_cond(),
                                               node.for_get_inc())):
            return True
    elif t == isl.ast_node_type.if_ and ast_expr_uses(node.if_get_cond(), it):
        return True
    return any(_control_uses(c, it) for c in ast_children(node))


def _small(facts: LoopFacts) -> bool:
    """At most SMALL_LOOP iterations whatever the sizes."""
    return facts.trip_count_bound is not None and facts.trip_count_bound <= SMALL_LOOP


class _Planner:
    def __init__(self, scheduled, deterministic: bool):
        self.scheduled = scheduled
        self.kernel: ir.Kernel = scheduled.kernel
        self.deterministic = deterministic
        self.names = dsl_c_names(self.kernel)
        self.by_name = {st.name: st for st in self.kernel.statements}
        self.loops: dict[str, LoopPlan] = {}

    def strategy(self, facts: LoopFacts) -> tuple[dict, frozenset]:
        """(privatized arrays -> elements, atomic statements) for the loop's scatters."""
        privatized = {a: s.elements for a, s in facts.scatters.items() if s.small}
        atomic = frozenset().union(*[s.statements for s in facts.scatters.values()
                                     if not s.small])
        return privatized, atomic

    def walk(self, node: isl.AstNode, iters: dict, enclosing: Optional[LoopPlan]) -> bool:
        """Plan the loops in ``node``; returns True if a for-node is at or below it.

        ``enclosing``: the 'omp parallel for' loop around ``node``, if any.
        """
        key = loop_key(node)
        facts = self.scheduled.loops.get(key) if key is not None else None
        if facts is None:
            below = False
            for child in ast_children(node):
                below |= self.walk(child, iters, enclosing)
            return below
        it = node.for_get_iterator().get_id().get_name()
        name = self.iterator_name(node, it, iters)
        privatized, atomic = self.strategy(facts)
        threads, mapping = self.threads(node, facts, atomic, enclosing, len(iters))
        cyclic = threads and _bounds_use(node.for_get_body(), it)
        if cyclic:
            mapping += ("; inner loop bounds depend on it (the work per iteration may "
                        "vary, as in triangular nests): iterations dealt round-robin, "
                        "schedule(static, 1)")
        lp = LoopPlan(facts, name, threads, False, privatized, atomic, mapping, cyclic=cyclic)
        below = False
        for child in ast_children(node):
            below |= self.walk(child, {**iters, it: name}, lp if threads else enclosing)
        # 'omp simd' on innermost loops whose only carried dependences are
        # reductions (the clause lets the sum be vectorized: 5x on the TV cost),
        # never on a thread loop with private scalars: gcc 12 miscompiles 'parallel
        # for simd private(...)' (tests/test_ad_primal_values.py::two_writers). An
        # inner 'omp simd private(r, ...)' is fine (the conv gradient's pointwise
        # loop r = max(s, 0) - y; d_r = ...; ran scalar without it: a third of the
        # forward recompute's time).
        # Privatized sums (a filter gradient d_f[k] += ...) get an array-section
        # reduction clause on the simd loop too: per-lane partial sums. Its final
        # combine writes the whole section, so inside a thread loop the section
        # must be that loop's private copy too (else threads race on it).
        shared = set(privatized) - set(enclosing.privatized if enclosing else ())
        lanes = self.lane_sums(node, it, facts, threads, enclosing, below)
        if lanes:
            # per-lane partial sums instead of a 'simd reduction' over the whole array
            # section (which gcc 12 sets up and combines element by element on every
            # entry of the loop), or instead of a scalar loop (a sum into an element of a
            # large array: gemm's gradient d_A[i, k] += d_C[i, j] * B[k, j] along j)
            lp = LoopPlan(facts, name, threads, False, {}, atomic, mapping + (
                f"; innermost loop adds into elements invariant along it: per-lane "
                f"partial sums ({lanes} lanes, sized for {self.scheduled.vector_unit}) into "
                f"{', '.join(sorted(facts.scatters))}"),
                lane_sums=lanes)
        elif (not below and facts.parallel and not (facts.private and threads) and not atomic
                and not (enclosing is not None and shared)):
            sums = self.invariant_sums(node, it, set(privatized))
            lp = LoopPlan(facts, name, threads, True,
                          {a: n for a, n in privatized.items() if a not in sums}, atomic,
                          cyclic=cyclic, register_sums=sums, mapping=mapping + (
                "; innermost loop: 'omp simd'" + (
                    " with the reduction clause" if facts.reductions or privatized else "")))
        if lp.simd and not lp.threads and not lp.register_sums:
            stream = self.streamed_store(node, it, facts)
            if stream:
                lp = dataclasses.replace(lp, stream=stream, mapping=lp.mapping + (
                    f"; {stream[0]} written once along it and never read: stored past the "
                    f"caches where it has at least {stream[2]} elements and the loop at "
                    f"least {stream[3]} iterations"))
        if not lp.threads and not lp.simd and not lp.lane_sums:
            blocks = self.value_blocks(node, it, facts, set(iters))
            if blocks:
                lp = dataclasses.replace(lp, value_blocks=blocks)
                lp = dataclasses.replace(lp, mapping="; ".join(
                    m for m in (lp.mapping, lp.block_decision) if m))
        self.loops[key] = lp
        return True

    def value_blocks(self, node, it: str, facts: LoopFacts, enclosing: set) -> tuple:
        """(width, row temporary or '', the statements whose copies share a pass) when the
        emitter runs the loop ``node`` in blocks (``LoopPlan.value_blocks``), else ().

        Two cases. The ``block`` loop of a ``sum row`` (``schedule.loop_order.
        block_sum_rows_in_registers`` proved it legal): its body's children (blocks
        spliced) each either all sums into the row or none of them, the sums' children
        consecutive, no child before them reading the row, none after them writing it.
        Or a loop that carries no dependence (``LoopFacts.carried``: each element it
        writes is written by one iteration, so any order of its iterations' instances
        gives the same values, bit for bit) whose statements all write array elements
        (no scalar: the copies would share it) and read, along their innermost loop, more
        values that do not use the loop (what the copies share) than do, the targets
        counted (the conv layer's ``d_x`` gather: 9 rows of ``d_s`` for each row of
        ``d_x``); every child is then copied within its pass, at least ``2 * width``
        iterations where the count is bounded.

        Both need the AST shape the copies take: step 1 up to a bound (``it < e`` or
        ``it <= e``); no bound or condition inside using the loop (each copy reruns the
        body's control as it is); no loop inside with lanes, scalar sums, privatized
        copies, threads or blocks of its own (their setup would not follow the copies);
        every statement inside takes the loop's iterator for the blocked variable, and
        the loops around for all its outer variables (``enclosing``: their iterators): a
        border row, where ISL fixes one (``h = 0``), runs as written (it takes a row's
        share of the time, and its copies would as much of the C compiler's)."""
        T = isl.ast_expr_op_type
        cond = node.for_get_cond()
        if (_ast_c(node.for_get_inc()) != "1" or cond.get_type() != isl.ast_expr_type.op
                or cond.get_op_type() not in (T.le, T.lt)
                or cond.get_op_arg(0).get_type() != isl.ast_expr_type.id
                or cond.get_op_arg(0).get_id().get_name() != it):
            return ()
        variables: set = set()
        self._collect_loop_vars(node.for_get_body(), it, variables)
        if len(variables) != 1:
            return ()
        (var,) = variables
        kids = []
        for kid in _flat_body(node.for_get_body()):
            if _control_uses(kid, it) or any(
                    lp.threads or lp.lane_sums or lp.register_sums or lp.privatized
                    or lp.value_blocks
                    for lp in (self.loops.get(loop_key(n)) for n in _for_nodes(kid))
                    if lp is not None):
                return ()
            calls = [pair for u in user_nodes(kid) for pair in user_statements(u, self.by_name)]
            for st, call in calls:
                if var not in st.loop_vars:
                    return ()
                at = st.loop_vars.index(var)
                if not all(_iterator_arg(call, k, enclosing) for k in range(at)) or \
                        not _iterator_arg(call, at, {it}):
                    return ()
            kids.append([st for st, _ in calls])
        temps = [t for t in self.kernel.temps if t.block == var]
        if temps:
            return self._row_block(kids, temps[0])
        return self._parallel_block(kids, var, facts)

    def _row_block(self, kids: list, temp: ir.Temp) -> tuple:
        """``value_blocks`` for the ``block`` loop of the sum row ``temp``."""
        row = temp.name
        kinds = []
        for sts in kids:
            sums = [st.target_name == row and st.op != "=" for st in sts]
            if any(sums) and not all(sums):
                return ()
            kinds.append("sums" if any(sums) else
                         "reads" if any(row in st.read_names() for st in sts) else
                         "writes" if any(st.target_name == row for st in sts) else "other")
        if "sums" not in kinds:
            return ()
        first = kinds.index("sums")
        last = len(kinds) - 1 - kinds[::-1].index("sums")
        if ("reads" in kinds[:first] or "writes" in kinds[last + 1:]
                or any(k != "sums" for k in kinds[first:last + 1])):
            return ()
        jammed = frozenset(st.name for sts in kids for st in sts
                           if st.target_name == row and st.op != "=")
        return (int(temp.type.shape[0].value), row, jammed)

    def _parallel_block(self, kids: list, var: str, facts: LoopFacts) -> tuple:
        """``value_blocks`` for a loop that carries no dependence (a gather's): blocks of
        the vector unit's ``row_block`` values."""
        sts = [st for k in kids for st in k]
        width = self.scheduled.vector_unit.row_block
        if (facts.carried or not sts
                or (facts.trip_count_bound is not None and facts.trip_count_bound < 2 * width)
                or any(not isinstance(st.target, ir.Load) or not st.loops for st in sts)):
            return ()
        varying = dict.fromkeys(ld for st in sts for ld in ir.loads(st.expr) + [st.target]
                                if ir.uses_loop_vars(ld, {st.loops[-1].var}))
        shared = sum(1 for ld in varying if not ir.uses_loop_vars(ld, {var}))
        if shared <= len(varying) - shared:
            return ()
        return (width, "", frozenset(st.name for st in sts))

    def lane_sums(self, node, it: str, facts: LoopFacts, threads: bool,
                  enclosing: Optional[LoopPlan], below: bool) -> int:
        """How many lanes of partial sums the innermost loop ``node`` gets, or 0.

        Only for a sequential loop whose body is plain statements, each adding (no
        guard) into an element of an array the loop scatters into, whose index does not
        use the loop (so the element is the same on every iteration: a sum along the
        loop), and in the default mode (the lanes reassociate the sum, as a reduction
        clause does). Inside an 'omp parallel for' loop, each such array must be one
        that loop does not scatter into, or privatizes (else the threads would race on
        the final update of the element). Not for a loop of border pieces only
        (``Statement.on_border``). Lanes of two vectors per sum of the vector unit the
        schedule was sized for (``VectorUnit.lane_bits``: 32 floats on AVX-512, 16 on
        AVX2), enough independent adds to hide the add latency, as the hand-written
        baselines' LANES; one vector each where the loop sums into more than
        ``VectorUnit.two_vector_sums`` elements, the latency then hidden by the other sums
        and their accumulators kept in registers (the conv layer's filter gradient blocked
        over 2 output channels on AVX-512: 18 sums, which as 36 vectors spilled).
        """
        if (below or threads or not facts.scatters or self.deterministic
                or not facts.parallel or facts.private or facts.reductions):
            return 0
        targets = set(facts.scatters)
        if enclosing is not None and any(a in enclosing.facts.scatters
                                         and a not in enclosing.privatized for a in targets):
            return 0
        along = self.sums_along(node, it, targets)
        if along is None:
            return 0
        dtypes, elements = along
        if all(self.by_name[n].on_border for n in facts.statements):
            # a border piece's sums run on a face of the domain (a dimension fewer
            # iterations than the interior's): lanes would add code, not speed
            return 0
        if len(dtypes) != 1 or not next(iter(dtypes)).is_float:
            return 0
        unit = self.scheduled.vector_unit
        lanes = unit.lane_bits // next(iter(dtypes)).bits
        if elements > unit.two_vector_sums:
            lanes //= 2
        if facts.trip_count_bound is not None and facts.trip_count_bound < lanes:
            return 0  # never a whole block of lanes (filter taps)
        return lanes

    def streamed_store(self, node, it: str, facts: LoopFacts) -> tuple:
        """``LoopPlan.stream`` of the vector loop ``node`` (iterator ``it``), or ().

        When: on x86-64 (its streaming stores); the body is plain statements (no guard),
        the first assigning and the others adding into the same element of a float array
        that is a kernel parameter no statement of the kernel reads in an expression (a
        ``+=`` into it reads the element the store left, coherent); the element's last
        index is a statement loop variable plus a constant, the variable the loop's own
        iterator, and no other index uses the loop; not border pieces alone, and a loop
        that may run ``STREAM_ROW_VECTORS`` vectors; an array stored row after row (no
        packed layout). The values are those of the plain loop, each computed by the same
        expression: only where they are stored changes."""
        if not host_is_x86_64():
            return ()
        users = _flat_body(node.for_get_body())
        if not users or any(u.get_type() != isl.ast_node_type.user for u in users):
            return ()
        pairs = [pair for u in users for pair in user_statements(u, self.by_name)]
        params = {p.name for p in self.kernel.params if p.is_array}
        target = None
        for k, (st, call) in enumerate(pairs):
            t = st.target
            if (st.guard is not None or not isinstance(t, ir.Load) or t.array not in params
                    or st.op != ("=" if k == 0 else "+=")):
                return ()
            args = tuple(call.get_op_arg(i).to_str() for i in range(1, call.get_op_n_arg()))
            if target is None:
                target = (t, args)
            elif (t, args) != target:
                return ()
        t, _ = target
        st, call = pairs[0]
        at_type = self.kernel.array_type(t.array)
        dtype = at_type.dtype
        # (a packed layout's elements along the last index need not be contiguous: the
        # vector of lanes is stored as one run)
        if not dtype.is_float or dtype.packed or at_type.layout is not None or any(
                ld.array == t.array for s in self.kernel.statements for e in s.exprs()
                for ld in ir.loads(e)):
            return ()
        along = loop_vars_along(st, call, it)
        if len(along) != 1 or not _iterator_arg(call, st.loop_vars.index(along[0]), {it}):
            return ()
        var = ir.LoopVar(along[0])
        last = affine_form(t.index[-1])
        if last is None or last[0].get(var) != 1 or any(
                ir.uses_loop_vars(ix, {var.name}) for ix in t.index[:-1]):
            return ()
        if all(self.by_name[n].on_border for n in facts.statements):
            return ()
        lanes = self.scheduled.vector_unit.bits // dtype.bits
        iterations = STREAM_ROW_VECTORS * lanes
        if facts.trip_count_bound is not None and facts.trip_count_bound < iterations:
            return ()
        elements = max(1, int(STREAM_SHARE_OF_CACHE * last_level_cache_bytes())
                       // dtype.np.itemsize)
        return (t.array, lanes, elements, iterations)

    def invariant_sums(self, node, it: str, arrays: set) -> tuple:
        """The ``arrays`` (privatized by loop ``node``, iterator ``it``) that every statement
        of the loop touching them only adds into (``+=``/``-=``, reading them nowhere), at
        an index that does not use the loop, sorted; () unless all of them are."""
        if not arrays:
            return ()
        for u in user_nodes(node.for_get_body()):
            for st, call in user_statements(u, self.by_name):
                touched = arrays & st.read_names() | arrays & {st.target_name}
                if not touched:
                    continue
                if (not _adds_along(st, call, it, arrays)
                        or any(ld.array in arrays for e in st.exprs() for ld in ir.loads(e))):
                    return ()
        return tuple(sorted(arrays))

    def sums_along(self, node, it: str, targets: set) -> Optional[tuple[set, int]]:
        """(the dtypes of the targets, how many distinct target elements) when the body of
        loop ``node`` (iterator ``it``) is plain statements, each adding (no guard) into an
        element of one of ``targets`` whose index does not use the loop: every iteration
        adds into the same elements (sums along the loop); else None."""
        users = _flat_body(node.for_get_body())
        if not users or any(u.get_type() != isl.ast_node_type.user for u in users):
            return None
        dtypes, elements = set(), set()
        for st, call in [pair for u in users for pair in user_statements(u, self.by_name)]:
            if (len(loop_vars_along(st, call, it)) != 1 or st.guard is not None
                    or not _adds_along(st, call, it, targets)):
                return None
            dtypes.add(self.kernel.array_type(st.target.array).dtype)
            args = tuple(call.get_op_arg(i).to_str() for i in range(1, call.get_op_n_arg()))
            elements.add((st.target, args))
        return dtypes, len(elements)

    def threads(self, node, facts: LoopFacts, atomic: frozenset,
                enclosing: Optional[LoopPlan], loops_above: int) -> tuple[bool, str]:
        """Whether the loop becomes 'omp parallel for', and why (or why not).

        ``loops_above``: how many loops enclose it."""
        if not facts.parallel:
            return False, ""
        if (enclosing is None and loops_above >= THIN_DEPTH
                and not _has_loop(node.for_get_body())):
            return False, (f"left sequential: an innermost loop inside {loops_above} "
                           f"sequential loops: a thread synchronization per iteration of "
                           f"them for one loop's work")
        order = _order_dependent(facts, self.kernel) if self.deterministic else ""
        if order:
            return False, f"left sequential (deterministic=True): parallel form reorders {order}"
        if _small(facts):
            return False, f"left sequential: at most {SMALL_LOOP} iterations, too few for threads"
        if enclosing is not None:
            return False, "runs inside an enclosing 'omp parallel for' loop"
        if atomic and all(st.on_border for st in self.kernel.statements if st.name in atomic):
            return False, ("left sequential: its scatters are border pieces (a face of the "
                           "domain: too little work to pay for atomic updates)")
        it = node.for_get_iterator().get_id().get_name()
        if atomic and self.sums_along(node, it, set(facts.scatters)) is not None:
            return False, ("left sequential: every iteration adds into the same elements "
                           "(a sum along the loop), threads would update them atomically")
        if not atomic or not self.has_clean_parallel(node.for_get_body()):
            return True, "outermost parallel loop: 'omp parallel for'"
        return False, ("left sequential: it needs atomics, and an inner loop is "
                       "parallel without them")

    def regions(self, node: isl.AstNode, inside: bool) -> None:
        """Open one parallel region around each outermost sequential loop that has
        'omp parallel for' loops below it: they become worksharing 'omp for' loops of
        one thread team (a barrier each instead of a fork/join each iteration), the
        sequential loops between run in every thread (their bounds depend on sizes and
        iterators only, so every thread takes the same path) and everything else
        inside runs in 'omp single' (the emitter's part)."""
        key = loop_key(node)
        lp = self.loops.get(key) if key is not None else None
        if lp is None:
            for child in ast_children(node):
                self.regions(child, inside)
            return
        if lp.threads:
            if inside:
                # (a worksharing loop's reduction clause cannot name scalars private to the
                # threads of the region: its sums stay array-section reductions)
                self.loops[key] = dataclasses.replace(
                    lp, region="for", mapping=lp.mapping + "; inside the parallel region of "
                    "an enclosing sequential loop: worksharing 'omp for'", register_sums=(),
                    privatized={**lp.privatized, **{a: lp.facts.scatters[a].elements
                                                    for a in lp.register_sums}})
            return
        if not self.threads_below(node.for_get_body()):
            return
        if inside:
            self.loops[key] = dataclasses.replace(lp, region="team")
            self.regions(node.for_get_body(), True)
            return
        mapping = ((lp.mapping + "; " if lp.mapping else "")
                   + "one 'omp parallel' region around this sequential loop: its parallel "
                   "loops share one thread team (no fork/join per iteration)")
        self.regions(node.for_get_body(), True)
        shared = self.shared_loops(node.for_get_body())
        extents = tuple(self.loops[loop_key(n)].facts.extent for n in shared)
        if all(not _has_loop(n.for_get_body()) for n in shared) \
                and not any(e is None for e in extents):
            mapping += (f"; its shared loops are innermost (one loop's work per barrier): "
                        f"threads only from {THIN_WORK} iterations on")
        else:
            extents = ()
        self.loops[key] = dataclasses.replace(lp, region="open", mapping=mapping,
                                              region_if=extents)

    def shared_loops(self, node: isl.AstNode) -> list:
        """The for-nodes of worksharing ('omp for') loops at or below ``node``."""
        lp = self.loops.get(loop_key(node)) if loop_key(node) is not None else None
        if lp is not None and lp.region == "for":
            return [node]
        return [n for c in ast_children(node) for n in self.shared_loops(c)]

    def threads_below(self, node: isl.AstNode) -> bool:
        """An 'omp parallel for' loop at or below ``node``."""
        lp = self.loops.get(loop_key(node)) if loop_key(node) is not None else None
        if lp is not None and lp.threads:
            return True
        return any(self.threads_below(c) for c in ast_children(node))

    def has_clean_parallel(self, node: isl.AstNode) -> bool:
        """A parallel loop below ``node`` that needs no atomics and is not small."""
        key = loop_key(node)
        facts = self.scheduled.loops.get(key) if key is not None else None
        if facts is not None and facts.parallel and not self.strategy(facts)[1] \
                and not _small(facts):
            return True
        return any(self.has_clean_parallel(c) for c in ast_children(node))

    def iterator_name(self, node, it: str, iters: dict) -> str:
        """The DSL loop variable this AST loop runs over, when that is unambiguous."""
        candidates: set = set()
        skewed: set = set()
        self._collect_loop_vars(node.for_get_body(), it, candidates, skewed, set(iters))
        taken = set(iters.values()) | set(self.names.values())
        if len(candidates) == 1:
            name = cname(candidates.pop())
            if name not in taken:
                return name
        elif not candidates and len(skewed) == 1:
            # a point loop of time-skewed tiles: it runs over v + s * t, t enclosing it
            name = cname(skewed.pop()) + "_skewed"
            if name not in taken:
                return name
        else:
            # a tile loop: the loops whose start it sets run over one DSL variable v
            points: set = set()
            self._collect_tiled_vars(node.for_get_body(), it, points)
            if len(points) == 1:
                name = cname(points.pop()) + "_tile"
                if name not in taken:
                    return name
        name = it
        while name in taken:
            name = "_" + name
        return name

    def _collect_tiled_vars(self, node, it, out: set):
        """The DSL variables of the loops below ``node`` that start at ``T * it`` (the
        point loops of a tile loop ``it``, ``schedule.tiling``; or at the largest of
        ``T * it`` and a bound, a time-skewed tile's, whose variables are skewed)."""
        init = node.for_get_init() if node.get_type() == isl.ast_node_type.for_ else None
        if init is not None and (_is_multiple_of(init, it) or (
                init.get_type() == isl.ast_expr_type.op
                and init.get_op_type() == isl.ast_expr_op_type.max
                and any(_is_multiple_of(init.get_op_arg(k), it)
                        for k in range(init.get_op_n_arg())))):
            self._collect_loop_vars(node.for_get_body(),
                                    node.for_get_iterator().get_id().get_name(), out, out)
        for c in ast_children(node):
            self._collect_tiled_vars(c, it, out)

    def _collect_loop_vars(self, node, it, out: set, skewed: Optional[set] = None,
                           enclosing: Optional[set] = None):
        """The DSL variables the statements below ``node`` take ``it`` for (``out``),
        and those they take an expression of ``it`` for (``skewed``; with ``enclosing``,
        only an expression that also uses one of those iterators)."""
        # (where several loop variables of a statement take the loop's value, the others
        # are fixed equal to the outermost by a condition: ``i == k`` of a split-off row)
        if node.get_type() == isl.ast_node_type.user:
            for st, call in user_statements(node, self.by_name):
                named = False
                for k in range(1, call.get_op_n_arg()):
                    a = call.get_op_arg(k)
                    if a.get_type() == isl.ast_expr_type.id:
                        if not named and a.get_id().get_name() == it:
                            out.add(st.loop_vars[k - 1])
                            named = True
                    elif skewed is not None and ast_expr_uses(a, it) and (
                            enclosing is None or any(ast_expr_uses(a, e) for e in enclosing)):
                        skewed.add(st.loop_vars[k - 1])
            return
        for c in ast_children(node):
            self._collect_loop_vars(c, it, out, skewed, enclosing)


def plan(scheduled, deterministic: bool = False) -> OpenMPPlan:
    """The OpenMP plan of a ScheduledKernel (or ScheduleCandidate).

    ``deterministic=True`` keeps loops sequential where the parallel form would
    reorder floating-point sums (reduction clauses, privatized copies,
    atomics), so results are the same bit for bit on every run and thread count.
    """
    planner = _Planner(scheduled, deterministic)
    planner.walk(scheduled.ast, {}, None)
    planner.regions(scheduled.ast, False)
    return OpenMPPlan(scheduled, planner.loops, planner.names)


class OpenMPTarget:
    """OpenMP C99 for the host compiler (``cc -O3 -fopenmp``); see ``polyad.target.Target``."""

    name = "openmp"
    source_suffix = ".c"
    dialect = C99
    # one thread streams a row best: the schedule stage reorders bands for unit stride
    unit_stride_schedule = True
    # a thread runs a chunk of rows: fused nests keep their temporaries' live rows per thread
    fuses_pipelines = True

    def plan(self, scheduled, options) -> OpenMPPlan:
        return plan(scheduled, options.deterministic)

    def score(self, plan: OpenMPPlan) -> tuple[int, int]:
        return plan.score()

    def emit(self, plan: OpenMPPlan) -> str:
        return emit_c(plan, self.dialect)

    def signature(self, kernel: ir.Kernel):
        return signature(kernel, self.dialect)

    def load(self, build, sanitize: Optional[str] = None) -> CompiledKernel:
        return CompiledKernel(build.kernel, build.source, build.signature,
                              list(build.requirements), list(build.param_names), sanitize,
                              build.deterministic, build.assigned_outputs)
