"""The C frontend (issue 11): C loop nests in, parallel C and gradients out.

Every corpus kernel (tests/c_corpus) is compiled by polyad from its C source and
compared with the same file compiled directly by gcc and called through cffi
(tests/c_corpus/reference.py), and with the Python-DSL kernel where the tests
have one; gradients of the corpus costs are checked against central finite
differences of gcc's build; rejected constructs must name their C line.
"""

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import polyad as pa
from c_corpus.cases import CASES, CORPUS
from c_corpus.reference import gcc_build
from polyad.frontend import c_frontend

_KERNELS = {}


def kernel(case):
    """The polyad kernel of a corpus case (parsed once per session)."""
    key = (case.file, case.func)
    if key not in _KERNELS:
        _KERNELS[key] = pa.from_c(case.path, case.func, sizes=case.macros or None)
    return _KERNELS[key]


def polyad_args(k, args):
    """The polyad call of a C function: its IR parameters by name (sizes are inferred)."""
    return [args[p.name] for p in k.ir.params]


def copy(args):
    return {n: v.copy() if isinstance(v, np.ndarray) else v for n, v in args.items()}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_corpus_kernel_matches_gcc(case):
    rng = np.random.default_rng(1)
    args = case.make(rng, case.dims)
    ref_args, pa_args = copy(args), copy(args)
    ref = gcc_build(case.path, case.defines(case.dims)).call(case.func, ref_args)
    k = kernel(case)
    out = k(*polyad_args(k, pa_args), **case.size_keywords(case.dims))
    if ref is not None:
        assert out == pytest.approx(ref, rel=case.rtol, abs=case.rtol)
    for name, v in ref_args.items():
        if isinstance(v, np.ndarray):
            np.testing.assert_allclose(pa_args[name], v, rtol=case.rtol, atol=case.rtol,
                                       err_msg=f"{case.func}: array {name}")


def test_corpus_size():
    assert len({c.file for c in CASES}) >= 20
    assert len(CASES) >= 20


def test_sizes_and_modes_from_c():
    jac = kernel(next(c for c in CASES if c.func == "kernel_jacobi_2d"))
    assert jac.ir.sizes == ("n", "tsteps") and [p.name for p in jac.ir.params] == ["A", "B"]
    tv = kernel(next(c for c in CASES if c.func == "tv_cost"))
    assert tv.ir.param("g").type.mode == "clamped" and tv.ir.param("b").type.mode is None
    per = kernel(next(c for c in CASES if c.func == "smooth_periodic"))
    assert per.ir.param("x").type.mode == "circular"
    sob = kernel(next(c for c in CASES if c.func == "sobel"))
    assert sob.ir.param("img").type == pa.f32[sob.ir.param("img").type.shape].clamped
    # PolyBench's 'tmp[i] = tmp[i] + A[i][j] * x[j]' is the accumulation 'tmp[i] += ...'
    atax = kernel(next(c for c in CASES if c.func == "kernel_atax"))
    assert [st.op for st in atax.ir.statements] == ["=", "=", "+=", "+="]
    assert "atomic" not in pa.vjp(atax, wrt="A").source
    # C literal typing: 2.0f keeps the Sobel arithmetic in float
    assert "2.0f" in sob.source and "double" not in sob.source.split("{", 1)[1]


# --------------------------------------------------------------------------
# the same kernels written in the Python DSL
# --------------------------------------------------------------------------


def test_tv_cost_equals_python_dsl():
    from tv_kernel import tv_cost as dsl_tv
    case = next(c for c in CASES if c.func == "tv_cost")
    args = case.make(np.random.default_rng(3), dict(M=9, N=11))
    c_value = kernel(case)(args["g"], args["b"], args["lam"])
    assert c_value == pytest.approx(dsl_tv(args["g"], args["b"], args["lam"]), rel=1e-12)
    dg_c = pa.grad(kernel(case), wrt="g")(args["g"], args["b"], args["lam"])
    dg_py = pa.grad(dsl_tv, wrt="g")(args["g"], args["b"], args["lam"])
    np.testing.assert_allclose(dg_c, dg_py, rtol=1e-12, atol=1e-12)


