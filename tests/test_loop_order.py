"""``schedule.loop_order`` and the OpenMP plan's per-lane partial sums, on the conv layer.

The conv-layer gradient ends in two order-free nests (the gather of ``d_x``
and the privatized filter gradient ``d_w``) whose innermost loop runs over
3 taps. The schedule must move the pixel-row loop ``v`` innermost (a
decision ``pa.explain`` shows), the plan must sum ``d_w`` along the row in
per-lane accumulators, and the results must match the reference interpreter,
with rows long enough for the lane blocks and their remainders, in the
default and the deterministic mode.
"""

import dataclasses

import islpy as isl
import numpy as np
import pytest

import polyad as pa
from polyad import ir
from polyad.pipeline import Options, artifact_of
from polyad.schedule.loop_order import (expand_reduction_rows, jam_small_loops,
                                       unit_stride_innermost)
from polyad.schedule.machine import AVX512
from polyad.target import openmp
from polyad.target.openmp import plan
from polyad.testing import interpret

B, CI, CO, H, W = pa.sizes("B CI CO H W")
# rows per pass of the suite's vector unit (POLYAD_VECTOR_UNIT=512x32, conftest)
ROW_BLOCK = AVX512.row_block
M, N = pa.sizes("M N")


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


@pa.kernel
def conv_cost32(x: pa.f32[B, CI, H, W].zero, w: pa.f32[CO, CI, 3, 3],
                y: pa.f32[B, CO, H, W]) -> pa.f32:
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


@pa.kernel
def row_sums(x: pa.f64[M, N], out: pa.Out(pa.f64[M, 3])):
    # order-free (only += into out, which the nest does not read): v moves innermost
    for m in range(M):
        for n in range(N):
            for k in range(3):
                out[m, k] += x[m, n] * float(k)


@pa.kernel
def prefix_rows(x: pa.f64[M, N], out: pa.Out(pa.f64[M, N])):
    # reads the array it adds into: not order-free, the order stays
    for m in range(M):
        for n in range(1, N):
            for k in range(2):
                out[m, n] += out[m, n - 1] * 0.5 + x[m, n] * float(k)


def conv_gradient_matches_interpreter(grad, fn, seed, shapes):
    """Assert that ``fn`` (``grad``, a gradient of a conv cost, compiled) gives the
    interpreter's outputs for random inputs at each ``(B, CI, CO, H, W)`` of ``shapes``."""
    rng = np.random.default_rng(seed)
    outputs = [p.name for p in grad.ir.params if p.intent == "out"]
    for b, ci, co, h, w in shapes:
        x = rng.standard_normal((b, ci, h, w))
        wt = rng.standard_normal((co, ci, 3, 3))
        y = rng.standard_normal((b, co, h, w))
        got = fn(x, wt, y)
        _, want = interpret(grad.ir, dict(x=x.copy(), w=wt.copy(), y=y),
                            dict(B=b, CI=ci, CO=co, H=h, W=w))
        for name, value in zip(outputs, got if isinstance(got, tuple) else (got,)):
            np.testing.assert_allclose(value, want[name], rtol=1e-12, atol=1e-12)


def _scheduled(kernel, deterministic=False):
    return artifact_of(kernel, Options(deterministic=deterministic)).scheduled


def test_conv_gradient_nests_get_the_pixel_row_innermost():
    grad = pa.grad(conv_cost, wrt=["w", "x"])
    sk = _scheduled(grad)
    moved = {st.owner: st for st in sk.kernel.statements
             if st.owner in sk.loop_orders and "moved innermost" in sk.loop_orders[st.owner]}
    targets = {st.target.array for st in moved.values()}
    assert targets == {"d_w", "d_x"}, sk.loop_orders
    for st in moved.values():
        # v innermost, and the 9 taps of kw and kh unrolled into it (one copy per tap)
        assert st.loops[-1].var == "v" and st.loops[-2].var in ("ci", "co")
        assert "kw" not in st.loop_vars and "kh" not in st.loop_vars
        assert "loop v moved innermost" in sk.loop_orders[st.owner]
        assert ("loop kw unrolled into the loop v (3 copies, kw = 0, 1, 2"
                in sk.loop_orders[st.owner])
        assert ("loop kh unrolled into the loop v (3 copies, kh = 0, 1, 2"
                in sk.loop_orders[st.owner])
        copies = [c for c in sk.kernel.statements if c.owner == st.owner]
        jams = [next(sp for sp in c.origin if sp.kind == "jam") for c in copies]
        if st.target.array == "d_w":  # blocked by 2 output channels (block_sums_in_registers)
            assert len(copies) == 18 and all(c.origin[-1].kind == "block" for c in copies)
            assert sorted(c.origin[-1].index for c in copies) == [0] * 9 + [1] * 9
            jams = jams[:9]
        assert len(jams) == 9 and all(c.origin[-1].kind in ("jam", "block") for c in copies)
        assert sorted(sp.index for sp in jams) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    # the nest that recomputes the forward sum keeps it per point along the row
    (rows,) = [why for why in sk.loop_orders.values() if why.startswith("scalar s kept")]
    assert "s_rows[v] (one row per thread)" in rows and "the loop v is innermost" in rows
    # each reordered statement had a nest of its own, now inside the shared loops of the
    # nest that writes what it reads (test_shared_loop_fusion): at different places in it
    assert len({st.position[:3] for st in moved.values()}) == 2
    text = pa.explain(grad)
    assert "loop v moved innermost (unit stride in d_x[b, ci, h, v])" in text
    assert "per-lane partial sums: 8 lanes" in text  # 18 sums: one vector each


