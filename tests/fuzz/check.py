"""Check one generated case: compiled polyad vs the independent reference.

``check_case(case, workdir, ...)`` returns a ``Result``: ``status`` is
``ok``, ``fail`` (a disagreement or a crash-free exception that is polyad's
fault), or ``unsupported`` (polyad refused the program with a clear
``PolyadError`` at definition or compile time; counted and reported, not a
failure). Size sets at which polyad refuses to run with a ``PolyadError``
("sizes too small") are counted as ``size_rejected``.

Checks: (a) values vs the reference at several size sets (sizes 0, 1, 2 and
small odd ones), at 1 and 2 OpenMP threads (where the float64 reference leaves
the range of the kernel's dtype, vs the reference interpreter of the kernel's
IR); (b) the vjp of every float input vs central finite differences of the
compiled primal (float64, random directions) and vs ``jax.grad`` of the
reference (where the reference overflows, which leaves products of infinities
and zeros that JAX and polyad associate differently, vs the reference
interpreter of the vjp's IR; where the differences dispute the vjp, rounding the
inputs moves JAX's gradient past the tolerance and the C compiler's fused
multiply-adds round the primal otherwise, the build that rounds every product
vs ``jax.grad``); (c) the jvp (forward mode) of the same inputs vs
that vjp, by the dot-product test, and the Hessian-vector product of a float64
kernel returning a scalar vs central differences of the vjp of that scalar, and
its symmetry, and the vjp with checkpoints (``checkpoint=1``: steps recomputed)
vs the vjp, where the kernel has a loop to checkpoint; (d) the
``deterministic=True`` build: bitwise the same at 1 and 2 threads; (e) under ASan
when ``sanitize`` is set (the process must run with libasan preloaded).
"""

from __future__ import annotations

import copy
import ctypes
import ctypes.util
import importlib.util
import math
import os
import sys
import traceback
from dataclasses import dataclass, field

import numpy as np

from .gen import Case
from .oracle import FloatLib, GeneratorBug, JaxLib, Undefined, load_reference, run_reference

_GOMP = None


def set_threads(n: int) -> None:
    """Set the OpenMP thread count of this process's libgomp (shared with every kernel)."""
    global _GOMP
    if _GOMP is None:
        _GOMP = ctypes.CDLL(ctypes.util.find_library("gomp") or "libgomp.so.1")
    _GOMP.omp_set_num_threads(int(n))


@dataclass
class Result:
    seed: int
    status: str = "ok"
    stage: str = ""
    message: str = ""
    size_rejected: int = 0
    checks: list = field(default_factory=list)
    features: list = field(default_factory=list)

    def as_dict(self):
        return dict(self.__dict__)


class Mismatch(AssertionError):
    pass


def load_kernel(case: Case, workdir: str):
    """Write the case's module to ``workdir`` and import it (polyad reads the file's source)."""
    path = os.path.join(workdir, f"fz_case_{case.seed}.py")
    with open(path, "w") as f:
        f.write(case.dsl)
    name = f"fz_case_{case.seed}"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod.fz_kernel


def _np_dtype(case):
    return np.float32 if case.dtype == "f32" else np.float64


def _extent(arr, d, sizes):
    A, B = arr.ext[d]
    return max(0, A * sizes[arr.sizes[d]] + B)


def make_inputs(case: Case, sizes: dict, rng) -> tuple[dict, dict]:
    """Random arrays for every array parameter (outputs zero) and scalar parameters."""
    dt = _np_dtype(case)
    arrays, scalars = {}, {}
    for name, kind, arr in case.params:
        if kind == "array":
            shape = tuple(_extent(arr, d, sizes) for d in range(len(arr.sizes)))
            if arr.role == "out":
                arrays[name] = np.zeros(shape, dt)
            else:
                arrays[name] = rng.uniform(-1.0, 1.0, shape).astype(dt)
        elif kind == "float":
            scalars[name] = float(rng.uniform(-1.0, 1.0))
        else:
            scalars[name] = case.int_values[name]
    scalars.update(sizes)   # passed as keywords: not every size is an array's extent
    return arrays, scalars


def _outputs(case):
    return [name for name, kind, arr in case.params
            if kind == "array" and arr.role in ("out", "inout")]


def _inputs(case):
    return [name for name, kind, arr in case.params if kind != "array" or arr.role != "out"]


def call_compiled(ck, case, arrays, scalars) -> dict:
    """Call a compiled kernel on copies; {'result': float?, output name: array}."""
    args = {n: (arrays[n].copy() if n in arrays else scalars[n])
            for n in _inputs(case) + [s for s in case.sizes if s in ck.kernel.sizes]}
    outs = [n for n, kind, arr in case.params if kind == "array" and arr.role == "out"]
    raw = ck(**args)
    got = {}
    parts = list(raw) if isinstance(raw, tuple) else [raw]
    if case.has_result:
        got["result"] = float(parts.pop(0))
    for n in outs:
        got[n] = parts.pop(0)
    for n, kind, arr in case.params:
        if kind == "array" and arr.role == "inout":
            got[n] = args[n]
    return got


def reference_values(ref, case, arrays, scalars, sizes) -> dict:
    res, objs = run_reference(ref, FloatLib(), arrays, scalars, sizes)
    out = {}
    if case.has_result:
        out["result"] = float(res)
    for n in _outputs(case):
        out[n] = objs[n].astype(np.float64)
    return out


