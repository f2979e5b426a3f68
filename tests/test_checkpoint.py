"""Checkpointed reverse mode (issue 19, part 2): long sequential loops reversed from
snapshots of their state instead of full tapes.

* the binomial (revolve) schedule: fewest forward steps (against a brute-force
  minimum), every step reversed once, in order, with at most the snapshots given;
* the split of a kernel around its loop: the state snapshot holds the arrays whose
  values flow from one iteration to the next (``A`` of the diffusion, not ``U``);
* gradients with checkpointing equal to those without and to central finite
  differences (float64) for the nonlinear diffusion, the recurrent cell and the
  in-place cholesky factorization, at sizes 1-6 and step counts 0, 1 and steps
  not divisible by anything the schedule chooses; the plan (snapshots,
  recomputed steps) asserted against the steps the driver ran;
* every checkpointable case of the AD corpus, checkpointed, equal to the untrimmed
  derivation at sizes 1-6;
* ``pa.vjp`` and ``pa.value_and_grad`` through the same path;
* automatic when the tapes exceed the budget (``memory=``, ``POLYAD_MEMORY_BUDGET``),
  ``MemoryBudgetError`` when even checkpointing cannot fit, the checkpoints in
  ``pa.explain``; the same driver over pieces compiled for CUDA (the CPU
  simulator);
* one checkpointed gradient with its pieces built under AddressSanitizer.
"""

from __future__ import annotations

import os
import textwrap
from functools import lru_cache

import numpy as np
import pytest

import polyad as pa
from ad_helpers import assert_close, fd_grad, run_reference, scalar_fn
from polyad import ad, checkpointing, ir
from polyad.ad import checkpoint as ck
from tape_kernels import KERNELS, make_args

N, = pa.sizes("N")


def copied(args: dict) -> dict:
    return {k: np.copy(v) if isinstance(v, np.ndarray) else v for k, v in args.items()}


def as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


# ---------------------------------------------------------------------------
# the binomial schedule
# ---------------------------------------------------------------------------

@lru_cache(maxsize=None)
def fewest_advances(steps: int, free: int) -> int:
    """Brute force: the fewest forward steps reversing ``steps`` steps with ``free``
    snapshots besides the start (split at every possible point)."""
    if steps <= 1:
        return 0
    if free == 0:
        return steps * (steps - 1) // 2
    return min(m + fewest_advances(steps - m, free - 1) + fewest_advances(m, free)
               for m in range(1, steps))


def replay(actions):
    """Run a schedule on step numbers: (steps reversed in order, slots used)."""
    slots, state, reversed_ = {}, 0, []
    for a in actions:
        if a[0] == "store":
            assert state == a[2]
            slots[a[1]] = state
        elif a[0] == "restore":
            assert slots[a[1]] == a[2]
            state = a[2]
        elif a[0] == "advance":
            assert state == a[1] and a[2] > a[1]
            state = a[2]
        else:
            assert state == a[1]
            reversed_.append(a[1])
    return reversed_, set(slots)


def test_revolve_is_binomial_and_optimal():
    for steps in range(0, 26):
        for free in range(0, 7):
            actions = ck.revolve_actions(steps, free)
            order, slots = replay(actions)
            assert order == list(range(steps - 1, -1, -1))
            assert len(slots) <= free + 1
            counts = ck.schedule_counts(actions)
            assert counts["advances"] == fewest_advances(steps, free) == ck.advances(steps, free)
    # the closed form r * l - beta(c + 1, r - 1), c = snapshots + start
    assert ck.advances(501, 20) == 3 * 501 - ck.beta(22, 2) == 1227
    assert ck.schedule_counts(ck.revolve_actions(501, 20))["advances"] == 1227


# ---------------------------------------------------------------------------
# the split
# ---------------------------------------------------------------------------

def test_split_state_is_what_flows_between_iterations():
    sp = ck.split_loop(KERNELS["diffusion"][0].ir)
    assert sp.loop.var == "t" and sp.before is None and sp.after is not None
    assert sp.state == ("A",)                          # U is rewritten before it is read
    assert {p.name: p.intent for p in sp.segment.params if p.is_array} == \
        {"A": "inout", "U": "inout"}
    # the step kernel its vjp runs on: every read of A sees the step's entry value, so A is
    # copied into the output A_next and updated there; U is the step's own; tanh's
    # argument gets a per-point array
    assert sp.renamed == {"A": "A_next"}
    assert {p.name: p.intent for p in sp.step.params if p.is_array} == \
        {"A": "in", "A_next": "out"}
    assert {t.name: t.role for t in sp.step.temps} == {"U": "user", "S0_arg": "user"}
    step_vjp = ad.vjp_kernel(sp.step, ["A"])
    assert ad.tape_arrays(step_vjp) == []
    tanh_calls = [x for st in step_vjp.statements for x in ir.walk(st.expr)
                  if isinstance(x, ir.Call) and x.func == "tanh"]
    assert len(tanh_calls) == 2                    # 1 - tanh(z) * tanh(z), once per point
    assert all(isinstance(c.args[0], ir.Load) and c.args[0].array == "S0_arg"
               for c in tanh_calls)
    rnn = ck.split_loop(KERNELS["rnn"][0].ir)
    assert rnn.state == ("h",) and rnn.renamed == {"h": "h_next"}
    chol = ck.split_loop(KERNELS["cholesky"][0].ir)
    assert chol.loop.var == "i" and chol.state == ("A",)
    assert chol.renamed == {}                       # the step reads elements it wrote