@pytest.mark.parametrize("kernel, lanes", [(conv_cost, 8), (conv_cost32, 16)])
def test_filter_gradient_sums_along_the_row_in_lanes(kernel, lanes):
    grad = pa.grad(kernel, wrt=["w", "x"])
    p = plan(_scheduled(grad))
    lane_loops = [lp for lp in p.loops.values() if lp.lane_sums]
    # one vector of lanes per sum where a loop has 18 (the interior rows' taps of two
    # output channels), two where it has at most 12 (a border row's: 6 taps)
    assert lane_loops and all(lp.lane_sums in (lanes, 2 * lanes) and lp.iterator == "v"
                              and not lp.simd and not lp.privatized for lp in lane_loops)
    assert any(lp.lane_sums == lanes for lp in lane_loops)
    src = grad.source
    # the thread loop's private copies (of one element at least: nonempty_sections)
    assert "reduction(+:d_w[0:pa_imax(CO * CI * 3 * 3, 1)])" in src
    assert src.count("#pragma omp simd reduction(+:d_w") == 0  # not per row
    assert f"d_w_lanes[{lanes}] = {{0}};" in src
    assert "d_w_lanes[v_lane] += d_s_expanded_rows[" in src
    # the nine taps' sums of two output channels share one lane loop (in the interior
    # rows), one vector of lanes each (18 sums)
    assert f"d_w_lanes18[{lanes}] = {{0}};" in src and "d_w_lanes19[" not in src
    # d_x is a plain vector loop over the row, the nine taps in one update
    lines = src.splitlines()
    k = next(k for k, line in enumerate(lines)
             if line.strip().startswith("d_x[((b * CI + ci) * H + (h - 1)) * W + v] +="))
    assert lines[k - 1].strip() == "for (int64_t v = 1; v < (W - 1); v++) {"
    assert lines[k - 2].strip() == "#pragma omp simd"
    assert [line.strip()[:1] for line in lines[k + 1:k + 9]] == ["+"] * 8
    assert lines[k + 8].rstrip().split("  //")[0].endswith(";")
    # deterministic: no reassociating lanes
    assert not any(lp.lane_sums for lp in plan(_scheduled(grad, True), True).loops.values())


@pytest.mark.parametrize("deterministic", [False, True])
def test_reordered_conv_gradient_matches_the_interpreter(deterministic):
    grad = pa.grad(conv_cost, wrt=["w", "x"])
    conv_gradient_matches_interpreter(
        grad, pa.compile(grad, deterministic=deterministic), 11,
        [(1, 1, 1, 1, 1), (1, 2, 3, 4, 16), (1, 1, 2, 3, 17), (2, 3, 2, 5, 37), (1, 2, 2, 2, 50)])


@pytest.mark.parametrize("deterministic", [False, True])
def test_the_input_gradient_zeroes_each_row_in_the_step_that_gathers_it(deterministic):
    """The conv gradient's input gather ``d_x[b, ci, h - 1, v] += ...`` (one row behind
    its producers, in the loops b, h, ci of the fused nest) gets that form only in the loop
    order, after ``fuse_zero_initialization``: its zeroing ran as a pass of its own, and
    the gather read the rows back from memory. ``cleanup.zero_rows_in_their_step`` zeroes
    each row in the step that gathers it (0.97-0.98 of the float32 gradient's time at 512²
    and 1024², interleaved against the build before). Outputs passed in filled with NaN,
    against the interpreter at heights where the first and last steps meet and beyond,
    and with no output or input channel (``test_empty_filter_sums_are_clean_under_asan``)."""
    grad = pa.grad(conv_cost, wrt=["w", "x"])
    assert ("d_x: zeroed row by row in the step of the loops b, h, ci that sums into the row"
            in pa.explain(grad, deterministic=deterministic))
    zeroings = [st for st in _scheduled(grad, deterministic).kernel.statements
                if st.target_name == "d_x" and st.op == "="]
    assert zeroings and all([lp.var for lp in st.loops[:3]] == ["b", "h", "ci"]
                            for st in zeroings)
    nan_filled_outputs_match_the_interpreter(
        grad, pa.compile(grad, deterministic=deterministic), 5,
        [(1, 1, 1, 1, 1), (1, 2, 3, 2, 16), (1, 1, 2, 3, 17), (2, 5, 2, 4, 9), (1, 3, 2, 6, 33),
         (1, 2, 0, 3, 5), (1, 0, 2, 3, 4)])


