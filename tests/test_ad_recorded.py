"""Exact to-be-recorded analysis (issue 19): tapes hold only values that are
overwritten before the reverse sweep reads them.

* the recorded sets of in-place kernels (cholesky records O(N^2) values, the
  increments of a factorization record nothing, a recurrent cell tapes its
  state per step, not per step and row, the five reads of a stencil step
  share one slice of the array per step, floyd-warshall's reads are all
  overwritten and its tape holds the branch each ``min`` took, one bit each,
  packed 32 to a word: gradients at flag counts that fill no whole word, at 1
  and 2 threads, and on cuda-sim);
* tapes over triangular loops packed: the cholesky and lu division tapes hold
  the triangle below the diagonal (half the box), a lower and an upper triangle
  and a tetrahedron of scalar tapes store each element at its own place
  (offsets a bijection onto the elements), through one named offset function
  in the generated C, on cuda-sim too;
* gradients equal to central finite differences (float64) and to the
  untrimmed derivation (``exact_tapes=False``: the structural checks alone, boxed
  tapes) at sizes 1-6, and on the whole AD corpus at its own arguments and at
  sizes 1-6;
* Hessian-vector products over the trimmed tapes against differences of
  gradients, and over budget (their tapes and the tapes' tangents named);
* five trimmed gradients built with AddressSanitizer (tapes indexed by fewer
  dimensions, shared slices, branch flags and packed triangles stay in bounds);
* the memory budget: ``pa.explain`` lists each tape with its formula, a call
  over budget raises ``MemoryBudgetError`` naming tapes, statements, options.
"""

from __future__ import annotations

import os
import textwrap
import zlib

import islpy as isl
import numpy as np
import pytest

import polyad as pa
from ad_helpers import assert_close, fd_grad, run, run_reference, scalar_fn
from cuda_corpus import random_arguments
from polyad import ad, ir
from polyad.ad.reverse import recorded_reads
from polyad.derivatives import DerivedKernel
from tape_kernels import KERNELS, make_args
from test_ad_corpus import CASES

N, = pa.sizes("N")


def untrimmed(kernel, wrt) -> DerivedKernel:
    """``value_and_grad`` derived with the structural tape checks alone."""
    return DerivedKernel(ad.value_and_grad_kernel(kernel.ir, wrt, exact_tapes=False),
                         "value_and_grad", kernel, wrt)


def tapes(kernel, wrt, exact=True):
    return ad.tape_arrays(ad.grad_kernel(kernel.ir, wrt, exact_tapes=exact))


def points(s: isl.Set, n: int) -> int:
    """Number of points of ``s`` with every size parameter set to ``n``."""
    for d in range(s.dim(isl.dim_type.param)):
        s = s.fix_val(isl.dim_type.param, d, isl.Val.int_from_si(s.get_ctx(), n))
    count = [0]
    s.foreach_point(lambda _: count.__setitem__(0, count[0] + 1))
    return count[0]


def copied(args: dict) -> dict:
    return {k: np.copy(v) if isinstance(v, np.ndarray) else v for k, v in args.items()}


def as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


def by_statement(records):
    out = {}
    for r in records:
        out.setdefault(r["statement"], []).append(r)
    return out


# ---------------------------------------------------------------------------
# recorded sets
# ---------------------------------------------------------------------------

