"""The host's vector unit (``polyad.schedule.machine``) and what is sized for it.

The suite runs with ``POLYAD_VECTOR_UNIT=512x32`` (conftest); the tests here set other
units. On AVX2's 16 registers of 256 bits the conv layer's filter sums are not blocked
over output channels (9 sums take 9 of the 12 registers sums may have) and get lanes
of one or two 256-bit vectors; the results still match the reference interpreter,
under AddressSanitizer too; caches keep the units and the CPUs apart.
"""

import re

import numpy as np
import pytest

import polyad as pa
from polyad import ArgumentError
from polyad.pipeline import Options, artifact_of, pipeline_key
from polyad.runtime import toolchain
from polyad.schedule import machine
from polyad.schedule.machine import AVX, AVX512, NEON, SSE, ZEN4, VectorUnit, unit_of
from polyad.target.openmp import plan
from polyad.testing import interpret

from test_asan import run_script_under_asan
from test_loop_order import conv_cost, conv_cost32, conv_gradient_matches_interpreter

AVX2_UNIT = "256x16"


@pytest.fixture
def avx2(monkeypatch):
    monkeypatch.setenv(machine.ENV, AVX2_UNIT)


def test_vector_units_of_cpu_flags():
    assert unit_of("fpu sse2 avx avx2 fma avx512f avx512bw".split(), "x86_64") == AVX512
    assert unit_of("fpu sse2 avx avx2 fma".split(), "x86_64") == AVX == VectorUnit(256, 16)
    assert unit_of("fpu sse2 sse4_2".split(), "x86_64") == SSE
    assert unit_of("fp asimd evtstrm".split(), "aarch64") == NEON == VectorUnit(128, 32)
    assert unit_of([], "x86_64") == AVX
    assert (AVX512.sum_registers, AVX512.lane_bits, AVX512.two_vector_sums) == (24, 1024, 12)
    assert (AVX.sum_registers, AVX.lane_bits, AVX.two_vector_sums) == (12, 512, 6)
    assert (AVX512.row_block, AVX.row_block, SSE.row_block, NEON.row_block) == (4, 2, 2, 4)


def test_zen4_computes_avx512_in_halves():
    """AMD family 19h (25) with AVX-512 is Zen 4: its unit computes a 512-bit operation in
    two 256-bit halves, and gets 2 rows per pass; its sums and lanes are AVX-512's."""
    flags = "fpu sse2 avx avx2 fma avx512f avx512bw".split()
    assert unit_of(flags, "x86_64", "AuthenticAMD", "25") == ZEN4 == VectorUnit(512, 32, 256)
    assert unit_of(flags, "x86_64", "AuthenticAMD", "26") == AVX512
    assert unit_of(flags, "x86_64", "GenuineIntel", "6") == AVX512
    assert unit_of("fpu sse2 avx avx2 fma".split(), "x86_64", "AuthenticAMD", "25") == AVX
    assert ZEN4.split and not AVX512.split and not AVX.split
    assert (ZEN4.row_block, AVX512.row_block) == (2, 4)
    assert (ZEN4.sum_registers, ZEN4.lane_bits, ZEN4.two_vector_sums) == (24, 1024, 12)
    assert (ZEN4.spec, AVX512.spec) == ("512x32/256", "512x32")
    assert str(ZEN4) == "32 vector registers of 512 bits, computed in halves of 256"


def test_the_environment_names_the_unit(monkeypatch):
    monkeypatch.setenv(machine.ENV, " 256X16 ")
    assert machine.host_vector_unit() == VectorUnit(256, 16)
    monkeypatch.setenv(machine.ENV, "512x32/256")
    assert machine.host_vector_unit() == ZEN4
    monkeypatch.delenv(machine.ENV)
    assert machine.host_vector_unit() == machine._detected_unit()
    for bad in ("avx2", "256", "0x16", "100x16", "256x2", "x16", "512x32/", "512x32/512",
                "512x32/100", "512x32/192", "512x32/x"):
        monkeypatch.setenv(machine.ENV, bad)
        with pytest.raises(ArgumentError, match=r"\$POLYAD_VECTOR_UNIT is .*such as 256x16"):
            machine.host_vector_unit()
    with pytest.raises(ArgumentError, match="POLYAD_VECTOR_UNIT"):
        pa.compile(conv_cost)


