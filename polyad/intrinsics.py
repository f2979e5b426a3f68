"""The intrinsic functions of the DSL: one registry, read by every stage.

Each stage keeps its own table keyed by these names (C spelling in ``emit``,
scalar implementation in ``testing``, derivative rule in ``ad.rules``), so an
intrinsic is added in one place per stage.

The objects ``pa.exp``, ``pa.log``, ... are ``Intrinsic`` instances: inside a
kernel the frontend recognises them; called from plain Python they apply the
numpy function, so the same formula can be checked outside a kernel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np


def _sign(x):
    return np.sign(x)


def _rsqrt(x):
    return 1.0 / np.sqrt(x)


_erf_vec = np.vectorize(math.erf, otypes=[float])
_erfc_vec = np.vectorize(math.erfc, otypes=[float])


@dataclass(frozen=True)
class Intrinsic:
    """A DSL intrinsic: ``name``, ``arity`` (-1 = two or more), ``numpy`` implementation.

    ``float_result`` intrinsics convert integer arguments to float (``exp(1)``);
    the others (``abs``, ``min``, ``max``, ``sign``) keep the argument type.
    """

    name: str
    arity: int
    numpy: Callable
    float_result: bool = True

    def __call__(self, *args):
        return self.numpy(*args)


_TABLE = [
    Intrinsic("abs", 1, np.abs, False),
    Intrinsic("sign", 1, _sign, False),
    Intrinsic("min", -1, np.minimum, False),
    Intrinsic("max", -1, np.maximum, False),
    Intrinsic("exp", 1, np.exp),
    Intrinsic("exp2", 1, np.exp2),
    Intrinsic("log", 1, np.log),
    Intrinsic("log2", 1, np.log2),
    Intrinsic("log10", 1, np.log10),
    Intrinsic("sin", 1, np.sin),
    Intrinsic("cos", 1, np.cos),
    Intrinsic("tan", 1, np.tan),
    Intrinsic("sinh", 1, np.sinh),
    Intrinsic("cosh", 1, np.cosh),
    Intrinsic("tanh", 1, np.tanh),
    Intrinsic("asin", 1, np.arcsin),
    Intrinsic("acos", 1, np.arccos),
    Intrinsic("atan", 1, np.arctan),
    Intrinsic("asinh", 1, np.arcsinh),
    Intrinsic("acosh", 1, np.arccosh),
    Intrinsic("atanh", 1, np.arctanh),
    Intrinsic("sqrt", 1, np.sqrt),
    Intrinsic("rsqrt", 1, _rsqrt),
    Intrinsic("erf", 1, _erf_vec),
    Intrinsic("erfc", 1, _erfc_vec),
    Intrinsic("floor", 1, np.floor),
    Intrinsic("ceil", 1, np.ceil),
    Intrinsic("pow", 2, np.power),
    Intrinsic("atan2", 2, np.arctan2),
]

INTRINSICS: dict[str, Intrinsic] = {f.name: f for f in _TABLE}

# Python builtins and ``math`` functions that mean the same intrinsic in a kernel.
PYTHON_ALIASES: dict[object, str] = {abs: "abs", min: "min", max: "max"}
for _name in ("exp", "exp2", "log", "log2", "log10", "sin", "cos", "tan", "sinh", "cosh",
              "tanh", "asin", "acos", "atan", "asinh", "acosh", "atanh", "sqrt", "erf",
              "erfc", "floor", "ceil", "pow", "atan2"):
    if hasattr(math, _name):
        PYTHON_ALIASES[getattr(math, _name)] = _name
