"""Linearity checks (``pa.is_linear`` / ``pa.is_affine``) and adjoints of linear kernels.

* a truth table of the conservative checks over kernels built to hit every rule
  (constants, products, intrinsics, guards, indices, device functions,
  temporaries, in-place updates, scalar parameters);
* ``pa.adjoint`` dot-product tests ``<A x, w> = <x, A^T w>`` for blurs,
  convolutions, strided downsampling and finite-difference gradient operators
  with every boundary mode (the primal through the reference interpreter, the
  adjoint compiled), and that their adjoints need no atomics;
* ``pa.NotLinearError`` naming the offending statement and its line.
"""

# (no ``from __future__ import annotations``: the operator factories below annotate kernel
# parameters with types chosen at run time, which the DSL reads from the live annotations)
import inspect

import numpy as np
import pytest

import polyad as pa
from ad_helpers import run, run_reference
from tv_kernel import tv_cost

N, M = pa.sizes("N M")
MODES = ["clamped", "circular", "mirror", "zero"]


# ---------------------------------------------------------------------------
# the truth table
# ---------------------------------------------------------------------------

@pa.func
def twice_minus(a: pa.f64, b: pa.f64) -> pa.f64:
    return 2.0 * a - b


@pa.func
def square(a: pa.f64) -> pa.f64:
    return a * a


@pa.func
def signed(a: pa.f64, c: pa.f64) -> pa.f64:
    if c > 0.0:
        return a
    return -a


@pa.kernel
def blur3(x: pa.f64[N].clamped, f: pa.f64[3], y: pa.Out(pa.f64[N])):
    for i in range(N):
        y[i] = f[0] * x[i - 1] + f[1] * x[i] + f[2] * x[i + 1]


@pa.kernel
def shift_plus_one(x: pa.f64[N], y: pa.Out(pa.f64[N])):
    for i in range(N):
        y[i] = x[i] + 1.0


@pa.kernel
def copy_f(x: pa.f64[N], f: pa.f64[N], y: pa.Out(pa.f64[N])):
    for i in range(N):
        y[i] = 2.0 * f[i]


@pa.kernel
def total(x: pa.f64[N]) -> pa.f64:
    s = 0.0
    for i in range(N):
        s += x[i]
    return s


@pa.kernel
def sum_squares(x: pa.f64[N]) -> pa.f64:
    s = 0.0
    for i in range(N):
        s += x[i] * x[i]
    return s


@pa.kernel
def dot(w: pa.f64[N], x: pa.f64[N]) -> pa.f64:
    s = 0.0
    for i in range(N):
        s += w[i] * x[i]
    return s


@pa.kernel
def relu(x: pa.f64[N], y: pa.Out(pa.f64[N])):
    for i in range(N):
        y[i] = max(x[i], 0.0)


@pa.kernel
def absolute(x: pa.f64[N], y: pa.Out(pa.f64[N])):
    for i in range(N):
        y[i] = abs(x[i])


@pa.kernel
def scale(x: pa.f64[N], lam: pa.f64, y: pa.Out(pa.f64[N])):
    for i in range(N):
        y[i] = lam * x[i] / 3.0


@pa.kernel
def guard_on_x(x: pa.f64[N], y: pa.Out(pa.f64[N])):
    for i in range(N):
        if x[i] > 0.0:
            y[i] = x[i]


@pa.kernel
def guard_on_f(x: pa.f64[N], f: pa.f64[N], y: pa.Out(pa.f64[N])):
    for i in range(N):
        if f[i] > 0.0:
            y[i] = x[i]


@pa.kernel
def select_on_f(x: pa.f64[N], f: pa.f64[N], y: pa.Out(pa.f64[N])):
    for i in range(N):
        y[i] = x[i] if f[i] > 0.0 else 0.0


@pa.kernel
def func_linear(x: pa.f64[N], f: pa.f64[N], y: pa.Out(pa.f64[N])):
    for i in range(N):
        y[i] = twice_minus(x[i], 3.0 * x[i]) + signed(x[i], f[i])