@pa.kernel
def carried_scalar(x: pa.f64[N], steps: pa.i64) -> pa.f64:
    s = 0.0
    for t in range(steps):
        for i in range(N):
            s += x[i] * x[i]
    return s


def test_loop_carrying_a_scalar_is_refused_when_forced():
    with pytest.raises(ck.NotCheckpointable, match="scalar"):
        ck.split_loop(carried_scalar.ir)
    g = pa.grad(carried_scalar, "x", checkpoint=True)
    with pytest.raises(pa.NotDifferentiableError, match="one-element array"):
        g(np.ones(3), 2)
    # not forced: the ordinary gradient
    np.testing.assert_allclose(pa.grad(carried_scalar, "x")(np.ones(3), 2), 4 * np.ones(3))


# ---------------------------------------------------------------------------
# gradients
# ---------------------------------------------------------------------------

STEPS = (0, 1, 2, 5, 7, 3)


@pytest.mark.parametrize("name", ["diffusion", "rnn", "cholesky"])
def test_checkpointed_gradient_equals_taped_and_fd(name):
    kernel, wrt = KERNELS[name]
    wrt = [wrt] if isinstance(wrt, str) else list(wrt)
    taped = pa.value_and_grad(kernel, wrt, checkpoint=False)
    rng = np.random.default_rng(7)
    for snapshots in (0, 2):
        g = pa.value_and_grad(kernel, wrt, checkpoint=snapshots)
        cp = checkpointing.checkpointer(g)
        for n in range(1, 7):
            steps = STEPS[n - 1]
            args = make_args(name, n, rng, steps=steps)
            value, grads = g(**copied(args))
            ref_value, ref_grads = taped(**copied(args))
            assert value == pytest.approx(ref_value, rel=1e-13, abs=1e-13)
            for w, a, b in zip(wrt, as_tuple(grads), as_tuple(ref_grads)):
                assert_close(a, b, 1e-12, 1e-13, what=f"{name} n={n} c={snapshots}: d/d{w}")
            # the plan: loop steps (N for cholesky, else the step count) plus the end
            loop = n if name == "cholesky" else steps
            plan = cp.last_plan
            assert plan.steps == loop + 1
            assert plan.snapshots == min(snapshots, plan.steps - 1)
            assert plan.advances == fewest_advances(plan.steps, plan.snapshots)
            assert cp.last_counts == {"advanced": plan.advances, "reversed": plan.steps}
            if n in (2, 5) and snapshots == 2:
                f = scalar_fn(kernel, args)
                for w, a in zip(wrt, as_tuple(grads)):
                    assert_close(a, fd_grad(f, args, w), 1e-6, 1e-7,
                                 what=f"{name} n={n}: d/d{w} vs finite differences")


def test_corpus_checkpointed_equals_untrimmed_at_sizes_1_to_6():
    """Every AD corpus case whose kernel has a loop to checkpoint, checkpointed with one
    snapshot (stores, restores and recomputed steps at every size above 2) and with as many
    as the budget allows, equals the untrimmed derivation at sizes 1-6."""
    from test_ad_corpus import CASES
    from test_ad_recorded import corpus_arguments, corpus_case
    checkpointed = []
    for name in sorted(CASES):
        kernel, wrt, reference = corpus_case(name)
        if checkpointing.checkpointer(pa.value_and_grad(kernel, wrt, checkpoint=True)) is None:
            continue
        checkpointed.append(name)
        rng = np.random.default_rng(11)
        for n in range(1, 7):
            args = corpus_arguments(name, kernel, n, rng)
            if args is None:
                continue
            ref_value, ref_grads = run_reference(reference, **copied(args))
            for snapshots in (1, True):
                g = pa.value_and_grad(kernel, wrt, checkpoint=snapshots)
                value, grads = g(**copied(args))
                assert value == pytest.approx(ref_value, rel=1e-12, abs=1e-13), name
                for w, a, b in zip(wrt, as_tuple(grads), as_tuple(ref_grads)):
                    assert_close(a, b, 1e-12, 1e-13,
                                 what=f"{name} n={n} checkpoint={snapshots}: d/d{w}")
    # the kernels whose outer loop carries arrays only (the rest carry a scalar sum)
    assert {"deconv_wrt_image_and_filter", "inplace_carried_prefix", "inplace_update_array",
            "matrix_factorization_matmul_temp", "mlp_2layer",
            "temp_inplace_relu_and_mul_assign"} <= set(checkpointed)


