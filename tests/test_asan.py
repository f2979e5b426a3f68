"""Kernels built with -fsanitize=address run clean (no out-of-bounds access)
for every boundary mode, index transforms, dropped writes and a reduction.

An ASan-instrumented shared library only loads into a process that was started
with the ASan runtime preloaded, so the kernels run in a subprocess.
"""

import os
import subprocess
import sys
import textwrap
from dataclasses import replace

import pytest

from polyad.pipeline import artifact_of, build_kernel, kernel_ir
from tests.fuzz.runner import asan_preload, libasan

SCRIPT = textwrap.dedent(
    '''
    import numpy as np
    import polyad as pa

    M, N = pa.sizes("M N")
    PAD = {"clamped": "edge", "circular": "wrap", "mirror": "reflect", "zero": "constant"}


    def shifted(x, offsets, mode):
        p = max(abs(o) for o in offsets)
        xp = np.pad(x, p, mode=PAD[mode])
        return xp[tuple(slice(p + o, p + o + n) for o, n in zip(offsets, x.shape))]


    @pa.kernel
    def st_clamped(x: pa.f64[M, N].clamped, y: pa.Out(pa.f64[M, N])):
        for m in range(M):
            for n in range(N):
                y[m, n] = x[m - 3, n + 3] + 2.0 * x[m + 2, n - 1] - x[m + 3, n - 3]


    @pa.kernel
    def st_circular(x: pa.f64[M, N].circular, y: pa.Out(pa.f64[M, N])):
        for m in range(M):
            for n in range(N):
                y[m, n] = x[m - 3, n + 3] + 2.0 * x[m + 2, n - 1] - x[m + 3, n - 3]


    @pa.kernel
    def st_mirror(x: pa.f64[M, N].mirror, y: pa.Out(pa.f64[M, N])):
        for m in range(M):
            for n in range(N):
                y[m, n] = x[m - 3, n + 3] + 2.0 * x[m + 2, n - 1] - x[m + 3, n - 3]


    @pa.kernel
    def st_zero(x: pa.f64[M, N].zero, y: pa.Out(pa.f64[M, N])):
        for m in range(M):
            for n in range(N):
                y[m, n] = x[m - 3, n + 3] + 2.0 * x[m + 2, n - 1] - x[m + 3, n - 3]


    @pa.kernel
    def st_f32_1d(x: pa.f32[N].mirror, y: pa.Out(pa.f32[N])):
        for i in range(N):
            y[i] = x[i - 2] + x[i + 3]


    @pa.kernel
    def transform(x: pa.f64[2 * M + 21, 4 * N], y: pa.Out(pa.f64[M, N])):
        for m in range(M):
            for n in range(N):
                y[m, n] = x[2 * m + 20, 4 * n + 3]


    @pa.kernel
    def drop_writes(x: pa.f64[N], y: pa.Out(pa.f64[N].zero)):
        for i in range(N):
            y[i + 2] = x[i]


    @pa.kernel
    def clamp_accumulate(x: pa.f64[N], y: pa.f64[N].clamped):
        for i in range(N):
            y[i - 3] += x[i]


    @pa.kernel
    def total(x: pa.f64[M, N]) -> pa.f64:
        s = 0.0
        for m in range(M):
            for n in range(N):
                s += x[m, n]
        return s


    @pa.kernel
    def blur_tmp(x: pa.f64[N].clamped, y: pa.Out(pa.f64[N])):
        t = pa.zeros(pa.f64[N + 2])
        for i in range(N):
            t[i + 1] = x[i - 1] + x[i + 1]
        t[0] = t[1]
        t[N + 1] = t[N]
        for i in range(N):
            y[i] = t[i] + t[i + 2]


    def main():
        rng = np.random.default_rng(1)
        for shape in [(4, 5), (7, 6)]:
            x = rng.standard_normal(shape)
            for mode, k in [("clamped", st_clamped), ("circular", st_circular),
                            ("mirror", st_mirror), ("zero", st_zero)]:
                c = pa.compile(k, sanitize="address")
                ref = (shifted(x, [-3, 3], mode) + 2.0 * shifted(x, [2, -1], mode)
                       - shifted(x, [3, -3], mode))
                np.testing.assert_allclose(c(x), ref, rtol=1e-12, atol=1e-12, err_msg=mode)
            s = pa.compile(total, sanitize="address")(x)
            assert abs(float(s) - x.sum()) < 1e-10, (s, x.sum())

        x32 = rng.standard_normal(6).astype(np.float32)
        y32 = pa.compile(st_f32_1d, sanitize="address")(x32)
        np.testing.assert_allclose(
            y32, shifted(x32, [-2], "mirror") + shifted(x32, [3], "mirror"), rtol=1e-5)

        xt = rng.standard_normal((2 * 3 + 21, 4 * 5))
        np.testing.assert_array_equal(
            pa.compile(transform, sanitize="address")(xt), xt[20:25:2, 3::4])

        x1 = rng.standard_normal(7)
        y1 = np.zeros(7)
        pa.compile(drop_writes, sanitize="address")(x1, y1)
        np.testing.assert_array_equal(y1, np.concatenate([[0.0, 0.0], x1[:5]]))

        y2 = np.zeros(7)
        pa.compile(clamp_accumulate, sanitize="address")(x1, y2)
        ref2 = np.zeros(7)
        ref2[0] = x1[:4].sum()
        ref2[1:4] = x1[4:]
        np.testing.assert_allclose(y2, ref2, rtol=1e-12, atol=1e-12)

        t = shifted(x1, [-1], "clamped") + shifted(x1, [1], "clamped")
        np.testing.assert_allclose(
            pa.compile(blur_tmp, sanitize="address")(x1),
            shifted(t, [-1], "clamped") + shifted(t, [1], "clamped"), rtol=1e-12)
        print("ASAN-SCRIPT-OK")


    if __name__ == "__main__":
        main()
    '''
)