def test_blur_and_gemm_equal_python_dsl():
    from test_forward_kernels import box3x3, matmul
    rng = np.random.default_rng(4)
    x = rng.standard_normal((8, 6))
    y = np.zeros_like(x)
    kernel(next(c for c in CASES if c.func == "blur3x3"))(x, y)
    np.testing.assert_allclose(y, box3x3(x), rtol=1e-13, atol=1e-13)
    A, B = rng.standard_normal((5, 4)), rng.standard_normal((4, 3))
    C = rng.standard_normal((5, 3))
    kernel(next(c for c in CASES if c.func == "kernel_gemm"))(1.0, 0.0, C, A, B)
    np.testing.assert_allclose(C, matmul(A, B), rtol=1e-13, atol=1e-13)


# --------------------------------------------------------------------------
# gradients of scalar costs vs central differences of gcc's own build
# --------------------------------------------------------------------------

GRAD_CASES = [c for c in CASES if c.wrt]


@pytest.mark.parametrize("case", GRAD_CASES, ids=lambda c: c.id)
def test_gradient_vs_finite_differences_of_gcc_build(case):
    rng = np.random.default_rng(5)
    args = case.make(rng, case.dims)
    ref = gcc_build(case.path, case.defines(case.dims))

    def f(x):
        a = copy(args)
        a[case.wrt] = x.copy()
        return ref.call(case.func, a)

    k = kernel(case)
    g = pa.grad(k, wrt=case.wrt)(*polyad_args(k, copy(args)), **case.size_keywords(case.dims))
    x0 = args[case.wrt]
    fd = np.zeros_like(x0)
    h = 1e-6
    for i in np.ndindex(x0.shape):
        xp, xm = x0.copy(), x0.copy()
        xp[i] += h
        xm[i] -= h
        fd[i] = (f(xp) - f(xm)) / (2 * h)
    np.testing.assert_allclose(g, fd, rtol=1e-5, atol=1e-6 * max(1.0, np.abs(fd).max()))


ASAN_SCRIPT = textwrap.dedent('''
    import sys
    import numpy as np
    import polyad as pa
    sys.path.insert(0, {tests!r})
    from c_corpus.cases import CASES

    from c_corpus.reference import gcc_build

    for case in CASES:
        if case.func not in ("cost_blur", "cost_jacobi_1d"):
            continue
        k = pa.from_c(case.path, case.func, sizes=case.macros or None)
        args = case.make(np.random.default_rng(2), case.dims)
        gk = pa.grad(k, wrt=case.wrt)
        grad = gk.package(pa.compile(gk, sanitize="address")(*[args[p.name]
                                                               for p in k.ir.params]))
        # directional derivative vs central differences of gcc's build
        ref = gcc_build(case.path)
        v = np.random.default_rng(3).standard_normal(grad.shape)
        def f(x):
            a = {{n: (x if n == case.wrt else w.copy() if hasattr(w, "copy") else w)
                 for n, w in args.items()}}
            return ref.call(case.func, a)
        x0, h = args[case.wrt], 1e-6
        fd = (f(x0 + h * v) - f(x0 - h * v)) / (2 * h)
        assert abs(fd - (grad * v).sum()) <= 1e-6 * max(1.0, abs(fd)), (case.func, fd)
    print("C-ASAN-OK")
''')


def test_c_adjoints_clean_under_asan(tmp_path, repo_root):
    from test_asan import run_script_under_asan
    run_script_under_asan(tmp_path, repo_root, ASAN_SCRIPT.format(tests=str(Path(__file__).parent)),
                          "C-ASAN-OK")


# --------------------------------------------------------------------------
# what the frontend rejects, and where it says so
# --------------------------------------------------------------------------

