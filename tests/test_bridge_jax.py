"""The JAX bridge: polyad.jax.primitive passes check_grads, works under jit, grad and
vmap, agrees with pa.vjp and with the same function written in jax.numpy."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
from jax.test_util import check_grads  # noqa: E402

import polyad as pa  # noqa: E402
import polyad.jax as pj  # noqa: E402
from bridge_kernels import blur_energy, shifted_sum, square_in_place  # noqa: E402


def blur_energy_jnp(x, w, s):
    xp = jnp.concatenate([x[:1], x, x[-1:]])
    y = s * (w[0] * xp[:-2] + w[1] * xp[1:-1] + w[2] * xp[2:])
    return jnp.sum(y * jnp.tanh(y)), y


def test_forward_eager_and_jit_match_jax_numpy(rng):
    x, w = jnp.asarray(rng.random(9)), jnp.asarray(rng.random(3))
    f = pj.primitive(blur_energy)
    e_ref, y_ref = blur_energy_jnp(x, w, 0.7)
    for g in (f, jax.jit(f)):
        e, y = g(x, w, 0.7)
        assert e.shape == () and y.shape == (9,) and y.dtype == jnp.float64
        np.testing.assert_allclose(e, e_ref, rtol=1e-13)
        np.testing.assert_allclose(y, y_ref, rtol=1e-13)


def test_check_grads_reverse_mode(rng):
    f = pj.primitive(blur_energy)
    args = (jnp.asarray(rng.random(8)), jnp.asarray(rng.random(3)), jnp.float64(0.6))
    check_grads(f, args, order=1, modes=["rev"])
    check_grads(jax.jit(f), args, order=1, modes=["rev"])


def test_grad_under_jit_matches_jax_numpy(rng):
    x, w = jnp.asarray(rng.random(12)), jnp.asarray(rng.random(3))
    ybar = jnp.asarray(rng.random(12))

    def loss(fn):
        def value(x, w, s):
            e, y = fn(x, w, s)
            return 2.0 * e + jnp.sum(y * ybar)
        return jax.jit(jax.grad(value, argnums=(0, 1, 2)))

    got = loss(pj.primitive(blur_energy))(x, w, 0.9)
    want = loss(blur_energy_jnp)(x, w, 0.9)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    gv = pa.vjp(blur_energy, wrt=["x", "w", "s"])(np.asarray(x), np.asarray(w), 0.9,
                                                  np.asarray(ybar), 2.0)
    for a, b in zip(got, gv):
        np.testing.assert_allclose(a, b, rtol=1e-12)


def test_in_out_array_and_vmap(rng):
    f = pj.primitive(square_in_place)
    x = jnp.asarray(rng.random(5))
    np.testing.assert_allclose(f(x, 2.0), 2.0 * x * x, rtol=1e-15)
    check_grads(f, (x, jnp.float64(2.0)), order=1, modes=["rev"])
    xs = jnp.asarray(rng.random((3, 5)))
    np.testing.assert_allclose(jax.vmap(f, in_axes=(0, None))(xs, 2.0), 2.0 * xs * xs,
                               rtol=1e-15)


def test_integer_input_size_keyword_and_wrt(rng):
    f = pj.primitive(shifted_sum, wrt="x")
    x = jnp.asarray(rng.random(5))
    y = jax.jit(lambda x, shift: f(x, shift, K=4))(x, 3)
    np.testing.assert_allclose(y, jnp.sum(x) * jnp.arange(3, 7), rtol=1e-14)
    gx = jax.grad(lambda x: jnp.sum(f(x, 3, K=4) ** 2))(x)
    np.testing.assert_allclose(gx, 2 * jnp.sum(x) * jnp.sum(jnp.arange(3, 7) ** 2) *
                               jnp.ones(5), rtol=1e-12)


def test_inputs_outside_wrt_get_zero_cotangents(rng):
    f = pj.primitive(blur_energy, wrt="x")
    gw = jax.grad(lambda w: f(jnp.ones(4), w, 0.5)[0])(jnp.asarray(rng.random(3)))
    np.testing.assert_array_equal(gw, 0.0)


def test_wrong_dtype_and_unknown_size_say_how_to_fix():
    f = pj.primitive(blur_energy)
    with pytest.raises(pa.DTypeError, match=r"'x' has dtype float32, expected float64.*"
                                            r"x\.astype\(jnp\.float64\)"):
        f(jnp.zeros(4, jnp.float32), jnp.zeros(3), 0.5)
    g = pj.primitive(shifted_sum, wrt="x")
    with pytest.raises(pa.ArgumentError, match=r"cannot infer size\(s\) K.*K=\.\.\."):
        g(jnp.zeros(4), 1)


def test_float64_kernel_without_x64_says_how_to_enable_it():
    import os
    import subprocess
    import sys
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = ("import jax.numpy as jnp, polyad as pa, polyad.jax as pj\n"
            "from bridge_kernels import blur_energy\n"
            "try:\n    pj.primitive(blur_energy)(jnp.ones(4), jnp.ones(3), 0.5)\n"
            "except pa.DTypeError as e:\n    print(e)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([repo, os.path.join(repo, "tests")])}
    env.pop("JAX_ENABLE_X64", None)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=300)
    assert "jax.config.update('jax_enable_x64', True)" in proc.stdout, proc.stderr