def test_checkpointed_vjp_equals_taped():
    kernel, wrt = KERNELS["diffusion"]
    rng = np.random.default_rng(3)
    args = make_args("diffusion", 6, rng, steps=5)
    bars = dict(A_bar=rng.standard_normal((6, 6)), result_bar=0.7)
    got = pa.vjp(kernel, wrt, checkpoint=1)(**copied(args), **bars)
    ref = pa.vjp(kernel, wrt, checkpoint=False)(**copied(args), **bars)
    assert_close(got, ref, 1e-12, 1e-13, what="diffusion vjp")
    assert np.any(got != pa.vjp(kernel, wrt)(**copied(args), A_bar=0 * bars["A_bar"],
                                             result_bar=0.7))


def test_checkpointing_leaves_the_inputs_alone():
    kernel, wrt = KERNELS["cholesky"]
    args = make_args("cholesky", 5, np.random.default_rng(4))
    before = copied(args)
    out = np.full((5, 5), np.nan)
    g = pa.grad(kernel, wrt, checkpoint=1)(**args, d_A=out)
    np.testing.assert_array_equal(args["A"], before["A"])
    assert g is out and not np.isnan(out).any()


# ---------------------------------------------------------------------------
# automatic under the budget
# ---------------------------------------------------------------------------

def test_checkpoints_when_the_tapes_exceed_the_budget(monkeypatch):
    kernel, wrt = KERNELS["diffusion"]
    args = make_args("diffusion", 40, np.random.default_rng(5), steps=60)
    # tapes: 8 * 60 * 40 * 40 = 768 kB; a snapshot 12.8 kB; working arrays ~100 kB
    ref = pa.grad(kernel, wrt)(**copied(args))
    g = pa.grad(kernel, wrt, memory="300kB")
    assert_close(g(**copied(args)), ref, 1e-12, 1e-13, what="diffusion under 300kB")
    plan = checkpointing.checkpointer(g).last_plan
    assert 1 <= plan.snapshots < 60 and plan.advances > 60
    assert plan.fixed_bytes + (plan.snapshots + 1) * plan.snapshot_bytes <= 300e3
    assert plan.snapshot_bytes == 8 * 40 * 40
    monkeypatch.setenv("POLYAD_MEMORY_BUDGET", "250kB")
    g_env = pa.grad(kernel, wrt)
    assert_close(g_env(**copied(args)), ref, 1e-12, 1e-13, what="diffusion under the env budget")
    assert checkpointing.checkpointer(g_env).last_plan.budget_source.startswith(
        "POLYAD_MEMORY_BUDGET")
    # within the budget: one compiled program, no checkpointing
    monkeypatch.delenv("POLYAD_MEMORY_BUDGET")
    big = pa.grad(kernel, wrt, memory="1GB")
    big(**copied(args))
    assert checkpointing.checkpointer(big).last_plan is None


def test_budget_checkpointing_cannot_meet_names_statement_formula_options():
    kernel, wrt = KERNELS["diffusion"]
    args = make_args("diffusion", 40, np.random.default_rng(5), steps=60)
    g = pa.grad(kernel, wrt, memory="50kB")
    with pytest.raises(pa.MemoryBudgetError) as err:
        g(**copied(args))
    msg = str(err.value)
    # the tapes of the unchecked gradient, as without checkpointing
    assert "tape tape_A_work f64[steps, N, N] = 8 * steps * N * N bytes" in msg
    assert "checkpointing the loop over 't' (line " in msg and "cannot meet the budget" in msg
    assert "U[i, j] = A[i, j] + 0.1 * pa.tanh(" in msg
    assert "(A) = 8 * N * N bytes" in msg
    assert "memory='50kB'" in msg and "POLYAD_MEMORY_BUDGET" in msg


