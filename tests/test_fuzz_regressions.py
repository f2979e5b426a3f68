"""Failures the differential fuzzer (tests/fuzz) found, as minimal tests."""

import inspect

import islpy as isl
import numpy as np
import pytest

import polyad as pa
from polyad import ir, poly
from polyad.recent import Recent

from ad_helpers import check_vjp_against_fd
from npref import shifted

N, = pa.sizes("N")


@pa.kernel
def strided_if_else(x0: pa.f64[2 * N + 1, N].clamped, z0: pa.f64[2 * N + 2],
                    y0: pa.Out(pa.f64[N, N])) -> pa.f64:
    acc = 0.0
    for i in range(0, N, 3):
        for j in range(N):
            for k in range(N):
                z0[2 * k + 2] = 0.25 - x0[j, k + 1] * z0[1]
                if k < j:
                    y0[j, i] *= max(x0[k - 1, 2 * j - 1], x0[1, k - 2])
                else:
                    y0[j, k] += float(k) * 0.25
    for i in range(0, N, 3):
        acc += float(i) * 0.25
    return acc


def _strided_if_else_reference(x0, z0):
    n = z0.shape[0] // 2 - 1
    z0 = z0.copy()
    y0 = np.zeros((n, n))

    def x(a, b):
        return x0[min(max(a, 0), 2 * n), min(max(b, 0), n - 1)]

    for i in range(0, n, 3):
        for j in range(n):
            for k in range(n):
                z0[2 * k + 2] = 0.25 - x(j, k + 1) * z0[1]
                if k < j:
                    y0[j, i] *= max(x(k - 1, 2 * j - 1), x(1, k - 2))
                else:
                    y0[j, k] += k * 0.25
    return sum(i * 0.25 for i in range(0, n, 3)), y0, z0


