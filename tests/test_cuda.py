"""The CUDA target: nvcc compiles the generated CUDA of both corpora, the CPU
simulator (target "cuda-sim") runs the same text and matches the reference interpreter, and
target "cuda" without a GPU raises pa.DeviceError.

Every kernel of the forward corpus (``cuda_corpus.forward_kernels``) and
every gradient of the AD corpus (``cuda_corpus.gradient_cases``) is compiled
for the simulator once per session; its ``.source`` is what nvcc compiles,
many kernels per translation unit (nvcc costs seconds per call).
"""

from __future__ import annotations

import re
import subprocess
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import polyad as pa
import cuda_corpus
from cuda_corpus import assert_matches, assert_matches_reference, copies, kernel_of, results
from deconv_kernels import deconvolution
from polyad.pipeline import Options
from polyad.schedule import why_parts_not_apart
from polyad.testing import call_interpreted
from polyad.runtime.cuda import DEFAULT_ARCH, DeviceArray, gpu_count
from polyad.runtime.toolchain import CUDA_INCLUDE, NVCC_FLAGS, nvcc
from tv_kernel import tv_cost

FORWARD, GRADIENTS, NAMES = cuda_corpus.FORWARD, cuda_corpus.GRADIENTS, cuda_corpus.NAMES
REJECTED = cuda_corpus.REJECTED
NVCC_BATCHES = 4


def _plan(kernel, deterministic=False):
    """The CUDA plan a kernel's cuda-sim build was emitted from."""
    return kernel.artifact(Options("cuda-sim", deterministic)).plan


@pytest.fixture(scope="session")
def simulated():
    """``{name: cuda-sim kernel}`` for every corpus kernel (built in parallel: the compilers
    run as subprocesses)."""
    def build(name):
        return name, pa.compile(kernel_of(name), target="cuda-sim")
    with ThreadPoolExecutor(2) as pool:
        return dict(pool.map(build, NAMES))


def test_rejected_kernels_are_rejected():
    for name in REJECTED:
        with pytest.raises(pa.PolyadError):
            pa.compile(FORWARD[name], target="cuda-sim")


# ---------------------------------------------------------------------------
# nvcc
# ---------------------------------------------------------------------------


def _translation_unit(items) -> str:
    """One .cu holding many generated kernels: each in its own namespace, launchers renamed."""
    parts = ['#include "polyad_cuda.h"']
    for k, (name, kernel) in enumerate(items):
        launcher = kernel.signature.name
        text = kernel.source.replace('#include "polyad_cuda.h"', "")
        text, n = re.subn(rf'extern "C" void {launcher}\(', f'extern "C" void {launcher}_b{k}(',
                          text)
        assert n == 1, name
        parts += [f"namespace pa_batch_{k} {{  // {name}", text, "}"]
    return "\n".join(parts)


def _assert_nvcc_compiles(items, tmp_path, stem):
    """nvcc compiles the kernels ``items`` ((name, CUDA source) pairs) in one translation
    unit, without errors or warnings."""
    src = tmp_path / f"{stem}.cu"
    src.write_text(_translation_unit(items))
    cmd = [nvcc(), *[f for f in NVCC_FLAGS if f != "-shared"], f"-arch={DEFAULT_ARCH}",
           f"-I{CUDA_INCLUDE}", "-c", str(src), "-o", str(tmp_path / f"{stem}.o")]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "warning" not in proc.stderr, proc.stderr[-4000:]


@pytest.mark.parametrize("batch", range(NVCC_BATCHES))
def test_nvcc_compiles_the_corpora(simulated, tmp_path, batch):
    items = [(n, simulated[n]) for n in NAMES[batch::NVCC_BATCHES]]
    _assert_nvcc_compiles(items, tmp_path, f"batch{batch}")


def test_nvcc_compiles_checkpointed_pieces(tmp_path):
    """The pieces a checkpointed gradient runs on CUDA (the segment and after kernels, the
    vjps of the step and after; cholesky has nothing before its loop) as nvcc compiles
    them."""
    from polyad.checkpointing import CheckpointedFunction
    from tape_kernels import KERNELS
    kernel, wrt = KERNELS["cholesky"]
    fn = pa.compile(pa.grad(kernel, wrt, checkpoint=True), target="cuda-sim")
    assert isinstance(fn, CheckpointedFunction)
    fn.checkpointer.compile_all()
    items = sorted(fn.checkpointer._compiled.items())
    assert len(items) == 4
    _assert_nvcc_compiles(items, tmp_path, "pieces")


