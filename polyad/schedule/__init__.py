"""Scheduling: from the ISL model of a kernel to an annotated ISL AST.

``schedule_kernel(kernel)`` resolves boundary modes into pieces, proves
bounds, computes dependences, builds the ISL AST of the program-order
schedule (loops separated at piece borders, so the interior loop has plain
indices), decides per loop whether it is parallel and how (reduction clause,
private scalars, atomics), and picks the loops that become OpenMP parallel
loops. The emitter only reads these decisions.
"""

from .build import LoopInfo, ScheduledKernel, schedule_kernel  # noqa: F401
