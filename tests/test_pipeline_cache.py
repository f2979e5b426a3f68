"""The pipeline cache: a new process loads compiled kernels without running any stage.

Keyed by the kernel's IR (called device functions and derivative rules are
part of the derived IR), the source options, the target and polyad's version
and sources; stored atomically next to the libraries; a corrupted entry is
rebuilt.
"""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np

import polyad as pa
import polyad.pipeline as pipeline
from polyad.pipeline import Options, build_kernel, pipeline_key

M, N = pa.sizes("M N")

KERNELS = textwrap.dedent('''
    import polyad as pa
    M, N = pa.sizes("M N")

    @pa.func
    def soft(x: pa.f64) -> pa.f64:
        return pa.sqrt(x * x + 0.01)

    @pa.kernel
    def energy(g: pa.f64[M, N].clamped, b: pa.f64[M, N], lam: pa.f64) -> pa.f64:
        C = 0.0
        for m in range(M):
            for n in range(N):
                C += (g[m, n] - b[m, n]) ** 2 + lam * soft(g[m, n + 1] - g[m, n])
        return C
''')

RUN = textwrap.dedent('''
    import json, sys
    import numpy as np
    sys.path.insert(0, sys.argv[1])
    import polyad as pa
    import polyad.pipeline as pipeline
    from energy_mod import energy
    g = np.linspace(0, 1, 35).reshape(5, 7); b = g[::-1].copy()
    c = energy(g, b, 0.3)
    dg = pa.grad(energy, wrt="g")(g, b, 0.3)
    print(json.dumps({"runs": pipeline.pipeline_runs, "c": c, "dg": dg.tolist()}))
''')


def _run(tmp_path, cache):
    env = dict(os.environ, POLYAD_CACHE_DIR=str(cache),
               PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(pa.__file__)),
                                           os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", RUN, str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def test_second_process_runs_no_stage(tmp_path):
    (tmp_path / "energy_mod.py").write_text(KERNELS)
    cache = tmp_path / "cache"
    cold = _run(tmp_path, cache)
    warm = _run(tmp_path, cache)
    assert cold["runs"] == 2          # the primal and its gradient were compiled
    assert warm["runs"] == 0          # both read from the pipeline cache
    assert warm["c"] == cold["c"]
    np.testing.assert_array_equal(warm["dg"], cold["dg"])
    assert len(list(cache.glob("*.pipeline"))) == 2


def _kernel(scale):
    @pa.kernel
    def k(x: pa.f64[N], y: pa.Out(pa.f64[N])):
        for i in range(N):
            y[i] = scale * x[i]
    return k


def test_key_follows_source_options_and_version(monkeypatch):
    a, b = _kernel(2.0), _kernel(3.0)
    key = pipeline_key(a.ir, Options())
    assert pipeline_key(_kernel(2.0).ir, Options()) == key            # same source, same key
    assert pipeline_key(b.ir, Options()) != key                        # the source changed
    assert pipeline_key(a.ir, Options(deterministic=True)) != key      # an option changed
    assert pipeline_key(a.ir, Options(sanitize="address")) == key      # toolchain-only option
    monkeypatch.setattr(pipeline, "POLYAD_VERSION", "999.0")
    assert pipeline_key(a.ir, Options()) != key                        # polyad changed


def test_key_follows_called_functions_and_custom_rules():
    def make(c):
        @pa.func
        def f(x: pa.f64) -> pa.f64:
            return pa.exp(c * x)

        @pa.kernel
        def k(x: pa.f64[N]) -> pa.f64:
            s = 0.0
            for i in range(N):
                s += f(x[i])
            return s
        return f, k

    f1, k1 = make(1.0)
    f2, k2 = make(2.0)
    assert pipeline_key(k1.ir, Options()) != pipeline_key(k2.ir, Options())
    before = pipeline_key(pa.grad(k1, wrt="x").ir, Options())

    @pa.derivative(f1)
    def f1_d(x: pa.f64) -> pa.f64:
        return 7.0 * x

    after = pipeline_key(pa.grad(k1, wrt="x").ir, Options())
    assert after != before