def interpreted_values(kern, case, arrays, scalars, sizes) -> dict:
    """The kernel's result and outputs by ``polyad.testing.interpret`` of its IR, which
    computes in the kernel's dtype (float32 rounding and overflow included), where
    the reference computes in float64."""
    from polyad.testing import interpret
    args = {n: (arrays[n].copy() if n in arrays else scalars[n]) for n, _, _ in case.params}
    result, final = interpret(kern.ir, args, sizes)
    out = {n: np.asarray(final[n], np.float64) for n in _outputs(case)}
    if case.has_result:
        out["result"] = float(result)
    return out


def reference_overflows(ref, case, arrays, scalars, sizes) -> bool:
    """Whether the reference run gives some element, or its result, a value past the
    case's floating-point range (an infinity, a NaN, or in a float32 case a magnitude
    float32 cannot hold): an intermediate too, one that a later assignment overwrites."""
    limit = float(np.finfo(_np_dtype(case)).max)
    lib = FloatLib(limit)
    res, _ = run_reference(ref, lib, arrays, scalars, sizes)
    return lib.overflowed or (case.has_result and not abs(float(res)) <= limit)


def _tol(case):
    return (2e-4, 2e-4) if case.dtype == "f32" else (1e-9, 1e-9)


# How many times the reference's own rounding noise a compiled value may differ by.
NOISE_MARGIN = 10.0


def compare(got: dict, want: dict, case, what: str, noise: dict | None = None):
    """Raise ``Mismatch`` where an output of ``got`` differs from ``want`` by more than the
    case's tolerance; ``noise`` (``rounding_noise``), where given, widens each output's
    absolute tolerance by ``NOISE_MARGIN`` times its noise."""
    rtol, atol = _tol(case)
    for n, w in want.items():
        g = np.asarray(got[n], dtype=np.float64)
        w = np.asarray(w, dtype=np.float64)
        scale = 1.0 + (np.max(np.abs(w)) if w.size else 0.0)
        slack = NOISE_MARGIN * noise.get(n, 0.0) if noise else 0.0
        if g.shape != w.shape or not np.allclose(g, w, rtol=rtol, atol=atol * scale + slack,
                                                 equal_nan=True):
            beyond = f" (and past {NOISE_MARGIN:g} times the reference's rounding noise " \
                     f"{noise.get(n, 0.0):.3g})" if noise else ""
            raise Mismatch(f"{what}: {n} differs from the reference{beyond}\n got  {g!r}\n"
                           f" want {w!r}")


def rounding_noise(ref, case, arrays, scalars, sizes, want, draws: int = 4) -> dict:
    """Per output of ``want`` (the reference's values at these inputs), the largest
    change of the reference's own values over ``draws`` runs with its float inputs moved
    by four units of the case's rounding (relative, random signs).

    A kernel whose values hinge on a comparison near a tie (a branch on a data value, a
    ``max``), or that amplifies rounding through chains of products, moves by far more
    than the comparison's tolerance (fuzz seed 16054: 0.3 on values of 200 for inputs
    moved by 1e-16). A compiled build that rounds otherwise (fused multiply-adds, sums
    in lanes) can only agree with such a reference up to that noise."""
    rel = 4 * float(np.finfo(_np_dtype(case)).eps)
    floats = {n for n, kind, _ in case.params if kind == "float"}
    rng = np.random.default_rng(case.seed)
    noise = {n: 0.0 for n in want}
    for _ in range(draws):
        moved = {n: (a * (1 + rel * rng.choice([-1.0, 1.0], a.shape))).astype(a.dtype)
                 for n, a in arrays.items()}
        moved_scalars = {n: (v * (1 + rel * rng.choice([-1.0, 1.0])) if n in floats else v)
                         for n, v in scalars.items()}
        other = reference_values(ref, case, moved, moved_scalars, sizes)
        for n, w in want.items():
            delta = np.abs(np.asarray(other[n], np.float64) - np.asarray(w, np.float64))
            delta = delta[np.isfinite(delta)]
            if delta.size:
                noise[n] = max(noise[n], float(np.max(delta)))
    return noise


def _is_refusal(exc) -> bool:
    """Is ``exc`` polyad refusing a kernel with a reason (a ``pa.PolyadError``), not one of
    its own bugs (``pa.InternalError``, which is a finding: seed 17924, ISL failing to
    coalesce a set, was counted as unsupported)?"""
    import polyad as pa
    return isinstance(exc, pa.PolyadError) and not isinstance(exc, pa.InternalError)


# ----------------------------------------------------------------------------


