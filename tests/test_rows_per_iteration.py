"""A row per iteration: border sums gathered one piece per value
(``schedule.gather``), zeroings moved into the nest row by row
(``schedule.cleanup.fuse_zero_initialization``), and a temporary that each iteration
writes and reads one row of kept as that row, per thread
(``schedule.fusion.rows_per_iteration``).

Decisions are asserted on small kernels and on the deconvolution gradient (where the
three together put the ``d_t`` pass and the ``d_x`` pass in one loop over rows with
``d_t`` in a row buffer, the hand-written line-buffered gradient's structure); values
against the reference interpreter at sizes where the border pieces meet.
"""

import numpy as np
import pytest

import polyad as pa
from polyad import ir
from polyad.pipeline import Options, artifact_of
from polyad.testing import interpret

from ad_helpers import check_against_fd
from deconv_kernels import deconvolution
from test_ad_corpus import clamped_wide
from test_shared_loop_fusion import scale_then_diff, scale_then_vertical

M, N = pa.sizes("M N")


def _scheduled(kernel, target="openmp", **options):
    return artifact_of(kernel, Options(target=target, **options)).scheduled


def _row_decisions(sk) -> list:
    return [d for d in sk.schedule_decisions if "kept as one row per thread" in d]


@pa.kernel
def square_then_scale_and_copy(x: pa.f64[M, N], y: pa.Out(pa.f64[M, N]),
                               z: pa.Out(pa.f64[M, N])):
    t = pa.empty(pa.f64[M, N])
    for m in range(M):
        for n in range(N):
            t[m, n] = x[m, n] * x[m, n]
    for m in range(M):
        for n in range(N):
            y[m, n] = 3.0 * t[m, n]  # its own row (without z: t would be one row)
    for n in range(N):
        for m in range(M):
            z[m, n] = t[m, n]


@pa.kernel
def zero_then_row_sums(x: pa.f64[M, N], y: pa.Out(pa.f64[M, N])):
    t = pa.empty(pa.f64[M, N])
    for m in range(M):
        for n in range(N):
            t[m, n] = 0.0
    for m in range(M):
        for n in range(N):
            t[m, n] += x[m, n] * x[m, n]
        for n in range(N):
            y[m, n] = t[m, n] + 1.0


def test_temporary_read_in_its_row_is_a_row_per_thread():
    sk = _scheduled(scale_then_diff)
    (text,) = _row_decisions(sk)
    assert text.startswith("t kept as one row per thread (t_row): each iteration of m")
    (row,) = [t for t in sk.kernel.temps if t.name == "t_row"]
    assert row.per_thread and row.role == "row" and row.chunk_loops == ("m",)
    assert [ir.expr_str(e) for e in row.type.shape] == ["N"]
    assert row not in sk.kernel.caller_temps  # the generated code declares it
    assert "t_row[n + 1]" in scale_then_diff.source
    # not for CUDA, whose threads run single iterations
    assert _row_decisions(_scheduled(scale_then_diff, "cuda")) == []


def test_not_where_another_row_or_another_nest_reads_it():
    # row m + 1 is written an iteration later (the nests are not fused either)
    assert _row_decisions(_scheduled(scale_then_vertical)) == []
    # a third nest reads t down its columns: t must hold the whole image
    sk = _scheduled(square_then_scale_and_copy)
    assert _row_decisions(sk) == [] and [t.name for t in sk.kernel.temps] == ["t"]


def test_zeroing_moves_into_the_nest_row_by_row():
    """The nest's statements share only the loop over m (two loops over n): the zeroing
    of row m runs at the start of iteration m, and t is then a row per thread."""
    sk = _scheduled(zero_then_row_sums)
    assert sk.fused_initializations
    zero = next(st for st in sk.kernel.statements
                if st.target_name == "t_row" and isinstance(st.expr, ir.Const))
    users = [st for st in sk.kernel.statements if st.accesses("t_row")]
    assert {st.position[0] for st in users} == {zero.position[0]}
    assert all(st.loops[0].var == "m" for st in users)
    assert zero.position[1] < min(st.position[1] for st in users if st is not zero)
    assert len(_row_decisions(sk)) == 1


@pytest.mark.parametrize("kernel", [scale_then_diff, scale_then_vertical,
                                    square_then_scale_and_copy, zero_then_row_sums])
