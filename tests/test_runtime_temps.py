"""Temporaries are reused between calls (per thread); pa.zeros ones are zeroed every call."""

import threading

import numpy as np

import polyad as pa

N, = pa.sizes("N")


@pa.kernel
def accumulate_twice(x: pa.f64[N], y: pa.Out(pa.f64[N])):
    t = pa.zeros(pa.f64[N])
    for i in range(N):
        t[i] += x[i]
        t[i] += x[i]
    for i in range(N):
        y[i] = t[i]


def test_zeroed_temporary_starts_from_zero_on_every_call():
    x = np.arange(6.0)
    first = accumulate_twice(x).copy()
    np.testing.assert_array_equal(accumulate_twice(x), first)
    np.testing.assert_array_equal(first, 2 * x)
    # a different size gets a buffer of its own size
    np.testing.assert_array_equal(accumulate_twice(np.ones(9)), np.full(9, 2.0))


def test_threads_do_not_share_temporaries():
    results = {}

    def work(k):
        x = np.full(50_000, float(k))
        for _ in range(20):
            y = accumulate_twice(x)
            if not np.array_equal(y, 2 * x):
                results[k] = "wrong"
                return
        results[k] = "ok"

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {k: "ok" for k in range(4)}
