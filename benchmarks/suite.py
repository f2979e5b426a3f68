"""Benchmark cases: inputs, minimal memory traffic, and every implementation's (fwd, grad).

A *case* is one benchmark (a cost and the parameter its gradient is taken
with respect to) at one size and dtype.  :func:`implementations` returns,
for a case, the contenders as ``Impl(name, fwd, grad)`` where ``fwd`` /
``grad`` are zero-argument callables, or a string saying why that
contender has no such entry (``"n/a (AD not available)"``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Union

import numpy as np

import baselines
import frameworks
import kernels
import reference

NP = {"f32": np.float32, "f64": np.float64}

# name -> (title, polyad kernel, wrt parameters, their indices in the inputs)
BENCHES = {
    "tv": ("TV denoising cost, grad wrt image g", "tv_cost", ("g",), (0,)),
    "deconv": ("deconvolution (separable clamped 5-tap blur), grad wrt image x and filter f",
               "deconv_cost", ("x", "f"), (0, 1)),
    "conv": ("conv layer NCHW 3x3 + ReLU + squared error, grad wrt weights w and input x",
             "conv_cost", ("w", "x"), (1, 0)),
    "stencil3d": ("3-D 7-point stencil cost (clamped), grad wrt x", "stencil3d_cost",
                  ("x",), (0,)),
    # the same gradients one parameter at a time (--bench all / --bench deconv_x ...)
    "deconv_x": ("deconvolution, grad wrt image x only", "deconv_cost", ("x",), (0,)),
    "deconv_f": ("deconvolution, grad wrt filter f only", "deconv_cost", ("f",), (1,)),
    "conv_w": ("conv layer, grad wrt weights w only", "conv_cost", ("w",), (1,)),
    "conv_x": ("conv layer, grad wrt input x only", "conv_cost", ("x",), (0,)),
}
DEFAULT_BENCHES = ("tv", "deconv", "conv", "stencil3d")

# conv layer shape for a nominal size S: B images of (S/4)x(S/4), CI -> CO channels
CONV_B, CONV_CI, CONV_CO = 4, 4, 8


def conv_hw(size: int) -> int:
    return max(1, size // 4)


def cube_edge(size: int) -> int:
    """Edge of the 3-D grid with about size*size points."""
    return max(1, round(size ** (2.0 / 3.0)))


class Timer:
    """Median of interleaved repeats: round r times every callable once, in turn, so
    that the machine's background noise hits all contenders alike."""

    def __init__(self, repeats: int, budget_s: float, min_repeats: int = 3, stat: str = "median"):
        self.repeats = repeats
        self.budget_s = budget_s
        self.min_repeats = min_repeats
        self.stat = {"median": np.median, "min": np.min}[stat]

    def run(self, calls: dict) -> dict:
        samples = {k: [] for k in calls}
        spent = {k: 0.0 for k in calls}
        for _ in range(self.repeats):
            for k, fn in calls.items():
                if len(samples[k]) >= self.min_repeats and spent[k] > self.budget_s:
                    continue
                t = time.perf_counter()
                fn()
                dt = time.perf_counter() - t
                samples[k].append(dt)
                spent[k] += dt
        return {k: (float(self.stat(v)), len(v)) for k, v in samples.items()}


@dataclass
class Case:
    bench: str
    size: int
    dtype: str
    inputs: tuple
    shape: str
    fwd_bytes: int
    grad_bytes: int
    # multiply-adds, counted where they outweigh the traffic (the conv layer; else 0):
    # two operations each; the gradient's are the forward's again (its recompute) and one
    # contraction of the same size per argument (d_w, d_x)
    fwd_flops: int = 0
    grad_flops: int = 0

    @property
    def title(self) -> str:
        return BENCHES[self.bench][0]

    @property
    def kernel(self) -> str:
        return BENCHES[self.bench][1]

    @property
    def wrt(self) -> tuple:
        return BENCHES[self.bench][2]

    @property
    def wrt_index(self) -> tuple:
        return BENCHES[self.bench][3]

    @property
    def wrt_arg(self):
        """``wrt`` as pa.grad takes it: a name, or a list of names."""
        return self.wrt[0] if len(self.wrt) == 1 else list(self.wrt)


