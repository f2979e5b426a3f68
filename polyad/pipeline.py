"""The one compilation path: IR -> schedule (facts) -> target plan -> source.

``compile_kernel(ir_kernel, Options(...))`` returns an ``Artifact`` (the
scheduled kernel, the target's plan, the source and the C signature). Every
entry point goes through it: ``pa.Kernel.compile`` / ``pa.compile`` (which
then hands the artifact to the target's loader), ``pa.explain`` (which only
reads an artifact), ``polyad.build`` and the CLI.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import pickle
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Union

from . import ir
from .errors import ArgumentError
from .poly import ISL_FAILURES
from .progress import StageClock
from .recent import Recent
from .runtime import toolchain
from .schedule import ScheduledKernel, machine, schedule_kernel
from .target import TARGETS, get_target
from .version import __version__ as POLYAD_VERSION

log = logging.getLogger("polyad")

SANITIZERS = (None, "address")


@dataclass(frozen=True)
class Options:
    """How to compile a kernel.

    ``target``: a name in ``polyad.target.TARGETS``; ``deterministic``: no
    parallel form that reorders floating-point sums (bit-identical results on
    every run and thread count); ``sanitize``: None or ``"address"``
    (AddressSanitizer; affects only the toolchain, not the source); ``tile``:
    tiling of nests of three or more loops (``schedule.tiling``): None for the
    cache model's tile sizes, False for none, or the sizes (positive integers,
    outermost loop first; the last repeats for deeper loops). ``fuse``: fuse chains of
    producer and consumer nests through rolling row buffers (``schedule.fusion``; targets
    whose threads run chunks of rows only, OpenMP): None (default) where a producer runs
    ahead, for the calls whose chunks keep the threads busy (the others run finer chunks,
    where a chunk recomputes few rows, or the unfused schedule), True also where none runs
    ahead and at every size, a positive integer as True in chunks of that many rows (64
    for True), False never.
    """

    target: str = "openmp"
    deterministic: bool = False
    sanitize: Optional[str] = None
    tile: object = None
    fuse: Union[bool, int, None] = None

    def __post_init__(self):
        get_target(self.target)
        if self.sanitize not in SANITIZERS:
            raise ValueError("sanitize must be None or 'address'")
        object.__setattr__(self, "deterministic", bool(self.deterministic))
        if not (self.fuse is None or isinstance(self.fuse, bool)
                or (isinstance(self.fuse, int) and self.fuse > 0)):
            raise ArgumentError(f"fuse must be None (fuse chains where a producer runs "
                                f"ahead), True (every chain), a positive number of rows "
                                f"(every chain, in chunks of that many rows) or False "
                                f"(none); got {self.fuse!r}")
        if self.tile not in (None, False):
            sizes = (self.tile,) if isinstance(self.tile, int) else tuple(self.tile)
            if not sizes or not all(isinstance(t, int) and not isinstance(t, bool) and t > 0
                                    for t in sizes):
                raise ArgumentError(f"tile must be None, False or positive integer tile sizes "
                                 f"such as (32, 32, 64); got {self.tile!r}")
            object.__setattr__(self, "tile", sizes)

    @property
    def target_object(self):
        """The ``Target`` named by ``target``."""
        return get_target(self.target)

    @property
    def source_options(self) -> "Options":
        """These options without what only the toolchain uses (one artifact serves both)."""
        return Options(self.target, self.deterministic, tile=self.tile, fuse=self.fuse)


@dataclass(frozen=True)
class Artifact:
    """A compiled kernel before the toolchain: every stage's result, read by all consumers.

    ``kernel``: the IR given; ``scheduled``: the ScheduledKernel (piece-split
    IR, ISL model, dependences, AST, LoopFacts); ``plan``: the target's plan;
    ``source``: the emitted text; ``signature``: its entry point's CSignature.
    """

    kernel: ir.Kernel
    options: Options
    scheduled: ScheduledKernel
    plan: object
    source: str
    signature: object

    @property
    def target(self):
        return get_target(self.options.target)

    @property
    def build(self) -> "Build":
        sk = self.scheduled
        return Build(sk.kernel, self.source, self.signature, tuple(sk.requirements),
                     tuple(sk.model.params), sk.chunked_extents, self.options.deterministic,
                     self.kernel.outputs_assigned_first(), sk.large_sizes, sk.fine_chunks)


@dataclass(frozen=True)
class Build:
    """What a target's loader needs, and nothing that ties it to one process.

    ``kernel``: the piece-split IR the source was emitted from; ``source``;
    ``signature``: its entry point's CSignature; ``requirements``: the size
    conditions checked before a call (``poly.SizeRequirement``); ``param_names``:
    the ISL parameter names in order; ``chunked_extents``: the extents of the loops
    fused chains run in chunks, where the fusion was the default's choice (the loader
    runs finer chunks, where ``fine_chunks``, or the unfused build for a call whose chunks
    leave threads idle: ``schedule.fusion.chunk_schedule``); ``deterministic``:
    the source is a ``deterministic=True`` build's (compiled with every product rounded,
    ``runtime.toolchain.arithmetic_flags``); ``assigned_outputs``: the ``pa.Out`` arrays
    the kernel assigns entirely before reading them (``ir.Kernel.outputs_assigned_first``:
    an omitted one needs no zeroing, ``runtime.output_pool``); ``large_sizes``: ``((size,
    bound), ...)``, where the source runs loops separated per piece only at sizes at least
    these (``poly.large_sizes``; the loader runs the unfused build for a large
    call below them, where fusion was the default's choice). Picklable: the
    pipeline cache stores it, so a new process loads a compiled kernel without running
    any stage.
    """

    kernel: ir.Kernel
    source: str
    signature: object
    requirements: tuple
    param_names: tuple
    chunked_extents: tuple = ()
    deterministic: bool = False
    assigned_outputs: tuple = ()
    large_sizes: tuple = ()
    fine_chunks: bool = False


def pipeline_key(ir_kernel: ir.Kernel, options: Options) -> str:
    """The pipeline cache key: the kernel's IR (called functions and derivative rules
    are part of it), the source-relevant options, the target, polyad's version and the
    host the decisions were sized for (``machine.host_key``: its CPU, its vector unit)."""
    text = "\0".join((repr(ir_kernel), repr(options.source_options), POLYAD_VERSION,
                      _package_digest(), machine.host_key()))
    return hashlib.sha256(text.encode()).hexdigest()[:24]


@functools.lru_cache(maxsize=None)
def _package_digest() -> str:
    """A hash of polyad's own Python sources: any change to the compiler (an
    edited checkout, not only a new version number) invalidates cached builds."""
    h = hashlib.sha256()
    root = Path(__file__).resolve().parent
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


# Counts the builds made by running the pipeline (not read from the cache) in
# this process; tests read it to show that a warm start runs no stage.
pipeline_runs = 0


def build_kernel(ir_kernel: ir.Kernel, options: Options = Options(),
                 artifact: Optional["Artifact"] = None,
                 make_artifact: Optional[Callable[[], "Artifact"]] = None) -> Build:
    """The loadable result of compiling ``ir_kernel``: read from the pipeline cache
    when an earlier process stored it, else compiled (``artifact`` if given, else
    ``make_artifact()`` if given, else ``compile_kernel``) and stored."""
    global pipeline_runs
    key = pipeline_key(ir_kernel, options)
    data = toolchain.read_cached(ir_kernel.name, key, ".pipeline")
    if data is not None:
        try:
            build = pickle.loads(data)
            if isinstance(build, Build):
                log.debug("pipeline cache hit %s_%s", ir_kernel.name, key)
                return build
        except Exception:  # a truncated or foreign entry: rebuild it
            pass
        log.warning("pipeline cache entry %s_%s is unreadable; rebuilding it",
                    ir_kernel.name, key)
    start = time.perf_counter()
    pipeline_runs += 1
    if artifact is None:
        artifact = (make_artifact() if make_artifact is not None
                    else compile_kernel(ir_kernel, options.source_options))
    build = artifact.build
    toolchain.write_cached(ir_kernel.name, key, ".pipeline", pickle.dumps(build))
    log.info("pipeline %s: %.2f s", ir_kernel.name, time.perf_counter() - start)
    return build


# The artifacts made through ``recent_artifact`` in this process, by (cache directory,
# pipeline key), the least recently used dropped first. A kernel object keeps its own
# artifacts (and its derived kernels), but objects of the same IR do not share them: a
# kernel factory called twice (the benchmarks' kernels by dtype),
# ``pa.Kernel(ir_kernel=...)``, a cell re-run in a notebook. Without this each would
# schedule again for ``pa.explain`` and its plan: the pipeline cache on disk keeps
# builds, not the ISL objects they read. Keyed by the directory too, as the disk layer
# in front of which it sits: a process that points POLYAD_CACHE_DIR elsewhere asks for
# fresh builds. Bounded, since an artifact holds its kernel's ISL objects.
recent_artifacts = Recent(24)


def recent_artifact(ir_kernel: ir.Kernel, options: "Options",
                    make: Callable[[], "Artifact"]) -> "Artifact":
    """The artifact of ``ir_kernel`` for ``options`` made earlier in this process (same
    pipeline key and cache directory), else ``make()``, remembered."""
    key = (str(toolchain.cache_dir()), pipeline_key(ir_kernel, options.source_options))
    return recent_artifacts.get_or_make(key, make)


def schedule_family(target) -> str:
    """Targets of one family score schedule candidates alike, so they can share a schedule."""
    return getattr(target, "schedule_family", target.name)


def compile_kernel(ir_kernel: ir.Kernel, options: Options = Options(),
                   scheduled: Optional[ScheduledKernel] = None) -> Artifact:
    """Schedule ``ir_kernel``, plan it for ``options.target`` and emit its source.

    ``scheduled``: the kernel's schedule already chosen for a target of the
    same ``schedule_family`` (with the same ``options.deterministic``, ``tile`` and ``fuse``), reused
    instead of scheduling again. A bug escaping a stage is raised as
    ``pa.InternalError`` naming the stage and the DSL statement it concerns.
    """
    target = get_target(options.target)
    clock = StageClock(ir_kernel.name)
    with ir.internal_errors("scheduling", ir_kernel, also=ISL_FAILURES):
        if scheduled is None:
            scheduled = schedule_kernel(
                ir_kernel, lambda cand: target.score(target.plan(cand, options)), clock,
                unit_stride=getattr(target, "unit_stride_schedule", False),
                # tiles are for caches of threads that run whole loops (CUDA's threads
                # run single iterations: its target schedules without them)
                tile=options.tile if getattr(target, "unit_stride_schedule", False) else False,
                fuse=options.fuse if getattr(target, "fuses_pipelines", False) else False)
    n = len(scheduled.kernel.statements)
    with clock.stage("plan", n), ir.internal_errors(f"planning ({options.target})", ir_kernel,
                                                         also=ISL_FAILURES):
        plan = target.plan(scheduled, options)
    with clock.stage("emit", n), ir.internal_errors(f"emitting ({options.target})", ir_kernel,
                                                         also=ISL_FAILURES):
        source = target.emit(plan)
        signature = target.signature(scheduled.kernel)
    clock.close()
    return Artifact(ir_kernel, options, scheduled, plan, source, signature)


def kernel_ir(kernel) -> ir.Kernel:
    """The IR of a ``pa.Kernel`` (primal or derived) or of an ``ir.Kernel`` itself."""
    if isinstance(kernel, ir.Kernel):
        return kernel
    k = getattr(kernel, "ir", None)
    if isinstance(k, ir.Kernel):
        return k
    raise TypeError(f"expected a polyad kernel, got {type(kernel).__name__} (use @pa.kernel)")


def artifact_of(kernel, options: Options = Options()) -> Artifact:
    """The artifact of ``kernel`` for ``options``: a ``pa.Kernel``'s cached one when it has
    one (so nothing is scheduled twice), else freshly compiled."""
    cached = getattr(kernel, "artifact", None)
    if callable(cached):
        return cached(options)
    return compile_kernel(kernel_ir(kernel), options)


__all__ = ["Artifact", "Build", "Options", "build_kernel", "TARGETS", "artifact_of", "compile_kernel",
           "kernel_ir", "recent_artifact", "schedule_family"]
