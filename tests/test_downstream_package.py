"""A downstream package ships compiled kernels through ``polyad.build.ffibuilder``.

The package is the one README.md spells out (``<!-- test: file ... -->``
blocks). It is installed with pip into a fresh virtualenv (system site
packages of the environment running the tests, for islpy/cffi/numpy, made
visible through a ``.pth`` file; this checkout of polyad on PYTHONPATH), then
imported and run from elsewhere with no usable C compiler and an empty
compile cache: nothing may be compiled at import or call time.
"""

import json
import os
import site as site_module
import subprocess
import sys
import sysconfig
import venv

import numpy as np
import pytest

import polyad as pa
import polyad.ad
from cli_support import cli_env, readme_files

CHECK = r"""
import json, os, sys
import numpy as np
import tvpkg

i = np.arange(24 * 31)
g = np.sin(0.37 * i).reshape(24, 31)
b = np.cos(0.11 * i).reshape(24, 31)
result = {"file": tvpkg.__file__, "cost": tvpkg.tv_cost(g, b, 0.1),
          "grad": tvpkg.tv_cost_grad(g, b, 0.1).tolist()}
try:
    tvpkg.tv_cost(g, b[:2], 0.1)
except Exception as exc:
    result["error"] = type(exc).__name__
print(json.dumps(result))
"""


def test_package_built_with_ffibuilder_runs_without_jit(tmp_path, monkeypatch):
    if not hasattr(polyad.ad, "grad_kernel") or not hasattr(pa, "grad"):
        pytest.skip("the derivative API (polyad.ad.grad_kernel, pa.grad) is not available")
    project = tmp_path / "tvpkg-project"
    for name, text in readme_files().items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(text)
    env_dir = tmp_path / "venv"
    venv.create(env_dir, system_site_packages=False, with_pip=False)
    python = env_dir / "bin" / "python"
    # The packages of the environment running this test (pip, islpy, cffi,
    # numpy, setuptools), never the base interpreter's: on a fresh machine
    # that one has none of them.
    nested_purelib = subprocess.run([str(python), "-c", "import sysconfig; "
                                     "print(sysconfig.get_paths()['purelib'])"],
                                    capture_output=True, text=True, check=True).stdout.strip()
    parent_paths = [p for p in dict.fromkeys(site_module.getsitepackages()
                                             + [sysconfig.get_paths()["purelib"]])
                    if os.path.isdir(p)]
    with open(os.path.join(nested_purelib, "parent_env.pth"), "w") as pth:
        pth.write("\n".join(parent_paths) + "\n")
    env = cli_env(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    proc = subprocess.run([str(python), "-m", "pip", "install", "--no-build-isolation",
                           "--no-deps", "--no-index", "-q", str(project)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    cache = tmp_path / "empty-cache"
    cache.mkdir()
    run_env = cli_env(POLYAD_CACHE_DIR=str(cache), CC="/bin/false")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = subprocess.run([str(python), "-c", CHECK], cwd=elsewhere, env=run_env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], capture_output=True, text=True, check=True)
    assert result["file"].startswith(site.stdout.strip())     # the installed copy
    assert os.listdir(cache) == []                            # nothing was compiled

    i = np.arange(24 * 31)
    g = np.sin(0.37 * i).reshape(24, 31)
    b = np.cos(0.11 * i).reshape(24, 31)
    monkeypatch.chdir(tmp_path)                               # ffibuilder writes build/ here
    sys.path.insert(0, str(project))
    try:
        import build_kernels                                  # the README's kernel, JIT here
    finally:
        sys.path.remove(str(project))
        sys.modules.pop("build_kernels", None)
    assert result["cost"] == pytest.approx(build_kernels.tv_cost(g, b, 0.1), rel=1e-12)
    np.testing.assert_allclose(np.array(result["grad"]),
                               pa.grad(build_kernels.tv_cost, wrt="g")(g, b, 0.1), rtol=1e-12)
    assert result["error"] == "ShapeError"