def check_case(case: Case, workdir: str, grads: bool = True, use_jax: bool = True,
               deterministic: bool = True, sanitize=None, target: str = "openmp") -> Result:
    """Check ``case`` built for ``target`` ("openmp", or "cuda-sim": the CUDA target's text
    run by its CPU simulator) against its reference translation, its vjp against
    finite differences (and JAX), its jvp, hvp and checkpointed vjp against the vjp."""
    import polyad as pa
    res = Result(case.seed, features=sorted(case.features))
    stage = "define"
    try:
        kern = load_kernel(case, workdir)
        ref = load_reference(case)
        stage = "compile"
        ck = pa.compile(kern, target=target, sanitize=sanitize)
        rng = np.random.default_rng(case.seed)
        valid_sets = []
        noisy = set()  # the size sets where the reference's own rounding noise was needed
        past_range = set()  # ... and those where it leaves the dtype's range

        def agree(got, want, arrays, scalars, sizes, what):
            try:
                compare(got, want, case, what)
            except Mismatch:
                at = tuple(sorted(sizes.items()))
                if reference_overflows(ref, case, arrays, scalars, sizes):
                    # the float64 reference holds values a float32 build cannot (seed
                    # 18623: -2.5e194 where the build's float32 overflows to -inf), and
                    # past an infinity the two part ways: the build is held to the
                    # reference interpreter of the kernel's IR, in the kernel's dtype
                    past_range.add(at)
                    compare(got, interpreted_values(kern, case, arrays, scalars, sizes),
                            case, f"{what} (held to the interpreter of the kernel's IR: "
                                  f"the reference leaves the {case.dtype} range)")
                    return
                noisy.add(at)
                compare(got, want, case, what,
                        rounding_noise(ref, case, arrays, scalars, sizes, want))

        for sizes in case.size_sets:
            stage = f"values {sizes}"
            arrays, scalars = make_inputs(case, sizes, rng)
            try:
                want = reference_values(ref, case, arrays, scalars, sizes)
            except Undefined:
                want = None
            for threads in (2, 1):
                set_threads(threads)
                try:
                    got = call_compiled(ck, case, arrays, scalars)
                except pa.PolyadError as exc:
                    if "sizes too small" not in str(exc) and want is not None:
                        raise
                    res.size_rejected += 1
                    break
                if want is None:
                    raise Mismatch(f"{stage}: the program reads an empty array through a "
                                   f"boundary mode, yet the kernel ran instead of raising")
                agree(got, want, arrays, scalars, sizes, f"{stage} threads={threads}")
            else:
                valid_sets.append((sizes, arrays, scalars))
        res.checks.append("values")
        if noisy:
            res.checks.append("values within the reference's rounding noise")
        if past_range:
            res.checks.append("values past the dtype's range held to the interpreter")
        if deterministic and sanitize is None:
            stage = "deterministic"
            dk = pa.compile(kern, target=target, deterministic=True)
            for sizes, arrays, scalars in valid_sets[-2:]:
                runs = []
                for threads in (1, 2):
                    set_threads(threads)
                    runs.append(call_compiled(dk, case, arrays, scalars))
                for n in runs[0]:
                    if not np.array_equal(np.asarray(runs[0][n]), np.asarray(runs[1][n]),
                                          equal_nan=True):
                        raise Mismatch(f"deterministic {sizes}: {n} differs between 1 and 2 "
                                       f"threads:\n{runs[0][n]!r}\n{runs[1][n]!r}")
                agree(runs[0], reference_values(ref, case, arrays, scalars, sizes), arrays,
                      scalars, sizes, f"deterministic {sizes}")
            res.checks.append("deterministic")
        set_threads(2)
        if grads and valid_sets:
            stage = "vjp"
            check_vjp(case, kern, ck, ref, valid_sets, res, use_jax, deterministic, sanitize,
                      target)
    except (Mismatch, GeneratorBug) as exc:
        res.status, res.stage, res.message = "fail", stage, str(exc)
    except _Stage as exc:
        res.status, res.stage = "unsupported", exc.stage
        res.message = f"{type(exc.exc).__name__}: {exc.exc}"
    except Exception as exc:  # noqa: BLE001 - every exception is a finding
        if _is_refusal(exc) and stage in ("define", "compile", "vjp-derive", "vjp-compile"):
            res.status, res.stage = "unsupported", stage
            res.message = f"{type(exc).__name__}: {exc}"
        else:
            res.status, res.stage = "fail", stage
            res.message = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
    finally:
        set_threads(2)
    return res


def differentiable_inputs(case):
    """The names of a case's vjp inputs: its float scalars and input (or in-out) arrays."""
    return [n for n, kind, arr in case.params
            if (kind == "array" and arr.role in ("in", "inout")) or kind == "float"]


def _objective(got: dict, cots: dict) -> float:
    return float(sum(np.sum(np.asarray(got[n], np.float64) * c) for n, c in cots.items()))


