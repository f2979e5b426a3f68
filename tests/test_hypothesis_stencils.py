"""Randomly generated 1-D / 2-D stencil kernels against a numpy.pad reference.

Kernels are defined by source, so each example writes its kernel to a .py file
in a temporary directory and imports it (``inspect.getsource`` then works).
Unchecked inputs (no boundary mode) are allowed: the loop is then shrunk to the
interior where every unchecked access is in bounds, and the output is passed in
zero-initialised.
"""

import hashlib
import importlib.util
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npref import shifted

MODES = ["clamped", "circular", "mirror", "zero", None]
DTYPES = {"f64": np.float64, "f32": np.float32}


@pytest.fixture(scope="module")
def kernel_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("hyp_kernels")


@st.composite
def stencil_specs(draw):
    ndim = draw(st.integers(1, 2))
    n_inputs = draw(st.integers(1, 2))
    modes = [draw(st.sampled_from(MODES)) for _ in range(n_inputs)]
    weight = st.floats(-2.0, 2.0, allow_nan=False).map(lambda w: round(w, 3))
    taps = draw(
        st.lists(
            st.tuples(
                st.integers(0, n_inputs - 1),
                st.tuples(*[st.integers(-3, 3)] * ndim),
                weight,
            ),
            min_size=1,
            max_size=5,
        )
    )
    shape = tuple(draw(st.integers(4, 9)) for _ in range(ndim))
    dtype = draw(st.sampled_from(sorted(DTYPES)))
    omit_out = draw(st.booleans())
    return dict(ndim=ndim, modes=modes, taps=taps, shape=shape, dtype=dtype, omit_out=omit_out)


def _interior(spec):
    """Per axis (lo, hi): loop over range(lo, SIZE - hi) keeps unchecked taps in bounds."""
    bounds = []
    for ax in range(spec["ndim"]):
        offs = [off[ax] for a, off, _ in spec["taps"] if spec["modes"][a] is None]
        lo = max([0] + [-o for o in offs])
        hi = max([0] + offs)
        bounds.append((lo, hi))
    return bounds


def _idx(var, o):
    if o == 0:
        return var
    return f"{var} + {o}" if o > 0 else f"{var} - {-o}"


def kernel_source(spec, name):
    ndim, dt = spec["ndim"], spec["dtype"]
    sizes = ["M", "N"][-ndim:] if ndim == 2 else ["N"]
    loopvars = ["m", "n"] if ndim == 2 else ["i"]
    ext = ", ".join(sizes)
    params = []
    for a, mode in enumerate(spec["modes"]):
        suffix = f".{mode}" if mode else ""
        params.append(f"a{a}: pa.{dt}[{ext}]{suffix}")
    params.append(f"y: pa.Out(pa.{dt}[{ext}])")
    lines = [
        "import polyad as pa",
        "",
        f'{", ".join(sizes)}{"," if ndim == 1 else ""} = pa.sizes("{" ".join(sizes)}")',
        "",
        "",
        "@pa.kernel",
        f"def {name}({', '.join(params)}):",
    ]
    indent = "    "
    for (lo, hi), size, v in zip(_interior(spec), sizes, loopvars):
        stop = size if hi == 0 else f"{size} - {hi}"
        start = f"{lo}, " if lo else ""
        lines.append(f"{indent}for {v} in range({start}{stop}):")
        indent += "    "
    terms = []
    for a, off, w in spec["taps"]:
        access = f"a{a}[{', '.join(_idx(v, o) for v, o in zip(loopvars, off))}]"
        terms.append(f"{w!r} * {access}")
    lines.append(f"{indent}y[{', '.join(loopvars)}] = " + " + ".join(terms))
    return "\n".join(lines) + "\n"


def load_kernel(spec, directory):
    digest = hashlib.sha1(kernel_source(spec, "KERNEL").encode()).hexdigest()[:12]
    name = f"stencil_{digest}"
    modname = f"_polyad_hyp_{digest}"
    if modname in sys.modules:
        return getattr(sys.modules[modname], name), sys.modules[modname].__file__
    path = directory / f"{modname}.py"
    path.write_text(kernel_source(spec, name))
    ms = importlib.util.spec_from_file_location(modname, path)
    mod = importlib.util.module_from_spec(ms)
    sys.modules[modname] = mod
    ms.loader.exec_module(mod)
    return getattr(mod, name), str(path)


def reference(spec, inputs):
    shape = spec["shape"]
    acc = np.zeros(shape, dtype=np.float64)
    for a, off, w in spec["taps"]:
        x = inputs[a].astype(np.float64)
        mode = spec["modes"][a]
        if mode is None:
            # only used on the interior (below); wrap so shapes match elsewhere
            acc += w * np.roll(x, [-o for o in off], axis=tuple(range(len(shape))))
        else:
            acc += w * shifted(x, off, mode)
    mask = np.zeros(shape, dtype=bool)
    sl = tuple(slice(lo, n - hi) for (lo, hi), n in zip(_interior(spec), shape))
    mask[sl] = True
    return np.where(mask, acc, 0.0)


@settings(
    max_examples=25,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(spec=stencil_specs(), seed=st.integers(0, 2**16))
def test_random_stencil(kernel_dir, spec, seed):
    kern, path = load_kernel(spec, kernel_dir)
    dt = DTYPES[spec["dtype"]]
    r = np.random.default_rng(seed)
    inputs = [r.standard_normal(spec["shape"]).astype(dt) for _ in spec["modes"]]
    ref = reference(spec, inputs)
    full = all(m is not None for m in spec["modes"])
    if full and spec["omit_out"]:
        y = kern(*inputs)
    else:
        y = np.zeros(spec["shape"], dtype=dt)
        assert kern(*inputs, y) is y
    assert y.dtype == dt and y.shape == spec["shape"]
    tol = dict(rtol=1e-12, atol=1e-12) if dt == np.float64 else dict(rtol=1e-5, atol=1e-5)
    src = open(path).read()
    np.testing.assert_allclose(y, ref, **tol, err_msg=f"kernel source:\n{src}")


def test_generated_source_shape():
    """Sanity check of the generator itself (no polyad call)."""
    spec = dict(ndim=2, modes=["clamped", None], taps=[(0, (-3, 2), 0.5), (1, (1, -2), -1.25)],
                shape=(5, 6), dtype="f64", omit_out=False)
    src = kernel_source(spec, "k")
    assert "def k(a0: pa.f64[M, N].clamped, a1: pa.f64[M, N], y: pa.Out(pa.f64[M, N])):" in src
    assert "for m in range(M - 1):" in src
    assert "for n in range(2, N):" in src
    assert "y[m, n] = 0.5 * a0[m - 3, n + 2] + -1.25 * a1[m + 1, n - 2]" in src
    spec1 = dict(spec, ndim=1, modes=["zero"], taps=[(0, (3,), 1.0)])
    src1 = kernel_source(spec1, "k1")
    assert 'N, = pa.sizes("N")' in src1 and "for i in range(N):" in src1
    compile(src, "<gen>", "exec")
    compile(src1, "<gen>", "exec")
