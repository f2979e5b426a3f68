"""The updates that reach an element first after its zeroing become assignments
(``schedule.cleanup.assign_first_updates``), the filter gradient's sums stay in the
nest of the residual (``schedule.distribute``), which then runs forwards
(``schedule.gather.ascending_order_free_nests``).

On the deconvolution gradient: ``d_t`` (a zero-filled temporary) and ``d_x`` get
their interior from one merged assignment each, zeroed only where the clamped
border pieces add first; the ``d_f`` sums read the residual where it is computed.
Every case is checked against the reference interpreter on the unscheduled
gradient, at sizes where the border pieces meet (1 to 6) and beyond.
"""

import islpy as isl
import numpy as np
import pytest

import polyad as pa
from polyad import ir
from polyad.pipeline import Options, artifact_of
from polyad.schedule.cleanup import assign_first_updates
from polyad.testing import interpret

from ad_helpers import check_against_fd
from deconv_kernels import deconvolution

M, N = pa.sizes("M N")


def _scheduled(kernel, **options):
    return artifact_of(kernel, Options(**options)).scheduled


def _check_gradient(grad, inputs: dict, sizes: dict, deterministic: bool = False):
    fn = pa.compile(grad, deterministic=deterministic)
    _, want = interpret(grad.ir, inputs, sizes)
    got = fn(*inputs.values())
    got = got if isinstance(got, tuple) else (got,)
    outs = [p.name for p in grad.ir.params if p.intent == "out"]
    for name, value in zip(outs, got):
        np.testing.assert_allclose(value, want[name], rtol=1e-12, atol=1e-12, err_msg=name)


def test_deconvolution_gradient_assigns_its_interiors():
    """(unfused: by default the chain of nests runs fused, ``test_fusion``)"""
    grad = pa.grad(deconvolution("f64"), wrt=("x", "f"))
    sk = _scheduled(grad, fuse=False)
    decisions = [d for d in sk.schedule_decisions if "first after the zeroing" in d]
    assert [d.split(":")[0] for d in decisions] == ["d_t"]
    # d_t is zeroed by a statement of its own now (rows the border pieces add to first),
    # left with the edge rows, in the iteration of the row it zeroes (the border pieces'
    # sums gather, one piece per value of m), and d_t is one row per thread
    assert not [t for t in sk.kernel.temps if t.name == "d_t"]
    (d_t,) = [t for t in sk.kernel.temps if t.name == "d_t_row"]
    assert d_t.per_thread and not d_t.zero and [ir.expr_str(e) for e in d_t.type.shape] == ["N"]
    (zero,) = [st for st in sk.kernel.statements if st.source == "zero d_t"]
    assert zero.conditions and not zero.conditions[-1].positive
    dom = sk.model.domain(zero)
    inner = isl.Set.read_from_str(dom.get_ctx(), f"[M, N] -> {{ {zero.name}[m, i1] : "
                                  "3 <= m < M - 3 }")
    assert dom.intersect(inner).is_empty()
    # every write of a row of d_x (its border columns gather too, one piece per value of
    # n) and of d_t runs in that row's iteration: the zeroings moved into the nest
    for name in ("d_x", "d_t_row"):
        writes = [st for st in sk.kernel.statements if st.target_name == name]
        assert len({st.position[0] for st in writes}) == 1
        assert all(st.loops[0].var == "m" for st in writes)
    (zero,) = [st for st in sk.kernel.statements if st.source == "zero d_x"]
    assert not zero.conditions
    src = artifact_of(grad, Options(fuse=False)).source
    assert "d_t_row[n] = d_r_expanded[(m + 2) * N + n] * f_0" in src
    assert "d_x[m * N + n] = d_t_row[n + 2] * f_0" in src
    # (the edge rows of d_t are zeroed and summed into in their iterations, in cache)
    assert "d_x[m * N + n] +=" not in src


@pytest.mark.parametrize("deterministic", [False, True])
def test_deconvolution_gradient_matches_the_interpreter(deterministic):
    grad = pa.grad(deconvolution("f64"), wrt=("x", "f"))
    rng = np.random.default_rng(31)
    for m, n in [(1, 1), (1, 4), (2, 3), (3, 2), (4, 4), (5, 6), (6, 5), (9, 17)]:
        inputs = dict(x=rng.standard_normal((m, n)), f=rng.standard_normal(5),
                      y=rng.standard_normal((m, n)))
        _check_gradient(grad, inputs, dict(M=m, N=n), deterministic)


def test_filter_sums_stay_with_the_residual():
    """The d_f statements of the vertical pass's adjoint read d_r where the residual
    nest computes it (they need no gather); the d_t updates moved to a nest of their own;
    the residual nest runs forwards (its only carried dependences are the sums')."""
    sk = _scheduled(pa.grad(deconvolution("f64"), wrt=("x", "f")), fuse=False)
    residual = [st for st in sk.kernel.statements
                if isinstance(st.target, ir.Load) and st.target.array == "d_r_expanded"]
    nests = {st.position[0] for st in residual}
    sums = [st for st in sk.kernel.statements if st.target_name == "d_f"
            and (st.reads_variable("d_r") or st.reads_variable("d_r_expanded"))]
    assert sums and {st.position[0] for st in sums} <= nests
    scatters = [st for st in sk.kernel.statements if st.target_name == "d_t_row"
                and st.source != "zero d_t"]
    assert scatters and not {st.position[0] for st in scatters} & nests
    assert all(lp.step > 0 for st in residual + sums for lp in st.loops)