def check_vjp(case, kern, ck, ref, valid_sets, res, use_jax, deterministic, sanitize,
              target="openmp"):
    import polyad as pa
    wrt = differentiable_inputs(case)
    if not wrt:
        return
    res_stage = "vjp-derive"
    try:
        vk = pa.vjp(kern, wrt)
        res_stage = "vjp-compile"
        vc = pa.compile(vk, target=target, sanitize=sanitize)
    except pa.PolyadError as exc:
        if not _is_refusal(exc):
            raise
        raise _Stage(res_stage, exc) from exc
    jk, jc, jvp_refused = _derived_build(lambda: pa.jvp(kern, wrt), target, sanitize)
    hk, hc, hvp_refused = None, None, None
    if case.has_result and case.dtype == "f64":   # (finite differences need float64)
        hk, hc, hvp_refused = _derived_build(lambda: pa.hvp(kern, wrt), target, sanitize)
    checkpointed = _checkpointed_vjp(kern, wrt, target, sanitize)
    rng = np.random.default_rng(case.seed + 1)
    dt = _np_dtype(case)
    jax_checked = False
    unjudged = 0  # directions finite differences could not judge (_check_fd)
    hvp_unjudged = 0  # ... and those of the hvp (_check_hvp)
    vouched = 0  # directions whose converged differences missed the vjp, where JAX agreed
    contracted = 0  # size sets whose disputed directions JAX judged on the uncontracted build
    jvp_contracted = 0  # size sets whose jvp was held to the vjp by the uncontracted builds
    # the two size sets checked: the largest and the smallest that ran
    chosen = sorted(valid_sets, key=lambda t: sum(t[0].values()))
    chosen = [chosen[0]] if len(chosen) == 1 else [chosen[0], chosen[-1]]
    for sizes, arrays, scalars in chosen:
        stage = f"vjp {sizes}"
        cots = {}
        for n in _outputs(case):
            cots[n] = rng.uniform(-1.0, 1.0, arrays[n].shape).astype(dt)
        if case.has_result:
            cots["result"] = float(rng.uniform(0.5, 1.5))
        args = {n: (arrays[n].copy() if n in arrays else scalars[n])
                for n in _inputs(case) + [s for s in case.sizes if s in vc.kernel.sizes]}
        for n in _outputs(case):
            args[f"{n}_bar"] = cots[n]
        if case.has_result:
            args["result_bar"] = cots["result"]
        known = {p.name for p in vc.kernel.params} | set(vc.kernel.sizes)
        args = {k: v for k, v in args.items() if k in known}
        set_threads(2)
        g = vk.package(vc(**args))
        g = list(g)
        grads = {n: np.asarray(v, np.float64) for n, v in zip(wrt, g)}
        cot64 = {n: np.asarray(c, np.float64) for n, c in cots.items()}
        overflows = use_jax and reference_overflows(ref, case, arrays, scalars, sizes)
        disputed: list = []  # (only where JAX, an independent oracle, will judge)
        uncontracted = None  # the gradients of the vjp's build that rounds every product,
        # once JAX agreed with them (_uncontracted_gradients, or the jvp's check below)
        if case.dtype == "f64":
            unjudged += _check_fd(case, ck, arrays, scalars, cot64, grads, stage, rng,
                                  disputed=disputed if use_jax and not overflows else None)
        oracle = None
        if overflows:
            # Past an overflow the gradient holds products of infinities and zeros, which
            # JAX and polyad associate differently (NaN against a number, seeds 15106,
            # 15260, 15579, 15719 and 15772): no independent oracle is left, so the
            # compiled vjp is held to the reference interpreter of its own IR.
            _check_interpreted_vjp(case, vk, args, grads, stage)
            res.checks.append("vjp-interpreter (the primal overflows)")
        elif use_jax:
            oracle = _JaxGradient(case, ref, arrays, scalars, sizes, cot64, wrt)
            if disputed and not oracle.agrees_closely(grads):
                uncontracted = _uncontracted_gradients(case, kern, ck, vk, target, args,
                                                       arrays, scalars, wrt, oracle)
                if uncontracted is None:
                    # JAX vouches for a direction the differences dispute only without
                    # the allowance for the gradient's rounding noise
                    raise Mismatch("\n".join(disputed
                                             + list(oracle.mismatches(grads, stage))))
                # the default build's gradient is the derivative of its own rounding of
                # the primal, which neither JAX nor the differences compute
                contracted += 1
            else:
                oracle.check(grads, stage)
                vouched += len(disputed)
            jax_checked = True
        if jc is not None:
            directions = copy.deepcopy(rng)  # (the retry below draws the same ones)
            try:
                _check_jvp(case, jk, jc, arrays, scalars, sizes, cot64, grads, rng,
                           f"jvp {sizes}")
            except Mismatch:
                # the jvp's default build, another program, contracts the primal's
                # products otherwise than the vjp's (seed 17804 on AMD Zen 3: gcc fuses
                # in the vector code, not in the scalar): where that rounding moves the
                # gradient (JAX's moves past the tolerance when the inputs round), the
                # builds that round every product are held to each other instead
                if oracle is None or not oracle.moved_by_rounding():
                    raise
                if uncontracted is None:
                    uncontracted = _deterministic_gradients(vk, args, wrt, target)
                    if not oracle.agrees_closely(uncontracted):
                        raise
                _check_jvp(case, jk, pa.compile(jk, target=target, deterministic=True),
                           arrays, scalars, sizes, cot64, uncontracted, directions,
                           f"jvp {sizes} (every product rounded)")
                jvp_contracted += 1
        if hc is not None:
            hvp_unjudged += _check_hvp(case, hk, hc, vk, vc, args, wrt, rng, f"hvp {sizes}")
        if checkpointed is not None:
            got = {n: np.asarray(g, np.float64) for n, g in zip(wrt, checkpointed(**_copies(args)))}
            _hold_to_vjp(case, got, grads, oracle, f"checkpointed vjp {sizes}")
        if deterministic and sanitize is None:
            dv = pa.compile(vk, target=target, deterministic=True)
            runs = []
            for threads in (1, 2):
                set_threads(threads)
                r = vk.package(dv(**_copies(args)))
                runs.append([np.asarray(x) for x in r])
            set_threads(2)
            for n, a, b in zip(wrt, *runs):
                if not np.array_equal(a, b, equal_nan=True):
                    raise Mismatch(f"deterministic vjp {sizes}: d_{n} differs between 1 and 2 "
                                   f"threads:\n{a!r}\n{b!r}")
            _hold_to_vjp(case, {n: np.asarray(a, np.float64) for n, a in zip(wrt, runs[0])},
                         grads, oracle, f"deterministic vjp {sizes}")
    res.checks.append("vjp-fd" if case.dtype == "f64" else "vjp")
    if unjudged:
        res.checks.append("vjp-fd: some directions left to JAX (the differences do not "
                          "converge, or the objective's rounding hides them)")
    if vouched:
        res.checks.append("vjp-fd: converged differences that missed the vjp left to JAX, "
                          "which agreed (the primal's rounding absorbs a term)")
    if contracted:
        res.checks.append("vjp-fd: converged differences that missed the vjp left to JAX, "
                          "which agreed with the build that rounds every product (the "
                          "default build's fused multiply-adds round the primal otherwise)")
    if jax_checked:
        res.checks.append("vjp-jax")
    res.checks.append(f"jvp refused ({jvp_refused}) where the vjp was not" if jvp_refused
                      else "jvp")
    if jvp_contracted:
        res.checks.append("jvp: held to the vjp by the builds that round every product (the "
                          "default jvp build's fused multiply-adds round the primal otherwise)")
    if checkpointed is not None:
        res.checks.append("checkpointed vjp")
    if hvp_refused:
        res.checks.append(f"hvp refused ({hvp_refused}) where the vjp was not")
    elif hc is not None:
        res.checks.append("hvp")
        if hvp_unjudged:
            res.checks.append("hvp: some directions the differences could not judge")