@pa.kernel
def func_square(x: pa.f64[N], y: pa.Out(pa.f64[N])):
    for i in range(N):
        y[i] = square(x[i])


@pa.kernel
def func_branch_on_x(x: pa.f64[N], f: pa.f64[N], y: pa.Out(pa.f64[N])):
    for i in range(N):
        y[i] = signed(f[i], x[i])


@pa.kernel
def blur_twice_temp(x: pa.f64[N].clamped, y: pa.Out(pa.f64[N])):
    t = pa.zeros(pa.f64[N].clamped)
    for i in range(N):
        t[i] = x[i - 1] + x[i + 1]
    for i in range(N):
        y[i] = t[i - 1] - 2.0 * t[i]


@pa.kernel
def square_temp(x: pa.f64[N], y: pa.Out(pa.f64[N])):
    t = pa.zeros(pa.f64[N])
    for i in range(N):
        t[i] = x[i] * 2.0
    for i in range(N):
        y[i] = t[i] * x[i]


@pa.kernel
def prefix_inplace(x: pa.f64[N]):
    for i in range(1, N):
        x[i] = x[i] + x[i - 1]


@pa.kernel
def divide(x: pa.f64[N], f: pa.f64[N], y: pa.Out(pa.f64[N]), z: pa.Out(pa.f64[N])):
    for i in range(N):
        y[i] = x[i] / f[i]
        z[i] = f[i] / x[i]


@pa.kernel
def remainder(x: pa.f64[N], y: pa.Out(pa.f64[N])):
    for i in range(N):
        y[i] = x[i] % 2.0


@pa.kernel
def affine_temp(x: pa.f64[N], y: pa.Out(pa.f64[N])):
    t = pa.zeros(pa.f64[N])
    for i in range(N):
        t[i] = x[i] + 1.0
    for i in range(N):
        y[i] = 2.0 * t[i]


@pa.kernel
def reused_scalar(x: pa.f64[N], y: pa.Out(pa.f64[N])):
    for i in range(N):
        s = x[i] + 1.0
        s = x[i]
        y[i] = s


@pa.kernel
def through_int(x: pa.f64[N], y: pa.Out(pa.f64[N])):
    for i in range(N):
        y[i] = float(int(x[i]))


@pa.kernel
def product_accumulator(x: pa.f64[N]) -> pa.f64:
    p = 1.0
    for i in range(N):
        p *= x[i]
    return p


@pa.kernel
def scaled_recurrence(x: pa.f64[N]) -> pa.f64:
    s = 0.0
    for i in range(N):
        s = 0.5 * s + x[i]
    return s


#: (kernel, wrt, is_linear, is_affine)
TRUTH = [
    (blur3, "x", True, True),
    (blur3, "f", True, True),                 # bilinear: linear in each factor alone
    (blur3, ["x", "f"], False, False),
    (shift_plus_one, "x", False, True),
    (copy_f, "x", False, True),               # output independent of x: affine, not linear
    (total, "x", True, True),
    (sum_squares, "x", False, False),
    (dot, "x", True, True),
    (dot, ["w", "x"], False, False),
    (relu, "x", False, False),
    (absolute, "x", False, False),
    (scale, "lam", True, True),
    (scale, "x", True, True),
    (guard_on_x, "x", False, False),
    (guard_on_f, "x", True, True),
    (select_on_f, "x", True, True),
    (func_linear, "x", True, True),
    (func_square, "x", False, False),
    (func_branch_on_x, "x", False, False),
    (blur_twice_temp, "x", True, True),
    (square_temp, "x", False, False),
    (prefix_inplace, "x", True, True),
    (divide, "x", False, False),              # z = f / x
    (remainder, "x", False, False),
    (affine_temp, "x", False, True),
    (reused_scalar, "x", False, True),        # conservative: linear, answered "affine"
    (through_int, "x", False, False),
    (product_accumulator, "x", False, False),
    (scaled_recurrence, "x", True, True),
    (tv_cost, "g", False, False),
]