def nan_filled_outputs_match_the_interpreter(grad, fn, seed, shapes):
    """Assert that ``fn`` (``grad``, the w and x gradient of a conv cost, compiled) called
    with its outputs passed in filled with NaN (an element it does not write stays NaN)
    gives the interpreter's at each ``(B, CI, CO, H, W)`` of ``shapes``."""
    rng = np.random.default_rng(seed)
    for b, ci, co, h, w in shapes:
        x, wt = rng.standard_normal((b, ci, h, w)), rng.standard_normal((co, ci, 3, 3))
        y = rng.standard_normal((b, co, h, w))
        d_w, d_x = np.full(wt.shape, np.nan), np.full(x.shape, np.nan)
        fn(x, wt, y, d_w=d_w, d_x=d_x)
        _, want = interpret(grad.ir, dict(x=x.copy(), w=wt.copy(), y=y),
                            dict(B=b, CI=ci, CO=co, H=h, W=w))
        np.testing.assert_allclose(d_w, want["d_w"], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(d_x, want["d_x"], rtol=1e-12, atol=1e-12)


EMPTY_SECTIONS_SCRIPT = '''
import polyad as pa
from test_loop_order import conv_cost, nan_filled_outputs_match_the_interpreter

grad = pa.grad(conv_cost, wrt=["w", "x"])
nan_filled_outputs_match_the_interpreter(
    grad, pa.compile(grad, sanitize="address"), 7,
    [(1, 0, 2, 3, 4), (1, 2, 0, 3, 5), (2, 0, 0, 2, 3), (1, 1, 1, 1, 1), (2, 5, 2, 4, 9)])
print("ASAN-SCRIPT-OK")
'''


def test_empty_filter_sums_are_clean_under_asan(tmp_path, repo_root):
    """The conv gradient's filter sums run in a reduction clause over the array section
    ``d_w[0:CO * CI * 3 * 3]``; gcc 12 initializes and combines a private copy with loops
    that run at least once, so with no input channel (CI = 0: the section has no
    elements, the loop over the batch still runs for d_x) it wrote one element past the
    copy on the stack, and the call ended in a segmentation fault. The emitter now points
    the clause at one element of the stack where the section is empty
    (``nonempty_sections``). With no output channel the zeroing of d_x, now in the steps
    of the gather, runs that loop too."""
    from test_asan import run_script_under_asan
    run_script_under_asan(tmp_path, repo_root, EMPTY_SECTIONS_SCRIPT, "ASAN-SCRIPT-OK",
                          [(pa.grad(conv_cost, wrt=["w", "x"]), Options(sanitize="address"))])


def test_a_row_summed_in_several_steps_keeps_its_zeroing_pass():
    """A row index made of the outer loops m and n with a loop k between them reaches
    each row in every iteration of k: zeroing it in the step would drop the sums of the
    earlier ones, so no rows are placed. Rows whose loops do not reach every row (the
    loop starts past the first) stay too; a loop one row behind, one step longer, gets the
    condition of its first step (row -1 is out of bounds)."""
    from polyad.schedule.cleanup import _rows_by_outer_loops
    m, n, k = (ir.LoopVar(v) for v in "mnk")
    size = ir.SizeVar("M", ir.i64)
    loop = lambda var, lo, hi: ir.Loop(var, ir.Const(lo, ir.i64) if isinstance(lo, int) else lo,
                                       hi)
    shape = (size, size, size)
    assert _rows_by_outer_loops((m, n), (loop("m", 0, size), loop("k", 0, size),
                                         loop("n", 0, size)), shape, ["M"]) is None
    assert _rows_by_outer_loops((m, n), (loop("m", 1, size), loop("n", 0, size)), shape,
                                ["M"]) is None
    behind = ir.Binary("-", n, ir.Const(1, ir.i64), ir.i64)
    c, conditions = _rows_by_outer_loops(
        (m, behind), (loop("m", 0, size), loop("n", 0, ir.Binary("+", size, ir.Const(1, ir.i64),
                                                                   ir.i64))), shape, ["M"])
    assert c == 2 and [ir.expr_str(cond.expr) for cond in conditions] == ["n - 1 >= 0"]


def test_order_free_rule_on_small_kernels():
    k, decisions = unit_stride_innermost(row_sums.ir)
    (st,) = k.statements
    assert [lp.var for lp in st.loops] == ["m", "k", "n"]
    assert "loop n moved innermost (unit stride in x[m, n])" in decisions[st.name]
    x = np.random.default_rng(12).standard_normal((3, 40))
    want = x.sum(axis=1)[:, None] * np.arange(3.0)
    np.testing.assert_allclose(row_sums(x), want, rtol=1e-12)
    k2, decisions2 = unit_stride_innermost(prefix_rows.ir)
    assert k2 is prefix_rows.ir
    assert all("reads an array the nest writes" in why for why in decisions2.values())


def test_statements_writing_one_array_are_not_distributed():
    """Two statements adding into one array in one nest keep their order (their terms
    would interleave differently in two nests)."""
    i, n, kk = ir.LoopVar("i"), ir.LoopVar("n"), ir.LoopVar("k")
    loops = (ir.Loop("i", ir.Const(0, ir.i64), ir.SizeVar("M")),
             ir.Loop("n", ir.Const(0, ir.i64), ir.SizeVar("N")),
             ir.Loop("k", ir.Const(0, ir.i64), ir.Const(3, ir.i64)))
    x = ir.Load("x", (i, n))
    s1 = ir.Statement("S1", loops, (0, 0, 0, 0), (), None, ir.Load("o", (i, kk)), "+=", x)
    s2 = ir.Statement("S2", loops, (0, 0, 0, 1), (), None, ir.Load("o", (i, kk)), "+=", x)
    kernel = ir.Kernel("k", (ir.Param("x", ir.f64[M, N]), ir.Param("o", ir.f64[M, 3], "inout")),
                       ("M", "N"), (), (), (s1, s2))
    out, decisions = unit_stride_innermost(kernel)
    assert out is kernel and decisions == {}


@pa.kernel
def moments(x: pa.f64[M, N], out: pa.Out(pa.f64[4, 2])):
    for m in range(M):
        for n in range(N):
            out[0, 0] += x[m, n]
            out[1, 1] -= x[m, n] * x[m, n]
            out[0, 0] += 2.0 * x[m, n]


def test_lane_sums_into_several_elements_with_remainders():
    """Two accumulators in one lane loop (a '-=' among them), rows shorter than, equal to
    and longer than a block of lanes."""
    src = moments.source
    assert "out_lanes[16] = {0};" in src and "out_lanes2[16] = {0};" in src
    assert "for (; n + 15 < N; n += 16) {" in src
    assert "out_lanes2[n_lane] -= x[m * N + (n + n_lane)] * x[m * N + (n + n_lane)];" in src
    rng = np.random.default_rng(13)
    for shape in [(1, 1), (3, 15), (2, 16), (3, 17), (4, 33), (2, 64)]:
        x = rng.standard_normal(shape)
        out = moments(x)
        want = np.zeros((4, 2))
        want[0, 0] = 3.0 * x.sum()
        want[1, 1] = -(x * x).sum()
        np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)


@pa.kernel
def blur_rows(x: pa.f64[M, N].clamped, f: pa.f64[5], y: pa.Out(pa.f64[M, N])):
    for m in range(M):
        for n in range(N):
            s = 0.0
            for k in range(5):
                s += f[k] * x[m, n + k - 2]
            y[m, n] = s * s


@pa.kernel
def sum_reads_output(x: pa.f64[M, N], y: pa.Out(pa.f64[M, N])):
    for m in range(M):
        for n in range(N):
            s = 0.0
            for k in range(3):
                s += y[m, k] + x[m, n]
            y[m, n] = s


@pa.kernel
def blur_1d(x: pa.f64[N].clamped, f: pa.f64[5], y: pa.Out(pa.f64[N])):
    for n in range(N):
        s = 0.0
        for k in range(5):
            s += f[k] * x[n + k - 2]
        y[n] = s


