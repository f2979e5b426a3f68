"""polyad.dask: kernels and their gradients tiled on dask arrays, against the untiled kernel.

Every boundary mode, uneven chunks (including chunks smaller than the halo, at
the border and inside), scalar results and small-target gradients summed from
per-tile partials, a dask.distributed cluster with two worker processes, and
the refusal of kernels whose results depend on unbounded regions.
"""

import dataclasses
import os
import subprocess
import sys

import numpy as np
import pytest

import polyad as pa
from tv_kernel import tv_cost

da = pytest.importorskip("dask.array")
pdask = pytest.importorskip("polyad.dask")

M, N, K, L = pa.sizes("M N K L")
MODES = ["clamped", "circular", "mirror", "zero"]


@pa.kernel
def blur(x: pa.f64[M, N].clamped, f: pa.f64[K], y: pa.Out(pa.f64[M, N])):
    for m in range(M):
        for n in range(N):
            s = 0.0
            for k in range(K):
                s += x[m, n + k - 1] * f[k]
            y[m, n] = 0.5 * s + 0.25 * (x[m - 1, n] + x[m + 1, n])


# The 7-point stencil on the interior (x has no boundary mode: the loops stop one
# cell short of each face, so the tiles' halos must cover that margin too).
# (polyad compiles the moded 3-D variants in 6-40 s each; the boundary modes
# are covered in 2-D below.)
@pa.kernel
def stencil7(x: pa.f64[L, M, N], c: pa.f64, y: pa.Out(pa.f64[L, M, N])):
    for i in range(1, L - 1):
        for j in range(1, M - 1):
            for k in range(1, N - 1):
                y[i, j, k] = (c * x[i, j, k] + x[i - 1, j, k] + x[i + 1, j, k] + x[i, j - 1, k]
                              + x[i, j + 1, k] + x[i, j, k - 1] + x[i, j, k + 1])


@pa.kernel
def filter_loss(x: pa.f64[M, N].clamped, f: pa.f64[K]) -> pa.f64:
    C = 0.0
    for m in range(M):
        for n in range(N):
            s = 0.0
            for k in range(K):
                s += x[m, n + k - 1] * f[k]
            C += s * s
    return C


def with_mode(kernel, mode):
    """The same kernel with every array that has a boundary mode switched to ``mode``."""
    def retype(p):
        if p.is_array and p.type.mode:
            return dataclasses.replace(p, type=dataclasses.replace(p.type, mode=mode))
        return p
    kir = kernel.ir
    return pa.Kernel(ir_kernel=dataclasses.replace(
        kir, name=f"{kir.name}_{mode}", params=tuple(retype(p) for p in kir.params)))


_VARIANTS = {}


def variant(kernel, mode):
    """One kernel object per (kernel, mode): compiled once for the whole module."""
    key = (kernel.ir.name, mode)
    if key not in _VARIANTS:
        _VARIANTS[key] = with_mode(kernel, mode)
    return _VARIANTS[key]


# Uneven chunks: a 1-wide chunk at the border, 1- and 2-wide chunks inside
# (the halos here are 1 to 3 cells), one chunk wider than the rest.
CHUNKS_2D = ((1, 5, 2, 9, 6), (2, 1, 11, 3))
SHAPE_2D = (23, 17)


def chunked(a, chunks):
    return da.from_array(a, chunks=chunks)


@pytest.mark.parametrize("mode", MODES)
def test_blur_every_mode(mode, rng):
    """polyad vectorizes the filter sum ``s`` (a reassociated reduction): 1e-12 relative."""
    k = variant(blur, mode)
    x = rng.standard_normal(SHAPE_2D)
    f = rng.standard_normal(3)
    y = pdask.map_kernel(k, chunked(x, CHUNKS_2D), f)
    assert y.chunks == CHUNKS_2D
    np.testing.assert_allclose(y.compute(scheduler="threads"), k(x, f), rtol=1e-12,
                               atol=1e-14)


