"""Calling compiled kernels: argument binding through the cached binding plan.

The bad-argument corpus below pins every argument check's exception type and
exact message (recorded from the loader before binding plans existed); each
call runs twice and after successful calls of the same argument pattern, so
both a freshly built plan and a cached one are checked. The rest covers
keyword calls, explicit sizes, return values, derived kernels and calls from
several threads at once.
"""

import itertools
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import polyad as pa
from binding_kernels import (N, axpy, blur2d, count_up, first_n, mixed_extents, odd_extent,
                             pad_k, ssq, ssq32, taps2d, two_outs, wrap3)

x5 = np.arange(5.0)


def _read_only(a):
    a = a.copy()
    a.flags.writeable = False
    return a


CASES = [
    ('too_many_positional', pa.ArgumentError,
     lambda: axpy(x5, x5.copy(), 1.0, 2.0),
     'axpy() takes 3 arguments, got 4'),
    ('twice', pa.ArgumentError,
     lambda: axpy(x5, x5.copy(), 1.0, y=x5.copy()),
     "axpy() got argument 'y' twice"),
    ('unknown_keyword', pa.ArgumentError,
     lambda: axpy(x5, x5.copy(), 1.0, bogus=1),
     "axpy() got an unknown argument 'bogus'; its parameters are ['x', 'y', 'a'], "
     "sizes ['N']"),
    ('missing', pa.ArgumentError,
     lambda: axpy(x5, a=1.0),
     "axpy() is missing argument 'y'"),
    ('size_not_int', pa.DTypeError,
     lambda: axpy(x5, x5.copy(), 1.0, N=5.0),
     'size N must be an integer, got 5.0'),
    ('size_bool', pa.DTypeError,
     lambda: axpy(x5, x5.copy(), 1.0, N=True),
     'size N must be an integer, got True'),
    ('not_array', pa.DTypeError,
     lambda: axpy([1.0] * 5, x5.copy(), 1.0),
     "axpy(): argument 'x' must be a numpy array of float64 with shape f64[N] (or an object "
     "implementing DLPack or the array interface), got list; convert it once: "
     "np.asarray(x, dtype=np.float64)"),
    ('not_array_out', pa.DTypeError,
     lambda: two_outs(np.ones((2, 3)), None),
     "two_outs(): argument 'lo' must be a numpy array of float64 with shape f64[M] (or an "
     "object implementing DLPack or the array interface), got NoneType"),
    ('dtype', pa.DTypeError,
     lambda: axpy(x5.astype(np.float32), x5.copy(), 1.0),
     "axpy(): argument 'x' has dtype float32, expected float64 (polyad never converts "
     'silently: pass x.astype(np.float64))'),
    ('dtype_out', pa.DTypeError,
     lambda: two_outs(np.ones((2, 3)), np.zeros(2, np.float32)),
     "two_outs(): argument 'lo' has dtype float32, expected float64 (polyad never "
     'converts silently: pass x.astype(np.float64))'),
    ('ndim', pa.ShapeError,
     lambda: axpy(np.ones((5, 1)), x5.copy(), 1.0),
     "axpy(): argument 'x' has 2 dimension(s), expected 1 (f64[N])"),
    ('ndim_2d', pa.ShapeError,
     lambda: two_outs(np.ones(6)),
     "two_outs(): argument 'x' has 1 dimension(s), expected 2 (f64[M, N])"),
    ('non_contiguous', pa.ShapeError,
     lambda: axpy(np.ones(10)[::2], x5.copy(), 1.0),
     "axpy(): argument 'x' is not C-contiguous; pass np.ascontiguousarray(x)"),
    ('non_contiguous_fortran', pa.ShapeError,
     lambda: two_outs(np.ones((3, 2)).T),
     "two_outs(): argument 'x' is not C-contiguous; pass np.ascontiguousarray(x)"),
    ('read_only_written', pa.ShapeError,
     lambda: axpy(x5, _read_only(x5), 1.0),
     "axpy(): argument 'y' is written but read-only"),
    ('shape_mismatch', pa.ShapeError,
     lambda: axpy(x5, np.ones(4), 1.0),
     "axpy(): dimension 0 of 'y' has length 4, but the kernel declares N = 5 (with N ="
     ' 5)'),
    ('shape_mismatch_2d', pa.ShapeError,
     lambda: two_outs(np.ones((2, 3)), np.zeros(2), np.zeros(4)),
     "two_outs(): dimension 0 of 'hi' has length 4, but the kernel declares N = 3 "
     '(with M = 2, N = 3)'),
    ('explicit_size_mismatch', pa.ShapeError,
     lambda: axpy(x5, x5.copy(), 1.0, N=4),
     "axpy(): dimension 0 of 'x' has length 5, but the kernel declares N = 4 (with N ="
     ' 4)'),
    ('affine_extent_even', pa.ShapeError,
     lambda: odd_extent(np.ones(8), np.zeros(4)),
     "odd_extent(): dimension 0 of 'x' has length 8, but the kernel declares 2 * N + 1"
     ' = 9 (with N = 4)'),
    ('affine_extent_wrong', pa.ShapeError,
     lambda: odd_extent(np.ones(10), np.zeros(4)),
     "odd_extent(): dimension 0 of 'x' has length 10, but the kernel declares 2 * N + "
     '1 = 9 (with N = 4)'),
    ('affine_extent_unsolvable_alone', pa.ArgumentError,
     lambda: odd_extent(np.ones(8)),
     'odd_extent(): cannot infer size(s) N from the arguments; pass them as keywords, '
     'e.g. N=...'),
    ('cannot_infer', pa.ArgumentError,
     lambda: pad_k(x5),
     'pad_k(): cannot infer size(s) K from the arguments; pass them as keywords, e.g. '
     'K=...'),
    ('negative_size', pa.ShapeError,
     lambda: pad_k(x5, K=-1),
     'pad_k(): size K = -1, but sizes must be >= 0'),
    ('explicit_size_inconsistent_out', pa.ShapeError,
     lambda: pad_k(x5, np.zeros(12), K=2),
     "pad_k(): dimension 0 of 'y' has length 12, but the kernel declares N + K = 7 "
     '(with K = 2, N = 5)'),
    ('float_scalar_str', pa.DTypeError,
     lambda: axpy(x5, x5.copy(), "1.0"),
     "axpy(): argument 'a' must be a number (float64), got str"),
    ('float_scalar_bool', pa.DTypeError,
     lambda: axpy(x5, x5.copy(), True),
     "axpy(): argument 'a' must be a number (float64), got bool"),
    ('float_scalar_array', pa.DTypeError,
     lambda: axpy(x5, x5.copy(), np.ones(1)),
     "axpy(): argument 'a' must be a number (float64), got ndarray"),
    ('int_scalar_float', pa.DTypeError,
     lambda: first_n(x5, 2.0),
     "first_n(): argument 'n' must be an integer (int32), got 2.0"),
    ('int_scalar_bool', pa.DTypeError,
     lambda: first_n(x5, np.bool_(True)),
     "first_n(): argument 'n' must be an integer (int32), got np.True_"),
    ('int_scalar_range', pa.ArgumentError,
     lambda: first_n(x5, 2 ** 31),
     "first_n(): argument 'n' = 2147483648 does not fit in int32"),
    ('int_scalar_range_neg', pa.ArgumentError,
     lambda: first_n(x5, -2 ** 31 - 1),
     "first_n(): argument 'n' = -2147483649 does not fit in int32"),
    ('int64_scalar_range', pa.ArgumentError,
     lambda: count_up(np.zeros(3, np.int64), 2 ** 63),
     "count_up(): argument 'step' = 9223372036854775808 does not fit in int64"),
    ('alias_same', pa.ShapeError,
     lambda: axpy(x5, x5, 1.0),
     "axpy(): output 'y' shares memory with 'x'; pass separate arrays (e.g. x.copy())"),
    ('alias_views', pa.ShapeError,
     lambda: (lambda b: axpy(b[:5], b[3:8], 1.0))(np.ones(9)),
     "axpy(): output 'y' shares memory with 'x'; pass separate arrays (e.g. x.copy())"),
    ('alias_out_in', pa.ShapeError,
     lambda: (lambda b: blur2d(b, b))(np.ones((3, 3))),
     "blur2d(): output 'v' shares memory with 'u'; pass separate arrays (e.g. "
     'u.copy())'),
    ('alias_two_outs', pa.ShapeError,
     lambda: (lambda b: two_outs(np.ones((3, 3)), b[:3], b[2:5]))(np.zeros(6)),
     "two_outs(): output 'lo' shares memory with 'hi'; pass separate arrays (e.g. "
     'hi.copy())'),
    ('sizes_too_small', pa.ShapeError,
     lambda: wrap3(np.ones(2)),
     'wrap3(): sizes too small (N = 2): the circular access x[i - 3] at line 73 '
     "needs the size of dimension 0 of 'x' (N) to exceed its offset"),
]


