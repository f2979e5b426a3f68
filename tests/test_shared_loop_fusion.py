"""``schedule.fusion.fuse_along_shared_loops``: a nest runs inside the outer loops it
shares with the nest before it when what it reads of that nest is written in the same
iteration (the conv layer's filter-gradient sums beside the rows of ``d_s`` they read).

Decisions are asserted on the conv-layer gradient and on small kernels (fused at the
deepest legal depth, not fused where a dependence crosses iterations or the first
nest's loop is sequential); values against the reference interpreter (the conv
gradient's in ``test_interchange``).
"""

import numpy as np
import pytest

import polyad as pa
from polyad.pipeline import Options, artifact_of
from polyad.testing import interpret

from test_loop_order import conv_cost

M, N = pa.sizes("M N")


def _fusions(kernel, target="openmp"):
    sk = artifact_of(kernel, Options(target=target)).scheduled
    return sk, [d for d in sk.schedule_decisions if "inside the loops" in d]


@pa.kernel
def scale_then_diff(x: pa.f64[M, N].clamped, y: pa.Out(pa.f64[M, N])):
    t = pa.empty(pa.f64[M, N].clamped)
    for m in range(M):
        for n in range(N):
            t[m, n] = 2.0 * x[m, n] + 1.0
    for m in range(M):
        for n in range(N):
            y[m, n] = t[m, n + 1] - t[m, n - 1]


@pa.kernel
def scale_then_vertical(x: pa.f64[M, N].clamped, y: pa.Out(pa.f64[M, N])):
    t = pa.empty(pa.f64[M, N].clamped)
    for m in range(M):
        for n in range(N):
            t[m, n] = 2.0 * x[m, n] + 1.0
    for m in range(M):
        for n in range(N):
            y[m, n] = t[m + 1, n] - t[m, n]


@pa.kernel
def running_then_scale(x: pa.f64[M, N], y: pa.Out(pa.f64[M, N])):
    t = pa.zeros(pa.f64[M, N].clamped)
    for m in range(M):
        for n in range(N):
            t[m, n] = x[m, n] + t[m - 1, n]  # row 0 reads its own zero
    for m in range(M):
        for n in range(N):
            y[m, n] = 3.0 * t[m, n]


def test_conv_gradient_runs_in_one_nest():
    sk, fusions = _fusions(pa.grad(conv_cost, wrt=["w", "x"]))
    assert len(fusions) == 3
    assert fusions[0].endswith("inside the loops b, co, h: what it reads of the first is "
                               "written in the same iteration (still in cache)")
    assert "inside the loops b:" in fusions[1]
    # then the d_x gather's loop over rows runs a row behind the one writing d_s
    # (fusion.fuse_rows_inside)
    assert fusions[2].startswith("fused the loop h of S8 into that of S2, S3, S4, S5, S6, "
                                 "S7 inside the loops b (1 row behind): d_s_expanded kept "
                                 "as 3 rows per thread (d_s_expanded_rows)")
    gradient = [st for st in sk.kernel.statements if st.target_name in ("d_w", "d_x")
                and not st.source.startswith("zero")]
    sums = [st for st in sk.kernel.statements if st.target_name == "d_s_expanded_rows"]
    assert {st.position[:2] for st in gradient + sums} == {sums[0].position[:2]}
    d_x = [st for st in gradient if st.target_name == "d_x"]
    assert all(st.loops[1] == sums[0].loops[1] for st in d_x)
    # no temporary of the size of the images left for the caller to allocate
    assert sk.kernel.caller_temps == ()
    # the d_w sums run in the iteration of (b, h) that wrote the rows of d_s they read,
    # in a loop over co right after the one writing them (blocked by 2 output channels:
    # loop_order.block_sums_in_registers, then over co's iteration numbers)
    d_w = [st for st in gradient if st.target_name == "d_w"]
    after = sums[0].position[:2] + (sums[0].position[2] + 1,)
    assert all(st.position[:3] == after and st.loops[2].var == "co_iter" for st in d_w)
    # not for CUDA, whose threads run single iterations
    assert _fusions(pa.grad(conv_cost, wrt=["w", "x"]), "cuda")[1] == []


def test_fused_at_the_deepest_legal_depth():
    _, fusions = _fusions(scale_then_diff)
    (text,) = fusions
    assert "inside the loops m:" in text  # n + 1 crosses iterations of n, not of m
    assert _fusions(scale_then_vertical)[1] == []  # t[m + 1, n]: written an iteration later
    assert _fusions(running_then_scale)[1] == []  # the first nest's loop over m is sequential


@pytest.mark.parametrize("kernel", [scale_then_diff, scale_then_vertical, running_then_scale])
def test_values_match_the_interpreter(kernel):
    rng = np.random.default_rng(3)
    for m, n in [(1, 1), (2, 3), (5, 8), (17, 33)]:
        x = rng.standard_normal((m, n))
        _, want = interpret(kernel.ir, dict(x=x), dict(M=m, N=n))
        np.testing.assert_allclose(kernel(x), want["y"], rtol=1e-14, atol=1e-14)


