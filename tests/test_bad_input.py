"""Bad input (issue 16, section 3): each case gives the right value or a clear
``PolyadError`` — never a wrapped integer, a silently skipped bounds proof, a
killed interpreter or a raw ``OSError``/``AttributeError``/islpy error."""

import os
import shutil
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import polyad as pa
from polyad.runtime import toolchain

N, = pa.sizes("N")
M, K = pa.sizes("M K")
HERE = os.path.abspath(__file__)


# ---- integer arithmetic is 64-bit; constants fold exactly and must fit ------

@pa.kernel
def square_i32(n: pa.i32, y: pa.Out(pa.f64[N])):
    for i in range(N):
        y[i] = float(n * n)


@pa.kernel
def mixed_width(n: pa.i32, m: pa.i64, y: pa.Out(pa.i64[N])):
    for i in range(N):
        y[i] = n * n * 2 + m


def test_i32_parameter_arithmetic_is_64_bit():
    np.testing.assert_array_equal(square_i32(50000, N=2), [2.5e9, 2.5e9])
    assert "int64_t" in square_i32.source
    np.testing.assert_array_equal(mixed_width(2 ** 31 - 1, -1, N=1), [2 * (2 ** 31 - 1) ** 2 - 1])


def test_i32_argument_that_does_not_fit_is_rejected():
    with pytest.raises(pa.ArgumentError, match="does not fit in int32"):
        square_i32(2 ** 31, N=1)


