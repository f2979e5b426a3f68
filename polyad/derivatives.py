"""The user-facing derivative API: ``pa.grad``, ``pa.value_and_grad``, ``pa.vjp``,
``pa.check_grad``, ``pa.derivative`` / ``pa.custom_vjp``.

Every derived object is a ``DerivedKernel``: an ordinary polyad ``Kernel``
(its IR is ``.ir``; it compiles, can be inspected and differentiated again)
whose call packages the results for the user::

    dg = pa.grad(tv_cost, wrt="g")(g, b, lam)                 # array like g
    C, (dx, df) = pa.value_and_grad(cost, wrt=["x", "f"])(x, y, f)
    grads = pa.grad(cost, wrt={"image": "x"})(x, y, f)       # {"image": dx}
    x_bar = pa.vjp(blur, wrt="x")(x, f, y_bar)               # pullback

Gradients with respect to float scalar parameters come back as Python floats.
The IR-level conventions (parameter order, ``d_<name>`` outputs) are those of
``polyad.ad``.

Derived kernels run compiled; ``check_grad(..., interpret=True)`` runs them
through the reference interpreter instead (``polyad.testing.call_interpreted``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import numpy as np

from . import ad, callconv, ir
from . import checkpointing as _checkpointing
from .ad import funcs as _ad_funcs
from .ad import rules as _ad_rules
from .api import Func, Kernel
from .errors import NotDifferentiableError, ShapeError
from .pipeline import kernel_ir
from .runtime import budget as _budget
from .testing import call_interpreted
from .tracebacks import user_facing

__all__ = ["grad", "value_and_grad", "vjp", "jvp", "hvp", "hessian", "adjoint", "is_linear",
           "is_affine", "check_grad", "derivative", "custom_vjp", "DerivedKernel", "HessianKernel",
           "GradCheck", "NoGradientPathWarning"]

NoGradientPathWarning = ad.NoGradientPathWarning

_RULES_VERSION = [0]


# --------------------------------------------------------------------------
# derived kernels
# --------------------------------------------------------------------------


def _wrt_key(wrt):
    if isinstance(wrt, str):
        return ("s", wrt)
    if isinstance(wrt, dict):
        return ("d", tuple(wrt.items()))
    if isinstance(wrt, (list, tuple)):
        return ("l", tuple(wrt))
    raise TypeError(f"wrt must be a parameter name, a list of names or a dict, got {wrt!r}")


class DerivedKernel(Kernel):
    """A kernel derived by AD (``pa.grad`` & co.): an ordinary ``Kernel`` whose call
    returns the derivatives shaped like ``wrt`` (one value, a tuple, or a dict)."""

    def __init__(self, ir_kernel: ir.Kernel, kind: str, primal, wrt):
        super().__init__(ir_kernel=ir_kernel)
        #: the memory budget of a call's tapes and temporaries (``memory=`` of pa.grad & co.;
        #: None: the default, see ``polyad.runtime.budget``)
        self.memory = None
        #: ``checkpoint=`` of pa.grad & co.: None (checkpoint when the tapes exceed the
        #: budget), True / False (always / never), or a number of snapshots (always)
        self.checkpoint = None
        self._has_tapes = bool(ad.tape_arrays(ir_kernel))
        self.__name__ = ir_kernel.name
        self.__qualname__ = ir_kernel.name
        self.kind = kind
        self.primal = primal
        self.wrt = wrt
        self.wrt_names = ad.check_wrt(kernel_ir(primal), wrt)
        self._package = result_packager(kind, wrt, self.wrt_names, kernel_ir(primal))
        self.__doc__ = callconv.docstring(
            ir_kernel, f"{kind} of {kernel_ir(primal).name} with respect to {wrt!r}.",
            self._returns_doc())

    def _returns_doc(self) -> str:
        """What ``package`` returns, in words."""
        pk = kernel_ir(self.primal)
        each = [f"d_{n}: " + ("an array like " + n if pk.param(n).is_array else "a float")
                for n in self.wrt_names]
        if isinstance(self.wrt, str):
            grads = each[0]
        elif isinstance(self.wrt, dict):
            grads = "a dict {" + ", ".join(f"{label!r}: d_{n}" for label, n in
                                            zip(self.wrt, self.wrt_names)) + "}"
        else:
            grads = "a tuple (" + ", ".join(each) + ")"
        if self.kind == "value_and_grad":
            return f"Returns: (value of {pk.name}, {grads})."
        return f"Returns: {grads}."

    def __call__(self, *args, **kwargs):
        if self.checkpoint is not False and self.kind in _CHECKPOINTED_KINDS:
            if self.checkpoint is not None:
                cp = _checkpointing.checkpointer(self)
                if cp is None:
                    raise NotDifferentiableError(
                        f"{self.ir.name}: checkpoint={self.checkpoint!r} but "
                        f"{_checkpointing.refusal(self)}", self.ir.filename or "<kernel>",
                        self.ir.line, 0, "call without checkpoint= (the tapes must then fit "
                        "the memory budget)")
                count = None if self.checkpoint is True else int(self.checkpoint)
                return self._package(cp(args, kwargs, count))
            if self._has_tapes and _checkpointing.needs_checkpointing(self, args, kwargs):
                cp = _checkpointing.checkpointer(self)
                if cp is not None:
                    return self._package(cp(args, kwargs))
        fn = self._default
        if fn is None:
            fn = self._default = self.compile()
        return self._package(fn(*args, **kwargs))

    def compile(self, target: str = "openmp", sanitize=None, deterministic: bool = False,
                tile=None, fuse=None):
        """The compiled derived kernel; for a CUDA target with ``checkpoint=`` set, the
        checkpointing driver over the pieces compiled for it
        (``polyad.checkpointing.CheckpointedFunction``; ``tile`` is ignored on CUDA)."""
        if target != "openmp" and self.checkpoint not in (None, False) \
                and self.kind in _CHECKPOINTED_KINDS:
            if _checkpointing.checkpointer(self, target) is None:
                raise NotDifferentiableError(
                    f"{self.ir.name}: checkpoint={self.checkpoint!r} but "
                    f"{_checkpointing.refusal(self)}", self.ir.filename or "<kernel>",
                    self.ir.line, 0, "compile without checkpoint= (the tapes must then fit "
                    "the memory budget)")
            return _checkpointing.CheckpointedFunction(self, target, sanitize, deterministic)
        fn = super().compile(target, sanitize, deterministic, tile, fuse)
        fn.memory_budget = self.memory
        return fn

    def checkpoint_report(self, sizes=None):
        """The checkpointing section of ``pa.explain`` (None: no tapes, or no loop to
        checkpoint)."""
        if self.kind not in _CHECKPOINTED_KINDS or self.checkpoint is False \
                or not ad.tape_arrays(self.ir):
            return None
        cp = _checkpointing.checkpointer(self)
        return None if cp is None else cp.report(sizes)

    def checkpoint_plan(self, **sizes):
        """The checkpointing plan (``polyad.checkpointing.Plan``) of a call with these sizes
        and integer parameters; None when the primal has no checkpointable loop."""
        cp = _checkpointing.checkpointer(self)
        if cp is None:
            return None
        count = None if self.checkpoint in (None, True, False) else int(self.checkpoint)
        return cp.plan(sizes, self.memory, count)

    def package(self, raw):
        """Shape the raw outputs (``d_<wrt>`` arrays, maybe led by the value) for the user."""
        return self._package(raw)

    def tape_bytes(self, **sizes) -> int:
        """Bytes of tape memory one call allocates for these sizes (and int parameters)."""
        return ad.tape_bytes(self.ir, sizes)

    def __repr__(self):
        return f"<polyad {self.kind} kernel {self.ir.name}>"


def result_packager(kind: str, wrt, wrt_names, primal: ir.Kernel):
    """The function that shapes a derived kernel's raw outputs (``d_<wrt>`` arrays, led
    by the value for ``value_and_grad``) as the user gets them: one value, a tuple or a
    dict like ``wrt``, a Python float for a float scalar ``wrt``. Decided once per
    derived kernel, so a call pays nothing for it when ``wrt`` names one array."""
    if kind == "jvp":
        return _jvp_packager(primal)
    scalar = tuple(not primal.param(name).is_array for name in wrt_names)
    with_value = kind == "value_and_grad"
    if isinstance(wrt, str) and not scalar[0]:
        return (lambda raw: (raw[0], raw[1])) if with_value else (lambda raw: raw)
    several = len(wrt_names) > 1

    def package(raw):
        if with_value:
            value, outs = raw[0], raw[1:]
        else:
            value, outs = None, raw if several else (raw,)
        grads = [float(np.asarray(o).reshape(-1)[0]) if s else o for o, s in zip(outs, scalar)]
        if isinstance(wrt, str):
            g = grads[0]
        elif isinstance(wrt, dict):
            g = dict(zip(wrt.keys(), grads))
        else:
            g = tuple(grads)
        return (value, g) if with_value else g

    return package


def _jvp_packager(primal: ir.Kernel):
    """``raw -> (primal outputs, tangent outputs)``, each shaped like the primal's own return
    (the value first, then the ``pa.Out`` arrays; one item unwrapped)."""
    n_out = sum(1 for p in primal.params if p.intent == "out")
    has_value = primal.result is not None

    def one(xs):
        return xs[0] if len(xs) == 1 else tuple(xs)

    def package(raw):
        raw = raw if isinstance(raw, tuple) else (raw,)
        value, arrays = (raw[0], list(raw[1:])) if has_value else (None, list(raw))
        outs, tans = arrays[:n_out], arrays[n_out:]
        if has_value:   # the tangent of the value comes last, as result_dot[0]
            outs = [value] + outs
            tans = [float(np.asarray(tans[-1]).reshape(-1)[0])] + tans[:-1]
        return one(outs), one(tans)

    return package


_CHECKPOINTED_KINDS = ("grad", "value_and_grad", "vjp")


def _derived(k, wrt, kind, build, cls=None, memory=None, checkpoint=None):
    if memory is not None:
        _budget.parse_bytes(memory)    # a bad budget fails here, not at the first call
    if not (checkpoint is None or isinstance(checkpoint, bool)
            or isinstance(checkpoint, int) and checkpoint >= 0):
        raise TypeError(f"checkpoint must be None, True, False or a number of snapshots "
                        f"(>= 0), got {checkpoint!r}")
    if isinstance(k, ir.Kernel):
        k = Kernel(ir_kernel=k)
    if not isinstance(k, Kernel):
        raise TypeError(f"pa.{kind}() differentiates a @pa.kernel, got {k!r}")
    cache = k.__dict__.setdefault("_polyad_derived", {})
    # checkpoint=0 (snapshots) is not checkpoint=False, though 0 == False
    key = (kind, _wrt_key(wrt), _RULES_VERSION[0], memory, (type(checkpoint), checkpoint))
    if key not in cache:
        cache[key] = (cls or DerivedKernel)(build(k.ir, wrt), kind, k, wrt)
        cache[key].memory = memory
        cache[key].checkpoint = checkpoint
    return cache[key]


@user_facing
def grad(k, wrt, mode: Optional[str] = None, memory=None, checkpoint=None) -> DerivedKernel:
    """Gradient of the scalar a kernel returns, with respect to ``wrt``.

    ``wrt``: a parameter name (the call returns one array or float), a list
    (a tuple comes back) or a dict ``label -> name`` (a dict comes back).
    ``mode``: ``"reverse"`` (one adjoint sweep for all of ``wrt``) or
    ``"forward"`` (one tangent sweep per parameter; scalar parameters only).
    Without ``mode``: forward when every ``wrt`` parameter is a scalar (the
    cheap direction for few inputs), reverse otherwise.
    ``memory``: the budget of a call's tapes and temporaries (``"1GB"``,
    ``"512MiB"``, ``"25%"`` of physical memory, or bytes); a call over it raises
    ``pa.MemoryBudgetError`` naming each tape and its size formula before
    allocating anything. Default: ``POLYAD_MEMORY_BUDGET``, else half the
    physical memory. ``pa.explain`` of the derived kernel lists the tapes.
    ``checkpoint``: when the tapes would exceed the budget and the kernel has an outer
    sequential loop (time steps, the outer ``k`` of a factorization), the call stores the
    loop's state at checkpoints and recomputes steps instead (binomial / revolve schedule,
    snapshots chosen from the budget; ``polyad.checkpointing``). ``checkpoint=True``
    always checkpoints, ``False`` never, ``n`` (an int) always, with ``n`` snapshots
    besides the start. A call checkpoints over OpenMP pieces; ``pa.compile(g,
    target="cuda")`` with ``checkpoint=`` set, over CUDA pieces.
    """
    if mode is None:
        names = ad.check_wrt(kernel_ir(k), wrt)
        pk = kernel_ir(k)
        mode = "reverse" if any(pk.param(n).is_array for n in names) else "forward"
    if mode == "forward":
        return _derived(k, wrt, "grad_forward", ad.forward_grad_kernel, memory=memory)
    if mode != "reverse":
        raise ValueError(f"mode must be 'forward' or 'reverse', got {mode!r}")
    return _derived(k, wrt, "grad", ad.grad_kernel, memory=memory, checkpoint=checkpoint)


@user_facing
def jvp(k, wrt) -> DerivedKernel:
    """Pushforward (forward mode): call with ``k``'s inputs, then one tangent per ``wrt``
    parameter (same shape; a float for a scalar), optionally the ``pa.Out`` arrays;
    returns ``(outputs, tangents)``: each shaped like ``k``'s own return (the scalar
    value first, then its ``pa.Out`` arrays, one item unwrapped)::

        y, ydot = pa.jvp(blur, wrt="x")(x, f, xdot)
        c, cdot = pa.jvp(cost, wrt=["g", "lam"])(g, b, lam, gdot, lamdot)
    """
    return _derived(k, wrt, "jvp", ad.jvp_kernel)


@user_facing
def value_and_grad(k, wrt, memory=None, checkpoint=None) -> DerivedKernel:
    """Like ``grad`` (``memory`` and ``checkpoint`` too); the call returns
    ``(value, gradient(s))``."""
    return _derived(k, wrt, "value_and_grad", ad.value_and_grad_kernel, memory=memory,
                    checkpoint=checkpoint)


@user_facing
def vjp(k, wrt, memory=None, checkpoint=None) -> DerivedKernel:
    """Pullback: call with ``k``'s inputs, then one cotangent per output array (``pa.Out`` and
    in-out arrays, in order), then the cotangent of the returned scalar if any; returns
    the cotangent(s) of ``wrt``. ``memory`` and ``checkpoint``: as for ``grad``."""
    return _derived(k, wrt, "vjp", ad.vjp_kernel, memory=memory, checkpoint=checkpoint)


@user_facing
def hvp(k, wrt, memory=None) -> DerivedKernel:
    """Hessian-vector product of the scalar a kernel returns: call with ``k``'s inputs, then
    one vector per ``wrt`` parameter (shaped like it); returns ``H v`` shaped like ``wrt``
    (one array or float, a tuple, or a dict). Forward mode over the reverse-mode gradient
    kernel (and its tapes: ``memory`` is their budget, as for ``grad``)::

        hv = pa.hvp(cost, wrt="g")(g, b, 0.1, v)
    """
    return _derived(k, wrt, "hvp", ad.hvp_kernel, memory=memory)


#: the largest number of entries of ``wrt`` ``pa.hessian`` builds a dense Hessian for
HESSIAN_MAX_SIZE = 4096


class HessianKernel(DerivedKernel):
    """``pa.hessian``: the hvp kernel (its ``.ir``), called once per unit vector."""

    def __call__(self, *args, **kwargs):
        pk = kernel_ir(self.primal)
        (name,) = self.wrt_names
        bound, sizes = callconv.bind_args(pk, args, kwargs)
        x = bound[name]
        shape = np.shape(x)
        n = int(np.prod(shape)) if shape else 1
        if n > HESSIAN_MAX_SIZE:
            raise ShapeError(f"pa.hessian({pk.name}, wrt={name!r}): {name} has {n} entries; a "
                             f"dense Hessian is built for at most {HESSIAN_MAX_SIZE} "
                             f"(pa.derivatives.HESSIAN_MAX_SIZE) - use pa.hvp(k, wrt) for "
                             f"Hessian-vector products instead")
        inputs = {p.name: bound[p.name] for p in pk.params if p.intent != "out"}
        dt = np.asarray(x).dtype if shape else np.float64
        cols = []
        for j in range(n):
            e = np.zeros(n, dt)
            e[j] = 1
            v = e.reshape(shape) if shape else 1.0
            raw = Kernel.__call__(self, **inputs, **{f"{name}_dot": v}, **sizes)
            cols.append(np.asarray(raw).reshape(-1)[:n] if shape else
                        float(np.asarray(raw).reshape(-1)[0]))
        if not shape:
            return cols[0]
        return np.stack(cols, axis=-1).reshape(shape + shape)


@user_facing
def hessian(k, wrt: str) -> HessianKernel:
    """Dense Hessian of the scalar a kernel returns with respect to one parameter, by
    ``pa.hvp`` over unit vectors (one compiled hvp call per entry); for small inputs:
    shape ``x.shape + x.shape`` (a float for a scalar). Above ``HESSIAN_MAX_SIZE``
    entries it raises ``pa.ShapeError`` (use ``pa.hvp``)."""
    if not isinstance(wrt, str):
        raise TypeError("pa.hessian(k, wrt) takes one parameter name; for several, use "
                        "pa.hvp with vectors for each")
    return _derived(k, wrt, "hessian",
                    ad.hvp_kernel, cls=HessianKernel)


@user_facing
def adjoint(k, wrt) -> DerivedKernel:
    """The transpose of a kernel linear in ``wrt``, as a kernel: call it with ``k``'s other
    inputs, then one cotangent per output array (then ``result_bar`` for a returned
    scalar); it returns the ``wrt``-shaped result ``A^T w``::

        xt = pa.adjoint(blur, wrt="x")(f, w)

    Raises ``pa.NotLinearError`` (naming the statement and line) when ``k`` is not
    linear in ``wrt`` (``pa.is_linear``).
    """
    return _derived(k, wrt, "adjoint", ad.adjoint_kernel)


@user_facing
def is_linear(k, wrt) -> bool:
    """Is every output of kernel ``k`` linear in ``wrt``? Conservative: a linear kernel may
    be answered False (say, one holding an affine value in a variable it later reuses),
    a nonlinear one is never answered True. Looks through device functions and
    temporaries."""
    return ad.is_linear(kernel_ir(k), wrt)


@user_facing
def is_affine(k, wrt) -> bool:
    """Is every output of kernel ``k`` affine (linear plus a constant) in ``wrt``?
    Conservative like ``is_linear``."""
    return ad.is_affine(kernel_ir(k), wrt)


# --------------------------------------------------------------------------
# user derivative rules
# --------------------------------------------------------------------------


@user_facing
def derivative(f, wrt: Optional[str] = None):
    """Decorator: supply the partial derivative of device function ``f``.

    ::

        @pa.func
        def softplus(x: pa.f64) -> pa.f64:
            return pa.log(1.0 + pa.exp(x))

        @pa.derivative(softplus)              # d softplus / dx
        def softplus_d(x: pa.f64) -> pa.f64:
            return 1.0 / (1.0 + pa.exp(-x))

    The decorated function takes the same parameters as ``f`` and returns
    ``d f / d wrt`` (``wrt`` may be omitted when ``f`` has one parameter).
    It replaces the derivative polyad would derive from ``f``'s body, in every
    kernel differentiated afterwards; other parameters keep the built-in rule.
    """
    fdef = getattr(f, "__polyad_func__", None)
    if fdef is None:
        raise TypeError(f"pa.derivative() takes a @pa.func device function, got {f!r}")
    params = [p for p, _ in fdef.params]
    if wrt is None:
        if len(params) != 1:
            raise TypeError(f"{fdef.name}() has {len(params)} parameters; name the one the "
                            f"rule is for: @pa.derivative({fdef.name}, wrt={params[0]!r})")
        wrt = params[0]

    def deco(fn):
        dfunc = fn if isinstance(fn, Func) else Func(fn)
        _ad_rules.register_func_rule(fdef, wrt, dfunc.__polyad_func__, dfunc.__polyad_deps__)
        _ad_funcs.clear_cache()
        _RULES_VERSION[0] += 1
        return dfunc

    return deco


def custom_vjp(f, **partials):
    """Register several partial derivatives of device function ``f`` at once:
    ``pa.custom_vjp(huber, r=huber_dr, delta=huber_ddelta)`` (each a device function or a
    plain Python function with ``f``'s parameters). Returns ``f``."""
    for name, fn in partials.items():
        derivative(f, wrt=name)(fn)
    return f


# --------------------------------------------------------------------------
# gradient check
# --------------------------------------------------------------------------


@dataclasses.dataclass
class GradCheck:
    """Result of ``pa.check_grad``: worst relative error over random directions."""

    max_rel_error: float
    direction: dict            # the worst direction: wrt name -> array (or float)
    fd: float                  # finite-difference directional derivative along it
    ad: float                  # AD directional derivative along it
    errors: list               # relative error per direction
    tol: float
    eps: float

    @property
    def ok(self) -> bool:
        return self.max_rel_error <= self.tol

    def __bool__(self):
        return self.ok

    def __str__(self):
        verdict = "OK" if self.ok else "FAILED"
        return (f"check_grad {verdict}: worst relative error {self.max_rel_error:.3g} "
                f"(tol {self.tol:g}, eps {self.eps:g}) - finite differences {self.fd:.12g}, "
                f"AD {self.ad:.12g} along direction "
                + ", ".join(f"{n}: {np.array2string(np.asarray(v), precision=4, threshold=8)}"
                            for n, v in self.direction.items()))


@user_facing
def check_grad(k, wrt, *args, eps: Optional[float] = None, directions: int = 3,
               seed: int = 0, tol: Optional[float] = None, interpret: bool = False,
               **kwargs) -> GradCheck:
    """Check AD against central finite differences on random directions.

    For a kernel returning a scalar ``f``, compares ``<grad f, v>`` with
    ``(f(x + eps v) - f(x - eps v)) / (2 eps)`` for ``directions`` random unit
    directions ``v`` over all ``wrt`` parameters; for a kernel without a
    scalar result the checked function is ``sum_o <c_o, o(x)>`` with random
    cotangents ``c_o`` of its outputs (the vjp is checked). Returns a
    ``GradCheck`` (truthy when ``max_rel_error <= tol``) that names the worst
    relative error and its direction. float64 kernels give ~1e-8 agreement
    with the default ``eps = 1e-6``. ``interpret=True`` runs the primal and the
    derived kernel in the reference interpreter instead of compiling them (to
    tell an AD error from a compiler error).
    """
    kobj = k if isinstance(k, Kernel) else Kernel(ir_kernel=kernel_ir(k))
    pk = kobj.ir
    names = ad.check_wrt(pk, wrt)
    bound, sizes = callconv.bind_args(pk, args, kwargs)
    bound = {n: (np.array(v, copy=True) if isinstance(v, np.ndarray) else v)
             for n, v in bound.items()}
    is64 = all((p.type.dtype if p.is_array else p.type) != ir.f32 for p in pk.params
               if (p.type.dtype if p.is_array else p.type).is_float)
    eps = eps if eps is not None else (1e-6 if is64 else 1e-3)
    tol = tol if tol is not None else (1e-5 if is64 else 2e-2)
    rng = np.random.default_rng(seed)
    inputs = [p for p in pk.params if p.intent != "out"]
    outputs = [p for p in pk.params if p.intent in ("out", "inout") and p.type.dtype.is_float]

    def call(kern, **kw):
        if interpret:
            raw = call_interpreted(kern.ir, **kw)
            return kern.package(raw) if isinstance(kern, DerivedKernel) else raw
        return kern(**kw)

    def call_primal(vals):
        a = {n: (np.array(v, copy=True) if isinstance(v, np.ndarray) else v)
             for n, v in vals.items() if n in {p.name for p in inputs}}
        return call(kobj, **a, **sizes)

    if pk.result is not None:
        cot = None

        def f(vals):
            r = call_primal(vals)
            return float(r[0] if isinstance(r, tuple) else r)

        dk = grad(kobj, names)
        gr = call(dk, **{p.name: bound[p.name] for p in inputs}, **sizes)
    else:
        # random cotangents of the outputs: check the vjp
        first = call(kobj, **{p.name: np.array(bound[p.name], copy=True)
                              if isinstance(bound[p.name], np.ndarray)
                              else bound[p.name] for p in inputs}, **sizes)
        outs = first if isinstance(first, tuple) else (first,)
        out_params = [p for p in pk.params if p.intent == "out"]
        shapes = {p.name: np.shape(o) for p, o in zip(out_params, outs)}
        for p in pk.params:
            if p.intent == "inout":
                shapes[p.name] = np.shape(bound[p.name])
        cot = {p.name: rng.standard_normal(shapes[p.name]) for p in outputs}

        def f(vals):
            a = {n: (np.array(v, copy=True) if isinstance(v, np.ndarray) else v)
                 for n, v in vals.items() if n in {p.name for p in inputs}}
            r = call(kobj, **a, **sizes)
            r = r if isinstance(r, tuple) else (r,)
            total = 0.0
            op = [p for p in pk.params if p.intent == "out"]
            for p, o in zip(op, r):
                if p.name in cot:
                    total += float(np.sum(cot[p.name] * o))
            for p in pk.params:
                if p.intent == "inout" and p.name in cot:
                    total += float(np.sum(cot[p.name] * a[p.name]))
            return total

        dk = vjp(kobj, names)
        bars = {f"{p.name}_bar": (cot[p.name] if p.name in cot else np.zeros(shapes[p.name]))
                for p in pk.params if p.intent in ("out", "inout")}
        gr = call(dk, **{p.name: bound[p.name] for p in inputs}, **bars, **sizes)
    grads = dict(zip(names, gr if isinstance(gr, tuple) else (gr,)))

    errors, worst = [], None
    for _ in range(directions):
        v = {}
        for n in names:
            p = pk.param(n)
            v[n] = rng.standard_normal(np.shape(bound[n])) if p.is_array else rng.standard_normal()
        norm = math.sqrt(sum(float(np.sum(np.square(x))) for x in v.values()))
        v = {n: x / norm for n, x in v.items()}
        plus = dict(bound)
        minus = dict(bound)
        for n in names:
            plus[n] = bound[n] + eps * v[n]
            minus[n] = bound[n] - eps * v[n]
        fd = (f(plus) - f(minus)) / (2 * eps)
        adv = sum(float(np.sum(np.asarray(grads[n]) * v[n])) for n in names)
        scale = max(abs(fd), abs(adv))
        err = abs(fd - adv) / scale if scale > 1e-8 else abs(fd - adv)
        errors.append(err)
        if worst is None or err > worst[0]:
            worst = (err, v, fd, adv)
    return GradCheck(worst[0], worst[1], worst[2], worst[3], errors, tol, eps)