# The benchmark gradients (benchmarks/kernels.py, float64; the tests' copies of those
# kernels) whose emitted code the simplification and loop-order passes rewrite: run
# instrumented on small and degenerate shapes, compared with the reference interpreter.
GRADIENT_SCRIPT = textwrap.dedent(
    '''
    import numpy as np
    import polyad as pa
    from polyad.testing import interpret

    from deconv_kernels import deconvolution
    from test_border_pieces import stencil7
    from test_loop_order import conv_cost
    from tv_kernel import tv_cost

    deconv_cost = deconvolution("f64")


    def check(kernel, wrt, args, sizes, fuse=False):
        grad = pa.grad(kernel, wrt=wrt)
        got = pa.compile(grad, sanitize="address", fuse=fuse)(*[a.copy() if isinstance(a, np.ndarray)
                                                     else a for a in args.values()])
        got = got if isinstance(got, tuple) else (got,)
        _, want = interpret(grad.ir, {k: (v.copy() if isinstance(v, np.ndarray) else v)
                                      for k, v in args.items()}, sizes)
        for name, value in zip(wrt, got):
            np.testing.assert_allclose(value, want["d_" + name], rtol=1e-12, atol=1e-12,
                                       err_msg=f"{kernel.__name__} d_{name} {sizes}")


    def main():
        rng = np.random.default_rng(2)
        for m, n in [(1, 1), (1, 3), (2, 2), (3, 4), (5, 6), (9, 11)]:
            check(tv_cost, ["g"], dict(g=rng.standard_normal((m, n)),
                                       b=rng.standard_normal((m, n)), lam=0.3), dict(M=m, N=n))
            check(deconv_cost, ["x", "f"], dict(x=rng.standard_normal((m, n)),
                                                f=rng.standard_normal(5),
                                                y=rng.standard_normal((m, n))), dict(M=m, N=n))
        # fused through row buffers (schedule.fusion): one chunk, and several with a remainder;
        # the version for small sizes (M < 10 or N < 6) and the one for large
        for m, n in [(1, 1), (3, 4), (9, 11), (10, 5), (10, 6), (139, 6)]:
            check(deconv_cost, ["x", "f"], dict(x=rng.standard_normal((m, n)),
                                                f=rng.standard_normal(5),
                                                y=rng.standard_normal((m, n))), dict(M=m, N=n),
                  fuse=True)
        # the taps of kw unrolled into the row loop, peeled at both ends (W = 2, 3: the
        # peeled ends meet); the filter gradient's sums blocked by 2 output channels, the
        # last block peeled where CO is odd (CO = 3, with whole blocks of lanes at W = 41);
        # the recomputed sums in blocks of 4 output channels, with channels left over
        # (CO = 5) and without (CO = 8); the d_x gather in blocks of 4 input channels
        # (CI = 4, 5)
        for b, ci, co, h, w in [(1, 1, 1, 1, 1), (1, 1, 2, 3, 2), (1, 2, 1, 2, 3),
                                (1, 2, 3, 2, 5), (2, 2, 2, 4, 37), (1, 2, 3, 4, 41),
                                (1, 2, 5, 4, 19), (1, 1, 8, 3, 9), (1, 5, 4, 4, 19)]:
            check(conv_cost, ["w", "x"], dict(x=rng.standard_normal((b, ci, h, w)),
                                              w=rng.standard_normal((co, ci, 3, 3)),
                                              y=rng.standard_normal((b, co, h, w))),
                  dict(B=b, CI=ci, CO=co, H=h, W=w))
        # the forward's sums in blocks of 4 output channels (borders, whole blocks, the
        # channels left over)
        cost = pa.compile(conv_cost, sanitize="address")
        for b, ci, co, h, w in [(1, 1, 1, 1, 1), (1, 2, 4, 2, 3), (2, 1, 5, 4, 19),
                                (1, 2, 9, 3, 33)]:
            args = dict(x=rng.standard_normal((b, ci, h, w)),
                        w=rng.standard_normal((co, ci, 3, 3)),
                        y=rng.standard_normal((b, co, h, w)))
            want, _ = interpret(conv_cost.ir, args, dict(B=b, CI=ci, CO=co, H=h, W=w))
            np.testing.assert_allclose(cost(**args), want, rtol=1e-12)
        # wrt x alone: the zeroing of d_x runs row by row before the gather's taps
        for b, ci, co, h, w in [(1, 1, 1, 1, 1), (1, 2, 3, 2, 5), (2, 2, 2, 4, 37),
                                (1, 4, 2, 3, 9)]:
            check(conv_cost, ["x"], dict(x=rng.standard_normal((b, ci, h, w)),
                                         w=rng.standard_normal((co, ci, 3, 3)),
                                         y=rng.standard_normal((b, co, h, w))),
                  dict(B=b, CI=ci, CO=co, H=h, W=w))
        # the 3-D stencil's gradient, fused through plane buffers: its version for small
        # sizes (X < 6, Y < 4 or Z < 4) and the one for large, on either side of each bound
        for p, m, n in [(1, 1, 1), (5, 4, 4), (6, 3, 5), (6, 4, 3), (6, 4, 4), (70, 5, 6)]:
            check(stencil7, ["x"], dict(x=rng.standard_normal((p, m, n)),
                                        y=rng.standard_normal((p, m, n))),
                  dict(X=p, Y=m, Z=n), fuse=True)
        print("ASAN-SCRIPT-OK")


    if __name__ == "__main__":
        main()
    '''
)





