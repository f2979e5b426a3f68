"""Coarse boundary pieces: a statement whose clamped/mirror/zero cases combine into more
than ``poly.MAX_FINE_PIECES`` pieces is split into its interior and one border piece
(indices through min/max; a ``.zero`` read 0 where it leaves its array, or read under a
condition where it leaves it on part of the border only), not one piece per combination of
cases (3^d per d-dimensional stencil read); its gradient stays right at the smallest
sizes, also under ASan."""

import textwrap

import numpy as np
import pytest

import polyad as pa
from polyad import ir, poly
from ad_helpers import check_against_fd, run
from polyad.pipeline import Options
from polyad.testing import call_interpreted
from test_asan import run_script_under_asan

M, N = pa.sizes("M N")
X, Y, Z = pa.sizes("X Y Z")


@pa.kernel
def energy27(u: pa.f64[X, Y, Z].clamped, w: pa.f64[3, 3, 3]) -> pa.f64:
    E = 0.0
    for i in range(X):
        for j in range(Y):
            for k in range(Z):
                s = 0.0
                for a in range(3):
                    for b in range(3):
                        for c in range(3):
                            s += w[a, b, c] * u[i + a - 1, j + b - 1, k + c - 1]
                E += pa.log(1.0 + s * s) + pa.sqrt(1.0 + (u[i + 1, j, k] - u[i, j, k]) ** 2)
    return E


def _blur(mode: str):
    """A 3x3 blur's squared error, reading ``x`` through boundary mode ``mode``."""
    X = getattr(pa.f64[M, N], mode)

    @pa.kernel
    def blur(x: X, f: pa.f64[3, 3], y: pa.f64[M, N]) -> pa.f64:
        C = 0.0
        for m in range(M):
            for n in range(N):
                s = 0.0
                for a in range(3):
                    for b in range(3):
                        s += f[a, b] * x[m + a - 1, n + b - 1]
                C += (s - y[m, n]) ** 2
        return C
    return blur


blur_clamped, blur_zero = _blur("clamped"), _blur("zero")


@pa.kernel
def blur_mirror(x: pa.f64[M, N].mirror, f: pa.f64[3, 3], y: pa.f64[M, N]) -> pa.f64:
    C = 0.0
    for m in range(M):
        for n in range(N):
            s = 0.0
            for a in range(3):
                for b in range(3):
                    s += f[a, b] * x[m + a - 1, n + b - 1]
            C += pa.sin(s - y[m, n]) ** 2
    return C


@pa.kernel
def stencil7(x: pa.f64[X, Y, Z].clamped, y: pa.f64[X, Y, Z]) -> pa.f64:
    C = 0.0
    for i in range(X):
        for j in range(Y):
            for k in range(Z):
                r = (6.0 * x[i, j, k] - x[i - 1, j, k] - x[i + 1, j, k] - x[i, j - 1, k]
                     - x[i, j + 1, k] - x[i, j, k - 1] - x[i, j, k + 1] - y[i, j, k])
                C += r * r
    return C


@pa.kernel
def tv2(g: pa.f64[M, N].clamped) -> pa.f64:
    C = 0.0
    for m in range(M):
        for n in range(N):
            C += pa.abs(g[m + 1, n] - g[m, n]) + pa.abs(g[m, n + 1] - g[m, n])
    return C


@pa.kernel
def zero_products(x: pa.f64[M, N].zero, f: pa.f64[3, 3], y: pa.f64[M, N]) -> pa.f64:
    """Two reads of a .zero array: on the border of the first, x[m, n + b - 1] leaves x
    only where b leaves it (n = 0, b = 0), not where a does (m = 0, a = 0)."""
    C = 0.0
    for m in range(M):
        for n in range(N):
            s = 0.0
            for a in range(3):
                for b in range(3):
                    s += f[a, b] * x[m + a - 1, n + b - 1] * x[m, n + b - 1]
            C += (s - y[m, n]) ** 2
    return C


@pa.kernel
def strided_taps(x: pa.f64[N].clamped, y: pa.Out(pa.f64[N])):
    for i in range(N):
        y[i] = x[2 * i - 1] + 2.0 * x[2 * i] + 3.0 * x[2 * i + 1]


# test ids (the blurs of every mode share their function's name)
_NAMES = {id(k): name for name, k in [("blur_clamped", blur_clamped), ("blur_mirror", blur_mirror),
                                      ("blur_zero", blur_zero), ("zero_products", zero_products)]}


def _pieces(kernel):
    model = poly.PolyModel(kernel)
    return poly.split_boundary_pieces(kernel, model).statements


