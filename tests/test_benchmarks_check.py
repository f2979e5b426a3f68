"""The benchmark suite's baselines are correct: ``benchmarks/run.py --check``; its
report computes a gradient's share of the triad as its columns say.

Only correctness (the hand-written C baselines against numpy references, the
numpy gradients against finite differences, the report's arithmetic on given
times); no timing is looked at here.
"""

import os
import subprocess
import sys
import textwrap

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


REPORT_SCRIPT = textwrap.dedent('''
    import re
    import numpy as np
    import run, stream

    # the in-round triad computes a = b + 3 c over whole elements, 24 bytes each
    triad = stream.Triad(24 * 1000 + 7)
    assert triad.n == 1000 and triad.nbytes == 24000
    triad()
    assert np.all(triad.a == 2.0 + 3.0 * 0.5)
    assert triad.gbs(1e-3) == 24000 / 1e-3 / 1e9

    # a gradient of 100 MB minimal traffic in 10 ms: 10 GB/s, half of the run's best
    # triad (20 GB/s), 62.5 % of the triad timed in its rounds (16 GB/s)
    def row(impl, fwd, grad):
        return {"impl": impl, "note": "", "fwd": fwd, "grad": grad, "fwd_na": None,
                "grad_na": None, "err_fwd": 0.0, "err_grad": 0.0, "first_s": 0.0,
                "fwd_ratio": 1.0, "grad_ratio": 1.0, "grad_over_fwd": grad / fwd,
                "fwd_gbs": 50e6 / fwd / 1e9, "grad_gbs": 100e6 / grad / 1e9}
    res = {"bench": "deconv", "title": "t", "size": 2048, "dtype": "f64",
           "shape": "2048x2048", "fwd_bytes": 50e6, "grad_bytes": 100e6,
           "rows": [row("hand-written C", 0.008, 0.025), row("polyad", 0.005, 0.010)],
           "triad_gbs": 16.0, "triad_n": 15}
    run.add_bandwidth(res, 20.0)
    polyad = res["rows"][1]
    assert abs(polyad["grad_bw"] - 0.5) < 1e-12
    assert abs(polyad["grad_bw_rounds"] - 0.625) < 1e-12
    text = run.format_case(res)
    assert ("STREAM triad in these rounds: 16.0 GB/s (15 rounds; the run's best 20.0); "
            "of it, the gradients: hand-written C 25%, polyad 62%") in text, text
    line = run.triad_share_target(res)
    assert "polyad grad at 62% of the triad in its rounds (PASS >= 50%), 50% of the run's best" \
        in line, line
    res["triad_gbs"] = 25.0
    run.add_bandwidth(res, 20.0)
    assert "at 40% of the triad in its rounds (FAIL >= 50%)" in run.triad_share_target(res)
    assert re.fullmatch(r"(, L\\d (\\d+ MiB|\\d+ KiB))?", run.last_level_cache())
    print("REPORT-OK")
''')


def _run_with_benchmarks(tmp_path, script: str, ok: str) -> None:
    """Run ``script`` in a fresh interpreter that imports the benchmarks' modules (their
    C built into ``tmp_path``); it must print ``ok``."""
    env = dict(os.environ)
    env["POLYAD_BENCH_BUILD_DIR"] = str(tmp_path / "build")
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(REPO_ROOT, "benchmarks"), REPO_ROOT]
                                        + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0 and ok in proc.stdout, proc.stdout + proc.stderr


def test_report_shares_of_the_triad(tmp_path):
    """The gradients' shares of the run's best triad and of the triad timed in their own
    rounds, in the table's line and in issue #10's target line."""
    _run_with_benchmarks(tmp_path, REPORT_SCRIPT, "REPORT-OK")