def test_per_point_sums_run_along_the_row():
    """The conv forward and a blur: the scalar sum over the taps lives in a row array,
    the taps loop outside the vector loop over the row; values as the interpreter's."""
    for kernel, name, role in ((conv_cost, "s_rows", "sum row"),
                               (blur_rows, "s_rows_row", "row")):
        sk = _scheduled(kernel)
        (why,) = [w for w in sk.loop_orders.values() if "scalar s kept" in w]
        assert why.startswith("scalar s kept per point in s_rows[")
        assert any(t.name == name and t.role == role for t in sk.kernel.temps)
    # the conv layer's sums (one piece each): a row per thread (per value of a block of
    # co: block_sum_rows_in_registers), allocated by the thread loop over b, reused for
    # every (co, h); the clamped blur's (an interior and a border piece) an array of the
    # whole iteration space, which each iteration of m writes and reads one row of: kept
    # as that row per thread (fusion.rows_per_iteration)
    sk = _scheduled(conv_cost)
    (row,) = [t for t in sk.kernel.temps if t.name == "s_rows"]
    assert [ir.expr_str(e) for e in row.type.shape] == [str(ROW_BLOCK), "W"]
    assert row.chunk_loops == ("b", "co", "h") and row not in sk.kernel.caller_temps
    src = conv_cost.source
    lines = src.splitlines()
    # the loop over b opens the parallel region, where each thread allocates the row
    # once for the iterations of b it runs (LoopPlan.buffers_per_thread)
    b = next(k for k, line in enumerate(lines)
             if line.strip() == "for (int64_t b = 0; b < B; b++) {")
    ind = lines[b][:len(lines[b]) - len(lines[b].lstrip())]
    assert lines[b - 1] == ind + "#pragma omp for schedule(static)"
    assert lines[b - 2].startswith(ind + ("float" if "float" in lines[b - 2] else "double")
                                   + " *restrict s_rows = malloc(")
    assert lines[b - 2].endswith("one per thread, reused by the iterations it runs")
    assert lines[b - 3] == ind[:-2] + "{"
    assert lines[b - 4].startswith(ind[:-2] + "#pragma omp parallel reduction(+:C)")
    end = lines.index(ind + "}", b)
    assert lines[end + 1:end + 3] == [ind + "free(s_rows);", ind[:-2] + "}"]
    # the interior rows' update: the 9 taps of kh and kw in one pass over the row, one
    # update of nine terms (the border rows' pieces have six)
    k = src.index("s_rows[v] += w_co_ci_0_0 * x[")
    simd, loop = src[:k].rstrip().splitlines()[-2:]
    assert simd.strip() == "#pragma omp simd"
    assert loop.strip().startswith("for (int64_t v = ")  # the row innermost, taps outside
    assert "for (int64_t kh = " not in src and "for (int64_t kw = " not in src
    body = src[k:].splitlines()[:9]
    assert [line.strip()[:1] for line in body[1:]] == ["+"] * 8
    assert "w_co_ci_2_2 * x[" in body[8] and "(v + 1)]" in body[8]
    rng = np.random.default_rng(14)
    for deterministic in (False, True):
        fn = pa.compile(conv_cost, deterministic=deterministic)
        for b, ci, co, h, w in [(1, 1, 1, 1, 1), (2, 2, 3, 3, 37), (1, 3, 2, 5, 16)]:
            x = rng.standard_normal((b, ci, h, w))
            wt = rng.standard_normal((co, ci, 3, 3))
            y = rng.standard_normal((b, co, h, w))
            want, _ = interpret(conv_cost.ir, dict(x=x, w=wt, y=y),
                                dict(B=b, CI=ci, CO=co, H=h, W=w))
            np.testing.assert_allclose(fn(x, wt, y), want, rtol=1e-12)
    x, f = rng.standard_normal((4, 23)), rng.standard_normal(5)
    _, want = interpret(blur_rows.ir, dict(x=x, f=f), dict(M=4, N=23))
    # same sums, same order: bit for bit where products are rounded apart as in Python
    np.testing.assert_array_equal(pa.compile(blur_rows, deterministic=True)(x, f), want["y"])
    np.testing.assert_allclose(blur_rows(x, f), want["y"], rtol=1e-14, atol=1e-14)


def test_per_point_sums_stay_when_the_parts_share_data():
    # the sum reads y, which the statement after it writes: no row expansion
    _, decisions = expand_reduction_rows(sum_reads_output.ir)
    assert decisions == {}
    # one shared loop: the split would cut the nest itself; left alone
    _, decisions = expand_reduction_rows(blur_1d.ir)
    assert decisions == {}
    x = np.random.default_rng(15).standard_normal((3, 5))
    _, want = interpret(sum_reads_output.ir, dict(x=x), dict(M=3, N=5))
    np.testing.assert_allclose(sum_reads_output(x), want["y"], rtol=1e-12)


@pa.kernel
def row_taps(x: pa.f64[M, N].zero, f: pa.f64[3], y: pa.Out(pa.f64[M, N])):
    # zero padding: the taps' domains differ at both ends of the row
    for m in range(M):
        for k in range(3):
            for n in range(N):
                y[m, n] += f[k] * x[m, n + k - 1]


@pa.kernel
def row_shift_sums(x: pa.f64[M, N], y: pa.Out(pa.f64[M, N + 2])):
    # y[m, n + k] receives terms from several (k, n): unrolled, they would arrive in
    # another order
    for m in range(M):
        for k in range(3):
            for n in range(N):
                y[m, n + k] += x[m, n] * float(k + 1)


@pa.kernel
def row_taps_reading_output(x: pa.f64[M, N], y: pa.Out(pa.f64[M, N])):
    for m in range(M):
        for k in range(3):
            for n in range(1, N):
                y[m, n] += y[m, n - 1] * 0.5 + x[m, n] * float(k)


@pa.kernel
def row_taps_two_depths(x: pa.f64[M, N], y: pa.Out(pa.f64[M, N]), z: pa.Out(pa.f64[M, 3])):
    for m in range(M):
        for k in range(3):
            z[m, k] += 1.0
            for n in range(N):
                y[m, n] += x[m, n] * float(k)


def test_small_loops_unrolled_into_the_row_loop():
    """The taps of a zero-padded row filter run in one pass over the row: ISL peels both
    ends, the updates of one element merge, and the values are the interpreter's."""
    k, decisions = jam_small_loops(row_taps.ir)
    assert [st.loop_vars for st in k.statements] == [("m", "n")] * 3
    assert "loop k unrolled into the loop n (3 copies, k = 0, 1, 2" in decisions["S0"]
    assert [st.position for st in k.statements] == [(0, 0, 0), (0, 0, 1), (0, 0, 2)]
    assert [ir.expr_str(st.expr) for st in k.statements] == [
        "f[0] * x[m, n - 1]", "f[1] * x[m, n]", "f[2] * x[m, n + 1]"]
    sk = _scheduled(row_taps)
    # the pieces that add f[k] * 0.0 are gone before the schedule
    assert len(sk.kernel.statements) == 3 and not any(
        "0.0" in ir.expr_str(st.expr) for st in sk.kernel.statements)
    src = row_taps.source
    assert src.count("for (int64_t n = ") == 1 and src.count("#pragma omp simd") == 1
    assert "for (int64_t k = " not in src
    rng = np.random.default_rng(16)
    for m, n in [(1, 1), (2, 2), (1, 3), (3, 17), (2, 40)]:
        x, f = rng.standard_normal((m, n)), rng.standard_normal(3)
        _, want = interpret(row_taps.ir, dict(x=x, f=f), dict(M=m, N=n))
        np.testing.assert_allclose(row_taps(x, f), want["y"], rtol=1e-13, atol=1e-13)


def test_small_loops_stay_where_unrolling_would_reorder():
    # the target uses both loops: terms of one element would arrive in another order
    k, decisions = jam_small_loops(row_shift_sums.ir)
    assert k is row_shift_sums.ir and decisions == {}
    # reads what the group writes
    k, decisions = jam_small_loops(row_taps_reading_output.ir)
    assert k is row_taps_reading_output.ir and decisions == {}
    # a statement of the small loop outside the row loop
    k, decisions = jam_small_loops(row_taps_two_depths.ir)
    assert k is row_taps_two_depths.ir and decisions == {}
    rng = np.random.default_rng(17)
    x = rng.standard_normal((3, 7))
    _, want = interpret(row_shift_sums.ir, dict(x=x), dict(M=3, N=7))
    np.testing.assert_allclose(row_shift_sums(x), want["y"], rtol=1e-13, atol=1e-13)


