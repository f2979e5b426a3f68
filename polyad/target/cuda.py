"""The CUDA target: the schedule's loop facts mapped onto a grid, and CUDA C source.

``plan`` is the only place a CUDA strategy is chosen:

- **Grid mapping.** The outermost loop that may run in parallel, and the
  parallel loops perfectly nested in it (at most 3), become a kernel launch:
  the innermost of them goes to ``x`` (unit stride: coalesced accesses),
  blocks of 256 threads (256, 32x8 or 32x4x2), grid-stride loops so any grid
  size is correct. A band whose loops all have at most 64 iterations (the
  OpenMP target's ``SMALL_LOOP``), or one that needs atomics, is passed over
  when a loop below it is parallel without them and long (as the OpenMP
  target does). Boundary pieces are guarded threads of the band
  (``schedule.guarded_pieces``), not loops of their own. Loops inside a band
  run sequentially in each thread; code outside every band runs in
  one-thread launches, host loops around a band launch it per iteration.
- **Distribution.** A one-loop band whose body holds a loop that could be a
  second grid axis beside other code (a row loop with border statements
  beside its column loop, a zeroing beside a summing loop) runs as one launch
  per part of its body, in order, the loop parts as 2-D grids, where the
  schedule proves the parts may run apart (``schedule.why_parts_not_apart``).
  One thread walking a whole row is uncoalesced and leaves most of the GPU
  idle: the float32 4096x4096 deconvolution gradient took 23.5 ms so on an
  H200, 1.9 ms distributed.
- **Scalar reductions** carried by the band: a per-thread partial, one block
  reduction (warp shuffles, shared memory) and one ``atomicAdd`` per block;
  ``deterministic=True``: block sums stored, then added in a fixed order
  (two passes). '*' reductions use a compare-and-swap product.
- **Scatters.** Into a small target (a filter gradient): when the target has
  at most ``LANE_ELEMENTS`` elements and the band only adds to it
  (``d_f[k] += ...``), per-thread partial sums (registers once nvcc unrolls
  the tap loop) and one block reduction per element, no atomics until the
  block's sums (shared-memory atomics on 5 addresses from 256 threads
  serialize: 9.6 ms for the 4096x4096 deconvolution gradient on an H100);
  otherwise a block-private copy in shared memory,
  shared-memory ``atomicAdd`` per update, one global ``atomicAdd`` per element
  and block. Into other targets: global ``atomicAdd``. With ``deterministic=True`` loops with float scatters stay
  sequential (no fixed-order form).

``CudaLoopPlan`` entries have the fields the C emitter and ``pa.explain``
read (``iterator``, ``threads``, ``simd``, ``atomic``, ``privatized``,
``mapping``, ``pragma``, ``decision``) plus the grid: ``axis``, and on the
band's first loop ``band`` (its loops' keys) and ``block``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import islpy as isl

from .. import ir
from ..emit.c_openmp import signature
from ..emit.cexpr import C99
from ..emit.cuda import CUDA, emit_cuda
from ..runtime.cuda import DEFAULT_ARCH, CudaKernel
from ..runtime.toolchain import CUDA_INCLUDE
from ..schedule import (LoopFacts, ScheduledKernel, ast_children, guarded_pieces, loop_key,
                        why_parts_not_apart)
from ..schedule.nests import STATEMENT_GROUP, sequence_nodes, skip_marks, statement_names
from .openmp import _Planner, _small
from .openmp import plan as openmp_plan

# Threads per block by band depth: whole warps along x, 256 threads in all.
BLOCK_SHAPES = {1: (256, 1, 1), 2: (32, 8, 1), 3: (32, 4, 2)}
# Largest small scatter target kept as per-thread register partials (one register each,
# and one block reduction each at the end of the launch).
LANE_ELEMENTS = 16


@dataclass(frozen=True)
class CudaLoopPlan:
    """What the CUDA target does with one loop.

    ``threads``: the loop is a grid loop (one of a band's loops, ``axis`` x/y/z);
    on the band's first loop ``band`` lists the band's loop keys (outermost
    first) and ``block`` the block shape; ``reductions``, ``privatized``
    (small scatter targets: array -> elements), ``lanes`` (those of them kept
    as per-thread register partials rather than shared-memory copies) and
    ``atomic`` (statements with global atomics) cover the whole band;
    ``two_pass``: deterministic reductions.
    """

    facts: LoopFacts
    iterator: str
    threads: bool = False
    axis: Optional[str] = None
    band: tuple = ()
    block: tuple = ()
    reductions: dict = field(default_factory=dict)
    privatized: dict = field(default_factory=dict)
    lanes: frozenset = frozenset()
    atomic: frozenset = frozenset()
    two_pass: bool = False
    mapping: str = ""
    simd: bool = False
    region: str = ""  # no OpenMP-style parallel regions: each grid is its own launch
    # a distributed loop (``_CudaPlanner.distribute``): one head per launch, each with the
    # ``parts`` of the loop's body it runs (indices into ``schedule.nests.sequence_nodes``)
    launches: tuple = ()
    parts: tuple = ()

    @property
    def private(self) -> tuple:
        return self.facts.private

    def pragma(self, names, size_text, ast_text=None) -> None:
        """CUDA loops carry no directive (the grid is the emitter's launch)."""
        return None

    def sections_maybe_empty(self) -> list:
        """No reduction clause privatizes an array section here (block copies and
        register partials are the emitter's own): none to guard."""
        return []

    def decision(self) -> str:
        """One line for people: grid axis and how carried dependences are honoured."""
        if not self.threads:
            return "parallel, runs sequentially" if self.facts.parallel else "sequential"
        if self.launches:
            return (f"cuda distributed over {len(self.launches)} launches, one per part of "
                    f"its body: " + " | ".join(
                        f"parts {', '.join(str(p + 1) for p in h.parts)}: "
                        + h.decision().removeprefix("cuda ") for h in self.launches))
        parts = [f"grid {self.axis}"]
        if self.band:
            parts[0] += f" (block {'x'.join(map(str, self.block[:len(self.band)]))})"
        for var, op in sorted(self.reductions.items()):
            how = "two-pass fixed-order sum" if self.two_pass else "block reduction + atomicAdd"
            parts.append(f"{var} ({op}=): {how}")
        for a, n in sorted(self.privatized.items()):
            parts.append(f"{a}[0:{ir.expr_str(n)}]: "
                         + ("per-thread partial sums, one block reduction per element"
                            if a in self.lanes else "shared-memory copy per block"))
        if self.atomic:
            parts.append(f"atomicAdd {', '.join(sorted(self.atomic))}")
        return "cuda " + "; ".join(parts)


@dataclass(frozen=True)
class CudaPlan:
    """The CUDA plan of a scheduled kernel: a CudaLoopPlan per AST loop, C names, options."""

    scheduled: object
    loops: dict
    names: dict
    deterministic: bool
    arch: str = (f"nvcc -arch=native when a GPU is present, else -arch={DEFAULT_ARCH} "
                 f"(double-precision atomicAdd needs sm_60+)")

    def notes(self) -> list[str]:
        """Target-wide facts for ``pa.explain``: architecture, launches, where scalars live."""
        heads = [h for lp in self.loops.values() for h in (lp.launches or (lp,)) if h.band]
        return [f"architecture: {self.arch}",
                f"{len(heads)} grid launch(es), blocks of 256 threads (32x8 for 2-D bands); "
                f"code outside grid loops runs in one-thread launches",
                "scalars live in device memory; in a grid launch each thread keeps its own "
                "copy of the scalars it writes (partials for reductions)",
                "the host launcher takes device pointers; numpy arrays are copied in and out "
                "by the Python wrapper, __cuda_array_interface__ arrays are used in place"
                + ("; reductions are two-pass and fixed-order (deterministic=True)"
                   if self.deterministic else "")]

    def loop(self, node: isl.AstNode) -> Optional[CudaLoopPlan]:
        key = loop_key(node)
        return None if key is None else self.loops.get(key)

    def score(self) -> tuple[int, int]:
        """(statements in a grid loop, statements under any loop); border pieces
        (``Statement.on_border``: a face of their statement's domain) do not count."""
        parallel, looped = set(), set()
        border = {st.name for st in self.scheduled.kernel.statements if st.on_border}

        def walk(node, in_loop, in_grid):
            lp = self.loop(node)
            in_loop = in_loop or lp is not None
            in_grid = in_grid or (lp is not None and lp.threads)
            if node.get_type() == isl.ast_node_type.user:
                names = node.user_get_expr().get_op_arg(0).get_id().get_name() \
                    .split(STATEMENT_GROUP)
                if in_loop:
                    looped.update(names)
                if in_grid:
                    parallel.update(names)
            for c in ast_children(node):
                walk(c, in_loop, in_grid)

        walk(self.scheduled.ast, False, False)
        return len(parallel - border), len(looped - border)


class _CudaPlanner(_Planner):
    """Chooses the grid bands; names iterators as the OpenMP planner does."""

    def eligible(self, facts: Optional[LoopFacts]) -> bool:
        if facts is None or not facts.parallel:
            return False
        if not self.deterministic:
            return True
        k = self.kernel
        if any(k.array_type(a).dtype.is_float for a in facts.scatters):
            return False  # scatters have no fixed-order form: keep them sequential
        return all(op == "+" or not k.scalar_dtype(v).is_float
                   for v, op in facts.reductions.items())

    def facts(self, node) -> Optional[LoopFacts]:
        key = loop_key(node)
        return self.scheduled.loops.get(key) if key is not None else None

    def band(self, node) -> list:
        band = [node]
        while len(band) < 3:
            body = skip_marks(band[-1].for_get_body())
            if body.get_type() != isl.ast_node_type.for_ or not self.eligible(self.facts(body)):
                break
            band.append(body)
        return band

    def clean_inside(self, node) -> bool:
        """A loop below that may go to the grid without atomics and is not small."""
        for c in ast_children(node):
            f = self.facts(c)
            if self.eligible(f) and not self.strategy(f)[1] and not _small(f):
                return True
            if self.clean_inside(c):
                return True
        return False

    def walk(self, node: isl.AstNode, iters: dict, in_grid: bool) -> None:
        facts = self.facts(node)
        if facts is None:
            for c in ast_children(node):
                self.walk(c, iters, in_grid)
            return
        if not in_grid and self.eligible(facts):
            band = self.band(node)
            band_facts = [self.facts(b) for b in band]
            atomics = any(self.strategy(f)[1] for f in band_facts)
            if not ((all(_small(f) for f in band_facts) or atomics)
                    and self.clean_inside(band[-1])):
                refused = self.distribute(node, facts, iters) if len(band) == 1 else ""
                if refused is not None:
                    self.grid_band(band, band_facts, iters, refused=refused)
                return
            why = ("left sequential: too few iterations for a grid, and a loop inside is long"
                   if not atomics else
                   "left sequential: it needs atomics, and a loop inside is parallel without them")
        elif in_grid:
            why = "runs sequentially in each thread of the enclosing grid loop"
        else:
            why = ("left sequential (deterministic=True): its parallel form reorders sums"
                   if facts.parallel else "")
        it = node.for_get_iterator().get_id().get_name()
        name = self.iterator_name(node, it, iters)
        self.loops[facts.key] = CudaLoopPlan(facts, name, mapping=why)
        for c in ast_children(node):
            self.walk(c, {**iters, it: name}, in_grid)

    def grid_loop(self, node) -> Optional[isl.AstNode]:
        """The loop ``node`` is, or the loop that an ``if`` without ``else`` runs as its
        whole body (marks looked through), when it may be a grid axis: parallel without
        atomics and not small."""
        node = skip_marks(node)
        if node.get_type() == isl.ast_node_type.if_ and not node.if_has_else_node():
            node = skip_marks(node.if_get_then_node())
        f = self.facts(node)
        if self.eligible(f) and not self.strategy(f)[1] and not _small(f):
            return node
        return None

    def distribute(self, node, facts: LoopFacts, iters: dict) -> Optional[str]:
        """Plan the grid loop ``node`` as one launch per part of its body when a part is a
        loop that can be a second grid axis and the parts may run apart
        (``schedule.why_parts_not_apart``): a row loop whose body holds an interior loop
        beside border statements, or a zeroing beside a summing loop, then runs as 2-D
        grids (adjacent threads on adjacent columns: coalesced) instead of one thread per
        row walking its row. Consecutive other children make one part, a 1-D launch.
        Returns None when planned so, else why not ("" where distribution would not deepen
        the grid), and plans nothing."""
        if not isinstance(self.scheduled, ScheduledKernel):
            return ""  # a candidate being scored: the grid's depth does not change it
        children = sequence_nodes(node.for_get_body())
        parts, run = [], []
        for k, child in enumerate(children):
            loop = self.grid_loop(child)
            if loop is None:
                run.append(k)
                continue
            if run:
                parts.append((tuple(run), None))
                run = []
            parts.append(((k,), loop))
        if run:
            parts.append((tuple(run), None))
        if len(parts) < 2 or all(loop is None for _, loop in parts):
            return ""
        names = [[n for k in ks for n in statement_names(children[k])] for ks, _ in parts]
        why = why_parts_not_apart(self.scheduled, names)
        if why:
            return why
        heads = []
        for (ks, loop), part_names in zip(parts, names):
            band = [node] + (self.band(loop)[:2] if loop is not None else [])
            heads.append(self.grid_band(band, [self.facts(b) for b in band], iters,
                                        (ks, part_names, [children[k] for k in ks])))
        it = node.for_get_iterator().get_id().get_name()
        self.loops[facts.key] = CudaLoopPlan(
            facts, self.iterator_name(node, it, iters), threads=True, launches=tuple(heads),
            mapping=("parallel loop whose body holds a grid loop beside other code: the "
                     "body's parts run as launches of their own, in order (no dependence "
                     "runs from a later part to an earlier one)"))
        return None

    def grid_band(self, band: list, band_facts: list, iters: dict, part=None, refused=""):
        """Plan ``band`` as one launch. ``part``: (indices, statement names, nodes) of the
        part of the first loop's body that the launch runs, for a distributed loop; the
        head's plan is then returned (the loop's entry holds its launches) instead of
        recorded. ``refused``: why the first loop's body does not run one launch per part."""
        reductions, privatized, atomic = {}, {}, frozenset()
        for f in band_facts:
            reductions.update(f.reductions)
            p, a = self.strategy(f)
            privatized.update(p)
            atomic |= a
        names = statement_names(band[-1]) if part is None else part[1]
        if part is not None:
            written = {self.by_name[n].target_name for n in names}
            reductions = {v: op for v, op in reductions.items() if v in written}
            privatized = {a: n for a, n in privatized.items() if a in written}
            atomic = atomic & set(names)
        lanes = self.register_partials(names, privatized)
        block = BLOCK_SHAPES[len(band)]
        axes = "xyz"[:len(band)][::-1]
        keys = tuple(f.key for f in band_facts)
        head_plan = None
        for k, (node, f, axis) in enumerate(zip(band, band_facts, axes)):
            it = node.for_get_iterator().get_id().get_name()
            name = self.iterator_name(node, it, iters)
            iters = {**iters, it: name}
            head = k == 0
            mapping = (f"outermost parallel loop{'s' if len(band) > 1 else ''}: one launch, "
                       f"grid-stride loop{'s' if len(band) > 1 else ''} over "
                       f"{'x'.join(map(str, block[:len(band)]))}-thread blocks"
                       if head else f"grid axis {axis} of the enclosing launch")
            if head and refused:
                mapping += f" (not one launch per part of its body: {refused})"
            lp = CudaLoopPlan(
                f, name, threads=True, axis=axis, band=keys if head else (),
                block=block if head else (), reductions=reductions if head else {},
                privatized=privatized if head else {}, lanes=lanes if head else frozenset(),
                atomic=atomic if head else frozenset(),
                two_pass=self.deterministic and bool(reductions), mapping=mapping,
                parts=part[0] if head and part is not None else ())
            if head and part is not None:
                head_plan = lp
            else:
                self.loops[f.key] = lp
        inside = ast_children(band[-1]) if part is None or len(band) > 1 else part[2]
        for c in inside:
            self.walk(c, iters, True)
        return head_plan

    def register_partials(self, names: list, privatized: dict) -> frozenset:
        """The privatized arrays each thread can sum into an array of its own: at most
        LANE_ELEMENTS elements, and every access by the statements ``names`` of the band
        an update (``+=``/``-=``), nothing reads the target. Constant indices (after nvcc
        unrolls small tap loops) keep the partials in registers."""
        statements = [self.by_name[n] for n in names]
        lanes = set()
        for a, n in privatized.items():
            size = ir.eval_integer(n, {})
            if size is None or size > LANE_ELEMENTS:
                continue
            updates_only = all(not (isinstance(st.target, ir.Load) and st.target.array == a)
                               or st.op in ("+=", "-=") for st in statements)
            read = any(ld.array == a for st in statements
                       for e in (st.expr, st.guard) if e is not None for ld in ir.loads(e))
            if updates_only and not read:
                lanes.add(a)
        return frozenset(lanes)


def plan(scheduled, deterministic: bool = False) -> CudaPlan:
    """The CUDA plan of a ScheduledKernel (or ScheduleCandidate).

    A ScheduledKernel's AST is rebuilt with boundary pieces as conditions
    inside one loop nest per band (``schedule.guarded_pieces``): the nest is
    then perfect, so a 2-D stencil maps onto a 2-D grid with guarded threads
    at the border instead of a grid over rows with the border pieces and the
    interior loop run sequentially by each thread.
    """
    if isinstance(scheduled, ScheduledKernel):
        scheduled = guarded_pieces(scheduled)
    planner = _CudaPlanner(scheduled, deterministic)
    planner.walk(scheduled.ast, {}, False)
    return CudaPlan(scheduled, planner.loops, planner.names, deterministic)


class CudaTarget:
    """CUDA C for nvcc, or for the CPU simulator (``simulate``); see ``polyad.target.Target``.

    ``cuda``: nvcc ``-O3 -shared``, ``-arch=native`` with a GPU else ``sm_80``;
    calls raise ``pa.DeviceError`` without a GPU. ``cuda-sim``: the same text
    compiled by the C++ compiler against ``polyad_cuda_sim.h``, run on the CPU.
    """

    source_suffix = ".cu"
    dialect = CUDA
    # Schedules of its own: the OpenMP target reorders bands for unit-stride inner loops
    # (one thread walks a row), which would give a grid of strips here, where adjacent
    # threads on adjacent columns are what coalesces.
    schedule_family = "cuda"
    unit_stride_schedule = False
    # what `polyad emit` writes beside the .cu (it includes polyad_cuda.h)
    runtime_headers = (CUDA_INCLUDE / "polyad_cuda.h", CUDA_INCLUDE / "polyad_cuda_sim.h")
    header_note = (
        "The definition (NAME.cu) is CUDA C++: a host launcher with this C signature",
        "that launches the kernels. Array and temporary pointers are DEVICE pointers",
        "(cudaMalloc); the result pointer is a host pointer. Build it with",
        f"nvcc -O3 -arch=native (or -arch={DEFAULT_ARCH}; double atomicAdd needs sm_60+) with",
        "polyad_cuda.h beside it; compiled by a C++ compiler instead, polyad_cuda_sim.h runs",
        "it on the CPU. After a call, pa_last_error() returns the first CUDA error or NULL.")

    def __init__(self, simulate: bool):
        self.simulate = simulate
        self.name = "cuda-sim" if simulate else "cuda"

    def plan(self, scheduled, options) -> CudaPlan:
        return plan(scheduled, options.deterministic)

    def score(self, plan: CudaPlan) -> tuple[int, int]:
        return openmp_plan(plan.scheduled, plan.deterministic).score()

    def emit(self, plan: CudaPlan) -> str:
        return emit_cuda(plan)

    def signature(self, kernel: ir.Kernel):
        # The launcher's parameters are the OpenMP function's; the loader's cdef
        # takes C99 spelling (the .cu text spells restrict as __restrict__).
        return signature(kernel, C99)

    def load(self, build, sanitize: Optional[str] = None) -> CudaKernel:
        if sanitize:
            raise ValueError(f"sanitize={sanitize!r} is only available with target 'openmp'")
        return CudaKernel(build.kernel, build.source, build.signature, list(build.requirements),
                          list(build.param_names), self.simulate)


__all__ = ["BLOCK_SHAPES", "CudaLoopPlan", "CudaPlan", "CudaTarget", "plan"]