def test_the_conv_gradient_on_avx2_keeps_its_sums_unblocked(avx2):
    grad = pa.grad(conv_cost32, wrt=["w", "x"])
    sk = artifact_of(grad, Options()).scheduled
    assert sk.vector_unit == AVX
    assert not any(sp.kind == "block" for st in sk.kernel.statements for sp in st.origin)
    text = pa.explain(grad)
    assert ("loop co not blocked into the loop v: its 9 sums per pass over the row leave no "
            "room for a second copy in the 12 of 16 vector registers of 256 bits that sums "
            "may take") in text
    assert "per-lane partial sums (8 lanes, sized for 16 vector registers of 256 bits)" in text
    # one 256-bit vector of lanes per sum where a loop has 9 (the interior rows' taps),
    # two where it has at most 6 (a border row's)
    lanes = {lp.lane_sums for lp in plan(sk).loops.values() if lp.lane_sums}
    assert lanes == {8, 16}, lanes
    src = grad.source
    assert "co_iter" not in src and "d_w_lanes9[8] = {0};" in src
    assert not re.search(r"d_w_lanes1\d\[", src)
    # the d_x gather in blocks of 2 input channels per pass (AVX-512: 4); the forward's
    # recompute keeps one row per pass: the unblocked filter sums after it in the same
    # body get lanes, which a block's copies would not follow (no decision claims one)
    assert "for (; ci + 1 < CI; ci += 2) {" in src and "ci += 4" not in src
    assert "loop co run in blocks of" not in text
    # double: 4 lanes for 9 sums
    f64 = {lp.lane_sums for lp in plan(artifact_of(pa.grad(conv_cost, wrt=["w", "x"]),
                                                   Options()).scheduled).loops.values()}
    assert {4, 8} <= f64


def conv_forward_matches_interpreter(seed):
    """Assert that the compiled conv forward gives the interpreter's cost for random
    inputs at a few shapes, rows shorter and longer than a block of lanes."""
    rng = np.random.default_rng(seed)
    for b, ci, co, h, w in [(1, 1, 1, 1, 1), (1, 2, 3, 4, 9), (2, 3, 5, 5, 21)]:
        x, wt = rng.standard_normal((b, ci, h, w)), rng.standard_normal((co, ci, 3, 3))
        y = rng.standard_normal((b, co, h, w))
        want, _ = interpret(conv_cost.ir, dict(x=x, w=wt, y=y),
                            dict(B=b, CI=ci, CO=co, H=h, W=w))
        np.testing.assert_allclose(pa.compile(conv_cost)(x, wt, y), want, rtol=1e-12)


def test_the_conv_forward_on_avx2_runs_two_rows_per_pass(avx2):
    """Each row of a block and each of its 9 taps' weights takes a register: blocks of 2
    output channels on 16 registers, of 4 on 32."""
    text = pa.explain(conv_cost)
    assert "loop co run in blocks of 2: the sums into s_rows for the 2 values" in text
    src = conv_cost.source
    assert "for (; co + 1 < CO; co += 2) {" in src and "co += 4" not in src
    conv_forward_matches_interpreter(29)


def test_the_conv_layer_on_zen4_runs_two_rows_per_pass(monkeypatch):
    """On a unit computing in halves the forward's per-point sums and the gradient's d_x
    gather take 2 rows per pass; the filter sums keep AVX-512's blocks of 2 output
    channels; the values match the interpreter; the pipeline key is the unit's own."""
    key = pipeline_key(conv_cost.ir, Options())
    monkeypatch.setenv(machine.ENV, "512x32/256")
    assert pipeline_key(conv_cost.ir, Options()) != key
    assert "loop co run in blocks of 2: the sums into s_rows" in pa.explain(conv_cost)
    assert "for (; co + 1 < CO; co += 2) {" in conv_cost.source
    grad = pa.grad(conv_cost, wrt=["w", "x"])
    src = grad.source
    assert "for (; ci + 1 < CI; ci += 2) {" in src and "ci += 4" not in src
    assert "co_iter" in src
    conv_gradient_matches_interpreter(
        grad, pa.compile(grad), 31,
        [(1, 1, 1, 1, 1), (1, 3, 5, 4, 9), (2, 5, 3, 5, 21)])
    conv_forward_matches_interpreter(31)


@pytest.mark.parametrize("deterministic", [False, True])
def test_the_conv_gradient_on_avx2_matches_the_interpreter(avx2, deterministic):
    grad = pa.grad(conv_cost, wrt=["w", "x"])
    conv_gradient_matches_interpreter(
        grad, pa.compile(grad, deterministic=deterministic), 23,
        [(1, 1, 1, 1, 1), (1, 2, 3, 4, 9), (1, 1, 2, 3, 17), (2, 3, 3, 5, 21)])


