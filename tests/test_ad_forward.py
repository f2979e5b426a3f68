"""Forward mode (``pa.jvp``, ``pa.grad(mode="forward")``) on the whole differentiable corpus.

For every kernel of the AD corpus (``test_ad_corpus.CASES``) and of the
forward-kernel corpus (every kernel of ``test_forward_kernels`` with a float
input), with a random tangent ``v`` of all differentiable inputs and a random
cotangent ``w`` of all float outputs, three numbers must agree:

* ``<w, J v>`` from the compiled jvp kernel,
* the central finite difference of ``t -> <w, k(x + t v)>`` (reference interpreter),
* ``<J^T w, v>`` from reverse mode (the dot-product identity): the compiled
  ``value_and_grad`` kernel the AD corpus test uses, or the vjp kernel run by the
  reference interpreter for kernels with output arrays.

The jvp's primal outputs must equal the primal kernel's.
"""

from __future__ import annotations

import warnings
import zlib

import numpy as np
import pytest

import polyad as pa
import test_ad_corpus as ad_corpus
import test_forward_kernels as fwd_corpus
from ad_helpers import assert_close, run, run_reference
from polyad.derivatives import NoGradientPathWarning
from tv_kernel import tv_cost

# ---------------------------------------------------------------------------
# the check
# ---------------------------------------------------------------------------


def _copy(v):
    return np.array(v, copy=True) if isinstance(v, np.ndarray) else v


def _tuple(x):
    return x if isinstance(x, tuple) else (x,)


def _float_outputs(k):
    """(kind, name) of every float output of ``k``, in the order jvp returns their tangents."""
    out = [("result", "result")] if k.result is not None and k.result[1].is_float else []
    out += [("out", p.name) for p in k.params if p.intent == "out" and p.type.dtype.is_float]
    return out


def _primal_outputs(kernel, args, sizes):
    """Every float output of ``kernel`` on ``args`` (interpreter): name -> value."""
    k = kernel.ir
    a = {n: _copy(v) for n, v in args.items()}
    raw = _tuple(run_reference(kernel, **a, **sizes))
    vals = {}
    if k.result is not None:
        vals["result"], raw = raw[0], raw[1:]
    for p, o in zip([p for p in k.params if p.intent == "out"], raw):
        vals[p.name] = o
    for p in k.params:
        if p.intent == "inout":
            vals[p.name] = a[p.name]
    return {n: v for n, v in vals.items()
            if n == "result" or (k.param(n).type.dtype.is_float)}


def _dot(a, b):
    return float(np.sum(np.asarray(a, dtype=np.float64) * np.asarray(b, dtype=np.float64)))


def check_jvp(kernel, args, sizes, wrt, rng, rtol=1e-6, eps=1e-6, dot_rtol=1e-9):
    """The three-way check above; returns the three numbers."""
    k = kernel.ir
    v = {n: (rng.standard_normal(np.shape(args[n])).astype(args[n].dtype) if k.param(n).is_array
             else float(rng.standard_normal())) for n in wrt}
    ref = _primal_outputs(kernel, args, sizes)
    w = {n: (rng.standard_normal(np.shape(o)).astype(o.dtype) if np.ndim(o)
             else float(rng.standard_normal())) for n, o in ref.items()}

    # forward mode, compiled
    a = {n: _copy(x) for n, x in args.items()}
    dots = {f"{n}_dot": _copy(v[n]) for n in wrt}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NoGradientPathWarning)
        jk = pa.jvp(kernel, wrt)
    outs, tans = run(jk, **a, **dots, **sizes)
    outs, tans = _tuple(outs), _tuple(tans)
    names = [n for kind, n in _float_outputs(k)]
    out_names = ([] if k.result is None else ["result"]) + [p.name for p in k.params
                                                             if p.intent == "out"]
    got = dict(zip(out_names, outs))
    for p in k.params:
        if p.intent == "inout":
            got[p.name] = a[p.name]
    for n, r in ref.items():
        tol = 1e-5 if np.asarray(r).dtype == np.float32 else 1e-10
        assert_close(got[n], r, tol, tol, what=f"{k.name}: primal output {n} of the jvp")
    tan = dict(zip(names, tans))
    inout_tan = [p.name for p in k.params if p.intent == "inout" and p.type.dtype.is_float]
    tan.update(dict(zip([n for n in inout_tan if n not in wrt], tans[len(names):])))
    for n in inout_tan:
        if n in wrt:
            tan[n] = dots[f"{n}_dot"]
    jv = sum(_dot(w[n], tan[n]) for n in w if n in tan)

    # central differences of <w, k(x + t v)>
    def f(t):
        moved = {n: (x + t * v[n] if n in v else _copy(x)) for n, x in args.items()}
        o = _primal_outputs(kernel, moved, sizes)
        return sum(_dot(w[n], o[n]) for n in w)
    fd = (f(eps) - f(-eps)) / (2 * eps)

    # reverse mode: <J^T w, v> (a scalar-only kernel: w * <grad, v>, through the same
    # value_and_grad kernel the AD corpus test compiles)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NoGradientPathWarning)
        if set(w) == {"result"}:
            _, g = run(pa.value_and_grad(kernel, list(wrt)),
                       **{n: _copy(x) for n, x in args.items()}, **sizes)
            g = [w["result"] * np.asarray(gn) for gn in g]
        else:
            bars = {f"{p.name}_bar": w.get(p.name, np.zeros(np.shape(ref.get(p.name, 0))))
                    for p in k.params if p.intent in ("out", "inout")}
            if k.result is not None:
                bars["result_bar"] = w.get("result", 0.0)
            # (interpreted: the vjp is the reference here, tested compiled elsewhere)
            g = _tuple(run_reference(pa.vjp(kernel, wrt),
                                     **{n: _copy(x) for n, x in args.items()}, **bars, **sizes))
    jtw = sum(_dot(gn, v[n]) for n, gn in zip(wrt, g))

    scale = max(abs(fd), abs(jv), abs(jtw), 1.0)
    assert abs(jv - fd) <= rtol * scale, f"{k.name}: <w, J v> = {jv!r}, finite differences {fd!r}"
    assert abs(jv - jtw) <= dot_rtol * scale, f"{k.name}: <w, J v> = {jv!r}, <J^T w, v> = {jtw!r}"
    return jv, fd, jtw