def _derived_build(derive, target, sanitize):
    """``(derived kernel, its build, None)``, or ``(None, None, the name of polyad's
    refusal)`` where polyad refuses to derive or compile it with a reason."""
    import polyad as pa
    try:
        dk = derive()
        return dk, pa.compile(dk, target=target, sanitize=sanitize), None
    except pa.PolyadError as exc:
        if not _is_refusal(exc):
            raise
        return None, None, type(exc).__name__


def _checkpointed_vjp(kern, wrt, target, sanitize):
    """A function of the vjp's arguments that runs the vjp with ``checkpoint=1`` (one
    snapshot besides the start, so the revolve schedule recomputes steps) and returns its
    gradients: the derived kernel's own call on OpenMP, its ``CheckpointedFunction``
    elsewhere. None where the kernel has no loop to checkpoint (a step other than 1, a
    scalar carried across the loop)."""
    import polyad as pa
    from polyad import checkpointing
    dk = pa.vjp(kern, wrt, checkpoint=1)
    if checkpointing.refusal(dk):
        return None
    if target == "openmp":
        return lambda **a: dk(**a)
    fn = pa.compile(dk, target=target, sanitize=sanitize)
    return lambda **a: dk.package(fn(**a))


def _check_hvp(case, hk, hc, vk, vc, args, wrt, rng, stage, eps=1e-6) -> int:
    """The compiled Hessian-vector product of the kernel's scalar against the vjp of that
    scalar (the vjp's call ``args`` with every output's cotangent 0 and the scalar's 1):
    for random ``u`` and ``v``, ``u . Hv`` equals ``v . Hu`` (the Hessian of the branch
    the point lies on is symmetric), and the central difference of ``u . grad`` along
    ``v``. Returns how many directions the differences could not judge: those whose
    difference moves by more than the tolerance between the step ``eps`` and a tenth of
    it (a branch or a ``max`` within a step of the point), or whose gap the gradient's
    rounding could explain. Directions where a side is not finite judge nothing."""
    params = {p.name for p in hk.ir.params} | set(hk.ir.sizes)
    shapes = {n: np.shape(args[n]) for n in wrt}

    def hvp(v):
        a = _copies({n: x for n, x in args.items() if n in params})
        for n in wrt:
            a[f"{n}_dot"] = v[n].copy() if shapes[n] else float(v[n])
            a[f"d_{n}_dot"] = np.zeros(shapes[n] or (1,))
        hc(**a)
        return {n: np.asarray(a[f"d_{n}_dot"], np.float64).reshape(shapes[n]) for n in wrt}

    def grad(shift):
        a = _copies(args)
        for n in a:
            if n.endswith("_bar"):
                a[n] = np.zeros_like(a[n]) if isinstance(a[n], np.ndarray) else 0.0
        a["result_bar"] = 1.0
        for n in wrt:
            a[n] = a[n] + shift[n] if shapes[n] else a[n] + float(shift[n])
        return {n: np.asarray(g, np.float64) for n, g in zip(wrt, vk.package(vc(**a)))}

    def dot(x, y):
        return sum(float(np.sum(x[n] * y[n])) for n in wrt)

    def size(x, y):
        return 1.0 + sum(float(np.sum(np.abs(x[n] * y[n]))) for n in wrt)

    def difference(u, v, step):
        return (dot(u, grad({n: step * v[n] for n in wrt}))
                - dot(u, grad({n: -step * v[n] for n in wrt}))) / (2 * step)

    at = grad({n: np.zeros(shapes[n]) for n in wrt})
    unjudged = 0
    for _ in range(2):
        u, v = ({n: rng.standard_normal(shapes[n]) for n in wrt} for _ in range(2))
        hv, hu = hvp(v), hvp(u)
        if not all(np.all(np.isfinite(h[n])) for h in (hv, hu) for n in wrt):
            continue
        if abs(dot(u, hv) - dot(v, hu)) > 1e-9 * (size(u, hv) + size(v, hu)):
            raise Mismatch(f"{stage}: u . Hv = {dot(u, hv)!r} but v . Hu = {dot(v, hu)!r} "
                           f"(the Hessian is not symmetric)")
        ad = dot(u, hv)
        # how far rounding can move a difference: a few units of the gradient's terms
        rounding = 100 * float(np.finfo(np.float64).eps) / eps * size(u, at)
        verdict, fd, finer = _difference_verdict(lambda step: difference(u, v, step), ad,
                                                 1e-5 * size(u, hv), rounding, eps)
        unjudged += verdict == "unjudged"
        if verdict == "differs":
            raise Mismatch(f"{stage}: u . Hv = {ad!r} (hvp) vs {fd!r} (central difference "
                           f"of u . grad along v; {finer!r} at a tenth of the step)")
    return unjudged


