"""Top-level loop nests of a kernel, as the schedule passes see them."""

from __future__ import annotations

from .. import ir


def loop_nests(kernel: ir.Kernel) -> dict[int, list]:
    """Statements inside loops, grouped by their top-level position (one group per nest)."""
    nests: dict[int, list] = {}
    for st in kernel.statements:
        if st.loops:
            nests.setdefault(st.position[0], []).append(st)
    return nests


def common_depth(nest: list) -> int:
    """How many outer loops (same loop, same position) all statements of a nest share."""
    c, first = 0, nest[0]
    while all(len(st.loops) > c and st.loops[c] == first.loops[c]
              and st.position[:c + 1] == first.position[:c + 1] for st in nest):
        c += 1
    return c