@pytest.mark.parametrize("mode", MODES)
def test_tv_gradient_every_mode_bit_identical(mode, rng):
    k = variant(tv_cost, mode)
    g = rng.standard_normal(SHAPE_2D)
    b = rng.standard_normal(SHAPE_2D)
    grad = pa.grad(k, wrt="g")
    dg = pdask.map_kernel(grad, chunked(g, CHUNKS_2D), chunked(b, 4), 0.3)
    assert dg.chunks == CHUNKS_2D
    np.testing.assert_array_equal(dg.compute(scheduler="threads"), grad(g, b, 0.3))


@pytest.mark.parametrize("mode", MODES)
def test_tv_cost_every_mode_summed_from_tiles(mode, rng):
    k = variant(tv_cost, mode)
    g = rng.standard_normal(SHAPE_2D)
    b = rng.standard_normal(SHAPE_2D)
    c = pdask.map_kernel(k, chunked(g, CHUNKS_2D), b, 0.3)   # numpy b is cut like g
    assert c.shape == ()
    np.testing.assert_allclose(c.compute(scheduler="threads"), k(g, b, 0.3), rtol=1e-12)


def test_tv_value_and_grad_with_scalar_gradient(rng):
    """A returned value, a tiled gradient and a scalar parameter's gradient in one kernel."""
    vg = pa.value_and_grad(tv_cost, wrt=["g", "lam"])
    g = rng.standard_normal(SHAPE_2D)
    b = rng.standard_normal(SHAPE_2D)
    value, (dg, dlam) = pdask.map_kernel(vg, chunked(g, CHUNKS_2D), chunked(b, CHUNKS_2D), 0.3)
    ref_value, (ref_dg, ref_dlam) = vg(g, b, 0.3)
    np.testing.assert_allclose(value.compute(), ref_value, rtol=1e-12)
    np.testing.assert_array_equal(dg.compute(), ref_dg)
    np.testing.assert_allclose(dlam.compute(), ref_dlam, rtol=1e-12)


def test_filter_gradient_is_a_small_target_summed_from_tiles(rng):
    """d/df scatters into a 3-element filter: per-tile partial filters, added by dask."""
    x = rng.standard_normal(SHAPE_2D)
    f = rng.standard_normal(3)
    grad = pa.grad(filter_loss, wrt=["x", "f"])
    dx, df = pdask.map_kernel(grad, chunked(x, CHUNKS_2D), f)
    ref_dx, ref_df = grad(x, f)
    np.testing.assert_array_equal(dx.compute(), ref_dx)
    np.testing.assert_allclose(df.compute(), ref_df, rtol=1e-12)


def test_stencil7_3d_bit_identical(rng):
    x = rng.standard_normal((9, 7, 8))
    chunks = ((1, 4, 4), (3, 1, 3), (2, 5, 1))
    y = pdask.map_kernel(stencil7, chunked(x, chunks), 0.5)
    assert y.chunks == chunks
    np.testing.assert_array_equal(y.compute(scheduler="threads"), stencil7(x, 0.5))


def test_stencil7_gradient_3d(rng):
    """The adjoint (a scatter into the neighbours), tiled the same way."""
    vjp = pa.vjp(stencil7, wrt="x")
    x = rng.standard_normal((9, 7, 8))
    y_bar = rng.standard_normal((9, 7, 8))
    chunks = ((5, 4), (1, 6), (3, 3, 2))
    dx = pdask.map_kernel(vjp, chunked(x, chunks), 0.5, chunked(y_bar, chunks))
    np.testing.assert_array_equal(dx.compute(), vjp(x, 0.5, y_bar))


def test_halo_wider_than_chunks_and_rechunked_arguments(rng):
    """Arguments chunked differently are rechunked to agree; 1-cell chunks everywhere."""
    k = variant(tv_cost, "mirror")
    grad = pa.grad(k, wrt="g")
    g = rng.standard_normal((6, 5))
    b = rng.standard_normal((6, 5))
    dg = pdask.map_kernel(grad, chunked(g, 1), chunked(b, 3), 0.1)
    assert dg.chunks == ((1,) * 6, (1,) * 5)
    np.testing.assert_array_equal(dg.compute(), grad(g, b, 0.1))