def test_strided_outer_loop_around_if_else_updates():
    """Fuzz seed 144: the boundary pieces k = 0, 1 of the ``*=`` statement (clamped reads)
    lost their dependences on each other and on the ``+=`` updates of the same element."""
    rng = np.random.default_rng(144)
    n = 7
    x0 = rng.uniform(-1, 1, (2 * n + 1, n))
    z0 = rng.uniform(-1, 1, 2 * n + 2)
    want_acc, want_y, want_z = _strided_if_else_reference(x0, z0)
    z = z0.copy()
    acc, y = strided_if_else(x0, z)
    assert acc == pytest.approx(want_acc)
    np.testing.assert_allclose(z, want_z, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(y, want_y, rtol=1e-12, atol=1e-12)


def _instances(umap: isl.UnionMap, n: int) -> list:
    """``(statement, iteration, value)`` of every pair of ``umap`` with ``N = n``."""
    out = []

    def add(m: isl.Map):
        n_in = m.dim(isl.dim_type.in_)
        points = []
        m.wrap().foreach_point(points.append)
        for p in points:
            v = [p.get_coordinate_val(isl.dim_type.set, k).to_python()
                 for k in range(n_in + m.dim(isl.dim_type.out))]
            out.append((m.get_tuple_name(isl.dim_type.in_), tuple(v[:n_in]),
                        (m.get_tuple_name(isl.dim_type.out), tuple(v[n_in:]))))

    fixed = isl.Set.read_from_str(umap.get_ctx(), f"[N] -> {{ : N = {n} }}")
    umap.intersect_params(fixed).foreach_map(add)
    return out


def _last_writers(writes: isl.UnionMap, reads: isl.UnionMap, sched: isl.UnionMap, n: int):
    """The exact flow by enumeration: each read instance's last earlier write of its element."""
    time = {(name, it): t for name, it, (_, t) in _instances(sched, n)}
    out = set()
    for rname, rit, element in _instances(reads, n):
        earlier = [(time[(w, wit)], (w, wit)) for w, wit, e in _instances(writes, n)
                   if e == element and time[(w, wit)] < time[(rname, rit)]]
        if earlier:
            out.add((max(earlier)[1], (rname, rit)))
    return out


def test_flow_keeps_sources_fixed_to_a_constant_beside_a_strided_loop():
    """The root cause of seed 144, on the ISL maps alone: pieces A (k = 0), B (k = 1) and
    C (k >= 2) update y[j, i] in turn under a stride-3 loop over i. isl's schedule-map
    path of compute_flow answers A -> C and drops B; the dependences must be exact."""
    ctx = isl.Context()
    domains = {"A": "k = 0 and 0 < j < N and 2j <= N",
               "B": "k = 1 and 2 <= j < N and 2j <= N",
               "C": "2 <= k < j and 2j <= N",
               "D": "2 <= k < j < N and 2j > N",
               "E": "k = 1 and 2 <= j < N and 2j > N"}
    stride = "(i) mod 3 = 0 and 0 <= i < N and "

    def umap(rng):
        return isl.UnionMap.read_from_str(ctx, "[N] -> { " + "; ".join(
            f"{s}[i, j, k] -> {rng} : {stride}{d}" for s, d in domains.items()) + " }")

    writes, sched = umap("y[j, i]"), umap("[i, j, k]")
    tree = isl.Schedule.from_domain(sched.domain()).insert_partial_schedule(
        isl.MultiUnionPwAff.from_union_map(sched))
    flow, *_ = poly._variable_dependences(writes, writes, writes, tree, flow_only=True)
    pairs = set()
    flow.foreach_map(lambda m: pairs.add((m.get_tuple_name(isl.dim_type.in_),
                                          m.get_tuple_name(isl.dim_type.out))))
    assert pairs == {("A", "B"), ("B", "C"), ("C", "C"), ("E", "D"), ("D", "D")}
    for n in (4, 7, 9):
        assert set(_instances(flow, n)) == {(s, it, t) for (s, it), t in
                                            _last_writers(writes, writes, sched, n)}


def test_dependences_of_seed_144_are_the_exact_flow():
    """``poly.dependences`` on the piece-split kernel of seed 144 equals the last-writer
    relation found by enumeration, for a few sizes."""
    model = poly.PolyModel(strided_if_else.ir)
    split = model.for_kernel(poly.split_boundary_pieces(strided_if_else.ir, model))
    reads, must, _ = split.accesses()
    deps = poly.dependences(split)
    pick = lambda m: m.intersect_range(isl.UnionSet.read_from_str(  # noqa: E731
        split.ctx, "[N] -> { y0[a, b] }"))
    for n in (5, 7, 8):
        want = _last_writers(pick(must), pick(reads), split.schedule_map(), n)
        assert set(_instances(deps.flow["y0"], n)) == {(s, it, t) for (s, it), t in want}


def test_dependence_fallback_contains_the_exact_flow():
    """Where ISL's compute_flow fails (fuzz seed 7's vjp: "affine expression involves
    some of the domain dimensions"), dependences fall back to every earlier access of
    the same element: a superset of the exact flow, so schedules stay legal."""
    ctx = isl.Context()
    sched = isl.UnionMap.read_from_str(ctx, "[N] -> { S[i] -> [0, i]; T[i] -> [1, i] }")
    writes = isl.UnionMap.read_from_str(ctx, "[N] -> { S[i] -> a[i] : 0 <= i < N; "
                                             "T[i] -> a[i + 1] : 0 <= i < N - 1 }")
    reads = isl.UnionMap.read_from_str(ctx, "[N] -> { T[i] -> a[i] : 0 <= i < N }")
    exact = isl.UnionAccessInfo.from_sink(reads).set_must_source(writes) \
        .set_schedule_map(sched).compute_flow().get_may_dependence()
    approx = poly._ordered_pairs(writes, reads, sched)
    assert exact.is_subset(approx)
    assert not approx.is_equal(exact)     # it keeps killed sources: over-approximate
    assert approx.is_subset(sched.lex_lt_union_map(sched))


@pa.kernel
def recurrence_in_place(x: pa.f64[N].clamped, z: pa.f64[N]):
    for i in range(1, N):
        z[i] = z[i - 1] * 0.5 + x[i - 2]
    for i in range(N):
        z[i] = z[i] * x[i]


def _runs_the_recurrence_right(k, rng):
    """``k`` (a build of ``recurrence_in_place``) against the recurrence in numpy."""
    for n in (1, 2, 5, 9):
        x = rng.uniform(-1, 1, n)
        z0 = rng.uniform(-1, 1, n)
        want = z0.copy()
        for i in range(1, n):
            want[i] = want[i - 1] * 0.5 + x[max(i - 2, 0)]
        want *= x
        z = z0.copy()
        k(x, z)
        np.testing.assert_allclose(z, want, rtol=1e-12, atol=1e-12)


def test_compile_survives_without_exact_dependences(monkeypatch, tmp_path):
    """A kernel compiles and runs right with the fallback dependences everywhere."""
    def fail(self, *args, **kwargs):
        raise isl.Error("simulated compute_flow failure")
    monkeypatch.setattr(isl.UnionAccessInfo, "compute_flow", fail)
    monkeypatch.setenv("POLYAD_CACHE_DIR", str(tmp_path))   # no build from an exact run
    k = pa.Kernel(ir_kernel=recurrence_in_place.ir)
    assert "memory-based" in pa.explain(k)
    _runs_the_recurrence_right(k, np.random.default_rng(4))


def test_loop_bounds_divide_with_floor_semantics(tmp_path):
    """Fuzz seed 210 (heap corruption in a vjp): ISL writes ``pdiv_r`` (C ``%``) in a loop
    bound whose dividend is negative only when the loop must not run; C's truncating
    ``%`` then started ``for (c0 = ((M - 1) % 3) - M + 1; c0 <= 0; c0 += 3)`` at 0 for
    M = 0 and wrote d_x0[-1]. Loop bounds are printed with floor division and modulo."""
    import cffi
    import subprocess

    from polyad.emit.cexpr import AST_HELPERS, ast_expr_c
    ctx = isl.Context()
    m = isl.AstExpr.from_id(isl.Id("M", context=ctx))
    one, three = (isl.AstExpr.from_val(isl.Val.int_from_si(ctx, v)) for v in (1, 3))
    lower = m.sub(one).pdiv_r(three).sub(m).add(one)       # ((M - 1) % 3) - M + 1
    quotient = m.sub(one).pdiv_q(three)                    # (M - 1) / 3
    src = tmp_path / "bounds.c"
    src.write_text("#include <stdint.h>\n" + AST_HELPERS + "\n"
                   f"int64_t lower(int64_t M) {{ return {ast_expr_c(lower, {}, True)}; }}\n"
                   f"int64_t quotient(int64_t M) {{ return {ast_expr_c(quotient, {}, True)}; }}\n")
    lib = tmp_path / "bounds.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    ffi = cffi.FFI()
    ffi.cdef("int64_t lower(int64_t M); int64_t quotient(int64_t M);")
    c = ffi.dlopen(str(lib))
    for n in range(-4, 8):
        assert c.lower(n) == (n - 1) % 3 - n + 1      # Python's % and // are floor ones
        assert c.quotient(n) == (n - 1) // 3
    assert c.lower(0) > 0    # the loop over c0 <= 0 runs zero times at M = 0
    # inside a loop (not a bound) ISL's promise holds and plain C division stays
    assert ast_expr_c(quotient, {}) == "((M - 1) / 3)"


M, = pa.sizes("M")


@pa.kernel
def dropped_zero_write(x0: pa.f64[2 * M + 3, N + 1].mirror,
                       y0: pa.Out(pa.f64[M, M + 3, N].zero)):
    for i in range(1, N, 2):
        y0[M - i, i - 1, i - 3] = x0[i + 1, 2 * i + 3] * x0[i, i]


def test_a_dropped_zero_write_has_no_adjoint():
    """Fuzz seed 1050: a write outside a .zero array is dropped, so at M = 1, N = 2 the
    primal never reads x0[2, 5] (which needs two mirror reflections) and accepts the
    sizes; its vjp ran the adjoint at that dropped instance too (adding 0 * ... into
    d_x0 at the reflected index) and refused them. The adjoint statements now run only
    where the primal write lands inside its array."""
    v = pa.vjp(dropped_zero_write, wrt=["x0"])
    for st in v.ir.statements:
        if st.source and "adjoint of: y0[M - i" in st.source:
            conds = " and ".join(pa.ir.expr_str(c.expr) for c in st.conditions)
            assert "i - 3 >= 0 and i - 3 < N" in conds, conds
    rng = np.random.default_rng(1)
    for m, n in [(1, 2), (5, 2), (5, 7)]:
        x0 = rng.standard_normal((2 * m + 3, n + 1))
        y0_bar = rng.standard_normal((m, m + 3, n))
        out = v(x0, y0_bar=y0_bar)
        d_x0 = out[0] if isinstance(out, tuple) else out
        eps, fd = 1e-6, np.zeros_like(x0)
        for idx in np.ndindex(x0.shape):
            xp, xm = x0.copy(), x0.copy()
            xp[idx] += eps
            xm[idx] -= eps
            fd[idx] = ((dropped_zero_write(xp, M=m) - dropped_zero_write(xm, M=m)) * y0_bar
                       ).sum() / (2 * eps)
        np.testing.assert_allclose(d_x0, fd, rtol=1e-6, atol=1e-8)


@pa.kernel
def dropped_write_of_a_max(x: pa.f64[N + 1, N].mirror, y: pa.Out(pa.f64[N + 1, N].zero)):
    for i in range(N):
        for j in range(N):
            y[2 * j, i] = max(x[i, j], x[2 * j + 3, i])
    for i in range(N + 1):
        for j in range(N):
            x[i, j] *= 0.5


def test_a_dropped_zero_write_has_no_tape_stores():
    """Fuzz seed 16189: the taped branch of a ``max`` whose operands are overwritten later
    was stored at every instance of the loops, also where the write to the .zero array
    ``y`` is dropped. There its operand ``x[2 * j + 3, i]`` needs two mirror reflections,
    so the vjp refused sizes the primal runs at (N = 6). Tape stores now run where the
    primal statement runs."""
    v = pa.vjp(dropped_write_of_a_max, wrt=["x"])
    tape_stores = [st for st in v.ir.statements if st.source.startswith("tape: which branch")]
    assert tape_stores
    for st in tape_stores:
        conds = " and ".join(pa.ir.expr_str(c.expr) for c in st.conditions)
        assert "2 * j < N + 1" in conds, conds
    rng = np.random.default_rng(2)
    for n in (3, 5, 6):
        x = rng.standard_normal((n + 1, n))
        x_bar, y_bar = rng.standard_normal((n + 1, n)), rng.standard_normal((n + 1, n))
        check_vjp_against_fd(dropped_write_of_a_max, ["x"], {"x": x}, {"x": x_bar, "y": y_bar},
                             rtol=1e-6, atol=1e-8)


@pa.kernel
def mirror_read_two_below(x: pa.f64[N + 1].clamped, z: pa.f64[N + 1].mirror,
                          y: pa.Out(pa.f64[2 * N, N + 1])):
    for i in range(0, N, 2):
        for j in range(N):
            y[2 * i, j] = x[i - 2] - min(z[j - 2], x[j + 2])


def test_a_border_piece_reflects_a_mirror_read_once():
    """Fuzz seed 16295: a mirror read resolved on a border piece in closed form
    (``min(|e|, 2 * (extent - 1) - |e|)``) reflected an index below the array a second
    time, about the far edge, so the primal ran at N = 1 (z[-2] of two elements) while its
    vjp, whose pieces reflect once, refused that size. Both now need the size to exceed
    the offset, as the DSL documents, and name the access as written (``z[j - 2]``, not
    the border piece's closed form); at larger sizes the values are numpy's reflection."""
    pieces = poly.split_boundary_pieces(mirror_read_two_below.ir).statements
    assert [st.on_border for st in pieces] == [False, True]  # the closed form's piece
    line = mirror_read_two_below.ir.statements[0].line
    v = pa.vjp(mirror_read_two_below, wrt=["x", "z"])
    rng = np.random.default_rng(3)
    with pytest.raises(pa.ShapeError, match=rf"access z\[j - 2\] at line {line} needs the "
                                            "size of dimension 0 of 'z'"):
        mirror_read_two_below(rng.standard_normal(2), rng.standard_normal(2))
    with pytest.raises(pa.ShapeError, match=r"sizes too small .*access z\[j - 2\]"):
        v(rng.standard_normal(2), rng.standard_normal(2), y_bar=rng.standard_normal((2, 2)))
    for n in (2, 3, 4):
        x, z = rng.standard_normal(n + 1), rng.standard_normal(n + 1)
        ref = np.zeros((2 * n, n + 1))
        # rows 2 * i of y for i = 0, 2, ...; columns j < N
        taps = np.minimum(shifted(z, [-2], "mirror"), shifted(x, [2], "clamped"))[:n]
        ref[0:2 * n:4, :n] = shifted(x, [-2], "clamped")[0:n:2, None] - taps
        np.testing.assert_allclose(mirror_read_two_below(x, z), ref, rtol=1e-14, err_msg=f"N = {n}")
        check_vjp_against_fd(mirror_read_two_below, ["x", "z"], {"x": x, "z": z},
                             {"y": rng.standard_normal((2 * n, n + 1))}, rtol=1e-6, atol=1e-8)


@pa.kernel
def taped_odd_taps(x0: pa.f64[N + 2], y0: pa.Out(pa.f64[N])):
    for i in range(N):
        for k in range(1, N, 2):
            y0[i] *= pa.sin(x0[k]) + y0[i] * x0[k + 1]


TAPE_ASAN_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
import numpy as np
import polyad as pa
import test_fuzz_regressions as t

v = pa.compile(pa.vjp(t.taped_odd_taps, wrt=["x0"]), sanitize="address")
rng = np.random.default_rng(0)
for n in (0, 1, 2, 0, 3, 4):
    out = v(rng.standard_normal(n + 2), y0_bar=rng.standard_normal(n))
    d_x0 = out[0] if isinstance(out, tuple) else out
    assert d_x0.shape == (n + 2,) and np.all(np.isfinite(d_x0))
print("ASAN-TAPE-OK")
"""


def test_a_tape_of_n_minus_1_rows_is_not_touched_at_n_0(tmp_path, repo_root):
    """Fuzz seed 1077 (heap corruption): the vjp's tapes for ``for k in range(1, N, 2)``
    have N - 1 rows, and the model took their extents as facts (N >= 1 in the context), so
    ISL's code for the vjp left out the guards that keep N = 0 off them and wrote outside
    the (empty) buffers. The context now holds the parameters' shapes only."""
    v = pa.vjp(taped_odd_taps, wrt=["x0"])
    assert any("N - 1" in [pa.ir.expr_str(e) for e in tp.type.shape] for tp in v.ir.temps)
    model = poly.PolyModel(v.ir)
    n_is_0 = isl.Set.read_from_str(model.ctx, "[N] -> { : N = 0 }")
    assert not model.context.intersect(n_is_0).is_empty(), model.context
    import test_asan
    tests = str(__import__("pathlib").Path(__file__).resolve().parent)
    test_asan.run_script_under_asan(tmp_path, repo_root, TAPE_ASAN_SCRIPT.format(tests=tests),
                                    "ASAN-TAPE-OK")


@pa.kernel
def branch_writes_its_condition(z: pa.f64[N], x: pa.f64[N], y: pa.Out(pa.f64[N])) -> pa.f64:
    acc = 0.0
    for j in range(N):
        if z[j] >= -0.2:
            z[j] -= x[j] * x[j]
            acc += z[j]
        else:
            y[j] = z[j] + 0.5
    return acc


def _branch_writes_its_condition_reference(z, x):
    z, y, acc = z.copy(), np.zeros_like(z), 0.0
    for j in range(len(z)):
        if z[j] >= -0.2:
            z[j] -= x[j] * x[j]
            acc += z[j]
        else:
            y[j] = z[j] + 0.5
    return acc, z, y


C_BRANCH = """
void branch_writes_its_condition(int n, double z[n], const double x[n], double y[n]) {
  for (int j = 0; j < n; j++) {
    if (z[j] >= -0.2) {
      z[j] -= x[j] * x[j];
    } else {
      y[j] = z[j] + 0.5;
    }
  }
}
"""


def test_a_branch_that_writes_its_condition_runs_alone():
    """fuzz seed 3107: every statement of a run-time ``if`` tested the condition again, so
    after the first branch wrote what the condition reads (``z[j] -= x[j]**2`` under
    ``z[j] >= -0.2``) the statements after it saw the new value: the second statement of
    the branch was skipped and the else branch ran too. The condition's value at the
    ``if`` is now kept in a local that the branches test."""
    from ad_helpers import check_against_fd

    src = branch_writes_its_condition.source
    lines, first = inspect.getsourcelines(branch_writes_its_condition)
    line = first + [s.strip() for s in lines].index("if z[j] >= -0.2:")  # the if's DSL line
    assert f"cond{line} = z[j] >= -0.2 ? 1 : 0;  // line {line}: if z[j] >= -0.2" in src
    assert src.count(f"if (cond{line} != 0)") == 2 and f"if (!(cond{line} != 0))" in src
    rng = np.random.default_rng(5)
    for n in (1, 4, 33):
        x = rng.uniform(0.3, 1.0, n)  # every update pushes z[j] below -0.2 when it starts near 0
        z = rng.uniform(-0.3, 0.5, n)
        want_acc, want_z, want_y = _branch_writes_its_condition_reference(z, x)
        got_z = z.copy()
        got_acc, got_y = branch_writes_its_condition(got_z, x)
        np.testing.assert_allclose(got_acc, want_acc, rtol=1e-13)
        np.testing.assert_allclose(got_z, want_z, rtol=1e-14)  # z - x * x: one fma
        np.testing.assert_array_equal(got_y, want_y)
        # the gradient too (inputs away from the condition's threshold)
        check_against_fd(branch_writes_its_condition, "x",
                         dict(z=np.where(np.abs(z + 0.2) < 0.05, 0.4, z), x=x))


def test_a_c_branch_that_writes_its_condition_runs_alone(tmp_path):
    path = tmp_path / "branch.c"
    path.write_text(C_BRANCH)
    k = pa.from_c(str(path), "branch_writes_its_condition")
    rng = np.random.default_rng(6)
    n = 17
    x, z = rng.uniform(0.3, 1.0, n), rng.uniform(-0.3, 0.5, n)
    _, want_z, want_y = _branch_writes_its_condition_reference(z, x)
    got_z, got_y = z.copy(), np.zeros(n)
    k(got_z, x, got_y)
    np.testing.assert_allclose(got_z, want_z, rtol=1e-14)  # z - x * x: one fma
    np.testing.assert_array_equal(got_y, want_y)


@pa.kernel
def scatter_reads_what_later_iterations_write(x: pa.f64[N], t: pa.f64[N], y: pa.Out(pa.f64[N])):
    for i in range(N):
        s = x[i] * 2.0
        t[i] = x[i] + 1.0
        y[i] += s * t[2]


def test_scatters_stay_before_the_writes_of_what_they_read():
    """fuzz seed 3265: scalar expansion moved the updates that read a scalar of the nest
    (``y[i] += s * t[2]``) into a nest after it, behind the iterations that write what
    they also read (``t[2]``, written at i = 2): iterations 0 and 1 read the new value.
    The move now needs no such anti dependence."""
    from polyad.pipeline import compile_kernel

    sk = compile_kernel(scatter_reads_what_later_iterations_write.ir).scheduled
    assert sk.expansions["s"].startswith("kept scalar: the scatters read 't'")
    rng = np.random.default_rng(12)
    for n in (3, 4, 7):  # (t[2] must exist)
        x, t = rng.standard_normal(n), rng.standard_normal(n)
        want_t, want_y = t.copy(), np.zeros(n)
        for i in range(n):
            want_t[i] = x[i] + 1.0
            want_y[i] += 2.0 * x[i] * want_t[2]
        got_t = t.copy()
        got_y = scatter_reads_what_later_iterations_write(x, got_t)
        np.testing.assert_allclose(got_y, want_y, rtol=1e-14)
        np.testing.assert_array_equal(got_t, want_t)


@pa.kernel
def last_write_of_an_inner_loop(x: pa.f64[N, N], t: pa.f64[N], y: pa.Out(pa.f64[N]),
                                z: pa.Out(pa.f64[N])):
    for i in range(N):
        z[i] = pa.sin(t[i])
        for j in range(N):
            y[i] = x[j, i]


def test_a_loop_is_not_split_where_its_inner_loop_orders_the_two_parts():
    """fuzz seed 15941: in the vjp, each iteration of the inner loop over j scatters
    ``d_x[j, i] += d_y[i]`` and then zeroes ``d_y[i]`` (only the last j's write of y[i]
    counts). Splitting the loop over i after its scatters was judged by the loops the
    whole body shares (i alone, as ``d_t[i]``'s update is outside the j loop), and ran
    every zeroing after every scatter of the iteration: each j got the cotangent. The
    loops each pair of statements shares now count."""
    vk = pa.vjp(last_write_of_an_inner_loop, ["x", "t"])
    assert "split after its scatters" not in pa.explain(vk)
    rng = np.random.default_rng(3)
    for n in (1, 2, 5):
        x, t = rng.standard_normal((n, n)), rng.standard_normal(n)
        y_bar, z_bar = rng.standard_normal(n), rng.standard_normal(n)
        d_x, d_t = vk(x, t, y_bar, z_bar)
        want = np.zeros((n, n))
        want[n - 1, :] = y_bar
        np.testing.assert_array_equal(d_x, want)
        np.testing.assert_allclose(d_t, np.cos(t) * z_bar, rtol=1e-14)


@pa.kernel
def cancelling_reads(x: pa.f64[N], y: pa.f64[N]) -> pa.f64:
    acc = 0.0
    for i in range(N):
        acc += x[i] * x[i] - (y[i] - y[i])
    return acc


def test_partials_that_cancel_contribute_nothing():
    """fuzz seed 3354: the partials of ``y[i]`` in ``y[i] - y[i]`` sum to zero, and the
    adjoint built an update of ``d_y[i]`` with no value (an internal error)."""
    g = pa.grad(cancelling_reads, wrt=["x", "y"])
    x, y = np.random.default_rng(13).standard_normal((2, 6))
    dx, dy = g(x, y)
    np.testing.assert_allclose(dx, 2 * x, rtol=1e-14)
    np.testing.assert_array_equal(dy, np.zeros(6))


@pa.kernel
def lower_all(z: pa.f64[N]) -> pa.f64:
    s = 0.0
    for k in range(N):
        z[k] -= 1.0
        s += z[k]
    return s


@pa.kernel
def branch_calls_a_kernel_that_writes_its_condition(z: pa.f64[N], y: pa.Out(pa.f64[N])) \
        -> pa.f64:
    acc = 0.0
    for i in range(N):
        if z[i] > 0.5:
            acc = lower_all(z)
            y[i] = 1.0
    return acc


def test_a_kernel_called_in_a_branch_counts_as_writing_its_arrays():
    """``acc = lower_all(z)`` writes ``z``, which the condition reads: the condition is kept
    too (the called kernel's statements and ``y[i] = 1.0`` test the value at the ``if``)."""
    k = branch_calls_a_kernel_that_writes_its_condition
    assert "cond" in k.source.split("z[i] > 0.5 ? 1 : 0;")[0].rsplit("\n", 1)[1]
    z = np.array([0.8, 1.2, 3.0, 0.1, 2.5])
    want_z, want_y, want_acc = z.copy(), np.zeros(5), 0.0
    for i in range(5):
        if want_z[i] > 0.5:
            want_z -= 1.0
            want_acc = want_z.sum()
            want_y[i] = 1.0
    got_z = z.copy()
    got_acc, got_y = k(got_z)
    np.testing.assert_allclose(got_acc, want_acc, rtol=1e-14)
    np.testing.assert_array_equal(got_z, want_z)
    np.testing.assert_array_equal(got_y, want_y)


def test_an_exact_analysis_past_its_quota_gives_way_to_the_memory_based_one(monkeypatch,
                                                                           tmp_path):
    """Fuzz seed 9620 (11 lines: strided and triangular loops, clamped transposed writes
    into one array) spent 22 s in ISL's exact dependence analysis of that array. Past
    ``poly.DEPENDENCE_QUOTA`` operations the analysis gives way to the memory-based
    dependences (a superset): here a quota of one operation makes every analysis give
    way, and the kernel still runs right; ``pa.explain`` says which arrays it concerns."""
    monkeypatch.setenv("POLYAD_CACHE_DIR", str(tmp_path))   # no build from an exact run
    monkeypatch.setattr(poly, "DEPENDENCE_QUOTA", 1)
    k = pa.Kernel(ir_kernel=recurrence_in_place.ir)
    text = pa.explain(k)
    assert "z: memory-based (every earlier access of an element" in text, text
    assert "past its quota of 1 operations" in text
    _runs_the_recurrence_right(k, np.random.default_rng(9620))


def test_the_quota_leaves_exact_analyses_of_ordinary_kernels_alone():
    """Under the default quota the exact analysis answers (no ``inexact`` variable):
    the recurrence's dependence stays the last write only, z[i - 1] -> z[i]."""
    model = poly.PolyModel(recurrence_in_place.ir)
    deps = poly.dependences(model)
    assert deps.inexact == {}
    assert "memory-based" not in pa.explain(recurrence_in_place)


def test_a_spent_operation_quota_is_cleared_on_the_way_out():
    """``poly.operation_quota`` (the dependence analysis's and the scheduler's bound):
    a call past the quota raises, and the context then works again (islpy keeps a spent
    quota on the context otherwise, and every later call fails)."""
    ctx = isl.Context()
    reads = isl.UnionMap.read_from_str(ctx, "[N] -> { S[i] -> a[i - 1] : 0 < i < N }")
    writes = isl.UnionMap.read_from_str(ctx, "[N] -> { S[i] -> a[i] : 0 <= i < N }")
    sched = isl.UnionMap.read_from_str(ctx, "[N] -> { S[i] -> [i] }")

    def flow():
        return isl.UnionAccessInfo.from_sink(reads).set_must_source(writes) \
            .set_schedule_map(sched).compute_flow().get_may_dependence()
    with pytest.raises(isl.Error):
        with poly.operation_quota(ctx, 1):
            flow()
    assert ctx.get_max_operations() == 0
    assert flow().is_equal(isl.UnionMap.read_from_str(
        ctx, "[N] -> { S[i] -> S[i + 1] : 0 <= i < N - 1 }"))



@pa.kernel
def scale_then_add(x: pa.f64[N], z: pa.f64[N]):
    for i in range(N):
        z[i] = z[i] * 2.0
    for i in range(N):
        z[i] += x[i]


def test_anti_pairs_that_are_output_pairs_too_stay_past_their_quota(monkeypatch, tmp_path):
    """Fuzz seed 8109: removing from a vjp's anti dependences the pairs that are output
    dependences too ran for more than ten minutes in ISL. The removal only drops
    duplicates, so it runs under ``poly.ANTI_DUPLICATES_QUOTA`` operations and, past it,
    they stay. Here every anti pair (the first loop reads ``z[i]``, the second writes
    it) is an output pair too: removed, no anti pair is left; past a quota of one
    operation, they all stay, the union with the output pairs is the same, and the
    kernel still runs right."""
    exact = poly.dependences(poly.PolyModel(scale_then_add.ir))
    assert exact.anti["z"].is_empty() and not exact.output["z"].is_empty()
    monkeypatch.setattr(poly, "ANTI_DUPLICATES_QUOTA", 1)
    monkeypatch.setattr(poly, "recent_analyses", Recent(512))  # not the answer above
    monkeypatch.setenv("POLYAD_CACHE_DIR", str(tmp_path))   # no build from an exact run
    model = poly.PolyModel(scale_then_add.ir)
    deps = poly.dependences(model)
    assert deps.inexact == {}    # the exact analysis itself answered
    output = isl.UnionMap.read_from_str(model.ctx, exact.output["z"].to_str())
    assert deps.output["z"].is_equal(output)
    assert not deps.anti["z"].is_empty()
    assert deps.anti["z"].is_subset(deps.output["z"])
    k = pa.Kernel(ir_kernel=scale_then_add.ir)
    rng = np.random.default_rng(8109)
    for n in (0, 1, 2, 5):
        x, z = rng.standard_normal(n), rng.standard_normal(n)
        want = z * 2.0 + x
        k(x, z)
        np.testing.assert_array_equal(z, want)

@pa.kernel
def lane_sum_into_an_edge(x0: pa.f64[N + 1, N + 3].circular, y0: pa.Out(pa.f64[N + 3])):
    for i in range(N):
        for j in range(N):
            y0[j + 2] += (x0[2 * j - 2, 2 * i + 1] - 3.0) * \
                (0.5 if x0[j - 1, j - 2] > -0.2 else x0[i - 2, j])


LANE_SUM_ASAN_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
import numpy as np
import polyad as pa
import test_fuzz_regressions as t

k = pa.compile(t.lane_sum_into_an_edge, sanitize="address")
rng = np.random.default_rng(0)
for n in (0, 1, 2, 3, 4, 40):
    x0 = rng.standard_normal((n + 1, n + 3))
    y0 = k(x0, np.zeros(n + 3))
    want = np.zeros(n + 3)
    at = lambda a, b: x0[a % (n + 1), b % (n + 3)]
    for i in range(n):
        for j in range(n):
            want[j + 2] += (at(2 * j - 2, 2 * i + 1) - 3.0) * \
                (0.5 if at(j - 1, j - 2) > -0.2 else at(i - 2, j))
    np.testing.assert_allclose(y0, want, rtol=1e-12, atol=1e-12)
print("ASAN-LANES-OK")
"""


def test_per_lane_sums_update_their_element_only_where_the_loop_runs(tmp_path, repo_root):
    """Fuzz seed 10204 (heap overflow): a sum along a loop into one element, emitted as
    per-lane partial sums, added them into ``y0[3]`` after the loop even where the loop
    ran no iteration: at N = 0, where y0 has 3 elements. The update now sits under the
    loop's condition."""
    src = lane_sum_into_an_edge.source
    assert "per-lane partial sums" in src
    assert "// the loop ran: its updates are in bounds" in src
    import test_asan
    tests = str(__import__("pathlib").Path(__file__).resolve().parent)
    test_asan.run_script_under_asan(tmp_path, repo_root,
                                    LANE_SUM_ASAN_SCRIPT.format(tests=tests), "ASAN-LANES-OK")


def test_isl_work_in_a_child_process_is_bounded_in_wall_time():
    """``poly.text_within_seconds``: ISL work past its seconds, failing, or crashing gives
    None and why, and the process goes on (fuzz seed 10591: ISL's scheduler ran for
    minutes within its operation quota)."""
    import os
    import signal
    import time
    assert poly.text_within_seconds(lambda: "S[i] -> [i]", 10) == ("S[i] -> [i]", "")
    big = "x" * 300_000  # more than a pipe holds at once
    assert poly.text_within_seconds(lambda: big, 10) == (big, "")
    t = time.monotonic()
    assert poly.text_within_seconds(lambda: time.sleep(60) or "late", 0.5) == \
        (None, "it ran past 0.5 s")
    assert time.monotonic() - t < 30

    def quota():
        ctx = isl.Context()
        with poly.operation_quota(ctx, 1):
            return isl.Set.read_from_str(ctx, "{ [i] : 0 <= i < 10 }").coalesce().to_str()
    assert poly.text_within_seconds(quota, 10) == \
        (None, "ISL gave up (an error, or its operation quota)")
    text, why = poly.text_within_seconds(lambda: os.kill(os.getpid(), signal.SIGSEGV), 10)
    assert text is None and why == f"ISL crashed (signal {int(signal.SIGSEGV)})"


def test_a_scheduler_past_its_seconds_leaves_the_program_order(monkeypatch, tmp_path):
    """Past ``SCHEDULER_SECONDS`` the ISL scheduler's child is killed and the kernel keeps
    the program order, which it runs right; ``pa.explain`` says why."""
    from polyad.schedule import build
    monkeypatch.setenv("POLYAD_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(build, "SCHEDULER_SECONDS", 0.0)
    k = pa.Kernel(ir_kernel=recurrence_in_place.ir)
    text = pa.explain(k)
    assert "program order (the ISL scheduler gave up: it ran past 0 s)" in text, text
    _runs_the_recurrence_right(k, np.random.default_rng(10591))


def test_a_schedule_isl_cannot_read_back_leaves_the_program_order(monkeypatch, tmp_path):
    """Fuzz seed 15269: ISL printed the vjp's schedule with a ``set`` node without
    children (``child: { set }``), which its own reader rejects: the compile failed with
    ISL's syntax error. The kernel now keeps the program order, and ``explain`` says why."""
    from polyad.schedule import build
    from polyad.recent import Recent
    monkeypatch.setenv("POLYAD_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(build, "recent_schedules", Recent(64))  # (ISL's earlier answers)
    monkeypatch.setattr(build, "text_within_seconds", lambda compute, seconds: (
        '{ domain: "[N] -> { S0[i] : 1 <= i < N }", child: { set } }', ""))
    k = pa.Kernel(ir_kernel=recurrence_in_place.ir)
    text = pa.explain(k)
    assert ("program order (the ISL scheduler gave up: ISL could not read back the "
            "schedule it printed)") in text, text
    _runs_the_recurrence_right(k, np.random.default_rng(15269))


@pa.func
def tanh_mix(a: pa.f32, b: pa.f32) -> pa.f32:
    return a * pa.tanh(b) + pa.sin(a) * 0.5


@pa.kernel
def triangle_min_and_log(x0: pa.f32[N + 3, N].zero, x1: pa.f32[N + 1, N].circular,
                         y0: pa.Out(pa.f32[N + 1, N, N + 1])) -> pa.f32:
    acc = 0.0
    t0 = pa.zeros(pa.f32[N + 1])
    for i in range(1, N):
        for j in range(i):
            for k in range(j + 1, N):
                acc += min((x1[i, N - k - 1] * x0[i + 1, 0]), x0[j - 1, k - 1])
                y0[k, i, i] = tanh_mix(pa.tanh((float(N) * 0.125)), (float(N) * 0.125))
    for i in range(N):
        for j in range(N):
            if i + 1 >= N:
                t0[j + 1] = pa.log(x1[j + 1, j + 2] * x1[j + 1, j + 2] + 1.0)
            else:
                t0[j] = x0[2 * j - 3, j]
    return acc


@pytest.mark.filterwarnings("ignore::polyad.ad.NoGradientPathWarning")
def test_the_extent_of_a_tiled_loop_is_bounded_without_its_floors():
    """Fuzz seed 15320: the vjp took 383 s to compile, all of it in the loop facts of one
    loop of a tiled nest: the exact max - min of a tile's points (``256 * floor(i / 256)
    <= N - 257``) over the sizes. The extent is now that of their hull without the floor
    (an upper bound; it only decides from how many iterations threads pay): the vjp
    compiles in about a second, and computes what the interpreter does."""
    import types
    from polyad.schedule.build import _LoopAnalysis
    from polyad.testing import interpret
    ctx = isl.Context()
    model = types.SimpleNamespace(ctx=ctx, context=isl.Set.read_from_str(ctx, "[N] -> { : }"))
    tiles = isl.UnionMap.read_from_str(ctx, "[N] -> { S[i] -> [t, i] : i >= 3 and 256t <= i "
                                            "< 256t + 256 and 256t <= N - 257 }")
    assert _LoopAnalysis.extent(types.SimpleNamespace(model=model), tiles, 1).to_C_str() \
        == "N - 4"
    vk = pa.vjp(triangle_min_and_log, ["x0", "x1"])
    rng = np.random.default_rng(15320)
    for n in (1, 4, 5):
        args = dict(x0=rng.standard_normal((n + 3, n)).astype(np.float32),
                    x1=rng.standard_normal((n + 1, n)).astype(np.float32),
                    y0_bar=rng.standard_normal((n + 1, n, n + 1)).astype(np.float32),
                    result_bar=np.float32(0.75))
        got = vk(**args)
        _, want = interpret(vk.ir, dict(args), dict(N=n))
        for name, value in zip(("d_x0", "d_x1"), got):
            np.testing.assert_allclose(value, want[name], rtol=1e-5, atol=1e-5)


@pa.kernel
def mirror_reads_on_two_strides(x0: pa.f64[N + 1, 2 * M].mirror,
                                x1: pa.f64[2 * N, N, M + 3].mirror,
                                y0: pa.Out(pa.f64[M + 2, 2 * N, M + 3]), s: pa.f64):
    for i in range(0, M, 2):
        for j in range(0, N, 3):
            y0[i + 1, j, i] += ((x1[N - j - 1, j - 2, i - 1] + s) + x0[j + 1, i + 2])
            y0[i + 2, j, i] = y0[i + 1, 2 * j, i + 2]


def test_the_extent_of_pieces_bounded_by_different_sizes():
    """Fuzz seed 15364: a loop of the CUDA target's vjp (one loop per band, the pieces as
    conditions inside) runs pieces bounded by ``3 i < N`` and by ``i <= M + 1`` (one under
    a floor). The simple hull of their values without the floor keeps neither bound, and
    ISL failed on its unbounded maximum (``isl.Error`` out of ``pa.compile``). The extent is
    now that of the pieces themselves there; the vjp computes what the interpreter does,
    and agrees with central differences of the interpreted primal."""
    import types
    from polyad.schedule.build import _LoopAnalysis
    from polyad.testing import interpret
    ctx = isl.Context()
    model = types.SimpleNamespace(ctx=ctx, context=isl.Set.read_from_str(ctx, "[N, M] -> { : }"))
    pieces = isl.UnionMap.read_from_str(
        ctx, "[N, M] -> { S[i] -> [i] : 0 <= i and 3i < N and M > 0; T[i] -> [i] : "
             "i mod 2 = 0 and N > 0 and 2 <= i <= 1 + M and i <= -2 + 2M }")
    assert _LoopAnalysis.extent(types.SimpleNamespace(model=model), pieces, 0).to_C_str() \
        == "N <= 9 && M == 2 ? 3 : M >= 3 && 3 * M + 6 >= N ? M + 2 : (N + 2) / 3"
    vk = pa.vjp(mirror_reads_on_two_strides, ["x0", "x1", "s"])
    kernel = pa.compile(vk, target="cuda-sim")
    rng = np.random.default_rng(15364)
    for m, n in [(7, 3), (6, 4)]:
        args = dict(x0=rng.standard_normal((n + 1, 2 * m)),
                    x1=rng.standard_normal((2 * n, n, m + 3)), s=0.5,
                    y0_bar=rng.standard_normal((m + 2, 2 * n, m + 3)))
        got = kernel(**args)
        _, want = interpret(vk.ir, dict(args), dict(M=m, N=n))
        for name, value in zip(("d_x0", "d_x1", "d_s"), got):
            np.testing.assert_allclose(value, want[name], rtol=1e-12, atol=1e-12)

        def objective(x0, x1, s, sizes=dict(M=m, N=n)):
            _, out = interpret(mirror_reads_on_two_strides.ir, dict(x0=x0, x1=x1, s=s), sizes)
            return float(np.sum(out["y0"] * args["y0_bar"]))
        v0, v1, vs, h = rng.standard_normal(args["x0"].shape), \
            rng.standard_normal(args["x1"].shape), 0.7, 1e-3
        central = (objective(args["x0"] + h * v0, args["x1"] + h * v1, 0.5 + h * vs)
                   - objective(args["x0"] - h * v0, args["x1"] - h * v1, 0.5 - h * vs)) / (2 * h)
        np.testing.assert_allclose(np.sum(got[0] * v0) + np.sum(got[1] * v1) + got[2] * vs,
                                   central, rtol=1e-8)


@pa.kernel
def strided_clamped_writes(x0: pa.f64[N, N + 1].clamped, x1: pa.f64[N + 3, M + 2],
                           y0: pa.Out(pa.f64[N, N + 1, N].clamped)):
    for i in range(1, M, 2):
        y0[i + 2, N - i, i + 2] = pa.tanh(((float(M) * 0.125) + 0.5))
        y0[-1, i - 1, i] *= ((float(i) * 0.25) - x1[0, i + 2])
        y0[N - i - 1, i + 3, 1] = (float(i) * 0.25)
        for j in range(M):
            y0[j - 3, j, j - 2] = pa.tanh(((float(j) * 0.25) if j > 1 else (float(j) * 0.25)))


@pytest.mark.filterwarnings("ignore::polyad.ad.NoGradientPathWarning")
def test_an_ast_whose_separation_crashes_isl_is_built_without_it():
    """Seed 13148: ISL's AST generation segfaulted on the separation options of this
    vjp's strided domain (every process compiling it died, after about a minute of
    work). A forked child probes the separated build of strided domains first, for at
    most ``poly.AST_PROBE_SECONDS``; this one is built with one loop per band
    (``poly.strided_ast_build_crashes``), and its values are the interpreter's."""
    from polyad.testing import interpret
    vk = pa.vjp(strided_clamped_writes, ["x0", "x1"])
    rng = np.random.default_rng(13148)
    for m, n in [(0, 5), (5, 7), (6, 9)]:
        args = dict(x0=rng.standard_normal((n, n + 1)), x1=rng.standard_normal((n + 3, m + 2)),
                    y0_bar=rng.standard_normal((n, n + 1, n)))
        got = vk(**args)
        _, want = interpret(vk.ir, dict(args), dict(M=m, N=n))
        for name, value in zip(("d_x0", "d_x1"), got):
            np.testing.assert_allclose(value, want[name], rtol=1e-12, atol=1e-12)


@pa.kernel
def strided_log_of_clamped_output(x0: pa.f64[M, N + 2, 2 * M + 3],
                                  y0: pa.Out(pa.f64[2 * N].clamped)):
    for i in range(0, M, 3):
        for j in range(i + 1, M):
            y0[2 * j - 1] = x0[i, 1, j + 2] if i % 2 == 0 else pa.exp(pa.tanh(float(N) * 0.125))
            if i + 2 >= N:
                y0[N - i - 1] += pa.log((x0[i, 0, 2 * i + 2] - y0[i - 1])
                                        * (x0[i, 0, 2 * i + 2] - y0[i - 1]) + 1.0)
            y0[2 * j - 2] = pa.sqrt((float(j) * 0.25) * (float(j) * 0.25) + 1.0)


def test_a_dependence_analysis_that_crashes_isl_is_memory_based():
    """Seed 14125: ISL's exact dependence analysis (``compute_flow``) of this vjp's
    ``d_y0``, whose statements run under ``range(0, M, 3)``, segfaulted, which killed
    every process compiling it. Strided statements are analysed in a forked child
    (``poly.STRIDED_PROBE_SECONDS``); where it crashes, the dependences are memory-based (a
    superset of the exact ones), ``explain`` says why, and the values are the
    interpreter's."""
    from polyad.testing import interpret
    vk = pa.vjp(strided_log_of_clamped_output, ["x0"])
    rng = np.random.default_rng(14125)
    for m, n in [(2, 2), (3, 4), (7, 4), (8, 3)]:
        args = dict(x0=rng.standard_normal((m, n + 2, 2 * m + 3)),
                    y0_bar=rng.standard_normal(2 * n))
        d_x0, = vk(**args)
        _, want = interpret(vk.ir, dict(args), dict(M=m, N=n))
        np.testing.assert_allclose(d_x0, want["d_x0"], rtol=1e-12, atol=1e-12)


def test_strided_dependences_from_the_forked_child_are_the_in_process_ones(monkeypatch,
                                                                           tmp_path):
    """Where ISL does not crash, the exact analysis run in the forked child (its answer
    read back from text) gives the dependences, and so the schedule and the C, that the
    analysis in this process gives: ``explain`` prints the same text both ways. (The
    strided loops keep their existential variables here, without ``schedule.strides``;
    conditions such as ``i % 3 == 0`` and gathers of strided scatters keep theirs.)"""
    from polyad.schedule import build
    monkeypatch.setattr(build, "unit_stride_loops", lambda kernel: (kernel, []))
    children = []
    in_a_child = poly.text_within_seconds
    monkeypatch.setattr(poly, "text_within_seconds",
                        lambda *a: children.append(a) or in_a_child(*a))
    texts = []
    for in_child in (True, False):
        monkeypatch.setenv("POLYAD_CACHE_DIR", str(tmp_path / str(in_child)))
        poly.recent_analyses.clear()  # each way analyses the kernel itself
        if not in_child:
            monkeypatch.setattr(poly, "_has_existentials", lambda instances: False)
        k = pa.Kernel(ir_kernel=strided_if_else.ir)
        texts.append(pa.explain(k))
        if in_child:
            assert children, "no analysis ran in a child"
    assert "forked child" not in texts[0]
    assert texts[0] == texts[1]


@pa.kernel
def copied_in_out_updated_off_its_rows(x1: pa.f64[N + 2, N + 3, N + 1],
                                       z0: pa.f64[N, 2 * N].zero, y0: pa.Out(pa.f64[N])):
    for i in range(N):
        for j in range(i, N):
            z0[j - 1, j + 1] += x1[j + 2, j, j]
            y0[j] = (z0[i + 2, 2 * j - 3]) ** 2 * x1[j, i + 1, i]


def test_a_buffer_that_a_later_nest_writes_is_not_fused():
    """Fuzz seed 14518: the vjp copies the in-out ``z0`` into ``z0_work`` in a nest of its
    own, then updates row ``j - 1`` of the copy and reads row ``i + 2`` in the loop over
    ``i``. Fusion kept the copy as one row per thread (row ``i + 2``), so the update of
    row ``j - 1`` went to that row's slot: ``d_x1`` was wrong at N = 7 and 8. A buffer's
    rows are now written by their producer only."""
    from polyad.testing import interpret
    vk = pa.vjp(copied_in_out_updated_off_its_rows, ["x1"])
    assert "S2, a later nest, writes 'z0_work' too" in pa.explain(vk)
    rng = np.random.default_rng(14518)
    for n in (3, 7, 8):
        args = dict(x1=rng.standard_normal((n + 2, n + 3, n + 1)),
                    z0=rng.standard_normal((n, 2 * n)), z0_bar=rng.standard_normal((n, 2 * n)),
                    y0_bar=rng.standard_normal(n))
        d_x1, = vk(**{k: v.copy() for k, v in args.items()})
        _, want = interpret(vk.ir, dict(args), dict(N=n))
        np.testing.assert_allclose(d_x1, want["d_x1"], rtol=1e-12, atol=1e-12)


M2, N2 = pa.sizes("M2 N2")


@pa.kernel
def overwritten_in_a_triangle(x0: pa.f64[2 * M2, 2 * M2 + 1].circular, x1: pa.f64[N2].circular,
                              y0: pa.Out(pa.f64[N2].clamped)):
    for i in range(M2):
        y0[i + 3] = y0[2 * i - 1] * 2.0
        y0[i - 1] -= x1[2 * i - 3] * y0[i]
        for j in range(i, M2):
            y0[i] = x1[N2 - i - 1] * x0[i + 3, 2 * i - 1]


def test_cuda_keeps_the_order_isl_loses_in_one_nest_per_band():
    """fuzz seed 16020 on the CUDA simulator: ISL's AST of the vjp's schedule with atomic
    loops (the CUDA target's one nest per band) put the zeroing ``d_y0[i] = 0`` of each
    reversed j at iteration -1 of a sequential loop and the scatters that read ``d_y0[i]``
    first at iteration 1, where the schedule tree gives both 1: every scatter read zero.
    Such an AST is now caught by the loop analysis and the pieces keep loops of their own;
    the gradient matches the interpreter of the vjp's IR."""
    from polyad.pipeline import Options
    from polyad.testing import interpret
    vk = pa.vjp(overwritten_in_a_triangle, ["x0", "x1"])
    sim = pa.compile(vk, target="cuda-sim")
    report = pa.explain(vk, target="cuda-sim")
    for decision in vk.artifact(Options("cuda-sim")).plan.scheduled.schedule_decisions:
        assert decision in report  # the fallback's among them, where ISL's nest needs it
    rng = np.random.default_rng(1)
    for m, n in [(4, 6), (3, 5), (5, 7)]:
        args = dict(x0=rng.uniform(-1, 1, (2 * m, 2 * m + 1)), x1=rng.uniform(-1, 1, n),
                    y0_bar=rng.uniform(-1, 1, n))
        got = sim(**{k: v.copy() for k, v in args.items()}, M2=m, N2=n)
        _, want = interpret(vk.ir, {k: v.copy() for k, v in args.items()}, dict(M2=m, N2=n))
        for name, g in zip(["x0", "x1"], got):
            np.testing.assert_allclose(g, want["d_" + name], rtol=1e-12, atol=1e-12)
        # and against central differences of the primal along a random direction (it is
        # piecewise polynomial of low degree: the differences are exact up to rounding)
        d0, d1 = rng.standard_normal(args["x0"].shape), rng.standard_normal(args["x1"].shape)

        def objective(step):
            y0 = overwritten_in_a_triangle(args["x0"] + step * d0, args["x1"] + step * d1,
                                           M2=m, N2=n)
            return float(np.sum(y0 * args["y0_bar"]))
        fd = (objective(1e-6) - objective(-1e-6)) / 2e-6
        assert abs(fd - (np.sum(got[0] * d0) + np.sum(got[1] * d1))) <= 1e-6 * (1 + abs(fd))


@pa.kernel
def doubling_chain(x: pa.f64[N]):
    for i in range(N - 1):
        x[i + 1] = x[i] * 2.0


def test_a_nest_that_runs_a_dependence_backwards_is_named():
    """The check behind the test above, on a schedule that runs the loop backwards: the
    analysis of one nest per band names the flow dependence it reverses, and the program
    order's passes."""
    from polyad.pipeline import Options, compile_kernel
    from polyad.schedule.build import _candidate
    sk = compile_kernel(doubling_chain.ir, Options()).scheduled
    (name,) = [st.name for st in sk.kernel.statements]
    backwards = isl.Schedule.from_domain(sk.model.union_domain()).insert_partial_schedule(
        isl.MultiUnionPwAff.from_union_map(isl.UnionMap.read_from_str(
            sk.model.ctx, f"[N] -> {{ {name}[i] -> [-i] }}")))
    cand = _candidate(backwards, sk.kernel, sk.model, sk.deps, separate=False)
    assert cand.runs_backwards.startswith("flow dependence of 'x'"), cand.runs_backwards
    one_nest = _candidate(sk.schedule, sk.kernel, sk.model, sk.deps, separate=False)
    assert one_nest.runs_backwards == ""


@pa.kernel
def never_runs_then_dead(x0: pa.f64[N].mirror, x1: pa.f64[N + 3, N + 1],
                         y0: pa.Out(pa.f64[N + 1]), s: pa.f64):
    t0 = pa.zeros(pa.f64[2 * N])
    for i in range(1, N, 2):
        if i % 2 == 0:
            y0[i] *= (s * (3.0 + x1[i + 2, i]))
    for i in range(N):
        t0[i] += x0[i + 1]
        t0[i] -= (t0[i] - (t0[2 * i] * x0[i + 1]))


@pa.kernel
def only_statement_never_runs(x: pa.f64[N], y: pa.f64[N]):
    for i in range(1, N, 2):
        if i % 2 == 0:
            y[i] = x[i] * 2.0


def test_a_statement_that_never_runs_is_dropped(tmp_path, monkeypatch):
    """Fuzz seed 17437: the only statement left after dead-code elimination ran under
    ``if i % 2 == 0`` in a loop over odd ``i``; its empty domain reached the program-order
    schedule, and ISL's ``isl_multi_union_pw_aff_from_union_map`` failed on it (an
    ``isl.Error`` out of ``pa.compile``). Such a statement is dead: the kernel runs as if
    it were not there, and so does its vjp."""
    monkeypatch.setenv("POLYAD_CACHE_DIR", str(tmp_path))
    rng = np.random.default_rng(17437)
    for n in (3, 4, 6):
        x0, x1, s = rng.uniform(-1, 1, n), rng.uniform(-1, 1, (n + 3, n + 1)), 0.5
        np.testing.assert_array_equal(never_runs_then_dead(x0, x1, s=s), np.zeros(n + 1))
        x, y = rng.uniform(-1, 1, n), rng.uniform(-1, 1, n)
        want = y.copy()
        only_statement_never_runs(x, y)
        np.testing.assert_array_equal(y, want)
    assert "scheduled as 0 piece(s) (it never runs" in pa.explain(only_statement_never_runs)
    assert "scheduled as 0 piece(s) (removed as dead" in pa.explain(never_runs_then_dead)
    d_x1 = pa.vjp(never_runs_then_dead, "x1")(
        rng.uniform(-1, 1, 4), rng.uniform(-1, 1, (7, 5)), s=0.5, y0_bar=np.ones(5))
    np.testing.assert_array_equal(d_x1, np.zeros((7, 5)))


def test_an_isl_failure_in_a_stage_is_an_internal_error(tmp_path, monkeypatch):
    """An ``isl.Error`` escaping a stage (as seed 17437's did) is a bug of polyad's: it
    is raised as ``pa.InternalError`` naming the stage and the kernel, the ISL error
    chained, not as islpy's own exception."""
    from polyad.schedule import build

    def fail(model):
        raise isl.Error("simulated failure")
    monkeypatch.setattr(build, "_program_order_schedule", fail)
    monkeypatch.setenv("POLYAD_CACHE_DIR", str(tmp_path))
    with pytest.raises(pa.InternalError) as info:
        pa.compile(doubling_chain)
    assert "internal error in polyad while scheduling kernel 'doubling_chain'" in str(info.value)
    assert isinstance(info.value.__cause__, isl.Error)


def test_an_isl_failure_while_differentiating_is_an_internal_error(monkeypatch):
    """The same for the differentiating stage (its recorded-reads and checkpoint analyses
    are ISL's too): an ``isl.Error`` escaping the derivation is ``pa.InternalError``."""
    from polyad.ad import reverse

    def fail(self):
        raise isl.Error("simulated failure")
    monkeypatch.setattr(reverse._Reverse, "build", fail)
    with pytest.raises(pa.InternalError) as info:
        pa.vjp(doubling_chain, "x").ir
    assert "internal error in polyad while differentiating kernel 'doubling_chain'" \
        in str(info.value)
    assert isinstance(info.value.__cause__, isl.Error)


@pa.kernel
def guarded_drop(x1: pa.f64[M2, N2].clamped, y0: pa.Out(pa.f64[N2 + 1, M2].zero)):
    for i in range(0, M2, 3):
        if x1[i + 1, 2 * i - 1] > -0.2:
            y0[2 * i, i - 1] += 1.0


def test_a_guard_is_tested_where_its_write_is_dropped():
    """Fuzz seed 17810: at N2 = 0 the condition reads the empty ``x1`` through its clamped
    mode in every iteration, as Python tests an ``if``; the write it guards falls outside
    the ``.zero`` array at i = 0, and the kernel ran (dropping the statement with its
    guard) where the sizes have no meaning. Now the call refuses them, naming the read and
    the if it sits in; sizes where ``x1`` has elements run and match the reference."""
    compiled = pa.compile(guarded_drop)
    lines, first = inspect.getsourcelines(guarded_drop)
    guarded = first + next(k for k, text in enumerate(lines) if "+= 1.0" in text)
    with pytest.raises(pa.ShapeError, match=r"sizes too small .*x1\[i \+ 1, 2 \* i - 1\] in "
                       rf"the condition of the if guarding line {guarded} needs"):
        compiled(np.zeros((4, 0)))
    rng = np.random.default_rng(17810)
    written = 0
    for m, n in ((4, 1), (5, 6), (7, 13)):
        x1 = rng.uniform(-1, 1, (m, n))
        want = np.zeros((n + 1, m))
        for i in range(0, m, 3):
            if x1[min(i + 1, m - 1), min(max(2 * i - 1, 0), n - 1)] > -0.2 and \
                    0 <= 2 * i < n + 1 and 0 <= i - 1 < m:
                want[2 * i, i - 1] += 1.0
        np.testing.assert_array_equal(compiled(x1), want)
        written += int(want.sum())
    assert written >= 2  # (writes that land, not only dropped ones)


def test_a_set_isl_fails_to_coalesce_is_used_as_it_is():
    """Fuzz seed 17924: ISL's coalescing raised "cannot relax redundant constraint" on the
    domain of a vjp's zeroing statement (a union of 40 pieces, built by subtractions; the
    same set parsed from its text coalesces), and the vjp failed to compile with an
    internal error. Coalescing only rewrites a set with fewer pieces, so ``poly.coalesced``
    keeps the set as it is where ISL fails; the vjp then compiles and passes every check
    of the fuzzer (``python -m tests.fuzz --cases 1 --seed 17924 --full``, 30 s of
    pipeline, too slow for this suite)."""
    class Uncoalescable:
        def __init__(self, ctx):
            self.ctx = ctx

        def get_ctx(self):
            return self.ctx

        def coalesce(self):
            raise isl.Error("call to isl_set_coalesce failed: cannot relax redundant "
                            "constraint")

    ctx = isl.Context()
    s = Uncoalescable(ctx)
    assert poly.coalesced(s) is s
    with poly.operation_quota(ctx, 1000), pytest.raises(isl.Error):
        poly.coalesced(s)  # (under a quota the caller gives up)
    box = isl.Set("[N] -> { S[i] : 0 <= i < N or N <= i < 2N }")
    assert poly.coalesced(box).is_equal(box) and poly.coalesced(box).n_basic_set() == 1


def _holds(cond, env: dict) -> bool:
    """The value of a condition ``poly.set_to_condition`` builds (comparisons of affine
    expressions with 0, joined by and / or) at the integer point ``env``."""
    if cond.op in ("and", "or"):
        a, b = _holds(cond.a, env), _holds(cond.b, env)
        return (a and b) if cond.op == "and" else (a or b)
    lhs, rhs = ir.eval_integer(cond.a, env), ir.eval_integer(cond.b, env)
    return lhs == rhs if cond.op == "==" else lhs >= rhs


def test_a_set_with_existential_variables_isl_left_unknown_becomes_a_condition():
    """Fuzz seed 18137: the elements a vjp's first updates reach (the range of an access
    map over a strided loop) came out of ISL's projection with existential variables it
    gave no expression, and ``set_to_condition`` failed on them with an internal error
    ("call to isl_constraint_get_aff failed: local space has unknown divs"). It gives them
    explicit expressions first; the condition holds exactly at the set's points. The vjp
    of seed 18137 then compiles and passes every check of the fuzzer (``python -m
    tests.fuzz --cases 1 --seed 18137 --full``: a pipeline of 20 s and 18 000 lines of C,
    too slow for this suite)."""
    s = isl.Set("[N] -> { [x, y] : exists a, b : x = a + 2b and 0 <= a <= N and 0 <= b <= a }")
    unknown = [c for b in s.get_basic_sets() for c in b.get_constraints()]
    with pytest.raises(isl.Error, match="unknown divs"):
        for c in unknown:
            c.get_aff()  # (what the conversion met before)
    cond = poly.set_to_condition(s, ["x", "y"], {"N": ir.SizeVar("N")})
    for n in range(0, 4):
        for x in range(-2, 3 * n + 4):
            for y in (-1, 0, 5):
                point = isl.Set(f"[N] -> {{ [{x}, {y}] : N = {n} }}")
                inside = not s.intersect(point).is_empty()
                assert _holds(cond, {"N": n, "x": x, "y": y}) == inside, (n, x, y)


@pa.kernel
def dropped_argument(x: pa.f64[N, N].mirror, y: pa.Out(pa.f64[N, N].zero), s: pa.f64):
    for i in range(N):
        for j in range(N):
            y[j, j - 1 - N] += pa.sin(x[i + 2, j] * x[i, 2 * j - 2])
            y[j, i] += s * x[i, j] + y[i, j]


def test_the_argument_of_a_dropped_write_is_not_computed_in_a_checkpointed_step():
    """Fuzz seed 19191: the checkpointed vjp's step kernel computes the argument of
    ``sin`` reading two elements into a temporary of its own (``_argument_temp``), also
    where the write it belongs to falls outside the ``.zero`` array (here always, at
    column ``j - 1 - N``) and is dropped with its reads. At N = 1 and 2 the mirror read
    ``x[i + 2, j]`` of those dropped instances needs two reflections, and the step
    refused sizes the kernel, its plain vjp and the checkpointed vjp's other pieces take.
    The temporary is now computed only where the write lands (never, here); the vjp it
    is held to is held to central differences first."""
    vjp = pa.vjp(dropped_argument, ["x", "s"])
    checkpointed = pa.vjp(dropped_argument, ["x", "s"], checkpoint=1)
    for n in (1, 2, 3, 4):
        rng = np.random.default_rng(19191 + n)
        x, ybar = rng.standard_normal((n, n)), rng.standard_normal((n, n))
        dropped_argument(x, s=0.7)
        check_vjp_against_fd(dropped_argument, ["x", "s"], {"x": x, "s": 0.7}, {"y": ybar})
        for got, want in zip(checkpointed(x, 0.7, ybar), vjp(x, 0.7, ybar)):
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