def prebuild_pipelines(cache_dir, kernels) -> None:
    """Run the pipeline of each ``(kernel, Options)`` of ``kernels`` in this process and
    store its build in the pipeline cache at ``cache_dir``, with the build of the unfused
    schedule a call may switch to (``Build.chunked_extents``), as ``pa.compile`` would.

    A script under ASan then finds them there: only the generated code is instrumented,
    but ISL runs slower under ASan's allocator (the benchmark gradients took 13-27 s
    there, 8-11 s in a plain process). The artifacts are made in this process's own
    cache context, so the tests of a worker share them."""
    todo, done = list(kernels), []
    while todo:
        kernel, options = todo.pop(0)
        art = artifact_of(kernel, options)
        done.append((kernel, options, art))
        if art.build.chunked_extents and options.fuse is None:
            todo.append((kernel, replace(options, fuse=False)))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("POLYAD_CACHE_DIR", str(cache_dir))
        for kernel, options, art in done:
            build_kernel(kernel_ir(kernel), options, art)


def run_script_under_asan(tmp_path, repo_root, script_text: str, marker: str,
                          prebuilt=()) -> str:
    """Run ``script_text`` as a Python script with libasan preloaded, polyad from
    ``repo_root``, the tests' modules importable and a fresh cache under ``tmp_path``;
    assert it exits cleanly,
    reports nothing and prints ``marker``; returns its output. Skips without libasan.

    ``prebuilt``: the ``(kernel, Options)`` pairs the script compiles, built here first
    (``prebuild_pipelines``); the script must then run no pipeline of its own (asserted:
    a pair left out would make the test slow, not wrong)."""
    if libasan() is None:
        pytest.skip("gcc with libasan not available")
    if prebuilt:
        prebuild_pipelines(tmp_path / "cache", prebuilt)
        script_text += ('\nimport polyad.pipeline\n'
                        'print("PIPELINE-RUNS", polyad.pipeline.pipeline_runs)\n')
    script = tmp_path / "asan_script.py"
    script.write_text(script_text)
    env = dict(os.environ, LD_PRELOAD=asan_preload(), ASAN_OPTIONS="detect_leaks=0",
               POLYAD_CACHE_DIR=str(tmp_path / "cache"))
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    env["PYTHONPATH"] = os.pathsep.join([repo_root, tests_dir]
                                        + [p for p in [env.get("PYTHONPATH")] if p])
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=600, cwd=str(tmp_path))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "AddressSanitizer" not in out, out
    assert marker in proc.stdout, out
    if prebuilt:
        assert "PIPELINE-RUNS 0\n" in proc.stdout, out
    return out


