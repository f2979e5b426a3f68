"""The memory budget of a call's temporaries (tapes above all; issue 19).

A derived kernel's tapes grow with its sizes: before a call allocates its
temporaries, their total is compared with the budget, and a call over it
raises ``MemoryBudgetError`` naming each tape, the statement whose values it
holds and its size as a formula of the sizes, instead of numpy's
``_ArrayMemoryError`` or the kernel's OOM kill half-way through.

The budget: ``memory=`` of ``pa.grad`` / ``pa.value_and_grad`` / ``pa.vjp``,
else the environment variable ``POLYAD_MEMORY_BUDGET``, else half the
physical memory. Sizes are written ``"1GB"``, ``"512MiB"``, ``"2e9"`` (bytes)
or ``"25%"`` (of the physical memory).
"""

from __future__ import annotations

import os
import re
from typing import Optional, Union

from .. import ir
from ..errors import MemoryBudgetError

ENV = "POLYAD_MEMORY_BUDGET"
DEFAULT_FRACTION = 0.5

_UNITS = {"": 1, "b": 1, "kb": 10 ** 3, "mb": 10 ** 6, "gb": 10 ** 9, "tb": 10 ** 12,
          "kib": 2 ** 10, "mib": 2 ** 20, "gib": 2 ** 30, "tib": 2 ** 40}


def physical_memory() -> int:
    """Bytes of physical memory of this machine."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def parse_bytes(value: Union[str, int, float], what: str = "memory") -> int:
    """``"1GB"`` -> 10**9, ``"512MiB"``, ``"25%"`` (of physical memory), or a number of bytes."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise MemoryBudgetError(f"{what} must be a size like '1GB', '512MiB', '25%' or a number "
                                f"of bytes, got {value!r}")
    if isinstance(value, (int, float)):
        n = float(value)
    else:
        m = re.fullmatch(r"\s*([0-9.]+(?:e[0-9]+)?)\s*([a-zA-Z%]*)\s*", value)
        unit = m.group(2).lower() if m else None
        if m is None or (unit not in _UNITS and unit != "%"):
            raise MemoryBudgetError(f"{what}={value!r} is not a size: write e.g. '1GB', "
                                    f"'512MiB', '25%' (of physical memory) or a number of bytes")
        n = float(m.group(1)) * (physical_memory() / 100 if unit == "%" else _UNITS[unit])
    if n <= 0:
        raise MemoryBudgetError(f"{what} must be positive, got {value!r}")
    return int(n)


def budget_bytes(memory: Optional[Union[str, int, float]] = None) -> tuple[int, str]:
    """(bytes, where the budget comes from) for an explicit ``memory`` or the default."""
    if memory is not None:
        return parse_bytes(memory), f"memory={memory!r}"
    env = os.environ.get(ENV)
    if env:
        return parse_bytes(env, ENV), f"{ENV}={env}"
    return int(physical_memory() * DEFAULT_FRACTION), \
        f"the default, {DEFAULT_FRACTION:.0%} of the physical memory"


def human(n: float) -> str:
    for unit, size in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def size_formula(t: ir.Temp) -> str:
    """``8 * N * (N - 1)``: bytes of temporary ``t`` as a formula of the sizes
    (``N * N * N / 8`` for a packed ``bit`` array, rounded up to whole 4-byte words;
    ``8 * ((N * N - N) // 2)`` for a triangle stored packed)."""
    if t.type.layout is not None:
        extents = [f"({ir.expr_str(t.type.layout.count)})"]
    else:
        extents = [f"({ir.expr_str(e)})" if any(c in ir.expr_str(e) for c in "+-")
                   else ir.expr_str(e) for e in t.type.shape]
    if t.type.dtype.packed:
        return " * ".join(extents or ["1"]) + " / 8"
    return " * ".join([str(t.type.dtype.bits // 8)] + extents)


def check(kernel: ir.Kernel, nbytes: list[int], sizes: dict, memory=None) -> None:
    """Raise ``MemoryBudgetError`` when the temporaries of ``kernel`` (``nbytes``: their
    sizes, in ``kernel.caller_temps`` order, for the call's ``sizes``) exceed the budget."""
    total = sum(nbytes)
    limit, source = budget_bytes(memory)
    if total <= limit:
        return
    lines = over_budget_lines(kernel, nbytes, sizes, limit, source)
    lines.append("how to fix: give the call more memory (pa.grad(kernel, wrt, memory='...'), "
                 f"or the environment variable {ENV}, e.g. '{human(total * 1.1)}'), run smaller "
                 "sizes, or split the loop that fills the largest tape into several kernel "
                 "calls (checkpoints)")
    raise MemoryBudgetError("\n".join(lines))


def over_budget_lines(kernel: ir.Kernel, nbytes: list[int], sizes: dict, limit: int,
                      source: str) -> list[str]:
    """The lines of a ``MemoryBudgetError`` that name the total and each temporary (its
    statement and size formula), largest first."""
    total = sum(nbytes)
    sizes_text = ", ".join(f"{k}={v}" for k, v in sizes.items())
    lines = [f"{kernel.name}() would allocate {human(total)} of temporaries for {sizes_text}, "
             f"over the memory budget of {human(limit)} ({source})"]
    ranked = sorted(zip(kernel.caller_temps, nbytes), key=lambda p: -p[1])
    for t, n in ranked:
        if n == 0:
            continue
        what = f": {t.holds}" if t.holds else ""
        lines.append(f"  {t.role} {t.name} {t.type!r} = {size_formula(t)} bytes = {human(n)}"
                     f"{what}")
    return lines
