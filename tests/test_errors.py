"""Errors: DSLError at definition time (with exact file:line:col), BoundsError at
compile time, and argument errors at call time (before any C runs).

Line numbers are found robustly: the offending line carries a trailing marker
comment ``# <<name`` and ``_line_of("name")`` searches this file for it.
"""

import os

import numpy as np
import pytest

import polyad as pa

M, N = pa.sizes("M N")
(K,) = pa.sizes("K")

_THIS_FILE = os.path.abspath(__file__)
with open(_THIS_FILE) as _f:
    _SOURCE_LINES = _f.read().splitlines()


def _line_of(name):
    tag = "# <<" + name
    hits = [k + 1 for k, text in enumerate(_SOURCE_LINES) if text.rstrip().endswith(tag)]
    assert len(hits) == 1, f"marker {tag!r} found {len(hits)} times"
    return hits[0]


def _check_dsl_error(excinfo, name):
    e = excinfo.value
    assert isinstance(e, pa.DSLError) and isinstance(e, pa.PolyadError)
    assert e.line == _line_of(name), f"{name}: reported line {e.line}, expected {_line_of(name)}\n{e}"
    assert os.path.basename(e.filename) == os.path.basename(_THIS_FILE)
    assert os.path.realpath(e.filename) == os.path.realpath(_THIS_FILE)
    assert isinstance(e.col, int) and e.col >= 0
    assert str(e).startswith(f"{e.filename}:{e.line}:{e.col}: "), str(e)
    assert e.hint is None or isinstance(e.hint, str)


def plain_python_helper(v):
    return v + 1.0


# ---------------------------------------------------------------------------
# Error hierarchy
# ---------------------------------------------------------------------------


def test_error_hierarchy():
    for cls in (pa.DSLError, pa.BoundsError, pa.ArgumentError, pa.DTypeError, pa.ShapeError):
        assert issubclass(cls, pa.PolyadError)
    assert issubclass(pa.BoundsError, pa.DSLError)
    assert issubclass(pa.DTypeError, pa.ArgumentError) and issubclass(pa.DTypeError, TypeError)
    assert issubclass(pa.ShapeError, pa.ArgumentError) and issubclass(pa.ShapeError, ValueError)


# ---------------------------------------------------------------------------
# DSLError at definition time, one per unsupported construct
# ---------------------------------------------------------------------------


def test_break():
    with pytest.raises(pa.DSLError) as ei:
        @pa.kernel
        def k(x: pa.f64[N]):
            for i in range(N):
                if x[i] > 0.0:
                    break  # <<break
                x[i] = 1.0
    _check_dsl_error(ei, "break")


def test_continue():
    with pytest.raises(pa.DSLError) as ei:
        @pa.kernel
        def k(x: pa.f64[N]):
            for i in range(N):
                if x[i] > 0.0:
                    continue  # <<continue
                x[i] = 1.0
    _check_dsl_error(ei, "continue")


def test_while():
    with pytest.raises(pa.DSLError) as ei:
        @pa.kernel
        def k(x: pa.f64[N]) -> pa.f64:
            s = 0.0
            while s < x[0]:  # <<while
                s += 1.0
            return s
    _check_dsl_error(ei, "while")


def test_try():
    with pytest.raises(pa.DSLError) as ei:
        @pa.kernel
        def k(x: pa.f64[N]):
            for i in range(N):
                try:  # <<try
                    x[i] = 1.0
                except Exception:
                    x[i] = 0.0
    _check_dsl_error(ei, "try")


def test_with():
    with pytest.raises(pa.DSLError) as ei:
        @pa.kernel
        def k(x: pa.f64[N]):
            with open("somefile") as fh:  # <<with
                x[0] = 1.0
    _check_dsl_error(ei, "with")


def test_lambda():
    with pytest.raises(pa.DSLError) as ei:
        @pa.kernel
        def k(x: pa.f64[N]):
            for i in range(N):
                x[i] = (lambda t: 2.0 * t)(x[i])  # <<lambda
    _check_dsl_error(ei, "lambda")