@pa.kernel
def blur_twice(x: pa.f64[N].clamped, f: pa.f64[3], y: pa.f64[N]) -> pa.f64:
    t = pa.empty(pa.f64[N].clamped)
    for n in range(N):
        t[n] = f[0] * x[n - 1] + f[1] * x[n] + f[2] * x[n + 1]
    C = 0.0
    for n in range(N):
        C += (f[0] * t[n - 1] + f[1] * t[n] + f[2] * t[n + 1] - y[n]) ** 2
    return C


@pa.kernel
def scatter_then_read(x: pa.f64[N], y: pa.Out(pa.f64[N])):
    t = pa.zeros(pa.f64[N])
    for n in range(N):
        t[n] -= x[n] * x[n]
    for n in range(N):
        y[n] = t[n] + 1.0


@pa.kernel
def read_before_update(x: pa.f64[N], y: pa.Out(pa.f64[N])):
    t = pa.zeros(pa.f64[N])
    for n in range(N):
        y[n] = t[n]
        t[n] += x[n]
    for n in range(N):
        y[n] += t[n]


@pa.kernel
def row_sums(x: pa.f64[M, N], y: pa.Out(pa.f64[M])):
    t = pa.zeros(pa.f64[M])
    for m in range(M):
        for n in range(N):
            t[m] += x[m, n]
    for m in range(M):
        y[m] = t[m]


def test_rule_on_small_kernels():
    # a -= that reaches each element first: t = -(x * x), no zero-fill left
    k, decisions = assign_first_updates(scatter_then_read.ir)
    assert decisions and not k.temps[0].zero
    (upd,) = [st for st in k.statements if st.target_name == "t" and st.source != "zero t"]
    assert upd.op == "=" and isinstance(upd.expr, ir.Unary) and upd.expr.op == "neg"
    # the zero is read before the update: nothing changes
    assert assign_first_updates(read_before_update.ir) == (read_before_update.ir, [])
    # a sum over n into t[m] (each element written by N instances): left a sum
    assert assign_first_updates(row_sums.ir) == (row_sums.ir, [])
    rng = np.random.default_rng(5)
    for n in (1, 2, 7):
        x = rng.standard_normal(n)
        np.testing.assert_array_equal(scatter_then_read(x), 1.0 - x * x)
        np.testing.assert_array_equal(read_before_update(x), x)
    for m, n in ((1, 1), (3, 4)):
        x = rng.standard_normal((m, n))
        np.testing.assert_allclose(row_sums(x), x.sum(axis=1), rtol=1e-12)


def test_one_dimensional_blur_gradient_matches_the_interpreter():
    """Border pieces at the same position as the interior's: a piece that shares an
    iteration with another write of the element is not first."""
    grad = pa.grad(blur_twice, wrt=("x", "f"))
    decisions = [d for d in _scheduled(grad).schedule_decisions if "first after" in d]
    assert [d.split(":")[0] for d in decisions] == ["d_x", "d_t"]
    rng = np.random.default_rng(8)
    for n in range(1, 9):
        _check_gradient(grad, dict(x=rng.standard_normal(n), f=rng.standard_normal(3),
                                   y=rng.standard_normal(n)), dict(N=n))


def test_one_dimensional_blur_gradient_matches_finite_differences():
    """The same gradient against central differences of the primal (an independent
    reference: the interpreter above runs the derived IR itself)."""
    rng = np.random.default_rng(9)
    for n in (1, 2, 3, 4, 6):
        check_against_fd(blur_twice, ("x", "f"), dict(x=rng.standard_normal(n),
                                                     f=rng.standard_normal(3),
                                                     y=rng.standard_normal(n)))


def test_past_its_quota_the_updates_stay_updates(monkeypatch, tmp_path):
    """Fuzz seed 18067: finding the first updates of a vjp's adjoints (a strided loop
    with circular and clamped pieces) took ISL 42 s. The analysis only saves a pass of
    zeroing, so it runs under ``cleanup.FIRST_UPDATES_QUOTA`` operations and, past it,
    leaves the updates as they are; the decision says so. The benchmarks' heaviest (the
    deconvolution gradient) needs between 200 000 and 700 000 of the quota's 2 million."""
    from polyad.schedule import cleanup
    monkeypatch.setattr(cleanup, "FIRST_UPDATES_QUOTA", 1)
    monkeypatch.setenv("POLYAD_CACHE_DIR", str(tmp_path))  # (a schedule made under the quota)
    kernel, decisions = assign_first_updates(scatter_then_read.ir)
    assert kernel is scatter_then_read.ir
    assert decisions == ["t: its updates stay updates after its zeroing: finding the "
                         "instances that reach their elements first ran past ISL's quota "
                         "of 1 operations"]
    # (a gradient no other test takes: a kernel object keeps the schedules made for it)
    grad = pa.grad(blur_twice, wrt="x")
    decisions = _scheduled(grad).schedule_decisions
    assert not [d for d in decisions if "first after" in d]
    assert sorted(d.split(":")[0] for d in decisions if "ran past ISL's quota" in d) \
        == ["d_t"]
    assert "ran past ISL's quota of 1 operations" in pa.explain(grad)
    rng = np.random.default_rng(10)
    for n in (1, 2, 5):
        _check_gradient(grad, dict(x=rng.standard_normal(n), f=rng.standard_normal(3),
                                   y=rng.standard_normal(n)), dict(N=n))