def test_corrupted_entry_is_rebuilt(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("POLYAD_CACHE_DIR", str(tmp_path))
    k = _kernel(5.0)
    first = build_kernel(k.ir)
    (entry,) = tmp_path.glob("*.pipeline")
    entry.write_bytes(entry.read_bytes()[:40])             # truncated
    runs = pipeline.pipeline_runs
    again = build_kernel(k.ir)
    assert pipeline.pipeline_runs == runs + 1
    assert again.source == first.source
    assert "unreadable" in caplog.text
    entry.write_bytes(b"not a pickle at all")
    fn = pa.compile(_kernel(5.0))                          # a fresh Kernel reads the entry
    x = np.arange(4.0)
    np.testing.assert_array_equal(fn(x), 5.0 * x)


def test_cache_info_shows_both_levels(tmp_path, monkeypatch, capsys):
    from polyad.cli import main
    monkeypatch.setenv("POLYAD_CACHE_DIR", str(tmp_path))
    pa.compile(_kernel(11.0))
    assert main(["cache", "info"]) == 0
    out = capsys.readouterr().out
    assert "pipeline results (IR -> schedule -> source): 1" in out
    assert "compiled libraries: 1" in out


def test_stage_times_are_logged(tmp_path, monkeypatch, caplog):
    import logging
    monkeypatch.setenv("POLYAD_CACHE_DIR", str(tmp_path))
    with caplog.at_level(logging.INFO, logger="polyad"):
        pa.compile(_kernel(13.0))
    stages = [r.getMessage() for r in caplog.records if r.getMessage().startswith("compile k:")]
    assert any(": dependences " in s for s in stages)
    assert any(": ast " in s for s in stages)
    assert any(": emit " in s for s in stages)


def test_long_compile_shows_a_progress_line(monkeypatch):
    import io
    from polyad import progress
    monkeypatch.setattr(progress, "LONG_COMPILE_S", 0.0)

    class Tty(io.StringIO):
        def isatty(self):
            return True

    out = Tty()
    clock = progress.StageClock("big_kernel", stream=out)
    with clock.stage("dependences", 27):
        pass
    clock.close()
    text = out.getvalue()
    assert "polyad: compiling big_kernel: dependences (27 statements," in text
    assert "polyad: compiled big_kernel in" in text


def test_a_second_kernel_of_the_same_ir_reuses_the_artifact(tmp_path, monkeypatch):
    """A second kernel object of the same IR (a vjp of a kernel object made anew; the
    test suite's helpers, which go through ``artifact_of``) gets the first one's artifact
    in one process, nothing scheduled again, as long as the cache directory is the
    same one."""
    import polyad.api
    monkeypatch.setenv("POLYAD_CACHE_DIR", str(tmp_path / "one"))
    pipeline.recent_artifacts.clear()
    calls = []
    fresh = pipeline.compile_kernel
    monkeypatch.setattr(polyad.api, "compile_kernel", lambda *a: calls.append(a) or fresh(*a))
    k = _kernel(17.0)

    def vjp():
        return pa.vjp(pa.Kernel(ir_kernel=k.ir), ["x"])
    first = vjp().artifact(Options())
    again = vjp()
    assert again.artifact(Options()) is first and len(calls) == 1
    assert pa.explain(vjp()) == pa.explain(again) and len(calls) == 1
    assert again.artifact(Options(deterministic=True)) is not first and len(calls) == 2
    monkeypatch.setenv("POLYAD_CACHE_DIR", str(tmp_path / "two"))
    assert again.artifact(Options()) is first  # an object keeps its own artifacts
    assert vjp().artifact(Options()) is not first and len(calls) == 3
    # bounded: the least recently used artifact goes first
    monkeypatch.setattr(pipeline.recent_artifacts, "bound", 2)
    vjp().artifact(Options(fuse=False))
    assert len(pipeline.recent_artifacts) == 2 and len(calls) == 4


def test_the_source_is_read_without_the_c_compiler(tmp_path, monkeypatch):
    """``kernel.source`` is the pipeline's text: from the pipeline cache in a process that
    did not make it, else made, and no C compiler runs for it; once the kernel is
    compiled, the source of its build."""
    from polyad.runtime import toolchain
    monkeypatch.setenv("POLYAD_CACHE_DIR", str(tmp_path))
    pipeline.recent_artifacts.clear()
    builds = []
    cached_build = toolchain._cached_build
    monkeypatch.setattr(toolchain, "_cached_build",
                        lambda *a, **kw: builds.append(a[1]) or cached_build(*a, **kw))
    k = _kernel(19.0)
    runs = pipeline.pipeline_runs
    src = k.source
    assert "19.0 * x[i]" in src and builds == [] and pipeline.pipeline_runs == runs + 1
    # a new kernel object of the same IR, in a process without the artifact: the cache
    pipeline.recent_artifacts.clear()
    assert pa.Kernel(ir_kernel=k.ir).source == src and pipeline.pipeline_runs == runs + 1
    assert builds == []
    assert pa.compile(k).source == src and len(builds) == 1
    assert k.source == src and len(builds) == 1
