"""Producer-consumer fusion through rolling row buffers (``polyad.schedule.fusion``,
``pa.compile(..., fuse=True)``).

The decisions are asserted on the deconvolution gradient of ``benchmarks/`` (the
same kernel, from ``deconv_kernels``), and every fused kernel is run against the reference
interpreter (program order, full-size temporaries), default and deterministic,
at sizes from one row to several chunks of rows.
"""

import functools

import numpy as np
import pytest

import polyad as pa
from polyad import ir
from polyad.pipeline import Options, artifact_of
from polyad.schedule.fusion import (BALANCED, CHUNK_ROWS, FINE_CHUNK_ROWS, chunk_balance,
                                     chunk_schedule, row_streams)
from polyad.testing import interpret

from ad_helpers import assert_close, fd_grad, run_reference, scalar_fn
from deconv_kernels import deconvolution
from test_border_pieces import stencil7
from test_shared_loop_fusion import scale_then_vertical

M, N = pa.sizes("M N")


deconv_cost = deconvolution("f64")


@pa.kernel
def column_sums(x: pa.f64[M, N], z: pa.Out(pa.f64[M, N])):
    t = pa.empty(pa.f64[M, N])
    for m in range(M):
        for n in range(N):
            t[m, n] = 2.0 * x[m, n]
    for m in range(M):
        for n in range(N):
            z[m, n] = 0.0
            for k in range(M):
                z[m, n] += t[k, n]


@pa.kernel
def output_then_blur(x: pa.f64[M, N], t: pa.Out(pa.f64[M, N].clamped),
                     z: pa.Out(pa.f64[M, N])):
    for m in range(M):
        for n in range(N):
            t[m, n] = 2.0 * x[m, n]
    for m in range(M):
        for n in range(N):
            z[m, n] = t[m - 1, n] + t[m, n] + t[m + 1, n]


@pa.kernel
def blur_then_vertical_and_next_column(x: pa.f64[M, N].clamped, f: pa.f64[5],
                                       y: pa.f64[M, N]) -> pa.f64:
    """``deconv_cost`` with a 3-tap row blur, and its last vertical tap one column right."""
    t = pa.empty(pa.f64[M, N].clamped)
    for m in range(M):
        for n in range(N):
            t[m, n] = f[0] * x[m, n - 1] + f[1] * x[m, n] + f[2] * x[m, n + 1]
    C = 0.0
    for m in range(M):
        for n in range(N):
            r = (f[0] * t[m - 2, n] + f[1] * t[m - 1, n] + f[2] * t[m, n]
                 + f[3] * t[m + 1, n] + f[4] * t[m + 2, n + 1]) - y[m, n]
            C += r * r
    return C


# one chunk; several, the last of one row (its border scatter comes from two chunks), of
# two rows, of CHUNK_ROWS - 1 rows
SIZES = [(1, 1), (2, 3), (3, 4), (5, 7), (70, 9), (2 * CHUNK_ROWS + 1, 4),
         (2 * CHUNK_ROWS + 2, 5), (3 * CHUNK_ROWS - 1, 6)]


def _decisions(kernel, target="openmp"):
    sk = artifact_of(kernel, Options(target=target, fuse=True)).scheduled
    return sk, [d for d in sk.schedule_decisions if "fused the nests" in d or "not fused" in d]


def test_deconvolution_gradient_keeps_blur_rows_per_thread():
    g = pa.grad(deconv_cost, wrt=["x", "f"])
    sk, decisions = _decisions(g)
    fused = [d for d in decisions if d.startswith("fused the nests")]
    assert len(fused) == 1 and len(decisions) == 1, sk.schedule_decisions
    (text,) = fused
    # the whole gradient in one loop over rows: the blur (S2), the residual with its d_f
    # sums (S4-S14: each chunk adds them for its own rows only), the d_t pass (its border
    # rows gathered in their own steps, zeroed there) and the d_x pass, which reads only
    # the row of d_t its step writes -- the hand-written line-buffered gradient
    assert text.startswith("fused the nests of S2, S3, S4, S5, S7, S9, S11, S13, zero_d_t, "
                           "S6, S8, S10, S12, S14 into the nest of S0, S15, ")
    assert ("at depth 1 (loop m; S2 4 rows ahead; S3, S4, S5, S7, S9, S11, S13 2 rows "
            "ahead; zero_d_t, S6, S8, S10, S12, S14 0 rows ahead)") in text
    assert ("d_r_expanded kept as 5 rows per thread (d_r_expanded_rows), d_t kept as 1 row "
            "per thread (d_t_rows), t kept as 5 rows per thread (t_rows)") in text
    rows = {t.name: [str(e) for e in t.type.shape] for t in sk.kernel.temps if t.role == "rows"}
    assert set(rows) == {"t_rows", "d_t_rows", "d_r_expanded_rows"}
    assert sk.kernel.array_type("t_rows").shape[0] == pa.ir.Const(5, pa.ir.i64)
    assert sk.kernel.array_type("d_t_rows").shape[0] == pa.ir.Const(1, pa.ir.i64)
    # no full-size temporary is left for the caller to pass
    assert sk.kernel.caller_temps == ()
    source = artifact_of(g, Options(fuse=True)).source
    assert "double *restrict t, " not in source and "malloc(" in source
    # some chunk loop runs its chunks on threads, each with its own buffers
    chunk_loops = [lp for lp in sk.loops.values() if lp.row_buffers]
    assert chunk_loops and all(lp.parallel for lp in chunk_loops)
    assert "fused the nests of S2, S3, " in pa.explain(g, fuse=True)
    # on by default: every buffer is rows of one dimension
    assert text in pa.explain(g) and text in pa.explain(g, fuse=None)
    assert "fused the nests" not in pa.explain(g, fuse=False)


