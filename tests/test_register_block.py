"""``schedule.register_block``: taps and output channels unrolled and jammed into the
vector loop, on the benchmark's conv layer and on kernels where it would be wrong.

The conv layer (the kernel of ``benchmarks/kernels.py``, as in
``test_loop_order``) must get its filter rows jammed into the pixel-row loop
in the forward sum and the input gradient, and its filter gradient blocked by
4 input channels; ``pa.explain`` shows both. Values must match the reference
interpreter (default and deterministic) and finite differences, with channel
counts below, at and above the block (remainders).
"""

import numpy as np
import pytest

import polyad as pa
from polyad.pipeline import Options, compile_kernel
from polyad.schedule.register_block import RegisterModel, register_block
from polyad.testing import interpret

from ad_helpers import check_against_fd
from test_loop_order import conv_cost, conv_cost32

C, M, N = pa.sizes("C M N")


@pa.kernel
def running_rows(x: pa.f64[M, N], f: pa.f64[3], out: pa.Out(pa.f64[M, N])):
    # each pass k reads the row the previous pass updated, one point to the left:
    # jamming the passes into the loop over n would read out[m, n - 1] too early
    for m in range(M):
        for k in range(3):
            for n in range(1, N):
                out[m, n] += out[m, n - 1] * f[k] + x[m, n]


@pa.kernel
def chained_sums(x: pa.f64[N], t: pa.Out(pa.f64[C, 1])):
    # channel c adds the finished sum of channel c - 1: the channels are not independent
    for c in range(1, C):
        for n in range(N):
            t[c, 0] += t[c - 1, 0] * x[n]


@pa.kernel
def channel_sums(x: pa.f64[C, N], y: pa.f64[N], t: pa.Out(pa.f64[C, 1])):
    for c in range(C):
        for n in range(N):
            t[c, 0] += x[c, n] * y[n]


def _scheduled(kernel, deterministic=False):
    return compile_kernel(kernel.ir, Options(deterministic=deterministic)).scheduled


def _decision(sk, array):
    owners = {st.owner for st in sk.kernel.statements
              if getattr(st.target, "array", None) == array}
    texts = [sk.loop_orders[o] for o in owners if o in sk.loop_orders]
    return " ".join(texts)


@pytest.mark.parametrize("kernel", [conv_cost, conv_cost32])
def test_conv_layer_blocks(kernel):
    grad = pa.grad(kernel, wrt=["w", "x"])
    sk = _scheduled(grad)
    assert "register block: ci by 4 in S" in _decision(sk, "d_w")
    assert "register block: taps kw unrolled (3) and jammed into v" in _decision(sk, "d_x")
    assert "register block: taps kw unrolled (3) and jammed into v" in _decision(sk, "s_rows")
    # the copies: 4 channels of d_w share the loop over ci stepping by 4, with a remainder
    blocked = [st for st in sk.kernel.statements if st.target_name == "d_w"
               and any(lp.var == "ci" and lp.step == 4 for lp in st.loops)]
    assert {st.name.rsplit("_c", 1)[1] for st in blocked} == {"0", "1", "2", "3"}
    assert any(st.target_name == "d_w" and st.name.endswith("_rem")
               for st in sk.kernel.statements)
    # no tap loop is left inside the forward sum's or d_x's nest
    for st in sk.kernel.statements:
        if st.target_name in ("s_rows", "d_x") and len(st.loops) == 7:
            assert st.loops[-2].var == "kw" and st.loops[-2].step == 3
    text = pa.explain(grad)
    assert "register block: ci by 4 in S" in text
    src = grad.source
    assert "for (int64_t ci = 0; ci < (CI - 3); ci += 4) {" in src
    assert "d_w_lanes4[" in src  # four lane accumulators in one loop
    # the forward kernel: the taps jammed, the channels not (row updates)
    fwd = _scheduled(kernel)
    assert "register block: taps kw" in _decision(fwd, "s_rows")
    assert "co by" not in _decision(fwd, "s_rows")


def test_deterministic_mode_blocks_too_and_no_block_without_a_register_model():
    # the blocks keep the order of every element's terms: deterministic mode has them
    sk = _scheduled(pa.grad(conv_cost, wrt=["w", "x"]), deterministic=True)
    assert "register block: ci by 4" in _decision(sk, "d_w")
    # CUDA has no register model: its schedule has no blocks
    cuda = compile_kernel(pa.grad(conv_cost, wrt=["w", "x"]).ir,
                          Options(target="cuda")).scheduled
    assert not any("register block" in t for t in cuda.loop_orders.values())