def test_a_kernel_compiled_for_two_units_keeps_both(monkeypatch):
    """The same Kernel object, the pipeline key and the C: one per vector unit (a process
    that changes $POLYAD_VECTOR_UNIT gets the schedule of the unit it names)."""
    grad = pa.grad(conv_cost32, wrt=["w", "x"])
    keys, sources = [], []
    for unit in ("512x32", AVX2_UNIT, "512x32"):
        monkeypatch.setenv(machine.ENV, unit)
        keys.append(pipeline_key(grad.ir, Options()))
        sources.append(grad.source)
    assert keys[0] == keys[2] != keys[1]
    assert "co_iter" in sources[0] and "co_iter" not in sources[1] and sources[2] == sources[0]


def test_a_library_built_on_another_cpu_is_not_reused(monkeypatch):
    """``-march=native`` means what the host's CPU has: a cache directory shared with a
    machine of another CPU (a network home directory) must not hand this one its
    libraries, which could stop on an illegal instruction."""
    source = "void polyad_machine_probe(double *x) { x[0] += 1.0; }\n"
    here = toolchain.compile_c(source, "machine_probe")
    monkeypatch.setattr(machine, "cpu_fingerprint", lambda: "another cpu")
    elsewhere = toolchain.compile_c(source, "machine_probe")
    assert elsewhere != here and here.exists() and elsewhere.exists()
    assert toolchain.compile_c(source, "machine_probe") == elsewhere
    monkeypatch.undo()
    assert toolchain.compile_c(source, "machine_probe") == here


ASAN_SCRIPT = '''
import numpy as np
import polyad as pa
from polyad.testing import interpret
from test_loop_order import conv_cost32

rng = np.random.default_rng(5)
grad = pa.grad(conv_cost32, wrt=["w", "x"])
c = pa.compile(grad, sanitize="address")
for b, ci, co, h, w in [(1, 1, 1, 1, 1), (1, 2, 1, 2, 2), (1, 1, 3, 3, 9), (2, 2, 2, 4, 18)]:
    x = rng.standard_normal((b, ci, h, w)).astype(np.float32)
    wt = rng.standard_normal((co, ci, 3, 3)).astype(np.float32)
    y = rng.standard_normal((b, co, h, w)).astype(np.float32)
    dw, dx = c(x, wt, y)
    _, want = interpret(grad.ir, dict(x=x, w=wt, y=y), dict(B=b, CI=ci, CO=co, H=h, W=w))
    np.testing.assert_allclose(dw, want["d_w"], rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(dx, want["d_x"], rtol=2e-4, atol=2e-4)
print("ASAN-SCRIPT-OK")
'''


def test_the_avx2_conv_gradient_is_clean_under_asan(avx2, tmp_path, repo_root):
    """Rows shorter than a block of 8 or 16 lanes, and longer: the lane loops and their
    remainders read and write in bounds (the script inherits the unit)."""
    run_script_under_asan(tmp_path, repo_root, ASAN_SCRIPT, "ASAN-SCRIPT-OK",
                          [(pa.grad(conv_cost32, wrt=["w", "x"]), Options(sanitize="address"))])


def test_the_last_cache_level_is_read_from_sysfs(tmp_path, monkeypatch):
    """The deepest level of ``index*/level`` with its ``index*/size`` (K or M), entries that
    cannot be read skipped; where none can, the default that the streaming threshold
    (``target.openmp.STREAM_SHARE_OF_CACHE``) then takes."""
    for index, level, size in [(0, "1", "48K"), (1, "1", "32K"), (2, "2", "1024K"),
                               (3, "3", "32768K"), (4, "4", "64M?"), (5, "x", "8M")]:
        d = tmp_path / f"index{index}"
        d.mkdir()
        (d / "level").write_text(level + "\n")
        (d / "size").write_text(size + "\n")
    (tmp_path / "index6").mkdir()  # no files
    assert machine.last_level_cache(str(tmp_path)) == (3, 32 << 20)
    (tmp_path / "index2" / "size").write_text("2M\n")
    (tmp_path / "index2" / "level").write_text("5\n")
    machine.last_level_cache.cache_clear()
    assert machine.last_level_cache(str(tmp_path)) == (5, 2 << 20)
    assert machine.last_level_cache(str(tmp_path / "missing")) is None
    monkeypatch.setattr(machine, "last_level_cache", lambda: None)
    assert machine.last_level_cache_bytes() == machine.DEFAULT_LAST_LEVEL_CACHE