def test_each_thread_allocates_its_row_buffers_once_for_the_chunks_it_runs():
    """The chunk loop opens the parallel region, each thread allocates the buffers there
    and the chunks are shared out with 'omp for' (``LoopPlan.buffers_per_thread``): a
    thread's chunks reuse its buffers, each chunk writing every row it reads first. The
    values stay the interpreter's with every chunk count per thread, the outputs passed
    in filled with NaN."""
    g = pa.grad(deconv_cost, wrt=["x", "f"])
    k = pa.compile(g, fuse=True)
    lines = k.source.splitlines()
    regions = [i for i, line in enumerate(lines)
               if line.strip() == "#pragma omp parallel reduction(+:d_f[0:5]) private(r)"]
    assert regions
    for i in regions:
        ind = lines[i][:len(lines[i]) - len(lines[i].lstrip())]
        assert lines[i + 1] == ind + "{"
        allocs = lines[i + 2:i + 5]
        assert sorted(a.split(" = malloc(")[0].strip() for a in allocs) == [
            "double *restrict d_r_expanded_rows", "double *restrict d_t_rows",
            "double *restrict t_rows"]
        assert all(a.endswith("for a chunk of 64 rows of m; one per thread, reused by the "
                              "iterations it runs") for a in allocs)
        assert lines[i + 5] == ind + "  #pragma omp for schedule(static, 1)"
        assert lines[i + 6].startswith(ind + "  for (int64_t m_chunk = 0; ")
        end = lines.index(ind + "  }", i + 6)
        assert not any("malloc(" in line or "free(" in line for line in lines[i + 6:end])
        assert [line.strip() for line in lines[end + 1:end + 5]] == [
            "free(d_r_expanded_rows);", "free(d_t_rows);", "free(t_rows);", "}"]
    assert ("own row buffers d_r_expanded_rows, d_t_rows, t_rows per iteration, allocated "
            "once per thread in the parallel region around the loop") in pa.explain(g, fuse=True)
    rng = np.random.default_rng(21)
    for m, n in [(5 * CHUNK_ROWS + 3, 7), (3 * CHUNK_ROWS, 12), (CHUNK_ROWS + 1, 9)]:
        x, f, y = rng.standard_normal((m, n)), rng.standard_normal(5), rng.standard_normal((m, n))
        _, want = interpret(g.ir, dict(x=x, f=f, y=y), dict(M=m, N=n))
        for threads in (1, 2, 3):
            d_x, d_f = np.full((m, n), np.nan), np.full(5, np.nan)
            with pa.num_threads(threads):
                k(x, f, y, d_x=d_x, d_f=d_f)
            np.testing.assert_allclose(d_x, want["d_x"], rtol=1e-12, atol=1e-12,
                                       err_msg=f"{m}x{n}, {threads} threads")
            np.testing.assert_allclose(d_f, want["d_f"], rtol=1e-12, atol=1e-10,
                                       err_msg=f"{m}x{n}, {threads} threads")


def test_the_row_loops_of_a_fused_step_run_as_one_loop():
    """``jam_row_loops``: in the fused deconvolution gradient's step the blur row (S2) and
    the residual row with its d_f sums (S3-S13) run in one loop over ``n`` (9 rows: x, 5
    of t, y, d_r's, d_t's); the d_t row (S6-S14) keeps its own, which with them would
    walk 13 rows (``ROW_STREAMS``); the d_x row (S16-S24), which reads d_t two columns
    either side, keeps its own loop (jammed, it would read columns of d_t not yet
    written), and gives its d_f sums (S15-S23, odd), which read d_t in the iteration
    that writes it, to the d_t row (``_jammable_part``)."""
    g = pa.grad(deconv_cost, wrt=["x", "f"])
    sk = artifact_of(g, Options(fuse=True)).scheduled
    jams = [d for d in sk.schedule_decisions if d.startswith(("jammed", "kept the row"))]
    assert jams == [
        "jammed the row loop of zero_d_t, S3, S4, S5, S7, S9, S11, S13 into that of S2 (loop n "
        "inside m): what one reads of the other is accessed in the same iteration",
        "kept the row loop of S6, S8, S10, S12, S14 apart from that of zero_d_t, S2, S3, S4, "
        "S5, S7, S9, S11, S13 (loop n inside m): as one loop they would walk 13 rows, more "
        "than the 10 whose addresses stay in registers",
        "jammed the row loop of S15, S17, S19, S21, S23 into that of S6, S8, S10, S12, S14 "
        "(loop n inside m): what one reads of the other is accessed in the same iteration; "
        "S0, S16, S18, S20, S22, S24 keep their own loop (reading what it writes in other "
        "iterations) and share nothing with the statements moved"], sk.schedule_decisions
    loops = {st.owner: st.position[:3] for st in sk.kernel.statements
             if st.loops and st.loops[0].var == "m_chunk"}
    assert loops["S2"] == loops["S3"] != loops["S6"]
    assert loops["S6"] == loops["S15"] == loops["S23"] != loops["S16"] == loops["S24"]
    assert len({loops["S2"], loops["S6"], loops["S16"]}) == 3
    step = [st for st in sk.kernel.statements if st.loops and st.loops[0].var == "m_chunk"
            and len(st.loops) > 2]
    assert len(row_streams([st for st in step if st.position[:3] == loops["S2"]])) == 9
    assert len(row_streams([st for st in step if st.position[:3] in
                            (loops["S2"], loops["S6"])])) == 14
    assert "jammed the row loop of zero_d_t" in pa.explain(g)
    assert "kept the row loop of S6" in pa.explain(g)
    assert "jammed the row loop of S15" in pa.explain(g)
    assert "jammed" not in pa.explain(g, fuse=False)


