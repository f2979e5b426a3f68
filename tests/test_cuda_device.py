"""The CUDA target on a real NVIDIA GPU (target "cuda", nvcc -arch=native).

- every kernel of the forward and gradient corpora (``cuda_corpus.NAMES``)
  runs on the device and matches the reference interpreter (float64 to 1e-12,
  float32 2e-5);
- PyTorch CUDA tensors and CuPy arrays are used in place, outputs come back
  as the same kind on the same device;
- deterministic reductions are bitwise repeatable on the device, reductions
  over many blocks match, checkpointed gradients run their pieces on the device;
- compute-sanitizer's memcheck finds no out-of-bounds access in gradients at
  sizes 1-4 (the device's counterpart of the AddressSanitizer builds).

CI has no GPU: there the module is skipped, and the same generated text is
compiled by nvcc and run by the CPU simulator in ``test_cuda.py``. On a GPU
machine: ``python -m pytest -q tests/test_cuda_device.py -n 16`` (each test
compiles its own kernels, so the corpus spreads over pytest-xdist workers).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import polyad as pa
from cuda_corpus import (GRADIENTS, NAMES, assert_matches, assert_matches_reference,
                         assert_tv_gradient_over_many_blocks, copies, kernel_of, results)
from polyad.runtime.cuda import DeviceArray, gpu_count
from tape_kernels import KERNELS, make_args

pytestmark = pytest.mark.skipif(gpu_count() == 0, reason="needs an NVIDIA GPU (CI has none; "
                                "test_cuda.py runs the same CUDA text on the simulator)")


@pytest.mark.parametrize("name", NAMES)
def test_device_matches_the_interpreter(name):
    gpu = pa.compile(kernel_of(name), target="cuda")
    assert gpu.arch == "native"
    assert_matches_reference(name, gpu)


def test_large_reduction_and_gradient_over_many_blocks(rng):
    assert_tv_gradient_over_many_blocks("cuda", (1531, 2049), rng)


@pytest.mark.parametrize("name", ["tv_cost", "logsumexp", "deconv_wrt_image_and_filter"])
def test_deterministic_reductions_are_bitwise_repeatable(name):
    derived, args = GRADIENTS[name]
    det = pa.compile(derived, target="cuda", deterministic=True)
    first = results(det(**copies(args)))
    expected = results(pa.compile(derived, deterministic=True)(**copies(args)))
    for _ in range(3):
        for a, b in zip(first, results(det(**copies(args)))):
            np.testing.assert_array_equal(a, b)
    for a, e in zip(first, expected):
        assert_matches(a, e, name)


def test_torch_cuda_tensors_are_used_in_place(rng):
    torch = pytest.importorskip("torch")
    assert torch.cuda.is_available()
    derived, args = GRADIENTS["f32_cost"]
    grad = pa.compile(derived, target="cuda")
    x, w = torch.from_numpy(args["x"]).cuda(), torch.from_numpy(args["w"]).cuda()
    dx, dw = grad(x, w)
    for d in (dx, dw):
        assert isinstance(d, torch.Tensor) and d.is_cuda and d.dtype == torch.float32
    expected = pa.compile(derived)(**copies(args))
    for d, e in zip((dx, dw), expected):
        assert_matches(d.cpu().numpy(), e, "f32_cost")
    outs = torch.full_like(x, float("nan")), torch.full_like(w, float("nan"))
    before = [o.data_ptr() for o in outs]
    returned = grad(x, w, *outs)
    assert all(r is o for r, o in zip(returned, outs))
    assert [o.data_ptr() for o in outs] == before
    for o, d in zip(outs, (dx, dw)):
        np.testing.assert_array_equal(o.cpu().numpy(), d.cpu().numpy())
    with pytest.raises(pa.DTypeError, match="float32"):
        grad(x.double(), w.double())


def test_cupy_arrays_are_used_in_place(rng):
    cupy = pytest.importorskip("cupy")
    x_host = rng.standard_normal((37, 41))
    k = pa.compile(kernel_of("test_forward_kernels.blur"), target="cuda")
    y = k(cupy.asarray(x_host))
    assert isinstance(y, cupy.ndarray) and y.shape == (37, 41)
    np.testing.assert_allclose(cupy.asnumpy(y),
                               pa.compile(kernel_of("test_forward_kernels.blur"))(x_host),
                               rtol=1e-12)


def test_device_arrays_round_trip_and_errors(rng):
    k = pa.compile(kernel_of("test_forward_kernels.blur"), target="cuda")
    x = rng.standard_normal((64, 65))
    dx = k.to_device(x)
    y = k(dx)
    assert isinstance(y, DeviceArray)
    np.testing.assert_allclose(y.numpy(), pa.compile(kernel_of("test_forward_kernels.blur"))(x),
                               rtol=1e-12)
    with pytest.raises(pa.DeviceError, match="allocating device memory: .*out of memory"):
        k.runtime.alloc(2 ** 62)
    np.testing.assert_allclose(k(dx).numpy(), y.numpy(), rtol=0, atol=0)  # not sticky


@pytest.mark.parametrize("name", ["diffusion", "cholesky"])
def test_checkpointed_gradient_on_the_device(name):
    kernel, wrt = KERNELS[name]
    g = pa.value_and_grad(kernel, wrt, checkpoint=2)
    gpu = pa.compile(g, target="cuda")
    taped = pa.value_and_grad(kernel, wrt, checkpoint=False)
    rng = np.random.default_rng(8)
    for n in (1, 4, 33):
        args = make_args(name, n, rng, steps=5)
        value, grads = g.package(gpu(**copies(args)))
        ref_value, ref_grads = taped(**copies(args))
        assert value == pytest.approx(ref_value, rel=1e-12, abs=1e-13)
        assert_matches(np.asarray(grads), np.asarray(ref_grads), f"{name} n={n}")


SANITIZED = '''
import numpy as np, polyad as pa, sys
sys.path.insert(0, "tests")
from cuda_corpus import GRADIENTS, arguments, copies
from tv_kernel import tv_cost
rng = np.random.default_rng(3)
for n in (1, 2, 3, 4):
    g, b = rng.standard_normal((n, n + 1)), rng.standard_normal((n, n + 1))
    pa.compile(pa.value_and_grad(tv_cost, "g"), target="cuda")(g, b, 0.1)
for name in ("deconv_wrt_image_and_filter", "logsumexp", "tape_kernels.cholesky"):
    pa.compile(GRADIENTS[name][0], target="cuda")(**copies(arguments(name)))
print("SANITIZED-OK")
'''


def test_compute_sanitizer_finds_no_out_of_bounds_access(tmp_path, repo_root):
    tool = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    if not os.path.exists(tool):
        pytest.skip("compute-sanitizer is not installed")
    script = tmp_path / "sanitized.py"
    script.write_text(SANITIZED)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [repo_root, os.path.join(repo_root, "tests"), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([tool, "--tool", "memcheck", "--error-exitcode", "3",
                           sys.executable, str(script)], capture_output=True, text=True,
                          cwd=repo_root, env=env, timeout=600)
    assert proc.returncode == 0 and "SANITIZED-OK" in proc.stdout, proc.stdout + proc.stderr
    assert "ERROR SUMMARY: 0 errors" in proc.stdout + proc.stderr