def _check_jvp(case, jk, jc, arrays, scalars, sizes, cots, grads, rng, stage,
               directions=2):
    """The compiled jvp against the vjp's ``grads`` (already held to finite differences
    or JAX) by the dot-product test: for random tangents ``d`` of the inputs, the jvp's
    output tangents ``J d`` dotted with the cotangents ``cots`` equal ``grads`` dotted
    with ``d`` (both are the directional derivative of the objective). Directions where
    either side is not finite (the primal overflows) judge nothing."""
    dt = _np_dtype(case)
    wrt = list(grads)
    out_params = [p.name for p in jk.ir.params if p.intent == "out"]
    rtol = GRADIENT_RTOL[case.dtype]
    for _ in range(directions):
        d = {n: np.asarray(rng.standard_normal(np.shape(grads[n]))).astype(dt) for n in wrt}
        args = {n: (arrays[n].copy() if n in arrays else scalars[n]) for n in _inputs(case)}
        args.update({s: v for s, v in sizes.items() if s in jk.ir.sizes})
        for n in wrt:
            args[f"{n}_dot"] = d[n].copy() if n in arrays else float(d[n])
        for name in out_params:
            primal = name[:-len("_dot")] if name.endswith("_dot") else name
            args[name] = np.zeros(np.shape(arrays[primal]) if primal in arrays else (1,), dt)
        jc(**args)
        tangents = {n: args[f"{n}_dot"] for n in cots if f"{n}_dot" in args}
        terms = [np.asarray(cots[n] * np.asarray(t, np.float64)).reshape(-1)
                 for n, t in tangents.items()]
        terms += [np.asarray(grads[n] * np.asarray(d[n], np.float64)).reshape(-1)
                  for n in wrt]
        if not all(np.all(np.isfinite(t)) for t in terms):
            continue
        by_jvp = sum(float(np.sum(cots[n] * np.asarray(t, np.float64)))
                     for n, t in tangents.items())
        by_vjp = sum(float(np.sum(grads[n] * np.asarray(d[n], np.float64))) for n in wrt)
        scale = 1.0 + sum(float(np.sum(np.abs(t))) for t in terms)
        if abs(by_jvp - by_vjp) > rtol * scale:
            raise Mismatch(f"{stage}: directional derivative {by_jvp!r} (jvp: output "
                           f"tangents dotted with the cotangents) vs {by_vjp!r} (vjp)\n"
                           + "\n".join(f" d = {d[n]!r} ({n})" for n in wrt) + "\n"
                           + "\n".join(f" {n}_dot = {t!r}" for n, t in tangents.items()))


# The relative tolerance of a derivative held to the vjp's (by another build, or by the dot
# product of another mode's): the builds round apart, fused multiply-adds in one of them.
GRADIENT_RTOL = {"f64": 1e-9, "f32": 1e-4}


def _copies(args: dict) -> dict:
    """``args`` with every array copied (a call writes into its in-out and out arrays)."""
    return {n: (v.copy() if isinstance(v, np.ndarray) else v) for n, v in args.items()}


def _uncontracted_gradients(case, kern, ck, vk, target, args, arrays, scalars, wrt,
                            oracle):
    """The gradients of the build of the vjp ``vk`` (called with ``args``) that rounds
    every product, where the C compiler's contraction of products into fused
    multiply-adds explains why the default build misses JAX's gradient (``oracle``)
    within the tolerance alone where finite differences disputed it; None where it does
    not explain it. The default build contracts (``-ffp-contract=fast``) and gcc's
    tunings for Intel cores do so in scalar code (those for AMD Zen avoid the chains), so
    its primal rounds otherwise than JAX's reference, which rounds every product; where
    the primal's values feed ``cos`` at -1e24 (fuzz seed 17804) the derivative of one
    rounding is not the other's. Contraction explains the miss where the default build's
    primal differs from the build that rounds every product (``deterministic=True``),
    moving the inputs by rounding moves JAX's gradient past the tolerance (a gradient
    that rounding does not move is held to JAX whatever the build rounds), and the build
    that rounds every product has a vjp that matches JAX within the tolerance alone: the
    derivative program is then JAX's, and the default build's gradient, the derivative
    of its own rounding of the primal, has no oracle here."""
    import polyad as pa
    if not oracle.moved_by_rounding():
        return None
    uncontracted = pa.compile(kern, target=target, deterministic=True)
    primal = call_compiled(ck, case, arrays, scalars)
    primal_uncontracted = call_compiled(uncontracted, case, arrays, scalars)
    if all(np.array_equal(np.asarray(primal[n]), np.asarray(primal_uncontracted[n]),
                          equal_nan=True) for n in primal):
        return None
    got = _deterministic_gradients(vk, args, wrt, target)
    return got if oracle.agrees_closely(got) else None


def _deterministic_gradients(vk, args, wrt, target) -> dict:
    """The gradients (float64, by name in ``wrt``) of the build of the vjp ``vk`` that
    rounds every product (``deterministic=True``), called with copies of ``args``."""
    import polyad as pa
    dv = pa.compile(vk, target=target, deterministic=True)
    return {n: np.asarray(g, np.float64) for n, g in zip(wrt, vk.package(dv(**_copies(args))))}


def _hold_to_vjp(case, got: dict, grads: dict, oracle, what: str) -> None:
    """Another build's gradients ``got`` (the deterministic one, the checkpointed one)
    against the vjp's ``grads``, within ``GRADIENT_RTOL`` (absolute: that times the
    largest finite magnitude); where they differ by more, JAX (``oracle``, which the vjp
    matched) judges ``got``, and without it they do not agree."""
    tol = GRADIENT_RTOL[case.dtype]
    for n, g in got.items():
        if np.allclose(g, grads[n], rtol=tol, atol=tol * _finite_scale(grads[n]),
                       equal_nan=True):
            continue
        if oracle is None:
            raise Mismatch(f"{what}: d_{n} differs from the vjp's\n got  {g!r}\n"
                           f" want {grads[n]!r}")
        oracle.check(got, what)
        return