@pytest.mark.parametrize("deterministic", [False, True])
def test_values_match_the_interpreter(kernel, deterministic):
    fn = pa.compile(kernel, deterministic=deterministic)
    outs = [p.name for p in kernel.ir.params if p.intent == "out"]
    rng = np.random.default_rng(3)
    for m, n in [(1, 1), (2, 3), (5, 8), (17, 33)]:
        x = rng.standard_normal((m, n))
        _, want = interpret(kernel.ir, dict(x=x), dict(M=m, N=n))
        got = fn(x)
        got = got if isinstance(got, tuple) else (got,)
        for name, value in zip(outs, got):
            np.testing.assert_allclose(value, want[name], rtol=1e-14, atol=1e-14, err_msg=name)


def test_border_sums_gather_one_piece_per_value():
    """d_x[0] += ... from i in {0, 1, 2} (x[i - 3] clamped) and d_x[N - 1] += ... from
    i in {N - 2, N - 1} (x[i + 2]): each value its own gather piece, so the edge
    elements' sums run in their own iterations, not in a nest of their own after the
    interior's."""
    sk = _scheduled(pa.grad(clamped_wide, wrt="x"))
    per_value = sorted(d for d in sk.gather_decisions.values() if "per value" in d)
    assert per_value == ["gather (one piece per value of i: 0, 1, 2)",
                         "gather (one piece per value of i: N - 1, N - 2)"]
    assert not any("nest of its own" in d for d in sk.gather_decisions.values())


def test_wide_clamped_gradient_matches_the_interpreter_and_finite_differences():
    grad = pa.grad(clamped_wide, wrt="x")
    rng = np.random.default_rng(8)
    for n in range(1, 10):
        x = rng.standard_normal(n)
        _, want = interpret(grad.ir, dict(x=x), dict(N=n))
        np.testing.assert_allclose(grad(x), want["d_x"], rtol=1e-12, atol=1e-12)
    for n in (1, 2, 3, 4):
        check_against_fd(clamped_wide, ("x",), dict(x=rng.standard_normal(n)))


def test_deconvolution_gradient_runs_d_t_and_d_x_in_one_loop_over_rows():
    """(unfused: by default the whole gradient is one chain, ``test_fusion``)"""
    grad = pa.grad(deconvolution("f64"), wrt=("x", "f"))
    sk = _scheduled(grad, fuse=False)
    per_value = sorted(d for d in sk.gather_decisions.values() if "per value" in d)
    assert per_value == ["gather (one piece per value of m: 0, 1)",
                         "gather (one piece per value of m: M - 1, M - 2)",
                         "gather (one piece per value of n: 0, 1)",
                         "gather (one piece per value of n: N - 1, N - 2)"]
    (fused,) = [d for d in sk.schedule_decisions if "inside the loops m:" in d]
    assert "zero_d_t" in fused.split(" into that of ")[1]
    assert _row_decisions(sk) == ["d_t kept as one row per thread (d_t_row): each iteration "
                                  "of m writes and reads only its own row of it"]
    d_x = [st for st in sk.kernel.statements if st.target_name == "d_x"]
    d_t = [st for st in sk.kernel.statements if st.accesses("d_t_row")]
    assert {st.position[0] for st in d_x + d_t} == {d_x[0].position[0]}
    assert [t.name for t in sk.kernel.caller_temps] == ["t", "d_r_expanded"]