def test_a_27_point_clamped_read_gives_an_interior_and_one_border_piece():
    pieces = _pieces(energy27.ir)
    owners = {}
    for st in pieces:
        owners.setdefault(st.owner, []).append(st)
    # the statement reading the 27 neighbours: 2 pieces, not the 3^3 * 2 combinations
    (tap,) = [o for o, sts in owners.items() if "w[a, b, c]" in ir.expr_str(sts[0].expr)]
    assert [st.on_border for st in owners[tap]] == [False, True]
    interior, border = owners[tap]
    assert "max(" not in ir.expr_str(interior.expr)
    assert "max(0, min(i + a - 1, X - 1))" in ir.expr_str(border.expr)
    # the one-sided difference u[i + 1] - u[i] alone has 2 cases: split case by case
    (diff,) = [o for o, sts in owners.items() if "sqrt" in ir.expr_str(sts[0].expr)]
    assert len(owners[diff]) == 2 and not any(st.on_border for st in owners[diff])
    assert max(len(sts) for sts in owners.values()) == 2
    # the gradient: every statement of its adjoint splits into at most two pieces too
    grad_pieces = _pieces(pa.grad(energy27, wrt=["u", "w"]).ir)
    per_owner = {}
    for st in grad_pieces:
        per_owner[st.owner] = per_owner.get(st.owner, 0) + 1
    assert max(per_owner.values()) == 2


def test_zero_mode_reads_give_an_interior_and_one_border_piece():
    """A 3x3 read of a .zero array: the border piece reads 0 (some index leaves the array
    at every point of it), not eight pieces that each read 0."""
    pieces = [st for st in _pieces(blur_zero.ir) if st.loops and "f[a, b]" in ir.expr_str(st.expr)]
    assert [st.on_border for st in pieces] == [False, True]
    assert ir.expr_str(pieces[1].expr).endswith("f[a, b] * 0.0")


def test_a_zero_read_inside_on_part_of_the_border_reads_under_a_condition():
    pieces = [st for st in _pieces(zero_products.ir)
              if st.loops and "f[a, b]" in ir.expr_str(st.expr)]
    assert [st.on_border for st in pieces] == [False, True]
    (select,) = [e for e in ir.walk(pieces[1].expr) if isinstance(e, ir.Select)]
    text = ir.expr_str(select)
    # read with its index clamped into x (in bounds either way), 0 where it leaves x
    assert "x[m, max(0, min(n + b - 1, N - 1))] if n + b - 1 >= 0 and n + b - 1 < N" in text
    assert text.endswith("else 0.0")
    rng = np.random.default_rng(3)
    for shape in [(1, 1), (1, 3), (2, 2), (3, 1), (4, 4)]:
        x, f, y = rng.standard_normal(shape), rng.standard_normal((3, 3)), \
            rng.standard_normal(shape)
        want = call_interpreted(zero_products, x, f, y, M=shape[0], N=shape[1])
        np.testing.assert_allclose(run(zero_products, x, f, y), want, rtol=1e-12)


def test_a_small_scatter_sharing_inner_loops_gets_a_nest_of_its_own():
    """energy27's filter gradient d_w[a, b, c] += ... shares the tap loops with the gather
    of d_u, whose bounds differ: it runs in a nest after that one, interior and border."""
    text = pa.explain(pa.grad(energy27, wrt=["u", "w"]))
    moved = [line for line in text.splitlines() if "scatter-to-gather of" in line
             and "'d_w' is small" in line]
    assert len(moved) == 2 and all("a nest of its own after this one" in line
                                   for line in moved), text
    rng = np.random.default_rng(5)
    for shape in [(1, 1, 1), (2, 3, 1), (3, 2, 4)]:
        args = dict(u=rng.standard_normal(shape), w=rng.standard_normal((3, 3, 3)))
        check_against_fd(energy27, ["u", "w"], args, rtol=1e-6, atol=1e-7)


def test_few_cases_keep_one_piece_per_case():
    """tv's two one-sided neighbours: 2 x 2 cases, at most MAX_FINE_PIECES, whose border
    pieces keep plain indices (g[m, N - 1] - g[m, N - 1] simplifies to 0 there)."""
    pieces = [st for st in _pieces(tv2.ir) if st.loops]
    assert len(pieces) == 4 <= poly.MAX_FINE_PIECES
    assert not any(st.on_border for st in pieces)
    assert "max(" not in "".join(ir.expr_str(st.expr) for st in pieces)


def test_a_border_that_is_not_a_face_keeps_the_case_split():
    """x[2 * i + 1] over i < N leaves x for half the iterations: one border piece would be
    a leading term of the work, so the cases stay apart (and the result is right)."""
    pieces = _pieces(strided_taps.ir)
    assert len(pieces) > poly.MAX_FINE_PIECES and not any(st.on_border for st in pieces)
    for n in (1, 2, 3, 7):
        x = np.arange(1.0, n + 1)
        want = call_interpreted(strided_taps, x.copy(), N=n)
        np.testing.assert_allclose(run(strided_taps, x.copy()), want, rtol=1e-14)


