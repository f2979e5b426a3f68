"""Index-set splitting (polyad.schedule.split): the instances that carry a nest's
dependences inside one iteration of its outer loop run first, the rest as one
parallel nest reading the array or a copy taken before the update.

Every kernel is checked against the reference interpreter (program order) bit for bit
(the split keeps each statement instance's own arithmetic), at 1 and 2 threads.
"""

import json

import numpy as np
import polyad as pa
from c_corpus import polybench_dsl as dsl
from polyad.testing import call_interpreted
from test_polybench import loop_of, pragmas, region_shape

N = pa.sizes("N")


@pa.kernel
def row_update(A: pa.f64[N, N]):
    # only row k is read by other instances of iteration k: i == k is split off
    for k in range(N):
        for i in range(N):
            for j in range(N):
                A[i, j] = A[i, j] * 0.5 + A[k, j]


@pa.kernel
def column_sweep(A: pa.f64[N, N]):
    # A[i - 1, j] is written earlier in the same k iteration by instances that are no
    # row or column of k: no equality subset holds the sources, no split
    for k in range(N):
        for i in range(1, N):
            for j in range(N):
                A[i, j] = A[i - 1, j] + A[k, j]


def decisions(k):
    return json.loads(pa.explain(k, format="json"))["schedule_decisions"]


def check_against_interpreter(k, sizes=(1, 2, 3, 4, 9)):
    rng = np.random.default_rng(11)
    for n in sizes:
        a = rng.random((n, n)) * 10
        want = a.copy()
        call_interpreted(k, want, N=n)
        for threads in (1, 2):
            got = a.copy()
            with pa.num_threads(threads):
                k(got, N=n)
            np.testing.assert_array_equal(got, want, err_msg=f"N={n}, {threads} threads")


def test_floyd_warshall_splits_row_and_column_k():
    fact = [d for d in decisions(dsl.floyd_warshall) if d.startswith("split ")]
    assert len(fact) == 1
    assert fact[0].startswith("split i == k, j == k off loop k's nest of S0")
    assert "copied before their update" in fact[0] and "4 pieces" in fact[0]


def test_floyd_warshall_is_one_region_with_parallel_unit_stride_nests():
    src = dsl.floyd_warshall.source
    regions, shared, forked = region_shape(src)
    assert regions == 1 and forked == 0 and shared >= 2
    # the outer loop keeps the DSL name, inside it the (i, j) pieces run under 'omp for'
    # with j innermost (unit stride)
    assert "for (int64_t k = 0; k < N; k++)" in src
    assert loop_of(src, "path[i * N + j] = pa_min_f64(path[i * N + j], path[i * N + k]") == "j"
    assert loop_of(src, "path[i * N + j] = pa_min_f64(path[i * N + j], path_k_j[i]") == "j"
    lines = src.splitlines()
    nest = next(n for n, line in enumerate(lines) if "path[i * N + j] = " in line)
    above = [line.strip() for line in lines[:nest]]
    i_loop = max(n for n, line in enumerate(above) if line.startswith("for (int64_t i "))
    assert above[i_loop - 1].startswith("#pragma omp for")
    assert "#pragma omp single" in pragmas(src)  # row and column k: O(N) per k


def test_floyd_warshall_matches_interpreter():
    check_against_interpreter(dsl.floyd_warshall)


def test_split_of_one_equality_matches_interpreter():
    fact = [d for d in decisions(row_update) if d.startswith("split ")]
    assert len(fact) == 1 and fact[0].startswith("split i == k off loop k's nest")
    assert "A_k_i" in row_update.source
    check_against_interpreter(row_update)


def test_no_split_where_other_instances_carry_the_dependences():
    assert not any(d.startswith("split ") for d in decisions(column_sweep))
    assert "_k_" not in column_sweep.source
    check_against_interpreter(column_sweep, sizes=(1, 2, 4, 9))


def test_floyd_warshall_on_cuda_sim():
    # the CUDA target runs the split too: the rest pieces on the grid, the split-off
    # instances in one thread between them
    sim = pa.compile(dsl.floyd_warshall, target="cuda-sim")
    assert "path_k_i[j] = path[k * N + j];" in sim.source
    rng = np.random.default_rng(12)
    for n in (1, 2, 3, 4, 9):
        a = rng.random((n, n)) * 10
        got, want = a.copy(), a.copy()
        sim(got, N=n)
        call_interpreted(dsl.floyd_warshall, want, N=n)
        np.testing.assert_array_equal(got, want, err_msg=f"cuda-sim N={n}")
