"""``schedule.simplify``: algebraic simplification of substituted statements before emission.

Each rule is checked on IR directly (what it rewrites and what it must leave
alone), then on the generated C of real gradients (the clamped TV gradient's
border code, the deconvolution adjoint's interleaved updates), which are run
against the reference interpreter, NaN and infinity included.
"""

import re

import numpy as np
import pytest

import polyad as pa
from polyad import ir
from polyad.schedule.merge import MergedUpdate, merge_updates
from polyad.schedule.simplify import simplify_expr, simplify_run
from polyad.testing import interpret

from tv_kernel import tv_cost

M, N = pa.sizes("M N")

I = ir.LoopVar("i")
G0 = ir.Load("g", (ir.Const(0, ir.i64),))
G1 = ir.Load("g", (ir.Const(1, ir.i64),))
LAM = ir.ScalarRef("lam")


def f64(v):
    return ir.Const(float(v), ir.f64)


def mul(a, b, dt=ir.f64):
    return ir.Binary("*", a, b, dt)


def sub(a, b, dt=ir.f64):
    return ir.Binary("-", a, b, dt)


def add(a, b, dt=ir.f64):
    return ir.Binary("+", a, b, dt)


def sign(a):
    return ir.Call("sign", (a,), ir.f64)


def st(name, target, op, expr, guard=None):
    return ir.Statement(name, (), (0,), (), guard, target, op, expr)


def test_sign_of_a_difference_of_one_element_with_itself_is_zero_and_kills_its_product():
    term = mul(LAM, sign(sub(G0, G0)))
    assert simplify_expr(term) == f64(0)
    assert simplify_expr(add(mul(LAM, sign(sub(G0, G1))), term)) == mul(LAM, sign(sub(G0, G1)))
    # a bare a - a is not folded: it is NaN for an infinite a
    assert simplify_expr(sub(G0, G0)) == sub(G0, G0)
    assert simplify_expr(ir.Call("abs", (sub(G0, G0),), ir.f64)) == ir.Call("abs", (sub(G0, G0),), ir.f64)
    # different elements stay
    assert simplify_expr(sign(sub(G0, G1))) == sign(sub(G0, G1))
    # a device function that happens to be called ``sign`` is not the intrinsic
    assert simplify_expr(sign(sub(G0, G0)), frozenset({"sign"})) == sign(sub(G0, G0))


def test_constants_fold_in_the_operations_own_type():
    assert simplify_expr(mul(f64(2), f64(0.1))) == f64(2 * 0.1)
    third = ir.Binary("/", ir.Const(1.0, ir.f32), ir.Const(3.0, ir.f32), ir.f32)
    folded = simplify_expr(third)
    assert folded.dtype == ir.f32 and folded.value == float(np.float32(1) / np.float32(3))
    assert simplify_expr(ir.Unary("neg", f64(2), ir.f64)) == f64(-2)
    assert simplify_expr(ir.Unary("neg", ir.Unary("neg", G0, ir.f64), ir.f64)) == G0
    assert simplify_expr(sign(f64(-3))) == f64(-1)
    assert simplify_expr(ir.Select(ir.Const(1, ir.boolean), G0, G1, ir.f64)) == G0
    # not folded: a non-finite result, a division by zero, mixed types
    assert simplify_expr(ir.Binary("/", f64(1), f64(0), ir.f64)).op == "/"
    assert simplify_expr(mul(f64(1e300), f64(1e300))).op == "*"
    mixed = ir.Binary("+", ir.Const(1.0, ir.f32), f64(2), ir.f64)
    assert simplify_expr(mixed) == mixed


def test_neutral_elements_and_symbolic_zeros():
    assert simplify_expr(add(G0, f64(0))) == G0
    assert simplify_expr(add(f64(0), G0)) == G0
    assert simplify_expr(sub(G0, f64(0))) == G0
    assert simplify_expr(sub(f64(0), G0)) == ir.Unary("neg", G0, ir.f64)
    assert simplify_expr(sub(f64(0), f64(2))) == f64(-2)  # the new negation folds too
    assert simplify_expr(mul(f64(0), G0)) == f64(0)
    assert simplify_expr(ir.Binary("/", f64(0), G0, ir.f64)) == f64(0)
    g32 = ir.Load("h", (I,), ir.f32)
    assert simplify_expr(ir.Binary("+", g32, ir.Const(0.0, ir.f64), ir.f64)) == ir.Cast(g32, ir.f64)


def test_updates_that_add_zero_are_dropped():
    x = ir.Load("x", (I,))
    keep = st("S0", x, "+=", G1)
    run = [st("S1", x, "+=", mul(LAM, sign(sub(G0, G0)))), keep,
           st("S2", x, "-=", mul(f64(0), G1))]
    assert simplify_run(run) == [keep]
    assign = st("S3", x, "=", mul(f64(0), G1))  # an assignment of zero still assigns
    assert simplify_run([assign])[0].expr == f64(0)