# (mirror: a size must exceed the offset 1, a size requirement checked at the call)
@pytest.mark.parametrize("kernel, shape", [
    (blur_clamped, (1, 1)), (blur_clamped, (1, 4)), (blur_clamped, (2, 3)),
    (blur_clamped, (3, 2)), (blur_clamped, (4, 4)),
    (blur_mirror, (2, 2)), (blur_mirror, (2, 4)), (blur_mirror, (3, 2)), (blur_mirror, (4, 4)),
    (blur_zero, (1, 1)), (blur_zero, (2, 3)), (blur_zero, (4, 4)),
    (zero_products, (1, 2)), (zero_products, (3, 3))],
    ids=lambda v: _NAMES.get(id(v), "") if hasattr(v, "ir") else "x".join(map(str, v)))
def test_border_piece_gradient_matches_finite_differences(kernel, shape):
    rng = np.random.default_rng(sum(shape))
    args = dict(x=rng.standard_normal(shape), f=rng.standard_normal((3, 3)),
                y=rng.standard_normal(shape))
    check_against_fd(kernel, ["x", "f"], args, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("shape", [(1, 1, 1), (1, 2, 3), (2, 2, 2), (4, 3, 1), (3, 4, 4)])
def test_3d_border_piece_gradient_matches_finite_differences(shape):
    rng = np.random.default_rng(sum(shape))
    args = dict(x=rng.standard_normal(shape), y=rng.standard_normal(shape))
    check_against_fd(stencil7, "x", args, rtol=1e-6, atol=1e-7)


def test_coarse_split_interior_stays_a_vector_loop_and_the_border_takes_no_atomics():
    """The interior of a coarse-split stencil gradient is a loop over plain indices under
    'omp simd' (the border's min/max stays out of it)."""
    src = pa.grad(blur_clamped, wrt="x").source
    lines = src.splitlines()
    inner = [k for k, line in enumerate(lines)
             if line.strip().startswith("#pragma omp") and "simd" in line]
    assert inner, src
    bodies = ["\n".join(lines[k + 1:k + 4]) for k in inner]
    assert any("pa_max" not in b and "pa_min" not in b for b in bodies), src
    # the border's scatter d_x[max(0, min(m + a - 1, M - 1)), ...] += runs in its own
    # nest after the gathered interior, sequential (thin), not with atomic updates
    assert "atomic" not in src and "pa_max_i64(0, pa_min_i64(m + a - 1" in src, src


ASAN_SCRIPT = textwrap.dedent('''
    import numpy as np
    import polyad as pa
    from polyad.testing import interpret
    import test_border_pieces as t

    rng = np.random.default_rng(0)
    for kernel, shapes in [(t.blur_clamped, [(1, 1), (1, 3), (2, 2), (4, 3)]),
                           (t.blur_mirror, [(2, 2), (2, 4), (4, 3)]),
                           (t.blur_zero, [(1, 1), (2, 3), (4, 4)]),
                           (t.zero_products, [(1, 2), (3, 3)])]:
        grad = pa.grad(kernel, wrt=["x", "f"])
        c = pa.compile(grad, sanitize="address")
        for shape in shapes:
            x, f, y = rng.standard_normal(shape), rng.standard_normal((3, 3)), rng.standard_normal(shape)
            dx, df = c(x.copy(), f.copy(), y)
            _, want = interpret(grad.ir, dict(x=x.copy(), f=f.copy(), y=y),
                                dict(M=shape[0], N=shape[1]))
            np.testing.assert_allclose(dx, want["d_x"], rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(df, want["d_f"], rtol=1e-12, atol=1e-12)
    c = pa.compile(pa.grad(t.stencil7, wrt="x"), sanitize="address")
    for shape in [(1, 1, 1), (2, 1, 3), (4, 4, 2)]:
        c(rng.standard_normal(shape), rng.standard_normal(shape))
    print("ASAN-SCRIPT-OK")
''')


def test_border_pieces_under_asan(tmp_path, repo_root):
    asan = Options(sanitize="address")
    prebuilt = [(pa.grad(k, wrt=wrt), asan)
                for k, wrt in [(blur_clamped, ["x", "f"]), (blur_mirror, ["x", "f"]),
                               (blur_zero, ["x", "f"]), (zero_products, ["x", "f"]),
                               (stencil7, "x")]]
    run_script_under_asan(tmp_path, repo_root, ASAN_SCRIPT, "ASAN-SCRIPT-OK", prebuilt)


def test_only_interior_sums_get_lanes():
    """Per-lane partial sums pay on the interior's rows: a border piece's sums along a row
    run on a face of the domain (a dimension fewer iterations), where lanes would add code
    (and compile time: energy27's filter-gradient nest, gcc 0.32 -> 0.26 s), not speed."""
    from polyad.pipeline import artifact_of

    art = artifact_of(pa.grad(energy27, wrt=["u", "w"]), Options())

    def border_only(lp):
        return all(art.scheduled.statement(n).on_border for n in lp.facts.statements)

    sums = [lp for lp in art.plan.loops.values() if "d_w" in lp.facts.scatters]
    assert any(lp.lane_sums for lp in sums)
    assert not any(lp.lane_sums and border_only(lp) for lp in sums)
    assert any(border_only(lp) and not lp.lane_sums for lp in sums)
