"""Kernels show real signatures and docstrings (parameters, sizes, return convention),
prebuilt kernels a readable repr, and the top-level namespace only the public API."""

import inspect

import numpy as np

import polyad as pa
from tv_kernel import tv_cost

N = pa.sizes("N")


@pa.kernel
def scale(x: pa.f64[N], a: pa.f64, y: pa.Out(pa.f64[N])):
    """y = a * x."""
    for i in range(N):
        y[i] = a * x[i]


def test_kernel_signature_and_docstring():
    assert str(inspect.signature(scale)) == \
        "(x: f64[N], a: f64, y: Out(f64[N]) = None, *, N=None, num_threads=None)"
    doc = inspect.getdoc(scale)
    assert doc.startswith("y = a * x.")
    assert "y: numpy array f64[N] (output, allocated and returned when omitted)" in doc
    assert "Sizes (keywords, inferred from the array shapes when omitted): N" in doc
    assert "Returns: the array y." in doc
    assert "Returns: the returned float64 value." in inspect.getdoc(tv_cost)
    inspect.signature(scale).bind(np.ones(2), 2.0)      # the signature accepts real calls


def test_derived_kernel_signature_and_return_convention():
    g = pa.grad(tv_cost, wrt={"image": "g", "weight": "lam"})
    sig = inspect.signature(g)
    assert list(sig.parameters)[:5] == ["g", "b", "lam", "d_g", "d_lam"]
    assert sig.parameters["d_g"].default is None
    assert sig.parameters["M"].kind is inspect.Parameter.KEYWORD_ONLY
    doc = inspect.getdoc(g)
    assert doc.startswith("grad of tv_cost with respect to")
    assert "Returns: a dict {'image': d_g, 'weight': d_lam}." in doc
    vg = pa.value_and_grad(tv_cost, wrt="g")
    assert "Returns: (value of tv_cost, d_g: an array like g)." in inspect.getdoc(vg)


def test_out_before_a_required_parameter_has_no_default():
    @pa.kernel
    def first_out(y: pa.Out(pa.f64[N]), x: pa.f64[N]):
        for i in range(N):
            y[i] = x[i]

    assert str(inspect.signature(first_out)).startswith("(y: Out(f64[N]), x: f64[N], *")


def test_compiled_and_prebuilt_kernels_have_readable_repr_and_signature():
    c = scale.compile()
    assert repr(c) == "<polyad compiled kernel scale(x: f64[N], a: f64, y: Out(f64[N]) = None, " \
                      "*, N=None)>"
    assert "Returns: the array y." in inspect.getdoc(c)


def test_top_level_namespace_is_the_public_api():
    names = dir(pa)
    for public in ("kernel", "func", "sizes", "grad", "vjp", "explain", "num_threads",
                   "PolyadError", "exp", "f64", "Out", "__version__"):
        assert public in names
    for internal in ("api", "ir", "poly", "frontend", "schedule", "emit", "runtime", "ad",
                     "derivatives", "errors", "report", "logconf", "intrinsics", "tracebacks"):
        assert internal not in names
    assert set(pa.__all__) <= set(vars(pa))
    import polyad.ir                                    # submodules stay importable
    assert polyad.ir.Size