B = pa.sizes("B")


@pa.kernel
def scale_then_window(x: pa.f64[B, M, N], y: pa.Out(pa.f64[B, M, N])):
    # per image b: a loop over rows writing t, then one reading rows m - 1 .. m + 1 of it
    t = pa.empty(pa.f64[B, M, N].clamped)
    for b in range(B):
        for m in range(M):
            for n in range(N):
                t[b, m, n] = 2.0 * x[b, m, n] + 1.0
        for m in range(M):
            for n in range(N):
                y[b, m, n] = t[b, m - 1, n] - 2.0 * t[b, m, n] + t[b, m + 1, n]


@pa.kernel
def window_then_rewrite(x: pa.f64[B, M, N], y: pa.Out(pa.f64[B, M, N])):
    # the second loop also writes x, which the first reads: the loops stay apart
    t = pa.empty(pa.f64[B, M, N].clamped)
    for b in range(B):
        for m in range(M):
            for n in range(N):
                t[b, m, n] = 2.0 * x[b, m, n]
        for m in range(M):
            for n in range(N):
                y[b, m, n] = t[b, m - 1, n] + t[b, m + 1, n]
                x[b, m, n] = 0.5 * y[b, m, n]


@pa.kernel
def two_rows_ahead(x: pa.f64[B, M, N], y: pa.Out(pa.f64[B, M, N])):
    # the second loop reads rows m and m + 2: 2 rows behind, 3 rows kept
    t = pa.empty(pa.f64[B, M, N].clamped)
    for b in range(B):
        for m in range(M):
            for n in range(N):
                t[b, m, n] = x[b, m, n] * x[b, m, n]
        for m in range(M):
            for n in range(N):
                y[b, m, n] = t[b, m + 2, n] - t[b, m, n]


@pa.kernel
def running_then_window(x: pa.f64[B, M, N], y: pa.Out(pa.f64[B, M, N])):
    # the first loop reads back the row it wrote a step before (a running sum down the
    # columns): its own reads keep a row alive too
    t = pa.empty(pa.f64[B, M, N].clamped)
    for b in range(B):
        for m in range(M):
            for n in range(N):
                t[b, m, n] = x[b, m, n] + 0.5 * t[b, m - 1, n] if m > 0 else x[b, m, n]
        for m in range(M):
            for n in range(N):
                y[b, m, n] = t[b, m - 1, n] + t[b, m + 1, n]


def _rows_inside(kernel, fuse=None):
    sk = artifact_of(kernel, Options(fuse=fuse)).scheduled
    return sk, [d for d in sk.schedule_decisions if d.startswith("fused the loop ")]


def test_sibling_row_loops_run_as_one_through_a_rolling_buffer():
    """fusion.fuse_rows_inside: the second loop over m runs a row behind the first inside
    the loop over b, t kept as 3 rows per thread; not with fuse=False, nor where the
    second loop writes what the first reads."""
    sk, (text,) = _rows_inside(scale_then_window)
    assert text == ("fused the loop m of S1 into that of S0 inside the loops b (1 row "
                    "behind): t kept as 3 rows per thread (t_rows) instead of BxMxN elements")
    (buffer,) = [t for t in sk.kernel.temps if t.name == "t_rows"]
    assert buffer.per_thread and buffer.chunk_loops == ("b",)
    assert [pa.ir.expr_str(e) for e in buffer.type.shape] == ["3", "N + 16"]
    assert all(st.loops[1].var == "m" and pa.ir.expr_str(st.loops[1].hi) == "M + 1"
               for st in sk.kernel.statements)
    assert "own row buffers t_rows per iteration" in pa.explain(scale_then_window)
    assert _rows_inside(scale_then_window, fuse=False)[1] == []
    assert _rows_inside(window_then_rewrite)[1] == []


def test_rolling_rows_cover_the_window_of_each_loop():
    """The lag is the second loop's largest read offset, the height every row read after
    its write: the first loop's own reads included."""
    assert _rows_inside(two_rows_ahead)[1][0].startswith(
        "fused the loop m of S1 into that of S0 inside the loops b (2 rows behind): t kept "
        "as 3 rows per thread")
    (text,) = _rows_inside(running_then_window)[1]
    assert "(1 row behind): t kept as 3 rows" in text


@pytest.mark.parametrize("kernel", [scale_then_window, window_then_rewrite, two_rows_ahead,
                                    running_then_window])
@pytest.mark.parametrize("deterministic", [False, True])
def test_rolling_rows_match_the_interpreter(kernel, deterministic):
    fn = pa.compile(kernel, deterministic=deterministic)
    rng = np.random.default_rng(8)
    for b, m, n in [(1, 1, 1), (1, 2, 3), (2, 3, 2), (3, 5, 8), (2, 17, 40)]:
        x = rng.standard_normal((b, m, n))
        _, want = interpret(kernel.ir, dict(x=x.copy()), dict(B=b, M=m, N=n))
        got = fn(x)
        np.testing.assert_allclose(got, want["y"], rtol=1e-14, atol=1e-14)
