"""The PolyBench kernels of benchmarks/polybench.py: outputs and schedule decisions.

Outputs (and three vjps) are checked against the reference interpreter at sizes 1-4;
the decisions the scheduler and the OpenMP plan make on them are asserted on the
emitted C and on ``pa.explain``'s report. No timings here (benchmarks/polybench.py).
"""

import json
import re

import numpy as np
import pytest

import polyad as pa
from c_corpus import polybench_dsl as dsl
from polyad.schedule.machine import host_is_x86_64
from polyad.testing import call_interpreted
from test_streaming import without_streamed_branches

KERNELS = ["gemm", "mm2", "atax", "bicg", "mvt", "gemver", "syrk", "doitgen", "covariance",
           "lu", "cholesky", "trisolv", "floyd_warshall", "jacobi_2d", "seidel_2d", "heat_3d",
           "fdtd_2d"]
# (kernel, input differentiated): the vjps benchmarks/polybench.py times
VJPS = [("gemm", "A"), ("mvt", "A"), ("jacobi_2d", "A")]
# factorizations and solves need a dominant diagonal (no pivoting, real square roots)
DOMINANT = {"lu": "A", "cholesky": "A", "trisolv": "L"}


def arguments(k, size: int, rng) -> tuple[dict, dict]:
    """Random arguments of ``k`` with every size equal to ``size``, and the size keywords."""
    sizes = {s: size for s in k.ir.sizes}
    args = {}
    for p in k.ir.params:
        if p.is_array:
            shape = tuple(size for _ in p.type.shape)
            args[p.name] = rng.random(shape) + 0.5
        else:
            args[p.name] = float(size) + 1.5 if p.name == "float_n" else 1.25
    if k.ir.name in DOMINANT:
        a = args[DOMINANT[k.ir.name]]
        args[DOMINANT[k.ir.name]] = a @ a.T + size * np.eye(size)
    return args, sizes


def copies(args):
    return {n: v.copy() if isinstance(v, np.ndarray) else v for n, v in args.items()}


@pytest.mark.parametrize("name", KERNELS)
def test_kernel_matches_interpreter_at_sizes_1_to_4(name):
    k = getattr(dsl, name)
    rng = np.random.default_rng(7)
    for size in (1, 2, 3, 4):
        args, sizes = arguments(k, size, rng)
        got, want = copies(args), copies(args)
        k(**got, **sizes)
        call_interpreted(k, **want, **sizes)
        for n, v in want.items():
            np.testing.assert_allclose(got[n], v, rtol=1e-12, atol=1e-12,
                                       err_msg=f"{name} size {size}: {n}")


@pytest.mark.parametrize("name,wrt", VJPS)
def test_vjp_matches_interpreter_at_sizes_1_to_4(name, wrt):
    k = getattr(dsl, name)
    dk = pa.vjp(k, wrt=wrt)
    outs = [p for p in k.ir.params if p.is_array and p.intent != "in"]
    rng = np.random.default_rng(8)
    for size in (1, 2, 3, 4):
        args, sizes = arguments(k, size, rng)
        bars = [rng.standard_normal(args[p.name].shape) for p in outs]
        positional = [args[p.name] for p in k.ir.params]
        got = dk(*copies(dict(enumerate(positional))).values(), *[b.copy() for b in bars],
                 **sizes)
        want = call_interpreted(dk.ir, *copies(dict(enumerate(positional))).values(),
                                *[b.copy() for b in bars], **sizes)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12,
                                   err_msg=f"vjp {name} wrt {wrt} size {size}")


def loop_of(source: str, statement: str) -> str:
    """The iterator of the innermost 'for' around the first line containing ``statement``."""
    lines = source.splitlines()
    at = next(i for i, line in enumerate(lines) if statement in line)
    depth = len(lines[at]) - len(lines[at].lstrip())
    for line in reversed(lines[:at]):
        indent = len(line) - len(line.lstrip())
        if indent < depth and line.lstrip().startswith("for ("):
            return re.match(r"\s*for \(int64_t (\w+) =", line).group(1)
    raise AssertionError(f"no loop around {statement!r}")


def pragmas(source: str) -> list:
    return [line.strip() for line in source.splitlines() if line.strip().startswith("#pragma")]


