"""Load CUDA kernels (nvcc, or the CPU simulator) and call them on host or device arrays.

``CudaKernel`` runs the same argument checks as the OpenMP runtime before any
launch, then marshals: numpy arrays are copied to the device and written
arrays copied back; objects with ``__cuda_array_interface__`` (CuPy arrays,
PyTorch CUDA tensors, polyad's ``DeviceArray``) are used in place, and outputs
the caller omits are allocated as the same kind. Every CUDA call of the
launcher is checked; the first failure is raised as ``pa.DeviceError`` with
CUDA's message.

``simulate=True`` (target ``"cuda-sim"``) builds the same ``.cu`` text with the
C++ compiler against ``polyad_cuda_sim.h``: "device" memory is then host
memory and kernels run sequentially on the CPU.
"""

from __future__ import annotations

import ctypes
import functools
import math
import os
import cffi
import numpy as np

from .. import ir
from ..errors import DeviceError, DTypeError, ShapeError
from . import budget
from .loader import KernelFunction, c_prototype
from .toolchain import compile_cuda, compile_cuda_sim

DEFAULT_ARCH = "sm_80"

RUNTIME_CDEF = """
const char *pa_last_error(void);
void pa_clear_error(void);
int pa_device_count(void);
void *pa_device_alloc(int64_t bytes);
void pa_device_free(void *p);
int pa_copy_to_device(void *dst, const void *src, int64_t bytes);
int pa_copy_to_host(void *dst, const void *src, int64_t bytes);
int pa_device_zero(void *p, int64_t bytes);
"""