def test_one_row_is_counted_once_however_its_index_is_written():
    """``row_streams``: the same row written three ways (``(m - 1) % 5`` is the slot of
    ``(m + 4) % 5``) is one; rows of a border piece fixed along the step count only for
    an array no access walks with the step."""
    m, n, two = ir.LoopVar("m"), ir.LoopVar("n"), ir.Const(2, ir.i64)
    loops = (ir.Loop("c", ir.Const(0, ir.i64), ir.Const(4, ir.i64)),
             ir.Loop("m", ir.Const(0, ir.i64), ir.SizeVar("M")),
             ir.Loop("n", ir.Const(0, ir.i64), ir.SizeVar("N")))

    def at(*index):
        return tuple(ir.fold_integer_constants(i) for i in index)

    def ring(e):
        return ir.Binary("%", e, ir.Const(5, ir.i64), ir.i64)

    def plus(a, b):
        return ir.Binary("+", a, b, ir.i64)

    def minus(a, b):
        return ir.Binary("-", a, b, ir.i64)

    def statement(name, target, *reads):
        expr = reads[0]
        for r in reads[1:]:
            expr = ir.Binary("+", expr, r, ir.f64)
        return ir.Statement(name=name, loops=loops, position=(0, 0, 0, 0), conditions=(),
                            guard=None, target=target, op="=", expr=expr)

    t = ir.Load("t_rows", at(ring(plus(m, ir.Const(4, ir.i64))), n), ir.f64)
    same = ir.Load("t_rows", (ring(minus(plus(m, ir.Const(6, ir.i64)), two)),
                              minus(n, ir.Const(1, ir.i64))), ir.f64)
    other = ir.Load("t_rows", (ring(m), n), ir.f64)
    congruent = ir.Load("t_rows", (ring(minus(m, ir.Const(1, ir.i64))), n), ir.f64)
    border = ir.Load("t_rows", (ring(ir.Const(0, ir.i64)), n), ir.f64)
    one_row = ir.Load("d_rows", (ir.Const(0, ir.i64), n), ir.f64)
    x = ir.Load("x", (plus(m, two), plus(n, two)), ir.f64)
    x_left = ir.Load("x", (plus(two, m), minus(n, two)), ir.f64)
    f0 = ir.Load("f", (ir.Const(0, ir.i64),), ir.f64)
    sts = [statement("A", t, x, x_left, f0),
           statement("B", one_row, same, congruent, other, border)]
    assert row_streams(sts) == row_streams(sts[:1]) | row_streams([statement(
        "C", one_row, other)])
    assert len(row_streams(sts)) == 4  # x, t (m + 4), t (m), d_rows


@pytest.mark.parametrize("kernel, jammed", [(deconv_cost, True),
                                            (blur_then_vertical_and_next_column, False)])
def test_row_loops_are_jammed_only_where_each_column_is_read_where_it_is_written(kernel,
                                                                                 jammed):
    """The residual row reading the blurred rows at its own column shares the blur's row
    loop; reading row ``m + 2`` at the next column (``t[m + 2, n + 1]``, the row the step
    writes) it does not: that column would not be written yet (run as one loop anyway, 6
    of these 8 sizes give wrong costs). Forward and gradient
    against the interpreter, at sizes around the chunk height."""
    sk = artifact_of(kernel, Options()).scheduled
    assert any(d.startswith("fused the nests") for d in sk.schedule_decisions)
    assert any(d.startswith("jammed the row loop of S2, S3 into that of S0")
               for d in sk.schedule_decisions) == jammed, sk.schedule_decisions
    g = pa.grad(kernel, wrt=["x", "f"])
    fwd, grad = pa.compile(kernel), pa.compile(g)
    rng = np.random.default_rng(14)
    for m, n in SIZES:
        x, f, y = rng.standard_normal((m, n)), rng.standard_normal(5), rng.standard_normal((m, n))
        want, _ = interpret(kernel.ir, dict(x=x, f=f, y=y), dict(M=m, N=n))
        np.testing.assert_allclose(fwd(x, f, y), want, rtol=1e-12, err_msg=f"{m}x{n}")
        dx, df = grad(x, f, y)
        _, want = interpret(g.ir, dict(x=x, f=f, y=y), dict(M=m, N=n))
        np.testing.assert_allclose(dx, want["d_x"], rtol=1e-12, atol=1e-12, err_msg=f"{m}x{n}")
        np.testing.assert_allclose(df, want["d_f"], rtol=1e-12, atol=1e-10, err_msg=f"{m}x{n}")


