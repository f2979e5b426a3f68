"""Build integration: emitted ``.c``/``.h`` in a plain C program, the cffi builder, the loader."""

import importlib
import io
import json
import shutil
import subprocess
import sys
import uuid

import numpy as np
import pytest

import polyad as pa
from polyad import build
from polyad.ad import grad_kernel
from polyad.progress import Progress
from tv_kernel import tv_cost

M, N = pa.sizes("M N")


@pa.func
def soft(v: pa.f64) -> pa.f64:
    return v / (1.0 + abs(v))


@pa.kernel
def smooth(x: pa.f64[N].circular, y: pa.Out(pa.f64[N]), scale: pa.f32):
    t = pa.zeros(pa.f64[N])
    for i in range(N):
        t[i] = soft(x[i - 2] + x[i + 1])
    for i in range(N):
        y[i] = scale * t[i]


tv_grad = pa.Kernel(ir_kernel=grad_kernel(tv_cost.ir, "g"))

C_MAIN = r"""
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "tv_cost.h"
#include "tv_cost_grad_g.h"

int main(int argc, char **argv)
{
  int64_t M = atoll(argv[1]), N = atoll(argv[2]);
  double *g = malloc(M * N * sizeof(double)), *b = malloc(M * N * sizeof(double));
  double *dg = calloc(M * N, sizeof(double));
  for (int64_t i = 0; i < M * N; i++) { g[i] = sin(0.37 * i); b[i] = cos(0.11 * i); }
  double C;
  tv_cost(g, b, 0.25, M, N, &C);
  tv_cost_grad_g(g, b, 0.25, dg, M, N);
  printf("%.17g\n", C);
  FILE *f = fopen(argv[3], "wb");
  fwrite(dg, sizeof(double), M * N, f);
  fclose(f);
  free(g); free(b); free(dg);
  return 0;
}
"""


def _cc():
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    return cc