def make_inputs(bench: str, shape_arg, dtype: str, rng: np.random.Generator) -> tuple:
    """Random inputs in kernel parameter order.  ``shape_arg``: the case's array shape."""
    t = NP[dtype]
    if bench == "tv":
        # distinct pixel values (k / S for a permutation k of 0..S-1, exact or at least
        # distinct in float32 up to S = 2**24): no exact ties between neighbours, so no
        # |0| whose derivative conventions differ (JAX takes d|x|/dx = 1 at 0, polyad,
        # the baselines and PyTorch 0)
        S = int(np.prod(shape_arg))
        g = (rng.permutation(S).reshape(shape_arg) / max(S, 1)).astype(t)
        b = (g + 0.1 * rng.standard_normal(shape_arg)).astype(t)
        return g, b, 0.1
    if bench.startswith("deconv"):
        x = rng.random(shape_arg).astype(t)
        f = rng.random(5) + 0.2
        f = (f / f.sum()).astype(t)  # asymmetric, so a wrong flip in the adjoint shows
        y = rng.random(shape_arg).astype(t)
        return x, f, y
    if bench.startswith("conv"):
        B, CI, CO, H, W = shape_arg
        x = rng.standard_normal((B, CI, H, W)).astype(t)
        w = (rng.standard_normal((CO, CI, 3, 3)) / np.sqrt(9 * CI)).astype(t)
        y = (0.5 * rng.random((B, CO, H, W))).astype(t)
        return x, w, y
    if bench == "stencil3d":
        x = rng.random(shape_arg).astype(t)
        y = (0.1 * rng.standard_normal(shape_arg)).astype(t)
        return x, y
    raise KeyError(bench)


def case_shape(bench: str, size: int):
    if bench.startswith("conv"):
        return (CONV_B, CONV_CI, CONV_CO, conv_hw(size), conv_hw(size))
    if bench == "stencil3d":
        n = cube_edge(size)
        return (n, n, n)
    return (size, size)


def shape_str(bench: str, shape) -> str:
    if bench.startswith("conv"):
        B, CI, CO, H, W = shape
        return f"B={B} {CI}->{CO}ch {H}x{W}"
    return "x".join(map(str, shape))


def make_case(bench: str, size: int, dtype: str, seed: int = 0) -> Case:
    shape = case_shape(bench, size)
    inputs = make_inputs(bench, shape, dtype, np.random.default_rng(seed))
    E = np.dtype(NP[dtype]).itemsize
    wrt = BENCHES[bench][2]
    fwd_flops = grad_flops = 0
    if bench.startswith("conv"):
        x, w, y = inputs
        fwd = (x.size + y.size) * E
        grad = fwd + (x.size * E if "x" in wrt else 0)
        fwd_flops = 2 * y.size * w[0].size
        grad_flops = fwd_flops * (1 + len(wrt))
    else:
        S = inputs[0].size
        fwd = 2 * S * E
        grad = 2 * S * E if wrt == ("f",) else 3 * S * E
    return Case(bench, size, dtype, inputs, shape_str(bench, shape), fwd, grad, fwd_flops,
                grad_flops)


# ---------------------------------------------------------------------------
# contenders
# ---------------------------------------------------------------------------

Entry = Union[Callable[[], object], str]


@dataclass
class Impl:
    name: str
    fwd: Entry
    grad: Entry
    block: Optional[Callable] = None
    notes: list = field(default_factory=list)


def handwritten(bench: str, inputs: tuple):
    """(fwd, grad) of the hand-written C baseline; grad() returns a tuple in wrt order."""
    wrt = "".join(BENCHES[bench][2])
    maker = {"tv": baselines.make_tv, "deconv": baselines.make_deconv,
             "conv": baselines.make_conv, "stencil3d": baselines.make_stencil3d}
    return maker[bench.split("_")[0]](*inputs, wrt=wrt)


def numpy_impl(bench: str, inputs: tuple):
    """(fwd, grad-or-reason) in numpy; a numpy gradient only for TV (hand-derived)."""
    if bench == "tv":
        return (lambda: reference.tv_forward_fast(*inputs),
                lambda: (reference.tv_gradient_fast(*inputs),))
    if bench.startswith("deconv"):
        return lambda: reference.deconv_forward_fast(*inputs), "-"
    if bench.startswith("conv"):
        return lambda: reference.conv_forward(*inputs), "-"
    return lambda: reference.stencil3d_forward_fast(*inputs), "-"


def polyad_grad_available():
    import polyad as pa
    return callable(getattr(pa, "grad", None))