def test_buffers_of_planes_are_fused_by_default():
    """The 3-D stencil gradient's chain keeps 3 planes per thread (14-25 % faster at
    256^3 and 512^3, with the planes past the L2). Against the interpreter at one plane
    and at several chunks of planes."""
    g = pa.grad(stencil7, wrt="x")
    text = pa.explain(g)
    assert "d_r_expanded kept as 3 rows per thread" in text
    assert ("at run time, a call of 2^20 points or more whose chunks of 64 rows of X would "
            "keep a thread busy for less than 80% of the busiest one's time, or whose sizes "
            "miss X >= 6 and Y >= 4 and Z >= 4, runs the unfused schedule") in text
    assert ("before that, one whose chunks of 16 rows keep every thread busy for at least "
            "80% of the busiest one's time, and the threads busier than chunks of 64 rows do "
            "by more than 5%, runs chunks of 16 rows (fuse=16)") in text
    assert "d_r_expanded kept as 3 rows per thread" in pa.explain(g, fuse=True)
    assert "the loop over i runs in chunks of 16 rows" in pa.explain(g, fuse=16)
    assert "fused the nests" not in pa.explain(g, fuse=False)
    rng = np.random.default_rng(8)
    for shape in [(1, 1, 1), (3, 2, 4), (5, 4, 3), (2 * CHUNK_ROWS + 3, 3, 2),
                  (2 * FINE_CHUNK_ROWS + 1, 2, 3)]:
        x, y = rng.standard_normal(shape), rng.standard_normal(shape)
        want = run_reference(g, x, y)
        for fuse in (None, True, FINE_CHUNK_ROWS):
            assert_close(pa.compile(g, fuse=fuse)(x, y), want, rtol=1e-12, atol=1e-12)