def test_atax_and_bicg_read_A_row_wise():
    # the second product (y[j] += A[i, j] * tmp[i]) is parallel over j: ISL makes j the
    # outer loop and walks A down its columns; the unit-stride pass moves j innermost
    # (strips of j in parallel outside)
    # (x = x + e is written as the update x += e; the first product's dot products along
    # the rows of A get lane sums)
    src = dsl.atax.source
    assert loop_of(src, "y[j] += A[i * N + j] * tmp[i]") == "j"
    assert "A[c0 * N" not in src and "A[i * N + c0]" not in src
    assert loop_of(src, "tmp_lanes[j_lane] += A[i * N + (j + j_lane)] * x[j + j_lane]") \
        == "j_lane"
    report = json.loads(pa.explain(dsl.atax, format="json"))
    assert any("unit stride" in d for d in report["schedule_decisions"])
    assert any(d.startswith("x = x + e written as the update x += e")
               for d in report["schedule_decisions"])
    assert loop_of(dsl.bicg.source, "s[j] += r_i * A[i * M + j]") == "j"
    assert "q_lanes[j_lane] += A[i * M + (j + j_lane)] * p[j + j_lane]" in dsl.bicg.source


def test_mvt_transposed_product_walks_rows():
    # x2[i] += A[j, i] * y_2[j]: as written, the inner loop j walks a column of A;
    # the scheduler interchanges so that i (parallel, in strips) is innermost
    src = dsl.mvt.source
    assert loop_of(src, "x2[i] += A[j * N + i] * y_2_j") == "i"
    assert loop_of(src, "x1_lanes[j_lane] += A[i * N + (j + j_lane)] * y_1[j + j_lane]") \
        == "j_lane"
    assert "#pragma omp parallel for schedule(static)" in pragmas(src)


def test_gradient_gets_the_same_decisions():
    # atax's vjp wrt x: the adjoint of each self-update saves, zeroes and restores the
    # cotangent of its target; the restore is dropped and the save read in place, so the
    # nests only add into d_tmp / d_x: no atomics; d_tmp's sums along the row get lane
    # sums, and the d_x nest (over A's columns) the unit-stride decision of atax itself
    dk = pa.vjp(dsl.atax, wrt="x")
    assert "omp atomic" not in dk.source and "t_S" not in dk.source
    report = json.loads(pa.explain(dk, format="json"))
    assert sum(d.startswith("restore of ") for d in report["schedule_decisions"]) == 2
    assert any(d.startswith("unit stride: the parallel loop")
               for d in report["schedule_decisions"])
    assert any(lp["decision"].startswith("per-lane partial sums") for lp in report["loops"])
    rng = np.random.default_rng(4)
    for m, n in ((1, 1), (3, 2), (4, 4), (20, 37)):
        A, x = rng.random((m, n)), rng.random(n)
        y, tmp, y_bar, tmp_bar = np.zeros(n), np.zeros(m), rng.random(n), rng.random(m)
        got = dk(A, x, y.copy(), tmp.copy(), y_bar, tmp_bar)
        want = call_interpreted(dk.ir, A, x, y.copy(), tmp.copy(), y_bar, tmp_bar)
        np.testing.assert_allclose(got, want, rtol=1e-12)


def test_mvt_gradient_is_one_pass_over_d_A():
    # the two adjoint nests of mvt's gradient both write d_A: after forward_copies one is
    # a gather (d_A[j, i] over j, i) and the zeroing of d_A is fused into it; the other
    # nest is fused in too (no dependence between different iterations): one pass (where
    # d_A is large, its rows are stored past the caches in a branch of their own)
    dk = pa.vjp(dsl.mvt, wrt="A")
    src = without_streamed_branches(dk.source)
    assert ("pa_stream_f64x8(&d_A[j * N + i], d_A_lanes);" in dk.source) == host_is_x86_64()
    assert src.count("d_A[") == 1 and "omp atomic" not in src
    assert loop_of(src, "d_A[j * N + i] = ") == "i"
    report = json.loads(pa.explain(dk, format="json"))
    assert any(d.startswith("fused the loop nest of S10 into that of S0, S6")
               for d in report["schedule_decisions"])


