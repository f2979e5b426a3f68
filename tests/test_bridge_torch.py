"""The PyTorch bridge: polyad.torch.function passes gradcheck in float64, agrees with
the JAX bridge and with pa.vjp, works in an nn.Module, and refuses what it cannot do."""

import os
import runpy
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import polyad as pa  # noqa: E402
import polyad.torch as pt  # noqa: E402
from bridge_kernels import blur_energy, shifted_sum, square_in_place  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def t64(a, grad=True):
    return torch.tensor(a, dtype=torch.float64, requires_grad=grad)


def test_forward_matches_the_plain_kernel_without_copies(rng):
    x, w = rng.random(9), rng.random(3)
    e_ref, y_ref = blur_energy(x, w, 0.7)
    f = pt.function(blur_energy)
    e, y = f(torch.from_numpy(x), torch.from_numpy(w), 0.7)
    assert isinstance(e, torch.Tensor) and e.shape == () and y.shape == (9,)
    np.testing.assert_allclose(e.item(), e_ref, rtol=1e-14)
    np.testing.assert_allclose(y.numpy(), y_ref, rtol=1e-14)


def test_gradcheck_float64_all_inputs(rng):
    f = pt.function(blur_energy)
    assert f.functional.wrt == ["x", "w", "s"]
    args = (t64(rng.random(8)), t64(rng.random(3)), t64(0.6))
    # The default build scatters d_x and d_w with atomics from two threads: the
    # order of the additions, and so the last bits, can differ between two
    # backward calls (gradcheck's reentrancy check; 1 run in ~3 failed at 0.0).
    assert torch.autograd.gradcheck(f, args, nondet_tol=1e-12)


def test_gradcheck_in_out_array_is_an_output_and_input_untouched(rng):
    f = pt.function(square_in_place)
    x = t64(rng.random(6))
    before = x.detach().clone()
    y = f(x, t64(1.5))
    torch.testing.assert_close(y, 1.5 * before * before)
    torch.testing.assert_close(x.detach(), before)
    assert torch.autograd.gradcheck(f, (x, t64(1.5)))


def test_size_keyword_and_integer_input(rng):
    f = pt.function(shifted_sum, wrt="x")
    x = t64(rng.random(5))
    y = f(x, 2, K=4)
    torch.testing.assert_close(y, x.detach().sum() * torch.arange(2, 6, dtype=torch.float64))
    assert torch.autograd.gradcheck(lambda x: f(x, 2, K=4), (x,))


def test_gradients_agree_with_pa_vjp_and_jax(rng):
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    import polyad.jax as pj
    x, w = rng.random(10), rng.random(3)
    ybar = rng.random(10)

    def loss_t(x, w, s):
        e, y = pt.function(blur_energy)(x, w, s)
        return 3.0 * e + (y * torch.from_numpy(ybar)).sum()

    tx, tw, ts = t64(x), t64(w), t64(0.8)
    loss_t(tx, tw, ts).backward()

    def loss_j(x, w, s):
        e, y = pj.primitive(blur_energy)(x, w, s)
        return 3.0 * e + (y * ybar).sum()

    gj = jax.grad(loss_j, argnums=(0, 1, 2))(x, w, 0.8)
    gv = pa.vjp(blur_energy, wrt=["x", "w", "s"])(x, w, 0.8, ybar, 3.0)
    for g_torch, g_jax, g_vjp in zip((tx.grad, tw.grad, ts.grad), gj, gv):
        np.testing.assert_allclose(g_torch.numpy(), np.asarray(g_jax), rtol=1e-12)
        np.testing.assert_allclose(g_torch.numpy(), g_vjp, rtol=1e-12)


def test_input_outside_wrt_that_requires_grad_is_refused(rng):
    f = pt.function(blur_energy, wrt=["x"])
    with pytest.raises(pa.ArgumentError, match=r"'w' requires grad.*add 'w' to wrt= or pass "
                                               r"w\.detach\(\)"):
        f(t64(rng.random(4)), t64(rng.random(3)), 0.5)
    e, y = f(t64(rng.random(4)), t64(rng.random(3), grad=False), 0.5)
    e.backward()


def test_wrong_dtype_device_and_arguments_say_how_to_fix():
    f = pt.function(blur_energy)
    with pytest.raises(pa.DTypeError, match=r"'x' has dtype torch.float32, expected "
                                            r"torch.float64.*x\.to\(torch\.float64\)"):
        f(torch.zeros(4), torch.zeros(3, dtype=torch.float64), 0.5)
    with pytest.raises(pa.ArgumentError, match=r"'x' is on meta.*x\.cpu\(\)"):
        f(torch.zeros(4, dtype=torch.float64, device="meta"),
          torch.zeros(3, dtype=torch.float64), 0.5)
    with pytest.raises(pa.ArgumentError, match=r"'y' is an output"):
        f(torch.zeros(4, dtype=torch.float64), torch.zeros(3, dtype=torch.float64), 0.5,
          y=torch.zeros(4, dtype=torch.float64))
    with pytest.raises(pa.ArgumentError, match="missing input"):
        f(torch.zeros(4, dtype=torch.float64))
    with pytest.raises(pa.NotDifferentiableError):
        pt.function(shifted_sum, wrt="shift")


def test_signature_and_docstring():
    import inspect
    f = pt.function(blur_energy)
    assert str(inspect.signature(f)) == "(x, w, s, *, N=None)"
    assert "Outputs: the returned float64 (0-d), y (a tuple)" in f.__doc__


def test_non_contiguous_tensor_is_made_contiguous(rng):
    f = pt.function(blur_energy)
    base = t64(rng.random((8, 2)))
    x = base[:, 0]
    assert not x.is_contiguous()
    e, _ = f(x, t64(rng.random(3)), 0.3)
    e.backward()
    assert base.grad is not None and torch.all(base.grad[:, 1] == 0)


def test_nn_module_example_trains():
    ns = runpy.run_path(os.path.join(REPO, "examples", "torch_layer.py"), run_name="example")
    # One thread: ~1000 calls on 64-element signals, where a parallel region costs more
    # than the work (and much more on a loaded machine).
    with pa.num_threads(1):
        first, last = ns["train"](steps=60)
    assert last < 0.05 * first


def test_import_polyad_imports_neither_torch_nor_jax():
    code = ("import sys, polyad, polyad.functional; "
            "assert 'torch' not in sys.modules and 'jax' not in sys.modules, "
            "sorted(m for m in sys.modules if m.startswith(('torch', 'jax')))")
    env = {**os.environ, "PYTHONPATH": REPO}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=REPO)