# ---------------------------------------------------------------------------
# the AD corpus
# ---------------------------------------------------------------------------


def _ad_params():
    out = []
    for n in sorted(ad_corpus.CASES):
        c = ad_corpus.CASES[n]
        out.append(pytest.param(n, marks=ad_corpus.compiler_issue(c["issue"])) if c["issue"]
                   else n)
    return out


@pytest.mark.parametrize("name", _ad_params())
def test_jvp_ad_corpus(name):
    c = ad_corpus.CASES[name]
    rng = np.random.default_rng(zlib.crc32(name.encode()) + 7)
    kernel, args = c["make"](rng)
    wrt = [c["wrt"]] if isinstance(c["wrt"], str) else list(c["wrt"])
    check_jvp(kernel, args, c["sizes"], wrt, rng, rtol=max(c["rtol"], 1e-6), eps=c["eps"])


# ---------------------------------------------------------------------------
# the forward-kernel corpus: every kernel with a float input, generic inputs
# ---------------------------------------------------------------------------

# sizes and integer arguments where the generic choice (every size 5, integers 3) does
# not fit the kernel
_FWD_SIZES = {"transform_2d": dict(K=3, L=2), "subsample_2d": dict(K=3, L=2)}
# kernels of intrinsics with restricted domains (log, sqrt, asin, atanh, ...): inputs in (0.1, 0.9)
_FWD_UNIT_INTERVAL = {"intrinsics64", "intrinsics32", "intrinsics_table"}


def _fwd_kernels():
    out = {}
    for name, obj in vars(fwd_corpus).items():
        if isinstance(obj, pa.Kernel) and obj.ir.name not in out:
            k = obj.ir
            wrt = [p.name for p in k.params if p.intent != "out"
                   and (p.type.dtype if p.is_array else p.type).is_float]
            outs = _float_outputs(k) + [p for p in k.params if p.intent == "inout"]
            if wrt and outs:
                out[k.name] = (obj, wrt)
    return out


FWD_KERNELS = _fwd_kernels()


def _fwd_args(kernel, rng):
    k = kernel.ir
    sizes = {s: 5 for s in k.sizes}
    sizes.update(_FWD_SIZES.get(k.name, {}))
    args = {}
    for p in k.params:
        if p.intent == "out":
            continue
        if p.is_array:
            shape = tuple(pa.ir.eval_integer(e, sizes) for e in p.type.shape)
            a = (rng.uniform(0.1, 0.9, shape) if k.name in _FWD_UNIT_INTERVAL
                 else rng.standard_normal(shape))
            args[p.name] = a.astype(p.type.dtype.np)
        elif p.type.is_float:
            args[p.name] = float(rng.uniform(0.5, 1.5))
        else:
            args[p.name] = 3
    # sizes no array extent determines are passed by keyword
    given = {s for p in k.params if p.is_array and p.intent != "out" for e in p.type.shape
             for s in [x.name for x in pa.ir.walk(e) if isinstance(x, pa.ir.SizeVar)]}
    return args, {s: v for s, v in sizes.items() if s not in given}