PEAK_SCRIPT = textwrap.dedent('''
    import os
    import run, peak, suite

    # chains sized for the unit: half its registers, each a vector of lanes
    os.environ["POLYAD_VECTOR_UNIT"] = "256x16"
    assert peak.lanes() == {"f32": 64, "f64": 32}
    os.environ["POLYAD_VECTOR_UNIT"] = "512x32"
    assert peak.lanes() == {"f32": 256, "f64": 128}
    del os.environ["POLYAD_VECTOR_UNIT"]
    rates = peak.measure(repeats=2, seconds=0.01)
    assert set(rates) == {"f32", "f64"} and all(0 < r < 1e6 for r in rates.values()), rates

    # the conv layer counts its multiply-adds: 2 operations for each of B * CO * H * W
    # outputs of CI * 9 taps; the gradient wrt w and x three times that, wrt w alone twice
    case = suite.make_case("conv", 64, "f32")
    assert case.fwd_flops == 2 * (4 * 8 * 16 * 16) * (4 * 9), case.fwd_flops
    assert case.grad_flops == 3 * case.fwd_flops
    assert suite.make_case("conv_w", 64, "f32").grad_flops == 2 * case.fwd_flops
    assert suite.make_case("tv", 64, "f32").fwd_flops == 0

    # 100 GFLOP/s of peak; polyad's forward of 1 GFLOP in 40 ms (25 %), its gradient of
    # 3 GFLOP in 100 ms (30 %): g/f 2.5 would need 1.2x the forward's share, it has 1.2x
    def row(impl, fwd, grad):
        return {"impl": impl, "note": "", "fwd": fwd, "grad": grad, "fwd_na": None,
                "grad_na": None, "err_fwd": 0.0, "err_grad": 0.0, "first_s": 0.0,
                "fwd_ratio": 1.0, "grad_ratio": 1.0, "grad_over_fwd": grad / fwd,
                "fwd_gbs": 1.0, "grad_gbs": 1.0}
    res = {"bench": "conv", "title": "t", "size": 2048, "dtype": "f32",
           "shape": "B=4 4->8ch 512x512", "fwd_bytes": 50e6, "grad_bytes": 60e6,
           "fwd_flops": 1e9, "grad_flops": 3e9,
           "rows": [row("hand-written C", 0.05, 0.2), row("polyad", 0.04, 0.1)]}
    run.add_bandwidth(res, 20.0)
    run.add_peak(res, {"f32": 100.0, "f64": 50.0})
    polyad = res["rows"][1]
    assert abs(polyad["fwd_peak"] - 0.25) < 1e-12 and abs(polyad["grad_peak"] - 0.3) < 1e-12
    text = run.format_case(res)
    assert ("multiply-adds: fwd 500 M, grad 1500 M (3x); of the f32 multiply-add peak "
            "(100 GFLOP/s, this run): hand-written C fwd 20%, grad 15%; polyad fwd 25%, "
            "grad 30%") in text, text
    line = run.conv_targets(res)
    assert ("grad/fwd = 2.50 (PASS <= 2.5) (its multiply-adds 3x the forward's: 2.5 asks for "
            "1.20x the forward's share of the peak; it has 1.20x)") in line, line
    print("PEAK-OK")
''')


def test_report_shares_of_the_multiply_add_peak(tmp_path):
    """The conv layer's kernels as shares of the multiply-add peak measured in the same
    run, and what its grad/fwd target asks of the gradient's share."""
    _run_with_benchmarks(tmp_path, PEAK_SCRIPT, "PEAK-OK")


def _run_flags(tmp_path, *args):
    env = dict(os.environ, POLYAD_CACHE_DIR=str(tmp_path / "cache"))
    env["PYTHONPATH"] = os.pathsep.join([REPO_ROOT] + ([env["PYTHONPATH"]]
                                                       if env.get("PYTHONPATH") else []))
    return subprocess.run([sys.executable, os.path.join(REPO_ROOT, "benchmarks", "flags.py"),
                           *args], env=env, capture_output=True, text=True, timeout=300)


def test_flags_compares_builds_that_agree_and_refuses_flags_it_cannot_change(tmp_path):
    """``benchmarks/flags.py`` builds the TV kernel and gradient with and without
    ``-fno-trapping-math``, finds their results bit-identical and prints one row; a flag
    polyad does not pass, or no change at all, is refused with a message."""
    proc = _run_flags(tmp_path, "--without=-fno-trapping-math", "--bench", "tv", "--sizes",
                      "64", "--dtype", "f64", "--rounds", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "changed: without -fno-trapping-math" in proc.stdout
    assert "results differ" not in proc.stdout, proc.stdout
    rows = [line for line in proc.stdout.splitlines() if line.startswith("tv 64x64 f64")]
    assert len(rows) == 1 and len(rows[0].split()) == 9, proc.stdout
    refused = _run_flags(tmp_path, "--without=-O3")
    assert refused.returncode == 2 and "not among polyad's arithmetic flags" in refused.stderr
    nothing = _run_flags(tmp_path)
    assert nothing.returncode == 2 and "name a flag to leave out" in nothing.stderr


CONV_LOOP_FORMS_SCRIPT = textwrap.dedent('''
    import conv_loop_forms

    errors = conv_loop_forms.errors()
    assert {"plain 1", "plain 4", "vector 4", "vector 8"} <= set(errors), errors
    assert all(e < 1e-6 for e in errors.values()), errors
    rates = conv_loop_forms.rates(passes=16, rounds=1)
    assert set(rates) == set(errors) and all(r > 0 for r in rates.values()), rates
    print("FORMS-OK")
''')


def test_the_conv_loop_forms_compute_the_same_sums(tmp_path):
    """``benchmarks/conv_loop_forms.c`` (the conv layer's inner loop as polyad prints it,
    with vector types, with AVX-512 intrinsics where the CPU has them), built with
    polyad's flags by ``conv_loop_forms.py``: one pass of every form is within float32
    rounding of the sums in float64, and every form can be timed."""
    _run_with_benchmarks(tmp_path, CONV_LOOP_FORMS_SCRIPT, "FORMS-OK")