def test_explain_lists_checkpoints_and_plan():
    kernel, wrt = KERNELS["diffusion"]
    g = pa.grad(kernel, wrt, memory="256MB")
    text = pa.explain(g, sizes={"N": 1000, "steps": 500})
    section = text.split("\ncheckpoints (")[1].split("\n\n")[0]
    assert "the loop over t, line " in section
    assert "snapshot of A  f64[N, N] = 8 * N * N bytes" in section
    assert "binomial (revolve)" in section
    plan = g.checkpoint_plan(N=1000, steps=500)
    assert plan.steps == 501 and plan.snapshots >= 10
    assert plan.advances == ck.advances(501, plan.snapshots)
    assert f"{plan.snapshots} snapshot(s)" in section and f"{plan.advances} forward" in section
    data = pa.explain(pa.grad(kernel, wrt, checkpoint=3), format="json")
    assert '"strategy": "binomial (revolve), 3 snapshot(s)' in data
    # a kernel with tapes but nothing to checkpoint says nothing about checkpoints
    assert "\ncheckpoints (" not in pa.explain(pa.grad(carried_scalar, "x"))


@pytest.mark.parametrize("name", ["diffusion", "cholesky", "rnn"])
def test_checkpointed_gradients_on_cuda_sim(name):
    """``pa.compile(g, target="cuda-sim")`` of a gradient with ``checkpoint=`` set: the same
    driver over CUDA pieces (run by the CPU simulator) gives the taped gradient."""
    kernel, wrt = KERNELS[name]
    wrt = [wrt] if isinstance(wrt, str) else list(wrt)
    g = pa.value_and_grad(kernel, wrt, checkpoint=2)
    sim = pa.compile(g, target="cuda-sim")
    assert isinstance(sim, checkpointing.CheckpointedFunction)
    taped = pa.value_and_grad(kernel, wrt, checkpoint=False)
    rng = np.random.default_rng(8)
    for n in (1, 3, 6):
        args = make_args(name, n, rng, steps=STEPS[n - 1])
        value, grads = g.package(sim(**copied(args)))
        ref_value, ref_grads = taped(**copied(args))
        assert value == pytest.approx(ref_value, rel=1e-12, abs=1e-13)
        for w, a, b in zip(wrt, as_tuple(grads), as_tuple(ref_grads)):
            assert_close(a, b, 1e-12, 1e-13, what=f"{name} n={n} cuda-sim: d/d{w}")
        plan = sim.checkpointer.last_plan
        assert plan.snapshots == min(2, plan.steps - 1)
        assert sim.checkpointer.last_counts["reversed"] == plan.steps
    # every piece is a CUDA kernel; the OpenMP driver's pieces are separate
    assert sim.source.count("/* ---- checkpointed piece ") >= 4
    assert "__global__" in sim.source
    assert checkpointing.checkpointer(g) is not sim.checkpointer


def test_checkpointed_vjp_on_cuda_sim_and_refusal():
    kernel, wrt = KERNELS["diffusion"]
    rng = np.random.default_rng(9)
    args = make_args("diffusion", 5, rng, steps=4)
    bars = dict(A_bar=rng.standard_normal((5, 5)), result_bar=0.3)
    v = pa.vjp(kernel, wrt, checkpoint=1)
    got = pa.compile(v, target="cuda-sim")(**copied(args), **bars)
    ref = pa.vjp(kernel, wrt, checkpoint=False)(**copied(args), **bars)
    assert_close(got, ref, 1e-12, 1e-13, what="diffusion vjp on cuda-sim")
    with pytest.raises(pa.NotDifferentiableError, match="carry values into or out of"):
        pa.compile(pa.grad(carried_scalar, "x", checkpoint=True), target="cuda-sim")


def test_bad_checkpoint_option():
    with pytest.raises(TypeError, match="checkpoint"):
        pa.grad(KERNELS["diffusion"][0], "A", checkpoint="often")


# ---------------------------------------------------------------------------
# AddressSanitizer
# ---------------------------------------------------------------------------

ASAN_SCRIPT = textwrap.dedent('''
    import sys
    sys.path.insert(0, {tests!r})
    import numpy as np
    import polyad as pa
    from polyad import checkpointing
    from tape_kernels import KERNELS, make_args

    rng = np.random.default_rng(0)
    for name in ("diffusion", "cholesky"):
        kernel, wrt = KERNELS[name]
        g = pa.grad(kernel, wrt, checkpoint=1)
        checkpointing.checkpointer(g).sanitize = "address"
        ref = pa.grad(kernel, wrt, checkpoint=False)
        for n, steps in ((1, 0), (4, 3), (7, 5)):
            args = make_args(name, n, rng, steps=steps)
            got = g(**{{k: np.copy(v) if isinstance(v, np.ndarray) else v
                        for k, v in args.items()}})
            np.testing.assert_allclose(got, ref(**args), rtol=1e-12, atol=1e-12)
    print("CHECKPOINT-ASAN-OK")
''')


def test_checkpointed_pieces_clean_under_asan(tmp_path, repo_root):
    from test_asan import run_script_under_asan
    run_script_under_asan(tmp_path, repo_root, ASAN_SCRIPT.format(tests=os.path.join(repo_root, "tests")),
                          "CHECKPOINT-ASAN-OK")
