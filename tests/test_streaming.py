"""Streaming stores (``LoopPlan.stream``): a vector loop that only assigns one element of a
large kernel output per iteration, which the kernel never reads, stores it past the caches.

The decision is asserted on the benchmarks' deconvolution gradient (its ``d_x`` rows) and
on small kernels; the values of the streamed branch are checked against the interpreter
and against the same kernel's build without it, with the threshold lowered so that every
size takes it (each kernel under a name of its own: builds are remembered per kernel).
"""

import dataclasses

import numpy as np
import pytest

import polyad as pa
from polyad.schedule.machine import host_is_x86_64, host_vector_unit, last_level_cache_bytes
from polyad.target import openmp
from polyad.testing import interpret

from deconv_kernels import deconvolution
from test_output_pool import blur_rows

M, N = pa.sizes("M N")

pytestmark = pytest.mark.skipif(not host_is_x86_64(), reason="streaming stores are x86-64's")


@pa.kernel
def blur_then_double(x: pa.f32[M, N].clamped, y: pa.Out(pa.f32[M, N]),
                     z: pa.Out(pa.f32[M, N])):
    for m in range(M):
        for n in range(N):
            y[m, n] = x[m - 1, n] + x[m + 1, n]
    for m in range(M):
        for n in range(N):
            z[m, n] = 2.0 * y[m, n]


@pa.kernel
def every_other(x: pa.f64[M, N], y: pa.Out(pa.f64[M, 2 * N])):
    for m in range(M):
        for n in range(N):
            y[m, 2 * n] = x[m, n]
            y[m, 2 * n + 1] = -x[m, n]


@pa.kernel
def added_into(x: pa.f64[M, N], y: pa.f64[M, N]):
    for m in range(M):
        for n in range(N):
            y[m, n] += 3.0 * x[m, n]


def without_streamed_branches(src: str) -> str:
    """``src`` without the branches that store a large output past the caches
    (``LoopPlan.stream``), the loops as written left."""
    out, end = [], None
    for line in src.splitlines():
        if end is None and line.endswith("is too large for the caches: stored past them"):
            end = line[:len(line) - len(line.lstrip())] + "} else {"
        elif end is not None and line == end:
            end = None
        elif end is None:
            out.append(line)
    return "\n".join(out)


def _renamed(kernel, name):
    """``kernel`` under another name: a build of its own, planned afresh."""
    return pa.Kernel(ir_kernel=dataclasses.replace(kernel.ir, name=name))


def _stream_everything(monkeypatch):
    """Plans made from now on stream every array they may, whatever its size and row
    (the thresholds 1 element and no iteration)."""
    monkeypatch.setattr(openmp, "last_level_cache_bytes", lambda: 1)
    monkeypatch.setattr(openmp, "STREAM_ROW_VECTORS", 0)


@pytest.fixture
def stream_everything(monkeypatch):
    _stream_everything(monkeypatch)


def test_the_deconvolution_gradient_streams_its_input_gradient():
    g = pa.grad(deconvolution("f64"), wrt=["x", "f"])
    lanes = host_vector_unit().bits // 64
    elements = int(openmp.STREAM_SHARE_OF_CACHE * last_level_cache_bytes()) // 8
    iterations = openmp.STREAM_ROW_VECTORS * lanes
    src = pa.compile(g).source
    assert (f"if (M * N >= {elements} && (N - 2) - 2 >= {iterations}) {{  // d_x is too large "
            f"for the caches: stored past them") in src
    assert f"pa_stream_f64x{lanes}(&d_x[m * N + n], d_x_lanes);" in src
    assert "pa_stream_fence();" in src
    # the rows are computed as before in the other branch, and d_x alone is streamed
    assert "d_x[m * N + n] = d_t_rows[n + 2] * f_0" in src
    assert not [line for line in src.splitlines()
                if "pa_stream_f64" in line and "&d_x[" not in line and "void" not in line]
    assert (f"d_x stored past the caches, {lanes} elements per streaming store, where it has "
            f"at least {elements} elements and the loop at least {iterations} iterations") \
        in pa.explain(g)