def _difference_verdict(difference, ad: float, tol: float, rounding: float,
                        eps: float) -> tuple:
    """``(verdict, the difference at eps, at eps / 10 or NaN)`` for a directional
    derivative ``ad`` and its central differences ``difference(step)``: "agrees" where
    the difference at ``eps`` or at a tenth of it is within ``tol`` of ``ad``;
    "unjudged" where ``rounding`` (how far rounding can move a difference) exceeds the
    gap, or where the difference moves between the two steps by more than the tolerance
    (it has not converged: a branch or a ``max`` within a step of the point, or rounding
    that no step separates from the truncation error); "differs" otherwise."""
    fd = difference(eps)
    if not abs(fd - ad) > tol:  # (a NaN on either side judges nothing)
        return "agrees", fd, math.nan
    if rounding > abs(fd - ad):
        return "unjudged", fd, math.nan
    finer = difference(eps / 10)
    if not abs(finer - ad) > tol:
        return "agrees", fd, finer
    if abs(finer - fd) > 1e-5 * (1.0 + abs(fd)):
        return "unjudged", fd, finer
    return "differs", fd, finer


def _finite_scale(values: np.ndarray) -> float:
    """1 + the largest finite magnitude in ``values`` (an absolute tolerance's scale that
    an infinity or NaN among them does not make infinite or NaN)."""
    finite = np.abs(values[np.isfinite(values)])
    return 1.0 + (float(np.max(finite)) if finite.size else 0.0)


def _check_interpreted_vjp(case, vk, args, grads, stage):
    """The compiled vjp's gradients against ``polyad.testing.interpret`` of the vjp's IR
    on the same arguments, NaN and infinities in the same places."""
    from polyad.testing import interpret
    sizes = {n: v for n, v in args.items() if n in vk.ir.sizes}
    inputs = {n: (v.copy() if isinstance(v, np.ndarray) else v)
              for n, v in args.items() if n not in sizes}
    _, arrays = interpret(vk.ir, inputs, sizes)
    tol = 1e-9 if case.dtype == "f64" else 1e-4
    for n, got in grads.items():
        want = np.asarray(arrays[f"d_{n}"], np.float64)
        scale = _finite_scale(want)
        if not np.allclose(got, want, rtol=tol, atol=tol * scale, equal_nan=True):
            raise Mismatch(f"{stage}: d_{n} differs from the reference interpreter of the "
                           f"vjp's IR (the primal overflows, so JAX is no oracle here)\n"
                           f" got  {got!r}\n want {want!r}")


class _Stage(Exception):
    def __init__(self, stage, exc):
        super().__init__(str(exc))
        self.stage, self.exc = stage, exc


def _check_fd(case, ck, arrays, scalars, cots, grads, stage, rng, directions=3,
              eps=1e-6, disputed: list | None = None) -> int:
    """The vjp's ``grads`` against central finite differences of the compiled primal
    along ``directions`` random directions; returns how many directions the differences
    could not judge.

    Where a direction's difference at ``eps`` misses the vjp's, it is taken again at
    ``eps / 10``: a difference that moves between the two steps by more than the
    tolerance has not converged (the primal has a branch on a data value, or a ``max``,
    within a step of the point, or amplifies rounding so that no step separates the
    truncation error from the rounding; fuzz seed 16054), and that direction is left to
    JAX. So is a direction where the objective's rounding alone could move the difference
    by the gap: the objective's terms are so large that a change of the size the vjp
    predicts vanishes in their last bits (fuzz seed 16659: an output of 1e42 beside a
    result that changes by 1e-6, so both differences were exactly 0). A difference that
    has converged and still misses the vjp's is a mismatch; with ``disputed`` (a list,
    given where JAX will judge the same gradient) its message is appended there instead
    of raised. Differences converge and still miss the derivative where the primal's
    rounding absorbs a term whose derivative does not vanish (fuzz seed 17804:
    ``y += cos(y)`` at y = -1.6e28 leaves y as it was in float64, so every step from 1e-4
    to 1e-13 sees a factor 1 where the derivative is ``1 - sin(y)``): the differences
    measure the rounded function, and JAX, differentiating the reference, decides."""
    wrt = list(grads)

    def F(shift):
        a = {n: (arrays[n] + shift[n] if n in shift and n in arrays else arrays[n])
             for n in arrays}
        s = {n: (scalars[n] + float(shift[n]) if n in shift and n in scalars else scalars[n])
             for n in scalars}
        return _objective(call_compiled(ck, case, a, s), cots)

    # how far rounding can move a difference: a few units of rounding of each of the
    # objective's terms (their magnitudes at the point; a step barely changes them)
    at_point = call_compiled(ck, case, arrays, scalars)
    rounding = 100 * float(np.finfo(np.float64).eps) / eps * _objective(
        {n: np.abs(np.asarray(at_point[n], np.float64)) for n in cots},
        {n: np.abs(c) for n, c in cots.items()})

    def difference(d, step):
        return (F({n: step * d[n] for n in wrt}) - F({n: -step * d[n] for n in wrt})) \
            / (2 * step)

    unjudged = 0
    for _ in range(directions):
        d = {n: rng.standard_normal(np.shape(grads[n])) for n in wrt}
        ad = sum(float(np.sum(grads[n] * d[n])) for n in wrt)
        tol = 1e-5 * (1.0 + sum(float(np.sum(np.abs(grads[n] * d[n]))) for n in wrt))
        verdict, fd, finer = _difference_verdict(lambda step: difference(d, step), ad, tol,
                                                 rounding, eps)
        unjudged += verdict == "unjudged"
        if verdict != "differs":
            continue
        message = (f"{stage}: directional derivative {ad!r} (vjp) vs {fd!r} (central "
                   f"finite difference of the compiled primal; {finer!r} at a tenth of "
                   f"the step)\n" + "\n".join(f" d_{n} = {grads[n]!r}" for n in wrt))
        if disputed is None:
            raise Mismatch(message)
        disputed.append(message)
    return unjudged