HEAD = "void k(int n, double A[n], double B[n], int idx[n])\n{\n"
REJECTED = [
    ("while", "  int i = 0;\n  while (i < n) { A[i] = 0.0; i++; }\n", 4, "'while' loops",
     "for (i = 0"),
    ("do-while", "  int i = 0;\n  do { A[i] = 0.0; } while (0);\n", 4, "do ... while", "for"),
    ("goto", "  goto out;\n  out: A[0] = 1.0;\n", 3, "'goto'", "for/if"),
    ("break", "  for (int i = 0; i < n; i++) { if (A[i] > 0) break; }\n", 3, "'break'",
     "loop bound"),
    ("continue", "  for (int i = 0; i < n; i++) { continue; }\n", 3, "'continue'", "if-statement"),
    ("switch", "  switch (n) { case 1: A[0] = 1.0; }\n", 3, "'switch'", "if/else"),
    ("pointer arithmetic", "  for (int i = 0; i < n; i++) *(A + i) = 0.0;\n", 3,
     "pointer dereference", "index the array"),
    ("address-of", "  double *q = &A[0];\n", 3, "local pointer", "local array"),
    ("data-dependent index", "  for (int i = 0; i < n; i++) B[i] = A[idx[i]];\n", 3,
     "is not affine", "indices read from arrays"),
    ("unknown function", "  for (int i = 0; i < n; i++) B[i] = frobnicate(A[i]);\n", 3,
     "unknown function 'frobnicate'", "math.h"),
    ("non-affine bound", "  for (int i = 0; i * i < n; i++) B[i] = 0.0;\n", 3,
     "compare the counter", "i < hi"),
    ("non-affine bound expr", "  for (int i = 0; i < n * n; i++) B[0] = 0.0;\n", 3,
     "not affine", "affine"),
    ("float counter", "  for (double x = 0; x < n; x++) B[0] = x;\n", 3, "floating-point",
     "int counter"),
    ("non-constant step", "  for (int i = 0; i < n; i += n) B[i] = 0.0;\n", 3,
     "nonzero integer constant", "i += c"),
    ("pointer without extent", "void k(int n, double *p)\n{\n  p[0] = 1.0;\n", 1,
     "pointer parameter 'p' has no extent", "polyad: p[n]"),
    ("assignment to parameter", "  n = 3;\n", 3, "assignment to parameter 'n'", "local"),
    ("modulo-assign", "  int j = 3;\n  j %= 2;\n", 4, "'%='", "+="),
    ("chained assignment", "  A[0] = B[0] = 1.0;\n", 3, "chained assignment", "one target"),
    ("bitwise", "  for (int i = 0; i < n; i++) B[i] = A[i ^ 1];\n", 3, "'^'", "bitwise"),
    ("float index", "  for (int i = 0; i < n; i++) B[i] = A[i * 0.5];\n", 3,
     "floating-point", "integer"),
    ("static local", "  static double acc = 0.0;\n", 3, "static local", "parameter"),
    ("return in loop", "  for (int i = 0; i < n; i++) { return; }\n", 3, "'return'",
     "accumulate"),
    ("counter with a value", "  int i = 2;\n  for (i = 0; i < n; i++) B[i] = 0.0;\n  A[0] = i;\n",
     4, "cannot be a loop counter", "variable of its own"),
    ("counter read after loop", "  int i;\n  for (i = 0; i < n; i++) B[i] = 0.0;\n  A[0] = i;\n",
     5, "read outside its loop", "no value after its loop"),
    ("partial indexing", "  for (int i = 0; i < n; i++) B[i] = A;\n", 3, "without an index",
     "x[i]"),
]