def _instrumented_libraries(cache) -> None:
    """Where ``cache`` holds shared libraries, the sanitized ones are instrumented."""
    libs = [os.path.join(r, f) for r, _, fs in os.walk(cache) for f in fs if f.endswith(".so")]
    if libs:
        assert any(b"__asan" in open(p, "rb").read() for p in libs), libs


def test_asan_kernels_clean(tmp_path, repo_root):
    run_script_under_asan(tmp_path, repo_root, SCRIPT, "ASAN-SCRIPT-OK")
    _instrumented_libraries(tmp_path / "cache")


def test_asan_gradients_clean(tmp_path, repo_root):
    # imported here: test_border_pieces imports this module
    from deconv_kernels import deconvolution
    from test_border_pieces import stencil7
    from test_loop_order import conv_cost
    from tv_kernel import tv_cost
    import polyad as pa
    from polyad.pipeline import Options

    asan = Options(sanitize="address")
    prebuilt = [(pa.grad(k, wrt=wrt), replace(asan, fuse=fuse))
                for k, wrt, fuse in [(tv_cost, ["g"], False),
                                     (deconvolution("f64"), ["x", "f"], False),
                                     (deconvolution("f64"), ["x", "f"], True),
                                     (conv_cost, ["w", "x"], False),
                                     (conv_cost, ["x"], False),
                                     (stencil7, ["x"], True)]] + [(conv_cost, asan)]
    run_script_under_asan(tmp_path, repo_root, GRADIENT_SCRIPT, "ASAN-SCRIPT-OK", prebuilt)
    _instrumented_libraries(tmp_path / "cache")