@pytest.fixture(scope="module", autouse=True)
def plans_already_built():
    """Successful calls in the argument patterns the corpus uses, so errors hit cached plans."""
    x, y = np.arange(5.0), np.ones(5)
    axpy(x, y, 1.0)
    axpy(x, y=y, a=1.0)
    axpy(x, y, 1.0, N=5)
    two_outs(np.ones((2, 3)))
    two_outs(np.ones((2, 3)), np.zeros(2))
    two_outs(np.ones((2, 3)), np.zeros(2), np.zeros(3))
    odd_extent(np.ones(9), np.zeros(4))
    pad_k(x, K=2)
    pad_k(x, np.zeros(7), K=2)
    first_n(x, 3)
    count_up(np.zeros(3, np.int64), 1)
    wrap3(np.ones(8))
    blur2d(np.ones((3, 3)))
    blur2d(np.ones((3, 3)), np.zeros((3, 3)))


@pytest.mark.parametrize("name, exc, call, message", CASES, ids=[c[0] for c in CASES])
def test_bad_argument_message(name, exc, call, message):
    for _ in range(2):
        with pytest.raises(exc) as info:
            call()
        assert str(info.value) == message


def test_failed_call_leaves_arrays_untouched_and_kernel_usable():
    x, y = np.arange(5.0), np.ones(5)
    with pytest.raises(pa.ShapeError):
        axpy(x, x, 2.0)
    np.testing.assert_array_equal(x, np.arange(5.0))
    axpy(x, y, 2.0)
    np.testing.assert_array_equal(y, 1 + 2 * np.arange(5.0))


