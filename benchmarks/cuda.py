"""CUDA benchmark: polyad's generated gradients on the GPU against hand-written CUDA and PyTorch.

Rows (float32, S x S, default 4096; median of --repeats timed calls after warm-up):

- copy: a grid-stride float4 copy kernel (``handwritten/tv_grad.cu``): the
  device's attainable bandwidth, measured in the same run;
- TV gradient: polyad ``pa.grad(tv_cost, "g")`` with ``target="cuda"`` called
  on PyTorch CUDA tensors (used in place; once with the output allocated by
  polyad as a zeroed tensor, once preallocated as the hand-written kernel's
  is, and once through the bare C launcher without the Python-side argument
  checks, which shows the call overhead), the hand-written gather kernel,
  PyTorch autograd and ``torch.compile``;
- deconvolution gradient (wrt the image and the filter): polyad (outputs
  allocated, and preallocated), PyTorch autograd and ``torch.compile``.

Each row prints its time, the ratio to the hand-written kernel (TV) or to
PyTorch autograd (deconvolution), and the fraction of the copy bandwidth its
compulsory traffic reaches (TV: read g and b, write the gradient).

    python benchmarks/cuda.py [--size 4096] [--repeats 21]

Needs an NVIDIA GPU, nvcc and PyTorch with CUDA; exits with status 2 and a
message otherwise.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import numpy as np  # noqa: E402

import polyad as pa  # noqa: E402
from polyad.runtime.cuda import gpu_count  # noqa: E402
from polyad.runtime.toolchain import cache_dir, nvcc  # noqa: E402


def build_handwritten() -> ctypes.CDLL:
    src = HERE / "handwritten" / "tv_grad.cu"
    lib = cache_dir() / "bench_tv_grad_cuda.so"
    if not lib.exists() or lib.stat().st_mtime < src.stat().st_mtime:
        subprocess.run([nvcc(), "-O3", "-shared", "-Xcompiler", "-fPIC", "-arch=native",
                        str(src), "-o", str(lib)], check=True)
    return ctypes.CDLL(str(lib))


def timed(fn, repeats: int, torch) -> float:
    """Median seconds of ``fn()`` (synchronized), after two warm-up calls."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def torch_tv(torch):
    def tv(g, b, lam):
        left = torch.cat([g[:, :1], g[:, :-1]], 1)   # g[m, n-1], clamped
        up = torch.cat([g[:1, :], g[:-1, :]], 0)     # g[m-1, n], clamped
        return ((g - b) ** 2).sum() + lam * (left - g).abs().sum() + lam * (up - g).abs().sum()
    return tv