class _JaxGradient:
    """``jax.grad`` of the reference's objective (the cotangents ``cots`` dotted with its
    outputs) with respect to ``wrt`` at the case's inputs; ``grad`` is None where the
    reference reads an empty array. ``check(grads, what)`` holds a vjp's gradients to it.

    Where they differ by more than the tolerance, the gradient's own rounding noise is
    measured, as ``rounding_noise`` measures the values': a reference whose values amplify
    rounding has gradients that do too (seed 16054: 2e-4 apart for inputs moved by
    1e-16), which a vjp of a build that rounds otherwise can only match up to that noise.
    The noise is the reference's, so a vjp whose values vary from run to run (a race)
    gains nothing from it."""

    def __init__(self, case, ref, arrays, scalars, sizes, cots, wrt):
        import jax
        jax.config.update("jax_enable_x64", True)
        self.case, self.wrt = case, list(wrt)
        self.sizes_of = {n: (arrays[n].shape if n in arrays else ()) for n in self.wrt}
        self.counts = [int(np.prod(self.sizes_of[n])) for n in self.wrt]
        lib = JaxLib()

        def objective(flat):
            pos = 0
            A, P = {}, {}
            for n, cnt in zip(self.wrt, self.counts):
                part = [flat[pos + k] for k in range(cnt)]
                pos += cnt
                if n in arrays:
                    o = np.empty(self.sizes_of[n], dtype=object)
                    flat_o = o.reshape(-1)
                    for k, v in enumerate(part):
                        flat_o[k] = v
                    A[n] = o
                else:
                    P[n] = part[0]
            for n, a in arrays.items():
                if n not in A:
                    o = np.empty(a.shape, dtype=object)
                    flat_o = o.reshape(-1)
                    for k, v in enumerate(a.reshape(-1)):
                        flat_o[k] = float(v)
                    A[n] = o
            for n, v in scalars.items():
                P.setdefault(n, v)
            result = ref(lib, A, P, dict(sizes))
            total = 0.0
            for n, c in cots.items():
                if n == "result":
                    total = total + result * c
                else:
                    for v, cc in zip(A[n].reshape(-1), c.reshape(-1)):
                        total = total + v * float(cc)
            return total

        self.objective = objective
        self.x0 = np.concatenate([np.asarray(arrays[n] if n in arrays else [scalars[n]],
                                             np.float64).reshape(-1) for n in self.wrt])
        try:
            self.grad = self._grad_at(self.x0)
        except Undefined:
            self.grad = None
        self.noise = None

    def _grad_at(self, x):
        import jax
        import jax.numpy as jnp
        return np.asarray(jax.grad(self.objective)(jnp.asarray(x)))

    def _rounding_noise(self):
        if self.noise is None:
            rel = 4 * float(np.finfo(_np_dtype(self.case)).eps)
            rng = np.random.default_rng(self.case.seed)
            self.noise = np.zeros_like(self.grad)
            for _ in range(4):
                moved = self.x0 * (1 + rel * rng.choice([-1.0, 1.0], self.x0.shape))
                self.noise = np.fmax(self.noise, np.abs(self._grad_at(moved) - self.grad))
        return self.noise

    def _parts(self):
        """(name, its slice of the flat gradient, JAX's gradient of it, its absolute
        tolerance) per differentiated input."""
        tol = self._tolerance()
        pos = 0
        for n, cnt in zip(self.wrt, self.counts):
            want = self.grad[pos:pos + cnt].reshape(self.sizes_of[n])
            scale = 1.0 + float(np.max(np.abs(want))) if want.size else 1.0
            yield n, slice(pos, pos + cnt), want, tol * scale
            pos += cnt

    def _tolerance(self) -> float:
        return 1e-8 if self.case.dtype == "f64" else 2e-3

    def moved_by_rounding(self) -> bool:
        """Does moving the inputs by a few units of rounding move JAX's gradient by more
        than the tolerance (False where JAX has no gradient)? Where it does, a build that
        rounds the intermediate values otherwise can move it as far."""
        if self.grad is None:
            return False
        noise = self._rounding_noise()
        return any(float(np.max(noise[part], initial=0.0)) > atol
                   for _, part, _, atol in self._parts())

    def _mismatches(self, grads, what, noise):
        tol = self._tolerance()
        for n, part, want, atol in self._parts():
            slack = NOISE_MARGIN * float(np.max(noise[part], initial=0.0)) \
                if noise is not None else 0.0
            got = grads[n]
            if not np.allclose(got, want, rtol=tol, atol=atol + slack):
                beyond = (f" (and past {NOISE_MARGIN:g} times the rounding noise of that "
                          f"gradient, {slack / NOISE_MARGIN:.3g})" if noise is not None else "")
                yield (f"{what}: d_{n} differs from jax.grad of the reference{beyond}\n"
                       f" got  {got!r}\n want {want!r}")

    def agrees_closely(self, grads: dict) -> bool:
        """Do ``grads`` match JAX's gradient within the tolerance alone, with no allowance
        for the gradient's rounding noise (False where JAX has no gradient)?"""
        return self.grad is not None and next(self.mismatches(grads, ""), None) is None

    def mismatches(self, grads: dict, what: str):
        """The messages of the gradients that differ from JAX's within the tolerance."""
        return self._mismatches(grads, what, None) if self.grad is not None else iter(())

    def check(self, grads: dict, what: str) -> None:
        """Raise ``Mismatch`` where ``grads`` (name -> gradient) differs from JAX's."""
        if self.grad is None or self.agrees_closely(grads):
            return
        for message in self._mismatches(grads, what, self._rounding_noise()):
            raise Mismatch(message)