def test_keyword_calls_match_positional():
    rng = np.random.default_rng(1)
    x = rng.standard_normal(7)
    ref = rng.standard_normal(7) + 0.5 * x
    for call in (lambda y: axpy(x, y, 0.5), lambda y: axpy(x, y, a=0.5),
                 lambda y: axpy(x, y=y, a=0.5), lambda y: axpy(a=0.5, y=y, x=x),
                 lambda y: axpy(y=y, x=x, a=np.float64(0.5)), lambda y: axpy(x, y, 0.5, N=7)):
        y = ref - 0.5 * x
        assert call(y) is None
        np.testing.assert_allclose(y, ref)
    u = rng.standard_normal((3, 4))
    for kwargs in ({}, {"hi": np.zeros(4)}, {"lo": np.zeros(3), "hi": np.zeros(4)}):
        total, lo, hi = two_outs(x=u, **kwargs)
        assert total == pytest.approx(u.sum())
        np.testing.assert_allclose(lo, u.sum(axis=1))
        np.testing.assert_allclose(hi, u.sum(axis=0))
        if "hi" in kwargs:
            assert hi is kwargs["hi"]


def test_explicit_sizes():
    x = np.arange(5.0)
    y = pad_k(x, K=3)
    np.testing.assert_array_equal(y, [0, 1, 2, 3, 4, 1, 1, 1])
    y = pad_k(x, N=5, K=0)
    np.testing.assert_array_equal(y, x)
    given = np.zeros(7)
    assert pad_k(x, given) is given            # K = 2 inferred from the output's shape
    np.testing.assert_array_equal(given, [0, 1, 2, 3, 4, 1, 1])
    assert pad_k(x, np.zeros(7), K=np.int32(2)).shape == (7,)
    np.testing.assert_array_equal(odd_extent(np.arange(9.0), N=4), [1, 3, 5, 7])