def test_cholesky_records_o_n2_values():
    cholesky, wrt = KERNELS["cholesky"]
    recs = recorded_reads(cholesky.ir, wrt)
    stmts = by_statement(recs)
    # the updates read final values only: nothing recorded, structurally they were taped
    for src in ("A[i, j] -= A[i, k] * A[j, k]", "A[i, i] -= A[i, k] * A[i, k]"):
        assert stmts[src], src
        for r in stmts[src]:
            assert r["final"] and r["how"] == "exact: no later write", r
            assert r["recorded"].is_empty()
    # the division and the square root need their overwritten operand
    for src, read in (("A[i, j] /= A[j, j]", "A_work[i, j]"),
                      ("A[i, i] = pa.sqrt(A[i, i])", "A_work[i, i]")):
        (r,) = [r for r in stmts[src] if r["read"] == read]
        assert not r["final"] and r["tape"] is not None
    (pivot,) = [r for r in stmts["A[i, j] /= A[j, j]"] if r["read"] == "A_work[j, j]"]
    assert pivot["final"]
    for n in (5, 9, 14):
        recorded = sum(points(r["recorded"], n) for r in recs if r["recorded"] is not None)
        assert recorded == n * (n - 1) // 2 + n      # below the diagonal, and the diagonal
    assert all(len(t.type.shape) <= 2 for t in tapes(cholesky, wrt))
    gk = ad.grad_kernel(cholesky.ir, wrt)
    assert ad.tape_bytes(gk, {"N": 1500}) == 8 * (1500 * 1499 // 2 + 1500)    # packed
    # the untrimmed derivation asks for the (N, N-1, N-2) tapes of the issue
    assert ad.tape_bytes(ad.grad_kernel(cholesky.ir, wrt, exact_tapes=False),
                         {"N": 1500}) > 25 * 2 ** 30


def test_increments_record_nothing():
    for name in ("cholesky", "lu"):
        kernel, wrt = KERNELS[name]
        for r in recorded_reads(kernel.ir, wrt):
            if "-=" in r["statement"]:
                target = r["statement"].split(" -=")[0].replace("A[", "A_work[")
                assert r["read"] != target, r         # the target is never read
                assert r["final"], r
    seidel, wrt = KERNELS["seidel-2d"]
    assert tapes(seidel, wrt) == [] and tapes(seidel, wrt, exact=False) == []


@pa.kernel
def accumulate_then_overwrite(x: pa.f64[N], A: pa.f64[N, N], y: pa.f64[N]) -> pa.f64:
    for t in range(3):
        for i in range(N):
            for k in range(N):
                y[i] += A[i, k] * pa.sin(x[k])
        for i in range(N):
            x[i] = 0.5 * y[i]
    C = 0.0
    for i in range(N):
        C += y[i] * x[i]
    return C


def test_increment_target_never_recorded_but_its_operand_is():
    recs = recorded_reads(accumulate_then_overwrite.ir, ["x", "A"])
    stmt = [r for r in recs if r["statement"].startswith("y[i] +=")]
    assert {r["read"] for r in stmt} == {"x_work[k]", "A[i, k]"}     # never its target y
    (r,) = [r for r in stmt if r["read"] == "x_work[k]"]
    assert not r["final"] and r["tape"] is not None
    assert all(r["final"] for r in stmt if r["read"] == "A[i, k]")
    (tape,) = [t for t in tapes(accumulate_then_overwrite, ["x", "A"]) if t.name == r["tape"]]
    assert len(tape.type.shape) == 2                      # (t, k): the row i is dropped


def test_recurrent_cell_tapes_state_per_step():
    rnn, wrt = KERNELS["rnn"]
    shapes = sorted(repr(t.type) for t in tapes(rnn, wrt))
    assert shapes == ["f64[T, N]", "f64[T, N]"]
    assert "f64[T, N, N]" in [repr(t.type) for t in tapes(rnn, wrt, exact=False)]


def test_stencil_reads_of_one_step_share_one_slice_per_step():
    diffusion, wrt = KERNELS["diffusion"]
    (tape,) = tapes(diffusion, wrt)
    assert repr(tape.type) == "f64[steps, N, N]"
    assert tape.holds.startswith("A_work per element and iteration of t; A_work[i - 1, j], "
                                 "A_work[i + 1, j], A_work[i, j - 1], A_work[i, j + 1], "
                                 "A_work[i, j] read by: U[i, j] = ")
    assert len(tapes(diffusion, wrt, exact=False)) == 5


def test_floyd_warshall_records_every_comparison():
    fw, wrt = KERNELS["floyd-warshall"]
    recs = [r for r in recorded_reads(fw.ir, wrt) if "pa.min" in r["statement"]]
    assert len(recs) == 3
    for r in recs:
        assert not r["final"] and points(r["recorded"], 5) == 125
    # the adjoint of min needs the branch taken, not the three values compared
    (tape,) = tapes(fw, wrt)
    assert repr(tape.type) == "bit[N, N, N]" and tape.holds.startswith("which branch (")
    assert tape.zero        # pa_bit_set only ORs the 1 bits in
    assert {r["tape"] for r in recs} == {tape.name}
    assert len(tapes(fw, wrt, exact=False)) == 3


def test_floyd_warshall_flags_packed_one_bit_each():
    fw, wrt = KERNELS["floyd-warshall"]
    g = pa.grad(fw, wrt)
    (entry,) = ad.tape_report(g.ir, {"N": 800})
    assert entry["type"] == "bit[N, N, N]" and entry["bytes"] == 800 ** 3 // 8
    # 7^3 = 343 flags: 11 words of 32 bits (the last one partly used)
    assert ad.tape_report(g.ir, {"N": 7})[0]["bytes"] == 11 * 4
    text = pa.explain(g)
    tapes_section = text.split("\ntapes (")[1].split("\n\n")[0]
    assert "bit[N, N, N] = N * N * N / 8 bytes: which branch (" in tapes_section
    assert "total: N * N * N / 8 bytes" in tapes_section
    source = pa.compile(g).source
    assert "pa_bit_set(tape_S0_branch, " in source and "pa_bit_get(tape_S0_branch, " in source
    assert "#pragma omp atomic\n    words[i >> 5] |= 1u << (i & 31);" in source


# ---------------------------------------------------------------------------
# packed triangles
# ---------------------------------------------------------------------------

def offset_at(layout: ir.PackedLayout, point: dict, sizes: dict) -> int:
    """``layout.offset`` at ``point`` (its exact divisions as Python's //)."""
    def fn(x):
        if isinstance(x, ir.Binary) and x.op == "/":
            return ir.Binary("//", x.a, x.b, x.dtype)
        return None
    return ir.eval_integer(ir.map_expr(layout.offset, fn), {**point, **sizes})


def nest_points(layout: ir.PackedLayout, sizes: dict, prefix=()):
    """The elements a packed layout stores, in lexicographic order."""
    d = len(prefix)
    if d == len(layout.names):
        yield prefix
        return
    env = {**sizes, **dict(zip(layout.names, prefix))}
    for x in range(ir.eval_integer(layout.lower[d], env), ir.eval_integer(layout.upper[d], env)):
        yield from nest_points(layout, sizes, prefix + (x,))


TRIANGLE_TAPES = {"s": ("f64[i < N, j < i]", lambda n: n * (n - 1) // 2),
                  "t": ("f64[i < N, i <= j < N - 1]", lambda n: n * (n - 1) // 2),
                  "u": ("f64[i < N, j < i, k < j]", lambda n: n * (n - 1) * (n - 2) // 6),
                  "which": ("bit[i < N, j < i]", lambda n: n * (n - 1) // 2)}


def test_triangular_tapes_are_packed():
    """Tapes over triangular loops store the triangle (tetrahedron) row after row: element
    ``x`` at the number of elements before it, every element at its own place."""
    triangles, wrt = KERNELS["triangles"]
    packed = {t.holds.split()[0]: t for t in tapes(triangles, wrt)}
    assert sorted(packed) == ["s", "t", "u", "which"]
    boxed = {t.holds.split()[0]: t for t in tapes(triangles, wrt, exact=False)}
    for var, (text, count) in TRIANGLE_TAPES.items():
        at = packed[var].type
        assert repr(at) == text
        if var in boxed:       # the untrimmed derivation tapes the values in boxes
            assert at.shape == boxed[var].type.shape and boxed[var].type.layout is None
        for n in range(0, 9):
            sizes = {"N": n}
            assert ir.stored_elements(at, sizes) == count(n)
            assert ad.tape_report(ad.grad_kernel(triangles.ir, wrt), sizes)[
                [t.name for t in tapes(triangles, wrt)].index(packed[var].name)]["bytes"] == \
                at.dtype.storage_bytes(count(n))        # bits: whole words of 32
            offsets = [offset_at(at.layout, dict(zip(at.layout.names, p)), sizes)
                       for p in nest_points(at.layout, sizes)]
            assert offsets == list(range(count(n))), (var, n)
    # packed_tapes=False (benchmarks/memory.py --table packing): the same tapes, boxed
    unpacked = ad.tape_arrays(ad.grad_kernel(triangles.ir, wrt, packed_tapes=False))
    assert [(t.name, t.type.shape) for t in unpacked] == [
        (t.name, t.type.shape) for t in tapes(triangles, wrt)]
    assert all(t.type.layout is None for t in unpacked)
    # lu and cholesky: the division's operand below the diagonal, half the box
    for name in ("lu", "cholesky"):
        kernel, of = KERNELS[name]
        (tape,) = [t for t in tapes(kernel, of) if t.holds.startswith("A_work per element")]
        assert repr(tape.type) == "f64[i < N, j < i]"
        assert ad.tape_report(ad.grad_kernel(kernel.ir, of), {"N": 1500})[-1]["bytes"] == \
            8 * 1500 * 1499 // 2
    # the generated C reads them through one named offset function per tape
    source = pa.compile(pa.grad(triangles, wrt)).source
    s, u = packed["s"].name, packed["u"].name
    assert f"static inline int64_t {s}_at(int64_t i, int64_t j) " \
        "{ return (i * i - i) / 2 + j; }" in source
    assert f"{s}[{s}_at(i, j)] = s;" in source
    assert f"/* {u} stores only its elements i < N, j < i, k < j, row after row */" in source
    assert f"pa_bit_set({packed['which'].name}, {packed['which'].name}_at(i, " in source


def test_packed_tapes_on_cuda_sim():
    for name in ("cholesky", "triangles"):
        kernel, wrt = KERNELS[name]
        g = pa.grad(kernel, wrt)
        sim = pa.compile(g, target="cuda-sim")
        assert "__host__ __device__" in sim.source.split("_at(int64_t i, int64_t j")[0] \
            .splitlines()[-1]
        reference = DerivedKernel(ad.grad_kernel(kernel.ir, wrt, exact_tapes=False), "grad",
                                  kernel, wrt)
        rng = np.random.default_rng(3)
        for n in (1, 4, 7):
            args = make_args(name, n, rng)
            got = g.package(sim(**copied(args)))
            ref = run(reference, **copied(args))
            for a, b in zip(as_tuple(got), as_tuple(ref)):
                assert_close(a, b, 1e-12, 1e-13, what=f"{name} cuda-sim n={n} vs untrimmed")


def shortcut_distances(n: int, rng) -> dict:
    """Floyd-warshall inputs where many ``min`` take the path through ``k`` and many do
    not (``make_args``'s distances in [1, 2) never shortcut: every flag would be 1)."""
    P = rng.uniform(1.0, 10.0, (n, n))
    if n >= 3:
        result = fw_forward(P)
        assert 0 < np.count_nonzero(result != P) < n * n - n    # both branches taken
    return dict(P=P, W=rng.standard_normal((n, n)))


def fw_forward(P):
    P = np.copy(P)
    for k in range(len(P)):
        P = np.minimum(P, P[:, k:k + 1] + P[k:k + 1, :])
    return P


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n", [5, 7, 9])
def test_floyd_warshall_bit_flags_at_any_word_fill(n, threads):
    """125, 343 and 729 flags: none a multiple of 32, so the last word is partly used,
    and rows of the tape straddle words that neighbouring threads set bits of."""
    fw, wrt = KERNELS["floyd-warshall"]
    args = shortcut_distances(n, np.random.default_rng(n))
    with pa.num_threads(threads):
        value, grad = run(pa.value_and_grad(fw, wrt), **copied(args))
    ref_value, ref_grad = run(untrimmed(fw, wrt), **copied(args))
    assert value == pytest.approx(ref_value, rel=1e-13, abs=1e-13)
    assert_close(grad, ref_grad, 1e-12, 1e-13, what=f"n={n}, {threads} threads vs untrimmed")
    assert_close(grad, fd_grad(scalar_fn(fw, args), args, wrt), 1e-6, 1e-7,
                 what=f"n={n}, {threads} threads vs finite differences")


@pytest.mark.parametrize("n", [1, 3, 6, 7])
def test_floyd_warshall_bit_flags_on_cuda_sim(n):
    fw, wrt = KERNELS["floyd-warshall"]
    args = shortcut_distances(n, np.random.default_rng(10 + n))
    g = pa.grad(fw, wrt)
    sim = pa.compile(g, target="cuda-sim")
    assert "atomicOr(&words[i >> 5], 1u << (i & 31));" in sim.source
    got = g.package(sim(**copied(args)))
    ref = run(DerivedKernel(ad.grad_kernel(fw.ir, wrt, exact_tapes=False), "grad", fw, wrt),
              **copied(args))
    assert_close(got, ref, 1e-12, 1e-13, what=f"cuda-sim n={n} vs untrimmed")


# ---------------------------------------------------------------------------
# gradients
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(KERNELS))
def test_trimmed_gradient_vs_fd_and_untrimmed(name):
    kernel, wrt = KERNELS[name]
    wrt = [wrt] if isinstance(wrt, str) else list(wrt)
    trimmed = pa.value_and_grad(kernel, wrt)
    reference = untrimmed(kernel, wrt)
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    for n in range(1, 7):
        args = make_args(name, n, rng, steps=3)
        value, grads = run(trimmed, **copied(args))
        ref_value, ref_grads = run(reference, **copied(args))
        assert value == pytest.approx(ref_value, rel=1e-13, abs=1e-13)
        f = scalar_fn(kernel, args)
        for w, g, rg in zip(wrt, grads, ref_grads):
            assert_close(g, rg, 1e-12, 1e-13, what=f"{name} n={n}: d/d{w} vs untrimmed")
            if n in (1, 2, 4, 6):
                assert_close(g, fd_grad(f, args, w), 1e-6, 1e-7,
                             what=f"{name} n={n}: d/d{w} vs finite differences")


@pytest.mark.parametrize("name", ["cholesky", "floyd-warshall", "rnn", "triangles"])
def test_hessian_vector_products_over_trimmed_tapes(name):
    kernel, wrt = KERNELS[name]
    wrt = [wrt] if isinstance(wrt, str) else list(wrt)
    rng = np.random.default_rng(7)
    args = make_args(name, 4, rng, steps=3)
    v = {w: rng.standard_normal(np.shape(args[w])) for w in wrt}
    hv = run(pa.hvp(kernel, wrt), **copied(args), **{f"{w}_dot": v[w] for w in wrt})
    hv = hv if isinstance(hv, tuple) else (hv,)
    grad = pa.grad(kernel, wrt)
    eps = 1e-5

    def g_at(sign):
        shifted = {**copied(args), **{w: args[w] + sign * eps * v[w] for w in wrt}}
        g = run(grad, **shifted)
        return g if isinstance(g, tuple) else (g,)
    fd = [(p - m) / (2 * eps) for p, m in zip(g_at(1), g_at(-1))]
    for w, a, b in zip(wrt, hv, fd):
        assert_close(a, b, 1e-5, 1e-6, what=f"{name}: H v for {w}")
    # the hvp kernel keeps the gradient's trimmed tapes and adds their tangents
    grad_tapes = ad.tape_arrays(ad.grad_kernel(kernel.ir, wrt))
    hvp_tapes = ad.tape_arrays(pa.hvp(kernel, wrt).ir)
    tangents = [t for t in grad_tapes if t.type.dtype.is_float]   # branch flags have none
    assert sorted(repr(t.type) for t in hvp_tapes) == sorted(
        repr(t.type) for t in grad_tapes + tangents)


def test_corpus_trimmed_equals_untrimmed():
    smaller = 0
    for name, c in sorted(CASES.items()):
        rng = np.random.default_rng(zlib.crc32(name.encode()))
        kernel, args = c["make"](rng)
        wrt = [c["wrt"]] if isinstance(c["wrt"], str) else list(c["wrt"])
        trimmed = pa.value_and_grad(kernel, wrt)
        value, grads = run_reference(trimmed, **args, **c["sizes"])
        ref_value, ref_grads = run_reference(untrimmed(kernel, wrt), **args, **c["sizes"])
        assert value == pytest.approx(ref_value, rel=1e-13, abs=1e-13), name
        for w, g, rg in zip(wrt, grads, ref_grads):
            assert_close(g, rg, 1e-12, 1e-13, what=f"{name}: d/d{w}")
        exact = sum(len(t.type.shape) for t in tapes(kernel, wrt))
        assert exact <= sum(len(t.type.shape) for t in tapes(kernel, wrt, exact=False)), name
        smaller += len(tapes(kernel, wrt)) < len(tapes(kernel, wrt, exact=False))
    assert smaller >= 1     # the analysis removes tapes somewhere in the corpus


def corpus_case(name: str):
    """``(kernel, wrt list, untrimmed value_and_grad)`` of AD corpus case ``name``."""
    c = CASES[name]
    kernel, _ = c["make"](np.random.default_rng(0))
    wrt = [c["wrt"]] if isinstance(c["wrt"], str) else list(c["wrt"])
    return kernel, wrt, untrimmed(kernel, wrt)


def corpus_arguments(name: str, kernel, n: int, rng):
    """Random arguments of corpus case ``name`` with every size ``n`` (at most 3 for kernels
    of more than three sizes: the interpreter runs them); None where the primal itself
    rejects them (a kernel reading ``x[1]`` needs ``N >= 2``)."""
    k = kernel.ir
    fixed = CASES[name]["sizes"]
    sizes = {s: fixed.get(s, n if len(k.sizes) <= 3 else min(n, 3)) for s in k.sizes}
    args = {**random_arguments(kernel, rng, sizes), **fixed}
    try:
        run_reference(kernel, **copied(args))
    except (IndexError, pa.PolyadError):
        return None
    return args


def test_corpus_trimmed_equals_untrimmed_at_sizes_1_to_6():
    """Every AD corpus case at sizes 1-6 (random arguments): the trimmed derivation (exact
    recorded sets, packed tapes) equals the untrimmed one, both interpreted."""
    for name in sorted(CASES):
        kernel, wrt, reference = corpus_case(name)
        trimmed = pa.value_and_grad(kernel, wrt)
        rng = np.random.default_rng(zlib.crc32(name.encode()))
        ran = 0
        for n in range(1, 7):
            args = corpus_arguments(name, kernel, n, rng)
            if args is None:
                continue
            value, grads = run_reference(trimmed, **copied(args))
            ref_value, ref_grads = run_reference(reference, **copied(args))
            assert value == pytest.approx(ref_value, rel=1e-13, abs=1e-13, nan_ok=True), name
            for w, g, rg in zip(wrt, as_tuple(grads), as_tuple(ref_grads)):
                assert_close(g, rg, 1e-12, 1e-13, what=f"{name} n={n}: d/d{w}")
            ran += 1
        assert ran >= 4, name


# ---------------------------------------------------------------------------
# AddressSanitizer
# ---------------------------------------------------------------------------

ASAN_SCRIPT = textwrap.dedent('''
    import sys
    sys.path.insert(0, {tests!r})
    import numpy as np
    import polyad as pa
    from polyad.testing import call_interpreted
    from tape_kernels import KERNELS, make_args

    rng = np.random.default_rng(5)
    for name in ("cholesky", "rnn", "floyd-warshall", "diffusion", "triangles"):
        kernel, wrt = KERNELS[name]
        g = pa.grad(kernel, wrt)
        c = pa.compile(g, sanitize="address")
        for n in (1, 3, 6, 7):
            args = make_args(name, n, rng, steps=4)
            got = g.package(c(**{{k: np.copy(v) if isinstance(v, np.ndarray) else v
                                  for k, v in args.items()}}))
            ref = g.package(call_interpreted(g.ir, **args))
            got = got if isinstance(got, tuple) else (got,)
            ref = ref if isinstance(ref, tuple) else (ref,)
            for a, b in zip(got, ref):
                np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12, err_msg=name)
    print("TAPE-ASAN-OK")
''')


def test_trimmed_tapes_clean_under_asan(tmp_path, repo_root):
    from test_asan import run_script_under_asan
    run_script_under_asan(tmp_path, repo_root, ASAN_SCRIPT.format(tests=os.path.join(repo_root, "tests")),
                          "TAPE-ASAN-OK")


# ---------------------------------------------------------------------------
# the memory budget, said before it happens
# ---------------------------------------------------------------------------

def test_over_budget_call_names_tapes_formulas_and_options():
    cholesky, wrt = KERNELS["cholesky"]
    args = make_args("cholesky", 120, np.random.default_rng(0))
    g = pa.grad(cholesky, wrt, memory="200KB")
    with pytest.raises(pa.MemoryBudgetError) as err:
        g(**copied(args))
    msg = str(err.value)
    assert isinstance(err.value, pa.PolyadError) and isinstance(err.value, MemoryError)
    assert "N=120" in msg and "memory='200KB'" in msg and "POLYAD_MEMORY_BUDGET" in msg
    assert "f64[i < N, j < i] = 8 * ((N * N - N) // 2) bytes" in msg
    assert "read by: A[i, j] /= A[j, j] (line " in msg
    # within budget the same gradient runs and matches the unbudgeted one
    ok = pa.grad(cholesky, wrt, memory="2MB")(**copied(args))
    np.testing.assert_array_equal(ok, pa.grad(cholesky, wrt)(**copied(args)))


def test_hessian_vector_product_over_budget_names_tapes_and_tangents():
    """``pa.hvp`` derives from the trimmed, packed gradient: its tapes and their tangents
    are checked against ``memory=`` before anything is allocated."""
    cholesky, wrt = KERNELS["cholesky"]
    args = make_args("cholesky", 120, np.random.default_rng(0))
    direction = np.random.default_rng(1).standard_normal((120, 120))
    h = pa.hvp(cholesky, wrt, memory="300KB")
    with pytest.raises(pa.MemoryBudgetError) as err:
        h(**copied(args), A_dot=direction)
    msg = str(err.value)
    assert "cholesky_cost_hvp_A() would allocate" in msg and "memory='300KB'" in msg
    assert "tape tape_A_work f64[i < N, j < i] = 8 * ((N * N - N) // 2) bytes = 55.8 KiB: " \
        "A_work per element; A_work[i, j] read by: A[i, j] /= A[j, j] (line " in msg
    assert "tape tape_A_work_dot f64[i < N, j < i] = 8 * ((N * N - N) // 2) bytes = 55.8 KiB: " \
        "the tangent of tape_A_work" in msg
    within = pa.hvp(cholesky, wrt, memory="1MB")(**copied(args), A_dot=direction)
    np.testing.assert_array_equal(within, pa.hvp(cholesky, wrt)(**copied(args), A_dot=direction))


def test_budget_from_environment(monkeypatch):
    rnn, wrt = KERNELS["rnn"]
    args = make_args("rnn", 40, np.random.default_rng(1), steps=50)
    monkeypatch.setenv("POLYAD_MEMORY_BUDGET", "10KiB")
    with pytest.raises(pa.MemoryBudgetError, match=r"POLYAD_MEMORY_BUDGET=10KiB"):
        pa.grad(rnn, wrt)(**copied(args))
    monkeypatch.setenv("POLYAD_MEMORY_BUDGET", "1GB")
    pa.grad(rnn, wrt)(**copied(args))


def test_untrimmed_cholesky_at_1500_fails_before_allocating():
    cholesky, wrt = KERNELS["cholesky"]
    g = DerivedKernel(ad.grad_kernel(cholesky.ir, wrt, exact_tapes=False), "grad", cholesky, wrt)
    g.memory = "8GB"
    g.checkpoint = False     # the taped program itself (tests/test_checkpoint.py checkpoints)
    A = np.eye(1500)
    with pytest.raises(pa.MemoryBudgetError, match=r"8 \* N \* \(N - 1\) \* \(N - 2\) bytes "
                                                   r"= 25\.1 GiB"):
        g(A, A)


def test_bad_budget_is_rejected_at_once():
    cholesky, wrt = KERNELS["cholesky"]
    for bad in ("lots", "-1GB", 0, True):
        with pytest.raises(pa.MemoryBudgetError):
            pa.grad(cholesky, wrt, memory=bad)


def test_explain_lists_tapes_with_formulas():
    cholesky, wrt = KERNELS["cholesky"]
    text = pa.explain(pa.grad(cholesky, wrt, memory="3GB"))
    tapes_section = text.split("\ntapes (")[1].split("\n\n")[0]
    assert "f64[i < N, j < i] = 8 * ((N * N - N) // 2) bytes: A_work per element; " \
        "A_work[i, j] read by: A[i, j] /= A[j, j]" in tapes_section
    assert "f64[N] = 8 * N bytes: A_work[i, i] read by: A[i, i] = pa.sqrt(A[i, i])" \
        in tapes_section
    assert "total: 8 * N + 8 * ((N * N - N) // 2) bytes" in tapes_section
    assert "(memory='3GB')" in tapes_section
    assert "-=" not in tapes_section          # the updates read final values: no tape


def test_budget_guards_device_temporaries_too():
    rnn, wrt = KERNELS["rnn"]
    args = make_args("rnn", 8, np.random.default_rng(2), steps=30)
    g = pa.grad(rnn, wrt, memory="1KiB")
    sim = pa.compile(g, target="cuda-sim")
    with pytest.raises(pa.MemoryBudgetError, match="tape_"):
        sim(**copied(args))
