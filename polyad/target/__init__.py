"""Targets: each turns a scheduled kernel's proven loop facts into a plan and source.

The schedule stage (``polyad.schedule``) states facts only: per AST loop a
``LoopFacts`` (parallel or why not; carried dependences classified as scalar
reductions, private scalars, scatters into small or large targets; a bound on
the trip count). A target is the only place that chooses a strategy for
those facts, and it records the choice in a plan that its emitter and
``pa.explain`` both read, so the two agree by construction.

The ``Target`` protocol (what ``polyad.pipeline.compile_kernel`` calls, in
this order)::

    name: str                 # "openmp"; the key in TARGETS
    source_suffix: str        # ".c", ".cu": file suffix of the emitted source
    dialect: emit.cexpr.Dialect
                              # qualifiers, math spellings and atomics for the
                              # shared C printers (emit/cexpr.py, emit/c_openmp.py)
    plan(scheduled, options) -> Plan
        scheduled: a ScheduledKernel or ScheduleCandidate (``.kernel`` the
        piece-split IR, ``.ast`` the ISL AST whose for-nodes carry
        annotation ids, ``.loops`` annotation id -> LoopFacts); options: the
        pipeline's ``Options`` (``deterministic`` ...). Pure: no side effect
        on ``scheduled``.
    score(plan) -> (parallel, looped)
        the parallel work of the plan and the most it could be (OpenMP: over
        the deepest statements, 2 for a parallel loop that pays, 1 for a thin
        one or a unit-stride vector loop); the scheduler keeps program order
        unless ISL's schedule scores more.
    emit(plan) -> str
        the complete source text (deterministic).
    signature(kernel) -> CSignature
        the C-level parameter list of the emitted entry point, in the order
        the runtime passes arguments (DSL params, sizes, temps, result).
    load(build, sanitize) -> KernelFunction
        compile ``build.source`` with the target's toolchain (cached) and
        return the callable that checks and marshals numpy arguments.
        ``build`` is a ``pipeline.Build`` (``Artifact.build``, or read from
        the pipeline cache by a later process): the piece-split IR, the
        source, the signature, the size requirements and parameter names.

A Plan has at least ``scheduled`` (what it was made from), ``names`` (DSL
name -> C name), ``loops`` (annotation id -> a plan entry) and
``loop(for_node)`` (the entry of an AST for-node). A plan entry has
``facts`` (its LoopFacts), ``iterator`` (the loop variable's C name),
``threads`` (runs its iterations on parallel hardware threads / a grid),
``simd``, ``atomic`` (statement names updated atomically), ``mapping`` (why,
for people), ``pragma(names, size_text)`` (the directive line before the
loop, or None), ``sections_maybe_empty()`` (the array sections its directive privatizes
that may have no elements, which the emitter guards) and ``decision()`` (one line for
``pa.explain``).

``TARGETS`` lists the targets this polyad has; ``PLANNED_TARGETS`` those
named but not available yet; ``get_target(name)`` raises ValueError for
others with the list of choices.
"""

from __future__ import annotations

from typing import Optional, Protocol

from .. import ir
from ..emit.c_openmp import POLYAD_VERSION
from .cuda import CudaTarget
from .openmp import OpenMPTarget


class Target(Protocol):
    """A code generator: plan, emit and load (see the module docstring)."""

    name: str
    source_suffix: str

    def plan(self, scheduled, options): ...

    def score(self, plan) -> tuple[int, int]: ...

    def emit(self, plan) -> str: ...

    def signature(self, kernel: ir.Kernel): ...

    def load(self, build, sanitize: Optional[str] = None): ...


_REGISTRY: dict[str, Target] = {t.name: t for t in (OpenMPTarget(), CudaTarget(simulate=False),
                                                    CudaTarget(simulate=True))}
TARGETS = tuple(_REGISTRY)
PLANNED_TARGETS = tuple(n for n in ("cuda",) if n not in _REGISTRY)


def get_target(name: str) -> Target:
    """The target called ``name``; ValueError (saying which exist) for any other."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    if name in PLANNED_TARGETS:
        raise ValueError(f"the {name!r} target is not available yet in polyad "
                         f"{POLYAD_VERSION}; use target {' or '.join(map(repr, TARGETS))}")
    raise ValueError(f"unknown target {name!r}; choose one of {', '.join(TARGETS)}")
