"""A kernel seen as a pure function of its inputs, with its pullback: the common
ground of the framework bridges (``polyad.torch``, ``polyad.jax``).

Conventions (the bridges document them to their users):

* inputs: the kernel's ``in`` and in-out parameters, in parameter order
  (``pa.Out`` parameters are never passed);
* outputs: the returned scalar (if the kernel returns one), then every output
  array (``pa.Out`` and in-out parameters, in parameter order). In-out arrays
  are copied before the call, so the caller's input is never modified and its
  new value is an output;
* sizes the inputs do not determine are keyword arguments, as in a plain call.

This module imports neither torch nor jax; it works on numpy arrays.
"""

from __future__ import annotations

import numpy as np

from . import ir
from .ad import check_wrt
from .api import Kernel
from .derivatives import vjp
from .errors import ArgumentError


class FunctionalKernel:
    """``kernel`` as ``outputs = forward(inputs)`` and ``grads = backward(inputs, cotangents)``.

    Attributes: ``inputs`` / ``outputs`` (``ir.Param`` lists; the returned
    scalar is the output named by ``result`` and listed first), ``wrt`` (the
    differentiated input names, in input order).
    """

    def __init__(self, kernel: Kernel, wrt=None):
        if not isinstance(kernel, Kernel):
            raise TypeError(f"expected a @pa.kernel, got {type(kernel).__name__}")
        kir = kernel.ir
        self.kernel = kernel
        self.name = kir.name
        self.inputs = [p for p in kir.params if p.intent != "out"]
        self.array_outputs = [p for p in kir.params if p.is_array and p.intent != "in"]
        self.result = kir.result  # (name, DType) or None
        if not self.array_outputs and self.result is None:
            raise ArgumentError(f"{self.name}() has no outputs (no pa.Out or written array and no "
                                f"returned value): there is nothing to differentiate")
        if wrt is None:
            wrt = [p.name for p in self.inputs if param_dtype(p).is_float]
        elif isinstance(wrt, str):
            wrt = [wrt]
        names = check_wrt(kir, list(wrt))
        order = [p.name for p in self.inputs]
        self.wrt = sorted(names, key=order.index)
        self._vjp = vjp(kernel, self.wrt) if self.wrt else None

    @property
    def n_outputs(self) -> int:
        return len(self.array_outputs) + (self.result is not None)

    # ---- shapes --------------------------------------------------------
    def infer_sizes(self, shapes: dict, sizes: dict) -> dict:
        """All sizes, from the input shapes (``name -> tuple``) and the given ``sizes``."""
        return ir.infer_sizes(self.kernel.ir, shapes, sizes)

    def output_specs(self, shapes: dict, sizes: dict) -> list[tuple[tuple, np.dtype]]:
        """``(shape, dtype)`` of every output, in output order."""
        sizes = self.infer_sizes(shapes, sizes)
        specs = [((), self.result[1].np)] if self.result is not None else []
        for p in self.array_outputs:
            specs.append((tuple(ir.eval_integer(e, sizes) for e in p.type.shape), p.type.dtype.np))
        return specs

    # ---- calls ---------------------------------------------------------
    def forward(self, inputs: list, sizes: dict) -> list:
        """Run the kernel on ``inputs`` (numpy arrays and numbers); returns its outputs
        (the scalar result as a 0-d array)."""
        args = {}
        for p, v in zip(self.inputs, inputs):
            args[p.name] = np.array(v, copy=True) if p.intent == "inout" else v
        raw = self.kernel(**args, **sizes)
        raw = list(raw) if isinstance(raw, tuple) else [raw]
        outputs = []
        if self.result is not None:
            outputs.append(np.asarray(raw.pop(0), self.result[1].np))
        for p in self.array_outputs:
            outputs.append(raw.pop(0) if p.intent == "out" else args[p.name])
        return outputs

    def backward(self, inputs: list, cotangents: list, sizes: dict) -> list:
        """The cotangents of the ``wrt`` inputs (arrays; float scalars as 0-d arrays) for
        the output ``cotangents`` (in output order)."""
        if self._vjp is None:
            return []
        cts = list(cotangents)
        result_bar = cts.pop(0) if self.result is not None else None
        args = [np.ascontiguousarray(c, p.type.dtype.np) for p, c in zip(self.array_outputs, cts)]
        if result_bar is not None:
            args.append(float(np.asarray(result_bar).reshape(())))
        grads = self._vjp(*inputs, *args, **sizes)
        grads = grads if isinstance(grads, tuple) else (grads,)
        out = []
        for name, g in zip(self.wrt, grads):
            p = self.kernel.ir.param(name)
            out.append(g if p.is_array else np.asarray(g, p.type.np))
        return out


def param_dtype(p: ir.Param) -> ir.DType:
    """The element dtype of a parameter (its own type for a scalar)."""
    return p.type.dtype if p.is_array else p.type


def split_sizes(fk: FunctionalKernel, args: tuple, kwargs: dict) -> tuple[list, dict]:
    """The inputs (positional, or by name) and the size keywords of a bridge call."""
    names = [p.name for p in fk.inputs]
    if len(args) > len(names):
        raise ArgumentError(f"{fk.name}() takes {len(names)} inputs ({', '.join(names)}), got "
                            f"{len(args)}")
    values: dict = dict(zip(names, args))
    sizes = {}
    ksizes = fk.kernel.ir.sizes
    for key, v in kwargs.items():
        if key in names:
            if key in values:
                raise ArgumentError(f"{fk.name}() got input {key!r} twice")
            values[key] = v
        elif key in ksizes:
            sizes[key] = v
        else:
            outs = [p.name for p in fk.array_outputs if p.intent == "out"]
            hint = (f" ({key!r} is an output: the bridge allocates and returns it)"
                    if key in outs else "")
            raise ArgumentError(f"{fk.name}() got an unknown argument {key!r}{hint}; its inputs "
                                f"are {names}, sizes {list(ksizes)}")
    missing = [n for n in names if n not in values]
    if missing:
        raise ArgumentError(f"{fk.name}() is missing input(s) {', '.join(map(repr, missing))}")
    return [values[n] for n in names], sizes


def unpack(outputs: list):
    """One output as itself, several as a tuple."""
    return outputs[0] if len(outputs) == 1 else tuple(outputs)


def describe(fk: FunctionalKernel, framework: str) -> str:
    """The docstring of a bridged kernel: inputs, outputs, differentiated inputs."""
    ins = ", ".join(p.name for p in fk.inputs)
    outs = ([f"the returned {fk.result[1].np_name} (0-d)"] if fk.result else []) + \
        [p.name for p in fk.array_outputs]
    return (f"{fk.name} as a differentiable {framework} function.\n\n"
            f"Inputs: {ins}. Outputs: {', '.join(outs)}"
            f"{' (a tuple)' if len(outs) > 1 else ''}. Differentiable with respect to: "
            f"{', '.join(fk.wrt) or 'nothing'}. Sizes the inputs do not fix are keywords.")
