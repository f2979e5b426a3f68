"""Compilation units: the C emitter prints each loop nest outside every loop as a function
of its own (between ``UNIT_BEGIN`` and ``UNIT_END``) that the kernel's function calls,
and the runtime compiles such units in parallel, one compiler process per core
(``runtime.toolchain.translation_units``): gcc spends its time per function, so a
gradient of several nests compiles in about the time of its largest nest.
"""

import logging
import platform
import re
import subprocess

import numpy as np
import pytest

import polyad as pa
from polyad.emit.c_openmp import UNIT_BEGIN, UNIT_END
from polyad.errors import CompileError
from polyad.runtime import toolchain
from polyad.testing import interpret

from deconv_kernels import deconvolution

N = pa.sizes("N")


def test_each_outer_nest_is_a_function_the_kernel_calls():
    src = pa.grad(deconvolution("f64"), wrt=["x", "f"]).source
    units = src.count(UNIT_BEGIN)
    assert units >= 2 and src.count(UNIT_END) == units
    # (the fused chain's version for small sizes: units of their own, build._size_versions)
    names = re.findall(r"^void (deconv_cost_grad_x_f_(?:small_sizes_)?nest\d+)\(", src, re.M)
    assert len(names) == units
    main = src[src.index("void deconv_cost_grad_x_f("):]
    calls = [line.strip() for line in main.splitlines() if "_nest" in line]
    # each unit is called once, in the order of the source, with the DSL lines it runs
    assert [c.split("(")[0] for c in calls] == names
    assert all(re.search(r";  // lines? \d+(, \d+)*$", c) for c in calls)
    # the statements themselves sit in the units, each with its DSL line
    assert "#pragma omp parallel for" not in main


def test_a_kernel_of_one_nest_stays_one_function():
    @pa.kernel
    def scale(x: pa.f64[N], y: pa.Out(pa.f64[N])):
        for i in range(N):
            y[i] = 2.0 * x[i]

    src = scale.source
    assert UNIT_BEGIN not in src and "_nest" not in src


def test_scalars_cross_units_by_address_when_written_and_by_value_when_read():
    @pa.kernel
    def normalize(x: pa.f64[N], y: pa.Out(pa.f64[N])):
        s = 0.0
        for i in range(N):
            s += x[i] * x[i]
        for i in range(N):
            y[i] = x[i] / (s + 1.0)

    src = normalize.source
    first, second = src.split(UNIT_BEGIN)[1:3]
    assert "double *restrict s_at" in first.splitlines()[1]
    assert "double s = *s_at;" in first and "*s_at = s;" in first
    assert first.splitlines()[1].endswith(", double *restrict s_at)")
    assert second.splitlines()[1].endswith(", double s)")
    x = np.random.default_rng(0).standard_normal(37)
    np.testing.assert_allclose(normalize(x), x / (x @ x + 1.0), rtol=1e-13)


def _units_of(files: list[str]) -> list[str]:
    return [name for f in files for name in re.findall(r"^void (\w+_nest\d+)\(.*\)$", f, re.M)]


def test_translation_units_deal_every_unit_to_one_file():
    # (unfused: by default the gradient is one chain of nests, one unit)
    src = pa.compile(pa.grad(deconvolution("f64"), wrt=["x", "f"]), fuse=False).source
    units = sorted(re.findall(r"^void (\w+_nest\d+)\(", src, re.M))
    assert toolchain.translation_units(src, 1) == [src]
    for jobs in (2, 3, 64):
        files = toolchain.translation_units(src, jobs)
        assert len(files) == min(jobs, len(units) + 1)
        assert sorted(_units_of(files)) == units  # defined once, somewhere
        # the kernel's function is in the first file, which declares the others' units
        assert "void deconv_cost_grad_x_f(" in files[0]
        assert all("void deconv_cost_grad_x_f(" not in f for f in files[1:])
        for name in set(units) - set(_units_of(files[:1])):
            assert re.search(rf"^void {name}\(.*\);$", files[0], re.M)
        # every other file has the includes and helpers of the source's head
        head = src[:src.index(UNIT_BEGIN)]
        assert all(f.startswith(head) for f in files[1:])
        sizes = [f.count("\n") for f in files]
        assert max(sizes) < 0.8 * src.count("\n")  # the work is shared out


def test_a_short_source_compiles_in_one_piece():
    short = "\n".join(["/* head */", UNIT_BEGIN, "void k_nest1(void)", "{", "}", UNIT_END,
                       UNIT_BEGIN, "void k_nest2(void)", "{", "}", UNIT_END,
                       "void k(void)", "{", "  k_nest1();", "  k_nest2();", "}", ""])
    assert toolchain.translation_units(short, 8) == [short]


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYAD_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("POLYAD_COMPILE_JOBS", "2")
    return tmp_path