def test_distributed_local_cluster_two_processes(rng, repo_root, monkeypatch):
    distributed = pytest.importorskip("dask.distributed")
    # The worker processes import polyad from this checkout and share the test cache.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([repo_root, os.environ.get("PYTHONPATH",
                                                                                 "")]))
    grad = pa.grad(tv_cost, wrt="g")
    g = rng.standard_normal(SHAPE_2D)
    b = rng.standard_normal(SHAPE_2D)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        dg = pdask.map_kernel(grad, chunked(g, CHUNKS_2D), chunked(b, CHUNKS_2D), 0.3)
        c = pdask.map_kernel(tv_cost, chunked(g, CHUNKS_2D), chunked(b, CHUNKS_2D), 0.3)
        dg_val, c_val = client.compute([dg, c], sync=True)
        workers = client.run(os.getpid)
    assert len(set(workers.values())) == 2
    np.testing.assert_array_equal(dg_val, grad(g, b, 0.3))
    np.testing.assert_allclose(c_val, tv_cost(g, b, 0.3), rtol=1e-12)


# ---------------------------------------------------------------------------
# kernels that cannot be tiled
# ---------------------------------------------------------------------------


@pa.kernel
def cumsum(x: pa.f64[N], y: pa.Out(pa.f64[N])):
    s = 0.0
    for n in range(N):
        s += x[n]
        y[n] = s


@pa.kernel
def matmul(a: pa.f64[M, K], b: pa.f64[K, N], c: pa.Out(pa.f64[M, N])):
    for i in range(M):
        for j in range(N):
            for k in range(K):
                c[i, j] += a[i, k] * b[k, j]


@pa.kernel
def center(x: pa.f64[N], y: pa.Out(pa.f64[N])):
    mean = 0.0
    for n in range(N):
        mean += x[n]
    for n in range(N):
        y[n] = x[n] - mean / N


@pa.kernel
def mixed_modes(x: pa.f64[N].circular, z: pa.f64[N].clamped, y: pa.Out(pa.f64[N])):
    for n in range(N):
        y[n] = x[n - 1] + z[n + 1]


def test_circular_and_clamped_along_one_cut_size_is_refused(rng):
    x = rng.standard_normal(10)
    with pytest.raises(pa.TilingError, match="along N some arrays are circular and others are "
                                             "clamped"):
        pdask.map_kernel(mixed_modes, chunked(x, 4), x)


def test_bad_arguments(rng):
    x = rng.standard_normal(SHAPE_2D)
    with pytest.raises(pa.DTypeError, match="'g' has dtype float32"):
        pdask.map_kernel(tv_cost, chunked(x.astype(np.float32), 8), x, 0.1)
    with pytest.raises(pa.ArgumentError, match="omp_threads"):
        pdask.map_kernel(tv_cost, chunked(x, 8), x, 0.1, omp_threads=0)
    with pytest.raises(pa.TilingError, match="leave out the output 'd_g'"):
        pdask.map_kernel(pa.grad(tv_cost, wrt="g"), chunked(x, 8), x, 0.1, x.copy())


def test_prefix_sum_along_a_cut_dimension_is_refused(rng):
    x = rng.standard_normal(10)
    with pytest.raises(pa.TilingError, match=r"cannot tile along N: y \(line \d+\) reads 'x' "
                                             r"along its dimension 0 \(N\) at distances that "
                                             r"grow with N.*single chunk along N"):
        pdask.map_kernel(cumsum, chunked(x, 4))
    # One chunk along N: nothing to cut, the untiled result.
    np.testing.assert_array_equal(pdask.map_kernel(cumsum, chunked(x, 10)).compute(),
                                  cumsum(x))