def test_integer_arguments_and_zeroed_temporaries():
    x = np.arange(5.0)
    np.testing.assert_array_equal(first_n(x, 3), [0, 2, 4, 0, 0])
    np.testing.assert_array_equal(first_n(x, np.int64(-2)), np.zeros(5))
    np.testing.assert_array_equal(first_n(x, 9), 2 * x)
    c = np.zeros(3, np.int64)
    count_up(c, 2 ** 62)
    count_up(c, np.int8(1))
    np.testing.assert_array_equal(c, 2 ** 62 + 1)


def test_return_values_and_types():
    x = np.arange(4.0)
    v = ssq(x)
    assert type(v) is np.float64 and v == 14.0
    v32 = ssq32(x.astype(np.float32))
    assert type(v32) is np.float32 and v32 == 14.0
    g = pa.grad(ssq, "x")(x)
    assert type(g) is np.ndarray and g.dtype == np.float64
    np.testing.assert_array_equal(g, 2 * x)
    value, g = pa.value_and_grad(ssq, "x")(x=x)
    assert value == 14.0
    np.testing.assert_array_equal(g, 2 * x)
    # a float gradient with respect to a scalar parameter comes back as a Python float
    da = pa.grad(two_outs_total, "a")(np.ones((2, 3)), 2.0)
    assert type(da) is float and da == 6.0


@pa.kernel
def two_outs_total(x: pa.f64[2, 3], a: pa.f64) -> pa.f64:
    t = 0.0
    for m in range(2):
        for n in range(3):
            t += a * x[m, n]
    return t


def test_empty_and_read_only_arrays():
    y = np.zeros(0)
    assert axpy(np.zeros(0), y, 1.0) is None
    assert ssq(np.zeros(0)) == 0.0
    x = _read_only(np.arange(3.0))
    assert ssq(x) == 5.0


def test_size_conditions_are_checked_for_every_new_size():
    np.testing.assert_array_equal(wrap3(np.ones(8)), np.full(8, 2.0))
    assert wrap3(np.ones(0)).shape == (0,)
    for n in (1, 2):
        with pytest.raises(pa.ShapeError, match="sizes too small"):
            wrap3(np.ones(n))
    np.testing.assert_array_equal(wrap3(np.ones(3)), np.full(3, 2.0))


@pa.kernel
def reflect_in_place(x: pa.f64[N + 1], z: pa.f64[N + 1].mirror):
    for i in range(N):
        z[i] = z[i - 2] * x[i]


def test_a_derivatives_size_requirement_names_the_array_the_caller_passes():
    """A vjp works on a copy of the in-out array ``z`` (``z_work``); its size requirement
    names ``z``, the array the caller passes, as the primal's does."""
    v = pa.vjp(reflect_in_place, wrt=["x", "z"])
    assert "z_work" in [t.name for t in v.ir.temps]
    line = reflect_in_place.ir.statements[0].line
    want = (rf"sizes too small \(N = 1\): the mirror access z\[i - 2\] at line {line} "
            r"needs the size of dimension 0 of 'z' \(N \+ 1\) to exceed its offset(\n|$)")
    with pytest.raises(pa.ShapeError, match=r"reflect_in_place\(\): " + want):
        reflect_in_place(np.ones(2), np.ones(2))
    with pytest.raises(pa.ShapeError, match=r"reflect_in_place_vjp_x_z\(\): " + want):
        v(np.ones(2), np.ones(2), z_bar=np.ones(2))
    z = np.arange(4.0)
    reflect_in_place(np.ones(4), z)
    np.testing.assert_array_equal(z, [2.0, 1.0, 2.0, 3.0])  # z[-2] is z[2], z[-1] is z[1]


