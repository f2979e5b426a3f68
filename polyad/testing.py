"""Reference interpreter of the IR, for differential testing.

``interpret(kernel, args, sizes)`` runs any kernel, primal or derived, one
statement instance at a time in program order, with the DSL's semantics
(boundary modes, Python-style ``//`` and ``%``, dtype-exact arithmetic). It is
slow and obviously correct: every schedule, target and transformation is
checked against it on small random inputs.
"""

from __future__ import annotations

import math
import operator
from typing import Any, Mapping, Optional

import numpy as np

from . import ir
from .callconv import bind_args, infer_sizes
from .errors import ArgumentError
from .intrinsics import INTRINSICS
from .ir import (Binary, Call, Cast, Const, Expr, Load, LoopVar, ScalarRef, Select,
                 SizeVar, Unary)


def _sign(x):
    return type(x)(int(x > 0) - int(x < 0))


_SCALAR_IMPL = {name: f.numpy for name, f in INTRINSICS.items()}
_SCALAR_IMPL.update({
    "sign": _sign, "erf": math.erf, "erfc": math.erfc,
    "min": lambda a, b: a if a <= b else b,
    "max": lambda a, b: a if a >= b else b,
})


_COMPARE = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
            "==": operator.eq, "!=": operator.ne}
# numpy's operations on scalars of one dtype (Python's ``//`` and ``%``: floored); an
# integer ``**`` is Python's, exact
_ARITHMETIC = {"+": operator.add, "-": operator.sub, "*": operator.mul,
               "/": operator.truediv, "//": np.floor_divide, "%": np.mod, "**": np.power}
_UPDATES = ("+=", "-=", "*=", "/=")


def resolve_index(value: int, extent: int, mode: Optional[str]) -> Optional[int]:
    """Where index ``value`` of an array dimension of size ``extent`` lands under ``mode``.

    Returns None for ``zero`` reads/writes outside the array; raises IndexError
    for an unchecked out-of-bounds index.
    """
    if 0 <= value < extent:
        return value
    if mode == "clamped":
        return 0 if value < 0 else extent - 1
    if mode == "circular":
        return value % extent
    if mode == "mirror":
        if extent == 1:
            return 0
        period = 2 * extent - 2
        v = value % period
        return v if v < extent else period - v
    if mode == "zero":
        return None
    raise IndexError(f"index {value} out of range [0, {extent})")


class _Machine:
    def __init__(self, kernel: ir.Kernel, arrays: dict, scalars: dict, sizes: dict):
        self.k = kernel
        self.arrays = arrays
        self.scalars = scalars
        self.sizes = sizes
        self.types = {name: kernel.array_type(name) for name in arrays}
        # array name -> its extents: they are in the sizes only, so evaluated once
        self.shapes: dict[str, tuple] = {}

    def extent(self, e: Expr, env) -> int:
        return int(self.eval(e, env))

    def index(self, ld: Load, env):
        at = self.types[ld.array]
        shape = self.shapes.get(ld.array)
        if shape is None:
            shape = self.shapes[ld.array] = tuple(self.extent(ext, {}) for ext in at.shape)
        out = []
        for ix, ext in zip(ld.index, shape):
            v = resolve_index(int(self.eval(ix, env)), ext, at.mode)
            if v is None:
                return None
            out.append(v)
        return tuple(out)

    def eval(self, e: Expr, env):
        if isinstance(e, Const):
            return e.dtype.np.type(e.value) if e.dtype != ir.boolean else bool(e.value)
        if isinstance(e, LoopVar):
            return env[e.name]
        if isinstance(e, SizeVar):
            return self.sizes[e.name]
        if isinstance(e, ScalarRef):
            return self.scalars[e.name]
        if isinstance(e, Load):
            ix = self.index(e, env)
            return e.dtype.np.type(0) if ix is None else self.arrays[e.array][ix]
        if isinstance(e, Unary):
            a = self.eval(e.a, env)
            return (not a) if e.op == "not" else -a
        if isinstance(e, Binary):
            if e.op == "and":
                return bool(self.eval(e.a, env)) and bool(self.eval(e.b, env))
            if e.op == "or":
                return bool(self.eval(e.a, env)) or bool(self.eval(e.b, env))
            a, b = self.eval(e.a, env), self.eval(e.b, env)
            return self.binary(e, a, b)
        if isinstance(e, Select):
            return self.eval(e.a, env) if self.eval(e.cond, env) else self.eval(e.b, env)
        if isinstance(e, Cast):
            v = self.eval(e.a, env)
            if not e.dtype.is_float and isinstance(v, (float, np.floating)):
                v = math.trunc(v)
            return e.dtype.np.type(v)
        if isinstance(e, Call):
            args = [self.eval(a, env) for a in e.args]
            f = self.k.func(e.func)
            if f is not None:
                return self.call_func(f, args)
            return e.dtype.np.type(_SCALAR_IMPL[e.func](*args))
        raise TypeError(f"cannot interpret {e!r}")

    def binary(self, e: Binary, a, b):
        op = e.op
        if op in ir.COMPARE_OPS:
            return _COMPARE[op](a, b)
        t = e.dtype.np.type
        a, b = t(a), t(b)
        if op == "**" and not e.dtype.is_float:
            return t(int(a) ** int(b))
        if op not in _ARITHMETIC:
            raise TypeError(op)
        return t(_ARITHMETIC[op](a, b))

    def call_func(self, f: ir.FuncDef, args):
        env = {name: dt.np.type(v) for (name, dt), v in zip(f.params, args)}
        return self.run_body(f, f.body, env)

    def run_body(self, f, body, env):
        saved = self.scalars
        for st in body:
            self.scalars = env
            try:
                if isinstance(st, ir.FReturn):
                    return f.result.np.type(self.eval(st.expr, {}))
                if isinstance(st, ir.FAssign):
                    env[st.name] = self.eval(st.expr, {})
                elif isinstance(st, ir.FIf):
                    branch = st.then if self.eval(st.cond, {}) else st.orelse
                    r = self.run_body(f, branch, env)
                    if r is not None:
                        return r
            finally:
                self.scalars = saved
        return None

    def instances(self):
        """All (schedule key, statement, env) instances, in program order."""
        out = []
        for n, st in enumerate(self.k.statements):
            self._enumerate(st, n, 0, {}, (), out)
        out.sort(key=lambda t: t[0])
        return out

    def _enumerate(self, st: ir.Statement, n, depth, env, key, out):
        if depth == len(st.loops):
            for c in st.conditions:
                if bool(self.eval(c.expr, env)) != c.positive:
                    return
            out.append((key + (st.position[depth], n), st, dict(env)))
            return
        lp = st.loops[depth]
        lo, hi = self.extent(lp.lo, env), self.extent(lp.hi, env)
        rng = range(lo, hi, lp.step)
        for v in rng:
            env[lp.var] = v
            sched = v if lp.step > 0 else -v
            self._enumerate(st, n, depth + 1, env, key + (st.position[depth], sched), out)
        env.pop(lp.var, None)

    def run(self):
        for _, st, env in self.instances():
            if st.guard is not None and not self.eval(st.guard, env):
                continue
            value = self.eval(st.expr, env)
            t = st.target
            if isinstance(t, Load):
                ix = self.index(t, env)
                if ix is None:
                    continue
                old = self.arrays[t.array][ix]
                self.arrays[t.array][ix] = self.update(st.op, old, value, t.dtype)
            else:
                old = self.scalars.get(t.name)
                self.scalars[t.name] = self.update(st.op, old, value, t.dtype)

    @staticmethod
    def update(op, old, value, dtype):
        t = dtype.np.type
        if op == "=":
            return t(value)
        if op not in _UPDATES:
            raise ValueError(op)
        return t(_ARITHMETIC[op[:-1]](old, value))


