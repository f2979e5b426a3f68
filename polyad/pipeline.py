"""The one compilation path: IR -> schedule (facts) -> target plan -> source.

``compile_kernel(ir_kernel, Options(...))`` returns an ``Artifact`` (the
scheduled kernel, the target's plan, the source and the C signature). Every
entry point goes through it: ``pa.Kernel.compile`` / ``pa.compile`` (which
then hands the artifact to the target's loader), ``pa.explain`` (which only
reads an artifact), ``polyad.build`` and the CLI.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from . import ir
from .schedule import ScheduledKernel, schedule_kernel
from .target import TARGETS, get_target

SANITIZERS = (None, "address")


@dataclass(frozen=True)
class Options:
    """How to compile a kernel.

    ``target``: a name in ``polyad.target.TARGETS``; ``deterministic``: no
    parallel form that reorders floating-point sums (bit-identical results on
    every run and thread count); ``sanitize``: None or ``"address"``
    (AddressSanitizer; affects only the toolchain, not the source).
    """

    target: str = "openmp"
    deterministic: bool = False
    sanitize: Optional[str] = None

    def __post_init__(self):
        get_target(self.target)
        if self.sanitize not in SANITIZERS:
            raise ValueError("sanitize must be None or 'address'")
        object.__setattr__(self, "deterministic", bool(self.deterministic))

    @property
    def source_options(self) -> "Options":
        """These options without what only the toolchain uses (one artifact serves both)."""
        return Options(self.target, self.deterministic)


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


def compile_kernel(ir_kernel: ir.Kernel, options: Options = Options()) -> Artifact:
    """Schedule ``ir_kernel``, plan it for ``options.target`` and emit its source."""
    target = get_target(options.target)
    scheduled = schedule_kernel(ir_kernel, lambda cand: target.score(target.plan(cand, options)))
    plan = target.plan(scheduled, options)
    return Artifact(ir_kernel, options, scheduled, plan, target.emit(plan),
                    target.signature(scheduled.kernel))


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


__all__ = ["Artifact", "Options", "TARGETS", "artifact_of", "compile_kernel", "kernel_ir"]