def test_list_literal():
    with pytest.raises(pa.DSLError) as ei:
        @pa.kernel
        def k(x: pa.f64[N], y: pa.Out(pa.f64[N])):
            w = [0.25, 0.5, 0.25]  # <<list
            for i in range(N):
                y[i] = w[1] * x[i]
    _check_dsl_error(ei, "list")


def test_dict_literal():
    with pytest.raises(pa.DSLError) as ei:
        @pa.kernel
        def k(x: pa.f64[N], y: pa.Out(pa.f64[N])):
            for i in range(N):
                d = {"a": 2.0}  # <<dict
                y[i] = x[i]
    _check_dsl_error(ei, "dict")


def test_unknown_name():
    with pytest.raises(pa.DSLError) as ei:
        @pa.kernel
        def k(x: pa.f64[N], y: pa.Out(pa.f64[N])):
            for i in range(N):
                y[i] = x[i] + undefined_name_xyz  # <<unknown-name
    _check_dsl_error(ei, "unknown-name")
    assert "undefined_name_xyz" in str(ei.value)


def test_unknown_function_python_helper():
    with pytest.raises(pa.DSLError) as ei:
        @pa.kernel
        def k(x: pa.f64[N], y: pa.Out(pa.f64[N])):
            for i in range(N):
                y[i] = plain_python_helper(x[i])  # <<plain-helper
    _check_dsl_error(ei, "plain-helper")


def test_unknown_function_builtin():
    with pytest.raises(pa.DSLError) as ei:
        @pa.kernel
        def k(x: pa.f64[N]):
            for i in range(N):
                print(x[i])  # <<print
    _check_dsl_error(ei, "print")


def test_unknown_function_numpy():
    with pytest.raises(pa.DSLError) as ei:
        @pa.kernel
        def k(x: pa.f64[N], y: pa.Out(pa.f64[N])):
            for i in range(N):
                y[i] = np.exp(x[i])  # <<np-exp
    _check_dsl_error(ei, "np-exp")


def test_recursion():
    with pytest.raises(pa.DSLError) as ei:
        @pa.func
        def fact(n: pa.f64) -> pa.f64:
            if n <= 1.0:
                return 1.0
            return n * fact(n - 1.0)  # <<recursion

        @pa.kernel
        def k(x: pa.f64[N], y: pa.Out(pa.f64[N])):
            for i in range(N):
                y[i] = fact(x[i])
    _check_dsl_error(ei, "recursion")


def test_non_affine_loop_bound():
    with pytest.raises(pa.DSLError) as ei:
        @pa.kernel
        def k(x: pa.f64[N], y: pa.Out(pa.f64[N])):
            for i in range(N):
                y[i] = 0.0
                for j in range(int(x[0])):  # <<loop-bound
                    y[i] += 1.0
    _check_dsl_error(ei, "loop-bound")


def test_non_affine_loop_bound_product():
    with pytest.raises(pa.DSLError) as ei:
        @pa.kernel
        def k(x: pa.f64[N], y: pa.Out(pa.f64[N])):
            for i in range(N):
                y[i] = 0.0
                for j in range(i * i):  # <<loop-bound-product
                    y[i] += 1.0
    _check_dsl_error(ei, "loop-bound-product")


def test_non_affine_index_indirect():
    with pytest.raises(pa.DSLError) as ei:
        @pa.kernel
        def k(x: pa.f64[N], idx: pa.i32[N], y: pa.Out(pa.f64[N])):
            for i in range(N):
                y[i] = x[idx[i]]  # <<indirect
    _check_dsl_error(ei, "indirect")


def test_non_affine_index_product():
    with pytest.raises(pa.DSLError) as ei:
        @pa.kernel
        def k(x: pa.f64[N].clamped, y: pa.Out(pa.f64[N])):
            for i in range(N):
                y[i] = x[i * i]  # <<index-product
    _check_dsl_error(ei, "index-product")


def test_return_inside_loop():
    with pytest.raises(pa.DSLError) as ei:
        @pa.kernel
        def k(x: pa.f64[N]) -> pa.f64:
            for i in range(N):
                return x[i]  # <<return-in-loop
            return 0.0
    _check_dsl_error(ei, "return-in-loop")


