"""Turn whatever a caller passes for an array parameter into the numpy array the
kernel runs on, without copying, or refuse it with what to do instead.

Accepted: ``numpy.ndarray`` (and ``numpy.memmap``, a file-backed ndarray whose
meaning polyad keeps), objects that implement DLPack (``__dlpack__``:
PyTorch CPU tensors, JAX arrays, ...), the numpy array interface
(``__array_interface__`` / ``__array_struct__``) or the buffer protocol
(``memoryview``, ``array.array``) - each viewed in place, never copied.
Objects with only ``__array__`` (pandas, xarray) are accepted as inputs,
since ``np.asarray`` may copy them, but not as arrays the kernel writes.

Refused: ndarray subclasses whose meaning a plain array loses
(``numpy.ma.MaskedArray``: the mask would be ignored; ``numpy.matrix``; any
other subclass: units, metadata), tensors that require grad or live on a
GPU, and Python sequences (polyad never converts silently).
"""

from __future__ import annotations

import numpy as np

from .. import ir
from ..errors import ArgumentError, DTypeError, ShapeError

# DLPack device type codes (dlpack.h): 1 = CPU, 3 = CUDA host (pinned) memory.
_DLPACK_HOST_DEVICES = (1, 3)


def _type_name(value) -> str:
    t = type(value)
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _convert_hint(value, name: str, dtype: str) -> str:
    """How to convert ``value`` to ``dtype`` in its own library."""
    module = type(value).__module__.split(".")[0]
    if module == "torch":
        return f"{name}.to(torch.{dtype})"
    if module in ("jax", "jaxlib"):
        return f"{name}.astype(jnp.{dtype})"
    return f"np.asarray({name}, dtype=np.{dtype})"


def _refuse_subclass(kernel: str, p: ir.Param, value: np.ndarray) -> None:
    where = f"{kernel}(): argument {p.name!r}"
    if isinstance(value, np.ma.MaskedArray):
        raise DTypeError(f"{where} is a numpy.ma.MaskedArray; polyad kernels read every element "
                         f"and would silently ignore its mask: pass {p.name}.filled(value) to "
                         f"replace the masked elements by a value of your choice (e.g. 0.0 for "
                         f"a sum), or {p.name}.data to use the raw values on purpose")
    if isinstance(value, np.matrix):
        raise DTypeError(f"{where} is a numpy.matrix; pass np.asarray({p.name})")
    raise DTypeError(f"{where} is a {_type_name(value)}, a numpy.ndarray subclass; polyad "
                     f"computes on the raw values and returns plain arrays, so what the subclass "
                     f"adds (units, masks, metadata) would be lost: pass np.asarray({p.name}) to "
                     f"use the raw values on purpose")


def _from_dlpack(kernel: str, p: ir.Param, value) -> np.ndarray:
    where = f"{kernel}(): argument {p.name!r} ({_type_name(value)})"
    try:
        device, _ = value.__dlpack_device__()
    except (AttributeError, TypeError, ValueError):
        device = 1
    if int(device) not in _DLPACK_HOST_DEVICES:
        raise ArgumentError(f"{where} is in device memory (DLPack device type {int(device)}); "
                            f"polyad's OpenMP kernels run on the CPU: copy it to host memory "
                            f"first (PyTorch: {p.name}.cpu(); CuPy: cupy.asnumpy({p.name}))")
    try:
        return np.from_dlpack(value)
    except BufferError as exc:
        hint = (f"pass {p.name}.detach() (or use polyad.torch.function(kernel) to "
                f"differentiate through the kernel)" if "gradient" in str(exc) else
                "pass a numpy array")
        raise ArgumentError(f"{where} cannot be viewed without a copy ({exc}): {hint}") from None
    except (TypeError, RuntimeError) as exc:
        raise DTypeError(f"{where} cannot be viewed through DLPack ({exc}): pass a numpy "
                         f"array of {p.type.dtype.np_name}") from None


def as_array_argument(kernel: str, p: ir.Param, value) -> np.ndarray:
    """The numpy array (a view, never a copy) that array parameter ``p`` of ``kernel``
    runs on when the caller passes ``value``; raises a polyad error saying what to do
    when there is none. Dtype and layout are checked here for non-numpy objects
    (with the fix in their own library), and by the loader for every array."""
    if type(value) is np.ndarray or type(value) is np.memmap:
        return value
    if isinstance(value, np.ndarray):
        _refuse_subclass(kernel, p, value)
    written = p.intent != "in"
    if hasattr(value, "__dlpack__"):
        array = _from_dlpack(kernel, p, value)
    elif hasattr(value, "__array_interface__") or hasattr(value, "__array_struct__"):
        array = np.asarray(value)
    elif not isinstance(value, (str, bytes, list, tuple)) and _has_buffer(value):
        array = np.asarray(memoryview(value))
    elif hasattr(value, "__array__") and not written:
        array = np.asarray(value)
    else:
        expected = f"a numpy array of {p.type.dtype.np_name} with shape {p.type!r}"
        if hasattr(value, "__array__"):
            raise DTypeError(f"{kernel}(): argument {p.name!r} is written by the kernel, but a "
                             f"{_type_name(value)} can only be converted by a copy that the "
                             f"results would not reach: pass {expected} and read the results "
                             f"from it")
        fix = (f"; convert it once: np.asarray({p.name}, dtype=np.{p.type.dtype.np_name})"
               if isinstance(value, (list, tuple)) else "")
        raise DTypeError(f"{kernel}(): argument {p.name!r} must be {expected} (or an object "
                         f"implementing DLPack or the array interface), got "
                         f"{_type_name(value)}{fix}")
    where = f"{kernel}(): argument {p.name!r} ({_type_name(value)})"
    want = p.type.dtype.np
    if array.dtype != want:
        raise DTypeError(f"{where} has dtype {array.dtype}, expected {p.type.dtype.np_name} "
                         f"(polyad never converts silently: pass "
                         f"{_convert_hint(value, p.name, p.type.dtype.np_name)})")
    if array.ndim == p.type.ndim and not array.flags.c_contiguous:
        fix = (f"{p.name}.contiguous()" if type(value).__module__.startswith("torch")
               else f"a C-contiguous copy of {p.name}")
        raise ShapeError(f"{where} is not C-contiguous; pass {fix}")
    if written and not array.flags.writeable:
        raise ShapeError(f"{where} is written by the kernel, but its memory is read-only: pass "
                         f"a writable numpy array, or omit {p.name!r} when it is a pa.Out "
                         f"output and use the returned array")
    return array


def _has_buffer(value) -> bool:
    try:
        memoryview(value)
    except TypeError:
        return False
    return True
