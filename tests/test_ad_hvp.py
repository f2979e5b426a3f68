"""Hessian-vector products (``pa.hvp``: forward mode over the reverse-mode gradient) and
dense Hessians (``pa.hessian``).

Checked against central finite differences of the compiled gradient and, where
JAX is installed, against ``jax.hessian`` of the corpus' ``jax.numpy``
transcriptions (``test_ad_corpus.CASES``).
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

import polyad as pa
import test_ad_corpus as ad_corpus
from ad_helpers import assert_close, run, run_reference

# smooth corpus cases (second derivatives exist at random points)
HVP_CASES = ["tv_smooth_sigmoid", "deconv_wrt_image_and_filter", "logsumexp",
             "logistic_regression", "prod_vector", "pow_by_loop", "mlp_2layer",
             "softmax_cross_entropy"]


def _case(name):
    c = ad_corpus.CASES[name]
    rng = np.random.default_rng(zlib.crc32(name.encode()) + 11)
    kernel, args = c["make"](rng)
    wrt = [c["wrt"]] if isinstance(c["wrt"], str) else list(c["wrt"])
    v = {n: (rng.standard_normal(np.shape(args[n])) if isinstance(args[n], np.ndarray)
             else float(rng.standard_normal())) for n in wrt}
    return c, kernel, args, wrt, v


def _tuple(x):
    return x if isinstance(x, tuple) else (x,)


@pytest.mark.parametrize("name", HVP_CASES)
def test_hvp_vs_finite_differences_of_the_gradient(name):
    c, kernel, args, wrt, v = _case(name)
    hv = _tuple(run(pa.hvp(kernel, wrt), **args, **{f"{n}_dot": v[n] for n in wrt},
                    **c["sizes"]))
    gk = pa.grad(kernel, wrt, mode="reverse")
    eps = 1e-5

    def g(t):
        moved = {n: (a + t * v[n] if n in v else a) for n, a in args.items()}
        return _tuple(run_reference(gk, **moved, **c["sizes"]))  # only the hvp compiled
    gp, gm = g(eps), g(-eps)
    for n, h, a, b in zip(wrt, hv, gp, gm):
        fd = (np.asarray(a) - np.asarray(b)) / (2 * eps)
        assert np.shape(h) == np.shape(args[n])
        assert_close(h, fd, rtol=1e-5, atol=1e-6, what=f"{name}: (H v)_{n}")


@pytest.mark.parametrize("name", [n for n in HVP_CASES if ad_corpus.CASES[n]["jax"]])
def test_hvp_vs_jax(name):
    """Against JAX's own Hessian-vector product, ``jvp(grad(f))`` (the dense
    ``jax.hessian`` comparison is ``test_hessian_dense_symmetric_and_matches_jax``)."""
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    c, kernel, args, wrt, v = _case(name)
    hv = _tuple(run(pa.hvp(kernel, wrt), **args, **{f"{n}_dot": v[n] for n in wrt},
                    **c["sizes"]))
    names = [p.name for p in kernel.ir.params if p.intent != "out"]
    argnums = tuple(names.index(n) for n in wrt)
    jargs = [jax.numpy.asarray(args[n]) if isinstance(args[n], np.ndarray) else args[n]
             for n in names]

    def grads(*xs):
        full = list(jargs)
        for i, x in zip(argnums, xs):
            full[i] = x
        return jax.grad(c["jax"], argnums=argnums)(*full)
    primals = tuple(jargs[i] for i in argnums)
    tangents = tuple(jax.numpy.asarray(v[n]) if isinstance(v[n], np.ndarray) else v[n]
                     for n in wrt)
    _, ref = jax.jvp(grads, primals, tangents)
    for n, h, r in zip(wrt, hv, ref):
        assert_close(h, np.asarray(r), rtol=1e-8, atol=1e-9, what=f"{name}: (H v)_{n} vs jax")


def test_hessian_dense_symmetric_and_matches_jax(rng):
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    c = ad_corpus.CASES["tv_smooth_sigmoid"]
    kernel, args = c["make"](rng)
    H = pa.hessian(kernel, "g")(**args)
    assert H.shape == args["g"].shape * 2
    n = args["g"].size
    Hm = H.reshape(n, n)
    np.testing.assert_allclose(Hm, Hm.T, rtol=1e-10, atol=1e-12)
    ref = np.asarray(jax.hessian(c["jax"], argnums=0)(args["g"], args["b"], args["lam"]))
    assert_close(H, ref, rtol=1e-8, atol=1e-9, what="hessian vs jax")


def test_hessian_of_scalar_parameter_and_size_limit(rng):
    k = ad_corpus.pow_loop      # x ** n: second derivative n (n - 1) x ** (n - 2)
    assert pa.hessian(k, "x")(1.3, 5) == pytest.approx(20 * 1.3 ** 3, rel=1e-12)
    big = rng.standard_normal(pa.derivatives.HESSIAN_MAX_SIZE + 1)
    with pytest.raises(pa.ShapeError, match="pa.hvp"):
        pa.hessian(ad_corpus.logsumexp, "x")(big)


def test_hvp_is_an_ordinary_kernel():
    k = pa.hvp(ad_corpus.tv_smooth, "g")
    assert isinstance(k, pa.Kernel)
    assert "hvp" in k.ir.name
    assert [p.name for p in k.ir.params if p.intent == "out"] == ["d_g_dot"]
    assert "tangent of: adjoint of" in k.explain()
