"""Schedule decisions (gather / privatize / atomic / reduction) and their correctness.

Every kernel here is also run against the IR interpreter (program order), in
the default and in the deterministic mode, so a wrong parallel decision shows
up as a wrong number, not only as a different pragma.
"""

import ctypes
import ctypes.util

import numpy as np
import pytest

import polyad as pa
from polyad import ir
from polyad.pipeline import Options, compile_kernel
from polyad.schedule.merge import MergedUpdate, merge_updates
from polyad.testing import interpret

M, N, K = pa.sizes("M N K")


@pa.kernel
def stencil_adjoint(dy: pa.f64[M, N], dx: pa.Out(pa.f64[M, N].clamped)):
    for m in range(M):
        for n in range(N):
            dx[m, n] = 0.0
    for m in range(M):
        for n in range(N):
            dx[m, n - 1] += 0.5 * dy[m, n]
            dx[m, n] += dy[m, n]
            dx[m - 1, n + 1] -= 0.25 * dy[m, n]


@pa.kernel
def filter_gradient(x: pa.f64[M, N].clamped, r: pa.f64[M, N], df: pa.Out(pa.f64[K])):
    for k in range(K):
        df[k] = 0.0
    for m in range(M):
        for n in range(N):
            for k in range(K):
                df[k] += x[m, n + k - 2] * r[m, n]


