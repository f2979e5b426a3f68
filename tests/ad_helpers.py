"""Helpers for the AD tests: running kernels and independent finite differences.

``run(kernel, *args, **kwargs)`` calls the compiled kernel; with
``POLYAD_TEST_INTERPRET=1`` it uses the reference interpreter instead (same
calling convention), to tell AD bugs from compiler bugs.

``fd_grad`` is an element-by-element central finite-difference gradient in
float64, written independently of ``pa.check_grad``.
"""

from __future__ import annotations

import os

import numpy as np

import polyad as pa
from polyad import derivatives as D
from polyad.testing import call_interpreted

grad = pa.grad
value_and_grad = pa.value_and_grad
vjp = pa.vjp
_check_grad = pa.check_grad
derivative = pa.derivative
custom_vjp = pa.custom_vjp


FORCE_INTERPRET = os.environ.get("POLYAD_TEST_INTERPRET", "") not in ("", "0")


def compiled_available() -> bool:
    return not FORCE_INTERPRET


def compiler_issue(reason: str):
    """Mark a test that fails only through the compiled path because of a known compiler or
    runtime issue (strict: it turns into a failure once the issue is fixed - then drop it)."""
    import pytest
    return pytest.mark.xfail(compiled_available(), reason=f"compiler issue: {reason}",
                             strict=True)


def check_grad(*args, **kwargs):
    """pa.check_grad through the same engine as ``run``."""
    kwargs.setdefault("interpret", not compiled_available())
    return _check_grad(*args, **kwargs)


def run(kernel, *args, **kwargs):
    """Call a primal or derived kernel (compiled when available, else interpreted)."""
    if compiled_available():
        return kernel(*args, **kwargs)
    return run_reference(kernel, *args, **kwargs)


def run_reference(kernel, *args, **kwargs):
    """Call a kernel through the reference interpreter (finite differences use this, so only
    the derived kernels under test get compiled)."""
    if isinstance(kernel, D.DerivedKernel):
        return kernel.package(call_interpreted(kernel.ir, *args, **kwargs))
    return call_interpreted(kernel, *args, **kwargs)


def _copy(v):
    return np.array(v, copy=True) if isinstance(v, np.ndarray) else v


def scalar_fn(kernel, args: dict, sizes=None, cotangents=None):
    """f(args) -> float: the kernel's result, or sum_o <cot_o, out_o> for array kernels
    (evaluated by the reference interpreter).

    ``cotangents`` maps output names (pa.Out or in-out parameters) to arrays.
    """
    sizes = sizes or {}
    k = kernel.ir
    outs = [p.name for p in k.params if p.intent == "out"]

    def f(a):
        a = {n: _copy(v) for n, v in a.items()}
        r = run_reference(kernel, **a, **sizes)
        if cotangents is None:
            return float(r[0] if isinstance(r, tuple) else r)
        rr = r if isinstance(r, tuple) else (r,)
        if k.result is not None:
            rr = rr[1:]
        total = 0.0
        for n, o in zip(outs, rr):
            if n in cotangents:
                total += float(np.sum(cotangents[n] * o))
        for n, c in cotangents.items():
            if n not in outs:
                total += float(np.sum(c * a[n]))   # in-out array: its final value
        return total

    return f


def fd_grad(f, args: dict, name: str, eps: float = 1e-6):
    """Central-difference gradient of ``f`` with respect to ``args[name]`` (array or float)."""
    x = args[name]
    if not isinstance(x, np.ndarray):
        ap, am = dict(args), dict(args)
        ap[name], am[name] = x + eps, x - eps
        return (f(ap) - f(am)) / (2 * eps)
    g = np.zeros(x.shape)
    for idx in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[idx] += eps
        xm[idx] -= eps
        ap, am = dict(args), dict(args)
        ap[name], am[name] = xp, xm
        g[idx] = (f(ap) - f(am)) / (2 * eps)
    return g


def assert_close(actual, expected, rtol=1e-6, atol=1e-7, what=""):
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol, err_msg=what)


def check_against_fd(kernel, wrt, args: dict, sizes=None, rtol=1e-6, atol=1e-7, eps=1e-6):
    """Gradient by pa.grad vs element-wise central differences; returns the AD gradients."""
    names = [wrt] if isinstance(wrt, str) else list(wrt)
    g = run(grad(kernel, names), **{n: _copy(v) for n, v in args.items()}, **(sizes or {}))
    f = scalar_fn(kernel, args, sizes)
    for n, gn in zip(names, g):
        assert_close(gn, fd_grad(f, args, n, eps), rtol, atol, what=f"d/d{n}")
    return dict(zip(names, g))


def check_vjp_against_fd(kernel, wrt, args: dict, cotangents: dict, sizes=None, rtol=1e-6,
                         atol=1e-7, eps=1e-6):
    """pa.vjp with the given cotangents vs central differences of sum <cot, out>."""
    names = [wrt] if isinstance(wrt, str) else list(wrt)
    k = kernel.ir
    bars = {}
    for p in k.params:
        if p.intent in ("out", "inout"):
            bars[f"{p.name}_bar"] = cotangents[p.name]
    if k.result is not None:
        bars["result_bar"] = cotangents.get("result", 0.0)
    g = run(vjp(kernel, names), **{n: _copy(v) for n, v in args.items()}, **bars,
            **(sizes or {}))
    f = scalar_fn(kernel, args, sizes, {n: c for n, c in cotangents.items() if n != "result"})
    if k.result is not None and cotangents.get("result", 0.0) != 0.0:
        f0, rbar = f, cotangents["result"]

        def f(a):  # noqa: F811
            r = run_reference(kernel, **{n: _copy(v) for n, v in a.items()}, **(sizes or {}))
            return f0(a) + rbar * float(r[0] if isinstance(r, tuple) else r)
    for n, gn in zip(names, g):
        assert_close(gn, fd_grad(f, args, n, eps), rtol, atol, what=f"vjp d/d{n}")
    return dict(zip(names, g))