_polyad_grads: dict = {}


def polyad_impl(case: Case):
    """(fwd, grad) through polyad's public API: ``k(*inputs)``, ``pa.grad(k, wrt=...)(*inputs)``."""
    import polyad as pa
    k = kernels.kernel(case.kernel, case.dtype)
    inputs = case.inputs

    def fwd():
        return k(*inputs)
    if not polyad_grad_available():
        return fwd, "n/a (AD not available)"
    key = (case.kernel, case.dtype, case.wrt)
    try:
        if key not in _polyad_grads:
            _polyad_grads[key] = pa.grad(k, wrt=case.wrt_arg)
        gk = _polyad_grads[key]
    except Exception as exc:  # AD refuses the kernel: report, don't abort the suite
        return fwd, f"n/a ({type(exc).__name__}: {str(exc).splitlines()[0][:50]})"

    def grad():
        out = gk(*inputs)
        return out if isinstance(out, tuple) else (out,)
    return fwd, grad


def polyad_unfused_impl(case: Case):
    """(fwd, grad) compiled with ``fuse=False`` (no producer-consumer fusion through row
    buffers, ``polyad.schedule.fusion``; the default fuses chains with rows of one
    dimension), the gradient's outputs preallocated (the derived kernel's pa.Out
    parameters, as the polyad row passes them)."""
    import polyad as pa
    k = kernels.kernel(case.kernel, case.dtype)
    fk = pa.compile(k, fuse=False)
    gk = pa.compile(pa.grad(k, wrt=case.wrt_arg), fuse=False)
    inputs = case.inputs
    outs = {f"d_{w}": np.empty_like(inputs[i]) for w, i in zip(case.wrt, case.wrt_index)}

    def grad():
        out = gk(*inputs, **outs)
        return out if isinstance(out, tuple) else (out,)
    return (lambda: fk(*inputs)), grad


# The hand-written rows; ratios (/hw) are taken to the fastest of them in the same run.
HAND_WRITTEN = ("hand-written C", "hand C line-buf")


def implementations(case: Case, with_jax: bool = True, with_torch: bool = True,
                    with_torch_compile: bool = True) -> list[Impl]:
    out = []
    f, g = handwritten(case.bench, case.inputs)
    out.append(Impl(HAND_WRITTEN[0], f, g))
    if case.bench.startswith("deconv"):
        # the line-buffered gradient (no full-size temporaries); its forward is the same code
        _, g = baselines.make_deconv_line_buffered(*case.inputs, wrt="".join(case.wrt))
        out.append(Impl(HAND_WRITTEN[1], "-", g))
    f, g = polyad_impl(case)
    out.append(Impl("polyad", f, g))
    if case.bench.startswith("deconv"):
        f, g = polyad_unfused_impl(case)
        out.append(Impl("polyad fuse=False", f, g))
    f, g = numpy_impl(case.bench, case.inputs)
    out.append(Impl("numpy", f, g))
    if with_jax:
        ok, why = frameworks.jax_available(x64=True)
        if ok:
            f, g = frameworks.make_jax(case.kernel, case.inputs, case.wrt_index)
            out.append(Impl("jax jit(grad)", f, g))
        else:
            out.append(Impl("jax jit(grad)", f"n/a ({why})", f"n/a ({why})"))
    if with_torch:
        ok, why = frameworks.torch_available()
        if ok:
            f, g = frameworks.make_torch(case.kernel, case.inputs, case.wrt_index)
            out.append(Impl("torch autograd", f, g))
        else:
            out.append(Impl("torch autograd", f"n/a ({why})", f"n/a ({why})"))
        if ok and with_torch_compile:
            # torch.compile (inductor): the optimizing compiler polyad must match; its
            # compile time is in the first calls ("1st s")
            f, g = frameworks.make_torch_compile(case.kernel, case.inputs, case.wrt_index)
            out.append(Impl("torch.compile", f, g))
    return out


def reference_results(case: Case):
    """(cost, gradients) in float64 from the hand-written C on float64 copies of the inputs.

    The baselines are themselves checked against numpy + finite differences
    (run.py --check) at the start of every run.
    """
    up = tuple(a.astype(np.float64) if isinstance(a, np.ndarray) else a for a in case.inputs)
    f, g = handwritten(case.bench, up)
    return f(), tuple(a.copy() for a in g())
