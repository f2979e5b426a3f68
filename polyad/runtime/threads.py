"""How many OpenMP threads a kernel call uses.

By default a call uses every core (``$OMP_NUM_THREADS`` when set), as
OpenMP does. Two ways to choose:

* ``with pa.num_threads(4): ...`` - every kernel call this Python thread
  makes inside the block uses at most 4 threads (other threads unaffected);
* ``kernel(x, num_threads=4)`` - one call (``@pa.kernel`` objects).

Calls made at the same time from several Python threads (dask's threaded
scheduler, torch data-loader or worker threads, a ``ThreadPoolExecutor``)
share the cores instead of each starting a full team: with ``k`` calls
running, a call without an explicit setting uses ``cores // k`` threads
(at least 1). The limit is set with ``omp_set_num_threads`` in the calling
thread just before the C call (an OpenMP setting is per thread) and
restored after it.
"""

from __future__ import annotations

import os
import threading
from typing import Optional

import cffi

from ..errors import PolyadError

# One entry per kernel call running now: list.append and list.pop are atomic, so
# counting needs no lock on the call path.
_running: list = []


class _ThreadLimits(threading.local):
    """``limits``: this thread's stack of ``pa.num_threads()`` values (a plain attribute:
    a missing one on ``threading.local`` costs an exception per lookup)."""

    def __init__(self):
        self.limits = []


_local = _ThreadLimits()
_omp = None


def _openmp():
    """The OpenMP runtime the kernels use (libgomp, which gcc -fopenmp links)."""
    global _omp
    if _omp is None:
        ffi = cffi.FFI()
        ffi.cdef("void omp_set_num_threads(int n); int omp_get_max_threads(void);")
        for name in ("libgomp.so.1", "libgomp.so", "libgomp.1.dylib", "libomp.so"):
            try:
                _omp = ffi.dlopen(name)
                break
            except OSError:
                continue
        else:
            raise PolyadError("cannot load the OpenMP runtime (libgomp) to set the number of "
                              "threads; set OMP_NUM_THREADS before starting Python instead")
    return _omp


def cores() -> int:
    """The threads a call may use in all: ``$OMP_NUM_THREADS`` or the CPUs this process
    may run on."""
    env = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def max_threads() -> int:
    """The OpenMP thread limit of the calling thread right now (``omp_get_max_threads``)."""
    return _openmp().omp_get_max_threads()


class num_threads:
    """Context manager: kernel calls of this Python thread inside the block use at most
    ``n`` OpenMP threads. Nests; ``None`` means the default (all cores, shared between
    concurrent calls)."""

    def __init__(self, n: Optional[int]):
        if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
            raise ValueError(f"num_threads must be a positive int or None, got {n!r}")
        self.n = n

    def __enter__(self):
        _local.limits.append(self.n)
        return self

    def __exit__(self, *exc):
        _local.limits.pop()
        return False


def call_threads() -> int:
    """The threads a kernel call this Python thread starts now gets (``begin_call``'s
    choice, before it counts the call)."""
    limits = _local.limits
    n = limits[-1] if limits else None
    if n is not None:
        return n
    if not _running:  # alone: OpenMP's own default team
        return (_omp or _openmp()).omp_get_max_threads()
    return max(1, cores() // (len(_running) + 1))


def begin_call() -> Optional[int]:
    """Called just before a kernel's C function: set this thread's OpenMP limit when one
    is asked for or other calls are running; returns the limit to restore (or None)."""
    _running.append(None)
    limits = _local.limits
    n = limits[-1] if limits else None
    if n is None:
        active = len(_running)
        if active == 1:
            return None
        if _omp is None:
            try:
                _openmp()
            except PolyadError:  # no libgomp to ask: leave the default
                return None
        n = max(1, cores() // active)
    try:
        omp = _openmp()
    except PolyadError:
        _running.pop()  # this call does not run
        raise
    previous = omp.omp_get_max_threads()
    omp.omp_set_num_threads(n)
    return previous


def end_call(previous: Optional[int]) -> None:
    """Called after the C function returns, with ``begin_call``'s result."""
    _running.pop()
    if previous is not None:
        _openmp().omp_set_num_threads(previous)