@pytest.mark.parametrize("deterministic", [False, True])
def test_streamed_gradient_rows_match_the_interpreter(stream_everything, deterministic):
    """The fused gradient's d_x rows (border rows and steady state, chunks of rows on the
    threads), streamed at every size."""
    g = pa.grad(_renamed(deconvolution("f64"), f"deconv_streamed_{deterministic}"),
                wrt=["x", "f"])
    k = pa.compile(g, deterministic=deterministic)
    assert "if (M * N >= 1 && (N - 2) - 2 >= 0) {" in k.source
    rng = np.random.default_rng(41)
    for m, n in [(1, 1), (2, 3), (3, 17), (9, 11), (10, 6), (12, 40), (70, 37), (139, 6)]:
        x, f, y = rng.standard_normal((m, n)), rng.standard_normal(5), rng.standard_normal((m, n))
        _, want = interpret(g.ir, dict(x=x, f=f, y=y), dict(M=m, N=n))
        d_x, d_f = np.full((m, n), np.nan), np.full(5, np.nan)
        k(x, f, y, d_x=d_x, d_f=d_f)
        np.testing.assert_allclose(d_x, want["d_x"], rtol=1e-12, atol=1e-12, err_msg=f"{m}x{n}")
        np.testing.assert_allclose(d_f, want["d_f"], rtol=1e-12, atol=1e-10, err_msg=f"{m}x{n}")


def test_streamed_rows_are_the_rows_of_the_plain_loop(monkeypatch):
    """Deterministic builds with and without the streamed branch agree bit for bit, at
    every alignment of the rows (an odd row length moves each row's first aligned
    element) and with rows shorter than a vector."""
    plain = pa.compile(_renamed(blur_rows, "blur_rows_as_written"), deterministic=True)
    _stream_everything(monkeypatch)
    streamed = pa.compile(_renamed(blur_rows, "blur_rows_streamed"), deterministic=True)
    assert "pa_stream_f64x" in streamed.source and "&out[m * N + n]" in streamed.source
    rng = np.random.default_rng(42)
    for m, n in [(1, 1), (1, 9), (2, 8), (3, 15), (5, 33), (4, 64), (7, 129)]:
        x = rng.standard_normal((m, n))
        got = np.full((m, n), np.nan)
        streamed(x, out=got)
        np.testing.assert_array_equal(got, plain(x), err_msg=f"{m}x{n}")
        want, outs = interpret(blur_rows.ir, dict(x=x), dict(M=m, N=n))
        np.testing.assert_allclose(got, outs["out"], rtol=1e-15, atol=1e-15)


def test_an_output_the_kernel_reads_or_updates_is_not_streamed(stream_everything):
    # y is read by the second nest: it stays in the caches; z is streamed
    k = pa.compile(_renamed(blur_then_double, "blur_then_double_streamed"))
    assert "pa_stream_f32x" in k.source and "(&z[" in k.source and "(&y[" not in k.source
    rng = np.random.default_rng(43)
    for m, n in [(1, 1), (4, 21), (6, 70)]:
        x = rng.standard_normal((m, n)).astype(np.float32)
        y, z = k(x)
        np.testing.assert_allclose(z, 2 * y, rtol=1e-6)
        _, want = interpret(blur_then_double.ir, dict(x=x), dict(M=m, N=n))
        np.testing.assert_allclose(z, want["z"], rtol=1e-6)
    # a store every other element, and an update that reads the element first
    for kernel in (every_other, added_into):
        k = pa.compile(_renamed(kernel, kernel.__name__ + "_streamed"))
        assert "pa_stream" not in k.source, kernel.__name__


def test_small_arrays_and_short_rows_are_not_streamed():
    """Below the thresholds the loop as written runs: the branch compares the array's
    elements with half the last-level cache's, in the array's element size, and the
    loop's iterations with STREAM_ROW_VECTORS vectors."""
    src = pa.compile(blur_rows).source
    elements = int(openmp.STREAM_SHARE_OF_CACHE * last_level_cache_bytes()) // 8
    iterations = openmp.STREAM_ROW_VECTORS * host_vector_unit().bits // 64
    assert f"if (M * N >= {elements} && (N - 1) - 1 >= {iterations}) {{" in src
    x = np.arange(12.0).reshape(3, 4)
    np.testing.assert_allclose(blur_rows(x), interpret(blur_rows.ir, dict(x=x),
                                                       dict(M=3, N=4))[1]["out"])