STREAMED_SCRIPT = textwrap.dedent(
    '''
    import dataclasses

    import numpy as np
    import polyad as pa
    from polyad.testing import interpret

    from deconv_kernels import deconvolution
    from test_output_pool import blur_rows

    deconv = pa.Kernel(ir_kernel=dataclasses.replace(deconvolution("f64").ir,
                                                     name="deconv_asan_streamed"))
    blur = pa.Kernel(ir_kernel=dataclasses.replace(blur_rows.ir, name="blur_asan_streamed"))


    def main():
        rng = np.random.default_rng(3)
        grad = pa.grad(deconv, wrt=["x", "f"])
        k = pa.compile(grad, sanitize="address")
        assert "pa_stream_f64x" in k.source
        for m, n in [(1, 1), (3, 17), (9, 11), (10, 6), (12, 40), (70, 37)]:
            x, f, y = (rng.standard_normal((m, n)), rng.standard_normal(5),
                       rng.standard_normal((m, n)))
            d_x, d_f = k(x, f, y)
            _, want = interpret(grad.ir, dict(x=x, f=f, y=y), dict(M=m, N=n))
            np.testing.assert_allclose(d_x, want["d_x"], rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(d_f, want["d_f"], rtol=1e-12, atol=1e-10)
        b = pa.compile(blur, sanitize="address")
        for m, n in [(1, 1), (2, 7), (3, 8), (4, 9), (5, 33)]:
            x = rng.standard_normal((m, n))
            _, want = interpret(blur.ir, dict(x=x), dict(M=m, N=n))
            np.testing.assert_allclose(b(x), want["out"], rtol=1e-15, atol=1e-15)
        print("ASAN-SCRIPT-OK")


    main()
    ''')


def test_asan_streamed_stores_clean(tmp_path, repo_root, monkeypatch):
    """The streamed branch of a large output's rows (``LoopPlan.stream``: an aligned
    head, vectors of lanes, a tail) under ASan: the builds are made here with the
    thresholds lowered to one element and no iteration, so that every size takes it."""
    import dataclasses

    from deconv_kernels import deconvolution
    from test_output_pool import blur_rows
    import polyad as pa
    from polyad.pipeline import Options
    from polyad.target import openmp

    monkeypatch.setattr(openmp, "last_level_cache_bytes", lambda: 1)
    monkeypatch.setattr(openmp, "STREAM_ROW_VECTORS", 0)
    deconv = pa.Kernel(ir_kernel=dataclasses.replace(deconvolution("f64").ir,
                                                     name="deconv_asan_streamed"))
    blur = pa.Kernel(ir_kernel=dataclasses.replace(blur_rows.ir, name="blur_asan_streamed"))
    asan = Options(sanitize="address")
    run_script_under_asan(tmp_path, repo_root, STREAMED_SCRIPT, "ASAN-SCRIPT-OK",
                          [(pa.grad(deconv, wrt=["x", "f"]), asan), (blur, asan)])
    _instrumented_libraries(tmp_path / "cache")


def test_a_sanitized_build_compiles_at_o1(monkeypatch):
    """ASan's documented level: the same accesses are checked, in well under half the C
    compiler's time on the benchmarks' conv gradient; an unsanitized build stays at -O3."""
    from polyad.runtime import toolchain
    commands = []
    monkeypatch.setattr(toolchain, "require_asan_runtime", lambda: None)
    monkeypatch.setattr(toolchain, "_cached_build",
                        lambda source, name, suffix, cmd_head, *rest, **kw: commands.append(cmd_head))
    toolchain.compile_c("void k(void) {}\n", "k", sanitize="address")
    toolchain.compile_c("void k(void) {}\n", "k")
    sanitized, plain = commands
    assert [f for f in sanitized if f.startswith("-O")] == ["-O1"]
    assert "-fsanitize=address" in sanitized and "-fopenmp" in sanitized
    assert [f for f in plain if f.startswith("-O")] == ["-O3"]
    assert "-fsanitize=address" not in plain
