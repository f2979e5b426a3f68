"""Boundary modes (.clamped / .circular / .mirror / .zero) against numpy.pad
('edge' / 'wrap' / 'reflect' / 'constant' 0), for reads and writes."""

import numpy as np
import pytest

import polyad as pa
from npref import map_index, shifted

M, N = pa.sizes("M N")

OFFSETS_1D = [-3, -2, -1, 0, 1, 2, 3]


# ---------------------------------------------------------------------------
# 1-D reads: y[d + 3, i] = x_mode[i + d] for d in -3..3
# ---------------------------------------------------------------------------


@pa.kernel
def taps1d_clamped(x: pa.f64[N].clamped, y: pa.Out(pa.f64[7, N])):
    for i in range(N):
        y[0, i] = x[i - 3]
        y[1, i] = x[i - 2]
        y[2, i] = x[i - 1]
        y[3, i] = x[i]
        y[4, i] = x[i + 1]
        y[5, i] = x[i + 2]
        y[6, i] = x[i + 3]


@pa.kernel
def taps1d_circular(x: pa.f64[N].circular, y: pa.Out(pa.f64[7, N])):
    for i in range(N):
        y[0, i] = x[i - 3]
        y[1, i] = x[i - 2]
        y[2, i] = x[i - 1]
        y[3, i] = x[i]
        y[4, i] = x[i + 1]
        y[5, i] = x[i + 2]
        y[6, i] = x[i + 3]


@pa.kernel
def taps1d_mirror(x: pa.f64[N].mirror, y: pa.Out(pa.f64[7, N])):
    for i in range(N):
        y[0, i] = x[i - 3]
        y[1, i] = x[i - 2]
        y[2, i] = x[i - 1]
        y[3, i] = x[i]
        y[4, i] = x[i + 1]
        y[5, i] = x[i + 2]
        y[6, i] = x[i + 3]


@pa.kernel
def taps1d_zero(x: pa.f64[N].zero, y: pa.Out(pa.f64[7, N])):
    for i in range(N):
        y[0, i] = x[i - 3]
        y[1, i] = x[i - 2]
        y[2, i] = x[i - 1]
        y[3, i] = x[i]
        y[4, i] = x[i + 1]
        y[5, i] = x[i + 2]
        y[6, i] = x[i + 3]


TAPS1D = {
    "clamped": taps1d_clamped,
    "circular": taps1d_circular,
    "mirror": taps1d_mirror,
    "zero": taps1d_zero,
}

# circular / mirror need N > 3 (largest offset); clamped / zero work for any N >= 1
CASES_1D = [(m, n) for m in ("clamped", "zero") for n in (1, 2, 3, 4, 7, 10)] + [
    (m, n) for m in ("circular", "mirror") for n in (4, 5, 7, 10)
]


@pytest.mark.parametrize("mode,n", CASES_1D)
def test_read_1d_offsets(rng, mode, n):
    x = rng.standard_normal(n)
    y = TAPS1D[mode](x)
    assert y.shape == (7, n)
    for row, d in enumerate(OFFSETS_1D):
        np.testing.assert_array_equal(y[row], shifted(x, [d], mode), err_msg=f"offset {d}")


def test_mirror_definition_matches_reflect():
    # -1 -> 1 and N -> N-2 (the edge sample is not repeated)
    x = np.arange(5.0)
    y = taps1d_mirror(x)
    np.testing.assert_array_equal(y[2], [1.0, 0.0, 1.0, 2.0, 3.0])  # x[i - 1]
    np.testing.assert_array_equal(y[4], [1.0, 2.0, 3.0, 4.0, 3.0])  # x[i + 1]
    np.testing.assert_array_equal(y[0], [3.0, 2.0, 1.0, 0.0, 1.0])  # x[i - 3]


# ---------------------------------------------------------------------------
# 2-D reads
# ---------------------------------------------------------------------------

OFFSETS_2D = [(-3, -3), (-3, 2), (0, 3), (1, -1), (2, 0), (3, 3), (-1, 0), (0, -2)]


@pa.kernel
def taps2d_clamped(x: pa.f64[M, N].clamped, y: pa.Out(pa.f64[8, M, N])):
    for m in range(M):
        for n in range(N):
            y[0, m, n] = x[m - 3, n - 3]
            y[1, m, n] = x[m - 3, n + 2]
            y[2, m, n] = x[m, n + 3]
            y[3, m, n] = x[m + 1, n - 1]
            y[4, m, n] = x[m + 2, n]
            y[5, m, n] = x[m + 3, n + 3]
            y[6, m, n] = x[m - 1, n]
            y[7, m, n] = x[m, n - 2]


