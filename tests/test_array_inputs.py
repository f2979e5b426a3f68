"""Plain kernel calls accept DLPack / array-interface / buffer objects without a copy,
refuse ndarray subclasses whose meaning polyad would lose (MaskedArray's mask), and
say exactly what to do otherwise."""

import array

import numpy as np
import pytest

import polyad as pa

N = pa.sizes("N")


@pa.kernel
def total(x: pa.f64[N]) -> pa.f64:
    s = 0.0
    for i in range(N):
        s += x[i]
    return s


@pa.kernel
def scale_into(x: pa.f64[N], a: pa.f64, y: pa.Out(pa.f64[N])):
    for i in range(N):
        y[i] = a * x[i]


def test_masked_array_is_refused_not_summed_with_its_mask_ignored():
    x = np.ma.masked_array([1.0, 2.0, 16.0, 11.0], mask=[0, 0, 1, 0])
    assert x.sum() == 14.0
    with pytest.raises(pa.DTypeError, match=r"'x' is a numpy.ma.MaskedArray.*ignore its mask.*"
                                            r"x\.filled\(value\)"):
        total(x)
    assert total(x.filled(0.0)) == 14.0


@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
def test_other_subclasses_are_refused_memmap_is_accepted(tmp_path):
    class Meters(np.ndarray):
        pass

    with pytest.raises(pa.DTypeError, match=r"numpy.ndarray subclass.*np\.asarray\(x\)"):
        total(np.ones(3).view(Meters))
    with pytest.raises(pa.DTypeError, match=r"numpy.matrix; pass np\.asarray\(x\)"):
        total(np.matrix([[1.0, 2.0]]))
    m = np.memmap(tmp_path / "x.bin", dtype=np.float64, mode="w+", shape=(4,))
    m[:] = [1.0, 2.0, 3.0, 4.0]
    assert total(m) == 10.0
    out = np.memmap(tmp_path / "y.bin", dtype=np.float64, mode="w+", shape=(4,))
    scale_into(m, 2.0, out)
    np.testing.assert_array_equal(np.asarray(out), [2.0, 4.0, 6.0, 8.0])


def test_torch_tensors_in_and_out_without_copies():
    torch = pytest.importorskip("torch")
    x = torch.arange(5, dtype=torch.float64)
    assert total(x) == 10.0
    y = torch.zeros(5, dtype=torch.float64)
    result = scale_into(x, 3.0, y)
    torch.testing.assert_close(y, 3.0 * x)                  # written in place: no copy
    assert np.shares_memory(result, y.numpy())
    with pytest.raises(pa.DTypeError, match=r"\(torch.Tensor\) has dtype float32, expected "
                                            r"float64.*x\.to\(torch\.float64\)"):
        total(torch.zeros(3))
    with pytest.raises(pa.ShapeError, match=r"not C-contiguous; pass x\.contiguous\(\)"):
        total(torch.zeros((4, 2), dtype=torch.float64)[:, 0])
    with pytest.raises(pa.ArgumentError, match=r"x\.detach\(\).*polyad\.torch\.function"):
        total(torch.zeros(3, dtype=torch.float64, requires_grad=True))


def test_jax_arrays_as_inputs_but_not_as_written_arrays():
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    x = jnp.arange(4.0)
    assert total(x) == 6.0
    np.testing.assert_array_equal(scale_into(x, 2.0), [0.0, 2.0, 4.0, 6.0])
    with pytest.raises(pa.ShapeError, match=r"'y' \(.*\) is written by the kernel, but its "
                                            r"memory is read-only"):
        scale_into(x, 2.0, jnp.zeros(4))
    with pytest.raises(pa.DTypeError, match=r"x\.astype\(jnp\.float64\)"):
        total(jnp.arange(4, dtype=jnp.int32))


def test_buffer_and_array_interface_objects():
    assert total(array.array("d", [1.0, 2.0, 4.0])) == 7.0
    out = array.array("d", [0.0, 0.0, 0.0])
    scale_into(np.ones(3), 5.0, out)                            # written in place
    assert list(out) == [5.0, 5.0, 5.0]

    class Interface:
        def __init__(self, a):
            self.__array_interface__ = a.__array_interface__
            self.keep = a

    assert total(Interface(np.arange(4.0))) == 6.0


def test_array_like_objects_only_as_inputs_and_sequences_never():
    class OnlyArray:
        def __array__(self, dtype=None, copy=None):
            return np.arange(3.0)

    assert total(OnlyArray()) == 3.0
    with pytest.raises(pa.DTypeError, match=r"'y' is written by the kernel.*copy"):
        scale_into(np.ones(3), 1.0, OnlyArray())
    with pytest.raises(pa.DTypeError, match=r"got list; convert it once: "
                                            r"np\.asarray\(x, dtype=np\.float64\)"):
        total([1.0, 2.0])
