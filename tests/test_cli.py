"""The ``polyad`` console script, run in a subprocess: every subcommand and its error paths.

Exit status convention: 0 success, 1 an error in the kernel's program or the
toolchain (DSL errors print ``FILE:LINE:COL: message``), 2 a usage error.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cli_support import REPO_ROOT, cli_env, console_script

KERNELS = '''\
import polyad as pa

M, N = pa.sizes("M N")


@pa.kernel
def tv_cost(g: pa.f64[M, N].clamped, b: pa.f64[M, N], lam: pa.f64) -> pa.f64:
    C = 0.0
    for m in range(M):
        for n in range(N):
            C += (g[m, n] - b[m, n]) ** 2
            C += lam * abs(g[m, n - 1] - g[m, n])
            C += lam * abs(g[m - 1, n] - g[m, n])
    return C


@pa.kernel
def blur(x: pa.f64[N].clamped, y: pa.Out(pa.f64[N])):
    for i in range(N):
        y[i] = 0.25 * x[i - 1] + 0.5 * x[i] + 0.25 * x[i + 1]


alias = blur          # the same kernel under a second name: emitted once by --all
not_a_kernel = 3
'''


@pytest.fixture(scope="module")
def polyad_cmd(tmp_path_factory):
    return str(console_script(tmp_path_factory.mktemp("bin")))


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    d = tmp_path_factory.mktemp("src")
    (d / "kernels.py").write_text(KERNELS)
    (d / "empty.py").write_text("X = 1\n")
    (d / "bad_dsl.py").write_text(textwrap.dedent('''\
        import polyad as pa

        N, = pa.sizes("N")


        @pa.kernel
        def bad(x: pa.f64[N]) -> pa.f64:
            s = 0.0
            for i in range(N):
                while s < 1.0:
                    s += x[i]
            return s
        '''))
    (d / "oob.py").write_text(textwrap.dedent('''\
        import polyad as pa

        N, = pa.sizes("N")


        @pa.kernel
        def shift(x: pa.f64[N], y: pa.Out(pa.f64[N])):
            for i in range(N):
                y[i] = x[i + 1]
        '''))
    (d / "raises.py").write_text("import polyad as pa\n\nundefined_name + 1\n")
    (d / "syntax.py").write_text("def f(:\n    pass\n")
    (d / "notes.txt").write_text("not python\n")
    return d


def run(cmd, *args, cwd=None, env=None, timeout=300):
    return subprocess.run([cmd, *map(str, args)], cwd=cwd, env=env or cli_env(),
                          capture_output=True, text=True, timeout=timeout)


# ---- show ------------------------------------------------------------------


def test_show_text(polyad_cmd, src):
    p = run(polyad_cmd, "show", src / "kernels.py:tv_cost")
    assert p.returncode == 0, p.stderr
    out = p.stdout
    for section in ("signature", "statements, domains and access relations",
                    "dependences (between scheduled statements)", "schedule tree (ISL",
                    "AST and loop decisions", "generated source (openmp)"):
        assert section in out
    assert "line 12: C += lam * abs(g[m, n - 1] - g[m, n])" in out
    # the clamped access as a piecewise map, and the pieces it splits into
    assert "S2[m, n] -> g[m, -1 + n] : 0 <= m < M and 0 < n < N; S2[m, n = 0] -> g[m, 0]" in out
    assert "scheduled as 2 piece(s)" in out and "S2_1: C += lam * abs(g[m, 0] - g[m, n])" in out
    assert "[L1: omp parallel for reduction(+: C)]" in out
    assert "runs inside an enclosing 'omp parallel for' loop" in out
    assert "#pragma omp parallel for schedule(static) reduction(+:C)" in out


def test_show_json_matches_the_generated_pragmas(polyad_cmd, src):
    p = run(polyad_cmd, "show", src / "kernels.py:tv_cost", "--format", "json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["kernel"] == "tv_cost" and d["sizes"] == ["M", "N"]
    assert [s["name"] for s in d["statements"]] == ["S0", "S1", "S2", "S3"]
    assert "flow" in {r["kind"] for r in d["dependences"]}
    assert set(d["dependences_computed"]) == {"C"}
    assert {r["variable"] for r in d["dependences"]} == {"C"}
    n_parallel = sum(loop["omp_parallel"] for loop in d["loops"])
    assert n_parallel == d["source"].count("#pragma omp parallel for")
    assert all(loop["why"] for loop in d["loops"])


def test_show_dot(polyad_cmd, src):
    p = run(polyad_cmd, "show", src / "kernels.py:tv_cost", "--format", "dot")
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert out.startswith('digraph "tv_cost" {') and out.rstrip().endswith("}")
    assert out.count("{") == out.count("}")
    assert '"S0" -> "S1" [label="flow C", style=solid];' in out
    assert "subgraph cluster_2" in out and '"S2_1" [label=' in out


def test_show_gradient(polyad_cmd, src):
    p = run(polyad_cmd, "show", src / "kernels.py:tv_cost", "--grad", "g")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("kernel tv_cost_grad_g ")
    assert "d_g  f64[M, N].clamped  (out)" in p.stdout
    assert "scatter-to-gather of" in p.stdout
    p = run(polyad_cmd, "show", src / "kernels.py:tv_cost", "--grad", "g", "lam",
            "--format", "json")
    assert p.returncode == 0, p.stderr
    assert [x["name"] for x in json.loads(p.stdout)["params"]][-2:] == ["d_g", "d_lam"]


def test_show_vjp_and_deterministic(polyad_cmd, src):
    p = run(polyad_cmd, "show", src / "kernels.py:blur", "--vjp", "x", "--deterministic")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("kernel blur_vjp_x ") and ", deterministic)" in p.stdout
    assert "y_bar  f64[N]  (in)" in p.stdout


def test_python_dash_m(src):
    p = subprocess.run([sys.executable, "-m", "polyad", "show", src / "kernels.py:blur"],
                       env=cli_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("kernel blur ")


@pytest.mark.parametrize("args, message", [
    (["show", "missing.py:k"], "no such file: missing.py"),
    (["show", "notes.txt:k"], "is not a Python or C file"),
    (["show", "kernels.py"], "name the kernel: kernels.py:KERNEL (kernels in kernels.py: "
                             "tv_cost, blur)"),
    (["show", "kernels.py:nope"], "'nope' is not defined in kernels.py"),
    (["show", "kernels.py:not_a_kernel"], "'not_a_kernel' is not a @pa.kernel"),
    (["show", "kernels.py:tv_cost", "--grad", "q"], "tv_cost has no parameter 'q'"),
    (["show", "kernels.py:tv_cost", "--target", "opencl"], "unknown target 'opencl'"),
    (["show", "kernels.py:tv_cost", "--grad", "g", "--vjp", "g"], "not allowed with"),
    (["show", "kernels.py:tv_cost", "--format", "svg"], "invalid choice: 'svg'"),
    (["emit", "kernels.py:tv_cost"], "the following arguments are required: -o/--output"),
    (["emit", "kernels.py:tv_cost", "--all", "-o", "out"], "--all emits every kernel of a file"),
    (["emit", "kernels.py", "--all", "--grad", "g", "-o", "out"], "apply to one kernel"),
    (["emit", "empty.py", "--all", "-o", "out"], "defines no @pa.kernel"),
    (["emit", "kernels.py:blur", "--target", "opencl", "-o", "out"], "unknown target 'opencl'"),
    (["cache", "drop"], "invalid choice: 'drop'"),
    ([], "the following arguments are required: COMMAND"),
])
def test_usage_errors_exit_2(polyad_cmd, src, args, message):
    p = run(polyad_cmd, *args, cwd=src)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert message in p.stderr
    assert p.stderr.startswith("usage: polyad")
    assert not (src / "out").exists()


@pytest.mark.parametrize("flag,name,text", [
    ("--jvp", "x", "tangent of"),
    ("--adjoint", "x", "blur_adjoint_x"),
])
def test_forward_and_adjoint_flags_show(polyad_cmd, src, flag, name, text):
    p = run(polyad_cmd, "show", "kernels.py:blur", flag, name, cwd=src)
    assert p.returncode == 0, p.stderr
    assert text in p.stdout


def test_hvp_flag_show_and_emit(polyad_cmd, src, tmp_path):
    p = run(polyad_cmd, "show", "kernels.py:tv_cost", "--hvp", "g", cwd=src)
    assert p.returncode == 0, p.stderr
    assert "tv_cost_hvp_g" in p.stdout and "tangent of: adjoint of" in p.stdout
    out = tmp_path / "emitted"
    p = run(polyad_cmd, "emit", "kernels.py:blur", "--adjoint", "x", "-o", out, cwd=src)
    assert p.returncode == 0, p.stderr
    assert (out / "blur_adjoint_x.c").is_file() and (out / "blur_adjoint_x.h").is_file()


def test_adjoint_flag_on_nonlinear_kernel_names_the_line(polyad_cmd, src):
    p = run(polyad_cmd, "show", "kernels.py:tv_cost", "--adjoint", "g", cwd=src)
    assert p.returncode == 1
    assert "kernels.py:" in p.stderr and "not linear in g" in p.stderr


def test_dsl_error_exit_1_with_location(polyad_cmd, src):
    p = run(polyad_cmd, "show", src / "bad_dsl.py:bad")
    assert p.returncode == 1
    first = p.stderr.splitlines()[0]
    assert re.match(re.escape(str(src / "bad_dsl.py")) + r":10:\d+: 'while' loops are not "
                    r"supported", first), p.stderr
    assert "hint: use 'for v in range(lo, hi)'" in p.stderr


def test_bounds_error_exit_1(polyad_cmd, src):
    p = run(polyad_cmd, "emit", src / "oob.py:shift", "-o", src / "oob_out")
    assert p.returncode == 1
    assert p.stderr.startswith(f"{src / 'oob.py'}:9:")
    assert "x[i + 1]" in p.stderr and "boundary mode" in p.stderr


def test_not_differentiable_exit_1(polyad_cmd, src):
    p = run(polyad_cmd, "show", src / "kernels.py:blur", "--grad", "x")
    assert p.returncode == 1
    assert p.stderr.startswith(f"{src / 'kernels.py'}:")
    assert "scalar" in p.stderr


def test_import_failure_exit_1(polyad_cmd, src):
    p = run(polyad_cmd, "show", src / "raises.py:k")
    assert p.returncode == 1
    assert "importing" in p.stderr and "NameError: name 'undefined_name' is not defined" in p.stderr
    assert f'File "{src / "raises.py"}", line 3' in p.stderr
    p = run(polyad_cmd, "show", src / "syntax.py:k")
    assert p.returncode == 1
    assert f"{src / 'syntax.py'}:1:" in p.stderr and "SyntaxError" in p.stderr


# ---- emit ------------------------------------------------------------------


def test_emit_one_kernel_and_its_gradient(polyad_cmd, src, tmp_path):
    out = tmp_path / "gen"
    p = run(polyad_cmd, "emit", src / "kernels.py:tv_cost", "-o", out)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == [str(out / "tv_cost.c"), str(out / "tv_cost.h")]
    assert p.stderr == ""                                     # one kernel: no progress display
    assert '#include "tv_cost.h"' in (out / "tv_cost.c").read_text()
    header = (out / "tv_cost.h").read_text()
    assert "void tv_cost(const double *g, const double *b, double lam, int64_t M, int64_t N, " \
           "double *C_out);" in header
    p = run(polyad_cmd, "emit", src / "kernels.py:tv_cost", "--grad", "g", "-o", out)
    assert p.returncode == 0, p.stderr
    assert (out / "tv_cost_grad_g.c").is_file() and (out / "tv_cost_grad_g.h").is_file()


def test_emit_all_with_progress(polyad_cmd, src, tmp_path):
    out = tmp_path / "all"
    p = run(polyad_cmd, "emit", src / "kernels.py", "--all", "-o", out)
    assert p.returncode == 0, p.stderr
    assert sorted(Path(x).name for x in p.stdout.split()) == \
        ["blur.c", "blur.h", "tv_cost.c", "tv_cost.h"]
    lines = p.stderr.splitlines()
    assert len(lines) == 2
    assert re.fullmatch(r"\[1/2\] emitting tv_cost \(\d+\.\d\d s\)", lines[0])
    assert re.fullmatch(r"\[2/2\] emitting blur \(\d+\.\d\d s\)", lines[1])
    p = run(polyad_cmd, "emit", src / "kernels.py", "--all", "-q", "-o", out)
    assert p.returncode == 0 and p.stderr == ""


def test_emit_into_a_file_fails_with_exit_1(polyad_cmd, src, tmp_path):
    target = tmp_path / "a_file"
    target.write_text("")
    p = run(polyad_cmd, "emit", src / "kernels.py:blur", "-o", target)
    assert p.returncode == 1
    assert p.stderr.startswith("polyad emit: error:")


# ---- demo, bench, cache, logging ----------------------------------------


def test_demo(polyad_cmd, tmp_path):
    p = run(polyad_cmd, "demo", "--size", "64")
    assert p.returncode == 0, p.stderr
    assert p.stdout.rstrip().endswith("OK")


def test_bench_runs_the_quick_suite(polyad_cmd, tmp_path):
    bench = tmp_path / "benchmarks"
    bench.mkdir()
    (bench / "run.py").write_text(
        "import json, os, sys\n"
        "print(json.dumps({'args': sys.argv[1:], 'cwd': os.getcwd()}))\n"
        "sys.exit(3 if '--fail' in sys.argv else 0)\n")
    p = run(polyad_cmd, "bench", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == {"args": ["--quick"], "cwd": str(tmp_path)}
    p = run(polyad_cmd, "bench", "--full", "--", "--fail", "x", cwd=tmp_path)
    assert p.returncode == 3                                   # the suite's own status
    assert json.loads(p.stdout)["args"] == ["--fail", "x"]


def test_bench_without_the_suite_is_a_clear_error(polyad_cmd, tmp_path):
    # a polyad installed without its source checkout: no benchmarks/ beside the package
    site = tmp_path / "site"
    shutil.copytree(REPO_ROOT / "polyad", site / "polyad",
                    ignore=shutil.ignore_patterns("__pycache__"))
    env = cli_env()
    env["PYTHONPATH"] = str(site)
    p = run(polyad_cmd, "bench", cwd=tmp_path, env=env)
    assert p.returncode == 2
    assert "the benchmark suite (benchmarks/run.py) was not found" in p.stderr
    assert "not with the wheel" in p.stderr


def test_cache_info_and_clear(polyad_cmd, tmp_path):
    cache = tmp_path / "cache"
    env = cli_env(POLYAD_CACHE_DIR=str(cache))
    compile_one = ("import numpy as np, polyad as pa\n"
                   "from kernels import blur\n"
                   "blur(np.ones(8))\n")
    shutil.copy(Path(__file__).parent / "cli_support.py", tmp_path)   # any file: not polyad's
    (tmp_path / "kernels.py").write_text(KERNELS)
    (tmp_path / "compile_one.py").write_text(compile_one)
    p = subprocess.run([sys.executable, "compile_one.py"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    (cache / "README.txt").write_text("someone else's file\n")
    p = run(polyad_cmd, "cache", "info", env=env)
    assert p.returncode == 0, p.stderr
    assert f"cache directory: {cache} ($POLYAD_CACHE_DIR)" in p.stdout
    # the library, its source, the pipeline result and the compiler's identity
    assert "compiled kernels: 1" in p.stdout and "files: 4," in p.stdout
    assert "pipeline results (IR -> schedule -> source): 1," in p.stdout
    p = run(polyad_cmd, "cache", "clear", env=env)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("removed 4 file(s), ") and str(cache) in p.stdout
    assert sorted(os.listdir(cache)) == ["README.txt"]
    p = run(polyad_cmd, "cache", "info", env=env)
    assert "compiled kernels: 0" in p.stdout


@pytest.mark.parametrize("where", ["after", "before"])
def test_verbose_logs_compiler_command_lines(polyad_cmd, tmp_path, where):
    env = cli_env(POLYAD_CACHE_DIR=str(tmp_path / "cache"))
    args = ["demo", "--size", "16", "-v"] if where == "after" else ["-v", "demo", "--size", "16"]
    p = run(polyad_cmd, *args, env=env)
    assert p.returncode == 0, p.stderr
    assert re.search(r"polyad DEBUG: compiling: \S+ .*-fopenmp.* -o \S+ \S+tv_cost_\w+\.c -lm",
                     p.stderr), p.stderr
    assert "polyad INFO: compiled tv_cost in" in p.stderr


def test_polyad_log_environment_variable(tmp_path):
    script = ("import numpy as np, polyad as pa\n"
              "from kernels import blur\n"
              "blur(np.ones(8))\n")
    (tmp_path / "kernels.py").write_text(KERNELS)
    (tmp_path / "s.py").write_text(script)
    for expect in ("polyad DEBUG: compiling:", "polyad DEBUG: cache hit"):
        env = cli_env(POLYAD_CACHE_DIR=str(tmp_path / "cache"), POLYAD_LOG="debug")
        p = subprocess.run([sys.executable, "s.py"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0 and expect in p.stderr, p.stderr
    env = cli_env(POLYAD_CACHE_DIR=str(tmp_path / "cache"))           # unset: silent
    p = subprocess.run([sys.executable, "s.py"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stderr == ""
    env["POLYAD_LOG"] = "loud"
    p = subprocess.run([sys.executable, "s.py"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.stderr.strip() == ("polyad: ignoring POLYAD_LOG='loud'; use one of debug, info, "
                                "warning, error")


def test_version(polyad_cmd):
    p = run(polyad_cmd, "--version")
    assert p.returncode == 0 and p.stdout.strip() == "polyad 0.1.0"


def test_version_is_written_in_one_place(polyad_cmd):
    """pyproject.toml, the package, the CLI and the emitted C all read polyad/version.py."""
    from setuptools.config.pyprojecttoml import read_configuration

    import polyad as pa
    from polyad.version import __version__
    config = read_configuration(REPO_ROOT / "pyproject.toml", expand=True)
    assert "version" in config["project"]["dynamic"]
    assert config["project"]["version"] == __version__ == pa.__version__
    assert run(polyad_cmd, "--version").stdout.strip() == f"polyad {__version__}"
    sources = [p for p in (REPO_ROOT / "polyad").rglob("*.py") if p.name != "version.py"]
    assert not [p for p in sources if f'"{__version__}"' in p.read_text()]


def test_installed_console_script_entry_point():
    import tomllib
    meta = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    assert meta["project"]["scripts"]["polyad"] == "polyad.cli:main"
    installed = shutil.which("polyad")
    if installed is None:
        pytest.skip("polyad is not installed in this environment (pip install -e .)")
    p = subprocess.run([installed, "--version"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.startswith("polyad ")
