"""Load compiled kernels with cffi (ABI mode) and call them on numpy arrays.

``KernelFunction`` checks every argument before any C runs: types and dtypes
(no silent conversion), ndim, shapes against the size symbols, C-contiguity,
outputs aliasing other arrays, and the size conditions boundary modes need.
"""

from __future__ import annotations

import re
import threading
from typing import Optional

import cffi
import islpy as isl
import numpy as np

from .. import ir
from ..errors import ArgumentError, DTypeError, ShapeError
from ..ir import SizeVar
from .toolchain import compile_c


def _solve_extent(e: ir.Expr, value: int, sizes: dict) -> Optional[tuple[str, int]]:
    """Solve ``e == value`` for its single unknown size (``e`` linear in it)."""
    unknown = {x.name for x in ir.walk(e) if isinstance(x, SizeVar) and x.name not in sizes}
    if len(unknown) != 1:
        return None
    name = unknown.pop()
    f0 = ir.eval_integer(e, {**sizes, name: 0})
    f1 = ir.eval_integer(e, {**sizes, name: 1})
    if f0 is None or f1 is None or f1 == f0:
        return None
    x, rem = divmod(value - f0, f1 - f0)
    if rem or ir.eval_integer(e, {**sizes, name: x}) != value:
        return None
    return name, x


