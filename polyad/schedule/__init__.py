"""Scheduling: from the ISL model of a kernel to an ISL AST with proven loop facts.

``schedule_kernel(kernel, score)`` resolves boundary modes into pieces,
proves bounds, computes dependences, builds the ISL AST of the program-order
schedule (loops separated at piece borders, so the interior loop has plain
indices) or of ISL's schedule when the target's ``score`` prefers it, and
runs the one dependence test on every loop: ``LoopFacts`` say whether a loop
is parallel and which carried dependences a parallel form must honour
(reductions, private scalars, scatters into small or large targets). No
target strategy is chosen here: that is ``polyad.target``'s plan.
"""

from .build import (LoopFacts, ScatterFact, ScheduleCandidate, ScheduledKernel,  # noqa: F401
                    guarded_pieces, loop_key, schedule_kernel,
                    why_parts_not_apart)
from .nests import ast_children  # noqa: F401
