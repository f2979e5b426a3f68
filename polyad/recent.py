"""``Recent``: what a process made recently, remembered by key, least recently used
dropped first past a bound.

Two memories of this kind save repeated work across the builds of one process: the
artifacts ``pipeline.recent_artifact`` made (scheduled kernels, for ``pa.explain``) and
the dependence analyses ``poly`` made of one variable. Kernels are compiled in threads
(the CUDA tests compile their corpus in two), so every operation holds a lock.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Hashable, Iterable, Optional


class Recent:
    """At most ``bound`` values by key, least recently used dropped first; ``bound`` is
    an attribute and may be changed (the next insertion applies it). A value is never
    None: ``get`` answers None for a key it does not hold."""

    def __init__(self, bound: int):
        self.bound = bound
        self._values: "OrderedDict[Hashable, object]" = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> Optional[object]:
        """The value remembered under ``key`` (now the most recently used), else None."""
        with self._lock:
            value = self._values.get(key)
            if value is not None:
                self._values.move_to_end(key)
            return value

    def keep(self, key: Hashable, value: object) -> object:
        """Remember ``value`` under ``key`` and return it, unless another thread remembered
        one under ``key`` meanwhile: then that one, so that every caller shares one."""
        with self._lock:
            value = self._values.setdefault(key, value)
            self._values.move_to_end(key)
            while len(self._values) > self.bound:
                self._values.popitem(last=False)
            return value

    def get_or_make(self, key: Hashable, make: Callable[[], object]) -> object:
        """The value remembered under ``key``, else ``make()`` (not None) remembered
        (``make`` runs without the lock: it may take seconds)."""
        value = self.get(key)
        return value if value is not None else self.keep(key, make())

    def items(self) -> list:
        """The (key, value) pairs, least recently used first."""
        with self._lock:
            return list(self._values.items())

    def replace(self, items: Iterable) -> None:
        """Forget everything and remember ``items`` (pairs, least recently used first)."""
        with self._lock:
            self._values = OrderedDict(items)

    def clear(self) -> None:
        self.replace(())

    def __len__(self) -> int:
        with self._lock:
            return len(self._values)
