"""The README's snippets run as written.

Python blocks without annotation run in order as one script (later blocks
continue the earlier ones, as a reader would); ``<!-- test: sh -->`` blocks
run with bash; ``<!-- test: file NAME -->`` blocks are the downstream
package that ``test_downstream_package.py`` builds and installs.
"""

import shutil
import subprocess
import sys

import pytest

import polyad as pa
import polyad.ad
from cli_support import REPO_ROOT, cli_env, console_script, readme_blocks, readme_files


@pytest.fixture
def workdir(tmp_path):
    shutil.copytree(REPO_ROOT / "examples", tmp_path / "examples")
    return tmp_path


def test_readme_keeps_the_two_commands_at_the_top():
    first = readme_blocks()[0]
    assert first.lang == "sh" and not first.annotation
    assert "pip install -e . && python -m polyad demo" in first.text
    assert 'pip install -e ".[test]" && python -m pytest -q -n auto' in first.text


def test_ci_runs_the_readmes_test_command():
    ci_script = (REPO_ROOT / ".ci" / "run").read_text()
    assert "python -m pytest -q -n auto\n" in ci_script


def test_readme_python_snippets_run(workdir):
    if not hasattr(pa, "grad"):
        pytest.skip("pa.grad (the derivative API) is not part of polyad yet")
    blocks = [b for b in readme_blocks() if b.lang == "python" and not b.annotation]
    assert len(blocks) >= 3
    script = "".join(f"# ---- README.md line {b.line} ----\n{b.text}\n" for b in blocks)
    (workdir / "readme_snippets.py").write_text(script)
    proc = subprocess.run([sys.executable, "readme_snippets.py"], cwd=workdir, env=cli_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "#pragma omp parallel for" in proc.stdout          # tv_cost.source
    assert "AST and loop decisions" in proc.stdout            # pa.explain(tv_cost)


def test_readme_shell_snippets_run(workdir):
    if not hasattr(polyad.ad, "grad_kernel"):
        pytest.skip("polyad.ad.grad_kernel (reverse mode) is not part of polyad yet")
    blocks = [b for b in readme_blocks() if b.lang == "sh" and b.annotation == "sh"]
    assert len(blocks) >= 2
    bin_dir = workdir / "bin"
    console_script(bin_dir)
    for b in blocks:
        proc = subprocess.run(["bash", "-e", "-c", b.text], cwd=workdir, env=cli_env(bin_dir),
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"README.md line {b.line}:\n{proc.stderr[-4000:]}"
    assert (workdir / "tv_grad.dot").read_text().startswith('digraph "tv_cost_grad_g"')
    for name in ("tv_cost", "tv_cost_grad_g"):
        assert (workdir / "kernels" / f"{name}.h").is_file()
        assert (workdir / "kernels" / f"{name}.o").is_file()


def test_readme_spells_out_the_downstream_package():
    files = readme_files()
    assert set(files) == {"build_kernels.py", "setup.py", "pyproject.toml", "tvpkg/__init__.py"}
    assert 'cffi_modules=["build_kernels.py:ffibuilder"]' in files["setup.py"]
    assert 'load("tvpkg._kernels")' in files["tvpkg/__init__.py"]


def test_readme_report_excerpt_is_current():
    import importlib.util
    spec = importlib.util.spec_from_file_location("readme_tv", REPO_ROOT / "examples" / "tv.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    report_lines = pa.explain(module.tv_cost).split("\n")
    (excerpt,) = [b for b in readme_blocks() if b.lang == "text"]
    for line in excerpt.text.rstrip("\n").split("\n"):
        if line.strip() != "...":
            assert line in report_lines, f"README.md line {excerpt.line}: {line!r}"