SHAPES = [(1, 1, 1, 1, 1), (1, 3, 2, 3, 17), (1, 4, 3, 2, 19), (2, 5, 2, 3, 37),
          (1, 9, 5, 2, 21)]


@pytest.mark.parametrize("deterministic", [False, True])
def test_blocked_conv_gradient_matches_the_interpreter(deterministic):
    grad = pa.grad(conv_cost, wrt=["w", "x"])
    fn = pa.compile(grad, deterministic=deterministic)
    fwd = pa.compile(conv_cost, deterministic=deterministic)
    rng = np.random.default_rng(21)
    for b, ci, co, h, w in SHAPES:
        x = rng.standard_normal((b, ci, h, w))
        wt = rng.standard_normal((co, ci, 3, 3))
        y = rng.standard_normal((b, co, h, w))
        sizes = dict(B=b, CI=ci, CO=co, H=h, W=w)
        dw, dx = fn(x, wt, y)
        _, want = interpret(grad.ir, dict(x=x.copy(), w=wt.copy(), y=y), sizes)
        np.testing.assert_allclose(dw, want["d_w"], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(dx, want["d_x"], rtol=1e-12, atol=1e-12)
        cost, _ = interpret(conv_cost.ir, dict(x=x, w=wt, y=y), sizes)
        np.testing.assert_allclose(fwd(x, wt, y), cost, rtol=1e-12)


@pytest.mark.parametrize("b, ci, co, h, w", [(1, 3, 2, 2, 5), (1, 5, 2, 2, 6)])
def test_blocked_conv_gradient_matches_finite_differences(b, ci, co, h, w):
    rng = np.random.default_rng(ci * 10 + co)
    check_against_fd(conv_cost, ["w", "x"],
                     dict(x=rng.standard_normal((b, ci, h, w)),
                          w=rng.standard_normal((co, ci, 3, 3)),
                          y=rng.standard_normal((b, co, h, w))),
                     dict(B=b, CI=ci, CO=co, H=h, W=w))


def test_float32_blocked_conv_gradient_matches_the_interpreter():
    grad = pa.grad(conv_cost32, wrt=["w", "x"])
    rng = np.random.default_rng(5)
    b, ci, co, h, w = 1, 6, 3, 4, 70
    x = rng.standard_normal((b, ci, h, w)).astype(np.float32)
    wt = rng.standard_normal((co, ci, 3, 3)).astype(np.float32)
    y = rng.standard_normal((b, co, h, w)).astype(np.float32)
    dw, dx = grad(x, wt, y)
    _, want = interpret(grad.ir, dict(x=x.copy(), w=wt.copy(), y=y),
                        dict(B=b, CI=ci, CO=co, H=h, W=w))
    np.testing.assert_allclose(dw, want["d_w"], rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(dx, want["d_x"], rtol=2e-4, atol=2e-4)


MODEL = RegisterModel(vector_registers=32, lane_sum=2)


def test_a_tap_loop_whose_passes_feed_each_other_is_not_jammed():
    kernel, decisions = register_block(running_rows.ir, MODEL)
    assert decisions == {} and kernel == running_rows.ir
    rng = np.random.default_rng(3)
    x, f = rng.standard_normal((3, 11)), rng.standard_normal(3)
    out = np.zeros((3, 11))
    running_rows(x, f, out)
    _, want = interpret(running_rows.ir, dict(x=x, f=f, out=np.zeros((3, 11))),
                        dict(M=3, N=11))
    np.testing.assert_allclose(out, want["out"], rtol=1e-13)


def test_channels_that_depend_on_each_other_are_not_blocked():
    kernel, decisions = register_block(chained_sums.ir, MODEL)
    assert decisions == {} and kernel == chained_sums.ir
    kernel, decisions = register_block(channel_sums.ir, MODEL)
    (text,) = decisions.values()
    assert text.startswith("register block: c by 4 in S0") and "y[n]" in text
    rng = np.random.default_rng(4)
    for c in (1, 3, 4, 6):
        x, y = rng.standard_normal((c, 40)), rng.standard_normal(40)
        t = np.zeros((c, 1))
        channel_sums(x, y, t)
        np.testing.assert_allclose(t[:, 0], x @ y, rtol=1e-12)
