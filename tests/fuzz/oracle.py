"""The runtime of the independent reference translation (``Case.ref``).

Boundary modes follow ``numpy.pad`` exactly (``edge``, ``wrap``, ``reflect``
with repeated reflection, ``constant`` 0), written out here as index
arithmetic; nothing here imports polyad. ``FloatLib`` runs the reference on
Python floats (float64), ``JaxLib`` on JAX scalars (for ``jax.grad``).
"""

from __future__ import annotations

import math

import numpy as np


class Undefined(Exception):
    """The program has no meaning at these sizes (a read of an empty array through a mode)."""


class GeneratorBug(Exception):
    """The generator produced an out-of-bounds access on an array without a boundary mode."""


def mode_index(i: int, n: int, mode):
    """The element a mode maps index ``i`` of an extent-``n`` dimension to (None: dropped)."""
    if 0 <= i < n:
        return i
    if mode is None:
        raise GeneratorBug(f"index {i} outside extent {n} of an array without a boundary mode")
    if mode == "zero":
        return None
    if n == 0:
        raise Undefined(f"{mode} access to an empty dimension")
    if mode == "clamped":
        return min(max(i, 0), n - 1)
    if mode == "circular":
        return i % n
    if mode == "mirror":
        if n == 1:
            return 0
        period = 2 * n - 2
        j = i % period
        return j if j < n else period - j
    raise ValueError(mode)


class _Lib:
    def rd(self, arr, mode, idx):
        pos = []
        for i, n in zip(idx, arr.shape):
            j = mode_index(i, n, mode)
            if j is None:
                return 0.0
            pos.append(j)
        return arr[tuple(pos)]

    def wr(self, arr, mode, idx, op, value):
        """``arr[idx] op= value()``; a write a ``.zero`` array drops is not evaluated
        (polyad restricts the statement's domain to the kept writes)."""
        pos = []
        for i, n in zip(idx, arr.shape):
            j = mode_index(i, n, mode)
            if j is None:
                return
            pos.append(j)
        pos = tuple(pos)
        value = value()
        if op == "=":
            arr[pos] = value
        elif op == "+=":
            arr[pos] = arr[pos] + value
        elif op == "-=":
            arr[pos] = arr[pos] - value
        elif op == "*=":
            arr[pos] = arr[pos] * value
        else:
            raise ValueError(op)
        self.written(arr[pos])

    def written(self, value) -> None:
        """Called with every value an element is given (``FloatLib`` watches for overflow)."""

    def zeros(self, shape):
        a = np.empty(tuple(max(0, n) for n in shape), dtype=object)
        a.fill(0.0)
        return a

    min = staticmethod(min)
    max = staticmethod(max)

    @staticmethod
    def sq(x):
        """``x ** 2`` as a product: Python's power raises OverflowError where C's square
        is infinite."""
        return x * x


def _ieee(fn):
    """``fn`` of the math module, NaN for an infinite argument as in C (the math module
    raises ValueError there)."""
    return lambda x: fn(x) if math.isfinite(x) else math.nan


class FloatLib(_Lib):
    """Python floats (float64) and the math module, with C's IEEE results where Python
    raises instead: a square that overflows is infinite (``x ** 2`` raises
    OverflowError), the sine and cosine of an infinity are NaN.

    ``overflowed``: some element was given a value past ``limit`` in magnitude (the
    largest float of the case's dtype), an infinity or a NaN."""

    def __init__(self, limit: float = math.inf):
        self.limit = limit
        self.overflowed = False

    def written(self, value) -> None:
        if not (math.isfinite(value) and abs(value) <= self.limit):
            self.overflowed = True

    sin = staticmethod(_ieee(math.sin))
    cos = staticmethod(_ieee(math.cos))
    tanh = staticmethod(math.tanh)
    exp = staticmethod(math.exp)
    sqrt = staticmethod(math.sqrt)
    log = staticmethod(math.log)
    abs = staticmethod(abs)


class JaxLib(_Lib):
    """JAX scalars; |x| has derivative sign(x) (0 at 0), as polyad defines it."""

    def __init__(self):
        import jax.numpy as jnp
        self.jnp = jnp
        self.sin, self.cos, self.tanh = jnp.sin, jnp.cos, jnp.tanh
        self.exp, self.sqrt, self.log = jnp.exp, jnp.sqrt, jnp.log

    def abs(self, x):
        return x * self.jnp.sign(x)


def load_reference(case):
    """The ``reference(L, A, P, Z)`` function of a case."""
    ns: dict = {}
    exec(compile(case.ref, f"<reference of fuzz case {case.seed}>", "exec"), ns)
    return ns["reference"]


def run_reference(fn, lib, arrays: dict, scalars: dict, sizes: dict):
    """Run on copies (object arrays); returns (result, {name: final object array})."""
    objs = {}
    for name, a in arrays.items():
        o = np.empty(a.shape, dtype=object)
        flat = o.reshape(-1)
        src = a.reshape(-1)
        for k in range(src.size):
            flat[k] = float(src[k])
        objs[name] = o
    result = fn(lib, objs, dict(scalars), dict(sizes))
    return result, objs