def test_updates_of_one_element_are_grouped_when_the_statements_between_commute():
    x, y = ir.Load("x", (I,)), ir.Load("y", (I,))
    a, b = ir.Load("a", (I,)), ir.Load("b", (I,))
    s0, s1, s2 = st("S0", x, "+=", a), st("S1", y, "+=", a), st("S2", x, "+=", b)
    assert simplify_run([s0, s1, s2]) == [s0, s2, s1]
    (merged, other) = merge_updates(simplify_run([s0, s1, s2]))
    assert isinstance(merged, MergedUpdate) and merged.statements == (s0, s2) and other == s1
    # S1 reads x (the partial sum after S0): S2 may not move above it
    reads_x = st("S1", y, "+=", ir.Load("x", (I,)))
    assert simplify_run([s0, reads_x, s2]) == [s0, reads_x, s2]
    # S2 reads y, which S1 writes
    reads_y = st("S2", x, "+=", ir.Load("y", (I,)))
    assert simplify_run([s0, s1, reads_y]) == [s0, s1, reads_y]
    # another element of x between them: same array, order kept
    x1 = st("S1", ir.Load("x", (ir.Const(1, ir.i64),)), "+=", a)
    assert simplify_run([s0, x1, s2]) == [s0, x1, s2]
    # a scalar written between them and read by the moved update
    r = ir.ScalarRef("r")
    set_r, uses_r = st("S1", r, "=", a), st("S2", x, "+=", r)
    assert simplify_run([s0, set_r, uses_r]) == [s0, set_r, uses_r]
    # atomic and guarded statements stay where they are
    assert simplify_run([s0, s1, s2], atomic=frozenset({"S2"})) == [s0, s1, s2]
    assert simplify_run([s0, s1, s2], atomic=frozenset({"S1"})) == [s0, s1, s2]
    guarded = st("S2", x, "+=", b, guard=ir.Binary(">", b, f64(0), ir.boolean))
    assert simplify_run([s0, s1, guarded]) == [s0, s1, guarded]


SIGN_OF_SELF = re.compile(r"pa_sign_f64\((g\[[^\]]*\]) - \1\)")


