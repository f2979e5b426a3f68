"""The benchmark suite's baselines are correct: ``benchmarks/run.py --check``.

Only correctness (the hand-written C baselines against numpy references, the
numpy gradients against finite differences); no timing is looked at here.
"""

import os
import subprocess
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_benchmark_baselines_check(tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([REPO_ROOT] + ([env["PYTHONPATH"]]
                                                       if env.get("PYTHONPATH") else []))
    # a fresh build directory: compile the baselines as a new checkout would
    env["POLYAD_BENCH_BUILD_DIR"] = str(tmp_path / "build")
    proc = subprocess.run([sys.executable, os.path.join(REPO_ROOT, "benchmarks", "run.py"),
                           "--check"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "baseline checks passed" in proc.stdout