class KernelFunction:
    """A kernel's C function behind polyad's Python call interface.

    Calling it checks every argument, allocates omitted outputs and
    temporaries, calls ``fn`` (a cffi function of ``ffi``) and returns the
    result. ``CompiledKernel`` (JIT) and ``polyad.build.load`` (a prebuilt
    cffi extension) both call kernels through this class.
    Attributes: ``kernel`` (IR), ``signature`` (the C parameter list),
    ``requirements`` (size conditions checked before the call).
    """

    def __init__(self, kernel: ir.Kernel, signature, requirements, param_names, ffi: cffi.FFI,
                 fn):
        self.kernel = kernel
        self.signature = signature
        self.requirements = requirements
        self._param_names = param_names  # isl parameter names, in order
        self._ffi = ffi
        self._fn = fn
        self._checked_sizes: dict[tuple, None] = {}
        self._params = {p.name: p for p in kernel.params}
        # Temporaries are reused from call to call (per thread, so concurrent
        # calls never share one): a fresh large array costs a page fault per
        # page on every call, more than the kernel itself for big images.
        self._temp_buffers = threading.local()

    # ---- argument binding ----------------------------------------------
    def _bind(self, args, kwargs) -> tuple[dict, dict]:
        k = self.kernel
        if len(args) > len(k.params):
            raise ArgumentError(f"{k.name}() takes {len(k.params)} arguments, got {len(args)}")
        values = {p.name: a for p, a in zip(k.params, args)}
        sizes = {}
        for name, v in kwargs.items():
            if name in self._params:
                if name in values:
                    raise ArgumentError(f"{k.name}() got argument {name!r} twice")
                values[name] = v
            elif name in k.sizes:
                if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
                    raise DTypeError(f"size {name} must be an integer, got {v!r}")
                sizes[name] = int(v)
            else:
                raise ArgumentError(f"{k.name}() got an unknown argument {name!r}; its parameters "
                                    f"are {[p.name for p in k.params]}, sizes {list(k.sizes)}")
        for p in k.params:
            if p.name not in values and p.intent != "out":
                raise ArgumentError(f"{k.name}() is missing argument {p.name!r}")
        return values, sizes

    def _check_array(self, p: ir.Param, a) -> None:
        k = self.kernel
        if not isinstance(a, np.ndarray):
            raise DTypeError(f"{k.name}(): argument {p.name!r} must be a numpy array of "
                             f"{p.type.dtype.np_name} with shape {p.type!r}, got {type(a).__name__}")
        if a.dtype != p.type.dtype.np:
            raise DTypeError(f"{k.name}(): argument {p.name!r} has dtype {a.dtype}, expected "
                             f"{p.type.dtype.np_name} (polyad never converts silently: pass "
                             f"x.astype(np.{p.type.dtype.np_name}))")
        if a.ndim != p.type.ndim:
            raise ShapeError(f"{k.name}(): argument {p.name!r} has {a.ndim} dimension(s), "
                             f"expected {p.type.ndim} ({p.type!r})")
        if not a.flags.c_contiguous:
            raise ShapeError(f"{k.name}(): argument {p.name!r} is not C-contiguous; pass "
                             f"np.ascontiguousarray({p.name})")
        if p.intent != "in" and not a.flags.writeable:
            raise ShapeError(f"{k.name}(): argument {p.name!r} is written but read-only")

    def _infer_sizes(self, arrays: dict, sizes: dict) -> None:
        k = self.kernel
        pending = []
        for p in k.params:
            if p.is_array and p.name in arrays:
                for d, (ext, n) in enumerate(zip(p.type.shape, arrays[p.name].shape)):
                    pending.append((p.name, d, ext, n))
        progress = True
        while pending and progress:
            progress = False
            for item in list(pending):
                name, d, ext, n = item
                v = ir.eval_integer(ext, sizes)
                if v is None:
                    solved = _solve_extent(ext, n, sizes)
                    if solved is None:
                        continue
                    sizes[solved[0]] = solved[1]
                    v = n
                if v != n:
                    raise ShapeError(
                        f"{k.name}(): dimension {d} of {name!r} has length {n}, but the kernel "
                        f"declares {ir.expr_str(ext)} = {v} "
                        f"(with {', '.join(f'{s} = {sizes[s]}' for s in sorted(sizes))})")
                pending.remove(item)
                progress = True
        missing = [s for s in k.sizes if s not in sizes]
        if missing:
            raise ArgumentError(f"{k.name}(): cannot infer size(s) {', '.join(missing)} from the "
                                f"arguments; pass them as keywords, e.g. {missing[0]}=...")
        for s in k.sizes:
            if sizes[s] < 0:
                raise ShapeError(f"{k.name}(): size {s} = {sizes[s]}, but sizes must be >= 0")

    def _check_requirements(self, sizes: dict, ints: dict) -> None:
        if not self.requirements:
            return
        values = tuple(sizes.get(n, ints.get(n)) for n in self._param_names)
        if values in self._checked_sizes:
            return
        for req in self.requirements:
            ctx = req.bad_params.get_ctx()
            cons = " and ".join(f"{n} = {v}" for n, v in zip(self._param_names, values))
            point = isl.Set.read_from_str(ctx, f"[{', '.join(self._param_names)}] -> {{ : {cons} }}")
            if not req.bad_params.intersect(point).is_empty():
                desc = ", ".join(f"{n} = {v}" for n, v in zip(self._param_names, values))
                raise ShapeError(f"{self.kernel.name}(): sizes too small ({desc}): {req.message}")
        self._checked_sizes[values] = None

    def __call__(self, *args, **kwargs):
        k = self.kernel
        values, sizes = self._bind(args, kwargs)
        arrays = {}
        scalars = {}
        for p in k.params:
            if p.name not in values:
                continue
            v = values[p.name]
            if p.is_array:
                self._check_array(p, v)
                arrays[p.name] = v
            else:
                scalars[p.name] = self._scalar(p, v)
        self._infer_sizes(arrays, sizes)
        ints = {n: scalars[n] for n in k.int_params}
        self._check_requirements(sizes, ints)
        outs = []
        for p in k.params:
            if p.is_array and p.name not in arrays:
                shape = tuple(ir.eval_integer(e, sizes) for e in p.type.shape)
                arrays[p.name] = np.zeros(shape, p.type.dtype.np)
            if p.intent == "out":
                outs.append(arrays[p.name])
        self._check_aliasing(arrays)
        temps = [self._temporary(t, tuple(max(0, ir.eval_integer(e, {**sizes, **ints}))
                                          for e in t.type.shape)) for t in k.temps]
        result = np.zeros(1, k.result[1].np) if k.result is not None else None
        cargs = []
        temp_iter = iter(temps)
        ffi = self._ffi
        for kind, name, decl in self.signature.params:
            if kind == "array":
                a = arrays[name]
                cargs.append(ffi.cast(_ctype(decl), a.ctypes.data))
            elif kind == "scalar":
                cargs.append(scalars[name])
            elif kind == "size":
                cargs.append(sizes[name])
            elif kind == "temp":
                cargs.append(ffi.cast(_ctype(decl), next(temp_iter).ctypes.data))
            else:
                cargs.append(ffi.cast(_ctype(decl), result.ctypes.data))
        self._fn(*cargs)
        value = result[0] if result is not None else None
        if value is not None and outs:
            return (value, *outs)
        if value is not None:
            return value
        if len(outs) == 1:
            return outs[0]
        return tuple(outs) if outs else None

    def _temporary(self, t: ir.Temp, shape: tuple) -> np.ndarray:
        """This thread's buffer for temporary ``t`` (zero-filled for ``pa.zeros``)."""
        cache = getattr(self._temp_buffers, "arrays", None)
        if cache is None:
            cache = self._temp_buffers.arrays = {}
        buf = cache.get(t.name)
        if buf is None or buf.shape != shape:
            buf = cache[t.name] = np.empty(shape, t.type.dtype.np)
        if t.zero:
            buf.fill(0)
        return buf

    def _scalar(self, p: ir.Param, v):
        dt = p.type
        if dt.is_float:
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer,
                                                                       np.floating)):
                raise DTypeError(f"{self.kernel.name}(): argument {p.name!r} must be a number "
                                 f"({dt.np_name}), got {type(v).__name__}")
            return float(v)
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise DTypeError(f"{self.kernel.name}(): argument {p.name!r} must be an integer "
                             f"({dt.np_name}), got {v!r}")
        info = np.iinfo(dt.np)
        if not info.min <= int(v) <= info.max:
            raise ArgumentError(f"{self.kernel.name}(): argument {p.name!r} = {v} does not fit "
                                f"in {dt.np_name}")
        return int(v)

    def _check_aliasing(self, arrays: dict) -> None:
        written = [p.name for p in self.kernel.params if p.is_array and p.intent != "in"]
        names = list(arrays)
        for w in written:
            for other in names:
                if other != w and np.may_share_memory(arrays[w], arrays[other]):
                    raise ShapeError(f"{self.kernel.name}(): output {w!r} shares memory with "
                                     f"{other!r}; pass separate arrays (e.g. {other}.copy())")