def test_clamped_tv_gradient_has_no_sign_of_a_pixel_minus_itself():
    grad = pa.grad(tv_cost, wrt="g")
    src = grad.source
    assert "pa_sign_f64(g[0] - g[1])" in src  # the pattern below would see real terms
    assert not SIGN_OF_SELF.search(src), SIGN_OF_SELF.search(src).group(0)
    rng = np.random.default_rng(3)
    for shape in [(1, 1), (1, 4), (4, 1), (2, 2), (3, 5), (6, 7)]:
        g, b = rng.standard_normal(shape), rng.standard_normal(shape)
        g[0, -1] = g[0, -2] if shape[1] > 1 else g[0, -1]  # an exact tie: sign(0) = 0
        _, want = interpret(grad.ir, dict(g=g.copy(), b=b, lam=0.3),
                            dict(M=shape[0], N=shape[1]))
        np.testing.assert_allclose(grad(g, b, 0.3), want["d_g"], rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("special", [np.inf, -np.inf, np.nan])
def test_simplified_tv_gradient_propagates_infinities_and_nans_as_the_interpreter(special):
    grad = pa.grad(tv_cost, wrt="g")
    rng = np.random.default_rng(4)
    g, b = rng.standard_normal((4, 5)), rng.standard_normal((4, 5))
    for pos in [(0, 0), (0, 4), (3, 0), (2, 2)]:
        g[pos] = special
    _, want = interpret(grad.ir, dict(g=g.copy(), b=b, lam=0.5), dict(M=4, N=5))
    np.testing.assert_array_equal(grad(g, b, 0.5), want["d_g"])


@pa.kernel
def blur_cost(x: pa.f64[M, N].clamped, f: pa.f64[3], y: pa.f64[M, N]) -> pa.f64:
    C = 0.0
    for m in range(M):
        for n in range(N):
            r = f[0] * x[m, n - 1] + f[1] * x[m, n] + f[2] * x[m, n + 1] - y[m, n]
            C += r * r
    return C


def test_adjoint_terms_of_one_element_merge_across_filter_updates():
    """The gradient wrt x and f interleaves ``d_x[i] += ...`` with ``d_f[k] += ...``;
    grouped, the interior updates d_x once per element."""
    grad = pa.grad(blur_cost, wrt=["x", "f"])
    lines = grad.source.splitlines()
    interior = [k for k, line in enumerate(lines) if "#pragma omp" in line and "simd" in line
                and "for (int64_t n = 1; n < (N - 1); n++)" in lines[k + 1]]
    assert interior, grad.source

    def body_at(k):
        body = []
        for line in lines[k + 2:]:
            if line.strip() == "}":
                break
            body.append(line.strip())
        return body

    # the interior loop that updates d_x (the recomputed residual's loop is a vector loop too)
    (body,) = [b for b in map(body_at, interior) if any(ln.startswith("d_x[") for ln in b)]
    heads = [line for line in body if line.startswith("d_x[")]
    assert len(heads) == 1 and heads[0].startswith(("d_x[m * N + n] = ", "d_x[m * N + n] += ")), body
    assert sum(line.startswith("+ ") for line in body) == 2  # the other two terms
    rng = np.random.default_rng(5)
    for shape in [(1, 1), (2, 3), (5, 8)]:
        x, y, f = rng.standard_normal(shape), rng.standard_normal(shape), rng.standard_normal(3)
        _, want = interpret(grad.ir, dict(x=x.copy(), f=f.copy(), y=y),
                            dict(M=shape[0], N=shape[1]))
        dx, df = grad(x, f, y)
        np.testing.assert_allclose(dx, want["d_x"], rtol=1e-13, atol=1e-14)
        np.testing.assert_allclose(df, want["d_f"], rtol=1e-13, atol=1e-14)


def _reads_scalar(kernel: ir.Kernel, name: str) -> bool:
    return any(isinstance(x, ir.ScalarRef) and x.name == name
               for st in kernel.statements for x in ir.walk_many(st.exprs()))


@pa.kernel
def scaled_cost(x: pa.f64[M]) -> pa.f64:
    C = 0.0
    for i in range(M):
        C += x[i] * x[i]
    C = C * 3.0
    return C


def test_the_gradient_seed_of_one_leaves_no_multiplication_by_the_results_adjoint():
    """``d_C = 1`` is never written again in the TV gradient: its terms lose ``d_C * ``
    (exact, x * 1 = x), and no loop nest takes ``d_C`` as a parameter."""
    for derived in (pa.grad(tv_cost, wrt="g"), pa.value_and_grad(tv_cost, wrt="g")):
        assert not _reads_scalar(derived.ir, "d_C")
        assert "d_C" not in derived.source
        assert "lam * pa_sign_f64(g[0] - g[1])" in derived.source
    vjp = pa.vjp(tv_cost, wrt="g")  # the cotangent is an input there: it stays a factor
    assert _reads_scalar(vjp.ir, "result_bar")
    rng = np.random.default_rng(6)
    g, b = rng.standard_normal((5, 4)), rng.standard_normal((5, 4))
    _, want = interpret(vjp.ir, dict(g=g.copy(), b=b, lam=0.3, result_bar=1.0), dict(M=5, N=4))
    np.testing.assert_array_equal(pa.grad(tv_cost, wrt="g")(g, b, 0.3), want["d_g"])


def test_a_results_adjoint_written_again_is_not_taken_for_a_constant():
    """``C = C * 3`` makes the reverse sweep scale ``d_C``: it stays a variable."""
    grad = pa.grad(scaled_cost, wrt="x")
    assert _reads_scalar(grad.ir, "d_C")
    x = np.random.default_rng(7).standard_normal(6)
    np.testing.assert_allclose(grad(x), 6.0 * x, rtol=1e-14)


@pa.kernel
def signs(x: pa.f64[N], y: pa.Out(pa.f64[N])):
    for n in range(N):
        y[n] = pa.sign(x[n])


def test_the_sign_helper_subtracts_two_converted_comparisons():
    """``(double)(x > 0) - (double)(x < 0)``: each comparison is a lane mask gcc turns into
    1.0 or 0.0 with an ``and``; the difference of two ints converted once went through
    int32 lanes and conversions (the f64 TV gradient ran ~10 % slower). Same values: 0 for
    NaN and both zeros (+0.0 either way), +-1 otherwise."""
    src = signs.source
    assert "return (double)(x > 0) - (double)(x < 0);" in src
    x = np.array([np.nan, 0.0, -0.0, 2.5, -3.0, np.inf, -np.inf, 1e-310])
    got = signs(x)
    np.testing.assert_array_equal(got, [0.0, 0.0, 0.0, 1.0, -1.0, 1.0, -1.0, 1.0])
    assert not np.signbit(got[:3]).any()
    _, want = interpret(signs.ir, dict(x=x), dict(N=len(x)))
    np.testing.assert_array_equal(got, want["y"])


def test_integer_division_and_modulo_of_constants_fold_as_python_does():
    """Index expressions after the emitter substitutes constants (a row buffer's slot
    ``(3 % 5 + 5) % 5``): ``//`` and ``%`` of integer constants fold with the IR's
    (Python's, flooring) meaning; division by zero and float operands stay."""
    from polyad.ir import Binary, Const, f64, fold_integer_constants, i64

    def fold(op, a, b, dt=i64):
        return fold_integer_constants(Binary(op, Const(a, dt), Const(b, dt), dt))

    assert fold("%", -3, 5) == Const(2, i64) and fold("//", -3, 5) == Const(-1, i64)
    assert fold("%", 8, 5) == Const(3, i64) and fold("//", 8, -5) == Const(-2, i64)
    slot = Binary("+", Binary("%", Const(3, i64), Const(5, i64), i64), Const(5, i64), i64)
    assert fold_integer_constants(Binary("%", slot, Const(5, i64), i64)) == Const(3, i64)
    assert isinstance(fold("%", 3, 0), Binary) and isinstance(fold("//", 3.0, 2.0, f64), Binary)