@pa.kernel
def pair_histogram(x: pa.f64[N], h: pa.Out(pa.f64[N])):
    for i in range(N):
        h[i] = 0.0
    for i in range(N):
        h[i // 2] += x[i]
        h[(i + 1) // 2] += 0.5 * x[i]


@pa.kernel
def circular_adjoint(dy: pa.f64[N], dx: pa.Out(pa.f64[N].circular)):
    for i in range(N):
        dx[i] = 0.0
    for i in range(N):
        dx[i - 2] += dy[i]
        dx[i + 1] += 2.0 * dy[i]


@pa.kernel
def read_after_scatter(dy: pa.f64[N], dx: pa.Out(pa.f64[N].clamped)):
    for i in range(N):
        dx[i] = 0.0
    for i in range(N):
        dx[i - 1] += dy[i]
        dx[i] += dx[i] * 0.5  # reads the scatter target: order matters


@pa.kernel
def sum_of_squares(x: pa.f64[M, N]) -> pa.f64:
    s = 0.0
    for m in range(M):
        for n in range(N):
            s += x[m, n] * x[m, n]
    return s


def _owner(sk, name):
    """The kernel statement that statement ``name`` of the scheduling passes was split from."""
    (owner,) = {st.owner for st in sk.kernel.statements if st.piece_of(name)}
    return owner


def _strategies(k):
    art = compile_kernel(k.ir, Options())
    sk = art.scheduled
    # decisions are per boundary piece: report the DSL statement each piece was split from
    gathered = {_owner(sk, name) for name, d in sk.gather_decisions.items() if d == "gather"}
    threaded = [lp for lp in art.plan.loops.values() if lp.threads]
    atomic = set().union(*[lp.atomic for lp in threaded])
    privatized = set().union(*[set(lp.privatized) for lp in threaded])
    reductions = set().union(*[set(lp.facts.reductions) for lp in threaded])
    return sk, gathered, atomic, privatized, reductions


def test_stencil_adjoint_becomes_gather_without_atomics():
    sk, gathered, atomic, privatized, _ = _strategies(stencil_adjoint)
    assert gathered == {"S1", "S3"}  # the shifted scatters; S2 writes dx[m, n] already
    assert not atomic and not privatized
    assert "atomic" not in stencil_adjoint.source
    assert "#pragma omp parallel for" in stencil_adjoint.source


def test_circular_adjoint_is_gather():
    _, gathered, atomic, _, _ = _strategies(circular_adjoint)
    assert gathered == {"S1", "S2"}
    assert not atomic


def test_filter_gradient_is_privatized():
    _, gathered, atomic, privatized, _ = _strategies(filter_gradient)
    assert privatized == {"df"}
    assert not atomic
    assert "reduction(+:df[0:pa_imax(K, 1)])" in filter_gradient.source


def test_histogram_scatter_uses_atomics():
    sk, gathered, atomic, privatized, _ = _strategies(pair_histogram)
    assert not gathered
    assert "several iterations write the same element" in sk.gather_decisions["S1"]
    assert {_owner(sk, name) for name in atomic} == {"S1", "S2"}
    assert pair_histogram.source.count("#pragma omp atomic") == 2


def test_scatter_whose_target_is_read_stays_ordered():
    sk, gathered, atomic, _, _ = _strategies(read_after_scatter)
    assert not gathered
    assert any("is read in the loop nest" in d for name, d in sk.gather_decisions.items()
               if _owner(sk, name) == "S1")


def test_scalar_sum_uses_reduction_clause():
    _, _, _, _, reductions = _strategies(sum_of_squares)
    assert reductions == {"s"}
    assert "reduction(+:s)" in sum_of_squares.source


CASES = [
    (stencil_adjoint, lambda r: dict(dy=r.standard_normal((6, 7))), {}),
    (filter_gradient, lambda r: dict(x=r.standard_normal((5, 9)), r=r.standard_normal((5, 9))),
     {"K": 5}),
    (pair_histogram, lambda r: dict(x=r.standard_normal(11)), {}),
    (circular_adjoint, lambda r: dict(dy=r.standard_normal(8)), {}),
    (read_after_scatter, lambda r: dict(dy=r.standard_normal(9)), {}),
    (sum_of_squares, lambda r: dict(x=r.standard_normal((7, 5))), {}),
]


def _sizes(args, extra):
    sizes = dict(extra)
    shapes = {a.shape for a in args.values()}
    for shape in shapes:
        if len(shape) == 2:
            sizes.setdefault("M", shape[0])
            sizes.setdefault("N", shape[1])
        else:
            sizes.setdefault("N", shape[0])
    return sizes


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("kernel,make,extra", CASES, ids=[c[0].ir.name for c in CASES])
def test_schedule_matches_program_order(kernel, make, extra, deterministic):
    args = make(np.random.default_rng(1))
    compiled = pa.compile(kernel, deterministic=deterministic)
    got = compiled(**{k: v.copy() for k, v in args.items()}, **extra)
    result, arrays = interpret(kernel.ir, {k: v.copy() for k, v in args.items()},
                               _sizes(args, extra))
    out = [p.name for p in kernel.ir.params if p.intent == "out"]
    want = result if result is not None else arrays[out[0]]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def _omp_set_num_threads(n):
    lib = ctypes.CDLL(ctypes.util.find_library("gomp") or "libgomp.so.1")
    lib.omp_set_num_threads(n)


@pytest.mark.parametrize("kernel,make,extra", CASES, ids=[c[0].ir.name for c in CASES])
def test_deterministic_mode_is_bitwise_reproducible(kernel, make, extra):
    args = make(np.random.default_rng(2))
    compiled = pa.compile(kernel, deterministic=True)
    results = []
    try:
        for threads in (1, 2, 2):
            _omp_set_num_threads(threads)
            results.append(np.asarray(compiled(**args, **extra)).tobytes())
    finally:
        _omp_set_num_threads(2)
    assert results[0] == results[1] == results[2]


def test_deterministic_mode_drops_atomics_and_float_reductions():
    assert "atomic" not in pa.compile(pair_histogram, deterministic=True).source
    # the sum is still vectorized (omp simd, a fixed order), never split across threads
    assert "omp parallel" not in pa.compile(sum_of_squares, deterministic=True).source
    # (ISL's scheduler may still run the filter taps in parallel: each thread owns its df[k])
    assert "reduction" not in pa.compile(filter_gradient, deterministic=True).source
    # gathers need neither, so the adjoint stencil stays parallel
    assert "omp parallel for" in pa.compile(stencil_adjoint, deterministic=True).source


@pa.kernel
def square_plus(x: pa.f64[N], c: pa.f64[N], y: pa.Out(pa.f64[N])):
    for i in range(N):
        y[i] = x[i] * x[i] + c[i]


def _cpu_has_fma() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return " fma " in f.read().replace("\n", " ")
    except OSError:
        return False


def test_products_fuse_into_multiply_adds_except_in_deterministic_builds():
    # x * x = 1 + 2^-29 + 2^-60: rounded on its own the product loses its 2^-60, which
    # is then all that is left of x * x + c; 37 elements reach a vector body and its
    # remainder
    x = np.full(37, 1 + 2.0 ** -30)
    c = np.full(37, -(1 + 2.0 ** -29))
    assert (pa.compile(square_plus, deterministic=True)(x, c) == 0.0).all()
    if not _cpu_has_fma():
        pytest.skip("this CPU has no fused multiply-add")
    assert (pa.compile(square_plus)(x, c) == 2.0 ** -60).all()


@pa.kernel
def wavefront_sweep(A: pa.f64[M, N]):
    for i in range(1, M):
        for j in range(1, N - 1):
            A[i, j] = 0.5 * A[i, j - 1] + 0.25 * A[i - 1, j + 1]


def test_isl_scheduler_finds_wavefront_parallelism():
    # program order has no parallel loop (i and j both carry flow dependences);
    # ISL's scheduler skews the nest so that the inner loop of a wavefront is parallel;
    # one thread team runs the whole sequential wavefront loop, its inner loop shared
    sk = compile_kernel(wavefront_sweep.ir).scheduled
    assert sk.schedule_origin.startswith("ISL scheduler")
    pragmas = [line.strip() for line in wavefront_sweep.source.splitlines()
               if line.strip().startswith("#pragma omp")]
    assert pragmas[0].startswith("#pragma omp parallel") and "for" not in pragmas[0]
    assert [p for p in pragmas if p.startswith("#pragma omp for")] == pragmas[1:2]
    A = np.random.default_rng(3).random((9, 11))
    want = A.copy()
    interpret(wavefront_sweep.ir, dict(A=want), dict(M=9, N=11))
    wavefront_sweep(A)
    np.testing.assert_allclose(A, want, rtol=1e-14)


def test_program_order_kept_when_already_parallel():
    assert compile_kernel(stencil_adjoint.ir).scheduled.schedule_origin == "program order"


def test_scheduler_quota_falls_back_to_program_order(monkeypatch):
    from polyad.schedule import build
    monkeypatch.setattr(build, "SCHEDULER_QUOTA", 1)
    art = compile_kernel(wavefront_sweep.ir)
    assert "gave up" in art.scheduled.schedule_origin
    assert "omp parallel" not in art.source  # the program order, sequential


def test_loops_past_the_ast_quota_become_one_nest_per_band(monkeypatch):
    """ISL's generation of a loop per piece runs under ``build.AST_QUOTA`` operations
    (unbounded, a fuzz vjp generated its loops for more than ten minutes); past it, the
    kernel gets one loop nest per band with the pieces as conditions inside, says so, and
    computes the same values. Here the quota is spent at once for the separated loops
    only, by ISL itself (a quota of one operation)."""
    from polyad.schedule import build
    quota = build.AST_QUOTA
    built = build._built_candidate

    def separated_past_the_quota(schedule, kernel, model, deps, separate, *rest):
        monkeypatch.setattr(build, "AST_QUOTA", 1 if separate else quota)
        return built(schedule, kernel, model, deps, separate, *rest)
    monkeypatch.setattr(build, "_built_candidate", separated_past_the_quota)
    art = compile_kernel(stencil_adjoint.ir)
    monkeypatch.setattr(build, "_built_candidate", built)
    monkeypatch.setattr(build, "AST_QUOTA", quota)
    separated = compile_kernel(stencil_adjoint.ir)
    assert any("one loop nest per band" in d and f"past {quota:_} operations" in d
               for d in art.scheduled.schedule_decisions)
    assert not any("one loop nest per band" in d for d in separated.scheduled.schedule_decisions)
    assert art.source != separated.source
    dy = np.random.default_rng(11).random((6, 7))
    want = {"dx": np.zeros((6, 7))}
    interpret(stencil_adjoint.ir, dict(dy=dy, **want), dict(M=6, N=7))
    got = np.zeros((6, 7))
    art.target.load(art.build)(dy=dy, dx=got)
    np.testing.assert_allclose(got, want["dx"], rtol=1e-14)


def test_isl_is_asked_once_for_the_schedule_of_both_builds(monkeypatch):
    """ISL's answer for one set of schedule constraints is remembered in the process: the
    default and the deterministic build of a kernel ask for the same schedule, and one
    that ran past ``build.SCHEDULER_SECONDS`` (fuzz seed 19715's vjp) would again."""
    from polyad.recent import Recent
    from polyad.schedule import build
    asked = []
    within = build.text_within_seconds
    monkeypatch.setattr(build, "text_within_seconds",
                        lambda compute, seconds: asked.append(seconds) or within(compute, seconds))
    monkeypatch.setattr(build, "recent_schedules", Recent(64))  # (ISL's earlier answers)
    default = compile_kernel(wavefront_sweep.ir)
    deterministic = compile_kernel(wavefront_sweep.ir, Options(deterministic=True))
    assert asked == [build.SCHEDULER_SECONDS]
    assert default.scheduled.schedule_origin.startswith("ISL scheduler")
    assert deterministic.scheduled.schedule_origin == default.scheduled.schedule_origin


def test_a_schedule_of_isl_past_the_ast_quota_is_dropped(monkeypatch):
    """Only the program order's loops, which the kernel cannot do without, get a second
    generation as one loop nest per band past ``build.AST_QUOTA``: the loops of ISL's
    schedule past it are dropped at once (a second generation took a minute on a fuzz
    kernel), and the program order stays, saying why."""
    from polyad.schedule import build
    quota = build.AST_QUOTA
    built = build._built_candidate
    generations = []

    def later_ones_past_the_quota(*args):
        monkeypatch.setattr(build, "AST_QUOTA", quota if not generations else 1)
        generations.append(args[4])  # (separate)
        return built(*args)
    monkeypatch.setattr(build, "_built_candidate", later_ones_past_the_quota)
    art = compile_kernel(wavefront_sweep.ir)
    assert generations == [True, True]
    assert art.scheduled.schedule_origin == (
        "program order (ISL's generation of the loops of its schedule ran past 1 operations)")
    assert "omp parallel" not in art.source  # the program order, sequential


def test_cuda_keeps_loops_per_piece_where_one_nest_per_band_runs_past_the_ast_quota(
        monkeypatch, tmp_path):
    """The CUDA target asks for one loop nest per band (``guarded_pieces``) after the
    schedule is chosen; where that generation runs past ``build.AST_QUOTA``, the pieces
    keep the loops of their own the schedule was chosen with, a decision says so, and the
    simulator computes the interpreter's values."""
    from polyad.schedule import build
    monkeypatch.setenv("POLYAD_CACHE_DIR", str(tmp_path))  # (no earlier build of it)
    quota = build.AST_QUOTA
    built = build._built_candidate

    def unseparated_past_the_quota(schedule, kernel, model, deps, separate, *rest):
        monkeypatch.setattr(build, "AST_QUOTA", quota if separate else 1)
        return built(schedule, kernel, model, deps, separate, *rest)
    monkeypatch.setattr(build, "_built_candidate", unseparated_past_the_quota)
    k = pa.Kernel(ir_kernel=stencil_adjoint.ir)
    art = compile_kernel(k.ir, Options(target="cuda-sim"))
    assert ("pieces kept in loops of their own: ISL's generation of one loop nest per band "
            "ran past its quota of 1 operations") in art.plan.scheduled.schedule_decisions
    sim = pa.compile(k, target="cuda-sim")
    dy = np.random.default_rng(12).random((5, 6))
    want = {"dx": np.zeros((5, 6))}
    interpret(stencil_adjoint.ir, dict(dy=dy, **want), dict(M=5, N=6))
    got = np.zeros((5, 6))
    sim(dy=dy, dx=got)
    np.testing.assert_allclose(got, want["dx"], rtol=1e-14)


def test_loops_past_the_ast_quota_either_way_are_a_clear_error(monkeypatch):
    """Where one loop nest per band runs past the quota too, the compile stops with an
    error naming the kernel, its source line, what ran out and what to do."""
    from polyad.schedule import build
    monkeypatch.setattr(build, "AST_QUOTA", 1)
    with pytest.raises(pa.CompileError, match=r"test_schedule\.py:\d+: kernel "
                       r"'stencil_adjoint': ISL's generation of its loops ran past its "
                       r"quota of 1 operations.*Split the kernel"):
        compile_kernel(stencil_adjoint.ir)


@pa.kernel
def column_dots(A: pa.f64[M, N], x: pa.f64[M], y: pa.Out(pa.f64[N])):
    for j in range(N):
        s = 0.0
        for i in range(M):
            s += A[i, j] * x[i]
        y[j] = s


@pa.kernel
def column_updates(A: pa.f64[M, N], x: pa.f64[M], y: pa.Out(pa.f64[N])):
    for j in range(N):
        for i in range(M):
            y[j] += A[i, j] * x[i]


def test_no_schedule_is_asked_of_isl_for_column_walks_into_a_local_scalar(monkeypatch):
    """The inner loop of ``s += A[i, j] * x[i]`` walks a column of A, but the scalar's
    dependences (all of which the ISL scheduler gets) keep the statement's instances in
    program order under any schedule: ISL is not asked for one with fewer column walks.
    A column walk into an array element, which ISL may reorder, still asks."""
    from polyad.schedule import build
    from polyad.schedule.locality import has_strided_inner_loop
    assert not has_strided_inner_loop(column_dots.ir)
    assert has_strided_inner_loop(column_updates.ir)
    asked = []
    isl_schedule = build._isl_schedule
    monkeypatch.setattr(build, "_isl_schedule",
                        lambda model, deps: asked.append(model.kernel.name)
                        or isl_schedule(model, deps))
    art = compile_kernel(column_dots.ir)
    assert asked == [] and art.scheduled.schedule_origin == "program order"
    rng = np.random.default_rng(7)
    A, x = rng.standard_normal((6, 5)), rng.standard_normal(6)
    y = np.zeros(5)
    column_dots(A, x, y)
    np.testing.assert_allclose(y, A.T @ x, rtol=1e-13)
    compile_kernel(column_updates.ir)
    assert asked == ["column_updates"]


@pa.kernel
def five_channels(x: pa.f64[5, N], y: pa.Out(pa.f64[5, N])):
    for c in range(5):
        for i in range(N):
            y[c, i] = 2.0 * x[c, i]


def test_loops_with_few_iterations_get_no_thread_team():
    plan = compile_kernel(five_channels.ir).plan
    by_depth = sorted(plan.loops.values(), key=lambda lp: lp.facts.depth)
    assert by_depth[0].facts.trip_count_bound == 4 and not by_depth[0].threads
    assert by_depth[1].threads and by_depth[1].facts.trip_count_bound is None
    assert "at most 64 iterations" in by_depth[0].mapping
    x = np.random.default_rng(5).random((5, 8))
    np.testing.assert_allclose(five_channels(x), 2.0 * x)


@pa.kernel
def with_dead_temporary(x: pa.f64[N], y: pa.Out(pa.f64[N])):
    t = pa.zeros(pa.f64[N])
    u = 0.0
    for i in range(N):
        t[i] = pa.exp(x[i])  # never read: dead
        u += x[i]  # never read: dead
        y[i] = 2.0 * x[i]


def test_dead_statements_are_removed():
    sk = compile_kernel(with_dead_temporary.ir).scheduled
    assert set(sk.removed_statements) == {"S0", "S1", "S2"}  # u = 0.0 as well
    assert "exp(" not in with_dead_temporary.source
    x = np.random.default_rng(6).random(7)
    np.testing.assert_allclose(with_dead_temporary(x), 2.0 * x)


@pa.kernel
def conv_adjoint(r: pa.f64[M, N], f: pa.f64[5], dx: pa.Out(pa.f64[M, N].clamped),
                 df: pa.Out(pa.f64[5])):
    for m in range(M):
        for n in range(N):
            dx[m, n] = 0.0
    for k in range(5):
        df[k] = 0.0
    for m in range(M):
        for n in range(N):
            for k in range(5):
                dx[m, n + k - 2] += r[m, n] * f[k]
                df[k] += r[m, n] * f[k]


def test_scatter_with_more_loops_than_target_dims_gathers_with_an_inner_sum():
    sk, gathered, atomic, privatized, _ = _strategies(conv_adjoint)
    assert sk.gather_decisions["S2_0"] == "gather"  # the interior: for each (m, j), sum over k
    assert privatized == {"df"} and not atomic
    assert "atomic" not in conv_adjoint.source
    rng = np.random.default_rng(7)
    r, f = rng.standard_normal((6, 9)), rng.standard_normal(5)
    dx, df = conv_adjoint(r, f)
    _, want = interpret(conv_adjoint.ir, dict(r=r, f=f), dict(M=6, N=9))
    np.testing.assert_allclose(dx, want["dx"], rtol=1e-12)
    np.testing.assert_allclose(df, want["df"], rtol=1e-12)


@pa.kernel
def deconvolution_cost(x: pa.f64[M, N].clamped, y: pa.f64[M, N], f: pa.f64[5]) -> pa.f64:
    C = 0.0
    for m in range(M):
        for n in range(N):
            s = 0.0
            for k in range(5):
                s += f[k] * x[m, n + k - 2]
            C += (s - y[m, n]) ** 2
    return C


def test_deconvolution_gradient_is_expanded_distributed_and_gathered():
    g = pa.grad(deconvolution_cost, wrt=["x", "f"])
    sk = compile_kernel(g.ir).scheduled
    assert any(d.startswith("expanded") for d in sk.expansions.values()), sk.expansions
    assert "gather" in sk.gather_decisions.values()
    assert "atomic" not in g.source
    assert "reduction(+:d_f[0:5])" in g.source  # the filter gradient: privatized
    rng = np.random.default_rng(8)
    x, y, f = rng.standard_normal((6, 9)), rng.standard_normal((6, 9)), rng.standard_normal(5)
    dx, df = g(x, y, f)
    _, want = interpret(g.ir, dict(x=x, y=y, f=f), dict(M=6, N=9))
    np.testing.assert_allclose(dx, want["d_x"], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(df, want["d_f"], rtol=1e-12, atol=1e-12)


def test_zeroing_moves_into_the_accumulating_nest():
    sk = compile_kernel(stencil_adjoint.ir).scheduled
    assert sk.fused_initializations == ("S0",)
    src = stencil_adjoint.source
    # one pass over dx: no loop of its own zeroes it, the sums assign the first term
    assert "= 0.0;" not in src
    assert "dx[m * N + n] = 0.5 * dy[m * N + (n + 1)]" in src
    dy = np.random.default_rng(9).standard_normal((5, 6))
    _, want = interpret(stencil_adjoint.ir, dict(dy=dy), dict(M=5, N=6))
    np.testing.assert_allclose(stencil_adjoint(dy), want["dx"], rtol=1e-14)


def test_updates_of_one_element_are_merged_into_one_statement():
    lines = stencil_adjoint.source.splitlines()
    # zeroing + three contributions become one assignment, one term per line,
    # each term keeping the comment that names its DSL line
    k = next(k for k, line in enumerate(lines)
             if line.strip().startswith("dx[m * N + n] = 0.5 * dy[m * N + (n + 1)]"))
    first, second, third = (f"line {st.line}:" for st in stencil_adjoint.ir.statements[1:])
    assert first in lines[k]
    assert lines[k + 1].strip().startswith("+ dy[m * N + n]") and second in lines[k + 1]
    assert lines[k + 2].strip().startswith("- 0.25 * dy[") and third in lines[k + 2]
    assert not any("dx[m * N + n] +=" in line for line in lines)
    dy = np.random.default_rng(10).standard_normal((6, 7))
    _, want = interpret(stencil_adjoint.ir, dict(dy=dy), dict(M=6, N=7))
    np.testing.assert_allclose(stencil_adjoint(dy), want["dx"], rtol=1e-14)


def test_pieces_record_their_lineage():
    """Every scheduled piece names the kernel statement and the splits it came from."""
    sk = compile_kernel(stencil_adjoint.ir, Options()).scheduled
    names = {st.name for st in stencil_adjoint.ir.statements}
    kinds = set()
    for piece in sk.kernel.statements:
        assert piece.owner in names
        parents = [s.parent for s in piece.origin]
        # each split cuts the piece the previous one made, starting at the kernel statement
        assert parents[:1] in ([], [piece.owner])
        for split, child in zip(piece.origin, parents[1:] + [piece.name]):
            assert split.kind in ("boundary", "gather") and child != split.parent
            kinds.add(split.kind)
    assert "boundary" in kinds
    # gather decisions are taken per boundary piece; each names pieces of the kernel's S1, S3
    assert {_owner(sk, name) for name, d in sk.gather_decisions.items() if d == "gather"} \
        == {"S1", "S3"}
    assert all(name not in names for name in sk.gather_decisions)


T = pa.sizes("T")


@pa.kernel
def repeated_scatter(x: pa.f64[T, N], h: pa.Out(pa.f64[N].clamped)):
    for i in range(N):
        h[i] = 0.0
    for t in range(T):
        for i in range(N):
            h[i - 1] += x[t, i]
            h[i + 1] += 2.0 * x[t, i]


@pa.kernel
def clamped_energy(u: pa.f64[M, N].clamped, w: pa.f64[3, 3]) -> pa.f64:
    E = 0.0
    for m in range(M):
        for n in range(N):
            s = 0.0
            for a in range(3):
                for b in range(3):
                    s += w[a, b] * u[m + a - 1, n + b - 1]
            E += s * s
    return E


def _facts(loops):
    return {key: (f.statements, f.parallel, f.carried, f.why_not_parallel, f.reductions,
                  f.private, f.scatters) for key, f in loops.items()}


def _facts_with_value_based_dependences(kernel):
    """The scheduled ``kernel``, checking that the loop test run on value-based dependences
    of every array proves the facts it proved on the memory-based ones of accumulators."""
    from polyad.poly import accumulator_arrays, dependences
    from polyad.schedule.build import _adjacent_equal_domains, _candidate, _program_order_tree

    sk = compile_kernel(kernel.ir, Options()).scheduled
    scalars = frozenset(n for n, _ in sk.kernel.locals)
    value = dependences(sk.model, flow_only=scalars)
    assert not value.memory_based
    assert sk.deps.memory_based == accumulator_arrays(sk.kernel) & set(value.output)
    # the loop test ran on the unordered pairs; the ordered dependences come on demand
    # (tiling's legality check may have asked already)
    assert set(sk.deps.same_element) == sk.deps.memory_based
    sk.deps.order_accumulators()
    for var in sk.deps.memory_based:  # a superset of the value-based pairs
        pairs = sk.deps.same_element[var]
        assert pairs.is_equal(pairs.reverse())
        assert sk.deps.output[var].is_subset(pairs)
        assert value.output[var].is_subset(sk.deps.output[var])
        assert value.flow[var].is_subset(sk.deps.flow[var])
    # the same AST, built from the tree of the program order as the scheduler did
    tree = (_program_order_tree(sk.model, _adjacent_equal_domains(sk.model))
            if sk.schedule_origin.startswith("program order") else None)
    again = _candidate(sk.schedule, sk.kernel, sk.model, value, ast_schedule=tree)
    assert _facts(again.loops) == _facts(sk.loops)
    return sk


@pytest.mark.parametrize("kernel", [
    pair_histogram, filter_gradient, repeated_scatter, read_after_scatter,
    pa.grad(clamped_energy, wrt=["u", "w"])], ids=lambda k: k.ir.name)
def test_memory_based_accumulator_dependences_give_the_value_based_loop_facts(kernel):
    _facts_with_value_based_dependences(kernel)


def test_accumulator_arrays_are_the_arrays_only_updates_touch_in_loops():
    from polyad.poly import accumulator_arrays

    sk = _facts_with_value_based_dependences(repeated_scatter)
    assert sk.deps.memory_based == {"h"}
    # dx[i] += dx[i] * 0.5 reads the target: value-based dependences, as before
    assert accumulator_arrays(compile_kernel(read_after_scatter.ir).scheduled.kernel) \
        == frozenset()
    # the filter gradient d_w[a, b] += ...; d_u is gathered. Its zeroing d_u[i, j] = 0
    # joined the gather's nest, then ran as a nest of its own once the gather's tap loops
    # moved outside the row loop (loop_order._initializations), and after the loop order
    # runs row by row in the step of m that gathers the row
    # (cleanup.zero_rows_in_their_step): d_u is assigned in the nest of its updates, so
    # only d_w is an accumulator (the loop facts of both analyses agree: the test above)
    grad = _facts_with_value_based_dependences(pa.grad(clamped_energy, wrt=["u", "w"]))
    assert grad.deps.memory_based == {"d_w"}
    zeroing = [st for st in grad.kernel.statements
               if st.target_name == "d_u" and st.op == "=" and st.loops]
    updates = [o for o in grad.kernel.statements if o.target_name == "d_u" and o.op == "+="]
    assert zeroing and updates and {z.position[0] for z in zeroing} \
        <= {o.position[0] for o in updates}
    assert all(o.loops[-1].var == "n" for o in updates if o.loops)


def test_a_variable_analysed_again_is_answered_from_memory(monkeypatch):
    """``poly._variable_analysis``: a second model of a kernel (a new ISL context, as
    another compilation has) gets the dependences of the first, equal relations, without
    running ISL's analysis again."""
    import islpy as isl
    from polyad import poly

    ran = []
    analyse = poly._variable_dependences
    monkeypatch.setattr(poly, "_variable_dependences", lambda *a: ran.append(a) or analyse(*a))
    grad = pa.grad(clamped_energy, wrt=["u", "w"]).ir
    kernel = poly.split_boundary_pieces(grad, poly.PolyModel(grad))
    first = poly.dependences(poly.PolyModel(kernel))
    assert ran
    analysed = len(ran)
    model = poly.PolyModel(kernel)
    second = poly.dependences(model)
    assert len(ran) == analysed
    for kind in ("flow", "anti", "output"):
        mine, theirs = getattr(first, kind), getattr(second, kind)
        assert mine.keys() == theirs.keys() and mine
        for var, umap in mine.items():
            assert isl.UnionMap.read_from_str(model.ctx, umap.to_str()).is_equal(theirs[var])


@pa.kernel
def two_clamped_stencils(x: pa.f64[N].clamped, y: pa.Out(pa.f64[N]), z: pa.Out(pa.f64[N])):
    for i in range(N):
        y[i] = x[i - 1] + x[i + 1]
        z[i] = x[i - 1] * x[i + 1]


def _sobel_vjp():
    from c_corpus.cases import CASES

    (case,) = [c for c in CASES if c.func == "sobel"]
    return pa.vjp(pa.from_c(case.path, case.func, sizes=case.macros or None), wrt="img")


@pytest.mark.parametrize("make", [lambda: pair_histogram, lambda: two_clamped_stencils,
                                  _sobel_vjp],
                         ids=["pair_histogram", "two_clamped_stencils", "sobel_vjp"])
def test_statements_of_one_domain_at_adjacent_positions_are_one_ast_statement(make):
    """The program order's AST is built with adjacent statements of equal domains as one
    statement (cheaper to separate over pieces); the facts and the C are those of the
    AST built statement by statement. (The sobel adjoint's gathers have pieces that add
    into one border element at one point: grouping those would reorder the sum. Unfused:
    the chunk loops of fused nests are never grouped.)"""
    import dataclasses

    from polyad.schedule.build import _adjacent_equal_domains, _candidate, _program_order_tree
    from polyad.target import get_target

    kernel = make()
    art = compile_kernel(kernel.ir, Options(fuse=False))
    sk = art.scheduled
    groups = set(_adjacent_equal_domains(sk.model).values())
    assert groups and all("+" in g for g in groups)  # S1+S2; S0_k+S1_k, piece by piece
    apart = _candidate(sk.schedule, sk.kernel, sk.model, sk.deps,
                       ast_schedule=_program_order_tree(sk.model, {}))
    assert _facts(apart.loops) == _facts(sk.loops)
    target = get_target("openmp")
    unrolled = dataclasses.replace(sk, ast=apart.ast, loops=apart.loops)
    assert target.emit(target.plan(unrolled, Options())) == art.source
    ast_text = pa.explain(kernel)
    assert not any(g in ast_text for g in groups)  # explain lists each statement
    assert all(f"{n}(" in ast_text for g in groups for n in g.split("+"))


def test_update_merging_pass_states_its_legality():
    """``schedule.merge``: consecutive updates of one element merge unless a guard, a read of
    the target or an atomic update sits among them."""
    x, y = ir.Load("x", (ir.LoopVar("i"),)), ir.Load("y", (ir.LoopVar("i"),))
    a, b = ir.Load("a", (ir.LoopVar("i"),)), ir.Load("b", (ir.LoopVar("i"),))

    def st(name, target, op, expr, guard=None):
        return ir.Statement(name, (), (0,), (), guard, target, op, expr)

    zero, add_a, sub_b = st("S0", x, "=", ir.Const(0.0)), st("S1", x, "+=", a), st("S2", x, "-=", b)
    (m,) = merge_updates([zero, add_a, sub_b])
    assert isinstance(m, MergedUpdate) and m.op == "=" and m.statements == (zero, add_a, sub_b)
    assert [(t.sign, t.expr, t.statement) for t in m.terms] == [("+", a, add_a), ("-", b, sub_b)]
    neg = st("S3", x, "+=", ir.Unary("neg", b))
    (m,) = merge_updates([add_a, neg])
    assert m.op == "+=" and [(t.sign, t.expr) for t in m.terms] == [("+", a), ("-", b)]
    assert merge_updates([zero]) == [zero]  # a single statement stays itself
    guarded = st("S5", x, "+=", b, guard=ir.Binary(">", b, ir.Const(0.0)))
    reads = st("S6", x, "+=", ir.Load("x", (ir.Const(0, ir.i64),)))
    other = st("S7", y, "+=", b)
    for breaker in (guarded, reads, other):
        out = merge_updates([add_a, breaker])
        assert out == [add_a, breaker]
    assert merge_updates([zero, add_a], atomic=frozenset({"S1"})) == [zero, add_a]
    assert merge_updates([st("S8", x, "*=", a), add_a]) == [st("S8", x, "*=", a), add_a]


@pa.kernel
def same_element_nests(x: pa.f64[N], y: pa.Out(pa.f64[N]), w: pa.Out(pa.f64[N])):
    for i in range(N):
        y[i] = 2.0 * x[i]
        w[i] = 1.0
    for i in range(N):
        w[i] += y[i]


@pa.kernel
def mirrored_nests(x: pa.f64[N], y: pa.Out(pa.f64[N]), w: pa.Out(pa.f64[N])):
    for i in range(N):
        y[i] = 2.0 * x[i]
        w[i] = 1.0
    for i in range(N):
        w[i] += y[N - 1 - i]


@pytest.mark.parametrize("k,fused", [(same_element_nests, True), (mirrored_nests, False)])
def test_nests_writing_one_array_fuse_only_without_cross_iteration_dependences(k, fused):
    # the second nest adds into w what the first wrote; reading y[i] (written in the same
    # iteration) allows one fused loop, reading y[N - 1 - i] (another iteration) does not
    sk = compile_kernel(k.ir).scheduled
    assert any(d.startswith("fused the loop nest") for d in sk.schedule_decisions) == fused
    assert k.source.count("for (int64_t") == (1 if fused else 2)
    x = np.random.default_rng(2).random(7)
    want = dict(x=x, y=np.zeros(7), w=np.zeros(7))
    interpret(k.ir, want, dict(N=7))
    y, w = np.zeros(7), np.zeros(7)
    k(x, y, w)
    np.testing.assert_allclose(w, want["w"], rtol=1e-15)
    np.testing.assert_allclose(y, want["y"], rtol=1e-15)


@pa.kernel
def swept_adjoint(a: pa.f64[N], b: pa.f64[N]):
    # the shape of a time-stepped stencil's adjoint: each sweep scatters one cotangent
    # into the other and then zeroes it; the next sweep reads what this one wrote
    for t in range(K):
        for i in range(1, N - 1):
            b[i - 1] += 0.5 * a[i]
            b[i + 1] += 0.25 * a[i]
            a[i] = 0.0
        for i in range(1, N - 1):
            a[i - 1] += 0.5 * b[i]
            a[i + 1] -= 0.25 * b[i]
            b[i] = 0.0


@pa.kernel
def zeroing_ahead(a: pa.f64[N], b: pa.f64[N]):
    for t in range(K):
        for i in range(1, N - 1):
            b[i - 1] += a[i]
            a[i + 1] = 0.0  # zeroes what iteration i + 1 reads: the loop cannot be split


def _run_both(k, n, steps):
    rng = np.random.default_rng(4)
    args = dict(a=rng.random(n), b=rng.random(n))
    want = {name: v.copy() for name, v in args.items()}
    interpret(k.ir, want, dict(N=n, K=steps))
    got = {name: v.copy() for name, v in args.items()}
    k(**got, K=steps)
    for name in args:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-13, atol=1e-13)


def test_scatters_under_a_sequential_loop_gather_inside_it():
    sk = compile_kernel(swept_adjoint.ir).scheduled
    splits = [d for d in sk.schedule_decisions if "split after its scatters" in d]
    assert len(splits) == 2  # each sweep's zeroing runs in a loop of its own after it
    shifted = {_owner(sk, name): d for name, d in sk.gather_decisions.items()}
    assert set(shifted) == {"S0", "S1", "S3", "S4"}
    assert all(d.startswith("gather inside loop t") for d in shifted.values())
    src = swept_adjoint.source
    assert "atomic" not in src and "omp for" in src
    for n in (1, 2, 3, 4, 9):
        _run_both(swept_adjoint, n, 3)


def test_loop_is_not_split_when_its_tail_writes_what_other_iterations_read():
    sk = compile_kernel(zeroing_ahead.ir).scheduled
    assert not any("split after its scatters" in d for d in sk.schedule_decisions)
    assert sk.gather_decisions["S0"].startswith("scatter: it reads a, written")
    for n in (1, 2, 3, 4, 9):
        _run_both(zeroing_ahead, n, 2)


def test_union_of_is_the_union_of_its_parts():
    """``poly.union_of`` (unions by halves, not one part at a time) gives the union of
    any number of parts, and the empty value it is given for none."""
    import islpy as isl
    from polyad.poly import union_of
    ctx = isl.Context()
    parts = [isl.UnionMap.read_from_str(ctx, f"[N] -> {{ S{k % 4}[i] -> T{k % 3}[i + {k}] : "
                                             f"0 <= i < N }}") for k in range(11)]
    empty = isl.UnionMap.read_from_str(ctx, "[N] -> { }")
    one_by_one = empty
    for p in parts:
        one_by_one = one_by_one.union(p)
    for n in range(len(parts) + 1):
        want = empty
        for p in parts[:n]:
            want = want.union(p)
        assert union_of(parts[:n], empty).is_equal(want)
    assert union_of(parts, empty).is_equal(one_by_one)
    assert union_of([], empty) is empty


@pa.kernel
def scaled_update(x: pa.f64[N], y: pa.f64[N], s: pa.f64):
    for i in range(N):
        y[i] += s * x[i]


def test_what_a_statement_reads_is_answered_alike_every_time():
    """``Statement.reads`` and the name queries keep their answers per statement: a
    caller that extends the list it got changes no later answer, and a new statement
    (``dataclasses.replace``) answers for its own expressions."""
    import dataclasses
    (st,) = scaled_update.ir.statements
    first = st.reads()
    first.append(first[0])
    assert st.reads() == first[:-1]
    assert st.reads_variable("x") and st.reads_variable("s") and not st.reads_variable("y")
    assert st.read_names() == {"x", "s", "y"}  # y: the implicit read of its += target
    names = st.scalar_reads()
    names.add("z")
    assert st.scalar_reads() == {"s"}
    other = dataclasses.replace(st, expr=ir.Const(1.0, st.target.dtype))
    assert not other.reads_variable("x") and not other.reads_variable("s")
    assert other.read_names() == {"y"}