@pytest.mark.parametrize("what,body,line,message,hint", REJECTED, ids=[r[0] for r in REJECTED])
def test_rejected_constructs_name_the_c_line(what, body, line, message, hint):
    src = (body if body.startswith("void") else HEAD + body) + "}\n"
    with pytest.raises(pa.DSLError) as info:
        pa.from_c(src, "k", filename="k.c")
    err = info.value
    assert err.filename == "k.c", str(err)
    assert err.line == line, str(err)
    assert message in err.message, str(err)
    assert hint in err.hint, str(err)
    assert str(err).startswith(f"k.c:{line}:")


def test_rejected_unsigned_recursion_and_mixed_modes():
    with pytest.raises(pa.DSLError, match="unsigned") as info:
        pa.from_c("void k(unsigned n, double A[n]) { A[0] = 1.0; }", "k", filename="u.c")
    assert info.value.line == 1
    rec = ("double f(double x) { return x > 1.0 ? f(x - 1.0) : x; }\n"
           "void k(int n, double A[n]) {\n  for (int i = 0; i < n; i++) A[i] = f(A[i]);\n}\n")
    with pytest.raises(pa.DSLError, match="recursive call of 'f'") as info:
        pa.from_c(rec, "k", filename="r.c")
    assert info.value.line == 1
    mixed = ("static int cl(int v, int n) { return v < 0 ? 0 : (v > n - 1 ? n - 1 : v); }\n"
             "void k(int n, double A[n], double B[n]) {\n  for (int i = 0; i < n; i++)\n"
             "    B[i] = A[(i + 1) % n] + A[cl(i - 1, n)];\n}\n")
    with pytest.raises(pa.DSLError, match="both circular .* and clamped") as info:
        pa.from_c(mixed, "k", filename="m.c")
    assert (info.value.line, info.value.col) == (4, 30)


def test_syntax_and_preprocessor_errors_name_the_line():
    with pytest.raises(pa.DSLError, match="C syntax error") as info:
        pa.from_c("void k(int n, double A[n]) {\n  A[0] = ;\n}\n", "k", filename="s.c")
    assert (info.value.filename, info.value.line) == ("s.c", 2)
    with pytest.raises(pa.DSLError, match="preprocessor") as info:
        pa.from_c("#include <omp.h>\nvoid k(void) {}\n", "k", filename="h.c")
    assert info.value.line == 1 and "math.h" in info.value.hint
    with pytest.raises(pa.DSLError, match="no function 'kern'"):
        pa.from_c("void k(void) {}", "kern")


def test_sizes_must_name_macros_or_parameters():
    with pytest.raises(pa.DSLError, match="neither #defined"):
        pa.from_c("void k(int n, double A[n]) { A[0] = 1.0; }", "k", sizes={"M": "m"})
    with pytest.raises(ValueError, match="identifiers"):
        pa.from_c("void k(int n, double A[n]) { A[0] = 1.0; }", "k", sizes={"n": "2x"})
    # an int parameter named in sizes= is a size even where no extent uses it
    k = pa.from_c("void k(int n, int t, double A[n]) {\n"
                  "  for (int s = 0; s < t; s++) for (int i = 0; i < n; i++) A[i] += 1.0;\n}\n",
                  "k", sizes={"t": "steps"})
    assert k.ir.sizes == ("n", "steps")
    A = np.zeros(4)
    k(A, steps=3)
    np.testing.assert_array_equal(A, 3.0)


def test_bounds_error_names_the_c_line():
    src = ("void shift(int n, double A[n], double B[n])\n{\n"
           "  for (int i = 0; i < n; i++)\n    B[i] = A[i + 1];\n}\n")
    with pytest.raises(pa.BoundsError) as info:
        pa.from_c(src, "shift", filename="shift.c").compile()
    assert info.value.line == 4 and "shift.c" in str(info.value)