@pa.kernel
def taps2d_circular(x: pa.f64[M, N].circular, y: pa.Out(pa.f64[8, M, N])):
    for m in range(M):
        for n in range(N):
            y[0, m, n] = x[m - 3, n - 3]
            y[1, m, n] = x[m - 3, n + 2]
            y[2, m, n] = x[m, n + 3]
            y[3, m, n] = x[m + 1, n - 1]
            y[4, m, n] = x[m + 2, n]
            y[5, m, n] = x[m + 3, n + 3]
            y[6, m, n] = x[m - 1, n]
            y[7, m, n] = x[m, n - 2]


@pa.kernel
def taps2d_mirror(x: pa.f64[M, N].mirror, y: pa.Out(pa.f64[8, M, N])):
    for m in range(M):
        for n in range(N):
            y[0, m, n] = x[m - 3, n - 3]
            y[1, m, n] = x[m - 3, n + 2]
            y[2, m, n] = x[m, n + 3]
            y[3, m, n] = x[m + 1, n - 1]
            y[4, m, n] = x[m + 2, n]
            y[5, m, n] = x[m + 3, n + 3]
            y[6, m, n] = x[m - 1, n]
            y[7, m, n] = x[m, n - 2]


@pa.kernel
def taps2d_zero(x: pa.f64[M, N].zero, y: pa.Out(pa.f64[8, M, N])):
    for m in range(M):
        for n in range(N):
            y[0, m, n] = x[m - 3, n - 3]
            y[1, m, n] = x[m - 3, n + 2]
            y[2, m, n] = x[m, n + 3]
            y[3, m, n] = x[m + 1, n - 1]
            y[4, m, n] = x[m + 2, n]
            y[5, m, n] = x[m + 3, n + 3]
            y[6, m, n] = x[m - 1, n]
            y[7, m, n] = x[m, n - 2]


TAPS2D = {
    "clamped": taps2d_clamped,
    "circular": taps2d_circular,
    "mirror": taps2d_mirror,
    "zero": taps2d_zero,
}


@pytest.mark.parametrize("mode", sorted(TAPS2D))
@pytest.mark.parametrize("shape", [(4, 4), (5, 7), (9, 6)])
def test_read_2d_offsets(rng, mode, shape):
    x = rng.standard_normal(shape)
    y = TAPS2D[mode](x)
    assert y.shape == (8,) + shape
    for row, off in enumerate(OFFSETS_2D):
        np.testing.assert_array_equal(y[row], shifted(x, off, mode), err_msg=f"offset {off}")


@pytest.mark.parametrize("shape", [(1, 1), (2, 3), (3, 1)])
def test_read_2d_small_clamped_zero(rng, shape):
    x = rng.standard_normal(shape)
    for mode in ("clamped", "zero"):
        y = TAPS2D[mode](x)
        for row, off in enumerate(OFFSETS_2D):
            np.testing.assert_array_equal(y[row], shifted(x, off, mode))


# ---------------------------------------------------------------------------
# Mixed modes in one kernel
# ---------------------------------------------------------------------------


@pa.kernel
def mixed1d(x: pa.f64[N].clamped, w: pa.f64[N].circular, z: pa.f64[N].mirror,
            v: pa.f64[N].zero, y: pa.Out(pa.f64[N])):
    for i in range(N):
        y[i] = x[i - 2] * w[i + 3] + x[i + 1] - w[i - 1] + 2.0 * z[i + 2] - z[i - 3] + v[i + 1] * v[i - 2]


@pytest.mark.parametrize("n", [4, 6, 11])
def test_mixed_modes_1d(rng, n):
    x, w, z, v = rng.standard_normal((4, n))
    s = shifted
    ref = (s(x, [-2], "clamped") * s(w, [3], "circular") + s(x, [1], "clamped")
           - s(w, [-1], "circular") + 2.0 * s(z, [2], "mirror") - s(z, [-3], "mirror")
           + s(v, [1], "zero") * s(v, [-2], "zero"))
    np.testing.assert_allclose(mixed1d(x, w, z, v), ref, rtol=1e-13, atol=1e-13)


@pa.kernel
def mixed2d(x: pa.f64[M, N].clamped, w: pa.f64[M, N].circular, b: pa.f64[M, N],
            y: pa.Out(pa.f64[M, N])):
    for m in range(M):
        for n in range(N):
            y[m, n] = b[m, n] + x[m - 1, n + 2] * w[m + 2, n - 1] - w[m - 3, n + 3] * x[m, n - 3]


@pytest.mark.parametrize("shape", [(4, 5), (7, 7)])
def test_mixed_modes_2d_with_unchecked(rng, shape):
    x, w, b = rng.standard_normal((3,) + shape)
    ref = (b + shifted(x, [-1, 2], "clamped") * shifted(w, [2, -1], "circular")
           - shifted(w, [-3, 3], "circular") * shifted(x, [0, -3], "clamped"))
    np.testing.assert_allclose(mixed2d(x, w, b), ref, rtol=1e-13, atol=1e-13)


