"""Loops of step other than 1 reach ISL as loops of step 1 over their iteration numbers
(``polyad.schedule.strides``): no existential variable in the scheduled domains, the
values of the program as written, its gradient, and bounds messages in the DSL's names."""

import re

import numpy as np
import pytest

import polyad as pa
from polyad import ir, poly
from polyad.pipeline import artifact_of
from polyad.schedule.strides import unit_stride_loops
from polyad.testing import interpret

M, N = pa.sizes("M N")


@pa.kernel
def strided(x: pa.f64[M, N].clamped, w: pa.f64[N], y: pa.Out(pa.f64[M, N])) -> pa.f64:
    acc = 0.0
    for i in range(1, M, 2):
        for j in range(i - 1, N - 1, 3):
            y[i, j] = x[i - 1, j] * w[j] + x[i, j + 2] * float(i)
    for i in range(M - 1, -1, -2):
        for j in range(N):
            y[i, j] = y[i, j] * pa.sin(x[i + 1, j]) + x[i - 1, j]
    for i in range(0, 7, 3):
        acc += x[i, 0] * w[0]
    return acc


# (the last loop reads x[i, 0] for i < 7 whatever M: sizes from 1)
SIZES = [(1, 1), (2, 3), (3, 4), (4, 2), (5, 7), (8, 9)]


def _scheduled_domains(kernel):
    sk = artifact_of(kernel).scheduled
    return sk, [sk.model.domain(st).to_union_set() for st in sk.kernel.statements]


def test_strided_loops_reach_isl_without_existential_variables():
    sk, domains = _scheduled_domains(strided)
    assert all(lp.step in (1, -1) for st in sk.kernel.statements for lp in st.loops)
    assert not any(poly._has_existentials(d) for d in domains), domains
    decisions = [line.split("decision: ")[1] for line in pa.explain(strided).splitlines()
                 if "runs over its iteration numbers" in line]
    assert [re.sub(r"line \d+", "line L", d) for d in decisions] == [
        "loop i (step 2, line L) runs over its iteration numbers i_iter: i = 2 * i_iter + 1",
        "loop j (step 3, line L) runs over its iteration numbers j_iter: j = 2 * i_iter + 3 * j_iter",
        "loop i (step -2, line L) runs over its iteration numbers i_iter: i = M - 2 * i_iter - 1",
        "loop i (step 3, line L) runs over its iteration numbers i_iter: i = 3 * i_iter"]
    # constant bounds: the trip count itself (the bound would be 7 - 0 with a condition)
    last = [st for st in sk.kernel.statements if st.target_name == "acc" and st.loops]
    assert last and all(st.loops[0].hi == ir.Const(3, ir.i64) for st in last)


def test_strided_loops_compute_the_program_as_written():
    rng = np.random.default_rng(2)
    for m, n in SIZES:
        x, w = rng.standard_normal((m, n)), rng.standard_normal(n)
        acc, y = strided(x, w)
        want, arrays = interpret(strided.ir, dict(x=x, w=w), dict(M=m, N=n))
        np.testing.assert_allclose(acc, want, rtol=1e-13, atol=1e-13)
        np.testing.assert_allclose(y, arrays["y"], rtol=1e-13, atol=1e-13)


def test_reversed_strided_loops_of_the_gradient_have_no_floor():
    """The vjp runs each strided loop backwards from its last value, ``lo + s * ((hi -
    lo - 1) // s)`` (``ad.reverse.reverse_loop``): recognised as the reversal, its loop
    runs over the same iteration numbers downwards, without the floor."""
    vk = pa.vjp(strided, ["x", "w"])

    def with_existentials(kernel):
        model = poly.PolyModel(kernel)
        return {st.name for st in kernel.statements
                if poly._has_existentials(model.domain(st).to_union_set())}

    backwards = {st.name for st in vk.ir.statements
                 if any(lp.step < -1 for lp in st.loops)}
    assert backwards and with_existentials(vk.ir) >= backwards
    out, decisions = unit_stride_loops(vk.ir)
    assert not with_existentials(out)
    assert all(lp.step in (1, -1) for st in out.statements for lp in st.loops)
    assert any(lp.step == -1 and lp.var.endswith("_iter")
               for st in out.statements if st.name in backwards for lp in st.loops)


