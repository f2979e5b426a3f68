"""The kernels the CUDA tests run: the forward and gradient corpora, enumerated.

- ``forward_kernels()``: every ``@pa.kernel`` defined at module level in the
  forward-compiler corpus modules (``test_forward_kernels``,
  ``test_boundary_modes``, ``test_kernel_calls``), by ``module.name``.
- ``gradient_cases()``: every case of the AD corpus (``test_ad_corpus.CASES``)
  as ``value_and_grad`` of its kernel with its own arguments, plus the
  float32 gradient kernel and two gradients with packed (triangular) tapes.
- ``random_arguments(kernel, rng, sizes)``: inputs for any kernel from its
  signature (arrays shaped by the sizes, scalars, int parameters).
- ``NAMES`` (both corpora, less the kernels that exist to be rejected),
  ``kernel_of``, ``arguments``, and the comparison helpers ``copies``,
  ``results``, ``assert_matches``, ``assert_matches_reference`` that the simulator
  and device tests share.
"""

from __future__ import annotations

import importlib
import zlib

import numpy as np

import polyad as pa
from polyad import ir
from polyad.derivatives import DerivedKernel
from polyad.testing import call_interpreted

FORWARD_MODULES = ("test_forward_kernels", "test_boundary_modes", "test_kernel_calls")


def forward_kernels() -> dict:
    """``{"module.name": Kernel}`` for every primal kernel of the forward corpus modules."""
    out, seen = {}, set()
    for mod_name in FORWARD_MODULES:
        mod = importlib.import_module(mod_name)
        for name, v in sorted(vars(mod).items()):
            if isinstance(v, pa.Kernel) and not isinstance(v, DerivedKernel) and id(v) not in seen:
                seen.add(id(v))
                out[f"{mod_name}.{name}"] = v
    return out


def gradient_cases() -> dict:
    """``{case: (derived kernel, arguments)}`` for every AD corpus case (value_and_grad)."""
    corpus = importlib.import_module("test_ad_corpus")
    out = {}
    for name, c in sorted(corpus.CASES.items()):
        rng = np.random.default_rng(zlib.crc32(name.encode()))
        kernel, args = c["make"](rng)
        wrt = [c["wrt"]] if isinstance(c["wrt"], str) else list(c["wrt"])
        out[name] = (pa.value_and_grad(kernel, wrt), {**args, **c["sizes"]})
    rng = np.random.default_rng(1)
    out["f32_cost"] = (pa.grad(corpus.f32_cost, ["x", "w"]),
                       dict(x=rng.standard_normal(6).astype(np.float32),
                            w=rng.standard_normal(3).astype(np.float32)))
    tapes = importlib.import_module("tape_kernels")
    for name in ("cholesky", "triangles"):     # tapes stored packed (triangles)
        kernel, wrt = tapes.KERNELS[name]
        out[f"tape_kernels.{name}"] = (pa.grad(kernel, wrt), tapes.make_args(name, 6, rng))
    return out


def random_arguments(kernel, rng, sizes: dict) -> dict:
    """Keyword arguments for ``kernel`` (inputs and in-out arrays, scalars, all sizes)."""
    k = kernel.ir
    args = {s: sizes[s] for s in k.sizes}
    for p in k.params:
        if p.intent == "out":
            continue
        if p.is_array:
            shape = tuple(ir.eval_integer(e, sizes) for e in p.type.shape)
            dt = np.dtype(p.type.dtype.np)
            if dt.kind == "f":
                args[p.name] = rng.standard_normal(shape).astype(dt)
            else:
                # nonzero: integer arrays are divisors in some kernels
                values = rng.integers(1, 4, size=shape) * rng.choice([-1, 1], size=shape)
                args[p.name] = values.astype(dt)
        elif p.type.is_float:
            args[p.name] = float(rng.uniform(0.5, 1.5))
        else:
            args[p.name] = 2
    return args


FORWARD = forward_kernels()
GRADIENTS = gradient_cases()
# Kernels of the forward modules that exist to be rejected (tests of errors).
REJECTED = {"test_kernel_calls.scale_rows"}
NAMES = sorted(set(FORWARD) - REJECTED) + sorted(GRADIENTS)


def kernel_of(name):
    """The kernel (primal or derived) of corpus entry ``name``."""
    return GRADIENTS[name][0] if name in GRADIENTS else FORWARD[name]


def arguments(name) -> dict:
    """The arguments corpus entry ``name`` runs on: the AD case's own, or random inputs with
    distinct sizes (one axis of 37: several blocks, small runs)."""
    if name in GRADIENTS:
        return GRADIENTS[name][1]
    k = FORWARD[name]
    rng = np.random.default_rng(0)
    sizes = {s: v for s, v in zip(k.ir.sizes, (37, 9, 6, 5, 4, 3))}
    return random_arguments(k, rng, sizes)


def copies(args: dict) -> dict:
    """``args`` with every numpy array copied (kernels may write in-out arrays)."""
    return {n: v.copy() if isinstance(v, np.ndarray) else v for n, v in args.items()}


def results(r) -> list:
    """A kernel call's results as a list of numpy arrays (scalars become 0-d arrays)."""
    if r is None:
        return []
    return [np.asarray(x) for x in (r if isinstance(r, tuple) else (r,))]


def assert_matches(actual, expected, what: str) -> None:
    """Same shape and dtype, equal to 1e-12 (float64) or 2e-5 (float32) of the largest
    finite magnitude."""
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, what
    rtol = 1e-12 if expected.dtype == np.float64 else 2e-5
    finite = np.abs(expected[np.isfinite(expected)]) if expected.dtype.kind == "f" else \
        np.abs(expected)
    scale = float(np.max(finite, initial=0.0))
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * max(scale, 1.0),
                               err_msg=what)


def assert_matches_reference(name: str, kernel) -> None:
    """``kernel`` (corpus entry ``name`` built for a CUDA target) gives the reference
    interpreter's results and leaves the in-out arrays as it does. (The OpenMP builds of
    the corpora are checked against it, JAX and finite differences by their own tests;
    the interpreter runs the 123 entries in about a second, where building them for
    OpenMP again took minutes of the suite.)"""
    args, reference = arguments(name), kernel_of(name)
    ref_args, other_args = copies(args), copies(args)
    expected = results(call_interpreted(reference, **ref_args))
    result = reference.ir.result
    if result is not None:  # returned as a Python number: in the kernel's own type
        expected[0] = expected[0].astype(result[1].np)
    actual = results(kernel(**other_args))
    assert len(actual) == len(expected)
    for k, (a, e) in enumerate(zip(actual, expected)):
        assert_matches(a, e, f"{name}: result {k}")
    for n, v in ref_args.items():
        if isinstance(v, np.ndarray):
            assert_matches(other_args[n], v, f"{name}: array {n}")


def assert_tv_gradient_over_many_blocks(target: str, shape: tuple, rng) -> None:
    """value_and_grad of the TV cost on ``target`` against OpenMP at ``shape`` (many blocks
    and a reduction over all of them)."""
    from tv_kernel import tv_cost
    g, b = rng.standard_normal(shape), rng.standard_normal(shape)
    grad = pa.value_and_grad(tv_cost, "g")
    value, dg = grad.package(pa.compile(grad, target=target)(g, b, 0.2))
    ref_value, ref_dg = grad(g, b, 0.2)
    np.testing.assert_allclose(value, ref_value, rtol=1e-11)
    assert_matches(dg, ref_dg, "d_g")
