"""Reads that do not change along a vector loop, of arrays no statement writes, are read
once before the loop into locals (``c_openmp._Emitter.invariant_reads``): gcc cannot move
them itself in the functions OpenMP outlines, whose pointers lose ``restrict``."""

import re
import textwrap

import polyad as pa
from polyad.emit.cexpr import unparen
from polyad.pipeline import Options

from deconv_kernels import deconvolution
from test_asan import run_script_under_asan
from test_loop_order import conv_cost


def _vector_loops(src: str) -> list[list[str]]:
    """The code (comments cut) of every loop under ``#pragma omp simd``, a list of lines."""
    lines = [line.split("//")[0] for line in src.splitlines()]
    loops = []
    for k, line in enumerate(lines):
        if line.strip().startswith("#pragma omp simd"):
            depth, body = 0, []
            for text in lines[k + 1:]:
                depth += text.count("{") - text.count("}")
                body.append(text)
                if depth <= 0:
                    break
            loops.append(body)
    return loops


def test_the_conv_gradient_reads_each_weight_once_per_vector_loop():
    src = pa.grad(conv_cost, wrt=["w", "x"]).source
    loops = _vector_loops(src)
    assert any(re.search(r"\bw_co_ci_[0-2]_[0-2]\b", line) for loop in loops for line in loop)
    assert not any(re.search(r"\bw\[", line) for loop in loops for line in loop)
    # declared where the loop is known to run: an index of w is in bounds where the loop
    # makes its reads, not necessarily where it runs no iteration
    first = src.index("const double w_")
    guard = src[:first].rstrip().splitlines()[-1]
    assert guard.strip().startswith("if (") and guard.endswith(
        "// the loop runs: the reads it makes before it are in bounds"), guard
    assert re.search(r"const double w_co_ci_1_0 = w\[.*\];  // w\[co, ci, 1, 0\], invariant "
                     r"along v", src)


def _large_size_units(src: str) -> str:
    """``src`` without the units of the version for small sizes (``build._size_versions``:
    loops with the pieces as conditions inside, where reads under a condition stay there)."""
    units = re.split(r"(?=/\* polyad unit)", src)
    return "".join(u for u in units if "_small_sizes_nest" not in u.split("{")[0])


def test_constant_taps_are_read_without_a_condition():
    src = _large_size_units(pa.grad(deconvolution("f64"), wrt=["x", "f"]).source)
    assert "pa_small_sizes" in src
    assert not any(re.search(r"\bf\[", line) for loop in _vector_loops(src) for line in loop)
    first = src.index("const double f_0 = f[0];  // f[0], invariant along ")
    assert src[:first].rstrip().splitlines()[-1].strip() == "{"


def test_unparen_removes_only_a_pair_around_everything():
    assert unparen("(W - 1)") == "W - 1"
    assert unparen("((1) < (W - 1))") == "(1) < (W - 1)"
    assert unparen("(1) < (W - 1)") == "(1) < (W - 1)"
    assert unparen("W") == "W"


ASAN_SCRIPT = textwrap.dedent('''
    import numpy as np
    import polyad as pa
    from polyad.testing import interpret
    from deconv_kernels import deconvolution
    from test_loop_order import conv_cost

    rng = np.random.default_rng(3)
    for deterministic in (False, True):
        grad = pa.grad(conv_cost, wrt=["w", "x"])
        c = pa.compile(grad, sanitize="address", deterministic=deterministic)
        for b, ci, co, h, w in [(1, 1, 1, 1, 1), (1, 2, 1, 2, 2), (2, 1, 3, 3, 3), (1, 2, 2, 4, 5)]:
            x = rng.standard_normal((b, ci, h, w))
            wt = rng.standard_normal((co, ci, 3, 3))
            y = rng.standard_normal((b, co, h, w))
            dw, dx = c(x, wt, y)
            _, want = interpret(grad.ir, dict(x=x, w=wt, y=y), dict(B=b, CI=ci, CO=co, H=h, W=w))
            np.testing.assert_allclose(dw, want["d_w"], rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(dx, want["d_x"], rtol=1e-12, atol=1e-12)
        grad = pa.grad(deconvolution("f64"), wrt=["x", "f"])
        c = pa.compile(grad, sanitize="address", deterministic=deterministic)
        for shape in [(1, 1), (2, 3), (3, 5), (4, 6)]:
            x, f, y = rng.standard_normal(shape), rng.standard_normal(5), rng.standard_normal(shape)
            dx, df = c(x, f, y)
            _, want = interpret(grad.ir, dict(x=x, f=f, y=y), dict(M=shape[0], N=shape[1]))
            np.testing.assert_allclose(dx, want["d_x"], rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(df, want["d_f"], rtol=1e-12, atol=1e-12)
    print("ASAN-SCRIPT-OK")
''')


def test_gradients_with_reads_kept_in_locals_match_the_interpreter_under_asan(tmp_path,
                                                                              repo_root):
    """Sizes 1-5: rows of one or two pixels run none of the interior's vector loops."""
    prebuilt = [(pa.grad(kernel, wrt=wrt), Options(sanitize="address", deterministic=d))
                for kernel, wrt in [(conv_cost, ["w", "x"]), (deconvolution("f64"), ["x", "f"])]
                for d in (False, True)]
    run_script_under_asan(tmp_path, repo_root, ASAN_SCRIPT, "ASAN-SCRIPT-OK", prebuilt)


def test_only_reads_every_iteration_makes_at_the_same_element_move():
    """An index naming the loop's iterator, also inside an opaque AST expression (a
    ``LoopVar`` spelled by its C text), or reading a scalar or another array, varies;
    reads under a selection's branches or after ``and`` / ``or`` may not happen."""
    from polyad import ir
    from polyad.emit.c_openmp import _invariant, _unconditional_loads

    def read(*index):
        return ir.Load("w", index)
    assert _invariant(read(ir.LoopVar("co"), ir.Const(1, ir.i64)), "v")
    assert _invariant(read(ir.LoopVar("vv")), "v")  # another loop's iterator
    assert not _invariant(read(ir.LoopVar("v")), "v")
    assert not _invariant(read(ir.LoopVar("(pa_imin(v, W - 1))")), "v")
    assert not _invariant(read(ir.ScalarRef("k", ir.i64)), "v")
    assert not _invariant(read(ir.Load("idx", (ir.LoopVar("co"),), ir.i64)), "v")
    a, b, c = read(ir.Const(0, ir.i64)), read(ir.Const(1, ir.i64)), read(ir.Const(2, ir.i64))
    cond = ir.Binary(">=", a, ir.Const(0.0), ir.boolean)
    assert _unconditional_loads(ir.Select(cond, b, c)) == [a]
    assert _unconditional_loads(ir.Binary("and", cond, ir.Binary(">=", b, c, ir.boolean),
                                          ir.boolean)) == [a]
    assert _unconditional_loads(ir.Binary("+", a, ir.Binary("*", b, c))) == [a, b, c]