def interpret(kernel: ir.Kernel, args: Mapping[str, Any], sizes: Mapping[str, int]):
    """Run ``kernel`` on ``args`` (name -> numpy array or scalar) with ``sizes``.

    Arrays in ``args`` are updated in place (pass copies to keep the inputs);
    out arrays and temporaries missing from ``args`` are created zeroed.
    Returns ``(result, arrays)``: the returned scalar (or None) and the dict of
    all arrays after the run.
    """
    arrays: dict[str, np.ndarray] = {}
    scalars: dict[str, Any] = {}
    sizes = dict(sizes)
    for p in kernel.params:
        if p.is_array:
            if p.name in args:
                arrays[p.name] = args[p.name]
        else:
            scalars[p.name] = p.type.np.type(args[p.name])
    m = _Machine(kernel, arrays, scalars, sizes)
    for p in kernel.params:
        if p.is_array and p.name not in arrays:
            shape = tuple(m.extent(e, {}) for e in p.type.shape)
            arrays[p.name] = np.zeros(shape, p.type.dtype.np)
    for t in kernel.temps:   # negative extents (a tape of an empty loop) allocate nothing
        shape = tuple(max(0, m.extent(e, {})) for e in t.type.shape)
        arrays[t.name] = np.zeros(shape, t.type.dtype.np)
    m.types = {name: kernel.array_type(name) for name in arrays}
    with np.errstate(all="ignore"):  # IEEE results (inf, nan) as the C kernels give them
        m.run()
    result = None
    if kernel.result is not None:
        result = kernel.result[1].np.type(scalars[kernel.result[0]])
    return result, arrays


# --------------------------------------------------------------------------
# the compiled calling convention, on the interpreter (an independent path)
# --------------------------------------------------------------------------


def call_interpreted(k, *args, **kwargs):
    """Run a kernel (``ir.Kernel`` or anything with ``.ir``) on the reference interpreter,
    called like the compiled kernel: arguments by position or keyword, ``pa.Out``
    arrays optional, sizes from shapes or keywords; returns the value, the Out
    arrays, or ``(value, out1, ...)``.
    """
    kir = k if isinstance(k, ir.Kernel) else k.ir
    bound, sizes = bind_args(kir, args, kwargs)
    values: dict[str, Any] = {}
    arrays = {}
    for p in kir.params:
        if p.name not in bound:
            continue
        v = bound[p.name]
        if p.is_array:
            a = v if isinstance(v, np.ndarray) else np.asarray(v)
            if a.dtype != p.type.dtype.np:
                if p.intent != "in":
                    raise ArgumentError(f"{kir.name}(): {p.name} must have dtype "
                                        f"{p.type.dtype.np_name}, got {a.dtype}")
                a = a.astype(p.type.dtype.np)
            arrays[p.name] = a
            values[p.name] = a
        else:
            values[p.name] = v
    sizes = infer_sizes(kir, arrays, sizes)
    result, out_arrays = interpret(kir, values, sizes)
    outs = [out_arrays[p.name] for p in kir.params if p.intent == "out"]
    if kir.result is not None:
        r = float(result) if kir.result[1].is_float else int(result)
        return (r, *outs) if outs else r
    if not outs:
        return None
    return outs[0] if len(outs) == 1 else tuple(outs)
