"""JAX bridge: a polyad kernel as a differentiable JAX function.

::

    import polyad.jax

    blur = polyad.jax.primitive(blur_kernel, wrt=["x", "w"])
    y = jax.jit(blur)(x, w)
    gx, gw = jax.grad(lambda x, w: blur(x, w).sum(), argnums=(0, 1))(x, w)

``primitive(kernel, wrt=None)`` returns a function with a ``jax.custom_vjp``
rule: its forward runs the compiled kernel and its backward the kernel
``pa.vjp(kernel, wrt)``, both on the host through ``jax.pure_callback``, so it
works under ``jax.jit`` (and ``jax.vmap``, one kernel call per batch element).
Inputs are the kernel's ``in`` and in-out parameters (positional or by name),
outputs the returned scalar (a 0-d array) followed by the ``pa.Out`` and
in-out arrays (see ``polyad.functional``). Sizes the input shapes do not fix
are static keyword arguments. ``wrt`` defaults to every floating-point input;
other inputs get zero cotangents (JAX cannot ask which inputs a caller
differentiates, so name them in ``wrt``). Reverse mode only: ``jax.jvp`` /
``jax.jacfwd`` through a ``custom_vjp`` function are not defined by JAX.

Kernels on ``f64`` need ``jax.config.update("jax_enable_x64", True)``.
Requires the ``polyad[jax]`` extra; ``import polyad`` does not import jax.
"""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np

from .api import Kernel
from .errors import DTypeError
from .functional import FunctionalKernel, describe, param_dtype, split_sizes, unpack

__all__ = ["primitive"]


def _host_inputs(fk: FunctionalKernel, values) -> list:
    """The callback's arguments as the kernel takes them (floats for scalar parameters)."""
    out = []
    for p, v in zip(fk.inputs, values):
        v = np.asarray(v)
        out.append(v if p.is_array else v.item())
    return out


class JaxKernel:
    """A polyad kernel callable on JAX arrays, with a ``custom_vjp`` rule."""

    def __init__(self, kernel: Kernel, wrt=None):
        self.functional = fk = FunctionalKernel(kernel, wrt)
        self.__name__ = fk.name
        self.__doc__ = describe(fk, "JAX")
        self.__signature__ = inspect.Signature(
            [inspect.Parameter(p.name, inspect.Parameter.POSITIONAL_OR_KEYWORD)
             for p in fk.inputs] +
            [inspect.Parameter(s, inspect.Parameter.KEYWORD_ONLY, default=None)
             for s in kernel.ir.sizes])
        self._call = jax.custom_vjp(self._forward, nondiff_argnums=(0,))
        self._call.defvjp(self._forward_with_residuals, self._backward)

    def __call__(self, *args, **kwargs):
        fk = self.functional
        inputs, sizes = split_sizes(fk, args, kwargs)
        inputs = [self._check_input(p, v) for p, v in zip(fk.inputs, inputs)]
        return unpack(list(self._call(tuple(sorted(sizes.items())), *inputs)))

    def _check_input(self, p, v):
        fk = self.functional
        dt = param_dtype(p)
        if not p.is_array and isinstance(v, (int, float)) and not isinstance(v, bool):
            v = jnp.asarray(v, dt.np)
        v = jnp.asarray(v) if not isinstance(v, jax.Array) else v
        if v.dtype != dt.np:
            if dt.np.itemsize == 8 and not jax.config.jax_enable_x64:
                fix = ("JAX runs without 64-bit types: call jax.config.update("
                       "'jax_enable_x64', True) at startup, before creating arrays")
            else:
                fix = (f"polyad never converts silently: pass "
                       f"{p.name}.astype(jnp.{dt.np_name})")
            raise DTypeError(f"{fk.name}(): input {p.name!r} has dtype {v.dtype}, expected "
                             f"{dt.np_name} ({fix})")
        if not p.is_array and v.ndim != 0:
            raise DTypeError(f"{fk.name}(): input {p.name!r} is a scalar parameter; pass a "
                             f"number or a 0-d array, got shape {v.shape}")
        return v

    def _specs(self, sizes: tuple, inputs) -> list:
        fk = self.functional
        shapes = {p.name: tuple(v.shape) for p, v in zip(fk.inputs, inputs) if p.is_array}
        return [jax.ShapeDtypeStruct(shape, dtype)
                for shape, dtype in fk.output_specs(shapes, dict(sizes))]

    def _forward(self, sizes: tuple, *inputs):
        fk = self.functional

        def host(*values):
            return tuple(fk.forward(_host_inputs(fk, values), dict(sizes)))

        return tuple(jax.pure_callback(host, tuple(self._specs(sizes, inputs)), *inputs,
                                       vmap_method="sequential"))

    def _forward_with_residuals(self, sizes: tuple, *inputs):
        return self._forward(sizes, *inputs), inputs

    def _backward(self, sizes: tuple, inputs, cotangents):
        fk = self.functional
        wrt_inputs = [(p, v) for p, v in zip(fk.inputs, inputs) if p.name in fk.wrt]
        specs = tuple(jax.ShapeDtypeStruct(jnp.shape(v), param_dtype(p).np)
                      for p, v in wrt_inputs)

        def host(*values):
            ins = _host_inputs(fk, values[:len(fk.inputs)])
            grads = fk.backward(ins, [np.asarray(c) for c in values[len(fk.inputs):]],
                                dict(sizes))
            return tuple(np.asarray(g, s.dtype).reshape(s.shape) for g, s in zip(grads, specs))

        grads = dict(zip(fk.wrt, jax.pure_callback(host, specs, *inputs, *cotangents,
                                                   vmap_method="sequential")))
        return tuple(grads[p.name] if p.name in grads else _zero_cotangent(p, v)
                     for p, v in zip(fk.inputs, inputs))

    def __repr__(self) -> str:
        return f"<polyad.jax primitive {self.__name__} wrt={self.functional.wrt}>"


def _zero_cotangent(p, v):
    """The cotangent of an input outside ``wrt`` (JAX's ``float0`` for integers)."""
    dt = param_dtype(p)
    if dt.is_float:
        return jnp.zeros(jnp.shape(v), dt.np)
    return np.zeros(jnp.shape(v), jax.dtypes.float0)


def primitive(kernel: Kernel, wrt=None) -> JaxKernel:
    """``kernel`` as a differentiable JAX function (see the module docstring).

    ``wrt``: an input name or a list of names (default: every floating-point input).
    """
    return JaxKernel(kernel, wrt)