def region_shape(src: str) -> tuple[int, int, int]:
    """(omp parallel regions, 'omp for' loops, 'omp parallel for' loops) of a source."""
    ps = pragmas(src)
    return (sum(bool(re.fullmatch(r"#pragma omp parallel( if\(.*\))?", p)) for p in ps),
            sum(p.startswith("#pragma omp for") for p in ps),
            sum(p.startswith("#pragma omp parallel for") for p in ps))


@pytest.mark.parametrize("name", ["fdtd_2d", "jacobi_2d", "heat_3d"])
def test_time_loop_is_one_parallel_region(name):
    # a sequential time loop around parallel sweeps: one thread team for all steps,
    # a worksharing loop per sweep (a barrier each) instead of a fork/join per sweep
    # (untiled: jacobi-2d's time-skewed tiles have one region around the wavefronts)
    src = getattr(dsl, name).compile(tile=False).source
    regions, shared, forked = region_shape(src)
    assert regions == 1 and forked == 0 and shared >= 2
    assert re.search(r"#pragma omp parallel\n\s*for \(int64_t t ", src)


def test_floyd_warshall_has_at_most_one_parallel_region_per_k():
    # ISL's schedule is an anti-diagonal wavefront with a parallel innermost loop: a
    # synchronization per (k, diagonal) for one diagonal's work, at stride N - 1. Index-set
    # splitting runs row and column k first (from copies of their old values where the
    # program order reads those), the rest as parallel (i, j) nests with j unit-stride
    # innermost, all inside one thread team around k
    src = dsl.floyd_warshall.source
    regions, shared, forked = region_shape(src)
    assert forked == 0 and regions == 1 and shared >= 2
    assert loop_of(src, "path[i * N + j] = ") == "j"
    assert re.search(r"#pragma omp parallel\n\s*for \(int64_t k ", src)
    assert re.search(r"#pragma omp for schedule\(static\)\n\s*for \(int64_t i = \(k \+ 1\)",
                     src)
    report = json.loads(pa.explain(dsl.floyd_warshall, format="json"))
    assert report["schedule_origin"].startswith("program order")
    assert any(d.startswith("split i == k, j == k off loop k's nest")
               for d in report["schedule_decisions"])


def test_thin_innermost_parallel_loop_is_left_sequential():
    # the wavefront kernel of test_schedule has one loop above its parallel one: kept;
    # floyd-warshall's ISL schedule (two loops above an innermost parallel loop) is not
    # (the kernel as written: the schedule stage splits it, see the test above)
    from polyad.schedule.build import _candidate, _isl_schedule
    from polyad.poly import PolyModel, dependences
    from polyad.target.openmp import plan
    model = PolyModel(dsl.floyd_warshall.ir)
    deps = dependences(model)
    cand = _candidate(_isl_schedule(model, deps)[0], dsl.floyd_warshall.ir, model, deps)
    loops = plan(cand).loops.values()
    parallel = [lp for lp in loops if lp.facts.parallel]
    assert parallel and not any(lp.threads for lp in loops)
    assert all("inside 2 sequential loops" in lp.mapping for lp in parallel)


def isl_candidate_plan(k):
    """The OpenMP plan of ISL's own schedule of ``k`` (whether or not the scheduler keeps it)."""
    from polyad.pipeline import compile_kernel
    from polyad.schedule.build import _candidate, _isl_schedule
    from polyad.poly import dependences
    from polyad.target.openmp import plan
    sk = compile_kernel(k.ir).scheduled
    isl_schedule, _ = _isl_schedule(sk.model, dependences(sk.model))
    return plan(_candidate(isl_schedule, sk.kernel, sk.model, sk.deps))


def test_sequential_statements_in_a_region_run_in_single():
    # trisolv under ISL's schedule (the column order): x[i] /= L[i, i] runs once per step,
    # by one thread, between the shared loops
    from polyad.emit.c_openmp import emit_c
    from polyad.emit.cexpr import C99
    p = isl_candidate_plan(dsl.trisolv)
    src = emit_c(p, C99)
    body = src[src.index("#pragma omp parallel if"):]
    single = body.index("#pragma omp single")
    assert "x[c0] = x[c0] / L[c0 * N + c0]" in body[single:body.index("#pragma omp for")]
    decisions = [lp.decision() for lp in p.loops.values()]
    assert any(d.startswith("omp parallel if(N - 1 >= 8192): one thread team")
               for d in decisions)
    assert any(d.startswith("omp for") for d in decisions)