@functools.lru_cache(maxsize=None)
def gpu_count() -> int:
    """NVIDIA GPUs the driver reports (0 without a driver), via libcuda's driver API."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    count = ctypes.c_int(0)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return count.value


def cuda_arch() -> str:
    """The ``-arch`` for nvcc: ``$POLYAD_CUDA_ARCH``, ``native`` with a GPU, else sm_80."""
    return os.environ.get("POLYAD_CUDA_ARCH") or ("native" if gpu_count() > 0 else DEFAULT_ARCH)


class _Runtime:
    """The memory and error functions every polyad CUDA library exports."""

    def __init__(self, ffi, lib):
        self.ffi, self.lib = ffi, lib

    def check(self, what: str) -> None:
        err = self.lib.pa_last_error()
        if err != self.ffi.NULL:
            message = self.ffi.string(err).decode(errors="replace")
            self.lib.pa_clear_error()
            raise DeviceError(f"{what}: {message}")

    def alloc(self, nbytes: int) -> int:
        p = self.lib.pa_device_alloc(nbytes)
        self.check("allocating device memory")
        return int(self.ffi.cast("uintptr_t", p))

    def free(self, ptr: int) -> None:
        self.lib.pa_device_free(self.ffi.cast("void *", ptr))

    def to_device(self, ptr: int, a: np.ndarray) -> None:
        self.lib.pa_copy_to_device(self.ffi.cast("void *", ptr),
                                   self.ffi.cast("void *", a.ctypes.data), a.nbytes)
        self.check("copying to the device")

    def to_host(self, a: np.ndarray, ptr: int) -> None:
        self.lib.pa_copy_to_host(self.ffi.cast("void *", a.ctypes.data),
                                 self.ffi.cast("void *", ptr), a.nbytes)
        self.check("copying to the host")

    def zero(self, ptr: int, nbytes: int) -> None:
        self.lib.pa_device_zero(self.ffi.cast("void *", ptr), nbytes)
        self.check("zeroing device memory")


class DeviceArray:
    """A C-contiguous array in device memory (simulated device memory under cuda-sim).

    polyad's own device array, for callers without CuPy or PyTorch: it exposes
    ``__cuda_array_interface__``; ``numpy()`` copies it to the host. Outputs of
    a call whose device inputs are ``DeviceArray`` objects are ``DeviceArray``.
    """

    def __init__(self, runtime: _Runtime, shape: tuple, dtype):
        self._runtime = runtime
        self.shape = tuple(int(n) for n in shape)
        self.dtype = np.dtype(dtype)
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        self.ptr = runtime.alloc(self.nbytes)

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr, False),
                "strides": None, "version": 3}

    def numpy(self) -> np.ndarray:
        out = np.empty(self.shape, self.dtype)
        self._runtime.to_host(out, self.ptr)
        return out

    def __del__(self):
        if getattr(self, "ptr", 0):
            self._runtime.free(self.ptr)
            self.ptr = 0

    def __repr__(self):
        return f"<polyad DeviceArray shape={self.shape} dtype={self.dtype}>"


# numpy dtypes of torch dtypes, filled as they are met (PyTorch is optional).
_TORCH_DTYPES: dict = {}


class _DeviceView:
    """A caller's device array seen through ``__cuda_array_interface__``.

    PyTorch tensors are read through their own attributes instead: the same facts
    (pointer, shape, dtype, contiguity), and torch builds ``__cuda_array_interface__``
    in Python, about 10 us per tensor per call (measured on an H100 host).
    """

    def __init__(self, obj):
        self.obj = obj
        if type(obj).__module__ == "torch" and type(obj).__name__ in ("Tensor", "Parameter"):
            self._from_torch(obj)
            return
        cai = obj.__cuda_array_interface__
        self.shape = tuple(cai["shape"])
        self.ndim = len(self.shape)
        self.dtype = np.dtype(cai["typestr"])
        self.ptr = int(cai["data"][0])
        self.readonly = bool(cai["data"][1])
        strides = cai.get("strides")
        self.contiguous = strides is None or math.prod(self.shape) <= 1 or \
            tuple(strides) == _c_strides(self.shape, self.dtype.itemsize)
        self.nbytes = math.prod(self.shape) * self.dtype.itemsize

    def _from_torch(self, t) -> None:
        dtype = _TORCH_DTYPES.get(t.dtype)
        if dtype is None:
            dtype = _TORCH_DTYPES[t.dtype] = np.dtype(str(t.dtype).removeprefix("torch."))
        self.shape = tuple(t.shape)
        self.ndim = len(self.shape)
        self.dtype = dtype
        self.ptr = t.data_ptr()
        self.readonly = False
        self.contiguous = t.is_contiguous()
        self.nbytes = math.prod(self.shape) * dtype.itemsize


def _c_strides(shape: tuple, itemsize: int) -> tuple:
    """The byte strides of a C-contiguous array of ``shape``."""
    out, step = [], itemsize
    for n in reversed(shape):
        out.append(step)
        step *= n
    return tuple(reversed(out))


class CudaKernel(KernelFunction):
    """A kernel compiled to CUDA (nvcc) or to the CPU simulator, callable from Python.

    Attributes: ``source`` (the CUDA C text), ``library`` (path), ``arch`` (nvcc's
    ``-arch``, None when simulated), ``simulate`` (True for target ``"cuda-sim"``).
    """

    def __init__(self, kernel: ir.Kernel, source: str, signature, requirements, param_names,
                 simulate: bool):
        self.source = source
        self.simulate = simulate
        self.arch = None if simulate else cuda_arch()
        self.library = (compile_cuda_sim(source, signature.name) if simulate
                        else compile_cuda(source, signature.name, self.arch))
        ffi = cffi.FFI()
        ffi.cdef(RUNTIME_CDEF + c_prototype(signature))
        self._lib = ffi.dlopen(str(self.library), ffi.RTLD_NOW | ffi.RTLD_NODELETE)
        self.runtime = _Runtime(ffi, self._lib)
        self._device_checked = False
        self._sizes_of_shapes: dict = {}
        # Per call, without walking the IR: the written arrays, and per C parameter its
        # kind, name and pointer type.
        self._written = tuple(p.name for p in kernel.params if p.is_array and p.intent != "in")
        self._param_kinds = tuple((p, p.is_array) for p in kernel.params)
        self._c_params = tuple((p.kind, p.name, p.dtype.c_type + " *")
                               for p in signature.params)
        super().__init__(kernel, signature, requirements, param_names, ffi,
                         getattr(self._lib, signature.name))

    def check_device(self) -> None:
        """Raise ``DeviceError`` unless a CUDA device is usable (always fine when simulated)."""
        if self._device_checked:
            return
        n = self._lib.pa_device_count()
        if n <= 0:
            err = self._lib.pa_last_error()
            why = (self._ffi.string(err).decode(errors="replace") if err != self._ffi.NULL
                   else "cudaGetDeviceCount() found 0 devices")
            self._lib.pa_clear_error()
            raise DeviceError(f"no CUDA device: {why} (kernel {self.kernel.name!r}; use "
                              f"target='cuda-sim' to run the CUDA code on the CPU, or "
                              f"target='openmp')")
        self._device_checked = True

    def to_device(self, a: np.ndarray) -> DeviceArray:
        """A ``DeviceArray`` copy of numpy array ``a`` (C order)."""
        self.check_device()
        a = np.ascontiguousarray(a)
        d = DeviceArray(self.runtime, a.shape, a.dtype)
        self.runtime.to_device(d.ptr, a)
        return d

    # ---- argument checks for device arrays -----------------------------------
    def _check_device_array(self, p: ir.Param, v: _DeviceView) -> None:
        k = self.kernel
        if v.dtype != p.type.dtype.np:
            raise DTypeError(f"{k.name}(): argument {p.name!r} has dtype {v.dtype}, expected "
                             f"{p.type.dtype.np_name} (polyad never converts silently)")
        if v.ndim != p.type.ndim:
            raise ShapeError(f"{k.name}(): argument {p.name!r} has {v.ndim} dimension(s), "
                             f"expected {p.type.ndim} ({p.type!r})")
        if not v.contiguous:
            raise ShapeError(f"{k.name}(): device argument {p.name!r} is not C-contiguous; pass "
                             f"a contiguous copy")
        if p.intent != "in" and v.readonly:
            raise ShapeError(f"{k.name}(): argument {p.name!r} is written but read-only")

    def _new_device_output(self, like, shape: tuple, dtype: np.dtype):
        """A zero-filled output of the same kind as the caller's device array ``like``."""
        module = type(like.obj).__module__.split(".")[0]
        if module == "torch":
            import torch
            return torch.zeros(shape, dtype=getattr(torch, dtype.name), device=like.obj.device)
        if module == "cupy":
            import cupy
            return cupy.zeros(shape, dtype)
        out = DeviceArray(self.runtime, shape, dtype)
        self.runtime.zero(out.ptr, out.nbytes)
        return out

    def _check_device_aliasing(self, arrays: dict) -> None:
        spans = {n: (a.ptr, a.ptr + a.nbytes) for n, a in arrays.items()
                 if isinstance(a, _DeviceView) and a.nbytes}
        for name in self._written:
            if name not in spans:
                continue
            lo, hi = spans[name]
            for other, (olo, ohi) in spans.items():
                if other != name and lo < ohi and olo < hi:
                    raise ShapeError(f"{self.kernel.name}(): output {name!r} shares memory "
                                     f"with {other!r}; pass separate arrays")

    # ---- the call --------------------------------------------------------
    def __call__(self, *args, **kwargs):
        k = self.kernel
        values, sizes = self._bind(args, kwargs)
        arrays, scalars = {}, {}
        for p, is_array in self._param_kinds:
            if p.name not in values:
                continue
            v = values[p.name]
            if is_array:
                if hasattr(v, "__cuda_array_interface__"):
                    v = _DeviceView(v)
                    self._check_device_array(p, v)
                else:
                    self._check_array(p, v)
                arrays[p.name] = v
            else:
                scalars[p.name] = self._scalar(p, v)
        self._complete_sizes(arrays, sizes)
        ints = {n: scalars[n] for n in k.int_params}
        if self.requirements:
            values = [sizes[n] if n in sizes else ints[n] for n in self._param_names]
            if self._bad_sizes is None or self._bad_sizes(values):
                self._check_requirements_values(tuple(values))  # raises, naming the condition
        self.check_device()
        like = next((a for a in arrays.values() if isinstance(a, _DeviceView)), None)
        outs = []
        for p, is_array in self._param_kinds:
            if is_array and p.name not in arrays:
                shape = tuple(ir.eval_integer(e, sizes) for e in p.type.shape)
                if like is None:
                    arrays[p.name] = np.zeros(shape, p.type.dtype.np)
                else:
                    arrays[p.name] = _DeviceView(self._new_device_output(like, shape,
                                                                        p.type.dtype.np))
            if p.intent == "out":
                outs.append(arrays[p.name])
        host = {n: a for n, a in arrays.items() if isinstance(a, np.ndarray)}
        self._check_aliasing(host)
        self._check_device_aliasing(arrays)
        return self._launch(arrays, scalars, sizes, ints, outs)

    def _complete_sizes(self, arrays: dict, sizes: dict) -> None:
        """``_infer_sizes``, remembered per tuple of shapes and explicit sizes (a call on
        arrays of shapes seen before skips the inference: it is most of a call's host time)."""
        key = (tuple(a.shape for a in arrays.values()), tuple(arrays), tuple(sizes.items()))
        known = self._sizes_of_shapes.get(key)
        if known is None:
            self._infer_sizes(arrays, sizes)
            if len(self._sizes_of_shapes) >= 64:
                self._sizes_of_shapes.clear()
            self._sizes_of_shapes[key] = known = dict(sizes)
        sizes.update(known)

    def _launch(self, arrays, scalars, sizes, ints, outs):
        k, rt, ffi = self.kernel, self.runtime, self._ffi
        owned: list[int] = []  # device buffers this call allocated
        temp_bytes = []
        if k.temps:   # device memory is scarcer still: the same budget, before any alloc
            env = {**sizes, **ints}
            temp_bytes = [t.type.dtype.storage_bytes(ir.stored_elements(t.type, env))
                          for t in k.temps]
            budget.check(k, temp_bytes, env, self.memory_budget)
        try:
            pointers = {}
            for name, a in arrays.items():
                if isinstance(a, _DeviceView):
                    pointers[name] = a.ptr
                else:
                    pointers[name] = rt.alloc(a.nbytes)
                    owned.append(pointers[name])
                    rt.to_device(pointers[name], a)
            temps = []
            for t, nbytes in zip(k.temps, temp_bytes):
                ptr = rt.alloc(nbytes)
                owned.append(ptr)
                if t.zero:
                    rt.zero(ptr, nbytes)
                temps.append(ptr)
            result = np.zeros(1, k.result[1].np) if k.result is not None else None
            cargs = []
            temp_iter = iter(temps)
            for kind, name, pointer in self._c_params:
                if kind == "array":
                    cargs.append(ffi.cast(pointer, pointers[name]))
                elif kind == "scalar":
                    cargs.append(scalars[name])
                elif kind == "size":
                    cargs.append(sizes[name])
                elif kind == "temp":
                    cargs.append(ffi.cast(pointer, next(temp_iter)))
                else:
                    cargs.append(ffi.cast(pointer, result.ctypes.data))
            self._fn(*cargs)
            if self._lib.pa_last_error() != ffi.NULL:
                rt.check(f"running kernel {k.name!r}")
            for name in self._written:
                a = arrays.get(name)
                if isinstance(a, np.ndarray):
                    rt.to_host(a, pointers[name])
        finally:
            for ptr in owned:
                rt.free(ptr)
        outs = [o.obj if isinstance(o, _DeviceView) else o for o in outs]
        value = result[0] if result is not None else None
        if value is not None and outs:
            return (value, *outs)
        if value is not None:
            return value
        if len(outs) == 1:
            return outs[0]
        return tuple(outs) if outs else None
