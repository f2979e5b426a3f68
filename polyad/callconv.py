"""The Python calling convention of a kernel, from its IR: the ``inspect.Signature``
and the docstring section that every callable kernel (``@pa.kernel``, derived,
prebuilt) shows to ``help()``, IDEs and ``inspect.signature``.

The convention (the loader implements it): parameters in DSL order, positional
or by keyword; ``pa.Out`` arrays may be omitted (then allocated and returned);
sizes are keywords, inferred from the array shapes when omitted; the result is
the returned scalar, then the ``pa.Out`` arrays, one value or a tuple.
``bind_args`` and ``infer_sizes`` apply the convention to a call's arguments for
the callers that run kernels without the loader (the interpreter, the
checkpointing driver, dask tiling, solvers).
"""

from __future__ import annotations

import inspect

import numpy as np

from . import ir
from .errors import ArgumentError

_P = inspect.Parameter


def signature(k: ir.Kernel, extra_keywords: tuple[str, ...] = ()) -> inspect.Signature:
    """``inspect.Signature`` of a call of ``k``: its parameters, then keyword-only sizes
    (default None: inferred) and ``extra_keywords`` (default None)."""
    params = []
    for i, p in enumerate(k.params):
        # A pa.Out parameter has a default only when every later one is omittable too
        # (Python signatures cannot have a required parameter after a default).
        optional = p.intent == "out" and all(q.intent == "out" for q in k.params[i + 1:])
        params.append(_P(p.name, _P.POSITIONAL_OR_KEYWORD, default=None if optional else _P.empty,
                         annotation=_annotation(p)))
    names = {p.name for p in k.params}
    for s in (*k.sizes, *extra_keywords):
        if s not in names:
            params.append(_P(s, _P.KEYWORD_ONLY, default=None))
    return inspect.Signature(params)


class _Annotation(str):
    """An annotation shown as the DSL spells it (``f64[M, N]``, not ``'f64[M, N]'``)."""

    def __repr__(self) -> str:
        return str(self)


def _annotation(p: ir.Param) -> _Annotation:
    text = repr(p.type) if p.is_array else p.type.name
    return _Annotation(f"Out({text})" if p.intent == "out" else text)


def parameters_doc(k: ir.Kernel) -> str:
    """The ``Parameters`` / ``Sizes`` lines of a kernel's docstring."""
    lines = ["Parameters:"]
    for p in k.params:
        role = {"in": "input", "out": "output, allocated and returned when omitted",
                "inout": "read and written in place"}[p.intent]
        if p.is_array:
            lines.append(f"    {p.name}: numpy array {p.type!r} ({role})")
        else:
            lines.append(f"    {p.name}: {p.type.name} scalar")
    if k.sizes:
        lines.append(f"Sizes (keywords, inferred from the array shapes when omitted): "
                     f"{', '.join(k.sizes)}")
    return "\n".join(lines)


def returns_doc(k: ir.Kernel) -> str:
    """What a plain call of ``k`` returns."""
    outs = [p.name for p in k.params if p.intent == "out"]
    parts = ([f"the returned {k.result[1].np_name} value"] if k.result is not None else []) + \
        [f"the array {o}" for o in outs]
    if not parts:
        return "Returns: None (the kernel writes its in-out arrays in place)."
    if len(parts) == 1:
        return f"Returns: {parts[0]}."
    return f"Returns: a tuple ({', '.join(parts)})."


def docstring(k: ir.Kernel, summary: str = "", returns: str = "") -> str:
    """A kernel's docstring: ``summary`` (or a default), its call signature, parameters,
    sizes and return convention (``returns`` overrides the plain-call one)."""
    head = summary.strip() or f"polyad kernel {k.name} (compiled OpenMP C)."
    return (f"{head}\n\n{k.name}{signature(k)}\n\n{parameters_doc(k)}\n"
            f"{returns or returns_doc(k)}")


def infer_sizes(k: ir.Kernel, arrays: dict, given: dict) -> dict:
    """Sizes from the shapes of the given arrays and the ``given`` sizes (``ir.infer_sizes``)."""
    return ir.infer_sizes(k, {n: np.shape(a) for n, a in arrays.items()}, given)


def bind_args(k: ir.Kernel, args, kwargs):
    """(name -> value for parameters given, sizes given) from a call's arguments."""
    if len(args) > len(k.params):
        raise ArgumentError(f"{k.name}() takes {len(k.params)} arguments, got {len(args)}")
    bound = {p.name: a for p, a in zip(k.params, args)}
    sizes = {}
    pnames = {p.name for p in k.params}
    for n, v in kwargs.items():
        if n in pnames:
            if n in bound:
                raise ArgumentError(f"{k.name}() got multiple values for {n!r}")
            bound[n] = v
        elif n in k.sizes:
            sizes[n] = v
        else:
            raise ArgumentError(f"{k.name}() has no parameter or size named {n!r}")
    for p in k.params:
        if p.name not in bound and p.intent != "out":
            raise ArgumentError(f"{k.name}() missing argument {p.name!r}")
    return bound, sizes