def test_thin_region_runs_in_threads_only_for_long_rows_and_scores_half():
    # trisolv's column order synchronizes once per row for one row's work: an if clause
    # on N; fdtd-2d's sweeps are two-dimensional: no clause. When the scheduler compares
    # schedules, a deepest statement in such a region scores as a unit-stride vector loop
    # (the program order's lane sums), half of a parallel loop that pays: a tie, and the
    # program order stays
    from polyad.emit.c_openmp import emit_c
    from polyad.emit.cexpr import C99
    from polyad.pipeline import compile_kernel
    p = isl_candidate_plan(dsl.trisolv)
    assert "#pragma omp parallel if(N - 1 >= 8192)" in pragmas(emit_c(p, C99))
    assert p.score() == (1, 2) == compile_kernel(dsl.trisolv.ir).plan.score()
    assert compile_kernel(dsl.gemm.ir).plan.score() == (2, 2)
    assert "#pragma omp parallel" in pragmas(dsl.fdtd_2d.source)


def test_trisolv_keeps_row_order_with_lane_sums():
    # the column order (ISL's, more parallel only in a thin region) walks L down its
    # columns; the program order's dot products x[i] -= L[i, j] * x[j] along j read a row
    # of L: kept, and summed in per-lane partial sums (the reads x[j], j < i, never see
    # the element x[i] the loop updates, which the loop facts prove)
    src = dsl.trisolv.source
    assert not any("parallel" in p for p in pragmas(src))
    assert "x_lanes[j_lane] -= L[i * N + (j + j_lane)] * x[j + j_lane]" in src
    report = json.loads(pa.explain(dsl.trisolv, format="json"))
    assert report["schedule_origin"].startswith("program order")
    sums = [lp for lp in report["loops"] if "per-lane partial sums" in lp["decision"]]
    assert len(sums) == 1
    assert any("a sum along the loop" in w for w in sums[0]["why"])
    rng = np.random.default_rng(5)
    for n in (1, 17, 40):  # below, at and past a block of 16 lanes, with remainders
        L = np.tril(rng.random((n, n))) / n + np.eye(n)
        b = rng.standard_normal(n)
        x = np.zeros(n)
        dsl.trisolv(L, x, b)
        np.testing.assert_allclose(L @ x, b, rtol=1e-10, atol=1e-10)


def test_dot_products_along_rows_get_lane_sums():
    # syrk: ISL's schedule (i, j, k) makes C[i, j] += alpha * A[i, k] * A[j, k] a dot
    # product of two rows of A along k, where the program order's inner j walks down a
    # column of A: kept as it is (as parallel, fewer strided accesses)
    src = dsl.syrk.source
    assert loop_of(src, "C_lanes[k_lane] += alpha * A[i * M + (k + k_lane)] * "
                        "A[j * M + (k + k_lane)]") == "k_lane"
    report = json.loads(pa.explain(dsl.syrk, format="json"))
    assert any(d.startswith("unit stride: ISL's schedule kept as it is")
               for d in report["schedule_decisions"])
    assert any(lp["decision"].startswith("per-lane partial sums: 16 lanes")
               for lp in report["loops"])
    # gemm's gradient: d_A[i, k] += d_C[i, j] * B[k, j] * alpha along j, into a large array
    # (no privatized copy): summed in lanes too, rows i in parallel outside
    dk = pa.vjp(dsl.gemm, wrt="A")
    assert "d_A_lanes[j_lane] += " in dk.source
    assert "#pragma omp parallel for schedule(static)" in pragmas(dk.source)
    # deterministic=True keeps every sum in order: no lanes
    det = pa.explain(dsl.syrk, deterministic=True, format="json")
    assert not any("per-lane" in lp["decision"] for lp in json.loads(det)["loops"])


def test_gradient_of_time_loop_gets_one_region():
    src = pa.vjp(dsl.jacobi_2d, wrt="A").source
    regions, shared, forked = region_shape(src)
    assert regions == 1 and shared >= 2
    # the loops outside the reversed time loop (copies) fork once each, at the top level
    forks = [line for line in src.splitlines() if "#pragma omp parallel for" in line]
    assert len(forks) == forked and all(line.startswith("  #") for line in forks)