@pytest.mark.parametrize("kernel,wrt,linear,affine", TRUTH,
                         ids=[f"{k.ir.name}-{w if isinstance(w, str) else '+'.join(w)}"
                              for k, w, _, _ in TRUTH])
def test_truth_table(kernel, wrt, linear, affine):
    assert pa.is_linear(kernel, wrt) is linear
    assert pa.is_affine(kernel, wrt) is affine


def test_truth_table_size():
    assert len({k.ir.name for k, *_ in TRUTH}) >= 20


def _random_in(kernel, wrt, rng):
    k = kernel.ir
    args = {}
    for p in k.params:
        if p.intent == "out":
            continue
        if p.is_array:
            shape = tuple(pa.ir.eval_integer(e, {"N": 7}) for e in p.type.shape)
            args[p.name] = rng.uniform(0.5, 1.5, shape)
        else:
            args[p.name] = 0.7
    return args


@pytest.mark.parametrize("kernel,wrt", [(k, w) for k, w, lin, _ in TRUTH if lin
                                        and k.ir.name != "tv_cost"],
                         ids=lambda x: x.ir.name if hasattr(x, "ir") else str(x))
def test_linear_answers_hold_numerically(kernel, wrt, rng):
    """Every kernel answered linear satisfies k(a x + b z) = a k(x) + b k(z) (interpreter)."""
    names = [wrt] if isinstance(wrt, str) else wrt
    base = _random_in(kernel, wrt, rng)

    def outputs(vals):
        r = run_reference(kernel, **{n: (v.copy() if isinstance(v, np.ndarray) else v)
                                     for n, v in vals.items()})
        r = r if isinstance(r, tuple) else (r,)
        inout = [vals[p.name] for p in kernel.ir.params if p.intent == "inout"]
        if inout:   # in-place kernels: run again on a copy we keep
            keep = {n: (v.copy() if isinstance(v, np.ndarray) else v) for n, v in vals.items()}
            run_reference(kernel, **keep)
            r = tuple(keep[p.name] for p in kernel.ir.params if p.intent == "inout")
        return [np.asarray(o, dtype=float) for o in r if o is not None]

    x = {n: base[n] for n in names}
    z = {n: (rng.standard_normal(np.shape(base[n])) if isinstance(base[n], np.ndarray)
             else 1.9) for n in names}
    a, b = 0.7, -1.3
    combo = {**base, **{n: a * x[n] + b * z[n] for n in names}}
    lhs = outputs(combo)
    ox, oz = outputs({**base, **x}), outputs({**base, **z})
    for l_, p, q in zip(lhs, ox, oz):
        np.testing.assert_allclose(l_, a * p + b * q, rtol=1e-10, atol=1e-10)


# ---------------------------------------------------------------------------
# adjoints: dot-product tests with every boundary mode
# ---------------------------------------------------------------------------

def _blur(mode):
    X = getattr(pa.f64[N], mode)

    @pa.kernel
    def blur(x: X, f: pa.f64[5], y: pa.Out(pa.f64[N])):
        for i in range(N):
            y[i] = (f[0] * x[i - 2] + f[1] * x[i - 1] + f[2] * x[i] + f[3] * x[i + 1]
                    + f[4] * x[i + 2])
    return blur


def _conv2d(mode):
    X = getattr(pa.f64[M, N], mode)

    @pa.kernel
    def conv(x: X, w: pa.f64[3, 3], y: pa.Out(pa.f64[M, N])):
        for m in range(M):
            for n in range(N):
                s = 0.0
                for a in range(3):
                    for b in range(3):
                        s += w[a, b] * x[m + a - 1, n + b - 1]
                y[m, n] = s
    return conv


def _downsample(mode):
    X = getattr(pa.f64[2 * N], mode)

    @pa.kernel
    def down(x: X, y: pa.Out(pa.f64[N])):
        for k in range(N):
            y[k] = 0.25 * x[2 * k - 1] + 0.5 * x[2 * k] + 0.25 * x[2 * k + 1]
    return down


