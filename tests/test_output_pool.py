"""``runtime.output_pool``: omitted outputs a kernel assigns entirely before reading them
are made on memory that earlier calls' outputs left, once no array refers to it; others
are zero-filled as before. ``ir.Kernel.outputs_assigned_first`` decides which."""

import gc

import numpy as np
import pytest

import polyad as pa
from polyad.runtime import output_pool

M, N = pa.sizes("M N")


@pytest.fixture
def small_pool(monkeypatch):
    """Every array goes through the pool, and the pool starts empty."""
    monkeypatch.setattr(output_pool, "MIN_BYTES", 1)
    monkeypatch.setattr(output_pool, "_blocks", [])
    return output_pool


def _address(a) -> int:
    return a.__array_interface__["data"][0]


def test_a_block_serves_again_once_no_array_refers_to_it(small_pool):
    a = small_pool.empty((64, 8), np.float64)
    at = _address(a)
    assert a.shape == (64, 8) and a.dtype == np.float64 and a.flags.c_contiguous
    b = small_pool.empty((64, 8), np.float64)            # a is alive: other memory
    assert _address(b) != at
    del a
    c = small_pool.empty((512,), np.float64)             # same size, a is gone: its block
    assert _address(c) == at
    d = small_pool.empty((64, 8), np.float32)            # another size: a new block
    assert _address(d) not in (at, _address(b))


@pytest.mark.parametrize("keep", ["slice", "view of a view", "memoryview", "reshape",
                                  "torch tensor"])
def test_anything_that_refers_to_an_output_keeps_its_block(small_pool, keep):
    a = small_pool.empty((32, 32), np.float64)
    at = _address(a)
    if keep == "slice":
        held = a[1:, ::2]
    elif keep == "view of a view":
        held = a[2:][3:].T
    elif keep == "memoryview":
        held = memoryview(a)
    elif keep == "reshape":
        held = a.reshape(-1)
    else:
        torch = pytest.importorskip("torch")
        held = torch.from_numpy(a)
    del a
    gc.collect()
    b = small_pool.empty((32, 32), np.float64)
    assert _address(b) != at
    del held
    gc.collect()
    c = small_pool.empty((32, 32), np.float64)
    assert _address(c) == at


def test_the_pool_holds_at_most_its_bound(small_pool, monkeypatch):
    monkeypatch.setattr(output_pool, "POOL_BYTES", 2450)
    a = small_pool.empty((100,), np.float64)   # 800 bytes
    b = small_pool.empty((200,), np.float64)   # 1600 bytes
    del a, b
    assert small_pool.held_bytes() == (2400, 2400)
    c = small_pool.empty((10,), np.float64)    # a new block: the oldest free one (a's) goes
    assert small_pool.held_bytes() == (1680, 1600)
    d = small_pool.empty((1000,), np.float64)  # cannot fit even alone: a plain array
    assert d.base is None and d.shape == (1000,)
    assert small_pool.held_bytes() == (80, 0)  # b's free block went trying
    small_pool.release()
    assert small_pool.held_bytes() == (80, 0)  # c is alive
    del c
    small_pool.release()
    assert small_pool.held_bytes() == (0, 0)


@pa.kernel
def blur_rows(x: pa.f64[M, N].clamped, out: pa.Out(pa.f64[M, N])):
    for m in range(M):
        for n in range(N):
            out[m, n] = 0.25 * x[m, n - 1] + 0.5 * x[m, n] + 0.25 * x[m, n + 1]


@pa.kernel
def inner_rows(x: pa.f64[M, N], out: pa.Out(pa.f64[M, N])):
    for m in range(1, M):
        for n in range(N):
            out[m, n] = x[m, n] * 2.0


@pa.kernel
def guarded(x: pa.f64[M, N], out: pa.Out(pa.f64[M, N])):
    for m in range(M):
        for n in range(N):
            if x[m, n] > 0.0:
                out[m, n] = x[m, n]


@pa.kernel
def read_ahead_in_the_same_nest(x: pa.f64[N], out: pa.Out(pa.f64[N + 1])):
    for n in range(N + 1):
        out[n] = x[0]
        if n < N:
            out[n + 1] += x[n]


@pa.kernel
def summed_first(x: pa.f64[M, N], out: pa.Out(pa.f64[M, N])):
    for m in range(M):
        for n in range(N):
            out[m, n] += x[m, n]


@pa.kernel
def transposed(x: pa.f64[N, N], out: pa.Out(pa.f64[N, N])):
    for i in range(N):
        for j in range(N):
            out[j, i] = x[i, j]


@pa.kernel
def cost(x: pa.f64[M, N].clamped) -> pa.f64:
    C = 0.0
    for m in range(M):
        for n in range(N):
            C += (x[m, n] - x[m, n - 1]) ** 2
    return C


def test_which_outputs_are_assigned_before_they_are_read():
    assert blur_rows.ir.outputs_assigned_first() == ("out",)
    for k in (inner_rows, guarded, read_ahead_in_the_same_nest, summed_first, transposed):
        assert k.ir.outputs_assigned_first() == (), k.ir.name
    # a derived kernel zeroes its adjoint first
    assert pa.grad(cost, wrt="x").ir.outputs_assigned_first() == ("d_x",)


def test_recycled_outputs_hold_the_kernels_values(small_pool):
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (7, 9))
    padded = np.pad(x, ((0, 0), (1, 1)), mode="edge")
    want = 0.25 * padded[:, :-2] + 0.5 * x + 0.25 * padded[:, 2:]
    first = blur_rows(x)
    at = _address(first)
    first[:] = np.nan                          # garbage the next call must not show
    del first
    second = blur_rows(x)
    assert _address(second) == at              # the same memory, every element assigned
    np.testing.assert_allclose(second, want, rtol=1e-15)
    grad = pa.grad(cost, wrt="x")
    g1 = grad(x)
    g1[:] = np.nan
    del g1
    g2 = grad(x)
    # the gradient of sum (x[m, n] - x[m, max(n - 1, 0)])^2, in numpy
    r = x - np.concatenate([x[:, :1], x[:, :-1]], axis=1)
    want_grad = 2 * r
    want_grad[:, :-1] -= 2 * r[:, 1:]
    want_grad[:, 0] -= 2 * r[:, 0]
    np.testing.assert_allclose(g2, want_grad, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(grad(x), pa.grad(cost, wrt="x")(x.copy()), rtol=1e-14)
    assert not np.isnan(grad(x)).any()


def test_outputs_the_kernel_does_not_assign_everywhere_start_at_zero(small_pool):
    x = np.arange(1.0, 13.0).reshape(3, 4)
    for _ in range(2):
        out = inner_rows(x)
        np.testing.assert_array_equal(out[0], 0.0)          # row 0 is never written
        np.testing.assert_array_equal(out[1:], 2.0 * x[1:])
        out[:] = np.nan
        del out
    y = np.where(x > 6.0, x, -x)
    out = guarded(y)
    np.testing.assert_array_equal(out, np.where(y > 0.0, y, 0.0))