def test_row_sums_of_unrolled_taps_get_memory_based_dependences():
    """The row sum that the unrolled taps update is analysed by memory (no exact kills
    among the copies); the loops over the row stay vector loops, the batch loop threads."""
    from polyad.poly import dependences
    sk = _scheduled(conv_cost)
    deps = dependences(sk.model, flow_only=frozenset(n for n, _ in sk.kernel.locals),
                       memory_based_accumulators=True)
    copies = {st.name for st in sk.kernel.statements if st.target_name == "s_rows"
              and st.origin and st.origin[-1].kind == "jam"}
    assert len(copies) == 9  # the taps of kw, then of kh
    pairs = set()
    deps.output["s_rows"].foreach_map(lambda m: pairs.add(
        (m.get_tuple_name(isl.dim_type.in_), m.get_tuple_name(isl.dim_type.out))))
    assert {(a, b) for a in copies for b in copies} <= pairs
    src = conv_cost.source
    # one parallel region, the batch loop shared out in it (its row allocated per thread)
    assert src.count("#pragma omp parallel") == 1 and "#pragma omp parallel for" not in src
    assert "#pragma omp for schedule(static)\n      for (int64_t b = 0;" in src


T = pa.sizes("T")


@pa.kernel
def decayed_sums(u: pa.f64[T, M, N].zero, f: pa.f64[3], acc: pa.Out(pa.f64[M, N])):
    # the loop over t carries acc: the threads share the loop over m, whose every
    # iteration then needs a row of its own
    for t in range(T):
        for m in range(M):
            for n in range(N):
                s = 0.0
                for k in range(3):
                    s += f[k] * u[t, m, n + k - 1]
                acc[m, n] = acc[m, n] * 0.5 + s


def test_sum_row_belongs_to_the_loop_the_threads_share():
    sk = _scheduled(decayed_sums)
    (row,) = [t for t in sk.kernel.temps if t.name == "s_rows"]
    assert row.role == "sum row" and row.chunk_loops == ("t", "m")
    lines = decayed_sums.source.splitlines()
    m = next(k for k, line in enumerate(lines) if line.strip().startswith("for (int64_t m = "))
    # (a team of threads runs the loop over t, and shares out the loop over m)
    assert lines[m - 1].strip() == "#pragma omp for schedule(static)"
    assert lines[m + 1].strip().startswith("double *restrict s_rows = malloc(")
    rng = np.random.default_rng(18)
    for t, mm, n in [(1, 1, 1), (3, 2, 2), (2, 5, 3), (4, 7, 37)]:
        u, f = rng.standard_normal((t, mm, n)), rng.standard_normal(3)
        _, want = interpret(decayed_sums.ir, dict(u=u, f=f), dict(T=t, M=mm, N=n))
        np.testing.assert_allclose(decayed_sums(u, f), want["acc"], rtol=1e-13, atol=1e-13)


def _zero_then_taps(update_reads_target=False, one_owner=False, second_sum=False):
    """``o[i, n] = 0`` then ``o[i, n] += x[i, n + k]`` for k < 3, in one nest (what
    ``cleanup.fuse_zero_initialization`` leaves of a gather's zeroing); with
    ``second_sum``, also ``p[i, n] += x[i, n + k]``, a statement of its own."""
    i, n, kk = ir.LoopVar("i"), ir.LoopVar("n"), ir.LoopVar("k")
    two = (ir.Loop("i", ir.Const(0, ir.i64), ir.SizeVar("M")),
           ir.Loop("n", ir.Const(0, ir.i64), ir.SizeVar("N")))
    three = two + (ir.Loop("k", ir.Const(0, ir.i64), ir.Const(3, ir.i64)),)
    target = ir.Load("o", (i, n))
    term = ir.Load("x", (i, ir.Binary("+", n, kk, ir.i64)))
    if update_reads_target:
        term = ir.Binary("*", term, ir.Load("o", (i, n)), ir.f64)
    zero = ir.Statement("S0", two, (0, 0, 0), (), None, target, "=", ir.Const(0.0, ir.f64))
    taps = ir.Statement("S1", three, (0, 0, 1, 0), (), None, target, "+=", term)
    statements = (zero, taps)
    params = (ir.Param("x", ir.f64[M, N + 2]), ir.Param("o", ir.f64[M, N], "inout"))
    if one_owner:  # two pieces of one statement
        zero = zero.split("boundary", 0, "S0_0")
        taps = dataclasses.replace(taps, name="S0").split("boundary", 1, "S0_1")
        statements = (zero, taps)
    if second_sum:
        statements += (ir.Statement("S2", three, (0, 0, 1, 1), (), None, ir.Load("p", (i, n)),
                                    "+=", term),)
        params += (ir.Param("p", ir.f64[M, N], "inout"),)
    return ir.Kernel("k", params, ("M", "N"), (), (), statements)


def _same_sums(kernel, out):
    """``out`` computes what ``kernel`` computes, over whatever o and p held before."""
    rng = np.random.default_rng(13)
    x = rng.standard_normal((3, 21))
    want = sum(x[:, k:k + 19] for k in range(3))
    arrays = dict(x=x, o=np.full((3, 19), 7.0))
    if any(p.name == "p" for p in kernel.params):
        arrays["p"] = np.ones((3, 19))
    for k in (kernel, out):
        _, got = interpret(k, {a: v.copy() for a, v in arrays.items()}, dict(M=3, N=19))
        np.testing.assert_allclose(got["o"], want, rtol=1e-12)
        if "p" in arrays:
            np.testing.assert_allclose(got["p"], 1.0 + want, rtol=1e-12)


def test_an_initialization_runs_along_the_row_before_the_reordered_updates():
    kernel = _zero_then_taps()
    out, decisions = unit_stride_innermost(kernel)
    zero, taps = out.statements
    # one nest: in each iteration of i, the zeroing of the row, then the taps with the row
    # loop n innermost
    assert zero.op == "=" and [lp.var for lp in zero.loops] == ["i", "n"]
    assert taps.op == "+=" and [lp.var for lp in taps.loops] == ["i", "k", "n"]
    assert zero.position == (0, 0, 0) and taps.position == (0, 1, 0, 0)
    assert "loop n moved innermost" in decisions["S1"]
    assert "S0 runs along the loop n before the updates of the elements it sets" \
        in decisions["S0"]
    _same_sums(kernel, out)


