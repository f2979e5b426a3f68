"""The OpenMP thread count of the calling thread.

Compiled kernels run their parallel loops on libgomp's thread pool. Callers
that already run many kernels side by side (dask worker threads, framework
bridges) give each call fewer OpenMP threads so the machine is not
oversubscribed. ``omp_set_num_threads`` sets the count for the *calling*
thread only (libgomp keeps one setting per thread), so each worker thread
chooses its own without affecting the others.
"""

from __future__ import annotations

import contextlib
import ctypes.util
import threading
from typing import Iterator, Optional

import cffi

_ffi = cffi.FFI()
_ffi.cdef("void omp_set_num_threads(int n); int omp_get_max_threads(void);")
_lock = threading.Lock()
_libgomp = None


def _omp():
    """libgomp, the OpenMP runtime every compiled kernel links (loaded once)."""
    global _libgomp
    with _lock:
        if _libgomp is None:
            name = ctypes.util.find_library("gomp") or "libgomp.so.1"
            _libgomp = _ffi.dlopen(name)
        return _libgomp


def max_threads() -> int:
    """The number of OpenMP threads the calling thread's next parallel loop uses."""
    return _omp().omp_get_max_threads()


def set_num_threads(n: int) -> None:
    """Use ``n`` OpenMP threads for this thread's kernel calls from now on."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"the OpenMP thread count must be a positive integer, got {n!r}")
    _omp().omp_set_num_threads(n)


@contextlib.contextmanager
def num_threads(n: Optional[int]) -> Iterator[None]:
    """Run the body with ``n`` OpenMP threads in this thread (None: leave it as it is)."""
    if n is None:
        yield
        return
    previous = max_threads()
    set_num_threads(n)
    try:
        yield
    finally:
        set_num_threads(previous)