def test_annotations_pointer_extent_and_explicit_mode():
    src = ("/* polyad: x[n]; y[n] */\n/* polyad: z mirror */\n"
           "void k(int n, const double *x, double *y, const double z[n])\n{\n"
           "  for (int i = 0; i < n; i++)\n    y[i] = x[i] + z[i - 2] + z[i + 1];\n}\n")
    k = pa.from_c(src, "k", sizes={"n": "n"})
    assert k.ir.param("z").type.mode == "mirror"
    rng = np.random.default_rng(6)
    x, z = rng.standard_normal(9), rng.standard_normal(9)
    y = np.zeros(9)
    k(x, y, z)
    zp = np.pad(z, 2, mode="reflect")
    np.testing.assert_allclose(y, x + zp[0:9] + zp[3:12], rtol=1e-14)


def test_c_semantics_integer_division_and_literals():
    src = ("void k(int n, const int a[n], double out[n], int q[n])\n{\n"
           "  for (int i = 0; i < n; i++) {\n"
           "    q[i] = a[i] / 3 + a[i] % 3;\n"
           "    out[i] = 1 / 2 + a[i] / 2.0f + 7 / 2;\n  }\n}\n")
    a = np.array([-7, -6, -1, 0, 1, 5, 8], np.int32)
    q, out = np.zeros(7, np.int32), np.zeros(7)
    pa.from_c(src, "k")(a, out, q)
    trunc = np.trunc(a / 3).astype(np.int32)
    np.testing.assert_array_equal(q, trunc + (a - 3 * trunc))
    np.testing.assert_allclose(out, (a / np.float32(2.0)).astype(np.float32) + 3.0)


def test_aliasing_outputs_are_rejected():
    case = next(c for c in CASES if c.func == "kernel_mvt")
    a = case.make(np.random.default_rng(7), case.dims)
    with pytest.raises(pa.ShapeError, match="shares memory"):
        kernel(case)(a["x1"], a["x1"], a["y_1"], a["y_2"], a["A"])


def test_cli_show_and_emit_c_files(tmp_path, repo_root):
    from cli_support import cli_env
    env = cli_env()
    run = [sys.executable, "-m", "polyad"]
    jac = str(CORPUS / "jacobi-2d.c")
    shown = subprocess.run(run + ["show", f"{jac}:kernel_jacobi_2d", "--sizes", "N=n",
                                  "TSTEPS=tsteps"], env=env, capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    assert "kernel kernel_jacobi_2d" in shown.stdout and "sizes: n, tsteps" in shown.stdout
    emitted = subprocess.run(run + ["emit", f"{CORPUS / 'atax.c'}:cost_atax", "--grad", "A",
                                    "-o", str(tmp_path), "-q"],
                             env=env, capture_output=True, text=True)
    assert emitted.returncode == 0, emitted.stderr
    c_file = tmp_path / "cost_atax_grad_A.c"
    assert c_file.exists() and "#pragma omp" in c_file.read_text()
    adjoint = subprocess.run(run + ["emit", f"{CORPUS / 'gemm.c'}:kernel_gemm", "--vjp", "A",
                                    "-o", str(tmp_path), "-q"],
                             env=env, capture_output=True, text=True)
    assert adjoint.returncode == 0, adjoint.stderr
    assert (tmp_path / "kernel_gemm_vjp_A.h").exists()
    bad = tmp_path / "bad.c"
    bad.write_text("void k(int n, double A[n]) {\n  while (n) A[0] = 1.0;\n}\n")
    failed = subprocess.run(run + ["show", f"{bad}:k"], env=env, capture_output=True, text=True)
    assert failed.returncode == 1 and f"{bad}:2:2: 'while' loops" in failed.stderr
    missing = subprocess.run(run + ["show", f"{bad}:nope"], env=env, capture_output=True,
                             text=True)
    assert missing.returncode == 2 and "functions in bad.c: k" in missing.stderr


def test_kernel_names_skip_static_helpers():
    unit = c_frontend.load_unit(CORPUS / "sobel.c")
    assert c_frontend.kernel_names(unit) == ["sobel"]
    by_name = pa.from_c(str(CORPUS / "gemm.c"), "kernel_gemm")  # a file name, as text
    assert by_name.ir.filename == str(CORPUS / "gemm.c")