def test_nvcc_builds_a_loadable_library():
    k = pa.compile(tv_cost, target="cuda")
    assert k.library.exists() and k.library.suffix == ".so"
    assert k.arch == ("native" if gpu_count() else DEFAULT_ARCH)


# ---------------------------------------------------------------------------
# the simulator against the reference interpreter
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_simulator_matches_the_interpreter(simulated, name):
    assert_matches_reference(name, simulated[name])


def test_simulator_builds_read_the_precompiled_runtime_header(tmp_path, monkeypatch):
    """A cuda-sim build includes polyad_cuda.h precompiled (built once per cache
    directory): g++'s -H marks a precompiled header it used with '!'. The header's
    flags must stay those of the builds, or g++ silently parses the header again.
    ``polyad cache clear`` removes it."""
    from polyad.runtime import toolchain
    monkeypatch.setenv("POLYAD_CACHE_DIR", str(tmp_path))
    if "GCC" not in subprocess.run([toolchain.cxx_compiler(), "-dM", "-E", "-x", "c++",
                                    "/dev/null"], capture_output=True, text=True).stdout:
        pytest.skip("precompiled headers are looked up by g++ only")
    kernel = pa.Kernel(ir_kernel=tv_cost.ir)  # compiled afresh, into this cache directory
    fn = pa.compile(kernel, target="cuda-sim")
    (pch,) = tmp_path.glob("pch_*")
    assert [p.name for p in pch.iterdir()] == ["polyad_cuda.h.gch"]
    (src,) = tmp_path.glob("tv_cost_sim_*.cu")
    assert src.read_text() == fn.source
    cxx = toolchain.cxx_compiler()
    proc = subprocess.run([cxx, *toolchain.SIM_FLAGS, f"-I{pch}", f"-I{CUDA_INCLUDE}", "-H",
                           "-fsyntax-only", str(src)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines()[0] == f"! {pch / 'polyad_cuda.h.gch'}", proc.stderr[:500]
    assert pch / "polyad_cuda.h.gch" in toolchain.cache_files()
    toolchain.clear_cache()
    assert not list(tmp_path.glob("pch_*"))
    pa.compile(kernel, target="cuda-sim", deterministic=True)
    assert list(tmp_path.glob("pch_*/polyad_cuda.h.gch"))  # built again after the clear


def test_simulator_builds_without_a_precompiled_header_where_the_compiler_makes_none(
        tmp_path, monkeypatch):
    """A C++ compiler that cannot precompile the header (here a wrapper that refuses
    ``-x c++-header``) leaves no .gch behind; the builds read the header itself."""
    from polyad.runtime import toolchain
    wrapper = tmp_path / "cxx"
    wrapper.write_text('#!/bin/sh\ncase " $* " in *" c++-header "*) echo "no headers" >&2; '
                       f'exit 1;; esac\nexec {toolchain.cxx_compiler()} "$@"\n')
    wrapper.chmod(0o755)
    cache = tmp_path / "cache"
    monkeypatch.setenv("POLYAD_CACHE_DIR", str(cache))
    monkeypatch.setenv("CXX", str(wrapper))
    toolchain.cxx_compiler.cache_clear()
    try:
        fn = pa.compile(pa.Kernel(ir_kernel=tv_cost.ir), target="cuda-sim")
    finally:
        monkeypatch.delenv("CXX")
        toolchain.cxx_compiler.cache_clear()
    assert not list(cache.glob("pch_*/*.gch")) and not list(cache.glob("pch_*/.*"))
    rng = np.random.default_rng(0)
    g, b = rng.standard_normal((5, 6)), rng.standard_normal((5, 6))
    np.testing.assert_allclose(fn(g, b, 0.3), tv_cost(g, b, 0.3), rtol=1e-12)


# ---------------------------------------------------------------------------
# the plan: block reductions, shared-memory privatization, atomics
# ---------------------------------------------------------------------------


def test_scalar_reduction_is_a_block_reduction(simulated):
    sim = simulated["tv_cost"]
    primal = pa.compile(tv_cost, target="cuda-sim")
    assert "pa_reduce_add(&pa_s->C, C);" in primal.source
    assert any(lp.reductions for lp in _plan(tv_cost).loops.values())
    assert "pa_reduce_add" in sim.source  # value_and_grad returns the value too


def test_filter_gradient_is_summed_in_registers(simulated):
    """deconv's d_f[k] += ... (5 taps): per-thread partial sums and one block reduction
    per element, not shared-memory atomics on 5 addresses."""
    sim = simulated["deconv_wrt_image_and_filter"]
    assert "d_f_lane[5] = {};" in sim.source
    assert re.search(r"d_f_lane\[\w+\] \+= ", sim.source)
    for e in range(5):
        assert f"pa_reduce_add(&d_f[{e}], d_f_lane[{e}]);" in sim.source
    assert "pa_privatize_begin(d_f" not in sim.source and "atomicAdd(&d_f" not in sim.source
    loops = _plan(GRADIENTS["deconv_wrt_image_and_filter"][0]).loops.values()
    assert any("d_f" in lp.lanes and "per-thread partial sums" in lp.decision() for lp in loops)


def test_other_small_targets_are_privatized_in_shared_memory(simulated):
    """Small targets updated at loop-dependent indices keep a shared-memory copy per block."""
    shared = [n for n in NAMES for lp in _plan(kernel_of(n)).loops.values()
              if set(lp.privatized) - set(lp.lanes)]
    assert shared, "no corpus kernel exercises shared-memory privatization"
    for n in shared:
        assert "pa_privatize_begin(" in simulated[n].source, n
        assert re.search(r"atomicAdd\(&\w+_block\[", simulated[n].source), n


def test_a_threads_own_element_is_updated_in_a_register(simulated):
    """The TV gradient's d_g[m, n] (zeroed, then five guarded updates): one register per
    thread and one store, not a store after every update; an element read before its first
    write is loaded first (piecewise's y[i], written under conditions); one written once is
    left alone (floyd-warshall's row copy, test_split)."""
    sim = simulated["tv_cost"]
    assert "double d_g_here;  // this thread's d_g[m * N + n], stored once below" in sim.source
    assert sim.source.count("d_g[m * N + n] = d_g_here;") == 1
    assert "d_g[m * N + n] +=" not in sim.source
    inplace = simulated["temp_inplace_relu_and_mul_assign"]
    assert "h_here *= h_here;  // line 562: h[i] *= h[i]" in inplace.source  # DSL text kept
    piecewise = simulated["test_forward_kernels.piecewise"]
    assert "double y_here = y[i];  // this thread's y[i], stored once below" in piecewise.source
    assert "y_here = 2.0 * x[i];  // line 685: y[i] = 2.0 * x[i]" in piecewise.source


def test_other_scatters_use_global_atomics(simulated):
    atomics = [n for n in NAMES if any(lp.atomic for lp in _plan(kernel_of(n)).loops.values())]
    assert atomics, "no corpus kernel exercises global atomics"
    for n in atomics:
        assert re.search(r"atomicAdd\(&", simulated[n].source), n


def test_two_dimensional_bands_get_32x8_tiles(simulated):
    blocks = {lp.block for n in NAMES for lp in _plan(kernel_of(n)).loops.values()
              if len(lp.band) == 2}
    assert blocks == {(32, 8, 1)}


@pytest.mark.parametrize("name", ["tv_cost", "logsumexp", "deconv_wrt_image_and_filter"])
def test_deterministic_two_pass_reduction(name):
    derived, args = GRADIENTS[name]
    det = pa.compile(derived, target="cuda-sim", deterministic=True)
    omp = pa.compile(derived, deterministic=True)
    if any(lp.reductions for lp in _plan(derived, deterministic=True).loops.values()):
        assert "pa_reduce_store(" in det.source and "pa_sum_partials(" in det.source
    assert "pa_reduce_add(" not in det.source and "atomicAdd" not in det.source
    first = results(det(**copies(args)))
    again = results(det(**copies(args)))
    expected = results(omp(**copies(args)))
    for a, b, e in zip(first, again, expected):
        np.testing.assert_array_equal(a, b)
        assert_matches(a, e, name)


Ms, Ns = pa.sizes("Ms Ns")


@pa.kernel
def scaled_rows(x: pa.f64[Ms, Ns], y: pa.Out(pa.f64[Ms, Ns])):
    for m in range(Ms):
        s = x[m, 0] * 2.0
        for n in range(Ns):
            y[m, n] = x[m, n] * s


def _distributed(kernel) -> list:
    """The loops of ``kernel``'s CUDA plan that run as one launch per part of their body."""
    return [lp for lp in _plan(kernel).loops.values() if lp.launches]


def _assert_sim_matches_openmp(kernel, rng, shapes) -> None:
    """The simulator's results equal OpenMP's and the reference interpreter's."""
    sim, omp = pa.compile(kernel, target="cuda-sim"), pa.compile(kernel)
    for shape in shapes:
        x = rng.standard_normal(shape)
        got = results(sim(x))
        for a, e in zip(got, results(omp(x))):
            np.testing.assert_allclose(a, e, rtol=1e-12, atol=1e-12, err_msg=str(shape))
        for a, e in zip(got, results(call_interpreted(kernel, x))):
            np.testing.assert_allclose(a, e, rtol=1e-12, atol=1e-12, err_msg=str(shape))


def test_a_row_loop_beside_border_code_runs_as_one_launch_per_part(rng):
    """The deconvolution gradient's row loops (``benchmarks/kernels.py``) hold a column
    loop beside other code (the forward blur's edge columns, the zeroing of d_t's edge
    rows, the sums into d_x's last column): each part of such a body runs as a launch of
    its own, the column loops as 2-D grids, instead of one thread per row walking its row
    (uncoalesced, and only M threads: 12x slower on an H200 at 4096^2)."""
    derived = pa.grad(deconvolution("f64"), ["x", "f"])
    distributed = _distributed(derived)
    assert len(distributed) >= 3
    for lp in distributed:
        assert "distributed over" in lp.decision()
        assert any(len(h.band) == 2 for h in lp.launches), lp.decision()
    sim, omp = pa.compile(derived, target="cuda-sim"), pa.compile(derived)
    assert not re.search(r"for \(int64_t \w+ = 0; \w+ < N; \w+\+\+\)", sim.source)
    for shape in [(1, 1), (1, 4), (2, 3), (3, 2), (4, 1), (5, 6), (7, 9)]:
        call = dict(x=rng.standard_normal(shape), f=rng.standard_normal(5),
                    y=rng.standard_normal(shape))
        got = results(sim(**copies(call)))
        for a, e in zip(got, results(omp(**copies(call)))):
            assert_matches(a, e, f"deconv gradient at {shape}")
        for a, e in zip(got, results(call_interpreted(derived, **copies(call)))):
            assert_matches(a, e, f"deconv gradient at {shape}, against the interpreter")


def test_parts_that_share_a_scalar_run_in_one_launch(rng):
    """A row's scalar that its column loop reads would not reach a launch of its own (each
    thread keeps its copy): the row loop stays one launch, and says why. The values agree
    with OpenMP at sizes from 1."""
    assert not _distributed(scaled_rows)
    mappings = [lp.mapping for lp in _plan(scaled_rows).loops.values()]
    assert any("the scalar 's' is accessed in two of the parts" in m for m in mappings)
    _assert_sim_matches_openmp(scaled_rows, rng, [(1, 1), (1, 3), (3, 1), (4, 5)])


def test_distribution_keeps_every_dependence_between_parts():
    """``why_parts_not_apart`` on the deconvolution gradient's loop over the rows of d_x
    (the column loop zeroes and sums d_x[m, n]; the statements after it add into
    d_x[m, N - 1]): legal in the body's order; with the parts swapped, the zeroing of
    d_x[m, N - 1] (an update pair of the accumulator d_x, ordered only when asked) would
    come after the sums into it."""
    plan = _plan(pa.grad(deconvolution("f64"), ["x", "f"]))
    scheduled = plan.scheduled
    (lp,) = [lp for lp in plan.loops.values() if lp.launches and "S0" in lp.facts.statements]
    assert [len(h.band) for h in lp.launches] == [2, 1]
    loop_part = sorted(plan.loops[lp.launches[0].band[1]].facts.statements)
    after = sorted(lp.facts.statements - set(loop_part))
    assert after and all(scheduled.statement(n).target_name == "d_x" for n in after)
    assert why_parts_not_apart(scheduled, [loop_part, after]) == ""
    assert why_parts_not_apart(scheduled, [after, loop_part]) == (
        "an output dependence on 'd_x' runs from a later part to an earlier one")


def test_many_blocks_and_a_large_reduction(rng):
    cuda_corpus.assert_tv_gradient_over_many_blocks("cuda-sim", (300, 301), rng)


# ---------------------------------------------------------------------------
# host side: device arrays in place, no GPU
# ---------------------------------------------------------------------------


def test_device_arrays_are_used_in_place(rng):
    k = pa.compile(FORWARD["test_forward_kernels.blur"], target="cuda-sim")
    x = rng.standard_normal((5, 7))
    dx = k.to_device(x)
    y = k(dx)
    assert isinstance(y, DeviceArray) and y.shape == (5, 7)
    np.testing.assert_allclose(y.numpy(), pa.compile(FORWARD["test_forward_kernels.blur"])(x),
                               rtol=1e-12)
    out = k.to_device(np.zeros((5, 7)))
    assert k(dx, out) is out
    np.testing.assert_allclose(out.numpy(), y.numpy(), rtol=0, atol=0)


class _ArrayInterfaceOf:
    """A numpy array exposed only through ``__cuda_array_interface__`` (the generic path)."""

    def __init__(self, a):
        self.a = a

    @property
    def __cuda_array_interface__(self):
        a = self.a
        return {"shape": a.shape, "typestr": a.dtype.str, "data": (a.ctypes.data, False),
                "strides": None if a.flags.c_contiguous else a.strides, "version": 3}


def test_torch_tensors_are_read_like_the_array_interface():
    """PyTorch tensors skip torch's slow ``__cuda_array_interface__`` property: the view
    reads the same pointer, shape, dtype and contiguity from the tensor itself."""
    torch = pytest.importorskip("torch")
    from polyad.runtime.cuda import _DeviceView
    fields = ("shape", "ndim", "dtype", "ptr", "readonly", "contiguous", "nbytes")
    for t in (torch.ones(3, 4), torch.ones(3, 4, dtype=torch.float64).t(),
              torch.ones(5, dtype=torch.int32), torch.ones(2, 3, 4)[:, 1]):
        fast, generic = _DeviceView(t), _DeviceView(_ArrayInterfaceOf(t.numpy()))
        assert {f: getattr(fast, f) for f in fields} == {f: getattr(generic, f) for f in fields}


def test_device_arrays_are_checked(rng):
    k = pa.compile(FORWARD["test_forward_kernels.blur"], target="cuda-sim")
    with pytest.raises(pa.DTypeError, match="dtype float32"):
        k(k.to_device(rng.standard_normal((5, 7)).astype(np.float32)))
    with pytest.raises(pa.ShapeError, match="dimension"):
        k(k.to_device(rng.standard_normal(5)))
    x = k.to_device(rng.standard_normal((5, 7)))
    with pytest.raises(pa.ShapeError, match="shares memory"):
        k(x, x)


def test_without_a_gpu_target_cuda_raises_device_error(rng):
    g, b = rng.standard_normal((6, 7)), rng.standard_normal((6, 7))
    k = pa.compile(tv_cost, target="cuda")
    if gpu_count() == 0:
        with pytest.raises(pa.DeviceError, match="no CUDA device"):
            k(g, b, 0.1)
    else:
        assert k(g, b, 0.1) == pytest.approx(tv_cost(g, b, 0.1), rel=1e-12)


# ---------------------------------------------------------------------------
# inspection and emitted sources
# ---------------------------------------------------------------------------


def test_explain_shows_the_cuda_plan():
    text = pa.explain(pa.grad(tv_cost, "g"), target="cuda")
    assert "target cuda" in text
    assert f"architecture: nvcc -arch=native when a GPU is present, else -arch={DEFAULT_ARCH}" \
        in text
    assert "cuda grid x" in text
    assert "__global__ void" in text
    text = pa.explain(tv_cost, target="cuda-sim")
    assert "C (+=): block reduction + atomicAdd" in text


def test_emit_writes_cu_header_and_runtime_headers(tmp_path):
    from polyad import build
    (emitted,) = build.emit_sources([pa.grad(tv_cost, "g")], tmp_path, target="cuda")
    assert emitted.c_file.suffix == ".cu"
    for name in ("polyad_cuda.h", "polyad_cuda_sim.h"):
        assert (tmp_path / name).is_file()
    header = emitted.h_file.read_text()
    assert "DEVICE pointers" in header and "-fopenmp" not in header
    cmd = [nvcc(), *[f for f in NVCC_FLAGS if f != "-shared"], f"-arch={DEFAULT_ARCH}",
           "-c", str(emitted.c_file), "-o", str(tmp_path / "k.o")]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr


def test_cli_show_and_emit_target_cuda(tmp_path, capsys):
    from polyad import cli
    src = tmp_path / "k.py"
    src.write_text("import polyad as pa\nN, = pa.sizes('N')\n\n@pa.kernel\n"
                   "def total(x: pa.f64[N]) -> pa.f64:\n    s = 0.0\n    for i in range(N):\n"
                   "        s += x[i] * x[i]\n    return s\n")
    assert cli.main(["show", f"{src}:total", "--grad", "x", "--target", "cuda"]) == 0
    assert "target cuda" in capsys.readouterr().out
    assert cli.main(["emit", f"{src}:total", "--target", "cuda", "-o", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "total.cu").is_file()


def test_runtime_failures_raise_device_error():
    k = pa.compile(FORWARD["test_forward_kernels.blur"], target="cuda-sim")
    with pytest.raises(pa.DeviceError, match="allocating device memory: .*out of memory"):
        k.runtime.alloc(2 ** 62)
    x = np.ones((4, 5))
    np.testing.assert_allclose(k(x), np.ones((4, 5)), rtol=1e-15)  # the error is not sticky