@pa.kernel
def read_past_in_place(x: pa.f64[N], z: pa.f64[N]):
    for i in range(N):
        z[i] = z[i + 1] * x[i]


def test_a_derivatives_bounds_error_names_the_array_the_caller_passes():
    """An access out of bounds at every size, reached first through a vjp (the primal never
    compiled): the error and its hint name the in-out array ``z``, not the vjp's working
    copy, and read as the primal's do."""
    v = pa.vjp(read_past_in_place, wrt=["x", "z"])
    with pytest.raises(pa.BoundsError) as derived:
        v(np.ones(3), np.ones(3), z_bar=np.ones(3))
    with pytest.raises(pa.BoundsError) as primal:
        read_past_in_place(np.ones(3), np.ones(3))
    first_lines = [str(e.value).splitlines()[:2] for e in (derived, primal)]
    assert first_lines[0] == first_lines[1], first_lines
    assert "z[i + 1] reads z[1] at i = 0 when N = 1, outside dimension 0 of 'z'" \
        in first_lines[0][0]
    assert "declare a boundary mode on 'z'" in first_lines[0][1]


def test_compiled_size_conditions_agree_with_isl():
    """The Python predicate made from the size conditions decides as ISL does."""
    for kernel in (wrap3, taps2d):
        compiled = kernel.compile()
        assert compiled.requirements and compiled._bad_sizes is not None
        for sizes in itertools.product(range(8), repeat=len(compiled.kernel.sizes)):
            try:
                compiled._check_requirements_values(sizes)
                bad = False
            except pa.ShapeError:
                bad = True
            assert compiled._bad_sizes(list(sizes)) == bad, (kernel, sizes)
    x = np.ones((5, 5))
    taps2d(x, x.copy())
    with pytest.raises(pa.ShapeError, match=r"taps2d\(\): sizes too small \(M = 5, N = 3\)"):
        taps2d(np.ones((5, 3)), np.ones((5, 3)))


def _reference_sizes(compiled, args, kwargs):
    """What the original checks say about a call: the error they raise, or the sizes."""
    try:
        values, sizes = compiled._bind(args, kwargs)
        arrays = {}
        for p in compiled.kernel.params:
            if p.name in values and p.is_array:
                compiled._check_array(p, values[p.name])
                arrays[p.name] = values[p.name]
        compiled._infer_sizes(arrays, sizes)
    except pa.PolyadError as e:
        return type(e), str(e)
    return tuple(sizes[s] for s in compiled.kernel.sizes)


def test_size_inference_plan_matches_the_original_checks():
    """Random shapes, some inconsistent, with and without outputs and explicit sizes:
    the sizes the plan passes to C (or the error it raises) are those of ``_infer_sizes``."""
    rng = np.random.default_rng(7)
    compiled = mixed_extents.compile()
    passed = []
    real_fn = compiled._fn
    compiled._fn = lambda *cargs: passed.append(cargs[3:6])
    try:
        for _ in range(400):
            n, k, m = rng.integers(0, 4, 3)
            a = np.ones(2 * n + 1 + rng.choice([0, 0, 0, 1, -1]))
            b = np.ones(max(0, n + k + rng.choice([0, 0, 0, 1, -1])))
            args = [a, b]
            kwargs = {}
            if rng.random() < 0.5:
                args.append(np.zeros((k, m + rng.choice([0, 0, 0, 1]))))
            else:
                kwargs["M"] = int(m)
            if rng.random() < 0.3:
                kwargs["K"] = int(k + rng.choice([0, 0, 1]))
            if rng.random() < 0.2:
                kwargs["N"] = int(n + rng.choice([0, 1, -1]))
            expected = _reference_sizes(compiled, args, kwargs)
            del passed[:]
            try:
                compiled(*args, **kwargs)
                outcome = tuple(passed[0])
            except pa.PolyadError as e:
                outcome = type(e), str(e)
            assert outcome == expected, (args, kwargs)
    finally:
        compiled._fn = real_fn