# ---------------------------------------------------------------------------
# Writes through boundary modes
# ---------------------------------------------------------------------------


def _scatter_ref(y0, x, offset, mode, accumulate):
    """Sequential reference of `for i: y_mode[i + offset] (+)= x[i]`."""
    y = y0.copy()
    n = len(y)
    for i in range(len(x)):
        j = map_index(i + offset, n, mode)
        if j is None:
            continue
        y[j] = y[j] + x[i] if accumulate else x[i]
    return y


@pa.kernel
def write_zero_out(x: pa.f64[N], y: pa.Out(pa.f64[N].zero)):
    for i in range(N):
        y[i - 2] = x[i]


@pa.kernel
def write_zero_inout(x: pa.f64[N], y: pa.f64[N].zero):
    for i in range(N):
        y[i + 2] += x[i]


@pytest.mark.parametrize("n", [1, 3, 8])
def test_writes_outside_dropped_zero_mode(rng, n):
    x = rng.standard_normal(n)
    y = np.zeros(n)
    write_zero_out(x, y)
    np.testing.assert_array_equal(y, _scatter_ref(np.zeros(n), x, -2, "zero", False))
    y0 = rng.standard_normal(n)
    y = y0.copy()
    assert write_zero_inout(x, y) is None
    np.testing.assert_allclose(y, _scatter_ref(y0, x, 2, "zero", True), rtol=1e-14)


@pa.kernel
def write_clamped_assign(x: pa.f64[N], y: pa.Out(pa.f64[N].clamped)):
    for i in range(N):
        y[i + 2] = x[i]


@pa.kernel
def write_clamped_accumulate(x: pa.f64[N], y: pa.f64[N].clamped):
    for i in range(N):
        y[i - 3] += x[i]


@pytest.mark.parametrize("n", [1, 4, 9])
def test_writes_clamped(rng, n):
    x = rng.standard_normal(n)
    y = np.zeros(n)
    write_clamped_assign(x, y)  # several iterations write y[N-1]: the last one wins
    np.testing.assert_array_equal(y, _scatter_ref(np.zeros(n), x, 2, "clamped", False))
    y0 = rng.standard_normal(n)
    y = y0.copy()
    write_clamped_accumulate(x, y)
    np.testing.assert_allclose(y, _scatter_ref(y0, x, -3, "clamped", True), rtol=1e-12, atol=1e-13)


@pa.kernel
def write_circular_mirror(x: pa.f64[N], a: pa.f64[N].circular, b: pa.f64[N].mirror):
    for i in range(N):
        a[i + 3] += x[i]
        b[i - 2] += x[i]


@pytest.mark.parametrize("n", [4, 7])
def test_writes_circular_and_mirror_accumulate(rng, n):
    x, a0, b0 = rng.standard_normal((3, n))
    a, b = a0.copy(), b0.copy()
    write_circular_mirror(x, a, b)
    np.testing.assert_allclose(a, _scatter_ref(a0, x, 3, "circular", True), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(b, _scatter_ref(b0, x, -2, "mirror", True), rtol=1e-12, atol=1e-13)


@pa.kernel
def write_zero_2d(x: pa.f64[M, N], y: pa.Out(pa.f64[M, N].zero)):
    for m in range(M):
        for n in range(N):
            y[m + 1, n - 2] = x[m, n]


def test_writes_outside_dropped_2d(rng):
    x = rng.standard_normal((5, 6))
    y = np.zeros((5, 6))
    write_zero_2d(x, y)
    ref = np.zeros((5, 6))
    ref[1:, :4] = x[:4, 2:]
    np.testing.assert_array_equal(y, ref)


# ---------------------------------------------------------------------------
# Sizes too small for circular / mirror
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["circular", "mirror"])
def test_too_small_for_offset_raises_shape_error_1d(mode):
    x = np.arange(2.0)  # N = 2, largest offset 3
    with pytest.raises(pa.ShapeError):
        TAPS1D[mode](x)


@pytest.mark.parametrize("mode", ["circular", "mirror"])
@pytest.mark.parametrize("shape", [(2, 6), (6, 2)])
def test_too_small_for_offset_raises_shape_error_2d(mode, shape):
    x = np.ones(shape)
    y = np.zeros((8,) + shape)
    with pytest.raises(pa.ShapeError):
        TAPS2D[mode](x, y)
    assert not y.any()  # nothing ran


def test_too_small_mixed_kernel_shape_error(rng):
    x, w, z, v = rng.standard_normal((4, 2))
    with pytest.raises(pa.ShapeError):
        mixed1d(x, w, z, v)
