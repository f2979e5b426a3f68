"""Kernels built with -fsanitize=address run clean (no out-of-bounds access)
for every boundary mode, index transforms, dropped writes and a reduction.

An ASan-instrumented shared library only loads into a process that was started
with the ASan runtime preloaded, so the kernels run in a subprocess.
"""

import os
import subprocess
import sys
import textwrap

import pytest

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

# The benchmark gradients (benchmarks/kernels.py, float64) whose emitted code the
# simplification and loop-order passes rewrite: run instrumented on small and
# degenerate shapes, compared with the reference interpreter.
GRADIENT_SCRIPT = textwrap.dedent(
    '''
    import numpy as np
    import polyad as pa
    from polyad.testing import interpret

    M, N = pa.sizes("M N")
    B, CI, CO, H, W = pa.sizes("B CI CO H W")


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
    def deconv_cost(x: pa.f64[M, N].clamped, f: pa.f64[5], y: pa.f64[M, N]) -> pa.f64:
        t = pa.empty(pa.f64[M, N].clamped)
        for m in range(M):
            for n in range(N):
                t[m, n] = (f[0] * x[m, n - 2] + f[1] * x[m, n - 1] + f[2] * x[m, n]
                           + f[3] * x[m, n + 1] + f[4] * x[m, n + 2])
        C = 0.0
        for m in range(M):
            for n in range(N):
                r = (f[0] * t[m - 2, n] + f[1] * t[m - 1, n] + f[2] * t[m, n]
                     + f[3] * t[m + 1, n] + f[4] * t[m + 2, n]) - y[m, n]
                C += r * r
        return C


    @pa.kernel
    def conv_cost(x: pa.f64[B, CI, H, W].zero, w: pa.f64[CO, CI, 3, 3],
                  y: pa.f64[B, CO, H, W]) -> pa.f64:
        C = 0.0
        for b in range(B):
            for co in range(CO):
                for h in range(H):
                    for v in range(W):
                        s = 0.0
                        for ci in range(CI):
                            for kh in range(3):
                                for kw in range(3):
                                    s += w[co, ci, kh, kw] * x[b, ci, h + kh - 1, v + kw - 1]
                        r = max(s, 0.0) - y[b, co, h, v]
                        C += r * r
        return C


    P, = pa.sizes("P")


    @pa.kernel
    def stencil3d_cost(x: pa.f64[P, M, N].clamped, y: pa.f64[P, M, N]) -> pa.f64:
        C = 0.0
        for p in range(P):
            for m in range(M):
                for n in range(N):
                    r = (6.0 * x[p, m, n] - x[p - 1, m, n] - x[p + 1, m, n]
                         - x[p, m - 1, n] - x[p, m + 1, n]
                         - x[p, m, n - 1] - x[p, m, n + 1]) - y[p, m, n]
                    C += r * r
        return C


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
        # sizes (P < 6, M < 4 or N < 4) and the one for large, on either side of each bound
        for p, m, n in [(1, 1, 1), (5, 4, 4), (6, 3, 5), (6, 4, 3), (6, 4, 4), (70, 5, 6)]:
            check(stencil3d_cost, ["x"], dict(x=rng.standard_normal((p, m, n)),
                                              y=rng.standard_normal((p, m, n))),
                  dict(P=p, M=m, N=n), fuse=True)
        print("ASAN-SCRIPT-OK")


    if __name__ == "__main__":
        main()
    '''
)





def run_script_under_asan(tmp_path, repo_root, script_text: str, marker: str) -> str:
    """Run ``script_text`` as a Python script with libasan preloaded, polyad from
    ``repo_root`` and a fresh cache under ``tmp_path``; assert it exits cleanly,
    reports nothing and prints ``marker``; returns its output. Skips without libasan."""
    if libasan() is None:
        pytest.skip("gcc with libasan not available")
    script = tmp_path / "asan_script.py"
    script.write_text(script_text)
    env = dict(os.environ, LD_PRELOAD=asan_preload(), ASAN_OPTIONS="detect_leaks=0",
               POLYAD_CACHE_DIR=str(tmp_path / "cache"))
    env["PYTHONPATH"] = os.pathsep.join([repo_root] + [p for p in [env.get("PYTHONPATH")] if p])
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=600, cwd=str(tmp_path))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "AddressSanitizer" not in out, out
    assert marker in proc.stdout, out
    return out


@pytest.mark.parametrize("script_text", [SCRIPT, GRADIENT_SCRIPT], ids=["kernels", "gradients"])
def test_asan_kernels_clean(tmp_path, repo_root, script_text):
    run_script_under_asan(tmp_path, repo_root, script_text, "ASAN-SCRIPT-OK")
    # where the cache holds shared libraries, the sanitized ones are instrumented
    libs = [os.path.join(r, f) for r, _, fs in os.walk(tmp_path / "cache") for f in fs
            if f.endswith(".so")]
    if libs:
        assert any(b"__asan" in open(p, "rb").read() for p in libs), libs


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