def test_an_initialization_leaves_a_nest_that_is_distributed():
    """Two sums of their own (the nest is split, one nest per statement): the zeroing
    runs in a nest of its own before them."""
    kernel = _zero_then_taps(second_sum=True)
    out, decisions = unit_stride_innermost(kernel)
    zero, taps, other = out.statements
    assert [lp.var for lp in zero.loops] == ["i", "n"]
    assert [lp.var for lp in taps.loops] == [lp.var for lp in other.loops] == ["i", "k", "n"]
    assert zero.position[0] < taps.position[0] < other.position[0]
    assert "S0 moved to a nest of its own before the updates" in decisions["S0"]
    _same_sums(kernel, out)


@pytest.mark.parametrize("case", ["update_reads_target", "one_owner"])
def test_an_initialization_stays_where_it_cannot_leave(case):
    kernel = _zero_then_taps(**{case: True})
    out, decisions = unit_stride_innermost(kernel)
    assert out is kernel
    assert all("reads an array the nest writes" in why or "is not an update" in why
               for why in decisions.values())


@pytest.mark.parametrize("deterministic", [False, True])
def test_input_gradient_alone_gets_the_pixel_row_innermost(deterministic):
    """The gradient wrt x only: d_x's zeroing joins the gather's nest (no d_w keeps it
    apart); the gather's taps must still move outside the row loop (104 -> 16 ms at B=4
    4->8ch 512x512 f32, benchmarks/README)."""
    grad = pa.grad(conv_cost, wrt="x")
    sk = _scheduled(grad, deterministic)
    gathers = [st for st in sk.kernel.statements if st.target_name == "d_x" and st.op == "+="]
    assert gathers and all(st.loops[-1].var == "v" and "kh" not in st.loop_vars
                           and "kw" not in st.loop_vars for st in gathers)
    # the zeroing of each row runs just before the row's updates, in the iteration of the
    # loops they share, and the gather runs in the loop over b of the nest writing d_s
    (zeroing,) = [st for st in sk.kernel.statements if st.target_name == "d_x" and st.op == "="]
    k = len(zeroing.loops) - 1
    assert all(st.loops[:k] == zeroing.loops[:k] and st.position[:k] == zeroing.position[:k]
               and st.position[k] > zeroing.position[k] for st in gathers)
    producers = [st for st in sk.kernel.statements if st.target_name == "d_s_expanded_rows"]
    assert producers and all(st.position[0] == zeroing.position[0] for st in producers)
    assert "runs along the loop v before the updates of the elements it sets" \
        in pa.explain(grad)
    conv_gradient_matches_interpreter(grad, pa.compile(grad, deterministic=deterministic), 14,
                                      [(1, 1, 1, 1, 1), (1, 2, 3, 4, 16), (2, 3, 2, 5, 37)])


C, K = pa.sizes("C K")


@pa.kernel
def channel_filter_sums(x: pa.f64[B, C, N].zero, d: pa.f64[B, K, N],
                        g: pa.Out(pa.f64[K, C, 3])):
    # a filter gradient: 3 sums along n per (k, c), each reading x (shared by every k)
    for b in range(B):
        for k in range(K):
            for c in range(C):
                for n in range(N):
                    g[k, c, 0] += d[b, k, n] * x[b, c, n - 1]
                    g[k, c, 1] += d[b, k, n] * x[b, c, n]
                    g[k, c, 2] += d[b, k, n] * x[b, c, n + 1]


@pa.kernel
def scaled_then_summed(x: pa.f64[B, C, N].zero, d: pa.f64[B, K, N],
                       e: pa.Out(pa.f64[B, K, N]), g: pa.Out(pa.f64[K, C, 3])):
    # the sums read the row of e that the same iteration of k writes
    for b in range(B):
        for k in range(K):
            for n in range(N):
                e[b, k, n] = 2.0 * d[b, k, n]
            for c in range(C):
                for n in range(N):
                    g[k, c, 0] += e[b, k, n] * x[b, c, n - 1]
                    g[k, c, 1] += e[b, k, n] * x[b, c, n]
                    g[k, c, 2] += e[b, k, n] * x[b, c, n + 1]


@pa.kernel
def one_row_reused(x: pa.f64[B, C, N].zero, d: pa.f64[B, K, N],
                   e: pa.Out(pa.f64[B, N]), g: pa.Out(pa.f64[K, C, 3])):
    # every iteration of k overwrites the row of e that its sums read: the sums cannot
    # leave k's body (they would all read the last k's row)
    for b in range(B):
        for k in range(K):
            for n in range(N):
                e[b, n] = 2.0 * d[b, k, n]
            for c in range(C):
                for n in range(N):
                    g[k, c, 0] += e[b, n] * x[b, c, n - 1]
                    g[k, c, 1] += e[b, n] * x[b, c, n]
                    g[k, c, 2] += e[b, n] * x[b, c, n + 1]


def _blocked_sums(sk):
    return [st for st in sk.kernel.statements
            if st.origin and st.origin[-1].kind == "block"]


@pytest.mark.parametrize("kernel, moved", [(channel_filter_sums, False),
                                           (scaled_then_summed, True),
                                           (one_row_reused, None)])
@pytest.mark.parametrize("deterministic", [False, True])
def test_sums_along_a_row_are_blocked_over_the_loop_whose_copies_share_reads(
        kernel, moved, deterministic):
    """block_sums_in_registers: 3 sums per pass, blocked by 4 values of k (the reads of x
    are shared, d's are not; blocking c would share only d). The sums leave k's body when
    nothing they read is written by another iteration of it (moved), else stay unblocked
    (None). Values against the interpreter at trip counts of k on either side of whole
    blocks (the copies past K skipped), bit for bit in the deterministic build."""
    sk = _scheduled(kernel, deterministic)
    blocked = _blocked_sums(sk)
    text = "; ".join(sk.loop_orders.values())
    if moved is None:
        assert not blocked and "blocked by" not in text
    else:
        assert len(blocked) == 12 and sorted(st.origin[-1].index for st in blocked) \
            == [0] * 3 + [1] * 3 + [2] * 3 + [3] * 3
        # the blocked loop reaches ISL over its iteration numbers (no existential variable)
        assert all(st.loops[1].var == "k_iter" and st.loops[1].step == 1
                   and st.loops[-1].var == "n" for st in blocked)
        assert any("4 * k_iter + 3, n]" in ir.expr_str(ld) for st in blocked
                   for ld in ir.loads(st.expr))
        assert "loop k (step 4, line " in "; ".join(sk.schedule_decisions)
        assert "loop k blocked by 4 into the loop n (4 values of k per pass over the row, " \
               "each read of x[b, c, n - 1], x[b, c, n], x[b, c, n + 1] used 4 times" in text
        assert ("sums moved out of the body of loop k into a loop of their own" in text) \
            == moved
    fn = pa.compile(kernel, deterministic=deterministic)
    rng = np.random.default_rng(21)
    for b, c, k, n in [(1, 1, 1, 1), (2, 2, 3, 5), (1, 3, 4, 17), (2, 1, 5, 40),
                       (1, 2, 9, 33)]:
        x = rng.standard_normal((b, c, n))
        d = rng.standard_normal((b, k, n))
        sizes = dict(B=b, C=c, K=k, N=n)
        args = dict(x=x, d=d, g=np.zeros((k, c, 3)))
        if kernel is not channel_filter_sums:
            args["e"] = np.zeros((b, k, n) if kernel is scaled_then_summed else (b, n))
        _, want = interpret(kernel.ir, {a: v.copy() for a, v in args.items()}, sizes)
        fn(**args)
        for name in want:
            if deterministic:
                np.testing.assert_array_equal(args[name], want[name])
            else:
                np.testing.assert_allclose(args[name], want[name], rtol=1e-12, atol=1e-12)