def test_matrix_product_over_a_cut_dimension_is_refused(rng):
    a = rng.standard_normal((6, 8))
    b = rng.standard_normal((8, 5))
    with pytest.raises(pa.TilingError, match=r"output 'c' .* has no dimension along K.*single "
                                             r"chunk along K"):
        pdask.map_kernel(matmul, chunked(a, (3, 4)), chunked(b, (4, 5)))
    # Cut along M and N only: tiles are independent.
    c = pdask.map_kernel(matmul, chunked(a, (3, 8)), chunked(b, (8, 2)))
    np.testing.assert_allclose(c.compute(), matmul(a, b), rtol=1e-12)


def test_global_mean_used_elementwise_is_refused(rng):
    x = rng.standard_normal(10)
    with pytest.raises(pa.TilingError, match="along N"):
        pdask.map_kernel(center, chunked(x, 4))


def test_tile_footprint_from_the_access_relations():
    """The halo polyad.poly derives: reads one cell away; the TV adjoint writes one cell
    away through the clamped mode (plus a guard of 2 for that fold at a cut); a filter of
    width K reaches K - 2 cells to the right; a prefix sum reaches arbitrarily far."""
    from polyad.ir import LoopVar
    from polyad.poly import tile_footprint
    axes = ["M", "N"]
    sums = {"S1": {"M": LoopVar("m"), "N": LoopVar("n")},
            "S2": {"M": LoopVar("m"), "N": LoopVar("n")},
            "S3": {"M": LoopVar("m"), "N": LoopVar("n")}}
    reach = tile_footprint(tv_cost.ir, axes, sums, {}, reductions=frozenset({"C"}))
    assert (reach["M"].halo, reach["N"].halo) == (1, 1)
    grad = pa.grad(tv_cost, wrt="g").ir
    writes = {st.name: dict(zip(axes, st.target.index)) for st in grad.statements
              if st.target_name == "d_g"}
    reach = tile_footprint(grad, axes, writes, {})
    assert (reach["M"].halo, reach["N"].halo) == (1 + 2, 1 + 2)
    y = next(st for st in blur.ir.statements if st.target_name == "y")
    reach = tile_footprint(blur.ir, axes, {y.name: dict(zip(axes, y.target.index))}, {"K": 6})
    assert (reach["M"].halo, reach["N"].halo) == (1, 4)
    y = next(st for st in cumsum.ir.statements if st.target_name == "y")
    reach = tile_footprint(cumsum.ir, ["N"], {y.name: {"N": y.target.index[0]}}, {})
    assert reach["N"].halo is None and "grow with N" in reach["N"].why


# ---------------------------------------------------------------------------
# threads and imports
# ---------------------------------------------------------------------------


def test_tiles_run_with_the_requested_openmp_threads(monkeypatch, rng):
    """Each tile's kernel call runs under ``num_threads(omp_threads)`` in its own dask
    thread: the limit the call sees is the one map_kernel was given."""
    from polyad.runtime import threads
    seen = []
    real = threads.begin_call

    def spy():
        seen.append(threads._local.limits[-1] if threads._local.limits else None)
        return real()

    monkeypatch.setattr(threads, "begin_call", spy)
    k = blur
    x = rng.standard_normal((12, 10))
    f = rng.standard_normal(5)
    xd = chunked(x, (5, 4))
    pdask.map_kernel(k, xd, f, omp_threads=1).compute(scheduler="threads")
    assert seen and set(seen) == {1}
    seen.clear()
    pdask.map_kernel(k, xd, f, omp_threads=2).compute(scheduler="threads")
    assert set(seen) == {2}
    with pytest.raises(pa.ArgumentError):
        pdask.map_kernel(k, xd, f, omp_threads=0)


def test_import_polyad_does_not_import_dask(repo_root):
    code = "import sys, polyad; assert not any(m.split('.')[0] == 'dask' for m in sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=repo_root,
                   env={**os.environ, "PYTHONPATH": repo_root})