@pytest.mark.parametrize("openmp", [True, False], ids=["openmp", "serial"])
def test_emitted_sources_build_into_a_c_program(tmp_path, openmp):
    cc = _cc()
    emitted = build.emit_sources([tv_cost, tv_grad], tmp_path / "kernels", progress=False)
    assert [e.c_file.name for e in emitted] == ["tv_cost.c", "tv_cost_grad_g.c"]
    (tmp_path / "main.c").write_text(C_MAIN)
    flags = ["-O2", "-std=c99", "-Wall", "-Werror"] + (["-fopenmp"] if openmp else
                                                       ["-Wno-unknown-pragmas"])
    cmd = [cc, *flags, "-I", str(tmp_path / "kernels"), "main.c",
           *[str(e.c_file) for e in emitted], "-lm", "-o", "prog"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    m, n = 37, 53
    run = subprocess.run(["./prog", str(m), str(n), "dg.bin"], cwd=tmp_path,
                         capture_output=True, text=True, check=True)
    i = np.arange(m * n)
    g = np.sin(0.37 * i).reshape(m, n)
    b = np.cos(0.11 * i).reshape(m, n)
    assert float(run.stdout) == pytest.approx(tv_cost(g, b, 0.25), rel=1e-12)
    dg = np.fromfile(tmp_path / "dg.bin").reshape(m, n)
    np.testing.assert_allclose(dg, tv_grad(g, b, 0.25), rtol=1e-12, atol=1e-14)


def test_header_compiles_as_cpp(tmp_path):
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    build.emit_sources([smooth], tmp_path, progress=False)
    (tmp_path / "use.cpp").write_text('#include "smooth.h"\nint main() { void (*f)(const double *, '
                                      'double *, float, int64_t, double *) = smooth; '
                                      'return f == 0; }\n')
    proc = subprocess.run([cxx, "-fsyntax-only", "-I", str(tmp_path), str(tmp_path / "use.cpp")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_header_documents_the_signature(tmp_path):
    (e,) = build.emit_sources([smooth], tmp_path, progress=False)
    h = e.h_file.read_text()
    assert "void smooth(const double *x, double *y, float scale, int64_t N, double *t);" in h
    lines = h.split("\n")
    start = lines.index(" * Arguments of smooth(), in order:") + 1
    block = lines[start:lines.index(" *", start)]
    args = [ln for ln in block if not ln.startswith(" *    ")]
    order = [a[5:].split("  ")[0].split()[-1].lstrip("*") for a in args]
    assert order == ["x", "y", "scale", "N", "t"]
    text = " ".join(" ".join(ln.lstrip(" *").split()) for ln in lines)
    assert "input array f64[N].circular: N elements of double, row-major (C order)" in text
    assert "boundary mode 'circular' is applied inside the kernel" in text
    assert "output array f64[N]" in text and "pass it zero-filled" in text
    assert "size N (>= 0)" in text
    assert "scratch array f64[N] the caller allocates: N elements of double, zero-filled" in text
    assert "Size conditions (the Python wrapper checks them before calling):" in text
    assert "needs the size of dimension 0 of 'x' (N) to exceed its offset" in text
    assert "#ifndef POLYAD_SMOOTH_H" in h and 'extern "C" {' in h
    c = e.c_file.read_text()
    assert '#include <stdint.h>\n#include "smooth.h"\n' in c
    assert "static inline double pa_fn_soft(double v)" in c


def test_emit_keeps_unchanged_files(tmp_path):
    (e,) = build.emit_sources([tv_cost], tmp_path, progress=False)
    before = (e.c_file.stat().st_mtime_ns, e.h_file.stat().st_mtime_ns)
    build.emit_sources([tv_cost], tmp_path, progress=False)
    assert (e.c_file.stat().st_mtime_ns, e.h_file.stat().st_mtime_ns) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tv_cost.c", "tv_cost.h"]


# ---- the cffi builder and the loader -------------------------------------


@pytest.fixture
def built(tmp_path, monkeypatch):
    """A cffi module with three kernels, compiled in tmp_path and importable."""
    name = f"polyad_test_kernels_{uuid.uuid4().hex[:8]}"
    monkeypatch.chdir(tmp_path)
    ffi = build.ffibuilder(name, {"tv_cost": tv_cost, "tv_grad": tv_grad, "smooth": smooth},
                           progress=False)
    ffi.compile(tmpdir=str(tmp_path))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def test_ffibuilder_module_runs_kernels_without_jit(built, monkeypatch, rng):
    def no_jit(*args, **kwargs):
        raise AssertionError("the JIT compiler was called")
    g = rng.random((20, 30))
    b = rng.random((20, 30))
    x = rng.random(17)
    expected = tv_cost(g, b, 0.1), tv_grad(g, b, 0.1), smooth(x, scale=2.0)   # JIT
    monkeypatch.setattr("polyad.runtime.loader.load_library", no_jit)
    mod = build.load(built)
    assert mod.names == ["tv_cost", "tv_grad", "smooth"] and len(mod) == 3
    assert list(mod) == mod.names and "smooth" in dir(mod)
    assert repr(mod) == f"<polyad kernels of {built}: tv_cost, tv_grad, smooth>"
    assert mod.tv_cost(g, b, 0.1) == pytest.approx(expected[0], rel=1e-12)
    np.testing.assert_allclose(mod["tv_grad"](g, b, 0.1), expected[1], rtol=1e-12)
    y = mod.smooth(x, scale=2.0)
    np.testing.assert_allclose(y, expected[2], rtol=1e-6)
    out = np.zeros(17)
    assert mod.smooth(x, out, 2.0) is out
    # the same argument checks as JIT-compiled kernels
    with pytest.raises(pa.DTypeError, match="dtype float32, expected float64"):
        mod.tv_cost(g.astype(np.float32), b, 0.1)
    with pytest.raises(pa.ShapeError, match="dimension 0 of 'b' has length 3"):
        mod.tv_cost(g, b[:3], 0.1)
    with pytest.raises(pa.ShapeError, match="sizes too small"):   # circular x[i - 2] with N = 1
        mod.smooth(np.ones(1), scale=1.0)
    with pytest.raises(AttributeError, match="has no kernel 'nope'; it has tv_cost, tv_grad"):
        mod.nope
    with pytest.raises(KeyError, match="no kernel 'nope'"):
        mod["nope"]


def test_built_derivatives_return_what_pa_grad_returns(tmp_path, monkeypatch, rng):
    from polyad.derivatives import grad, value_and_grad
    kernels = {"d_lam": grad(tv_cost, wrt="lam"),
               "d_both": grad(tv_cost, wrt=["g", "lam"]),
               "d_named": grad(tv_cost, wrt={"image": "g"}),
               "v_and_g": value_and_grad(tv_cost, wrt="g")}
    name = f"polyad_test_derived_{uuid.uuid4().hex[:8]}"
    monkeypatch.chdir(tmp_path)
    build.ffibuilder(name, kernels, progress=False).compile(tmpdir=str(tmp_path))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        mod = build.load(name)
        g = rng.random((9, 11))
        b = rng.random((9, 11))
        for key, k in kernels.items():
            want, got = k(g, b, 0.3), mod[key](g, b, 0.3)
            assert type(got) is type(want), key
            if key == "d_lam":
                assert got == pytest.approx(want, rel=1e-12)
            elif key == "d_both":
                np.testing.assert_allclose(got[0], want[0], rtol=1e-12)
                assert got[1] == pytest.approx(want[1], rel=1e-12)
            elif key == "d_named":
                assert list(got) == ["image"]
                np.testing.assert_allclose(got["image"], want["image"], rtol=1e-12)
            else:
                assert got[0] == pytest.approx(want[0], rel=1e-12)
                np.testing.assert_allclose(got[1], want[1], rtol=1e-12)
            returns = mod[key].__doc__.splitlines()[-1]
            assert returns.startswith("Returns: ") and returns == k.__doc__.splitlines()[-1]
        # a scalar wrt is differentiated in forward mode by default (pa.grad's mode=None)
        assert repr(mod.d_lam).startswith("<polyad prebuilt grad_forward kernel d_lam(g: f64[M, N]")
        assert mod.d_lam.raw(g, b, 0.3).shape == (1,)       # the IR-level output
    finally:
        sys.modules.pop(name, None)


def test_load_accepts_the_module_object(built):
    module = importlib.import_module(built)
    assert build.load(module).names == ["tv_cost", "tv_grad", "smooth"]


def test_load_rejects_other_modules():
    with pytest.raises(pa.PolyadError, match="was not built by polyad.build.ffibuilder"):
        build.load("json")


def test_ffibuilder_configuration(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ffi = build.ffibuilder("pkg._k", [tv_cost], extra_compile_args=["-march=native"],
                           progress=False)
    module_name, source, _, kwds = ffi._assigned_source
    assert module_name == "pkg._k"
    src_dir = tmp_path / "build" / "polyad" / "pkg._k"
    assert kwds["sources"] == [str(src_dir.relative_to(tmp_path) / "tv_cost.c")]
    assert kwds["extra_compile_args"] == ["-O3", "-fopenmp", "-ffp-contract=fast",
                                          "-fno-trapping-math", "-fno-tree-loop-distribution",
                                          "-march=native"]
    assert kwds["extra_link_args"] == ["-fopenmp"]
    # a deterministic build keeps every product rounded (toolchain.contraction_flag)
    ffi = build.ffibuilder("pkg._k", [tv_cost], deterministic=True, progress=False)
    assert ffi._assigned_source[3]["extra_compile_args"] == ["-O3", "-fopenmp",
                                                             "-ffp-contract=off",
                                                             "-fno-trapping-math",
                                                             "-fno-tree-loop-distribution"]
    assert (src_dir / "tv_cost.h").is_file()
    assert '#include "tv_cost.h"' in source and "polyad_metadata" in source
    with pytest.raises(ValueError, match="not a dotted Python name"):
        build.ffibuilder("pkg-kernels", [tv_cost])
    with pytest.raises(ValueError, match="target 'cuda' is not supported"):
        build.ffibuilder("pkg._k", [tv_cost], target="cuda")


def test_kernel_names():
    assert [k.name for k in build.named_kernels({"cost": tv_cost, "grad": tv_grad})] == \
        ["cost", "grad"]
    with pytest.raises(ValueError, match="two kernels are named 'tv_cost'"):
        build.named_kernels([tv_cost, tv_cost])
    with pytest.raises(ValueError, match="kernel name 'a b' is not an identifier"):
        build.named_kernels({"a b": tv_cost})
    with pytest.raises(ValueError, match="no kernels given"):
        build.named_kernels([])
    with pytest.raises(TypeError, match="expected a polyad kernel, got int"):
        build.named_kernels([3])


@pytest.mark.parametrize("k", [tv_cost, tv_grad, smooth], ids=lambda k: k.ir.name)
def test_metadata_round_trip(k):
    data = json.loads(json.dumps(build._to_json(k.ir)))
    assert build._from_json(data) == k.ir


def test_c_string_literals(tmp_path):
    cc = _cc()
    text = 'a "quoted" \\ back??=slash ??/ ' + "x" * 250 + "\\" * 101 + "end"
    prog = tmp_path / "s.c"
    prog.write_text('#include <stdio.h>\nint main(void) { fputs(' + build._c_string(text)
                    + ', stdout); return 0; }\n')
    subprocess.run([cc, "-std=c99", "-Wall", "-Werror", "-Wno-trigraphs", str(prog), "-o",
                    str(tmp_path / "s")], check=True)
    out = subprocess.run([str(tmp_path / "s")], capture_output=True, text=True, check=True)
    assert out.stdout == text


# ---- progress display ----------------------------------------------------


class FakeTTY(io.StringIO):
    def isatty(self):
        return True


def test_progress_lines_when_not_a_terminal():
    s = io.StringIO()
    with Progress(2, "emitting", stream=s) as p:
        with p.step("a"):
            pass
        with p.step("b"):
            pass
    lines = s.getvalue().splitlines()
    assert [ln.split(" (")[0] for ln in lines] == ["[1/2] emitting a", "[2/2] emitting b"]


def test_progress_rewrites_the_terminal_line():
    s = FakeTTY()
    with Progress(2, "compiling", stream=s) as p:
        with p.step("first_kernel"):
            pass
        with p.step("b"):
            pass
    text = s.getvalue()
    assert text.startswith("\r[1/2] compiling first_kernel ...")
    assert "\r[2/2] compiling b ..." in text
    assert text.endswith(" s\n") and "\rcompiling 2 kernel(s): done in " in text


def test_progress_on_failure_and_when_disabled():
    s = FakeTTY()
    with pytest.raises(RuntimeError):
        with Progress(3, "emitting", stream=s) as p:
            with p.step("a"):
                pass
            with p.step("b"):
                raise RuntimeError("boom")
    assert s.getvalue().rstrip().endswith("\r[1/3] emitting: stopped")
    quiet = io.StringIO()
    with Progress(1, "emitting", stream=quiet) as p:          # one item: no display
        with p.step("a"):
            pass
    with Progress(5, "emitting", stream=quiet, enabled=False) as p:
        with p.step("a"):
            pass
    assert quiet.getvalue() == ""


def test_prebuilt_kernels_have_signatures_docstrings_and_repr(built):
    import inspect
    mod = build.load(built)
    assert str(inspect.signature(mod.tv_cost)) == \
        "(g: f64[M, N].clamped, b: f64[M, N], lam: f64, *, M=None, N=None)"
    assert repr(mod.tv_cost).startswith("<polyad compiled kernel tv_cost(g: f64[M, N].clamped")
    assert "Returns: the returned float64 value." in inspect.getdoc(mod.tv_cost)