def test_a_blocked_loop_keeps_its_sums_in_registers():
    """The sums of the conv layer's filter gradient run for 2 output channels per pass
    over the row (9 taps: 18 sums, within the 24 of AVX-512's registers that sums may take,
    ``VectorUnit.sum_registers``; the suite runs with that unit) and one vector of lanes each."""
    grad = pa.grad(conv_cost32, wrt=["w", "x"])
    text = pa.explain(grad)
    assert "sums moved out of the body of loop co into a loop of their own after it (no " \
           "element shared with S2, S3, S4, S5, S6 across its iterations); loop co blocked " \
           "by 2 into the loop v" in text
    assert "per-lane partial sums: 16 lanes" in text
    src = grad.source
    assert "for (int64_t co_iter = 0; co_iter < pa_ifloord(CO, 2); co_iter++) {" in src
    assert "d_w[(((2 * co_iter + 1) * CI + ci) * 3 + 2) * 3 + 2] += d_w_lanes18[0];" in src


def test_blocked_loops_reach_isl_without_existential_variables(monkeypatch):
    """A loop blocked by 2 steps by 2, which ISL writes with a ``mod`` constraint (an
    existential variable in every set of its statements; their AST build is probed in a
    forked child, poly.strided_ast_build_crashes). It reaches ISL over its iteration
    numbers instead (strides.unit_stride_loops, run again after the loop-order passes):
    no existential variable, no fork, and explain says so."""
    from polyad import poly
    from polyad.pipeline import compile_kernel
    forks = []
    monkeypatch.setattr(poly, "text_within_seconds",
                        lambda compute, seconds: forks.append(seconds) or (compute(), ""))
    artifact = compile_kernel(pa.grad(conv_cost, wrt=["w", "x"]).ir, Options())
    sk = artifact.scheduled
    assert any(st.origin and st.origin[-1].kind == "block" for st in sk.kernel.statements)
    assert not poly._has_existentials(sk.schedule.get_domain()) and forks == []
    assert any(d.startswith("loop co (step 2, line ") and d.endswith(
        "runs over its iteration numbers co_iter: co = 2 * co_iter")
        for d in sk.schedule_decisions), sk.schedule_decisions


@pytest.mark.parametrize("wrt", [["w", "x"], ["x"], ["w"]])
def test_blocked_rolled_and_slabbed_conv_gradients_match_finite_differences(wrt):
    """The conv gradients as scheduled now (filter sums blocked over 2 output channels,
    the d_x gather a row behind through 3 rows of d_s, or d_s as a slab per (b, h))
    against central differences of the compiled cost (the primal's C, none of those
    passes): every element of w, and x along random directions. CO = 3 (a whole block
    and a peeled one), CI = 5 (the d_x gather's block of 4 input channels and one left
    over), W = 19 (a whole block of 8 lanes in the interior), H = 4."""
    rng = np.random.default_rng(17)
    b, ci, co, h, w = 1, 5, 3, 4, 19
    args = dict(x=rng.standard_normal((b, ci, h, w)), w=rng.standard_normal((co, ci, 3, 3)),
                y=rng.standard_normal((b, co, h, w)))
    cost = pa.compile(conv_cost)
    got = pa.grad(conv_cost, wrt=wrt)(**args)
    got = dict(zip(wrt, got if isinstance(got, tuple) else (got,)))
    eps = 1e-6

    def along(name, d):
        plus, minus = dict(args), dict(args)
        plus[name], minus[name] = args[name] + eps * d, args[name] - eps * d
        return (cost(**plus) - cost(**minus)) / (2 * eps)

    if "w" in got:
        for idx in np.ndindex(args["w"].shape):
            unit = np.zeros(args["w"].shape)
            unit[idx] = 1.0
            np.testing.assert_allclose(got["w"][idx], along("w", unit), rtol=1e-6, atol=1e-6)
    if "x" in got:
        for _ in range(4):
            d = rng.standard_normal(args["x"].shape)
            np.testing.assert_allclose(np.vdot(got["x"], d), along("x", d), rtol=1e-6,
                                       atol=1e-6)


@pa.kernel
def conv_relu(x: pa.f64[B, CI, H, W].zero, w: pa.f64[CO, CI, 3, 3],
              out: pa.Out(pa.f64[B, CO, H, W])):
    for b in range(B):
        for co in range(CO):
            for h in range(H):
                for v in range(W):
                    s = 0.0
                    for ci in range(CI):
                        for kh in range(3):
                            for kw in range(3):
                                s += w[co, ci, kh, kw] * x[b, ci, h + kh - 1, v + kw - 1]
                    out[b, co, h, v] = max(s, 0.0)


@pa.kernel
def three_channel_conv(x: pa.f64[B, CI, H, W].zero, w: pa.f64[3, CI, 3, 3],
                       out: pa.Out(pa.f64[B, 3, H, W])):
    for b in range(B):
        for co in range(3):
            for h in range(H):
                for v in range(W):
                    s = 0.0
                    for ci in range(CI):
                        for kh in range(3):
                            for kw in range(3):
                                s += w[co, ci, kh, kw] * x[b, ci, h + kh - 1, v + kw - 1]
                    out[b, co, h, v] = max(s, 0.0)


def _row_blocks(kernel, deterministic=False):
    """(the sum rows run in blocks, the plan's blocked loops) of ``kernel``."""
    sk = _scheduled(kernel, deterministic)
    blocked = [lp for lp in plan(sk, deterministic).loops.values() if lp.value_blocks]
    return [t for t in sk.kernel.temps if t.block], blocked, sk


