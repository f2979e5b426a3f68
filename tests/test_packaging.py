"""The sdist carries what its tests read and the LICENSE; the wheel carries the LICENSE
and the package (with the bridges) but not the tests."""

import shutil
import subprocess
import sys
import tarfile
import zipfile

import pytest

from cli_support import REPO_ROOT

# setuptools' build_meta rewrites sys.argv: read the output directory first.
BUILD = ("import sys; from setuptools import build_meta as b; out = sys.argv[1]; "
         "s = b.build_sdist(out); w = b.build_wheel(out); print('BUILT', s, w)")


@pytest.fixture(scope="module")
def dists(tmp_path_factory):
    src = tmp_path_factory.mktemp("src") / "polyad"
    tracked = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                             cwd=REPO_ROOT, capture_output=True, text=True)
    if tracked.returncode != 0:
        pytest.skip("not a git checkout")
    for name in tracked.stdout.split():
        if (REPO_ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO_ROOT / name, src / name)
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run([sys.executable, "-c", BUILD, str(out)], cwd=src,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sdist, wheel = proc.stdout.split("BUILT ")[-1].split()
    return tracked.stdout.split(), out / sdist, out / wheel


def test_sdist_has_what_the_tests_read(dists):
    tracked, sdist, _ = dists
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    needed = [t for t in tracked if t.startswith(("tests/", "docs/", "examples/", "benchmarks/"))
              and not t.endswith(".gitignore")]
    needed += ["README.md", "LICENSE", "pyproject.toml"]
    missing = [n for n in needed if n not in names]
    assert not missing, missing


def test_wheel_has_license_and_package_not_tests(dists):
    _, _, wheel = dists
    with zipfile.ZipFile(wheel) as whl:
        names = whl.namelist()
        meta = whl.read(next(n for n in names if n.endswith("dist-info/METADATA"))).decode()
    assert any(n.endswith("dist-info/licenses/LICENSE") for n in names)
    for module in ("polyad/torch.py", "polyad/jax.py", "polyad/functional.py",
                   "polyad/runtime/arrays.py", "polyad/frontend/sources.py"):
        assert module in names
    assert not any(n.startswith("tests/") for n in names)
    assert "Provides-Extra: torch" in meta and "Provides-Extra: jax" in meta
    assert "torch==2.13.0" in meta