def test_gradient_of_strided_loops_matches_finite_differences():
    vk = pa.vjp(strided, ["x", "w"])
    rng = np.random.default_rng(3)
    for m, n in [(1, 1), (2, 3), (4, 4), (5, 7)]:
        x, w = rng.standard_normal((m, n)), rng.standard_normal(n)
        y_bar, result_bar = rng.standard_normal((m, n)), 1.3

        def cost(x, w):
            acc, y = strided(x, w)
            return float(np.sum(y * y_bar) + result_bar * acc)

        d_x, d_w = vk(x=x, w=w, y_bar=y_bar, result_bar=result_bar)
        for value, got, other in ((x, d_x, lambda v: cost(v, w)), (w, d_w, lambda v: cost(x, v))):
            fd = np.zeros_like(value)
            for idx in np.ndindex(value.shape):
                up, down = value.copy(), value.copy()
                up[idx] += 1e-6
                down[idx] -= 1e-6
                fd[idx] = (other(up) - other(down)) / 2e-6
            np.testing.assert_allclose(got, fd, rtol=1e-6, atol=1e-7)


@pa.kernel
def every_other_row(x: pa.f64[M, N], y: pa.Out(pa.f64[M, N])):
    for i in range(0, M, 2):
        for j in range(N):
            y[i, j] = x[i + 1, j]


def test_bounds_messages_name_the_dsl_loop_variables():
    """The bounds are proved on the program as written, before the rewrite."""
    with pytest.raises(pa.BoundsError) as err:
        every_other_row.compile()
    msg = str(err.value)
    assert "x[i + 1, j] reads x[" in msg and "at i = " in msg and "_iter" not in msg, msg


@pa.kernel
def name_taken(x: pa.f64[M], y: pa.Out(pa.f64[M])):
    for i_iter in range(M):
        y[i_iter] = x[i_iter]
    for i in range(0, M, 2):
        y[i] += 1.0


def test_the_iteration_number_takes_a_free_name():
    out, decisions = unit_stride_loops(name_taken.ir)
    assert [lp.var for st in out.statements for lp in st.loops] == ["i_iter", "i_iter2"]
    assert len(decisions) == 1 and decisions[0].endswith(
        "runs over its iteration numbers i_iter2: i = 2 * i_iter2")
    x = np.arange(5.0)
    np.testing.assert_array_equal(name_taken(x), x + np.array([1, 0, 1, 0, 1]))
    assert unit_stride_loops(out) == (out, [])  # nothing left to rewrite: the same kernel


ASAN_SCRIPT = """
import numpy as np
import polyad as pa
from polyad.testing import interpret
from test_unit_strides import strided

vk = pa.vjp(strided, ["x", "w"])
c, primal = pa.compile(vk, sanitize="address"), pa.compile(strided, sanitize="address")
rng = np.random.default_rng(4)
for m in range(1, 5):
    for n in range(1, 5):
        args = dict(x=rng.standard_normal((m, n)), w=rng.standard_normal(n),
                    y_bar=rng.standard_normal((m, n)), result_bar=0.7)
        _, want = interpret(vk.ir, dict(args), dict(M=m, N=n))
        for name, got in zip(("d_x", "d_w"), c(**args)):
            np.testing.assert_allclose(got, want[name], rtol=1e-12, atol=1e-12)
        acc, y = primal(args["x"], args["w"])
        ref, arrays = interpret(strided.ir, dict(x=args["x"], w=args["w"]), dict(M=m, N=n))
        np.testing.assert_allclose(y, arrays["y"], rtol=1e-13, atol=1e-13)
print("STRIDES-ASAN-OK")
"""


def test_strided_kernel_and_gradient_clean_under_asan(tmp_path, repo_root):
    """Sizes 1-4 of both, built with AddressSanitizer: no access outside an array."""
    import os
    from test_asan import run_script_under_asan
    tests = os.path.join(repo_root, "tests")
    run_script_under_asan(tmp_path, repo_root,
                          f"import sys\nsys.path.insert(0, {tests!r})\n" + ASAN_SCRIPT,
                          "STRIDES-ASAN-OK")