def test_assign_to_loop_variable():
    with pytest.raises(pa.DSLError) as ei:
        @pa.kernel
        def k(x: pa.f64[N]):
            for i in range(N):
                x[i] = 1.0
                i = i + 1  # <<assign-loop-var
    _check_dsl_error(ei, "assign-loop-var")


def test_augassign_to_loop_variable():
    with pytest.raises(pa.DSLError) as ei:
        @pa.kernel
        def k(x: pa.f64[M, N]):
            for m in range(M):
                for n in range(N):
                    m += 1  # <<augassign-loop-var
                    x[m, n] = 1.0
    _check_dsl_error(ei, "augassign-loop-var")


def test_too_many_indices():
    with pytest.raises(pa.DSLError) as ei:
        @pa.kernel
        def k(x: pa.f64[N], y: pa.Out(pa.f64[N])):
            for i in range(N):
                y[i] = x[i, i]  # <<too-many-indices
    _check_dsl_error(ei, "too-many-indices")


def test_too_few_indices():
    with pytest.raises(pa.DSLError) as ei:
        @pa.kernel
        def k(A: pa.f64[M, N], y: pa.Out(pa.f64[M])):
            for m in range(M):
                y[m] = A[m]  # <<too-few-indices
    _check_dsl_error(ei, "too-few-indices")


def test_nested_function_definition():
    with pytest.raises(pa.DSLError) as ei:
        @pa.kernel
        def k(x: pa.f64[N], y: pa.Out(pa.f64[N])):
            def inner(v):  # <<nested-def
                return v
            for i in range(N):
                y[i] = x[i]
    _check_dsl_error(ei, "nested-def")


def test_error_in_second_statement_points_at_it():
    # the first (valid) statements must not shift the reported position
    with pytest.raises(pa.DSLError) as ei:
        @pa.kernel
        def k(x: pa.f64[N], y: pa.Out(pa.f64[N])):
            for i in range(N):
                y[i] = x[i]
            for i in range(N):
                y[i] = y[i] + another_undefined_name  # <<second-stmt
    _check_dsl_error(ei, "second-stmt")


# ---------------------------------------------------------------------------
# BoundsError at compile time
# ---------------------------------------------------------------------------


def _assert_bounds_message(e, array):
    msg = str(e)
    assert f"{array}[" in msg, msg  # names the access
    assert any(m in msg for m in ("clamped", "circular", "mirror", "zero")), msg  # suggests a mode


def test_bounds_error_on_compile():
    @pa.kernel  # definition is fine: bounds are checked when compiling
    def shift_left(x: pa.f64[N], y: pa.Out(pa.f64[N])):
        for i in range(N):
            y[i] = x[i + 1]  # <<oob-shift

    with pytest.raises(pa.BoundsError) as ei:
        pa.compile(shift_left)
    e = ei.value
    assert isinstance(e, pa.DSLError)
    assert e.line == _line_of("oob-shift")
    _assert_bounds_message(e, "x")


def test_bounds_error_on_first_call():
    @pa.kernel
    def shift_left_call(x: pa.f64[N], y: pa.Out(pa.f64[N])):
        for i in range(N):
            y[i] = x[i + 1]  # <<oob-shift-call

    y = np.zeros(5)
    with pytest.raises(pa.BoundsError) as ei:
        shift_left_call(np.ones(5), y)
    assert ei.value.line == _line_of("oob-shift-call")
    _assert_bounds_message(ei.value, "x")
    assert not y.any()


def test_no_bounds_error_when_loop_is_shorter(rng):
    @pa.kernel
    def shift_left_ok(x: pa.f64[N], y: pa.Out(pa.f64[N])):
        for i in range(N - 1):
            y[i] = x[i + 1]

    pa.compile(shift_left_ok)
    x = rng.standard_normal(6)
    y = np.zeros(6)
    shift_left_ok(x, y)
    np.testing.assert_array_equal(y, np.concatenate([x[1:], [0.0]]))