class CompiledKernel(KernelFunction):
    """A kernel compiled to a shared library (cached), callable on numpy arrays.

    Attributes: ``source`` (the C text), ``library`` (path), ``kernel`` (IR).
    """

    def __init__(self, kernel: ir.Kernel, source: str, signature, requirements, param_names,
                 sanitize: Optional[str] = None):
        self.source = source
        self.library = compile_c(source, signature.name, sanitize)
        ffi = cffi.FFI()
        ffi.cdef(c_prototype(signature))
        # Never unmapped: OpenMP worker threads may still spin in libgomp (loaded
        # for this library) when the interpreter exits and frees the handle.
        self._lib = ffi.dlopen(str(self.library), ffi.RTLD_NOW | ffi.RTLD_NODELETE)
        super().__init__(kernel, signature, requirements, param_names, ffi,
                         getattr(self._lib, signature.name))


def c_prototype(signature) -> str:
    """The declaration of a kernel's C function as cffi's ``cdef`` takes it."""
    return re.sub(r"\brestrict\b\s*", "", signature.declaration()) + ";"


def _ctype(decl: str) -> str:
    """``const double *restrict x`` -> ``double *`` (the pointer type cffi casts to)."""
    base = re.sub(r"\b(const|restrict)\b", "", decl).split("*")[0].strip()
    return base + " *"