@pa.kernel
def big_power(y: pa.Out(pa.f64[N])):
    for i in range(N):
        y[i] = float(10 ** 20) + 2.0 ** 70 - float(3 ** 40 // 7 % 1000)


def test_constants_fold_in_python_precision():
    want = float(10 ** 20) + 2.0 ** 70 - float(3 ** 40 // 7 % 1000)
    np.testing.assert_array_equal(big_power(N=1), [want])


def _define(src: str, tmp_path, name="k"):
    """Define the kernel ``name`` of module text ``src`` (polyad reads its file)."""
    path = tmp_path / f"bad_{abs(hash(src))}.py"
    path.write_text("import polyad as pa\nN, = pa.sizes('N')\n" + textwrap.dedent(src))
    ns = {"__name__": path.stem}
    exec(compile(path.read_text(), str(path), "exec"), ns)
    return ns[name]


@pytest.mark.parametrize("body, what", [
    ("y[i] = 10 ** 20", "does not fit in int64"),
    ("y[i] = int(10 ** 19) + i", "does not fit in int64"),
    ("y[i] = i + 2 ** 64", "does not fit"),
])
def test_integer_constants_that_do_not_fit_are_dsl_errors(tmp_path, body, what):
    src = f"""
    @pa.kernel
    def k(y: pa.Out(pa.i64[N])):
        for i in range(N):
            {body}
    """
    with pytest.raises(pa.DSLError, match=what) as e:
        _define(src, tmp_path)
    assert e.value.line == 7


def test_float_constant_overflow_is_a_dsl_error(tmp_path):
    src = """
    @pa.kernel
    def k(y: pa.Out(pa.f64[N])):
        for i in range(N):
            y[i] = float(10 ** 400)
    """
    with pytest.raises(pa.DSLError, match="does not fit in float64"):
        _define(src, tmp_path)


# ---- a loop variable shadowing a size ---------------------------------------

def test_loop_variable_shadowing_a_size_is_a_dsl_error(tmp_path):
    src = """
    @pa.kernel
    def k(y: pa.Out(pa.f64[N])):
        for N in range(3):
            y[N] = 1.0
    """
    with pytest.raises(pa.DSLError, match="loop variable 'N' shadows the size 'N'") as e:
        _define(src, tmp_path)
    assert e.value.line == 6


# ---- integer // and % by zero -------------------------------------------------

@pytest.mark.parametrize("expr", ["i // 0", "i % 0", "(i + 1) % (3 - 3)", "i // (2 * 0)"])
def test_literal_zero_divisor_is_a_dsl_error(tmp_path, expr):
    src = f"""
    @pa.kernel
    def k(y: pa.Out(pa.i64[N])):
        for i in range(N):
            y[i] = {expr}
    """
    with pytest.raises(pa.DSLError, match="by zero"):
        _define(src, tmp_path)


DIV_SCRIPT = textwrap.dedent('''
    import numpy as np
    import polyad as pa

    N, = pa.sizes("N")


    @pa.kernel
    def divide(d: pa.i64, y: pa.Out(pa.i64[N]), z: pa.Out(pa.i64[N])):
        for i in range(N):
            y[i] = (i + 5) // d
            z[i] = (i + 5) % d


    @pa.kernel
    def divide_min(d: pa.i64, y: pa.Out(pa.i64[N])):
        for i in range(N):
            y[i] = (-9223372036854775807 - 1 + i) // d


    y, z = divide(0, N=3)
    assert y.tolist() == [0, 0, 0] and z.tolist() == [0, 0, 0], (y, z)
    y, z = divide(-2, N=3)
    assert y.tolist() == [-3, -3, -4] and z.tolist() == [-1, 0, -1], (y, z)
    y = divide_min(-1, N=1)
    assert y.tolist() == [-9223372036854775808], y
    print("DIV-OK")
''')


def test_run_time_zero_divisor_does_not_kill_the_process(tmp_path, repo_root):
    """Integer // and % by a zero value give 0 (numpy's result) instead of SIGFPE/SIGILL;
    INT64_MIN // -1 wraps instead of trapping. Run in a child: a trap would kill it."""
    script = tmp_path / "div.py"
    script.write_text(DIV_SCRIPT)
    env = dict(os.environ, PYTHONPATH=repo_root)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0 and "DIV-OK" in proc.stdout, proc.stdout + proc.stderr


# ---- bounds are proved on the program as written --------------------------

@pa.kernel
def dead_out_of_bounds(x: pa.f64[M, K].clamped, y: pa.Out(pa.f64[M, K])):
    t = pa.zeros(pa.f64[M, K])
    for i in range(M):
        for j in range(i):
            t[i, j] = x[i, j]
    for i in range(M):
        for j in range(K):
            y[i, j] = x[i, j]


def test_bounds_proof_precedes_dead_code_elimination():
    with pytest.raises(pa.BoundsError, match=r"t\[i, j\] writes") as e:
        dead_out_of_bounds.compile()
    assert e.value.line == dead_out_of_bounds.ir.statements[0].line


# ---- the compile cache ------------------------------------------------------

@pa.kernel
def cached_scale(x: pa.f64[N], y: pa.Out(pa.f64[N])):
    for i in range(N):
        y[i] = 3.0 * x[i]


def _libraries(directory):
    return [os.path.join(directory, f) for f in os.listdir(directory)
            if f.startswith("cached_scale_") and f.endswith(".so")]


@pytest.mark.parametrize("damage", ["truncated", "empty", "garbage", "foreign"])
def test_damaged_cache_entry_is_rebuilt(tmp_path, monkeypatch, damage):
    monkeypatch.setenv("POLYAD_CACHE_DIR", str(tmp_path))
    x = np.arange(4.0)
    src = pa.compile(pa.Kernel(ir_kernel=cached_scale.ir)).source     # fills the cache
    (lib,) = _libraries(tmp_path)
    data = open(lib, "rb").read()
    bad = tmp_path / "damaged"
    if damage == "truncated":
        bad.write_bytes(data[:len(data) // 3])
    elif damage == "empty":
        bad.write_bytes(b"")
    elif damage == "garbage":
        bad.write_bytes(os.urandom(4096))
    else:  # another valid library under this name: the kernel's symbol is missing
        other = toolchain.compile_c("double other(double x) { return x; }\n", "other")
        shutil.copyfile(other, bad)
    # replaced, not overwritten in place: this process still maps the original file
    os.replace(bad, lib)
    fresh = pa.Kernel(ir_kernel=cached_scale.ir)   # a new process would load from the cache
    np.testing.assert_array_equal(fresh(x), 3.0 * x)
    assert fresh.source == src
    assert open(lib, "rb").read()[:4] == b"\x7fELF" and os.path.getsize(lib) > 1000


def test_unusable_cache_directory_falls_back_with_a_warning(tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("POLYAD_CACHE_DIR", str(blocker / "cache"))
    toolchain._fallback_cache_dir.cache_clear()
    fresh = pa.Kernel(ir_kernel=cached_scale.ir)
    with pytest.warns(RuntimeWarning, match="POLYAD_CACHE_DIR"):
        y = fresh(np.ones(3))
    np.testing.assert_array_equal(y, [3.0, 3.0, 3.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # one warning per process and directory
        assert toolchain.cache_dir() == toolchain.cache_dir()


# ---- malformed types --------------------------------------------------------

def _raises_here(make, match):
    with pytest.raises(pa.DSLError, match=match) as e:
        make()
    assert e.value.filename == HERE and e.value.line > 0
    return e.value


def test_non_affine_extent():
    _raises_here(lambda: pa.f64[N * N], r"extent N \* N .* not affine")


def test_float_extent():
    _raises_here(lambda: pa.f64[2.5], "extents must be sizes or integers, got 2.5")
    _raises_here(lambda: pa.f32[N * 1.5], "got 1.5")


def test_unknown_boundary_mode():
    err = _raises_here(lambda: pa.f64[N].reflect, "unknown boundary mode 'reflect'")
    assert ".mirror" in err.hint
    assert not hasattr(pa.f64[N], "reflect")      # still an AttributeError for hasattr()


def test_out_of_a_scalar_type():
    _raises_here(lambda: pa.Out(pa.f64), r"pa.Out\(\) takes an array type")


def test_unknown_mode_in_a_kernel_signature(tmp_path):
    src = """
    @pa.kernel
    def k(x: pa.f64[N].periodic, y: pa.Out(pa.f64[N])):
        for i in range(N):
            y[i] = x[i]
    """
    with pytest.raises(pa.DSLError, match="unknown boundary mode 'periodic'") as e:
        _define(src, tmp_path)
    assert e.value.line == 5