def _gradient(mode):
    X = getattr(pa.f64[M, N], mode)

    @pa.kernel
    def grad2d(x: X, gx: pa.Out(pa.f64[M, N]), gy: pa.Out(pa.f64[M, N])):
        for m in range(M):
            for n in range(N):
                gx[m, n] = x[m, n + 1] - x[m, n]
                gy[m, n] = x[m + 1, n] - x[m, n]
    return grad2d


OPERATORS = {"blur5": _blur, "conv3x3": _conv2d, "downsample2": _downsample,
             "gradient2d": _gradient}


def _operator_args(name, rng):
    if name == "blur5":
        return dict(x=rng.standard_normal(9), f=rng.standard_normal(5)), {}
    if name == "conv3x3":
        return dict(x=rng.standard_normal((5, 6)), w=rng.standard_normal((3, 3))), {}
    if name == "downsample2":
        return dict(x=rng.standard_normal(10)), {}
    return dict(x=rng.standard_normal((5, 6))), {}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(OPERATORS))
def test_adjoint_dot_product(name, mode, rng):
    kernel = OPERATORS[name](mode)
    assert pa.is_linear(kernel, "x")
    args, sizes = _operator_args(name, rng)
    ax = run_reference(kernel, **args, **sizes)
    ax = ax if isinstance(ax, tuple) else (ax,)
    ws = [rng.standard_normal(o.shape) for o in ax]
    adj = pa.adjoint(kernel, "x")
    coeffs = {n: v for n, v in args.items() if n != "x"}
    outs = [p.name for p in kernel.ir.params if p.intent == "out"]
    xt = run(adj, **coeffs, **{f"{o}_bar": w for o, w in zip(outs, ws)}, **sizes)
    assert xt.shape == args["x"].shape
    lhs = sum(float(np.sum(o * w)) for o, w in zip(ax, ws))
    rhs = float(np.sum(args["x"] * xt))
    assert lhs == pytest.approx(rhs, rel=1e-12, abs=1e-12)
    assert [p.name for p in adj.ir.params if p.intent != "out"] == \
        list(coeffs) + [f"{o}_bar" for o in outs]
    assert "atomic" not in adj.source


def test_adjoint_of_scalar_result_and_of_inplace_kernel(rng):
    w = rng.standard_normal(6)
    xt = pa.adjoint(dot, "x")(w, 2.0)
    np.testing.assert_allclose(xt, 2.0 * w, rtol=1e-14)
    # in-place prefix sum: A^T is the suffix sum
    ybar = rng.standard_normal(6)
    xt = run(pa.adjoint(prefix_inplace, "x"), ybar)
    np.testing.assert_allclose(xt, np.cumsum(ybar[::-1])[::-1], rtol=1e-12)


def test_adjoint_is_an_ordinary_kernel():
    adj = pa.adjoint(blur3, "x")
    assert isinstance(adj, pa.Kernel)
    assert "adjoint" in adj.ir.name
    assert adj.explain()
    assert pa.is_linear(adj, "y_bar")        # the transpose is linear in its cotangent
    back = pa.adjoint(adj, "y_bar")           # and its transpose is the kernel again
    rng = np.random.default_rng(1)
    x, f = rng.standard_normal(7), rng.standard_normal(3)
    np.testing.assert_allclose(run(back, f, x), run(blur3, x, f), rtol=1e-12)


@pytest.mark.parametrize("kernel,wrt,line_text", [
    (tv_cost, "g", "(g[m, n] - b[m, n]) ** 2"),
    (shift_plus_one, "x", "x[i] + 1.0"),
    (guard_on_x, "x", "y[i] = x[i]"),
    (square_temp, "x", "t[i] * x[i]"),
])
def test_not_linear_error_names_statement(kernel, wrt, line_text):
    with pytest.raises(pa.NotLinearError) as exc:
        pa.adjoint(kernel, wrt)
    err = exc.value
    assert isinstance(err, pa.PolyadError)
    assert line_text in str(err)
    src, first = inspect.getsourcelines(kernel.__wrapped__)
    assert line_text in src[err.line - first]
    assert "linear" in err.hint