def test_a_call_whose_chunks_leave_a_thread_idle_runs_finer_chunks(monkeypatch):
    """The 3-D stencil gradient's chunks recompute 2 planes: a call of 161 planes on 2
    threads (chunks of 64: 97 planes for one thread, 64 for the other) runs chunks of
    16 planes, compiled on first use; 256 planes (balanced) and one thread run the
    default's chunks. Values against the unfused schedule (the finer chunks' against the
    interpreter: ``test_buffers_of_planes_are_fused_by_default``); the deconvolution
    gradient (8 rows recomputed per chunk) has no finer chunks."""
    g = pa.grad(stencil7, wrt="x")
    fine = pa.compile(g, fuse=FINE_CHUNK_ROWS)
    calls = []
    c_function = fine._fn
    monkeypatch.setattr(fine, "_fn", lambda *a: calls.append(1) or c_function(*a))
    rng = np.random.default_rng(17)
    for threads, planes, runs_fine in [(2, 161, True), (2, 256, False), (1, 161, False)]:
        shape = (planes, 64, 1 + (1 << 20) // (planes * 64))
        x, y = rng.standard_normal(shape), rng.standard_normal(shape)
        calls.clear()
        with pa.num_threads(threads):
            got = pa.compile(g)(x, y)
        assert len(calls) == runs_fine, (threads, planes)
        if planes == 161:
            np.testing.assert_allclose(got, pa.compile(g, fuse=False)(x, y), rtol=1e-12,
                                       atol=1e-12)
    assert "chunks of 16 rows" not in pa.explain(pa.grad(deconv_cost, wrt=["x", "f"]))


@pytest.mark.parametrize("extent, threads, balanced", [
    (1, 1, True), (65, 1, True),            # one thread: never idle
    (1, 2, False), (CHUNK_ROWS, 2, False),  # one chunk: the other thread idle
    (100, 2, False),                        # 64 and 36 rows: 78 %
    (128, 2, True), (130, 2, True),         # 64 and 64 (+ 2) rows
    (161, 2, True),                         # 64 + 33 and 64 rows: 83 %
    (192, 2, False),                        # 128 and 64 rows: 75 %
    (2048, 2, True), (256, 4, True), (192, 4, False)])
def test_chunks_balance_the_threads(extent, threads, balanced):
    """Chunks go to the threads round-robin (``schedule(static, 1)``); a call runs the
    fused chain when each thread is busy for at least 80 % of the busiest one's time."""
    assert (chunk_balance(extent, threads, CHUNK_ROWS) >= BALANCED) == balanced
    big = 1 << 20
    assert chunk_schedule([extent], big, threads) == ("fused" if balanced else "unfused")
    assert chunk_schedule([extent], big - 1, threads) == "fused"
    assert chunk_schedule([extent], big, threads, small=True) == "unfused"


@pytest.mark.parametrize("extent, threads, schedule", [
    (161, 2, "fine"),      # 97 and 64 planes (83 %); in 16s: 81 and 80
    (100, 2, "fine"),      # 64 and 36 (78 %, else unfused); in 16s: 52 and 48
    (CHUNK_ROWS, 2, "fine"), (20, 2, "unfused"),  # 16 and 4 rows: 62 %
    (256, 2, "fused"),     # balanced in 64s: the finer chunks would only cost
    (130, 2, "fused"),     # 66 and 64 (98 %): the finer ones gain less than 5 %
    (161, 1, "fused")])
def test_finer_chunks_run_where_they_balance_the_threads(extent, threads, schedule):
    """Where a chain's chunks recompute few rows, a large call whose chunks of 64 rows
    leave a thread partly idle runs chunks of 16 rows when those keep the threads busier
    by more than 5 %, and for at least 80 % of the busiest one's time."""
    assert chunk_schedule([extent], 1 << 20, threads, fine=True) == schedule
    assert chunk_schedule([256, extent], 1 << 20, threads, fine=True) == schedule


def test_a_call_whose_chunks_leave_a_thread_idle_runs_the_unfused_schedule(monkeypatch):
    """A 64-row image on two threads is one chunk: the fused deconvolution gradient ran
    1.5x slower than the unfused one at 64 x 65536. Such a call of 2^20 points or more
    runs the unfused schedule (compiled on first use); one thread, more rows, or fewer
    points run the fused chain, and ``fuse=True`` always does. Each against numpy."""
    g = pa.grad(deconv_cost, wrt=["x", "f"])
    unfused = pa.compile(g, fuse=False)  # what the default compilation falls back to
    calls = []
    c_function = unfused._fn
    monkeypatch.setattr(unfused, "_fn", lambda *a: calls.append(1) or c_function(*a))
    rng = np.random.default_rng(15)
    points = 1 << 20
    cases = [(2, CHUNK_ROWS, points // CHUNK_ROWS, True),  # one chunk, the other thread idle
             (2, 100, points // 100 + 1, True),            # 64 and 36 rows
             (1, CHUNK_ROWS, points // CHUNK_ROWS, False),  # one thread
             (2, 4 * CHUNK_ROWS, points // (4 * CHUNK_ROWS), False),  # 2 chunks per thread
             (2, CHUNK_ROWS, 6, False)]                    # a small call
    for threads, m, n, runs_unfused in cases:
        x, f, y = rng.standard_normal((m, n)), rng.standard_normal(5), rng.standard_normal((m, n))
        want_dx, want_df = _deconvolution_gradient_numpy(x, f, y)
        for fuse in (None, True):
            calls.clear()
            with pa.num_threads(threads):
                dx, df = pa.compile(g, fuse=fuse)(x, f, y)
            assert len(calls) == (runs_unfused and fuse is None), (threads, m, n, fuse)
            np.testing.assert_allclose(dx, want_dx, rtol=1e-12, atol=1e-11)
            np.testing.assert_allclose(df, want_df, rtol=1e-10)


def _deconvolution_gradient_numpy(x, f, y):
    """(d_x, d_f) of ``deconv_cost`` in numpy: clamped indices, the adjoint scatters by
    ``np.add.at`` (an independent reference, fast enough at 2^20 points)."""
    m, n = x.shape
    cols = [np.clip(np.arange(n) + k - 2, 0, n - 1) for k in range(5)]
    rows = [np.clip(np.arange(m) + k - 2, 0, m - 1) for k in range(5)]
    t = sum(f[k] * x[:, cols[k]] for k in range(5))
    d_r = 2 * (sum(f[k] * t[rows[k], :] for k in range(5)) - y)
    d_t, d_x = np.zeros_like(t), np.zeros_like(x)
    for k in range(5):
        np.add.at(d_t, rows[k], f[k] * d_r)
    for k in range(5):
        np.add.at(d_x, (slice(None), cols[k]), f[k] * d_t)
    d_f = np.array([(d_r * t[rows[k], :]).sum() + (d_t * x[:, cols[k]]).sum()
                    for k in range(5)])
    return d_x, d_f


@pytest.mark.parametrize("deterministic", [False, True])
def test_fused_deconvolution_gradient_matches_the_interpreter(deterministic):
    g = pa.grad(deconv_cost, wrt=["x", "f"])
    k = pa.compile(g, deterministic=deterministic, fuse=True)
    rng = np.random.default_rng(11)
    for m, n in SIZES:
        x, f, y = rng.standard_normal((m, n)), rng.standard_normal(5), rng.standard_normal((m, n))
        dx, df = k(x, f, y)
        _, want = interpret(g.ir, dict(x=x, f=f, y=y), dict(M=m, N=n))
        np.testing.assert_allclose(dx, want["d_x"], rtol=1e-12, atol=1e-12, err_msg=f"{m}x{n}")
        np.testing.assert_allclose(df, want["d_f"], rtol=1e-12, atol=1e-10, err_msg=f"{m}x{n}")


def test_fused_forward_matches_the_interpreter():
    sk, fused = _decisions(deconv_cost)
    assert fused and "t kept as 5 rows per thread" in fused[0]
    rng = np.random.default_rng(12)
    for m, n in SIZES:
        x, f, y = rng.standard_normal((m, n)), rng.standard_normal(5), rng.standard_normal((m, n))
        want, _ = interpret(deconv_cost.ir, dict(x=x, f=f, y=y), dict(M=m, N=n))
        np.testing.assert_allclose(pa.compile(deconv_cost, fuse=True)(x, f, y), want,
                                   rtol=1e-12)


def test_fused_deconvolution_gradient_against_finite_differences():
    k = pa.compile(pa.grad(deconv_cost, wrt=["x", "f"]), fuse=True)
    rng = np.random.default_rng(13)
    for m, n in [(1, 1), (2, 5), (4, 3), (6, 6)]:
        args = dict(x=rng.standard_normal((m, n)), f=rng.standard_normal(5),
                    y=rng.standard_normal((m, n)))
        dx, df = k(*[a.copy() for a in args.values()])
        cost = scalar_fn(deconv_cost, args)
        assert_close(dx, fd_grad(cost, args, "x"), 1e-6, 1e-7, what=f"d/dx {m}x{n}")
        assert_close(df, fd_grad(cost, args, "f"), 1e-6, 1e-7, what=f"d/df {m}x{n}")


def test_unbounded_window_is_not_fused():
    sk, fused = _decisions(column_sums)
    assert fused == ["not fused: the nest of S1, S2 reads 't' outside the window ISL can bound "
                     "along the outer loop"], sk.schedule_decisions
    assert not any(t.role == "rows" for t in sk.kernel.temps)
    x = np.random.default_rng(14).standard_normal((5, 4))
    _, want = interpret(column_sums.ir, dict(x=x), dict(M=5, N=4))
    np.testing.assert_allclose(pa.compile(column_sums, fuse=True)(x), want["z"], rtol=1e-14)


def test_a_kernel_output_is_never_a_row_buffer():
    sk, fused = _decisions(output_then_blur)
    assert fused == ["not fused: the nest of S0 is no producer: it writes 't', a kernel "
                     "parameter"], sk.schedule_decisions
    assert not any(t.role == "rows" for t in sk.kernel.temps)
    x = np.random.default_rng(15).standard_normal((6, 3))
    t, z = pa.compile(output_then_blur, fuse=True)(x)
    _, want = interpret(output_then_blur.ir, dict(x=x), dict(M=6, N=3))
    np.testing.assert_allclose(t, want["t"], rtol=1e-14)
    np.testing.assert_allclose(z, want["z"], rtol=1e-14)


def test_sums_alone_make_no_producer():
    """PolyBench's mvt: the first nest only adds into the kernel array x1, which the second
    never reads: no temporary for a buffer, so nothing to fuse (a producer's sums into
    kernel arrays ride along with a temporary it produces, as the deconvolution
    residual's d_f sums do)."""
    from c_corpus.polybench_dsl import mvt
    sk, fused = _decisions(mvt)
    assert fused == [] and not any(t.role == "rows" for t in sk.kernel.temps)
    rng = np.random.default_rng(16)
    args = {name: rng.standard_normal(shape) for name, shape in
            (("x1", 5), ("x2", 5), ("y_1", 5), ("y_2", 5), ("A", (5, 5)))}
    _, want = interpret(mvt.ir, {k: v.copy() for k, v in args.items()}, dict(N=5))
    got = {k: v.copy() for k, v in args.items()}
    pa.compile(mvt, fuse=True)(*got.values())  # (x1 and x2 are updated in place)
    np.testing.assert_allclose(got["x1"], want["x1"], rtol=1e-14)
    np.testing.assert_allclose(got["x2"], want["x2"], rtol=1e-14)


def test_cuda_keeps_the_unfused_schedule():
    # a CUDA thread runs one iteration, not a chunk of rows: no row buffers
    sk, fused = _decisions(pa.grad(deconv_cost, wrt=["x", "f"]), target="cuda")
    assert fused == [] and not any(t.role == "rows" for t in sk.kernel.temps)


@functools.lru_cache(maxsize=None)
def _corpus_fusions():
    """(name, derived kernel, args, sizes) of the AD corpus gradients that fusion changes."""
    import zlib

    from test_ad_corpus import CASES

    out = []
    for name in sorted(CASES):
        c = CASES[name]
        if c["issue"]:
            continue
        kernel, args = c["make"](np.random.default_rng(zlib.crc32(name.encode())))
        wrt = [c["wrt"]] if isinstance(c["wrt"], str) else list(c["wrt"])
        for k in (kernel, pa.grad(kernel, wrt=wrt)):
            _, fused = _decisions(k)
            if any(d.startswith("fused the nests") for d in fused):
                out.append((name, k, args, c["sizes"]))
    return out


def test_fused_corpus_kernels_match_the_interpreter():
    """Every kernel and gradient of the AD corpus that fusion changes, compiled fused,
    against the reference interpreter (program order, full-size temporaries);
    deterministic plans of the fused deconvolution gradient are checked above."""
    deterministic = False
    cases = _corpus_fusions()
    assert any(name.startswith("deconv") for name, *_ in cases), [n for n, *_ in cases]
    for name, k, args, sizes in cases:
        copy = {n: (v.copy() if isinstance(v, np.ndarray) else v) for n, v in args.items()}
        got = pa.compile(k, deterministic=deterministic, fuse=True)(**copy, **sizes)
        want = run_reference(k, **{n: (v.copy() if isinstance(v, np.ndarray) else v)
                                    for n, v in args.items()}, **sizes)
        got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-11, err_msg=name)


def test_a_bad_fuse_option_is_refused():
    for bad in ("yes", "16", 0, -16, 1.5, 0.0):
        with pytest.raises(pa.ArgumentError, match="fuse must be None .* True .* a positive "
                                                   "number of rows .* or False"):
            pa.compile(deconv_cost, fuse=bad)


def test_a_piece_run_after_the_chunk_loop_keeps_the_chunks_buffers_shared():
    """The consumer's piece at m = M - 1 (t[M, n] clamped to row M - 1) runs after every
    other instance of the last chunk, and ISL's AST runs it after the chunk loop, outside
    any chunk's buffers. No loop may then keep ``t_rows`` per chunk (the piece would read
    a buffer nobody wrote): with ``fuse=True`` the chunks share one buffer, and a loop
    runs in parallel only where the buffer's dependences allow it (ISL's schedule runs
    tiles of columns in parallel, each column its own elements of the buffer); by default
    the kernel is not fused, and says why."""
    from polyad.schedule.build import _buffers_no_loop_owns

    sk = artifact_of(scale_then_vertical, Options(fuse=True)).scheduled
    assert _buffers_no_loop_owns(sk) == ["t_rows"]
    assert not any("t_rows" in lp.row_buffers for lp in sk.loops.values())
    default = artifact_of(scale_then_vertical, Options()).scheduled
    assert "not fused: no chunk loop runs t_rows per chunk" in " ".join(
        default.schedule_decisions)
    assert not [t for t in default.kernel.temps if t.role == "rows"]
    rng = np.random.default_rng(9)
    for m, n in [(1, 1), (2, 3), (CHUNK_ROWS + 1, 3), (2 * CHUNK_ROWS + 1, 2), (70, 5),
                 (130, 600)]:
        x = rng.standard_normal((m, n))
        _, want = interpret(scale_then_vertical.ir, dict(x=x), dict(M=m, N=n))
        for fuse in (None, True):
            for _ in range(3):  # a wrong buffer holds whatever malloc returned
                np.testing.assert_array_equal(pa.compile(scale_then_vertical, fuse=fuse)(x),
                                              want["y"])


def test_a_fused_gradient_has_a_version_for_large_sizes_and_one_for_small():
    """Loops separated per piece only where every size is at least its bound (M >= 10,
    N >= 6 for the 5-tap deconvolution): separating them at every size printed a case
    per small size (4467 lines of C, most of its compile time). Both versions against
    the interpreter, on either side of each bound."""
    g = pa.grad(deconv_cost, wrt=["x", "f"])
    k = pa.compile(g, fuse=True)
    assert ("loops separated per piece where M >= 10 and N >= 6; below, one loop per band"
            in pa.explain(g, fuse=True))
    assert "#define pa_small_sizes (!(M >= 10 && N >= 6))" in k.source
    assert k.source.count("\n") < 2500
    rng = np.random.default_rng(14)
    for m, n in [(9, 6), (10, 5), (10, 6), (11, 7), (CHUNK_ROWS + 10, 6)]:
        x, f, y = rng.standard_normal((m, n)), rng.standard_normal(5), rng.standard_normal((m, n))
        dx, df = k(x, f, y)
        _, want = interpret(g.ir, dict(x=x, f=f, y=y), dict(M=m, N=n))
        np.testing.assert_allclose(dx, want["d_x"], rtol=1e-12, atol=1e-12, err_msg=f"{m}x{n}")
        np.testing.assert_allclose(df, want["d_f"], rtol=1e-12, atol=1e-10, err_msg=f"{m}x{n}")


def test_a_large_call_below_the_size_bounds_runs_the_unfused_schedule(monkeypatch):
    """Below its size bounds (M >= 10 and N >= 6) the fused deconvolution gradient runs
    its loops with the pieces as conditions inside: a call of 2^20 points or more there
    runs the unfused schedule, whose loops are separated at every size; at the bounds, or
    with ``fuse=True``, the fused one runs. One thread, so the chunks never decide."""
    g = pa.grad(deconv_cost, wrt=["x", "f"])
    unfused = pa.compile(g, fuse=False)
    calls = []
    c_function = unfused._fn
    monkeypatch.setattr(unfused, "_fn", lambda *a: calls.append(1) or c_function(*a))
    rng = np.random.default_rng(16)
    points = 1 << 20
    cases = [(9, points // 9 + 1, True), (points // 5 + 1, 5, True),
             (10, points // 10 + 1, False), (points // 6 + 1, 6, False), (9, 6, False)]
    assert "or whose sizes miss M >= 10 and N >= 6, runs the unfused schedule" in pa.explain(g)
    for m, n, runs_unfused in cases:
        x, f, y = rng.standard_normal((m, n)), rng.standard_normal(5), rng.standard_normal((m, n))
        want_dx, want_df = _deconvolution_gradient_numpy(x, f, y)
        for fuse in (None, True):
            calls.clear()
            with pa.num_threads(1):
                dx, df = pa.compile(g, fuse=fuse)(x, f, y)
            assert len(calls) == (runs_unfused and fuse is None), (m, n, fuse)
            np.testing.assert_allclose(dx, want_dx, rtol=1e-12, atol=1e-11)
            np.testing.assert_allclose(df, want_df, rtol=1e-10)


@pytest.mark.parametrize("dtype, pad", [("f64", 16), ("f32", 32)])
def test_rows_of_a_row_buffer_are_padded_past_a_row(dtype, pad):
    """The slots of a buffer of rows sit 128 bytes more than a row apart (N + 16 doubles,
    N + 32 floats): at N = 4096 floats the rows of one step fell 16 KiB apart into the
    same L1 sets. Buffers of one row and of planes keep their shape. Against the
    interpreter at a power-of-two width."""
    g = pa.grad(deconvolution(dtype), wrt=["x", "f"])
    temps = {t.name: t for t in artifact_of(g, Options()).scheduled.kernel.temps}
    for name in ("t_rows", "d_r_expanded_rows"):
        assert pa.ir.expr_str(temps[name].type.shape[1]) == f"N + {pad}"
    assert pa.ir.expr_str(temps["d_t_rows"].type.shape[1]) == "N"
    planes = artifact_of(pa.grad(stencil7, wrt="x"), Options()).scheduled.kernel.temps
    assert [pa.ir.expr_str(e) for t in planes if t.role == "rows" for e in t.type.shape[1:]] \
        == ["Y", "Z"]
    rng = np.random.default_rng(17)
    m, n = CHUNK_ROWS + 5, 16
    t = np.float64 if dtype == "f64" else np.float32
    x, f, y = (rng.standard_normal((m, n)).astype(t), rng.standard_normal(5).astype(t),
               rng.standard_normal((m, n)).astype(t))
    dx, df = pa.compile(g, fuse=True)(x, f, y)
    _, want = interpret(g.ir, dict(x=x, f=f, y=y), dict(M=m, N=n))
    tol = 1e-12 if dtype == "f64" else 1e-4
    np.testing.assert_allclose(dx, want["d_x"], rtol=tol, atol=tol)
    np.testing.assert_allclose(df, want["d_f"], rtol=tol, atol=tol * 100)


PA_M, = pa.sizes("pa_small_sizes")


@pa.kernel
def named_like_polyad(x: pa.f64[PA_M, N].clamped, y: pa.Out(pa.f64[PA_M, N])):
    t = pa.empty(pa.f64[PA_M, N].clamped)
    for m in range(PA_M):
        for n in range(N):
            t[m, n] = 2.0 * x[m, n] + 1.0
    for m in range(PA_M):
        for n in range(N):
            y[m, n] = t[m + 1, n] - t[m, n]


def test_a_size_named_like_polyads_own_parameter_keeps_its_own():
    """A size whose name starts with ``pa_`` (here the very name of the parameter that
    tells the size versions apart) gets a trailing underscore in ISL as in C: it printed
    as itself in the AST's C while the signature named it ``pa_small_sizes_`` (a C
    compiler error), and would have been the versions' parameter. Against numpy, on
    either side of the bound."""
    k = pa.compile(named_like_polyad, fuse=True)
    assert "#define pa_small_sizes (!(pa_small_sizes_ >= " in k.source
    rng = np.random.default_rng(18)
    for m, n in [(1, 1), (3, 2), (CHUNK_ROWS + 3, 5)]:
        x = rng.standard_normal((m, n))
        t = 2.0 * x + 1.0
        want = t[np.minimum(np.arange(m) + 1, m - 1)] - t
        np.testing.assert_allclose(k(x), want, rtol=1e-15, atol=1e-15)


def test_row_buffer_dependences_equal_isls_dataflow_analysis():
    """The memory-based dependences of row buffers (``poly._memory_based_pairs``: the
    pairs of accesses of one element, ordered by the schedule tree's map) are the
    relations ISL's ``compute_flow`` gives with may-sources only, its independent answer
    (slower: 2.1 against 0.9 s on the deconvolution gradient's), for each buffer of the
    fused deconvolution gradient and each kind."""
    import islpy as isl
    from polyad.poly import _by_variable, _memory_based_pairs

    sk = artifact_of(pa.grad(deconv_cost, wrt=["x", "f"]), Options(fuse=True)).scheduled
    model = sk.model
    reads, _, writes = model.accesses(None)
    tree = model.schedule_tree()
    r_by, w_by = _by_variable(reads), _by_variable(writes)
    buffers = [t.name for t in sk.kernel.temps if t.per_thread]
    assert sorted(buffers) == ["d_r_expanded_rows", "d_t_rows", "t_rows"]
    for var in buffers:
        for sources, sinks in [(w_by[var], r_by[var]), (w_by[var], w_by[var]),
                               (r_by[var], w_by[var])]:
            restricted = tree.intersect_domain(sources.domain().union(sinks.domain()))
            flow = isl.UnionAccessInfo.from_sink(sinks).set_may_source(sources) \
                .set_schedule(restricted).compute_flow().get_may_dependence()
            assert _memory_based_pairs(sources, sinks, tree).is_equal(flow), var