def torch_deconv(torch):
    def deconv(x, f, y):
        m, n = x.shape
        xp = torch.cat([x[:, :1], x[:, :1], x, x[:, -1:], x[:, -1:]], 1)
        t = sum(f[k] * xp[:, k:k + n] for k in range(5))
        tp = torch.cat([t[:1], t[:1], t, t[-1:], t[-1:]], 0)
        u = sum(f[k] * tp[k:k + m] for k in range(5))
        return ((u - y) ** 2).sum()
    return deconv


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=21)
    args = ap.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("benchmarks/cuda.py needs PyTorch with CUDA (pip install torch)")
        return 2
    if gpu_count() == 0 or not torch.cuda.is_available():
        print("benchmarks/cuda.py needs an NVIDIA GPU: none is visible")
        return 2
    import kernels
    k32 = kernels.load("f32")
    S, R = args.size, args.repeats
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    g = torch.randn(S, S, device=dev, generator=gen)
    b = g + 0.1 * torch.randn(S, S, device=dev, generator=gen)
    y = torch.randn(S, S, device=dev, generator=gen)
    f = torch.randn(5, device=dev, generator=gen)
    lam = 0.1
    nbytes = S * S * 4
    hand = build_handwritten()
    d = torch.empty_like(g)
    copy_dst = torch.empty_like(g)

    def copy():
        hand.copy_f32(ctypes.c_void_p(g.data_ptr()), ctypes.c_void_p(copy_dst.data_ptr()),
                      ctypes.c_int64(S * S))

    def hand_tv():
        hand.tv_grad(ctypes.c_void_p(g.data_ptr()), ctypes.c_void_p(b.data_ptr()),
                     ctypes.c_float(lam), ctypes.c_void_p(d.data_ptr()), S, S)

    poly_tv = pa.compile(pa.grad(k32.tv_cost, "g"), target="cuda")
    poly_deconv = pa.compile(pa.grad(k32.deconv_cost, ["x", "f"]), target="cuda")
    d_poly = torch.empty_like(g)
    dx_poly, df_poly = torch.empty_like(g), torch.empty_like(f)
    ffi = poly_tv._ffi

    def poly_tv_launcher():
        poly_tv._fn(ffi.cast("float *", g.data_ptr()), ffi.cast("float *", b.data_ptr()), lam,
                    ffi.cast("float *", d_poly.data_ptr()), S, S)
        poly_tv.runtime.check("running the TV gradient")

    tv, deconv = torch_tv(torch), torch_deconv(torch)
    tv_c, deconv_c = torch.compile(tv), torch.compile(deconv)

    def autograd(fn, inputs, wrt, extra=()):
        def run():
            leaves = [t.detach().requires_grad_(k in wrt) for k, t in enumerate(inputs)]
            return torch.autograd.grad(fn(*leaves, *extra), [leaves[k] for k in wrt])
        return run

    # correctness first: polyad and the hand-written kernel against autograd
    hand_tv()
    ref_tv = autograd(tv, [g, b], [0], (lam,))()[0]
    got_tv = poly_tv(g, b, lam)
    np.testing.assert_allclose(got_tv.cpu().numpy(), ref_tv.cpu().numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(d.cpu().numpy(), ref_tv.cpu().numpy(), rtol=1e-4, atol=1e-4)
    ref_dx, ref_df = autograd(deconv, [g, f, y], [0, 1])()
    got_dx, got_df = poly_deconv(g, f, y)
    np.testing.assert_allclose(got_dx.cpu().numpy(), ref_dx.cpu().numpy(), rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(got_df.cpu().numpy(), ref_df.cpu().numpy(), rtol=1e-3)
    poly_tv(g, b, lam, d_poly)
    np.testing.assert_array_equal(d_poly.cpu().numpy(), got_tv.cpu().numpy())
    d_poly.fill_(float("nan"))
    poly_tv_launcher()
    np.testing.assert_array_equal(d_poly.cpu().numpy(), got_tv.cpu().numpy())
    poly_deconv(g, f, y, dx_poly, df_poly)   # float32 atomics: the order of the sums varies
    np.testing.assert_allclose(dx_poly.cpu().numpy(), got_dx.cpu().numpy(), rtol=1e-4, atol=1e-5)

    t_copy = timed(copy, R, torch)
    bw = 2 * nbytes / t_copy
    rows = [("copy (bandwidth reference)", t_copy, 2 * nbytes)]
    t_hand = timed(hand_tv, R, torch)
    rows += [("TV grad: hand-written CUDA gather", t_hand, 3 * nbytes),
             ("TV grad: polyad (cuda)", timed(lambda: poly_tv(g, b, lam), R, torch), 3 * nbytes),
             ("TV grad: polyad, output preallocated",
              timed(lambda: poly_tv(g, b, lam, d_poly), R, torch), 3 * nbytes),
             ("TV grad: polyad, bare C launcher", timed(poly_tv_launcher, R, torch), 3 * nbytes),
             ("TV grad: PyTorch autograd",
              timed(autograd(tv, [g, b], [0], (lam,)), R, torch), 3 * nbytes),
             ("TV grad: torch.compile",
              timed(autograd(tv_c, [g, b], [0], (lam,)), R, torch), 3 * nbytes),
             ("deconv grad: polyad (cuda)", timed(lambda: poly_deconv(g, f, y), R, torch),
              3 * nbytes),
             ("deconv grad: polyad, outputs preallocated",
              timed(lambda: poly_deconv(g, f, y, dx_poly, df_poly), R, torch), 3 * nbytes),
             ("deconv grad: PyTorch autograd",
              timed(autograd(deconv, [g, f, y], [0, 1]), R, torch), 3 * nbytes),
             ("deconv grad: torch.compile",
              timed(autograd(deconv_c, [g, f, y], [0, 1]), R, torch), 3 * nbytes)]
    print(f"{torch.cuda.get_device_name()}  float32 {S}x{S}  median of {R}  "
          f"copy bandwidth {bw / 1e9:.0f} GB/s")
    print(f"{'':40s} {'ms':>9s} {'vs hand':>8s} {'of copy bw':>10s}")
    for name, t, traffic in rows:
        print(f"{name:40s} {t * 1e3:9.3f} {t / t_hand:8.2f} {traffic / t / bw:10.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
