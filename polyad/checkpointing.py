"""Checkpointed reverse mode: gradients of long sequential loops in bounded memory (issue 19).

A derived kernel (``pa.grad``, ``pa.value_and_grad``, ``pa.vjp``) whose tapes
would exceed the memory budget, and whose primal has a checkpointable outer loop
(``polyad.ad.checkpoint.split_loop``: a time loop, the outer ``k`` of a
factorization), runs here instead of as one compiled program:

* the primal is cut into ``before`` / ``segment(t0, t1)`` / ``after`` kernels,
  compiled as they are (forward), and ``before`` / ``step(t0)`` / ``after``
  differentiated by ``ad.vjp_kernel``: ordinary polyad kernels, scheduled and
  parallelised like any other (parallel loops inside a step keep their schedule);
* a Python driver runs the binomial (revolve) schedule over the steps of the
  loop, the ``after`` statements being the last step: it stores the state
  (``LoopSplit.state``) in snapshots, advances with the segment kernel, and
  reverses one step at a time with the step kernel's vjp, whose tapes (if any)
  hold that one step;
* the cotangents of every array travel between the vjp calls; those of arrays a
  piece only reads accumulate.

The number of snapshots comes from the budget: what the budget leaves after the
driver's own arrays (working copies, cotangents), the largest vjp call's
temporaries and a reserve of 1/64 of the budget (Python objects, allocator
slack), divided by the bytes of one snapshot. ``pa.grad(..., checkpoint=n)``
forces checkpointing with ``n`` snapshots (``True``: as many as the budget allows;
``False``: never).

Calling the derived kernel runs the pieces on the OpenMP target.
``pa.compile(g, target="cuda")`` (or ``"cuda-sim"``) of a derived kernel with
``checkpoint=`` set returns a ``CheckpointedFunction``: the same driver over
the pieces compiled for that target. The driver's arrays and snapshots are
host (numpy) arrays; each piece call copies what it reads to the device and
what it writes back, so the device holds one piece's arrays and at most one
step's tapes.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Optional

import numpy as np

from . import ad, ir
from .ad import checkpoint as ck
from .api import Kernel
from .errors import MemoryBudgetError
from .runtime import budget
from .callconv import bind_args

__all__ = ["CheckpointedFunction", "Checkpointer", "Plan", "checkpointer"]


@dataclasses.dataclass(frozen=True)
class Plan:
    """What one checkpointed call does: ``steps`` steps reversed (the loop's iterations,
    plus one for the statements after it), ``snapshots`` states stored besides the start,
    ``advances`` forward steps recomputed by the schedule, ``strategy`` in words, and the
    bytes behind the choice."""

    steps: int
    snapshots: int
    advances: int
    strategy: str
    snapshot_bytes: int
    fixed_bytes: int
    budget_bytes: int
    budget_source: str


class Checkpointer:
    """The checkpointed version of one derived kernel (see the module docstring)."""

    def __init__(self, derived, target: str = "openmp"):
        self.derived = derived
        #: the target the pieces are compiled for
        self.target = target
        self.kind = derived.kind
        primal = derived.primal.ir
        self.primal = primal
        self.split = ck.split_loop(primal)
        self.wrt = list(derived.wrt_names)
        sp = self.split
        pieces = [p for p in (sp.before, sp.segment, sp.after) if p is not None]
        written = {p.name for piece in pieces for p in piece.params if p.intent == "inout"}
        self.carried = [n for n, at in sp.arrays.items()
                        if at.dtype.is_float and (n in written or n in self.wrt)]
        self.scalar_wrt = [n for n in self.wrt if not primal.param(n).is_array]
        #: ``<X>_next`` -> X for the state arrays the step kernel writes into a copy
        self.next_of = {nxt: n for n, nxt in sp.renamed.items()}
        self._vjp_ir = {}
        for piece in (sp.before, sp.step, sp.after):
            if piece is None:
                continue
            wrt = [p.name for p in piece.params if p.intent != "out" and (
                p.is_array and p.name in self.carried or p.name in self.scalar_wrt)]
            self._vjp_ir[piece.name] = (wrt, self._vjp(piece, wrt) if wrt else None)
        self._compiled: dict = {}
        #: ``sanitize=`` and ``deterministic=`` of the pieces' compilations (tests build
        #: them with ASan)
        self.sanitize = None
        self.deterministic = False
        #: the plan of the last call, and the forward steps it ran / steps it reversed
        self.last_plan: Optional[Plan] = None
        self.last_counts: dict = {}

    @staticmethod
    def _vjp(piece: ir.Kernel, wrt: list) -> ir.Kernel:
        with warnings.catch_warnings():
            # a piece's array that does not reach its outputs has a zero cotangent
            warnings.simplefilter("ignore", ad.NoGradientPathWarning)
            return ad.vjp_kernel(piece, wrt)

    # -- compiled pieces -------------------------------------------------------
    def _fn(self, k: ir.Kernel):
        fn = self._compiled.get(k.name)
        if fn is None:
            fn = self._compiled[k.name] = Kernel(ir_kernel=k).compile(
                self.target, sanitize=self.sanitize, deterministic=self.deterministic)
            fn.memory_budget = self.derived.memory
        return fn

    def compile_all(self) -> None:
        """Compile every piece and its vjp now (a call compiles them on first use)."""
        sp = self.split
        for piece in (sp.before, sp.segment, sp.after):
            if piece is not None:
                self._fn(piece)
        for _, vk in self._vjp_ir.values():
            if vk is not None:
                self._fn(vk)

    # -- sizes -----------------------------------------------------------------
    def _bind(self, args, kwargs):
        bound, sizes = bind_args(self.derived.ir, args, kwargs)
        shapes = {n: np.shape(v) for n, v in bound.items()
                  if self.derived.ir.param(n).is_array and v is not None}
        sizes = ir.infer_sizes(self.derived.ir, shapes, sizes)
        env = dict(sizes)
        for p in self.primal.params:
            if not p.is_array:
                env[p.name] = bound[p.name]
        return bound, sizes, env

    def _shape(self, at: ir.ArrayType, env: dict) -> tuple:
        return tuple(max(0, ir.eval_integer(e, env)) for e in at.shape)

    @staticmethod
    def _nbytes(at: ir.ArrayType, env: dict) -> int:
        return at.dtype.storage_bytes(ir.stored_elements(at, env))

    def plan(self, env: dict, memory=None, forced: Optional[int] = None) -> Plan:
        """The plan of a call with sizes and integer parameters ``env``."""
        sp = self.split
        lo = ir.eval_integer(sp.loop.lo, env)
        hi = ir.eval_integer(sp.loop.hi, env)
        steps = max(0, hi - lo) + (1 if sp.after is not None else 0)
        limit, source = budget.budget_bytes(memory)
        snap = sum(self._nbytes(sp.arrays[n], env) for n in sp.state)
        fixed = self.fixed_bytes(env, lo)
        if forced is not None:
            free = forced
        elif snap == 0:
            free = steps
        else:
            free = (limit - fixed - self.reserve(limit)) // snap - 1
            if free < 0:
                raise self._over_budget(env, limit, source, snap, fixed)
        free = max(0, min(free, steps - 1))
        adv = ck.advances(steps, free)
        r = ck.repetitions(steps, free + 1) if free and steps > 1 else (
            steps - 1 if steps > 1 else 0)
        strategy = (f"binomial (revolve): {free} snapshot(s) of the state besides the start, "
                    f"{steps} steps reversed one at a time, {adv} forward steps recomputed "
                    f"(each step advanced at most {r} times)")
        return Plan(steps, free, adv, strategy, snap, fixed, limit, source)

    @staticmethod
    def reserve(limit: int) -> int:
        """Bytes of the budget kept for what the plan does not count (Python objects, the
        allocator's slack): 1/64 of it."""
        return limit // 64

    def fixed_bytes(self, env: dict, lo: int) -> int:
        """Bytes a call holds besides its snapshots: working copies of the arrays the kernel
        writes, two cotangent buffers per array a vjp returns, the largest vjp call's
        temporaries (one step's tapes)."""
        sp = self.split
        written = [n for n in sp.arrays
                   if n in {t.name for t in sp.temps}
                   or self.primal.param(n).intent != "in"]
        total = sum(self._nbytes(sp.arrays[n], env) for n in written)
        # cotangents: the current one and a spare output buffer per array a vjp returns
        returned = {n for wrt, _ in self._vjp_ir.values() for n in wrt}
        total += 2 * sum(self._nbytes(sp.arrays[n], env)
                         for n in returned if n not in self.scalar_wrt)
        step_env = dict(env, **{sp.start: lo})
        worst = 0
        for _, vk in self._vjp_ir.values():
            if vk is not None:
                worst = max(worst, sum(self._nbytes(t.type, step_env) for t in vk.temps))
        return total + worst

    def _over_budget(self, env, limit, source, snap, fixed) -> MemoryBudgetError:
        sp = self.split
        st = sp.segment.statements[0]
        k = self.derived.ir
        lines = budget.over_budget_lines(k, [self._nbytes(t.type, env) for t in k.temps],
                                         env, limit, source)
        lines.append(
            f"checkpointing the loop over {sp.loop.var!r} (line {sp.line}: {st.source}) cannot "
            f"meet the budget either: one snapshot of its state ({', '.join(sp.state)}) = "
            f"{self.state_formula()} bytes = {budget.human(snap)}, plus {budget.human(fixed)} "
            f"for the working arrays, cotangents and one step's temporaries")
        lines.append(
            f"how to fix: give the call more memory (pa.grad(kernel, wrt, memory='...'), or "
            f"the environment variable {budget.ENV}; checkpointing needs at least "
            f"'{budget.human((fixed + 2 * snap) * 1.1)}'), or run smaller sizes")
        return MemoryBudgetError("\n".join(lines))

    def report(self, sizes: Optional[dict] = None) -> dict:
        """The checkpointing section of ``pa.explain``: the loop, each array of a snapshot
        with its size formula, the strategy, and with ``sizes`` (sizes and integer
        parameters) the plan of such a call."""
        sp = self.split
        st = sp.segment.statements[0]
        limit, source = budget.budget_bytes(self.derived.memory)
        out = {
            "loop": sp.loop.var, "line": sp.line, "statement": st.source,
            "state": [{"name": n, "type": repr(sp.arrays[n]),
                       "bytes": budget.size_formula(ir.Temp(n, sp.arrays[n], False))}
                      for n in sp.state],
            "snapshot_bytes": self.state_formula(),
            "when": ("always" if self.derived.checkpoint not in (None, False)
                     else "when a call's tapes exceed the budget"),
            "strategy": ("binomial (revolve) over the steps of the loop (the statements after "
                         "it are the last step), reversed one step at a time with the vjp of "
                         "the step kernel (one step of tapes at most); snapshots = (63/64 "
                         "budget - working arrays - one step's temporaries) / snapshot bytes - 1"
                         if not isinstance(self.derived.checkpoint, int)
                         or isinstance(self.derived.checkpoint, bool)
                         else f"binomial (revolve), {self.derived.checkpoint} snapshot(s) "
                              f"besides the start (checkpoint={self.derived.checkpoint})"),
            "budget": {"bytes": limit, "source": source},
            "step": ([f"{n} is copied into {nxt} and updated there (every read of the step "
                      f"sees the entry value: no tape, no forward sweep for it)"
                      for n, nxt in sp.renamed.items()]
                     + [f"{t.name} {t.type!r}: {t.holds}" if t.holds else
                        f"{t.name} {t.type!r}: rewritten before read in every step"
                        for t in sp.step.temps]),
            "plan": None,
        }
        if sizes is not None:
            forced = self.derived.checkpoint
            count = None if forced in (None, True, False) else int(forced)
            out["plan"] = dict(dataclasses.asdict(self.plan(dict(sizes), self.derived.memory,
                                                            count)), sizes=dict(sizes))
        return out

    def state_formula(self) -> str:
        """Bytes of one snapshot as a formula of the sizes."""
        sp = self.split
        return " + ".join(budget.size_formula(ir.Temp(n, sp.arrays[n], False))
                          for n in sp.state) or "0"

    # -- the call ----------------------------------------------------------------
    def __call__(self, args, kwargs, forced: Optional[int] = None):
        sp = self.split
        bound, sizes, env = self._bind(args, kwargs)
        plan = self.plan(env, self.derived.memory, forced)
        lo = ir.eval_integer(sp.loop.lo, env)
        loop_steps = max(0, ir.eval_integer(sp.loop.hi, env) - lo)
        self.last_plan = plan
        counts = self.last_counts = {"advanced": 0, "reversed": 0}
        # the primal's arrays: inputs as given, copies of in-out ones, fresh outputs and
        # temporaries (the derived kernel never modifies its inputs)
        work = self._arrays(bound, env, copy=True)
        scalars = {p.name: bound[p.name] for p in self.primal.params if not p.is_array}
        # cotangents: of the outputs (vjp) or of the returned scalar
        bars: dict = {}
        result_bar = 1.0
        if self.kind == "vjp":
            for p in self.primal.params:
                if p.intent in ("out", "inout") and p.type.dtype.is_float:
                    bars[p.name] = np.array(bound[f"{p.name}_bar"], p.type.dtype.np, copy=True)
            if self.primal.result is not None:
                result_bar = bound["result_bar"]
        scalar_grads = {n: 0.0 for n in self.scalar_wrt}
        pool: dict = {}      # spare buffers for the vjp calls' outputs
        value = None

        def call_args(piece: ir.Kernel, arrays: dict, extra=()):
            out = {}
            for p in piece.params:
                if p.intent != "out":     # (a step's <name>_next: no input of its vjp)
                    out[p.name] = arrays[p.name] if p.is_array else scalars.get(p.name)
            out.update(extra)
            out.update({s: sizes[s] for s in piece.sizes if s in sizes})
            return out

        def reverse(piece: ir.Kernel, arrays: dict, extra=()):
            wrt, vk = self._vjp_ir[piece.name]
            if vk is None:
                return
            kw = call_args(piece, arrays, extra)
            for p in piece.params:
                if p.intent == "inout" or p.name in self.next_of:
                    name = self.next_of.get(p.name, p.name)
                    kw[f"{p.name}_bar"] = self._bar(bars, name, arrays[name])
            if piece.result is not None:
                kw["result_bar"] = result_bar
            for n in wrt:    # the outputs go into spare buffers (the vjp zeroes them)
                if n in pool:
                    kw[f"d_{n}"] = pool.pop(n)
            raw = self._fn(vk)(**kw)
            raw = raw if isinstance(raw, tuple) else (raw,)
            # arrays the piece updates (a step: its state, written into <name>_next) get
            # the cotangent of their entry value; those it only reads accumulate
            replaced = {p.name for p in piece.params if p.intent == "inout"} | {
                self.next_of[p.name] for p in piece.params if p.name in self.next_of}
            intents = {p.name: "inout" if p.name in replaced else p.intent
                       for p in piece.params}
            grads = dict(zip(wrt, raw))
            for n, d in grads.items():
                if n in scalar_grads:
                    scalar_grads[n] += float(np.asarray(d).reshape(-1)[0])
                elif intents[n] == "inout" or bars.get(n) is None:
                    if bars.get(n) is not None:
                        pool[n] = bars[n]
                    bars[n] = d
                else:
                    np.add(bars[n], d, out=bars[n])
                    pool[n] = d

        def bounds(t0, t1):
            return {sp.start: lo + t0, sp.stop: lo + t1}

        if sp.before is not None:
            self._fn(sp.before)(**call_args(sp.before, work))
        snapshots: dict = {}
        for action in ck.revolve_actions(plan.steps, plan.snapshots):
            kind = action[0]
            if kind == "store":
                slot = snapshots.setdefault(action[1], {})
                for n in sp.state:
                    if n in slot:
                        np.copyto(slot[n], work[n])
                    else:
                        slot[n] = np.array(work[n], copy=True)
            elif kind == "restore":
                for n in sp.state:
                    np.copyto(work[n], snapshots[action[1]][n])
            elif kind == "advance":
                self._fn(sp.segment)(**call_args(sp.segment, work, bounds(action[1], action[2])))
                counts["advanced"] += action[2] - action[1]
            elif action[1] == loop_steps:     # the statements after the loop
                reverse(sp.after, work)
                if self.kind == "value_and_grad":
                    value = self._value(work, call_args)
            else:
                reverse(sp.step, work, {sp.start: lo + action[1]})
            counts["reversed"] += kind == "reverse"
        if plan.steps == 0 and self.kind == "value_and_grad":
            value = self._value(work, call_args)
        if sp.before is not None:
            reverse(sp.before, self._arrays(bound, env, copy=False))
        outs = []
        for n in self.wrt:
            p = self.primal.param(n)
            if p.is_array:
                g = bars.get(n)
                g = np.zeros(self._shape(p.type, env), p.type.dtype.np) if g is None else g
            else:
                g = np.array([scalar_grads[n]], p.type.np)
            given = bound.get(f"d_{n}")
            if given is not None:
                np.copyto(given, np.asarray(g).reshape(np.shape(given)))
                g = given
            outs.append(g)
        if self.kind == "value_and_grad":
            return (value, *outs)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _arrays(self, bound: dict, env: dict, copy: bool) -> dict:
        """The primal's arrays on entry: its array parameters as given (in-out ones copied
        when ``copy``), zero-filled outputs and temporaries."""
        out = {}
        for p in self.primal.params:
            if not p.is_array:
                continue
            if p.intent == "out":
                out[p.name] = np.zeros(self._shape(p.type, env), p.type.dtype.np)
            else:
                a = np.ascontiguousarray(bound[p.name], p.type.dtype.np)
                out[p.name] = np.array(a, copy=True) if copy and p.intent == "inout" else a
        for t in self.split.temps:
            out[t.name] = np.zeros(self._shape(t.type, env), t.type.dtype.np)
        return out

    def _value(self, work: dict, call_args):
        """The primal's value: the ``after`` statements on copies of the arrays they write."""
        after = self.split.after
        arrays = {n: (np.array(a, copy=True) if any(
            p.name == n and p.intent == "inout" for p in after.params) else a)
            for n, a in work.items()}
        raw = self._fn(after)(**call_args(after, arrays))
        return raw[0] if isinstance(raw, tuple) else raw

    @staticmethod
    def _bar(bars: dict, name: str, like: np.ndarray) -> np.ndarray:
        b = bars.get(name)
        if b is None:
            b = bars[name] = np.zeros(like.shape, like.dtype)
        return b


def checkpointer(derived, target: str = "openmp") -> Optional[Checkpointer]:
    """The checkpointed version of ``derived`` with pieces compiled for ``target`` (made
    once per target), None when its primal has no checkpointable loop (``refusal`` says
    why)."""
    cache = derived.__dict__
    key = "_checkpointer" if target == "openmp" else f"_checkpointer_{target}"
    if key not in cache:
        try:
            cache[key] = Checkpointer(derived, target)
            cache["_checkpoint_refusal"] = None
        except ck.NotCheckpointable as exc:
            cache[key] = None
            cache["_checkpoint_refusal"] = str(exc)
    return cache[key]


class CheckpointedFunction:
    """``pa.compile(g, target=...)`` of a derived kernel ``g`` with ``checkpoint=`` set, for
    a target other than OpenMP: called like the compiled derived kernel (raw outputs:
    ``g.package`` shapes them), it runs the checkpointing driver over the pieces compiled
    for ``target``. ``source``: the pieces' generated code, one after the other."""

    def __init__(self, derived, target: str, sanitize=None, deterministic: bool = False):
        self.derived = derived
        self.target = target
        self.checkpointer = checkpointer(derived, target)
        self.checkpointer.sanitize = sanitize
        self.checkpointer.deterministic = deterministic

    def __call__(self, *args, **kwargs):
        forced = self.derived.checkpoint
        return self.checkpointer(args, kwargs, None if forced is True else int(forced))

    @property
    def source(self) -> str:
        cp = self.checkpointer
        cp.compile_all()
        return "\n".join(f"/* ---- checkpointed piece {name} ---- */\n{fn.source}"
                         for name, fn in cp._compiled.items())


def refusal(derived) -> str:
    """Why ``derived`` cannot be checkpointed ('' when it can)."""
    checkpointer(derived)
    return derived.__dict__.get("_checkpoint_refusal") or ""


def needs_checkpointing(derived, args, kwargs) -> bool:
    """Would this call's temporaries (the tapes above all) exceed the budget? Decided once
    per call pattern (array shapes, integer arguments) and budget."""
    k = derived.ir
    if not ad.tape_arrays(k):
        return False

    def key_of(v):
        if isinstance(v, np.ndarray):
            return v.shape
        return v if isinstance(v, (int, np.integer)) else None

    limit = budget.budget_bytes(derived.memory)[0]
    key = (limit, tuple(key_of(v) for v in args),
           tuple((n, key_of(v)) for n, v in kwargs.items()))
    seen = derived.__dict__.setdefault("_checkpoint_decisions", {})
    if key not in seen:
        if len(seen) > 64:
            seen.clear()
        bound, sizes = bind_args(k, args, kwargs)
        shapes = {n: np.shape(v) for n, v in bound.items() if k.param(n).is_array}
        env = dict(ir.infer_sizes(k, shapes, sizes))
        for p in k.params:
            if not p.is_array and p.name in bound:
                env[p.name] = bound[p.name]
        total = 0
        for t in k.temps:
            total += t.type.dtype.storage_bytes(ir.stored_elements(t.type, env))
        seen[key] = total > limit
    return seen[key]

