"""PyTorch bridge: a polyad kernel as a differentiable PyTorch function.

::

    import polyad.torch

    blur = polyad.torch.function(blur_kernel, wrt=["x", "w"])
    y = blur(x, w)                  # torch tensors in, torch tensors out
    y.sum().backward()              # runs the generated vjp kernel

``function(kernel, wrt=None)`` returns a callable backed by a
``torch.autograd.Function``: forward runs the compiled kernel, backward the
kernel ``pa.vjp(kernel, wrt)``. Inputs are the kernel's ``in`` and in-out
parameters (positional or by name); outputs are the returned scalar (a 0-d
tensor) followed by the ``pa.Out`` and in-out arrays, one tensor or a tuple
(see ``polyad.functional``). ``wrt`` defaults to every floating-point input.

CPU tensors reach the kernel without a copy when they are contiguous and of
the kernel's dtype (non-contiguous ones are made contiguous, as torch
operators do; a dtype mismatch is an error: polyad never converts). CUDA
tensors are refused until polyad has a CUDA target. Float scalar parameters
accept Python numbers or 0-d tensors (only the latter get gradients).
Backward is not itself differentiable (``once_differentiable``).

Requires the ``polyad[torch]`` extra; ``import polyad`` does not import torch.
"""

from __future__ import annotations

import inspect

import torch
from torch.autograd.function import once_differentiable

from .api import Kernel
from .errors import ArgumentError, DTypeError
from .functional import FunctionalKernel, describe, param_dtype, split_sizes, unpack

__all__ = ["function"]


def _to_numpy(fk: FunctionalKernel, p, value):
    """A kernel argument from a tensor (no copy when contiguous) or a number."""
    dt = param_dtype(p)
    if not isinstance(value, torch.Tensor):
        return value
    if value.device.type != "cpu":
        raise ArgumentError(f"{fk.name}(): input {p.name!r} is on {value.device}; polyad runs "
                            f"kernels on the CPU (OpenMP) for now: pass {p.name}.cpu()")
    expected = getattr(torch, dt.np_name)
    if value.dtype != expected:
        raise DTypeError(f"{fk.name}(): input {p.name!r} has dtype {value.dtype}, expected "
                         f"{expected} (polyad never converts silently: pass "
                         f"{p.name}.to({expected}))")
    if not p.is_array:
        if value.dim() != 0:
            raise ArgumentError(f"{fk.name}(): input {p.name!r} is a scalar parameter; pass a "
                                f"number or a 0-d tensor, got shape {tuple(value.shape)}")
        return value.item()
    return value.detach().contiguous().numpy()


class _KernelFunction(torch.autograd.Function):
    """forward: the kernel; backward: its vjp kernel (both compiled polyad C)."""

    @staticmethod
    def forward(ctx, fk: FunctionalKernel, sizes: dict, *inputs):
        arrays = [_to_numpy(fk, p, v) for p, v in zip(fk.inputs, inputs)]
        outputs = fk.forward(arrays, sizes)
        ctx.fk, ctx.sizes, ctx.arrays = fk, sizes, arrays
        return tuple(torch.from_numpy(o) for o in outputs)

    @staticmethod
    @once_differentiable
    def backward(ctx, *cotangents):
        fk = ctx.fk
        cts = [c.detach().contiguous().numpy() for c in cotangents]
        grads = dict(zip(fk.wrt, fk.backward(ctx.arrays, cts, ctx.sizes)))
        result = [None, None]
        for p, needs in zip(fk.inputs, ctx.needs_input_grad[2:]):
            g = grads.get(p.name)
            result.append(torch.from_numpy(g) if needs and g is not None
                          else None)
        return tuple(result)


class TorchKernel:
    """A polyad kernel callable on torch tensors, differentiable with respect to ``wrt``."""

    def __init__(self, kernel: Kernel, wrt=None):
        self.functional = FunctionalKernel(kernel, wrt)
        fk = self.functional
        self.__name__ = fk.name
        self.__doc__ = describe(fk, "PyTorch")
        self.__signature__ = inspect.Signature(
            [inspect.Parameter(p.name, inspect.Parameter.POSITIONAL_OR_KEYWORD)
             for p in fk.inputs] +
            [inspect.Parameter(s, inspect.Parameter.KEYWORD_ONLY, default=None)
             for s in kernel.ir.sizes])

    def __call__(self, *args, **kwargs):
        fk = self.functional
        inputs, sizes = split_sizes(fk, args, kwargs)
        for p, v in zip(fk.inputs, inputs):
            if isinstance(v, torch.Tensor) and v.requires_grad and p.name not in fk.wrt:
                raise ArgumentError(
                    f"{fk.name}(): input {p.name!r} requires grad, but this function is "
                    f"differentiable only with respect to {fk.wrt}: add {p.name!r} to wrt= "
                    f"or pass {p.name}.detach()")
        return unpack(list(_KernelFunction.apply(fk, sizes, *inputs)))

    def __repr__(self) -> str:
        return f"<polyad.torch function {self.__name__} wrt={self.functional.wrt}>"


def function(kernel: Kernel, wrt=None) -> TorchKernel:
    """``kernel`` as a differentiable PyTorch function (see the module docstring).

    ``wrt``: an input name or a list of names (default: every floating-point
    input). An input outside ``wrt`` that requires grad is an error.
    """
    return TorchKernel(kernel, wrt)