def test_bounds_error_negative_index():
    @pa.kernel
    def shift_right(x: pa.f64[M, N], y: pa.Out(pa.f64[M, N])):
        for m in range(M):
            for n in range(N):
                y[m, n] = x[m, n - 1]  # <<oob-negative

    with pytest.raises(pa.BoundsError) as ei:
        pa.compile(shift_right)
    assert ei.value.line == _line_of("oob-negative")
    _assert_bounds_message(ei.value, "x")


def test_bounds_error_on_write():
    @pa.kernel
    def write_past_end(x: pa.f64[N], y: pa.Out(pa.f64[N])):
        for i in range(N):
            y[i + 1] = x[i]  # <<oob-write

    with pytest.raises(pa.BoundsError) as ei:
        pa.compile(write_past_end)
    assert ei.value.line == _line_of("oob-write")
    _assert_bounds_message(ei.value, "y")


def test_bounds_error_index_transform():
    @pa.kernel
    def bad_transform(x: pa.f64[2 * K + 18, 4 * N], y: pa.Out(pa.f64[K, N])):
        for k in range(K):
            for n in range(N):
                y[k, n] = x[2 * k + 20, 4 * n]  # <<oob-transform

    with pytest.raises(pa.BoundsError) as ei:
        pa.compile(bad_transform)
    assert ei.value.line == _line_of("oob-transform")
    _assert_bounds_message(ei.value, "x")


def test_bounds_error_only_unchecked_array_named():
    @pa.kernel
    def half_checked(x: pa.f64[N].clamped, w: pa.f64[N], y: pa.Out(pa.f64[N])):
        for i in range(N):
            y[i] = x[i + 3] + w[i - 2]  # <<oob-half

    with pytest.raises(pa.BoundsError) as ei:
        pa.compile(half_checked)
    assert ei.value.line == _line_of("oob-half")
    _assert_bounds_message(ei.value, "w")


# ---------------------------------------------------------------------------
# Call-time argument errors (raised before any C code runs)
# ---------------------------------------------------------------------------


@pa.kernel
def add_into(x: pa.f64[N], w: pa.f64[N]):
    for i in range(N):
        x[i] = x[i] + w[i]


@pa.kernel
def add_into_2d(x: pa.f64[M, N], w: pa.f64[M, N]):
    for m in range(M):
        for n in range(N):
            x[m, n] = x[m, n] + w[m, n]


@pa.kernel
def copy_out(x: pa.f64[N], y: pa.Out(pa.f64[N])):
    for i in range(N):
        y[i] = x[i]


@pa.kernel
def odd_extent(x: pa.f64[2 * N + 1], y: pa.Out(pa.f64[N])):
    for i in range(N):
        y[i] = x[2 * i + 1]


@pa.kernel
def scaled_by_size(x: pa.f64[N]):
    for i in range(N):
        x[i] = x[i] * float(K)


def test_add_into_works(rng):
    x0, w = rng.standard_normal((2, 5))
    x = x0.copy()
    assert add_into(x, w) is None
    np.testing.assert_allclose(x, x0 + w)


def _unchanged_after(exc, call, x):
    before = x.copy()
    with pytest.raises(exc):
        call()
    np.testing.assert_array_equal(x, before)


def test_dtype_float32_for_f64(rng):
    x = rng.standard_normal(5)
    w = np.ones(5, dtype=np.float32)
    _unchanged_after(pa.DTypeError, lambda: add_into(x, w), x)
    with pytest.raises(TypeError):
        add_into(x, w)
    with pytest.raises(pa.ArgumentError):
        add_into(x, w)


def test_dtype_integer_array_for_f64(rng):
    x = rng.standard_normal(5)
    _unchanged_after(pa.DTypeError, lambda: add_into(x, np.ones(5, dtype=np.int64)), x)


def test_dtype_inout_array_not_converted(rng):
    x = rng.standard_normal(5).astype(np.float32)
    _unchanged_after(pa.DTypeError, lambda: add_into(x, np.ones(5)), x)


def test_non_array_for_array_param(rng):
    x = rng.standard_normal(5)
    _unchanged_after(pa.DTypeError, lambda: add_into(x, [1.0, 1.0, 1.0, 1.0, 1.0]), x)
    _unchanged_after(pa.DTypeError, lambda: add_into(x, 3.0), x)