def test_a_gradient_built_from_parallel_units_matches_the_interpreter(fresh_cache, caplog):
    grad = pa.grad(deconvolution("f64"), wrt=["x", "f"])
    with caplog.at_level(logging.INFO, logger="polyad"):
        fn = pa.compile(grad)
    assert any("(2 units at once)" in r.getMessage() for r in caplog.records)
    # nothing of the build is left but the source and the library
    assert not [p.name for p in fresh_cache.iterdir() if p.name.startswith(".")]
    rng = np.random.default_rng(3)
    for m, n in [(1, 1), (3, 2), (9, 37)]:
        x, y = rng.standard_normal((m, n)), rng.standard_normal((m, n))
        f = rng.standard_normal(5)
        dx, df = fn(x, f, y)
        _, want = interpret(grad.ir, dict(x=x, f=f, y=y), dict(M=m, N=n))
        np.testing.assert_allclose(dx, want["d_x"], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(df, want["d_f"], rtol=1e-12, atol=1e-12)


def test_a_unit_the_compiler_rejects_names_the_whole_source(fresh_cache):
    head = ["#include <stdint.h>"] + [f"/* padding {k} */" for k in range(toolchain.MIN_SPLIT_LINES)]
    broken = "\n".join(head + [UNIT_BEGIN, "void k_nest1(double *x)", "{", "  x[0] = ;", "}",
                               UNIT_END, UNIT_BEGIN, "void k_nest2(double *x)", "{",
                               "  x[1] = 2.0;", "}", UNIT_END,
                               "void k(double *x)", "{", "  k_nest1(x);", "  k_nest2(x);",
                               "}", ""])
    assert len(toolchain.translation_units(broken, 2)) == 2
    with pytest.raises(CompileError) as err:
        toolchain.compile_c(broken, "broken_units")
    text = str(err.value)
    assert "kernel 'broken_units'" in text and "expected expression" in text
    source = re.search(r"source: (\S+)", text).group(1)
    assert open(source).read() == broken
    assert not list(fresh_cache.glob("*.so")) and not list(fresh_cache.glob(".*"))


def test_compile_jobs_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("POLYAD_COMPILE_JOBS", "3")
    assert toolchain.compile_jobs() == 3
    monkeypatch.setenv("POLYAD_COMPILE_JOBS", "many")
    with pytest.raises(CompileError, match="POLYAD_COMPILE_JOBS"):
        toolchain.compile_jobs()
    monkeypatch.delenv("POLYAD_COMPILE_JOBS")
    assert toolchain.compile_jobs() >= 1


@pa.kernel
def relu_cost(s: pa.f32[N], y: pa.f32[N]) -> pa.f32:
    C = 0.0
    for i in range(N):
        r = max(s[i], 0.0) - y[i]
        C += r * r
    return C


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                    reason="names an x86-64 machine without masked vector operations")
def test_a_loop_with_a_selection_vectorizes_on_a_machine_without_vector_masks(tmp_path):
    """A ReLU's derivative, ``d_r * (s >= 0 ? 1 : 0)``: with polyad's arithmetic flags
    gcc vectorizes its loop for an AVX2 machine (``-march=x86-64-v3``, no masked vector
    operations). Without ``toolchain.NO_TRAPS_FLAG`` gcc would not compute ``r + r``
    where the selection discards it, kept the loop scalar with a branch per element, and
    the conv layer's gradient took 1.3 to 1.6 times as long on such a machine."""
    cc = toolchain.c_compiler()
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
    if "Free Software Foundation" not in version:
        pytest.skip("reads gcc's vectorizer report")
    assert toolchain.NO_TRAPS_FLAG in toolchain.arithmetic_flags(False)
    assert toolchain.NO_TRAPS_FLAG in toolchain.arithmetic_flags(True)
    src = pa.grad(relu_cost, wrt="s").source
    lines = src.splitlines()
    selection = next(k for k, text in enumerate(lines) if "? 1.0f : 0.0f" in text)
    loop = max(k for k in range(selection) if lines[k].lstrip().startswith("for ("))
    c_file = tmp_path / "relu_cost_grad_s.c"
    c_file.write_text(src)
    proc = subprocess.run([cc, "-O3", "-march=x86-64-v3", "-fopenmp", "-std=c99",
                           *toolchain.arithmetic_flags(False), "-fopt-info-vec-optimized",
                           "-c", str(c_file), "-o", str(tmp_path / "relu.o")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    # (gcc names an OpenMP loop by its 'for' line or by the first line of its body)
    vectorized = {int(n) for n in re.findall(
        r"relu_cost_grad_s\.c:(\d+):\d+: optimized: loop vectorized", proc.stderr)}
    assert vectorized & set(range(loop + 1, selection + 2)), (lines[loop], proc.stderr)


@pa.kernel
def reset_then_add(t: pa.f64[2], y: pa.Out(pa.f64[2 * N + 2])):
    for i in range(N):
        y[i + 1] -= y[i + 1]
        y[2 * i] += pa.tanh(t[1] - 2.0)


def test_a_guarded_update_after_a_reset_of_the_same_element_keeps_its_order():
    """Fuzz seed 17743: the schedule runs ``y[2] -= y[2]`` and then a guarded
    ``y[2] += ...`` in one iteration of a loop over the elements of ``y``. gcc 12, having
    if-converted that loop into masked stores (``-march=native``, ``-fno-trapping-math``),
    split it with its loop distribution into loops that ran the update first, so ``y[2]``
    ended 0. ``toolchain.NO_LOOP_DISTRIBUTION_FLAG`` keeps the loop whole."""
    assert toolchain.NO_LOOP_DISTRIBUTION_FLAG in toolchain.BASE_FLAGS
    compiled = pa.compile(reset_then_add)
    rng = np.random.default_rng(5)
    for n in range(1, 6):
        t = rng.standard_normal(2)
        y = rng.standard_normal(2 * n + 2)
        _, want = interpret(reset_then_add.ir, dict(t=t.copy(), y=y.copy()), dict(N=n))
        compiled(t, y)
        np.testing.assert_allclose(y, want["y"], rtol=1e-14, atol=0, err_msg=f"N = {n}")
