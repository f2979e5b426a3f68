"""Memory for the outputs a call allocates, reused once no array refers to it.

A fresh output array is new memory, which the operating system maps and zeroes page
by page as the kernel first writes it: the deconvolution gradient of ``benchmarks/``
at 4096² took 1.3x (float32) to 1.5x (float64) as long with its ``d_x`` allocated per
call as with it passed. A loop of calls (a solver, a training step) drops the previous
call's result as it takes the next one's, so the same memory can serve again.

``empty`` hands out arrays on blocks this module owns (``uint8`` arrays of at least
``MIN_BYTES``). An array made on a block, and every view of it, refers to the block
(numpy's ``base`` is the array that owns the memory); so is anything that keeps such an
array alive (a ``memoryview``, a DLPack capsule, a torch tensor from ``from_numpy``).
A block that only this module refers to is free: the next output of the same size takes
it. The blocks, in use or free, hold at most ``POOL_BYTES``: a new block lets go of free
ones (least recently handed out first) to fit, and an output that still does not fit is
a plain array, so after a program drops its outputs the pool keeps at most that much.

Only outputs the kernel assigns entirely before reading them take recycled memory
(``ir.Kernel.outputs_assigned_first``): their contents before the call never show.
Others are zero-filled as before (``np.zeros``): filling a recycled block costs more
than the kernel's threads touching fresh pages.
"""

from __future__ import annotations

import sys
import threading

import numpy as np

# Below this, malloc reuses freed memory itself and a fresh array has few pages to fault.
MIN_BYTES = 1 << 22
# The blocks, in use or free, hold at most this much.
POOL_BYTES = 1 << 30

_lock = threading.Lock()
_blocks: list = []  # uint8 arrays, least recently handed out first


def _free(j: int) -> bool:
    # references: the list's and getrefcount's argument; any array made on the block
    # (a view of it, or a view of such a view) adds one through its ``base``
    return sys.getrefcount(_blocks[j]) == 2


def empty(shape: tuple, dtype) -> np.ndarray:
    """An uninitialized C-contiguous array of ``shape`` and ``dtype``: on a free block of
    its size when there is one, else on a new block if the pool has room for it, else a
    plain ``np.empty`` array (so are arrays under ``MIN_BYTES``)."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if nbytes < MIN_BYTES:
        return np.empty(shape, dtype)
    with _lock:
        for j in range(len(_blocks)):
            if _blocks[j].nbytes == nbytes and _free(j):
                block = _blocks.pop(j)
                break
        else:
            held = sum(b.nbytes for b in _blocks)
            for j in range(len(_blocks)):
                if held + nbytes <= POOL_BYTES:
                    break
                if _free(j):
                    held -= _blocks[j].nbytes
                    _blocks[j] = None
            _blocks[:] = [b for b in _blocks if b is not None]
            if held + nbytes > POOL_BYTES:
                return np.empty(shape, dtype)
            block = np.empty(nbytes, np.uint8)
        _blocks.append(block)
        return block.view(dtype).reshape(shape)


def held_bytes() -> tuple[int, int]:
    """(bytes of all blocks, bytes of the free ones): what the pool holds."""
    with _lock:
        return (sum(b.nbytes for b in _blocks),
                sum(_blocks[j].nbytes for j in range(len(_blocks)) if _free(j)))


def release() -> None:
    """Let go of every free block (the memory returns to the system when numpy frees it)."""
    with _lock:
        _blocks[:] = [_blocks[j] for j in range(len(_blocks)) if not _free(j)]