@pytest.mark.parametrize("deterministic", [False, True])
def test_conv_sums_run_for_a_block_of_output_channels_per_pass(deterministic):
    """block_sum_rows_in_registers: the conv layer's per-point sums for ROW_BLOCK output
    channels in one pass over the row (each on its own row of s_rows, every read of x
    shared), the pointwise part after them for each channel in turn, the channels after
    the whole blocks as written. Values against the interpreter at CO on either side of
    whole blocks, and in the deterministic build bit for bit those of one channel at a
    time (CO = 1: no whole block, the loop as written; each element's terms in the same
    order)."""
    temps, blocked, sk = _row_blocks(conv_relu, deterministic)
    (row,) = temps
    assert row.name == "s_rows" and row.block == "co" and row.role == "sum row"
    assert [ir.expr_str(e) for e in row.type.shape] == [str(ROW_BLOCK), "W"]
    # the interior rows' loops over co (border rows, h fixed by ISL, run as written)
    assert blocked and all(lp.value_blocks[:2] == (ROW_BLOCK, "s_rows") and lp.iterator == "co"
                           and not lp.threads for lp in blocked)
    text = pa.explain(conv_relu, deterministic=deterministic)
    assert (f"loop co run in blocks of {ROW_BLOCK}: the sums into s_rows for the "
            f"{ROW_BLOCK} values of a block in one pass over the row v") in text
    assert f"run in blocks of {ROW_BLOCK} values (each on its own row of s_rows" in text
    src = pa.compile(conv_relu, deterministic=deterministic).source
    assert f"for (; co + {ROW_BLOCK - 1} < CO; co += {ROW_BLOCK}) {{" in src
    assert "for (; co < CO; co++) {" in src
    # the copies of the interior update share the reads of x: one pass, ROW_BLOCK rows
    k = src.index(f"s_rows[{ROW_BLOCK - 1} * W + v] += w_co{ROW_BLOCK - 1}_ci_0_0 * x[")
    loop = src[:k].rstrip().splitlines()
    assert any(line.strip().startswith("s_rows[v] += w_co_ci_0_0 * x[") for line in loop[-40:])
    assert "s_rows[W + v] += w_co1_ci_0_0 * x[" in src
    fn = pa.compile(conv_relu, deterministic=deterministic)
    rng = np.random.default_rng(23)
    for b, ci, co, h, w in [(1, 1, 1, 1, 1), (2, 2, 3, 4, 5), (1, 3, 4, 5, 17),
                            (2, 1, 5, 3, 9), (1, 2, 8, 4, 33), (1, 2, 9, 6, 7)]:
        x = rng.standard_normal((b, ci, h, w))
        wt = rng.standard_normal((co, ci, 3, 3))
        _, want = interpret(conv_relu.ir, dict(x=x, w=wt), dict(B=b, CI=ci, CO=co, H=h, W=w))
        got = fn(x, wt)
        np.testing.assert_allclose(got, want["out"], rtol=1e-12, atol=1e-12)
        if deterministic:
            one_at_a_time = np.concatenate([fn(x, wt[c:c + 1]) for c in range(co)], axis=1)
            np.testing.assert_array_equal(got, one_at_a_time)


def test_sum_rows_stay_unblocked_without_two_whole_blocks():
    """A loop of 3 output channels (a constant trip count below 2 * ROW_BLOCK) keeps
    one row and its loop as written."""
    temps, blocked, sk = _row_blocks(three_channel_conv)
    assert not temps and not blocked
    (row,) = [t for t in sk.kernel.temps if t.name == "s_rows"]
    assert len(row.type.shape) == 1 and not any("blocks of" in w
                                                 for w in sk.loop_orders.values())


def test_conv_layer_gradient_recomputes_its_sums_in_blocks():
    """The conv gradient's recomputed forward sums run in blocks of output channels too
    (its filter sums blocked by block_sums_in_registers before)."""
    temps, blocked, _ = _row_blocks(pa.grad(conv_cost, wrt=["w", "x"]))
    assert [t.name for t in temps] == ["s_rows"] and temps[0].block == "co" and blocked


@pytest.mark.parametrize("wrt", [["x"], ["w", "x"]])
def test_conv_input_gradient_gathers_a_block_of_input_channels_per_pass(wrt, monkeypatch):
    """The d_x gather's loop over ci carries no dependence (each d_x row is one input
    channel's): the emitter runs it in blocks of ROW_BLOCK, the 9 taps' reads of d_s
    shared by the block's rows of d_x. Values against the interpreter at CI on either
    side of whole blocks; in the deterministic build bit for bit those of the same plan
    without the blocks."""
    grad = pa.grad(conv_cost, wrt=wrt)
    blocks = [lp for lp in plan(_scheduled(grad)).loops.values()
              if lp.value_blocks and not lp.value_blocks[1]]
    assert blocks and all(lp.iterator == "ci" and lp.value_blocks[0] == ROW_BLOCK for lp in blocks)
    sk = _scheduled(grad)
    assert all(sk.statement(n).target_name == "d_x" for lp in blocks for n in lp.value_blocks[2])
    assert f"run in blocks of {ROW_BLOCK} values (no dependence carried: the copies of a " \
           f"block in one pass over their rows, sharing their reads)" in pa.explain(grad)
    assert f"for (; ci + {ROW_BLOCK - 1} < CI; ci += {ROW_BLOCK}) {{" in grad.source
    conv_gradient_matches_interpreter(grad, grad, 29, [(1, 1, 2, 3, 5), (1, 3, 2, 4, 9),
                                                       (2, 4, 1, 3, 17), (1, 5, 3, 4, 8),
                                                       (1, 9, 2, 5, 33)])
    rng = np.random.default_rng(31)
    args = dict(x=rng.standard_normal((2, 6, 5, 19)), w=rng.standard_normal((3, 6, 3, 3)),
                y=rng.standard_normal((2, 3, 5, 19)))
    blocked = pa.compile(grad, deterministic=True)(**args)
    # the same kernel under another name (derived kernels and builds are cached per
    # kernel), planned without the blocks
    monkeypatch.setattr(openmp._Planner, "_parallel_block", lambda *a: ())
    again = pa.Kernel(ir_kernel=dataclasses.replace(conv_cost.ir, name="conv_cost_again"))
    plain = pa.grad(again, wrt=wrt)
    assert f"ci += {ROW_BLOCK}" not in pa.compile(plain, deterministic=True).source
    unblocked = pa.compile(plain, deterministic=True)(**args)
    for got, want in zip(blocked if isinstance(blocked, tuple) else (blocked,),
                         unblocked if isinstance(unblocked, tuple) else (unblocked,)):
        np.testing.assert_array_equal(got, want)
