"""Choosing the number of OpenMP threads: pa.num_threads(n) blocks, num_threads= per
call, and concurrent calls from several Python threads sharing the cores."""

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import polyad as pa
from polyad.runtime import threads

N = pa.sizes("N")


@pa.kernel
def total(x: pa.f64[N]) -> pa.f64:
    s = 0.0
    for i in range(N):
        s += x[i]
    return s


def test_block_and_per_call_limits_apply_to_the_call_and_are_restored(monkeypatch):
    x = np.arange(100_000.0)
    before = threads.max_threads()
    seen = []
    real_begin = threads.begin_call

    def spy():
        previous = real_begin()
        seen.append(threads.max_threads())
        return previous

    monkeypatch.setattr(threads, "begin_call", spy)
    with pa.num_threads(1):
        assert total(x) == x.sum()
        with pa.num_threads(3):
            total(x)
        total(x)
    total(x, num_threads=2)
    total(x)
    assert seen == [1, 3, 1, 2, before]
    assert threads.max_threads() == before


def test_bad_values_are_refused():
    with pytest.raises(ValueError, match="positive int"):
        pa.num_threads(0)
    with pytest.raises(ValueError, match="positive int"):
        total(np.ones(3), num_threads=1.5)


def test_concurrent_calls_share_the_cores():
    """While one call runs, a second call from another thread gets cores // 2 threads."""
    results = {}
    first_inside = threading.Event()
    release = threading.Event()

    def first():
        previous = threads.begin_call()
        first_inside.set()
        release.wait(60)
        threads.end_call(previous)

    def second():
        first_inside.wait(60)
        previous = threads.begin_call()
        results["second"] = threads.max_threads()
        threads.end_call(previous)
        results["after"] = threads.max_threads()
        release.set()

    with ThreadPoolExecutor(2) as pool:
        done = [pool.submit(first), pool.submit(second)]
        for f in done:
            f.result(timeout=60)
    assert results["second"] == max(1, threads.cores() // 2)
    assert results["after"] == threads.cores() or results["after"] >= results["second"]


def test_kernels_from_worker_threads_compute_the_same():
    x = np.random.default_rng(0).random(50_000)
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda _: total(x), range(8)))
    np.testing.assert_allclose(got, x.sum(), rtol=1e-12)


def test_cores_follows_omp_num_threads(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert threads.cores() == 3
