"""Load compiled kernels with cffi (ABI mode) and call them on numpy arrays.

``KernelFunction`` checks every argument before any C runs: types and dtypes
(no silent conversion), ndim, shapes against the size symbols, C-contiguity,
outputs aliasing other arrays, and the size conditions boundary modes need.

A call runs a **binding plan** made once per kernel and per call pattern
(how many positional arguments, which keywords): where each parameter's
value comes from, the order in which array extents determine or check the
sizes (extents compiled to small Python functions), which array pairs could
alias, which outputs to allocate. The success path is then a few attribute
reads and comparisons per argument, ``ffi.from_buffer`` per array and one
cffi call. When a guard fails, the check that owns the error runs in full
(``_check_array``, ``_scalar``, ``_infer_sizes``, ``_check_aliasing``) and
raises the error it always raised; those checkers are the specification
the plan's guards implement.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Callable, Optional

import cffi
import islpy as isl
import numpy as np

from .. import callconv, ir
from ..errors import ArgumentError, DTypeError, ShapeError
from ..ir import SizeVar
from ..schedule.fusion import chunk_schedule
from . import budget, output_pool, threads
from .arrays import as_array_argument
from .toolchain import load_library


# --------------------------------------------------------------------------
# extents compiled to Python functions
# --------------------------------------------------------------------------

_INT_OPS = ("+", "-", "*", "//", "%")  # Python spells them as the IR does


def _extent_source(e: ir.Expr, slot: dict) -> Optional[str]:
    """Python source of integer expression ``e`` over ``v[slot[name]]``, as
    ``ir.eval_integer`` evaluates it; None when ``eval_integer`` cannot."""
    if isinstance(e, ir.Const):
        return repr(int(e.value))
    if isinstance(e, (SizeVar, ir.ScalarRef)):
        return f"v[{slot[e.name]}]" if e.name in slot else None
    if isinstance(e, ir.Cast):
        return _extent_source(e.a, slot)
    if isinstance(e, ir.Unary) and e.op == "neg":
        a = _extent_source(e.a, slot)
        return None if a is None else f"(-{a})"
    if isinstance(e, ir.Binary) and e.op in _INT_OPS:
        a, b = _extent_source(e.a, slot), _extent_source(e.b, slot)
        return None if a is None or b is None else f"({a} {e.op} {b})"
    return None


def _compile_extent(e: ir.Expr, slot: dict) -> Optional[Callable[[list], int]]:
    """``e`` as a function of the value list ``v`` (sizes, then integer parameters).

    Division or remainder by zero raises ZeroDivisionError where
    ``ir.eval_integer`` gives None; callers treat both as "cannot evaluate".
    """
    src = _extent_source(e, slot)
    return None if src is None else eval(f"lambda v: {src}", {})  # noqa: S307 (our own text)


def _compile_shape(shape: tuple, slot: dict, clamp: bool = False) -> Callable[[list], tuple]:
    """The whole shape as one function of the value list (``clamp``: negative -> 0)."""
    parts = [_extent_source(e, slot) for e in shape]
    if any(p is None for p in parts):
        raise AssertionError(f"an extent of {shape} is not an integer expression of sizes "
                             f"and integer parameters")
    items = "".join((f"max(0, {p}), " if clamp else f"{p}, ") for p in parts)
    return eval(f"lambda v: ({items})", {})  # noqa: S307 (our own text)


def _storage_shape(at: ir.ArrayType, slot: dict) -> Callable[[list], tuple]:
    """The shape of the numpy buffer holding an array of type ``at``, as a function of the
    value list: the array's own shape, its element count for a packed layout (a
    triangle), or for a packed dtype its words in one dimension."""
    shape = _compile_shape(at.shape if at.layout is None else (at.layout.count,), slot,
                           clamp=True)
    if not at.dtype.packed:
        return shape
    words = at.dtype.storage_elements
    return lambda v: (words(math.prod(shape(v))),)


def _solve_into(v: list, slot: int, fn: Callable[[list], int], n: int) -> bool:
    """Set ``v[slot]`` so that ``fn(v) == n`` (``fn`` linear in it), as ``ir.solve_extent``
    does; False when that has no integer solution it can find."""
    v[slot] = 0
    f0 = fn(v)
    v[slot] = 1
    step = fn(v) - f0
    if step == 0:
        return False
    x, rem = divmod(n - f0, step)
    v[slot] = x
    return not rem and fn(v) == n


def _compile_conditions(requirements, param_names) -> Optional[Callable[[list], bool]]:
    """One function of the value list that is True when some requirement's bad set
    contains the point, or None when a set needs ISL to decide (existential
    variables, parameters other than ``param_names``).

    Each bad set is a union of basic sets, each a conjunction of integer linear
    equalities and inequalities over the parameters: exactly what a Python
    expression on integers decides.
    """
    index = {name: k for k, name in enumerate(param_names)}
    disjuncts = []
    for req in requirements:
        s = req.bad_params
        names = [s.get_dim_name(isl.dim_type.param, k) for k in range(s.dim(isl.dim_type.param))]
        if any(n not in index for n in names) or s.dim(isl.dim_type.set) != 0:
            return None
        for bs in s.get_basic_sets():
            if bs.dim(isl.dim_type.div) != 0:
                return None
            terms = []
            for c in bs.get_constraints():
                parts = [str(c.get_constant_val().to_python())]
                for k, n in enumerate(names):
                    coef = c.get_coefficient_val(isl.dim_type.param, k).to_python()
                    if coef:
                        parts.append(f"{coef} * v[{index[n]}]")
                terms.append(f"{' + '.join(parts)} {'==' if c.is_equality() else '>='} 0")
            disjuncts.append("(" + (" and ".join(terms) or "True") + ")")
    if not disjuncts:
        return lambda v: False
    return eval(f"lambda v: {' or '.join(disjuncts)}", {})  # noqa: S307 (our own text)


def _size_names(e: ir.Expr) -> set:
    return {x.name for x in ir.walk(e) if isinstance(x, SizeVar)}


def _other_names(e: ir.Expr) -> set:
    """Names in ``e`` that are not sizes (``ir.eval_integer`` never knows them here)."""
    return {x.name for x in ir.walk(e) if isinstance(x, (ir.ScalarRef, ir.LoopVar))}


# --------------------------------------------------------------------------
# binding plans
# --------------------------------------------------------------------------

# What a DSL parameter is, for the per-call loop.
_ARRAY, _FLOAT, _INT = 0, 1, 2
# Size-inference steps, in the order ``_infer_sizes`` takes them.
_SET, _EQUAL, _EVAL, _SOLVE = 0, 1, 2, 3
# The value of an output the caller left out (``None`` is a value a caller may pass).
_OMITTED_OUTPUT = object()


@dataclass(frozen=True, slots=True)
class _ParamSpec:
    """What a call checks and passes for one DSL parameter (the same in every pattern)."""

    param: ir.Param
    kind: int                  # _ARRAY, _FLOAT or _INT
    dtype: Optional[np.dtype]  # arrays: the element dtype numpy reports
    ndim: int
    written: bool              # arrays the kernel writes (must be writeable)
    buffer_type: object        # arrays: the cffi ``T[]`` type ``from_buffer`` builds
    low: int = 0               # integer scalars: the range of their C type
    high: int = 0
    value_slot: int = -1       # integer parameters in size conditions: slot in the value list


@dataclass(frozen=True, slots=True)
class _CallPlan:
    """How one call pattern binds its arguments (built on the first call with the pattern).

    ``supplied``: per DSL parameter, whether the call passes it (else it is an
    output to allocate). ``size_keywords``: (slot, name) of
    sizes passed explicitly. ``steps``: the size-inference program
    (op, parameter, dimension, size slot, compiled extent); ``complete`` is False when
    some size cannot be inferred (the call then raises through ``_infer_sizes``).
    ``signed``: slots of sizes that may come out negative. ``alias_pairs``: (written,
    other) parameter indices of caller-supplied arrays. ``allocate``: (parameter,
    compiled shape) of omitted outputs.
    """

    supplied: tuple
    positional_only: bool
    later_names: tuple         # the parameters after the positional ones, by name
    omitted: tuple             # as many _OMITTED_OUTPUT: kwargs.get's defaults
    size_keywords: tuple
    steps: tuple
    complete: bool
    signed: tuple
    alias_pairs: tuple
    allocate: tuple


class KernelFunction:
    """A kernel's C function behind polyad's Python call interface.

    Calling it checks every argument, allocates omitted outputs and
    temporaries, calls ``fn`` (a cffi function of ``ffi``) and returns the
    result. ``CompiledKernel`` (JIT) and ``polyad.build.load`` (a prebuilt
    cffi extension) both call kernels through this class.
    Attributes: ``kernel`` (IR), ``signature`` (``CSignature``: the C parameters),
    ``requirements`` (size conditions checked before the call). The argument
    ``assigned_outputs``: the ``pa.Out`` arrays the kernel assigns entirely before
    reading them (``ir.Kernel.outputs_assigned_first``); omitted, they are made on
    memory earlier calls' outputs left (``runtime.output_pool``) instead of zeroed.

    Inputs other than numpy arrays (DLPack, the array interface, ndarray
    subclasses) take one more branch where a parameter's guard fails:
    ``as_array_argument`` views them as numpy arrays or refuses them, before
    ``_check_array``.
    """

    def __init__(self, kernel: ir.Kernel, signature, requirements, param_names, ffi: cffi.FFI,
                 fn, assigned_outputs: tuple = ()):
        self.kernel = kernel
        self.signature = signature
        self.requirements = requirements
        self._param_names = param_names  # isl parameter names, in order
        self._ffi = ffi
        self._fn = fn
        # cffi's Python-level FFI.from_buffer only forwards to its C backend's.
        self._from_buffer = getattr(getattr(ffi, "_backend", None), "from_buffer",
                                    ffi.from_buffer)
        # Size conditions as one Python predicate; where ISL must decide, each new
        # tuple of sizes is checked with ISL once and remembered.
        self._bad_sizes = _compile_conditions(requirements, param_names)
        self._checked_sizes: dict[tuple, None] = {}
        self._params = {p.name: p for p in kernel.params}
        self._check_signature_layout()
        # The value list of a call: the sizes, then the integer parameters, in the
        # order of ``param_names`` (the size conditions' ISL parameters).
        self._slot = {name: i for i, name in enumerate((*kernel.sizes, *kernel.int_params))}
        self._specs = tuple(self._spec(p) for p in kernel.params)
        self._nvalues = len(self._slot)
        self._nsizes = len(kernel.sizes)
        # Per temporary: dtype, zero-filled, storage shape (negative extents -> 0; a packed
        # ``bit`` array: its words, flat), cffi type.
        self._temps = tuple((t.type.dtype.np, t.zero, _storage_shape(t.type, self._slot),
                             ffi.typeof(t.type.dtype.c_type + "[]")) for t in kernel.caller_temps)
        self._out_indices = tuple(i for i, p in enumerate(kernel.params) if p.intent == "out")
        self._recycled = frozenset(i for i, p in enumerate(kernel.params)
                                   if p.name in assigned_outputs)
        self._result_type = (None if kernel.result is None else
                             (kernel.result[1].np, ffi.typeof(kernel.result[1].c_type + "[]")))
        self._plans: dict = {}
        # Temporaries and the result cell are reused from call to call (per thread,
        # so concurrent calls never share one): a fresh large array costs a page
        # fault per page on every call, more than the kernel itself for big images.
        self._buffers = threading.local()
        # Bytes the temporaries may take (``memory=`` of pa.grad & co.; None: the default
        # budget, see ``polyad.runtime.budget``). Checked whenever a call allocates them.
        self.memory_budget = None
        # Fused chains' chunked loops (their extents as functions of the value list) and
        # the makers of the kernel functions run where their chunks leave threads idle
        # (``run_other_schedules_when_unbalanced``): "unfused", "fine" (finer chunks) ->
        # maker, and those made; None: always this one.
        self._chunked = None
        self._large_sizes: tuple = ()
        self._makers: dict = {}
        self._others: dict = {}
        self.__name__ = kernel.name
        self.__signature__ = callconv.signature(kernel)
        self.__doc__ = callconv.docstring(kernel)

    def _check_signature_layout(self) -> None:
        """The C parameters are the DSL parameters, sizes, temporaries, result, in order."""
        k = self.kernel
        expected = ([("array" if p.is_array else "scalar", p.name) for p in k.params]
                    + [("size", s) for s in k.sizes] + [("temp", t.name) for t in k.caller_temps]
                    + ([("result", k.result[0])] if k.result is not None else []))
        actual = [(p.kind, p.name) for p in self.signature.params]
        if actual != expected:
            raise AssertionError(f"C signature of {k.name} does not follow the calling "
                                 f"convention: {actual} != {expected}")

    def _spec(self, p: ir.Param) -> _ParamSpec:
        if p.is_array:
            dt = p.type.dtype
            return _ParamSpec(p, _ARRAY, dt.np, p.type.ndim, p.intent != "in",
                              self._ffi.typeof(dt.c_type + "[]"))
        if p.type.is_float:
            return _ParamSpec(p, _FLOAT, None, 0, False, None)
        info = np.iinfo(p.type.np)
        return _ParamSpec(p, _INT, None, 0, False, None, int(info.min), int(info.max),
                          self._slot.get(p.name, -1))

    def run_other_schedules_when_unbalanced(
            self, extents, unfused: Callable[[], "KernelFunction"], large_sizes: tuple = (),
            fine: Optional[Callable[[], "KernelFunction"]] = None) -> None:
        """Run ``fine()`` (the same kernel compiled in finer chunks, ``fuse=16``; None:
        none) or ``unfused()`` (``fuse=False``), each made on first use, for the large
        calls where the chunks of the loops of ``extents`` (IR expressions of the sizes:
        ``Build.chunked_extents``) would leave threads idle on the threads the call gets,
        or where a size is below its bound in ``large_sizes`` (``Build.large_sizes``)
        (``schedule.fusion.chunk_schedule``)."""
        fns = tuple(_compile_extent(e, self._slot) for e in extents)
        if fns and None not in fns:
            self._chunked = fns
            self._large_sizes = tuple((self._slot[size], bound) for size, bound in large_sizes
                                      if size in self._slot)
            self._makers = {"unfused": unfused}
            if fine is not None:
                self._makers["fine"] = fine

    def _other_schedule(self, v: list) -> Optional["KernelFunction"]:
        """The kernel function of finer chunks or the unfused one where the sizes ``v``
        leave threads idle in a large call, or are below the bounds of the separated
        loops (``schedule.fusion.chunk_schedule``), else None."""
        points = 1
        for size in v[:self._nsizes]:
            points *= size
        small = any(v[slot] < bound for slot, bound in self._large_sizes)
        which = chunk_schedule([fn(v) for fn in self._chunked], points,
                               threads.call_threads(), small, "fine" in self._makers)
        if which == "fused":
            return None
        if which not in self._others:
            self._others[which] = self._makers[which]()
        return self._others[which]

    # ---- plans ----------------------------------------------------------
    def _plan(self, args: tuple, kwargs: dict) -> _CallPlan:
        """The plan of the call pattern of ``args``/``kwargs`` (made and kept on first use).

        Binding errors of the pattern itself (too many arguments, unknown or
        repeated keywords, a missing argument) raise here, as ``_bind`` words them.
        """
        self._bind(args, kwargs)
        k = self.kernel
        position = {p.name: i for i, p in enumerate(k.params)}
        supplied = tuple(i < len(args) or p.name in kwargs for i, p in enumerate(k.params))
        explicit = [name for name in kwargs if name not in position]
        steps, known = self._size_steps(supplied, set(explicit))
        arrays = [i for i, p in enumerate(k.params) if p.is_array and supplied[i]]
        written = [i for i in arrays if k.params[i].intent != "in"]
        plan = _CallPlan(
            supplied=supplied,
            positional_only=not kwargs and len(args) == len(k.params),
            later_names=tuple(p.name for p in k.params[len(args):]),
            omitted=(_OMITTED_OUTPUT,) * (len(k.params) - len(args)),
            size_keywords=tuple((self._slot[name], name) for name in explicit),
            steps=steps,
            complete=known >= set(k.sizes),
            signed=tuple(self._slot[s] for s in explicit)
            + tuple(step[3] for step in steps if step[0] == _SOLVE),
            alias_pairs=tuple((w, o) for w in written for o in arrays if o != w),
            allocate=tuple((i, _compile_shape(p.type.shape, self._slot))
                           for i, p in enumerate(k.params) if not supplied[i]))
        self._plans[len(args) if not kwargs else (len(args), *kwargs)] = plan
        return plan

    def _size_steps(self, supplied: tuple, explicit: set) -> tuple[tuple, set]:
        """``_infer_sizes``'s sequence of solves and checks for this pattern, as steps.

        Which item ``_infer_sizes`` settles when depends only on which sizes are
        known, so replaying its loop on names gives its exact order, provided
        every solve succeeds; a call whose solve fails takes ``_infer_sizes``
        itself.
        """
        k = self.kernel
        pending = [(i, d, ext) for i, p in enumerate(k.params)
                   if p.is_array and supplied[i]
                   for d, ext in enumerate(p.type.shape)]
        known = set(explicit)
        steps = []
        progress = True
        while pending and progress:
            progress = False
            for item in list(pending):
                i, d, ext = item
                fn = _compile_extent(ext, self._slot)
                if fn is None or _other_names(ext):
                    continue  # eval_integer never evaluates it: never settled
                unknown = _size_names(ext) - known
                if not unknown:
                    if isinstance(ext, SizeVar):
                        steps.append((_EQUAL, i, d, self._slot[ext.name], None))
                    else:
                        steps.append((_EVAL, i, d, -1, fn))
                elif len(unknown) == 1:
                    name = unknown.pop()
                    op = _SET if isinstance(ext, SizeVar) else _SOLVE
                    steps.append((op, i, d, self._slot[name], fn))
                    known.add(name)
                else:
                    continue
                pending.remove(item)
                progress = True
        return tuple(steps), known

    # ---- the call --------------------------------------------------------
    def __call__(self, *args, **kwargs):
        plan = self._plans.get(len(args) if not kwargs else (len(args), *kwargs))
        if plan is None:
            plan = self._plan(args, kwargs)
        if plan.positional_only:
            values = args
        else:
            values = args + tuple(map(kwargs.get, plan.later_names, plan.omitted))
        v = [None] * self._nvalues  # sizes, then integer parameters
        for slot, name in plan.size_keywords:
            n = kwargs[name]
            v[slot] = n if type(n) is int else self._size_value(name, n)
        from_buffer = self._from_buffer
        cvals = []
        viewed = None  # index -> the numpy view of a non-numpy array argument
        for spec, a in zip(self._specs, values):
            kind = spec.kind
            if kind == _ARRAY:
                if a is _OMITTED_OUTPUT:
                    cvals.append(None)  # allocated below
                    continue
                if type(a) is not np.ndarray or a.dtype is not spec.dtype or a.ndim != spec.ndim:
                    if type(a) is not np.ndarray:
                        a = as_array_argument(self.kernel.name, spec.param, a)
                        viewed = viewed or {}
                        viewed[self._specs.index(spec)] = a
                    self._check_array(spec.param, a)
                flags = a.flags
                if not flags.c_contiguous or (spec.written and not flags.writeable):
                    self._check_array(spec.param, a)
                cvals.append(from_buffer(spec.buffer_type, a, False))
            elif kind == _FLOAT:
                cvals.append(a if type(a) is float else self._scalar(spec.param, a))
            else:
                if type(a) is not int or not spec.low <= a <= spec.high:
                    a = self._scalar(spec.param, a)
                cvals.append(a)
                if spec.value_slot >= 0:
                    v[spec.value_slot] = a
        if viewed is not None:
            values = tuple(viewed.get(i, a) for i, a in enumerate(values))
        # Sizes: the plan's steps, in _infer_sizes's order (which takes over where they fail).
        ok = plan.complete
        if ok:
            try:
                for op, i, d, slot, fn in plan.steps:
                    n = values[i].shape[d]
                    if op == _SET:
                        v[slot] = n
                    elif op == _EQUAL:
                        if v[slot] != n:
                            ok = False
                            break
                    elif op == _EVAL:
                        if fn(v) != n:
                            ok = False
                            break
                    elif not _solve_into(v, slot, fn, n):
                        ok = False
                        break
            except ZeroDivisionError:
                ok = False
            if ok:
                for slot in plan.signed:
                    if v[slot] < 0:
                        ok = False
        if not ok:
            self._sizes_the_long_way(plan, values, v)
        if self.requirements:
            bad = self._bad_sizes
            if bad is None:
                if tuple(v) not in self._checked_sizes:
                    self._check_requirements_values(tuple(v))
            elif bad(v):
                self._check_requirements_values(tuple(v))  # raises, naming the condition
        if self._chunked is not None:
            other = self._other_schedule(v)
            if other is not None:
                return other(*args, **kwargs)
        if plan.allocate:
            values = list(values)  # the allocated outputs take their places
            for i, shape in plan.allocate:
                spec = self._specs[i]
                a = values[i] = (output_pool.empty(shape(v), spec.dtype) if i in self._recycled
                                 else np.zeros(shape(v), spec.dtype))
                cvals[i] = from_buffer(spec.buffer_type, a, False)
        for w, o in plan.alias_pairs:
            a, b = values[w], values[o]
            if a is b or not (a.flags.owndata and b.flags.owndata) and np.may_share_memory(a, b):
                self._check_aliasing(self._arrays_by_name(plan, values))
        if self._temps:
            cvals += v[:self._nsizes]
            cvals += self._temporaries(v)
        else:
            cvals += v[:self._nsizes] if self._nsizes < self._nvalues else v
        result = self._result_type
        if result is not None:
            result, pointer = self._result_cell()
            cvals.append(pointer)
        previous_threads = threads.begin_call()
        try:
            self._fn(*cvals)
        finally:
            threads.end_call(previous_threads)
        if self._out_indices:
            outs = [values[i] for i in self._out_indices]
            if result is not None:
                return (result[0], *outs)
            return outs[0] if len(outs) == 1 else tuple(outs)
        return None if result is None else result[0]

    def _sizes_the_long_way(self, plan: _CallPlan, values, v: list) -> None:
        """Infer the sizes with ``_infer_sizes`` (which raises the error the plan's steps
        detected, or settles a case they do not cover) and store them in ``v``."""
        sizes = {name: v[slot] for slot, name in plan.size_keywords}
        arrays = {p.name: a for p, a in zip(self.kernel.params, values)
                  if p.is_array and a is not _OMITTED_OUTPUT}
        self._infer_sizes(arrays, sizes)
        for name, n in sizes.items():
            v[self._slot[name]] = n

    def _arrays_by_name(self, plan: _CallPlan, values) -> dict:
        """The call's arrays in ``_check_aliasing``'s order: supplied ones, then allocated."""
        params = self.kernel.params
        order = [i for i, p in enumerate(params) if p.is_array and plan.supplied[i]]
        order += [i for i, _ in plan.allocate]
        return {params[i].name: values[i] for i in order}

    def _temporaries(self, v: list) -> list:
        """This thread's buffers for the temporaries, as C pointers (``pa.zeros`` ones zeroed)."""
        buffers = getattr(self._buffers, "temps", None)
        if buffers is None:
            buffers = self._buffers.temps = [None] * len(self._temps)
        shapes = [shape_of(v) for _, _, shape_of, _ in self._temps]
        if any(c is None or c[0].shape != s for c, s in zip(buffers, shapes)):
            self._check_budget(shapes, v)
        pointers = []
        for j, (dtype, zero, shape_of, buffer_type) in enumerate(self._temps):
            shape = shapes[j]
            cached = buffers[j]
            if cached is None or cached[0].shape != shape:
                array = np.empty(shape, dtype)
                cached = buffers[j] = (array, self._from_buffer(buffer_type, array, False))
            if zero:
                cached[0].fill(0)
            pointers.append(cached[1])
        return pointers

    def _check_budget(self, shapes: list, v: list) -> None:
        """Raise ``MemoryBudgetError`` before allocating temporaries over the budget."""
        nbytes = [int(np.prod(s, dtype=np.float64)) * np.dtype(t[0]).itemsize
                  for s, t in zip(shapes, self._temps)]
        sizes = {name: v[slot] for name, slot in self._slot.items()}
        budget.check(self.kernel, nbytes, sizes, self.memory_budget)

    def _result_cell(self):
        """This thread's one-element array receiving the returned scalar, and its pointer."""
        cell = getattr(self._buffers, "result", None)
        if cell is None:
            array = np.zeros(1, self._result_type[0])
            cell = self._buffers.result = (array, self._from_buffer(self._result_type[1], array,
                                                                    False))
        return cell

    # ---- the checks (the specification of the plan's guards) ------------
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
                sizes[name] = self._size_value(name, v)
            else:
                raise ArgumentError(f"{k.name}() got an unknown argument {name!r}; its parameters "
                                    f"are {[p.name for p in k.params]}, sizes {list(k.sizes)}")
        for p in k.params:
            if p.name not in values and p.intent != "out":
                raise ArgumentError(f"{k.name}() is missing argument {p.name!r}")
        return values, sizes

    @staticmethod
    def _size_value(name: str, v) -> int:
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
            raise DTypeError(f"size {name} must be an integer, got {v!r}")
        return int(v)

    def _check_array(self, p: ir.Param, a) -> None:
        k = self.kernel
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
        """Complete ``sizes`` in place from the shapes of ``arrays`` (raises on conflicts)."""
        sizes.update(ir.infer_sizes(self.kernel, {n: a.shape for n, a in arrays.items()}, sizes))

    def _check_requirements_values(self, values: tuple) -> None:
        """Check the size conditions for ``values`` (in ``param_names`` order), once per tuple."""
        for req in self.requirements:
            ctx = req.bad_params.get_ctx()
            cons = " and ".join(f"{n} = {v}" for n, v in zip(self._param_names, values))
            point = isl.Set.read_from_str(ctx, f"[{', '.join(self._param_names)}] -> {{ : {cons} }}")
            if not req.bad_params.intersect(point).is_empty():
                desc = ", ".join(f"{n} = {v}" for n, v in zip(self._param_names, values))
                raise ShapeError(f"{self.kernel.name}(): sizes too small ({desc}): {req.message}")
        self._checked_sizes[values] = None

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

    def __repr__(self) -> str:
        return f"<polyad compiled kernel {self.kernel.name}{self.__signature__}>"


class CompiledKernel(KernelFunction):
    """A kernel compiled to a shared library (cached), callable on numpy arrays.

    Attributes: ``source`` (the C text), ``library`` (path), ``kernel`` (IR).
    ``deterministic``: the source of a ``deterministic=True`` build, compiled without
    contracting products into fused multiply-adds (``toolchain.arithmetic_flags``).
    ``assigned_outputs``: as for ``KernelFunction``.
    """

    def __init__(self, kernel: ir.Kernel, source: str, signature, requirements, param_names,
                 sanitize: Optional[str] = None, deterministic: bool = False,
                 assigned_outputs: tuple = ()):
        self.source = source
        ffi = cffi.FFI()
        ffi.cdef(c_prototype(signature))
        self.library, self._lib, fn = load_library(source, signature.name, sanitize, ffi,
                                                   signature.name, deterministic)
        super().__init__(kernel, signature, requirements, param_names, ffi, fn,
                         assigned_outputs)


def c_prototype(signature) -> str:
    """The declaration of a kernel's C function as cffi's ``cdef`` takes it."""
    return signature.declaration(restrict=False) + ";"