def test_calls_from_several_threads_at_once():
    grad_ssq = pa.grad(ssq, "x")
    start = threading.Barrier(6)

    def work(k):
        rng = np.random.default_rng(k)
        n = 3 + k
        start.wait()
        for _ in range(300):
            x = rng.standard_normal(n)
            y = rng.standard_normal(n)
            y0 = y.copy()
            axpy(x, y=y, a=0.25)
            if not np.allclose(y, y0 + 0.25 * x):
                return "axpy"
            if not np.isclose(ssq(x), x @ x):
                return "ssq"
            if not np.allclose(grad_ssq(x), 2 * x):
                return "grad"
            u = rng.standard_normal((2, n))
            total, lo, hi = two_outs(u)
            if not (np.isclose(total, u.sum()) and np.allclose(lo, u.sum(1))
                    and np.allclose(hi, u.sum(0))):
                return "two_outs"
            if not np.array_equal(first_n(x, k), np.where(np.arange(n) < k, 2 * x, 0.0)):
                return "first_n"
        return "ok"

    with ThreadPoolExecutor(6) as pool:
        assert list(pool.map(work, range(6))) == ["ok"] * 6


def test_c_signature_is_typed_records():
    sig = first_n.compile().signature
    assert [(p.kind, p.name, p.role, p.dtype.name) for p in sig.params] == [
        ("array", "x", "in", "f64"), ("scalar", "n", "in", "i32"), ("array", "y", "out", "f64"),
        ("size", "N", "in", "i64"), ("temp", "t", "temp", "f64")]
    x, _, y, _, t = sig.params
    assert x.const and x.mode == "clamped" and not y.const and t.zero_filled
    assert [str(e) for e in x.extents] == [str(e) for e in first_n.ir.params[0].type.shape]
    assert sig.declaration() == ("void first_n(const double *restrict x, int32_t n, "
                                 "double *restrict y, int64_t N, double *restrict t)")
    assert sig.declaration(restrict=False) == ("void first_n(const double *x, int32_t n, "
                                               "double *y, int64_t N, double *t)")
    (result,) = [p for p in ssq.compile().signature.params if p.kind == "result"]
    assert (result.c_name, result.role, result.declaration()) == (
        "s_out", "out", "double *restrict s_out")


def test_one_size_inference_for_calls_bridges_and_the_interpreter():
    """The compiled call, the framework bridges (``polyad.functional``) and the
    reference interpreter infer sizes with one function: same sizes, same errors."""
    from polyad import callconv, ir
    from polyad.functional import FunctionalKernel
    kir = odd_extent.ir
    x = np.zeros(7)
    want = ir.infer_sizes(kir, {"x": x.shape}, {})
    assert FunctionalKernel(odd_extent).infer_sizes({"x": x.shape}, {}) == want
    assert callconv.infer_sizes(kir, {"x": x}, {}) == want
    messages = set()
    for infer in (lambda: ir.infer_sizes(kir, {"x": (6,)}, {}),
                  lambda: FunctionalKernel(odd_extent).infer_sizes({"x": (6,)}, {}),
                  lambda: callconv.infer_sizes(kir, {"x": np.zeros(6)}, {}),
                  lambda: odd_extent(np.zeros(6))):
        with pytest.raises(pa.ArgumentError) as err:   # 2 * N + 1 == 6 has no solution
            infer()
        messages.add(str(err.value))
    assert len(messages) == 1, messages