@pytest.mark.parametrize("fuse", [False, True])
def test_deconvolution_gradient_matches_the_interpreter(fuse):
    """(deterministic builds: test_first_updates and test_fusion)"""
    grad = pa.grad(deconvolution("f64"), wrt=("x", "f"))
    fn = pa.compile(grad, fuse=fuse)
    rng = np.random.default_rng(12)
    for m, n in [(1, 1), (1, 5), (2, 2), (3, 4), (4, 3), (5, 5), (6, 7), (70, 9)]:
        inputs = dict(x=rng.standard_normal((m, n)), f=rng.standard_normal(5),
                      y=rng.standard_normal((m, n)))
        _, want = interpret(grad.ir, inputs, dict(M=m, N=n))
        d_x, d_f = fn(*inputs.values())
        np.testing.assert_allclose(d_x, want["d_x"], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(d_f, want["d_f"], rtol=1e-12, atol=1e-12)


def separable_blur_cost(mode: str, taps: int):
    """A separable blur (horizontal into a temporary of boundary ``mode``, then vertical)
    and its squared error: ``taps`` 3, or 5 (the deconvolution's)."""
    if taps == 5:
        return deconvolution("f64", mode)
    X = getattr(pa.f64[M, N], mode)

    @pa.kernel
    def blur3_cost(x: X, f: pa.f64[3], y: pa.f64[M, N]) -> pa.f64:
        t = pa.empty(X)
        for m in range(M):
            for n in range(N):
                t[m, n] = f[0] * x[m, n - 1] + f[1] * x[m, n] + f[2] * x[m, n + 1]
        C = 0.0
        for m in range(M):
            for n in range(N):
                r = f[0] * t[m - 1, n] + f[1] * t[m, n] + f[2] * t[m + 1, n] - y[m, n]
                C += r * r
        return C
    return blur3_cost


@pytest.mark.parametrize("mode, taps", [(mode, taps) for mode in ("clamped", "zero", "circular",
                                                                   "mirror")
                                         for taps in (3, 5) if (mode, taps) != ("clamped", 5)])
def test_blur_gradients_of_every_boundary_mode_match_the_interpreter(mode, taps):
    """The border pieces these passes rewrite differ by mode and width: every gradient,
    default and fused, against the interpreter at sizes 1-4 (where the border pieces of
    both edges meet) and one larger (clamped with 5 taps: the deconvolution's, below)."""
    grad = pa.grad(separable_blur_cost(mode, taps), wrt=("x", "f"))
    compiled = [pa.compile(grad), pa.compile(grad, fuse=True)]
    rng = np.random.default_rng(taps * 10 + len(mode))
    for m, n in [(1, 1), (1, 4), (2, 3), (3, 2), (4, 4), (3, 1), (9, 7)]:
        inputs = dict(x=rng.standard_normal((m, n)), f=rng.standard_normal(taps),
                      y=rng.standard_normal((m, n)))
        _, want = interpret(grad.ir, inputs, dict(M=m, N=n))
        for fn in compiled:
            try:
                d_x, d_f = fn(*inputs.values())
            except pa.ShapeError as e:
                # one wrap or reflection of an offset only: sizes below it are refused
                assert mode in ("circular", "mirror") and min(m, n) <= taps // 2, e
                continue
            np.testing.assert_allclose(d_x, want["d_x"], rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(d_f, want["d_f"], rtol=1e-12, atol=1e-12)
    # and the gradient itself against central differences of the primal (independent of
    # AD and of the interpreter's run of the derived kernel)
    check_against_fd(separable_blur_cost(mode, taps), ("x", "f"),
                     dict(x=rng.standard_normal((3, 4)), f=rng.standard_normal(taps),
                          y=rng.standard_normal((3, 4))))


@pytest.mark.parametrize("deterministic", [False, True])
def test_a_slab_per_iteration_of_the_shared_loops(deterministic):
    """fusion.slabs_per_iteration: in the conv layer's gradient wrt w alone, once the
    filter sums run blocked over two output channels, each iteration of b, h writes and
    reads only the CO x W elements of d_s with its b and h: kept as that slab per
    thread, none left for the caller. Values against the interpreter, CO odd and even."""
    from test_loop_order import conv_cost, conv_gradient_matches_interpreter
    grad = pa.grad(conv_cost, wrt="w")
    sk = _scheduled(grad, deterministic=deterministic)
    assert ("d_s_expanded kept as COxW elements per thread (d_s_expanded_slab): each "
            "iteration of b, h writes and reads only its own of them") in sk.schedule_decisions
    (slab,) = [t for t in sk.kernel.temps if t.name == "d_s_expanded_slab"]
    assert slab.per_thread and slab.chunk_loops == ("b", "h")
    assert sk.kernel.caller_temps == ()
    conv_gradient_matches_interpreter(
        grad, pa.compile(grad, deterministic=deterministic), 5,
        [(1, 1, 1, 1, 1), (1, 2, 3, 4, 16), (2, 1, 2, 3, 17), (2, 3, 5, 5, 37)])