def test_gradient_of_time_loop_gathers_without_atomics():
    # each reversed time step scatters d_A into d_B (and back) and zeroes the source:
    # the zeroing gets a loop of its own, the scatters become gathers inside t
    dk = pa.vjp(dsl.jacobi_2d, wrt="A")
    report = json.loads(pa.explain(dk, format="json"))
    gathers = [d for s in report["statements"] for d in s["scatter_to_gather"].values()]
    assert len(gathers) == 10 and all(d.startswith("gather inside loop t") for d in gathers)
    assert "atomic" not in dk.source


def test_explain_text_shows_region_and_unit_stride():
    text = pa.explain(dsl.atax)
    assert "decision: unit stride" in text
    assert "omp parallel: one thread team" in pa.explain(dsl.fdtd_2d)


def test_triangular_parallel_loops_are_dealt_round_robin():
    # syrk's row i updates i + 1 elements: blocks of rows per thread would give the
    # last thread most of the work
    src = dsl.syrk.source
    assert "#pragma omp parallel for schedule(static, 1)" in pragmas(src)
    assert "#pragma omp parallel for schedule(static)" in pragmas(dsl.gemm.compile(tile=False).source)
    report = json.loads(pa.explain(dsl.syrk, format="json"))
    assert any("round-robin" in w for lp in report["loops"] for w in lp["why"])


def schedule_decisions(k, **options) -> list:
    return json.loads(pa.explain(k, format="json", **options))["schedule_decisions"]


def test_products_are_tiled_by_the_cache_model():
    # gemm's i, k, j nest and 2mm's second product (ISL's fused schedule) run in tiles
    # whose accesses fit half of L2; the outer tile loop is the parallel one
    for k in (dsl.gemm, dsl.mm2):
        tiled = [d for d in schedule_decisions(k) if d.startswith("tiled ")]
        assert len(tiled) == 1 and "cache model" in tiled[0]
        assert re.match(r"tiled \d+x\d+x\d+ ", tiled[0])
    src = dsl.gemm.source
    assert "#pragma omp parallel for" in src and "pa_imin(" in src
    assert "for (int64_t i_tile = 0;" in src.split("#pragma omp parallel for")[1].splitlines()[1]


def test_dot_products_and_time_loops_are_not_tiled():
    # syrk's i, j, k schedule sums along its innermost loop in lanes: tiles would only
    # cut the lanes short; rectangular tiles of a time loop would run steps out of order
    assert any("innermost loop sums into one element" in d
               for d in schedule_decisions(dsl.syrk))
    assert any("dependence would run backwards" in d for d in schedule_decisions(dsl.fdtd_2d))
    assert not any(d.startswith("tiled ") for d in schedule_decisions(dsl.gemm, tile=False))
    assert "tiled 64x64x256" not in dsl.gemm.explain(tile=False)
    assert "pa_imin(" not in dsl.gemm.compile(tile=False).source


def _assert_tiled_matches_interpreter(k, name, tile, sizes_to_try, seed):
    """``k`` compiled with ``tile`` gives the reference interpreter's outputs at each size."""
    fn = k.compile(tile=tile)
    rng = np.random.default_rng(seed)
    for size in sizes_to_try:
        args, sizes = arguments(k, size, rng)
        got, want = copies(args), copies(args)
        fn(**got, **sizes)
        call_interpreted(k, **want, **sizes)
        for n, v in want.items():
            np.testing.assert_allclose(got[n], v, rtol=1e-12, atol=1e-12,
                                       err_msg=f"{name} tile {tile} size {size}: {n}")


@pytest.mark.parametrize("name,tile", [("gemm", (2, 3, 2)), ("mm2", (3, 2, 2)),
                                       ("syrk", (2, 2, 3))])
def test_tiled_kernels_match_interpreter_with_partial_tiles(name, tile):
    k = getattr(dsl, name)
    assert any(d.startswith("tiled " + "x".join(map(str, tile)))
               for d in schedule_decisions(k, tile=tile))
    _assert_tiled_matches_interpreter(k, name, tile, (1, 2, 3, 4, 7), seed=9)