@pytest.mark.parametrize("name", sorted(FWD_KERNELS))
def test_jvp_forward_corpus(name):
    kernel, wrt = FWD_KERNELS[name]
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    args, sizes = _fwd_args(kernel, rng)
    is32 = any(isinstance(a, np.ndarray) and a.dtype == np.float32 for a in args.values())
    if is32:   # float32: finite differences with a larger step, float32 agreement
        check_jvp(kernel, args, sizes, wrt, rng, rtol=2e-3, eps=1e-2, dot_rtol=1e-4)
    else:
        check_jvp(kernel, args, sizes, wrt, rng)


# ---------------------------------------------------------------------------
# the API
# ---------------------------------------------------------------------------


def test_jvp_returns_outputs_and_tangents(rng):
    import test_forward_kernels as F
    x, xdot = rng.standard_normal((6, 7)), rng.standard_normal((6, 7))
    y, ydot = pa.jvp(F.blur, wrt="x")(x, xdot)
    assert_close(y, F.blur(x), 1e-12, 1e-12)
    assert_close(ydot, F.blur(xdot), 1e-12, 1e-12)   # blur is linear: J v = blur(v)


def test_jvp_scalar_kernel_value_and_tangent(rng):
    g, b = rng.standard_normal((5, 6)), rng.standard_normal((5, 6))
    c, cdot = pa.jvp(tv_cost, wrt=["g", "lam"])(g, b, 0.3, np.zeros((5, 6)), 1.0)
    assert c == pytest.approx(tv_cost(g, b, 0.3), rel=1e-12)
    assert isinstance(cdot, float)
    assert cdot == pytest.approx(pa.grad(tv_cost, "lam", mode="reverse")(g, b, 0.3), rel=1e-12)


def test_jvp_tangent_statements_stay_parallel():
    """The tangent of a parallel stencil loop is in the same parallel loop, with no atomics."""
    import test_forward_kernels as F
    src = pa.jvp(F.blur, wrt="x").source
    assert "#pragma omp parallel for" in src
    assert "atomic" not in src
    body = [ln for ln in src.splitlines() if "y_dot[" in ln and "=" in ln]
    assert body, src


@pytest.mark.parametrize("mode", ["forward", "reverse", None])
def test_grad_modes_agree(rng, mode):
    g, b = rng.standard_normal((5, 6)), rng.standard_normal((5, 6))
    d = pa.grad(tv_cost, wrt="lam", mode=mode)(g, b, 0.3)
    ref = pa.grad(tv_cost, wrt=["g", "lam"], mode="reverse")(g, b, 0.3)[1]
    assert isinstance(d, float)
    assert d == pytest.approx(ref, rel=1e-12)


def test_grad_default_mode_forward_for_scalars_reverse_for_arrays():
    assert pa.grad(tv_cost, "lam").kind == "grad_forward"
    assert pa.grad(tv_cost, "g").kind == "grad"
    assert pa.grad(tv_cost, ["g", "lam"]).kind == "grad"
    assert "grad_forward" in pa.grad(tv_cost, "lam").ir.name


def test_forward_grad_several_scalars(rng):
    k = ad_corpus.logreg
    X, y = rng.standard_normal((5, 3)), rng.choice([-1.0, 1.0], 5)
    w, b0 = rng.standard_normal(3), 0.2
    d = pa.grad(k, wrt=["b0"], mode="forward")(X, y, w, b0)
    ref = pa.grad(k, wrt=["w", "b0"], mode="reverse")(X, y, w, b0)[1]
    assert d[0] == pytest.approx(ref, rel=1e-12)


def test_forward_grad_of_array_is_an_error():
    with pytest.raises(pa.NotDifferentiableError, match="mode='reverse'"):
        pa.grad(tv_cost, "g", mode="forward")
    with pytest.raises(ValueError, match="mode must be"):
        pa.grad(tv_cost, "g", mode="sideways")


def test_jvp_is_an_ordinary_kernel():
    jk = pa.jvp(tv_cost, "g")
    assert isinstance(jk, pa.Kernel)
    assert "tangent of" in jk.explain()
    # differentiable again: the jvp of the jvp is the second directional derivative,
    # 2 <u, v> for the TV cost (|.|'' = 0)
    jj = pa.jvp(jk, "g")
    rng = np.random.default_rng(5)
    g, b, u, v = (rng.standard_normal((4, 5)) for _ in range(4))
    (c, cu), (cv, cuv) = run(jj, g, b, 0.3, u, v)
    assert c == pytest.approx(tv_cost(g, b, 0.3), rel=1e-12)
    assert cu[0] == pytest.approx(run(jk, g, b, 0.3, u)[1], rel=1e-12)
    assert cv == pytest.approx(run(jk, g, b, 0.3, v)[1], rel=1e-12)
    assert cuv[0] == pytest.approx(2 * np.sum(u * v), rel=1e-10)