def test_shape_wrong_ndim(rng):
    x = rng.standard_normal(6)
    _unchanged_after(pa.ShapeError, lambda: add_into(x, np.ones((2, 3))), x)
    x2 = rng.standard_normal((2, 3))
    _unchanged_after(pa.ShapeError, lambda: add_into_2d(x2, np.ones(6)), x2)


def test_shape_inconsistent_sizes(rng):
    x = rng.standard_normal(4)
    _unchanged_after(pa.ShapeError, lambda: add_into(x, np.ones(5)), x)
    with pytest.raises(ValueError):
        add_into(x, np.ones(5))
    x2 = rng.standard_normal((3, 4))
    _unchanged_after(pa.ShapeError, lambda: add_into_2d(x2, np.ones((3, 5))), x2)
    _unchanged_after(pa.ShapeError, lambda: add_into_2d(x2, np.ones((4, 3))), x2)


def test_shape_inconsistent_affine_extent(rng):
    y = np.zeros(4)
    _unchanged_after(pa.ShapeError, lambda: odd_extent(np.ones(10), y), y)  # 2*4 + 1 != 10
    y2 = np.zeros(4)
    _unchanged_after(pa.ShapeError, lambda: odd_extent(np.ones(8), y2), y2)  # 8 is even
    y = np.zeros(4)
    x = rng.standard_normal(9)
    odd_extent(x, y)  # consistent: fine
    np.testing.assert_array_equal(y, x[1::2])


def test_shape_non_contiguous(rng):
    x = rng.standard_normal(5)
    w_big = rng.standard_normal(10)
    _unchanged_after(pa.ShapeError, lambda: add_into(x, w_big[::2]), x)
    x2 = rng.standard_normal((3, 4))
    a = rng.standard_normal((3, 8))
    _unchanged_after(pa.ShapeError, lambda: add_into_2d(x2, a[:, ::2]), x2)
    b = rng.standard_normal((4, 3))
    _unchanged_after(pa.ShapeError, lambda: add_into_2d(x2, b.T), x2)
    # a non-contiguous in-out array is rejected too (no silent copy)
    big = rng.standard_normal((3, 8))
    view = big[:, ::2]
    _unchanged_after(pa.ShapeError, lambda: add_into_2d(view, np.ones((3, 4))), big)


def test_shape_out_aliases_input(rng):
    x = rng.standard_normal(6)
    _unchanged_after(pa.ShapeError, lambda: copy_out(x, x), x)
    _unchanged_after(pa.ShapeError, lambda: copy_out(x, y=x), x)
    buf = rng.standard_normal(9)
    # partially overlapping views of one buffer
    _unchanged_after(pa.ShapeError, lambda: copy_out(buf[:6], buf[3:9]), buf)


def test_out_array_wrong_dtype_or_shape(rng):
    x = rng.standard_normal(6)
    y32 = np.zeros(6, dtype=np.float32)
    _unchanged_after(pa.DTypeError, lambda: copy_out(x, y32), y32)
    y5 = np.zeros(5)
    _unchanged_after(pa.ShapeError, lambda: copy_out(x, y5), y5)
    y2d = np.zeros((2, 3))
    _unchanged_after(pa.ShapeError, lambda: copy_out(x, y=y2d), y2d)


def test_missing_argument(rng):
    x = rng.standard_normal(5)
    _unchanged_after(pa.ArgumentError, lambda: add_into(x), x)


def test_unknown_keyword(rng):
    x = rng.standard_normal(5)
    _unchanged_after(pa.ArgumentError, lambda: add_into(x, np.ones(5), bogus=1), x)


def test_too_many_positional(rng):
    x = rng.standard_normal(5)
    _unchanged_after(pa.ArgumentError, lambda: add_into(x, np.ones(5), np.ones(5)), x)


def test_missing_free_size(rng):
    x = rng.standard_normal(5)
    _unchanged_after(pa.ArgumentError, lambda: scaled_by_size(x), x)
    x0 = x.copy()
    scaled_by_size(x, K=3)
    np.testing.assert_allclose(x, 3.0 * x0)