def test_stencil_time_loops_are_time_skewed():
    # jacobi-2d's two statements per step (B from A at 2t, A from B at 2t + 1) read
    # their neighbours one step back: i and j skewed by 1 per half step make every
    # dependence distance non-negative; the tiles of a wavefront run in parallel
    decisions = [d for d in schedule_decisions(dsl.jacobi_2d, tile=(8, 16, 32))
                 if d.startswith("time-skewed tiled ")]
    assert len(decisions) == 1 and decisions[0].startswith("time-skewed tiled 8x16x32 ")
    assert "i + 1*(2*t + statement), j + 1*(2*t + statement)" in decisions[0]
    assert "wavefronts" in decisions[0]
    assert "time-skewed tiled 8x16x32" in dsl.jacobi_2d.explain(tile=(8, 16, 32))
    src = dsl.jacobi_2d.compile(tile=(8, 16, 32)).source
    assert region_shape(src) == (1, 1, 0)
    assert "for (int64_t i_tile = " in src and "for (int64_t j_skewed = " in src
    assert not any(d.startswith("time-skewed") for d in
                   schedule_decisions(dsl.jacobi_2d, tile=False))


def test_time_skew_is_refused_when_no_small_factor_makes_the_band_permutable():
    # B[i, j] reads A eight columns on, which the previous step wrote: only a skew of
    # 8 per half step would make the distance non-negative
    N, TSTEPS = dsl.N, dsl.TSTEPS

    @pa.kernel
    def far_shift(A: pa.f64[N, N], B: pa.f64[N, N]):
        for t in range(TSTEPS):
            for i in range(N):
                for j in range(N - 8):
                    B[i, j] = 0.5 * A[i, j + 8]
            for i in range(N):
                for j in range(N - 8):
                    A[i, j] = B[i, j]

    decisions = schedule_decisions(far_shift, tile=(2, 2, 2))
    assert any("no skew of the space by the time (at most 4 per step" in d for d in decisions)
    assert not any(d.startswith(("tiled", "time-skewed")) for d in decisions)


def test_dependence_check_refuses_wavefront_tiles_without_the_skew():
    # jacobi-2d's program-order schedule is [0, t, place, i, 0, j, 0]: wavefronts of
    # 4x4x4 tiles of the skewed band pass the check, of the unskewed one they do not
    # (B[i, j] at step t + 1 reads A[i + 1, j], which step t writes in a tile with a
    # larger i coordinate)
    import islpy as isl
    from polyad.pipeline import Options, compile_kernel
    from polyad.poly import maps_of
    from polyad.schedule import tiling

    sk = compile_kernel(dsl.jacobi_2d.ir, Options(tile=False)).scheduled
    per_statement = {m.get_tuple_name(isl.dim_type.in_): m
                     for m in maps_of(sk.schedule.get_map())}
    funcs = {n: tiling._functions(m) for n, m in per_statement.items()}
    group = list(sk.kernel.statements)
    skewed, factors = tiling._time_skew(group, per_statement, funcs, [1, 3, 5], sk.deps,
                                        sk.model)
    assert factors == [1, 1]
    plan = {st.name: (1, 6, {1: 4, 3: 4, 5: 4}, True) for st in group}
    assert tiling._respects(tiling._tiled_map(per_statement, {**funcs, **skewed}, plan),
                            sk.deps, sk.model)
    assert not tiling._respects(tiling._tiled_map(per_statement, funcs, plan), sk.deps,
                                sk.model)


@pytest.mark.parametrize("name,tile", [("jacobi_2d", (2, 3, 2)), ("jacobi_2d", (2, 1, 4)),
                                       ("jacobi_2d", None), ("heat_3d", (2, 3, 2, 2))])
def test_time_skewed_stencils_match_interpreter_with_partial_tiles(name, tile):
    k = getattr(dsl, name)
    assert any(d.startswith("time-skewed tiled ") for d in schedule_decisions(k, tile=tile))
    _assert_tiled_matches_interpreter(k, name, tile, (1, 2, 3, 4, 9), seed=11)


def test_tile_option_is_checked():
    with pytest.raises(ValueError, match="tile must be"):
        pa.compile(dsl.gemm, tile=(32, 0))
    with pytest.raises(pa.ArgumentError, match=r"got \(32, 0\)"):   # a polyad error
        pa.compile(dsl.gemm, tile=(32, 0))
