"""Tricky data flow for the reverse sweep's primal values (read / recompute / tape).

Each kernel is checked against finite differences; the structural assertions
pin down which mechanism polyad chose (see ``polyad.ad.tape``).
"""

from __future__ import annotations

import pytest

import polyad as pa
from polyad import ad

from ad_helpers import check_against_fd, check_vjp_against_fd, grad, vjp

M, N = pa.sizes("M N")


def _sources(k):
    return [st.source for st in k.ir.statements]


@pa.kernel
def nested_self_update(x: pa.f64[M], y: pa.f64[N]) -> pa.f64:
    C = 0.0
    for i in range(M):
        s = x[i]
        for j in range(N):
            s = s * y[j] + 0.1
            C += s * s
    return C


def test_nested_self_update(rng):
    check_against_fd(nested_self_update, ["x", "y"],
                     {"x": rng.standard_normal(3), "y": rng.standard_normal(4)})
    shapes = {t.type.shape for t in ad.tape_arrays(grad(nested_self_update, "x").ir)}
    assert len(shapes) == 1 and len(next(iter(shapes))) == 2     # indexed by (i, j)


@pa.kernel
def conditional_kill(x: pa.f64[N]) -> pa.f64:
    s = 0.5
    C = 0.0
    for i in range(N):
        if x[i] > 0.0:
            s = x[i]
        C += s * s * x[i]
    return C


def test_conditional_kill_is_taped(rng):
    check_against_fd(conditional_kill, "x", {"x": rng.standard_normal(7)})
    assert ad.tape_arrays(grad(conditional_kill, "x").ir)


@pa.kernel
def read_before_write(x: pa.f64[N]) -> pa.f64:
    t = pa.zeros(pa.f64[N])
    C = 0.0
    for i in range(N):
        C += t[i] * x[i] + t[N - 1 - i] * x[i]
        t[i] = x[i] * x[i]
    return C


def test_write_after_read_in_same_loop(rng):
    check_against_fd(read_before_write, "x", {"x": rng.standard_normal(6)})


@pa.kernel
def two_writers(x: pa.f64[N], y: pa.f64[N]) -> pa.f64:
    t = pa.empty(pa.f64[N])
    for i in range(N):
        t[i] = x[i]
        t[i] += y[i] * x[i]
        t[i] *= t[i]
    C = 0.0
    for i in range(N):
        C += pa.sqrt(t[i] + 1.0)
    return C


def test_several_writers_of_an_element(rng):
    check_against_fd(two_writers, ["x", "y"], {"x": rng.standard_normal(5),
                                               "y": rng.standard_normal(5)})


@pa.kernel
def two_level_recompute(x: pa.f64[M], y: pa.f64[N]) -> pa.f64:
    C = 0.0
    for i in range(M):
        a = x[i] * 2.0
        for j in range(N):
            b = a * y[j]
            C += pa.sin(b) * a
    return C


def test_recompute_across_levels(rng):
    check_against_fd(two_level_recompute, ["x", "y"],
                     {"x": rng.standard_normal(3), "y": rng.standard_normal(4)})
    k = grad(two_level_recompute, ["x", "y"])
    assert not ad.tape_arrays(k.ir)
    src = _sources(k)
    assert "recompute: a = x[i] * 2.0" in src and "recompute: b = a * y[j]" in src


@pa.kernel
def guard_on_taped_scalar(x: pa.f64[N]) -> pa.f64:
    r = 1.0
    C = 0.0
    for i in range(N):
        r = r * x[i]
        if r > 0.2:
            C += r * x[i]
        else:
            C -= pa.exp(r)
    return C


def test_guard_reads_overwritten_scalar(rng):
    check_against_fd(guard_on_taped_scalar, "x", {"x": rng.uniform(0.3, 1.8, 6)})


@pa.kernel
def carried_between_loops(x: pa.f64[M, N]) -> pa.f64:
    C = 0.0
    h = 0.0
    for i in range(M):
        for j in range(N):
            h = pa.tanh(h + x[i, j])
        C += h * h
        h = 0.5 * h
    return C


def test_state_carried_across_outer_iterations(rng):
    check_against_fd(carried_between_loops, "x", {"x": rng.standard_normal((3, 4))})


@pa.kernel
def shared_element(x: pa.f64[N].clamped, y: pa.Out(pa.f64[N].clamped)):
    for i in range(N):
        y[i - 1] = x[i] * x[i]        # y[0] written twice (i = 0 and i = 1): last one wins
    for i in range(N):
        y[i + 1] += 0.5 * y[i] * x[i]


def test_clamped_write_overwrites_and_self_reads(rng):
    check_vjp_against_fd(shared_element, "x", {"x": rng.standard_normal(5)},
                         {"y": rng.standard_normal(5)})


@pa.kernel
def zero_mode_writes(x: pa.f64[N], y: pa.Out(pa.f64[N].zero)):
    for i in range(-2, N + 2):
        y[i] = pa.sin(x[(i + 2) % 3]) * float(i)


def test_zero_mode_writes_dropped(rng):
    x = rng.standard_normal(5)
    check_vjp_against_fd(zero_mode_writes, "x", {"x": x}, {"y": rng.standard_normal(5)})


@pa.kernel
def inout_and_out(x: pa.f64[N], w: pa.f64[N], y: pa.Out(pa.f64[N])) -> pa.f64:
    for i in range(N):
        y[i] = x[i] * w[i]
        x[i] = pa.exp(x[i]) - y[i]
    C = 0.0
    for i in range(N):
        C += x[i] * y[i]
    return C


def test_vjp_inout_out_and_result_together(rng):
    x, w = rng.standard_normal(5), rng.standard_normal(5)
    check_vjp_against_fd(inout_and_out, ["x", "w"], {"x": x, "w": w},
                         {"x": rng.standard_normal(5), "y": rng.standard_normal(5),
                          "result": 0.3})
    assert [p.name for p in vjp(inout_and_out, "x").ir.params] == \
        ["x", "w", "x_bar", "y_bar", "result_bar", "d_x"]


@pytest.mark.parametrize("m,n", [(1, 1), (1, 4), (3, 1)])
def test_degenerate_sizes(rng, m, n):
    check_against_fd(carried_between_loops, "x", {"x": rng.standard_normal((m, n))})
    check_against_fd(two_level_recompute, ["x", "y"],
                     {"x": rng.standard_normal(m), "y": rng.standard_normal(n)})
