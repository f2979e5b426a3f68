"""Reverse-mode AD on a corpus of differentiable kernels.

Every gradient is checked against central finite differences in float64
(``ad_helpers.fd_grad``, element by element, or along random directions for
the larger cases) and, where JAX is installed, against ``jax.grad`` of a
``jax.numpy`` transcription written next to the kernel.

Kernels run through ``ad_helpers.run`` (compiled when the compiled call path
exists, the reference interpreter otherwise). Sizes are tiny: the interpreter
is slow.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

import polyad as pa
from ad_helpers import (assert_close, compiler_issue, fd_grad, grad, run, run_reference,
                        scalar_fn, value_and_grad)
from tv_kernel import tv_cost

M, N = pa.sizes("M N")
K, L = pa.sizes("K L")
B, D, H = pa.sizes("B D H")
NB, CI, CO, HH, WW = pa.sizes("NB CI CO HH WW")
P, = pa.sizes("P")


# ===========================================================================
# the corpus
# ===========================================================================

CASES = {}


def case(name, wrt, sizes=None, jax=None, directional=False, rtol=1e-6, atol=1e-7, eps=1e-6,
         compiler_issue=None):
    """Register ``make(rng) -> (kernel, args)`` as a corpus case."""
    def deco(make):
        CASES[name] = dict(make=make, wrt=wrt, sizes=sizes or {}, jax=jax,
                           directional=directional, rtol=rtol, atol=atol, eps=eps,
                           issue=compiler_issue)
        return make
    return deco


def _pad(x, p, mode):
    import jax.numpy as jnp
    return jnp.pad(x, p, mode={"clamped": "edge", "circular": "wrap", "mirror": "reflect",
                               "zero": "constant"}[mode])


# ---- 1. TV cost (clamped), DESIGN §1 ----------------------------------------

def jax_tv(g, b, lam):
    import jax.numpy as jnp
    gp = _pad(g, 1, "clamped")
    return (jnp.sum((g - b) ** 2) + lam * jnp.sum(jnp.abs(gp[1:-1, :-2] - g))
            + lam * jnp.sum(jnp.abs(gp[:-2, 1:-1] - g)))


@case("tv_cost", ["g", "lam"], jax=jax_tv)
def _(rng):
    return tv_cost, dict(g=rng.standard_normal((4, 5)), b=rng.standard_normal((4, 5)), lam=0.3)


# ---- 2. smoothed TV with a sigmoid weight temporary --------------------------

@pa.func
def sigmoid(z: pa.f64) -> pa.f64:
    return 1.0 / (1.0 + pa.exp(-z))


@pa.kernel
def tv_smooth(g: pa.f64[M, N].clamped, b: pa.f64[M, N], lam: pa.f64) -> pa.f64:
    C = 0.0
    for m in range(M):
        for n in range(N):
            dx = g[m, n] - g[m, n - 1]
            dy = g[m, n] - g[m - 1, n]
            w = sigmoid(4.0 * (dx * dx + dy * dy))
            C += (g[m, n] - b[m, n]) ** 2 + lam * w * pa.sqrt(dx * dx + dy * dy + 0.01)
    return C


def jax_tv_smooth(g, b, lam):
    import jax.numpy as jnp
    gp = _pad(g, 1, "clamped")
    dx = g - gp[1:-1, :-2]
    dy = g - gp[:-2, 1:-1]
    w = 1.0 / (1.0 + jnp.exp(-4.0 * (dx * dx + dy * dy)))
    return jnp.sum((g - b) ** 2 + lam * w * jnp.sqrt(dx * dx + dy * dy + 0.01))


@case("tv_smooth_sigmoid", ["g", "lam"], jax=jax_tv_smooth)
def _(rng):
    return tv_smooth, dict(g=rng.standard_normal((4, 5)), b=rng.standard_normal((4, 5)),
                           lam=0.7)


# ---- 3. deconvolution: separable 5-tap blur + data fidelity -----------------

@pa.kernel
def deconv_cost(x: pa.f64[M, N].clamped, y: pa.f64[M, N], f: pa.f64[5]) -> pa.f64:
    t = pa.zeros(pa.f64[M, N].clamped)
    for m in range(M):
        for n in range(N):
            s = 0.0
            for k in range(5):
                s += f[k] * x[m, n + k - 2]
            t[m, n] = s
    C = 0.0
    for m in range(M):
        for n in range(N):
            u = 0.0
            for k in range(5):
                u += f[k] * t[m + k - 2, n]
            C += (u - y[m, n]) ** 2
    return C


def jax_deconv(x, y, f):
    import jax.numpy as jnp
    m, n = x.shape
    xp = _pad(x, ((0, 0), (2, 2)), "clamped")
    t = sum(f[k] * xp[:, k:k + n] for k in range(5))
    tp = _pad(t, ((2, 2), (0, 0)), "clamped")
    u = sum(f[k] * tp[k:k + m, :] for k in range(5))
    return jnp.sum((u - y) ** 2)


@case("deconv_wrt_image_and_filter", ["x", "f"], jax=jax_deconv)
def _(rng):
    return deconv_cost, dict(x=rng.standard_normal((4, 5)), y=rng.standard_normal((4, 5)),
                             f=rng.standard_normal(5))


# ---- 4. product of a vector (tape) -------------------------------------------

@pa.kernel
def prod_vec(x: pa.f64[N]) -> pa.f64:
    p = 1.0
    for i in range(N):
        p = p * x[i]
    return p


def jax_prod(x):
    import jax.numpy as jnp
    return jnp.prod(x)


@case("prod_vector", "x", jax=jax_prod)
def _(rng):
    return prod_vec, dict(x=rng.uniform(0.5, 1.5, 6) * rng.choice([-1, 1], 6))


# ---- 5. pow by a loop --------------------------------------------------------

@pa.kernel
def pow_loop(x: pa.f64, n: pa.i32) -> pa.f64:
    r = 1.0
    for k in range(n):
        r = r * x
    return r


@case("pow_by_loop", "x", jax=lambda x, n: x ** n)
def _(rng):
    return pow_loop, dict(x=1.3, n=5)


@pa.kernel
def pow_loop_vec(x: pa.f64[N]) -> pa.f64:
    C = 0.0
    for i in range(N):
        r = 1.0
        for k in range(P):
            r = r * x[i]
        C += r
    return C


@case("pow_by_loop_per_element", "x", sizes=dict(P=3), jax=lambda x: (x ** 3).sum())
def _(rng):
    return pow_loop_vec, dict(x=rng.standard_normal(5))


# ---- 6. log-sum-exp ------------------------------------------------------------

@pa.kernel
def logsumexp(x: pa.f64[N]) -> pa.f64:
    m = x[0]
    for i in range(1, N):
        m = max(m, x[i])
    s = 0.0
    for i in range(N):
        s += pa.exp(x[i] - m)
    return m + pa.log(s)


def jax_lse(x):
    import jax.scipy.special as jss
    return jss.logsumexp(x)


@case("logsumexp", "x", jax=jax_lse)
def _(rng):
    return logsumexp, dict(x=rng.standard_normal(6))


@pa.kernel
def logsumexp_rows(x: pa.f64[M, N].clamped) -> pa.f64:
    C = 0.0
    for i in range(M):
        m = x[i, 0]
        for j in range(1, N):
            m = max(m, x[i, j])
        s = 0.0
        for j in range(N):
            s += pa.exp(x[i, j] - m)
        C += m + pa.log(s)
    return C


def jax_lse_rows(x):
    import jax.scipy.special as jss
    return jss.logsumexp(x, axis=1).sum()


@case("logsumexp_rows_loop_local", "x", jax=jax_lse_rows)
def _(rng):
    return logsumexp_rows, dict(x=rng.standard_normal((3, 5)))


# ---- 7. logistic regression ------------------------------------------------------

@pa.kernel
def logreg(X: pa.f64[B, D], y: pa.f64[B], w: pa.f64[D], b0: pa.f64) -> pa.f64:
    loss = 0.0
    for i in range(B):
        z = b0
        for j in range(D):
            z += X[i, j] * w[j]
        loss += pa.log(1.0 + pa.exp(-y[i] * z))
    return loss / B


def jax_logreg(X, y, w, b0):
    import jax.numpy as jnp
    return jnp.mean(jnp.log(1.0 + jnp.exp(-y * (X @ w + b0))))


@case("logistic_regression", ["w", "b0"], jax=jax_logreg)
def _(rng):
    return logreg, dict(X=rng.standard_normal((5, 3)), y=rng.choice([-1.0, 1.0], 5),
                        w=rng.standard_normal(3), b0=0.2)


# ---- 8. two-layer MLP --------------------------------------------------------------

@pa.kernel
def mlp_loss(X: pa.f64[B, D], T: pa.f64[B], W1: pa.f64[H, D], b1: pa.f64[H], W2: pa.f64[H],
             b2: pa.f64) -> pa.f64:
    h = pa.zeros(pa.f64[B, H])
    for i in range(B):
        for j in range(H):
            s = b1[j]
            for k in range(D):
                s += W1[j, k] * X[i, k]
            h[i, j] = pa.tanh(s)
    loss = 0.0
    for i in range(B):
        o = b2
        for j in range(H):
            o += W2[j] * h[i, j]
        loss += 0.5 * (o - T[i]) ** 2
    return loss


def jax_mlp(X, T, W1, b1, W2, b2):
    import jax.numpy as jnp
    h = jnp.tanh(X @ W1.T + b1)
    return 0.5 * jnp.sum((h @ W2 + b2 - T) ** 2)


@case("mlp_2layer", ["W1", "b1", "W2", "b2", "X"], jax=jax_mlp)
def _(rng):
    return mlp_loss, dict(X=rng.standard_normal((3, 4)), T=rng.standard_normal(3),
                          W1=rng.standard_normal((3, 4)) * 0.5, b1=rng.standard_normal(3),
                          W2=rng.standard_normal(3), b2=0.1)


# ---- 9. conv2d layer NCHW + ReLU + MSE -------------------------------------------------

@pa.kernel
def conv_relu_mse(inp: pa.f64[NB, CI, HH, WW].zero, w: pa.f64[CO, CI, 3, 3], bias: pa.f64[CO],
                  target: pa.f64[NB, CO, HH, WW]) -> pa.f64:
    loss = 0.0
    for b in range(NB):
        for co in range(CO):
            for y in range(HH):
                for x in range(WW):
                    s = bias[co]
                    for ci in range(CI):
                        for ky in range(3):
                            for kx in range(3):
                                s += w[co, ci, ky, kx] * inp[b, ci, y + ky - 1, x + kx - 1]
                    a = max(s, 0.0)
                    loss += (a - target[b, co, y, x]) ** 2
    return loss / (NB * CO * HH * WW)


def jax_conv(inp, w, bias, target):
    import jax
    import jax.numpy as jnp
    out = jax.lax.conv_general_dilated(inp, w, (1, 1), ((1, 1), (1, 1)),
                                       dimension_numbers=("NCHW", "OIHW", "NCHW"))
    a = jnp.maximum(out + bias[None, :, None, None], 0.0)
    return jnp.mean((a - target) ** 2)


@case("conv2d_nchw_relu_mse", ["w", "bias", "inp"], jax=jax_conv, directional=True)
def _(rng):
    return conv_relu_mse, dict(inp=rng.standard_normal((2, 2, 4, 4)),
                               w=rng.standard_normal((2, 2, 3, 3)) * 0.5,
                               bias=rng.standard_normal(2) * 0.1,
                               target=rng.standard_normal((2, 2, 4, 4)))


# ---- 10. boundary modes: mirror / circular / zero stencils --------------------------------

@pa.kernel
def mirror_laplace(x: pa.f64[M, N].mirror) -> pa.f64:
    C = 0.0
    for m in range(M):
        for n in range(N):
            C += (x[m - 1, n] + x[m + 1, n] + x[m, n - 1] + x[m, n + 1] - 4.0 * x[m, n]) ** 2
    return C


def jax_mirror(x):
    import jax.numpy as jnp
    p = _pad(x, 1, "mirror")
    lap = p[:-2, 1:-1] + p[2:, 1:-1] + p[1:-1, :-2] + p[1:-1, 2:] - 4.0 * x
    return jnp.sum(lap ** 2)


@case("mirror_stencil_2d", "x", jax=jax_mirror)
def _(rng):
    return mirror_laplace, dict(x=rng.standard_normal((4, 5)))


@pa.kernel
def circular_corr(x: pa.f64[N].circular, w: pa.f64[5]) -> pa.f64:
    C = 0.0
    for i in range(N):
        s = 0.0
        for k in range(5):
            s += w[k] * x[i + k - 2]
        C += s * s * x[i]
    return C


def jax_circ(x, w):
    import jax.numpy as jnp
    n = x.shape[0]
    p = _pad(x, 2, "circular")
    s = sum(w[k] * p[k:k + n] for k in range(5))
    return jnp.sum(s * s * x)


@case("circular_stencil", ["x", "w"], jax=jax_circ)
def _(rng):
    return circular_corr, dict(x=rng.standard_normal(6), w=rng.standard_normal(5))


@pa.kernel
def zero_pad_diff(x: pa.f64[N].zero) -> pa.f64:
    C = 0.0
    for i in range(-1, N + 1):
        C += pa.sin(x[i + 1] - 2.0 * x[i] + x[i - 1])
    return C


def jax_zero(x):
    import jax.numpy as jnp
    p = jnp.pad(x, 2)
    return jnp.sum(jnp.sin(p[2:] - 2.0 * p[1:-1] + p[:-2]))


@case("zero_mode_outside_loop", "x", jax=jax_zero)
def _(rng):
    return zero_pad_diff, dict(x=rng.standard_normal(5))


@pa.kernel
def clamped_wide(x: pa.f64[N].clamped) -> pa.f64:
    C = 0.0
    for i in range(N):
        C += x[i - 3] * x[i + 2] + x[i] ** 3
    return C


def jax_clamped_wide(x):
    import jax.numpy as jnp
    n = x.shape[0]
    p = _pad(x, 3, "clamped")
    return jnp.sum(p[0:n] * p[5:5 + n] + x ** 3)


@case("clamped_border_accumulation", "x", jax=jax_clamped_wide)
def _(rng):
    return clamped_wide, dict(x=rng.standard_normal(5))


# ---- 11. index transforms ---------------------------------------------------------------

@pa.kernel
def transform_cost(x: pa.f64[2 * K + 21, 4 * L], c: pa.f64[K, L]) -> pa.f64:
    C = 0.0
    for k in range(K):
        for l in range(5, L):
            C += c[k, l] * x[2 * k + 20, 4 * l - 20] ** 2
    return C


def jax_transform(x, c):
    import jax.numpy as jnp
    k, l = c.shape
    sub = x[20:20 + 2 * k:2, 0:4 * l - 20:4]
    return jnp.sum(c[:, 5:] * sub[:, :l - 5] ** 2)


@case("index_transform_2k20_4l20", "x", jax=jax_transform, directional=True)
def _(rng):
    return transform_cost, dict(x=rng.standard_normal((2 * 2 + 21, 4 * 7)),
                                c=rng.standard_normal((2, 7)))


@pa.kernel
def upsample_cost(x: pa.f64[N], r: pa.f64[4], y: pa.f64[2 * N]) -> pa.f64:
    C = 0.0
    for i in range(2 * N):
        C += (x[i // 2] - y[i]) ** 2 + r[(i + 1) % 4] * y[i] * x[i // 2]
    return C


def jax_upsample(x, r, y):
    import jax.numpy as jnp
    n = x.shape[0]
    i = jnp.arange(2 * n)
    return jnp.sum((x[i // 2] - y) ** 2 + r[(i + 1) % 4] * y * x[i // 2])


@case("quasi_affine_div_mod_index", ["x", "r"], jax=jax_upsample)
def _(rng):
    return upsample_cost, dict(x=rng.standard_normal(3), r=rng.standard_normal(4),
                               y=rng.standard_normal(6))


# ---- 12. triangular loops -------------------------------------------------------------------

@pa.kernel
def pair_energy(x: pa.f64[N], A: pa.f64[N, N]) -> pa.f64:
    C = 0.0
    for i in range(N):
        for j in range(i + 1, N):
            C += A[i, j] * (x[i] - x[j]) ** 2
    return C


def jax_pairs(x, A):
    import jax.numpy as jnp
    d = (x[:, None] - x[None, :]) ** 2
    return jnp.sum(jnp.triu(A, 1) * d)


@case("triangular_pairs", ["x", "A"], jax=jax_pairs)
def _(rng):
    return pair_energy, dict(x=rng.standard_normal(5), A=rng.standard_normal((5, 5)))


@pa.kernel
def lower_tri_quad(A: pa.f64[N, N], x: pa.f64[N]) -> pa.f64:
    C = 0.0
    for i in range(N):
        s = 0.0
        for j in range(i + 1):
            s += A[i, j] * x[j]
        C += pa.tanh(s) * x[i]
    return C


def jax_lower_tri(A, x):
    import jax.numpy as jnp
    return jnp.sum(jnp.tanh(jnp.tril(A) @ x) * x)


@case("triangular_loop_local_accumulator", ["A", "x"], jax=jax_lower_tri)
def _(rng):
    return lower_tri_quad, dict(A=rng.standard_normal((4, 4)), x=rng.standard_normal(4))


# ---- 13. in-place updates ---------------------------------------------------------------------

@pa.kernel
def inplace_square_cost(x: pa.f64[N]) -> pa.f64:
    for i in range(N):
        x[i] = x[i] * x[i] + 0.5 * x[i]
    C = 0.0
    for i in range(N - 1):
        C += x[i] * x[i + 1]
    return C


def jax_inplace_sq(x):
    import jax.numpy as jnp
    y = x * x + 0.5 * x
    return jnp.sum(y[:-1] * y[1:])


@case("inplace_update_array", "x", jax=jax_inplace_sq)
def _(rng):
    return inplace_square_cost, dict(x=rng.standard_normal(5))


@pa.kernel
def prefix_sum_cost(x: pa.f64[N], w: pa.f64[N]) -> pa.f64:
    for i in range(1, N):
        x[i] += x[i - 1] * w[i]
    C = 0.0
    for i in range(N):
        C += pa.sin(x[i])
    return C


def jax_prefix(x, w):
    import jax.numpy as jnp
    out = [x[0]]
    for i in range(1, x.shape[0]):
        out.append(x[i] + out[-1] * w[i])
    return jnp.sum(jnp.sin(jnp.stack(out)))


@case("inplace_carried_prefix", ["x", "w"], jax=jax_prefix)
def _(rng):
    return prefix_sum_cost, dict(x=rng.standard_normal(5), w=rng.standard_normal(5))


@pa.kernel
def temp_relu_inplace(x: pa.f64[N], w: pa.f64[N]) -> pa.f64:
    h = pa.empty(pa.f64[N])
    for i in range(N):
        h[i] = w[i] * x[i] - 0.1
    for i in range(N):
        h[i] = max(h[i], 0.0)
    for i in range(N):
        h[i] *= h[i]
    C = 0.0
    for i in range(N):
        C += h[i] * x[i]
    return C


def jax_temp_relu(x, w):
    import jax.numpy as jnp
    h = jnp.maximum(w * x - 0.1, 0.0) ** 2
    return jnp.sum(h * x)


@case("temp_inplace_relu_and_mul_assign", ["x", "w"], jax=jax_temp_relu)
def _(rng):
    return temp_relu_inplace, dict(x=rng.standard_normal(6), w=rng.standard_normal(6))


# ---- 14. device functions with branches -------------------------------------------------

@pa.func
def huber(r: pa.f64, delta: pa.f64) -> pa.f64:
    a = abs(r)
    if a <= delta:
        return 0.5 * r * r
    else:
        return delta * (a - 0.5 * delta)


@pa.func
def soft_threshold(v: pa.f64, t: pa.f64) -> pa.f64:
    if v > t:
        return v - t
    elif v < -t:
        return v + t
    else:
        return 0.0


@pa.func
def clip01(v: pa.f64) -> pa.f64:
    return 0.0 if v < 0.0 else (1.0 if v > 1.0 else v)


@pa.func
def smooth_pen(v: pa.f64, t: pa.f64) -> pa.f64:
    s = soft_threshold(v, t)
    u = s * s
    u += huber(v - clip01(v), t)
    return u * pa.exp(-0.1 * v)


@pa.kernel
def func_cost(x: pa.f64[N], lam: pa.f64) -> pa.f64:
    C = 0.0
    for i in range(N):
        C += huber(x[i], lam) + smooth_pen(x[i], lam) * x[i]
    return C


def jax_func_cost(x, lam):
    import jax.numpy as jnp
    a = jnp.abs(x)
    hub = lambda r, d: jnp.where(jnp.abs(r) <= d, 0.5 * r * r, d * (jnp.abs(r) - 0.5 * d))
    st = jnp.where(x > lam, x - lam, jnp.where(x < -lam, x + lam, 0.0))
    clip = jnp.where(x < 0.0, 0.0, jnp.where(x > 1.0, 1.0, x))
    pen = (st * st + hub(x - clip, lam)) * jnp.exp(-0.1 * x)
    del a
    return jnp.sum(hub(x, lam) + pen * x)


@case("device_functions_with_branches", ["x", "lam"], jax=jax_func_cost)
def _(rng):
    x = np.concatenate([rng.uniform(-3, 3, 6), [0.3, -0.35, 1.6]])
    return func_cost, dict(x=x, lam=0.7)


# ---- 15. scalar-local statistics ------------------------------------------------------------

@pa.kernel
def mean_var(x: pa.f64[N]) -> pa.f64:
    s = 0.0
    for i in range(N):
        s += x[i]
    mu = s / N
    v = 0.0
    for i in range(N):
        v += (x[i] - mu) ** 2
    return v / float(N)


def jax_var(x):
    import jax.numpy as jnp
    return jnp.var(x)


@case("variance_two_pass", "x", jax=jax_var)
def _(rng):
    return mean_var, dict(x=rng.standard_normal(6))


@pa.kernel
def max_abs(x: pa.f64[N]) -> pa.f64:
    s = 0.0
    for i in range(N):
        s = max(s, abs(x[i]))
    return s


def jax_max_abs(x):
    import jax.numpy as jnp
    return jnp.max(jnp.abs(x))


@case("max_reduction_self_update", "x", jax=jax_max_abs)
def _(rng):
    return max_abs, dict(x=rng.standard_normal(6))


# ---- 16. control flow on active data -----------------------------------------------------

@pa.kernel
def piecewise(x: pa.f64[N], w: pa.f64[N]) -> pa.f64:
    C = 0.0
    for i in range(N):
        y = x[i] if x[i] > 0.0 else 0.1 * x[i]
        if y * w[i] > 0.05:
            C += y * w[i] * x[i]
        else:
            C -= pa.cos(y) * w[i]
    return C


def jax_piecewise(x, w):
    import jax.numpy as jnp
    y = jnp.where(x > 0, x, 0.1 * x)
    return jnp.sum(jnp.where(y * w > 0.05, y * w * x, -jnp.cos(y) * w))


@case("active_if_and_ternary", ["x", "w"], jax=jax_piecewise)
def _(rng):
    return piecewise, dict(x=rng.standard_normal(7), w=rng.standard_normal(7))


@pa.kernel
def affine_conditions(x: pa.f64[N], n0: pa.i32) -> pa.f64:
    C = 0.0
    for i in range(N):
        if i < N // 2:
            C += x[i] ** 2
        elif i % 2 == 0:
            C += pa.exp(x[i])
        else:
            C += 3.0 * x[i]
        if i >= n0 and n0 >= 0:
            C += x[i] * x[i - n0]
    return C


def jax_affine_cond(x, n0):
    import jax.numpy as jnp
    n = x.shape[0]
    i = jnp.arange(n)
    c = jnp.where(i < n // 2, x ** 2, jnp.where(i % 2 == 0, jnp.exp(x), 3.0 * x))
    return jnp.sum(c) + jnp.sum(x[n0:] * x[:n - n0])


@case("affine_and_int_param_conditions", "x", jax=jax_affine_cond)
def _(rng):
    return affine_conditions, dict(x=rng.standard_normal(7), n0=2)


# ---- 17. strided and downward loops ---------------------------------------------------------

@pa.kernel
def strided(x: pa.f64[N]) -> pa.f64:
    C = 0.0
    for i in range(N - 1, 0, -2):
        C += x[i] ** 3
    for i in range(1, N, 3):
        C += x[i] * x[i - 1]
    for i in range(N - 1, -1, -1):
        C = C * 0.9 + x[i]
    return C


def jax_strided(x):
    import jax.numpy as jnp
    n = x.shape[0]
    c = jnp.sum(x[n - 1:0:-2] ** 3)
    for i in range(1, n, 3):
        c = c + x[i] * x[i - 1]
    for i in range(n - 1, -1, -1):
        c = c * 0.9 + x[i]
    return c


@case("strided_and_negative_step_loops", "x", jax=jax_strided)
def _(rng):
    return strided, dict(x=rng.standard_normal(7))


@pa.kernel
def half_ranges(x: pa.f64[N], mask: pa.f64[N]) -> pa.f64:
    C = 0.0
    for i in range(N // 2, N):
        C += x[i] * x[i - N // 2]
    for i in range((N + 1) // 2 - 1, -1, -2):
        if mask[i] > 0.5:
            C += pa.cos(x[i]) * x[N - 1 - i]
    return C


def jax_half_ranges(x, mask):
    import jax.numpy as jnp
    n = x.shape[0]
    c = jnp.sum(x[n // 2:] * x[:n - n // 2])
    for i in range((n + 1) // 2 - 1, -1, -2):
        c = c + jnp.where(mask[i] > 0.5, jnp.cos(x[i]) * x[n - 1 - i], 0.0)
    return c


@case("quasi_affine_loop_bounds_inactive_guard", "x", jax=jax_half_ranges)
def _(rng):
    return half_ranges, dict(x=rng.standard_normal(7), mask=rng.uniform(0, 1, 7))


# ---- 18. softmax cross-entropy -----------------------------------------------------------------

@pa.kernel
def softmax_xent(z: pa.f64[B, K], y: pa.f64[B, K]) -> pa.f64:
    loss = 0.0
    for i in range(B):
        s = 0.0
        for k in range(K):
            s += pa.exp(z[i, k])
        for k in range(K):
            loss -= y[i, k] * pa.log(pa.exp(z[i, k]) / s)
    return loss


def jax_xent(z, y):
    import jax
    import jax.numpy as jnp
    return -jnp.sum(y * jax.nn.log_softmax(z, axis=1))


@case("softmax_cross_entropy", "z", jax=jax_xent)
def _(rng):
    y = np.eye(4)[rng.integers(0, 4, 3)]
    return softmax_xent, dict(z=rng.standard_normal((3, 4)), y=y)


# ---- 19. recurrences (tape) --------------------------------------------------------------------

@pa.kernel
def rnn(x: pa.f64[N], y: pa.f64[N], w: pa.f64, u: pa.f64) -> pa.f64:
    h = 0.0
    C = 0.0
    for t in range(N):
        h = pa.tanh(w * h + u * x[t])
        C += (h - y[t]) ** 2
    return C


def jax_rnn(x, y, w, u):
    import jax.numpy as jnp
    h, c = 0.0, 0.0
    for t in range(x.shape[0]):
        h = jnp.tanh(w * h + u * x[t])
        c = c + (h - y[t]) ** 2
    return c


@case("rnn_recurrence", ["x", "w", "u"], jax=jax_rnn)
def _(rng):
    return rnn, dict(x=rng.standard_normal(6), y=rng.standard_normal(6), w=0.8, u=1.2)


@pa.kernel
def horner(c: pa.f64[N], t: pa.f64) -> pa.f64:
    p = 0.0
    for k in range(N):
        p = p * t + c[k]
    return p


@case("horner_polynomial", ["c", "t"], jax=lambda c, t: sum(c[k] * t ** (c.shape[0] - 1 - k)
                                                           for k in range(c.shape[0])))
def _(rng):
    return horner, dict(c=rng.standard_normal(5), t=0.7)


@pa.kernel
def mul_div_assign(x: pa.f64[N]) -> pa.f64:
    r = 1.0
    for i in range(N):
        r *= x[i]
        r /= 1.0 + x[i] * x[i]
        r -= 0.1 * x[i]
    return r


def jax_muldiv(x):
    r = 1.0
    for i in range(x.shape[0]):
        r = r * x[i]
        r = r / (1.0 + x[i] * x[i])
        r = r - 0.1 * x[i]
    return r


@case("mul_div_sub_assign", "x", jax=jax_muldiv)
def _(rng):
    return mul_div_assign, dict(x=rng.standard_normal(5))


# ---- 20. quadratic forms, matmul, sizes and loop variables as values -----------------------

@pa.kernel
def quad_form(A: pa.f64[N, N], x: pa.f64[N]) -> pa.f64:
    C = 0.0
    for i in range(N):
        for j in range(N):
            C += x[i] * A[i, j] * x[j]
    return C


@case("quadratic_form", ["A", "x"], jax=lambda A, x: x @ A @ x)
def _(rng):
    return quad_form, dict(A=rng.standard_normal((4, 4)), x=rng.standard_normal(4))


@pa.kernel
def matfact(U: pa.f64[M, K], V: pa.f64[K, N], R: pa.f64[M, N]) -> pa.f64:
    prod = pa.zeros(pa.f64[M, N])
    for m in range(M):
        for n in range(N):
            for k in range(K):
                prod[m, n] += U[m, k] * V[k, n]
    C = 0.0
    for m in range(M):
        for n in range(N):
            C += (prod[m, n] - R[m, n]) ** 2
    return C


@case("matrix_factorization_matmul_temp", ["U", "V"],
      jax=lambda U, V, R: ((U @ V - R) ** 2).sum())
def _(rng):
    return matfact, dict(U=rng.standard_normal((3, 2)), V=rng.standard_normal((2, 4)),
                         R=rng.standard_normal((3, 4)))


@pa.kernel
def weighted_by_index(x: pa.f64[N]) -> pa.f64:
    C = 0.0
    for i in range(N):
        C += float(i) * x[i] * x[i] / N + pa.atan2(x[i], 1.0 + float(N - i))
    return C


def jax_weighted_idx(x):
    import jax.numpy as jnp
    n = x.shape[0]
    i = jnp.arange(n, dtype=x.dtype)
    return jnp.sum(i * x * x / n + jnp.arctan2(x, 1.0 + (n - i)))


@case("sizes_and_loop_vars_as_values", "x", jax=jax_weighted_idx)
def _(rng):
    return weighted_by_index, dict(x=rng.standard_normal(5))


# ---- 21. loop-local scalar chains, guards on locals ----------------------------------------

@pa.kernel
def local_chain(x: pa.f64[M, N]) -> pa.f64:
    C = 0.0
    for m in range(M):
        a = 0.0
        for n in range(N):
            a += x[m, n]
        b = a * a
        for n in range(N):
            c = b * x[m, n]
            if c > 0.0:
                C += pa.sqrt(c + 1.0)
            else:
                C += c * a
    return C


def jax_local_chain(x):
    import jax.numpy as jnp
    a = x.sum(axis=1, keepdims=True)
    c = a * a * x
    return jnp.sum(jnp.where(c > 0, jnp.sqrt(jnp.abs(c) + 1.0), c * a))


@case("loop_local_chain_guard_on_local", "x", jax=jax_local_chain)
def _(rng):
    return local_chain, dict(x=rng.standard_normal((3, 4)))


@pa.kernel
def overwritten_later(x: pa.f64[N]) -> pa.f64:
    C = 0.0
    s = x[0] * x[1]
    for i in range(N):
        C += s * x[i]
    s = pa.exp(x[2])
    for i in range(N):
        C += s * x[i] * x[i]
    return C


def jax_overwritten(x):
    import jax.numpy as jnp
    return x[0] * x[1] * jnp.sum(x) + jnp.exp(x[2]) * jnp.sum(x * x)


@case("scalar_overwritten_after_loop", "x", jax=jax_overwritten)
def _(rng):
    return overwritten_later, dict(x=rng.standard_normal(5))


# ---- 22. float32 --------------------------------------------------------------------------------

@pa.kernel
def f32_cost(x: pa.f32[N].clamped, w: pa.f32[3]) -> pa.f32:
    C = 0.0
    for i in range(N):
        s = w[0] * x[i - 1] + w[1] * x[i] + w[2] * x[i + 1]
        C += pa.tanh(s) ** 2
    return C


@pytest.mark.parametrize("_", [0])
def test_float32_gradient(rng, _):
    x = rng.standard_normal(6).astype(np.float32)
    w = rng.standard_normal(3).astype(np.float32)
    dx, dw = run(grad(f32_cost, ["x", "w"]), x, w)
    assert dx.dtype == np.float32 and dw.dtype == np.float32
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    xp = np.pad(x64, 1, mode="edge")

    def f(x_, w_):
        xp_ = np.pad(x_, 1, mode="edge")
        s = w_[0] * xp_[:-2] + w_[1] * x_ + w_[2] * xp_[2:]
        return np.sum(np.tanh(s) ** 2)
    del xp
    gx = fd_grad(lambda a: f(a["x"], a["w"]), dict(x=x64, w=w64), "x")
    gw = fd_grad(lambda a: f(a["x"], a["w"]), dict(x=x64, w=w64), "w")
    assert_close(dx, gx, rtol=2e-4, atol=2e-5)
    assert_close(dw, gw, rtol=2e-4, atol=2e-5)


# ===========================================================================
# the checks
# ===========================================================================


def _directional_check(kernel, wrt, args, sizes, grads, rng, rtol, eps):
    f = scalar_fn(kernel, args, sizes)
    for _ in range(3):
        v = {n: rng.standard_normal(np.shape(args[n])) for n in wrt}
        ap = {**args, **{n: args[n] + eps * v[n] for n in wrt}}
        am = {**args, **{n: args[n] - eps * v[n] for n in wrt}}
        fd = (f(ap) - f(am)) / (2 * eps)
        ad = sum(float(np.sum(np.asarray(grads[n]) * v[n])) for n in wrt)
        assert abs(fd - ad) <= rtol * max(abs(fd), abs(ad), 1.0), (fd, ad)


def _params(names):
    return [pytest.param(n, marks=compiler_issue(CASES[n]["issue"])) if CASES[n]["issue"]
            else n for n in names]


@pytest.mark.parametrize("name", _params(sorted(CASES)))
def test_gradient_vs_finite_differences(name):
    c = CASES[name]
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    kernel, args = c["make"](rng)
    wrt = [c["wrt"]] if isinstance(c["wrt"], str) else list(c["wrt"])
    value, grads = run(value_and_grad(kernel, wrt), **args, **c["sizes"])
    ref_value = run_reference(kernel, **{n: (v.copy() if isinstance(v, np.ndarray) else v)
                               for n, v in args.items()}, **c["sizes"])
    assert value == pytest.approx(ref_value, rel=1e-12, abs=1e-12)
    grads = dict(zip(wrt, grads))
    for n in wrt:
        assert np.shape(grads[n]) == np.shape(args[n])
    if c["directional"]:
        _directional_check(kernel, wrt, args, c["sizes"], grads, rng, 1e-6, c["eps"])
    else:
        f = scalar_fn(kernel, args, c["sizes"])
        for n in wrt:
            assert_close(grads[n], fd_grad(f, args, n, c["eps"]), c["rtol"], c["atol"],
                         what=f"{name}: d/d{n}")


JAX_CASES = sorted(n for n, c in CASES.items() if c["jax"] is not None)


@pytest.mark.parametrize("name", _params(JAX_CASES))
def test_gradient_vs_jax(name):
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    c = CASES[name]
    rng = np.random.default_rng(zlib.crc32(name.encode()) + 1)
    kernel, args = c["make"](rng)
    wrt = [c["wrt"]] if isinstance(c["wrt"], str) else list(c["wrt"])
    _, grads = run(value_and_grad(kernel, wrt), **args, **c["sizes"])
    names = [p.name for p in kernel.ir.params if p.intent != "out"]
    argnums = tuple(names.index(n) for n in wrt)
    jargs = [args[n] if not isinstance(args[n], np.ndarray) else jax.numpy.asarray(args[n])
             for n in names]
    ref = jax.grad(c["jax"], argnums=argnums)(*jargs)
    for n, g, r in zip(wrt, grads, ref):
        assert_close(g, np.asarray(r), 1e-9, 1e-10, what=f"{name}: d/d{n} vs jax")


def test_corpus_size():
    assert len(CASES) >= 30
