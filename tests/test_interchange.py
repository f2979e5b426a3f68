"""``schedule.loop_order.interchange_for_reuse``: a loop whose iterations all read the
same rows runs inside the loop that moves them (the conv layer's gradient: ``for b, h:
for co`` instead of ``for b, co: for h``, the rows of ``x`` reused from cache by every
output channel).

Decisions are asserted on the conv layer's gradient and forward and on small kernels
(interchanged where iterations are independent, not where an array element's terms or
a dependence would be reordered); values against the reference interpreter, in
default and deterministic mode.
"""

import numpy as np
import pytest

import polyad as pa
from polyad.pipeline import Options, artifact_of
from polyad.testing import interpret

from test_loop_order import conv_cost

B, C, H, V = pa.sizes("B C H V")


def _scheduled(kernel, target="openmp"):
    return artifact_of(kernel, Options(target=target)).scheduled


def _interchanges(sk):
    return {owner: why for owner, why in sk.loop_orders.items() if "interchanged (" in why}


@pa.kernel
def broadcast_rows(x: pa.f64[B, H, V], w: pa.f64[C], y: pa.Out(pa.f64[B, C, H, V])):
    for b in range(B):
        for c in range(C):
            for h in range(H):
                for v in range(V):
                    y[b, c, h, v] = x[b, h, v] * w[c]


@pa.kernel
def sum_over_both(x: pa.f64[B, H, V], w: pa.f64[C], s: pa.Out(pa.f64[B, V])):
    for b in range(B):
        for c in range(C):
            for h in range(H):
                for v in range(V):
                    s[b, v] += x[b, h, v] * w[c]


@pa.kernel
def diagonal_recurrence(x: pa.f64[B, H, V], y: pa.f64[B, C, H, V].clamped):
    for b in range(B):
        for c in range(1, C):
            for h in range(H):
                for v in range(V):
                    y[b, c, h, v] = 0.5 * y[b, c - 1, h + 1, v] + x[b, h, v]


def test_conv_gradient_runs_rows_outside_channels():
    sk = _scheduled(pa.grad(conv_cost, wrt=["w", "x"]))
    decisions = _interchanges(sk)
    # (the 9 taps unrolled into the row loop: kh is a constant in every copy)
    assert any("loops co and h interchanged (h outside): x[b, ci, h - 1, v - 1]" in why
               for why in decisions.values()), decisions
    assert any("loops ci and h interchanged (h outside): d_s_expanded[b, co, h + 1, "
               "v + 1]" in why for why in decisions.values()), decisions
    sums = {st.target_name: st for st in sk.kernel.statements
            if st.target_name in ("d_w", "d_x") and not st.source.startswith("zero")}
    # (the filter sums blocked by 2 output channels: a loop over co's iteration numbers)
    assert [lp.var for lp in sums["d_w"].loops[:3]] == ["b", "h", "co_iter"]
    assert [lp.var for lp in sums["d_x"].loops[:3]] == ["b", "h", "ci"]
    # the forward too: its cost is one scalar sum over every loop (a reduction, whose
    # terms then arrive in another fixed order)
    forward = _scheduled(conv_cost)
    assert any("loops co and h interchanged (h outside)" in why
               for why in _interchanges(forward).values())
    # not for CUDA, whose threads run single iterations
    assert _interchanges(_scheduled(pa.grad(conv_cost, wrt=["w", "x"]), "cuda")) == {}


def test_interchanged_where_iterations_are_independent():
    sk = _scheduled(broadcast_rows)
    (why,) = _interchanges(sk).values()
    assert why.startswith("loops c and h interchanged (h outside): x[b, h, v]")
    (st,) = sk.kernel.statements
    assert [lp.var for lp in st.loops] == ["b", "h", "c", "v"]


def test_not_interchanged_where_order_matters():
    # s[b, v] receives terms from both c and h: interchanged, they would arrive in
    # another order (another rounding)
    assert _interchanges(_scheduled(sum_over_both)) == {}
    # iteration (c, h) reads what (c - 1, h + 1) wrote: h outside would run it first
    assert _interchanges(_scheduled(diagonal_recurrence)) == {}


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("kernel", [broadcast_rows, sum_over_both, diagonal_recurrence])
def test_values_match_the_interpreter(kernel, deterministic):
    rng = np.random.default_rng(5)
    f = pa.compile(kernel, deterministic=deterministic)
    for b, c, h, v in [(1, 1, 1, 1), (2, 3, 4, 5), (3, 2, 7, 17)]:
        inputs = dict(x=rng.standard_normal((b, h, v)), w=rng.standard_normal(c))
        if kernel is diagonal_recurrence:
            inputs = dict(x=inputs["x"], y=rng.standard_normal((b, c, h, v)))
        _, want = interpret(kernel.ir, {k: a.copy() for k, a in inputs.items()},
                            dict(B=b, C=c, H=h, V=v))
        out = f(**inputs)
        name = {broadcast_rows: "y", sum_over_both: "s", diagonal_recurrence: "y"}[kernel]
        got = inputs["y"] if kernel is diagonal_recurrence else out
        np.testing.assert_allclose(got, want[name], rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("deterministic", [False, True])
def test_conv_forward_matches_the_interpreter(deterministic):
    f = pa.compile(conv_cost, deterministic=deterministic)
    rng = np.random.default_rng(7)
    for b, ci, co, h, w in [(1, 1, 1, 1, 1), (2, 3, 2, 5, 19)]:
        x = rng.standard_normal((b, ci, h, w))
        wt = rng.standard_normal((co, ci, 3, 3))
        y = rng.standard_normal((b, co, h, w))
        want, _ = interpret(conv_cost.ir, dict(x=x, w=wt, y=y), dict(B=b, CI=ci, CO=co, H=h, W=w))
        first = f(x, wt, y)
        np.testing.assert_allclose(first, want, rtol=1e-13)
        if deterministic:
            assert all(f(x, wt, y) == first for _ in range(3))


@pytest.mark.parametrize("deterministic", [False, True])
def test_conv_gradient_matches_the_interpreter(deterministic):
    grad = pa.grad(conv_cost, wrt=["w", "x"])
    f = pa.compile(grad, deterministic=deterministic)
    rng = np.random.default_rng(6)
    for b, ci, co, h, w in [(1, 1, 1, 1, 1), (2, 3, 2, 5, 19), (1, 2, 3, 2, 4), (2, 2, 3, 3, 37),
                            (3, 1, 2, 4, 5)]:
        x = rng.standard_normal((b, ci, h, w))
        wt = rng.standard_normal((co, ci, 3, 3))
        y = rng.standard_normal((b, co, h, w))
        _, want = interpret(grad.ir, dict(x=x, w=wt, y=y), dict(B=b, CI=ci, CO=co, H=h, W=w))
        d_w, d_x = f(x, wt, y)
        np.testing.assert_allclose(d_w, want["d_w"], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(d_x, want["d_x"], rtol=1e-12, atol=1e-12)
