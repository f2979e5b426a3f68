"""Optimisation on top of polyad's derivatives: linear operators and solvers.

``pa.linear_operator(kernel, wrt, **bound)`` turns a kernel linear in ``wrt``
into an operator ``A`` with ``A(x)`` (the kernel), ``A.T(y)`` (its generated
adjoint, ``pa.adjoint``), ``shape``/``dtype`` and ``A.aslinearoperator()`` (a
``scipy.sparse.linalg.LinearOperator`` on flattened arrays; scipy is only
imported there).

Solvers (each takes a ``callback``, stops on a tolerance, returns the solution
and a ``SolveInfo`` record, and shows a progress line on a terminal)::

    x, info = pa.solvers.cg(A, y, lam=0.01, R=pa.linear_operator(grad2d, wrt="x"))
    x, info = pa.solvers.gradient_descent(pa.solvers.Objective(cost, "x", y=y), x0)
    x, info = pa.solvers.nonlinear_cg(objective, x0)
    x, info = pa.solvers.newton_cg(objective, x0)         # Hessian-vector products: pa.hvp
    params, info = pa.solvers.adam(objective, {"w1": w1, "w2": w2}, lr=1e-2)

An *objective* is any callable ``x -> (value, gradient)``; ``Objective``
builds one from a scalar kernel (``pa.value_and_grad``, and ``pa.hvp`` for
Newton-CG). ``x`` is an array, or a dict of arrays for ``Objective`` with a
dict ``wrt`` (Adam's parameter groups).
"""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import Callable, Optional

import numpy as np

from . import derivatives, ir
from .ad import check_linear
from .api import Kernel
from .errors import ArgumentError, ShapeError
from .callconv import infer_sizes

__all__ = ["LinearOperator", "linear_operator", "Objective", "SolveInfo", "cg",
           "gradient_descent", "nonlinear_cg", "newton_cg", "adam"]


# --------------------------------------------------------------------------
# linear operators
# --------------------------------------------------------------------------


class LinearOperator:
    """A kernel linear in ``wrt`` with its other arguments bound: ``A(x)``, ``A.T(y)``.

    Built by ``pa.linear_operator``. ``in_shape``/``out_shape`` are known once the
    sizes are (from the bound arrays, size keywords such as ``N=64``, or the first
    call); ``shape`` is ``(out_size, in_size)`` as for a matrix on flattened arrays.
    """

    def __init__(self, kernel, wrt: str, **bound):
        if not isinstance(kernel, Kernel):
            raise TypeError(f"pa.linear_operator() takes a @pa.kernel, got {kernel!r}")
        k = kernel.ir
        if not isinstance(wrt, str):
            raise TypeError("pa.linear_operator(kernel, wrt): wrt is one parameter name")
        check_linear(k, wrt)
        outs = [p for p in k.params if p.intent == "out"]
        inouts = [p for p in k.params if p.intent == "inout"]
        if inouts or (k.result is not None and outs) or not (outs or k.result is not None):
            raise ArgumentError(
                f"pa.linear_operator({k.name}): the kernel's outputs must be pa.Out arrays or "
                f"one returned scalar (no in-out arrays); it has {len(outs)} pa.Out array(s), "
                f"{len(inouts)} in-out array(s)"
                f"{' and returns a scalar' if k.result is not None else ''}")
        params = {p.name for p in k.params}
        sizes = {n: v for n, v in bound.items() if n in k.sizes}
        args = {n: v for n, v in bound.items() if n in params}
        unknown = set(bound) - set(sizes) - set(args)
        if unknown or wrt in args:
            bad = sorted(unknown) or [wrt]
            raise ArgumentError(f"pa.linear_operator({k.name}, wrt={wrt!r}): cannot bind "
                                f"{', '.join(bad)} (bind the kernel's other inputs and sizes)")
        missing = [p.name for p in k.params if p.intent == "in" and p.name != wrt
                   and p.name not in args]
        if missing:
            raise ArgumentError(f"pa.linear_operator({k.name}, wrt={wrt!r}): bind "
                                f"{', '.join(missing)} (e.g. {missing[0]}=...)")
        self.kernel = kernel
        self.wrt = wrt
        self.bound = args
        self.sizes = sizes
        self.outputs = outs     # several: A(x) is a tuple, A.T takes a tuple
        self.adjoint = derivatives.adjoint(kernel, wrt)
        p = k.param(wrt)
        self.dtype = (p.type.dtype if p.is_array else p.type).np
        self._x_type = p.type if p.is_array else None
        self._learn_sizes({})

    def _learn_sizes(self, extra: dict):
        k = self.kernel.ir
        arrays = {n: v for n, v in {**self.bound, **extra}.items() if isinstance(v, np.ndarray)}
        try:
            self.sizes = infer_sizes(k, arrays, self.sizes)
        except ArgumentError:
            return   # not all sizes known yet: the first call tells them

    def _shape_of(self, atype) -> Optional[tuple]:
        if atype is None:
            return ()
        dims = [ir.eval_integer(e, {**self.sizes, **{n: v for n, v in self.bound.items()
                                                      if not isinstance(v, np.ndarray)}})
                for e in atype.shape]
        return None if any(d is None for d in dims) else tuple(dims)

    @property
    def in_shape(self) -> Optional[tuple]:
        return self._shape_of(self._x_type)

    @property
    def out_shapes(self) -> Optional[list]:
        """The shape of every output (``[()]`` for a returned scalar)."""
        if not self.outputs:
            return [()]
        shapes = [self._shape_of(p.type) for p in self.outputs]
        return None if any(s is None for s in shapes) else shapes

    @property
    def out_shape(self) -> Optional[tuple]:
        """The output's shape (one output), or None while unknown."""
        shapes = self.out_shapes
        if shapes is None:
            return None
        if len(shapes) != 1:
            raise ShapeError(f"pa.linear_operator({self.kernel.ir.name}) has "
                             f"{len(shapes)} outputs: see out_shapes")
        return shapes[0]

    @property
    def shape(self) -> tuple[int, int]:
        """``(rows, columns)`` of the operator on flattened arrays (outputs concatenated)."""
        i, o = self.in_shape, self.out_shapes
        if i is None or o is None:
            raise ShapeError(f"the shape of pa.linear_operator({self.kernel.ir.name}) is not "
                             f"known yet: bind the sizes ({', '.join(self.kernel.ir.sizes)}=...) "
                             f"or call the operator once")
        return (sum(math.prod(s) for s in o), math.prod(i))

    def __call__(self, x):
        """``A x``: the kernel on ``x`` and the bound arguments."""
        if isinstance(x, np.ndarray):
            self._learn_sizes({self.wrt: x})
        out = self.kernel(**{self.wrt: x}, **self.bound, **self._size_kwargs())
        return out

    __matmul__ = __call__

    def rmatvec(self, y):
        """``A^T y``: the generated adjoint kernel (``y`` a tuple for several outputs)."""
        if not self.outputs:
            bars = {"result_bar": y}
        elif len(self.outputs) == 1:
            bars = {f"{self.outputs[0].name}_bar": y}
        else:
            if not isinstance(y, tuple) or len(y) != len(self.outputs):
                raise ArgumentError(f"A.T of pa.linear_operator({self.kernel.ir.name}) takes a "
                                    f"tuple of {len(self.outputs)} arrays, one per output")
            bars = {f"{p.name}_bar": v for p, v in zip(self.outputs, y)}
        return self.adjoint(**self._coefficients(), **bars, **self._size_kwargs())

    def _coefficients(self) -> dict:
        names = {p.name for p in self.adjoint.ir.params}
        return {n: v for n, v in self.bound.items() if n in names}

    def _size_kwargs(self) -> dict:
        return {n: v for n, v in self.sizes.items()
                if n in self.kernel.ir.sizes and not self._size_from_arrays(n)}

    def _size_from_arrays(self, name: str) -> bool:
        for p in self.kernel.ir.params:
            if p.is_array and p.intent != "out" and (p.name in self.bound or p.name == self.wrt):
                for e in p.type.shape:
                    if any(isinstance(x, ir.SizeVar) and x.name == name for x in ir.walk(e)):
                        return True
        return False

    @property
    def T(self) -> "_Transposed":
        """The transposed operator: ``A.T(y)``, ``A.T.T is A``."""
        return _Transposed(self)

    def aslinearoperator(self):
        """A ``scipy.sparse.linalg.LinearOperator`` on flattened arrays (needs scipy)."""
        try:
            from scipy.sparse.linalg import LinearOperator as ScipyOperator
        except ImportError as exc:   # scipy is an optional dependency
            raise ImportError("A.aslinearoperator() needs scipy: pip install scipy "
                              "(or polyad[solvers])") from exc
        m, n = self.shape
        i_shape, o_shapes = self.in_shape, self.out_shapes
        dt = self.dtype
        cuts = np.cumsum([math.prod(s) for s in o_shapes])[:-1]

        def matvec(v):
            x = np.ascontiguousarray(np.asarray(v, dtype=dt).reshape(i_shape))
            out = self(x if i_shape else float(x))
            parts = out if isinstance(out, tuple) else (out,)
            return np.concatenate([np.asarray(o, dtype=dt).reshape(-1) for o in parts])

        def rmatvec(v):
            parts = [np.ascontiguousarray(p.reshape(s)) if s else float(p[0])
                     for p, s in zip(np.split(np.asarray(v, dtype=dt), cuts), o_shapes)]
            y = tuple(parts) if len(parts) > 1 else parts[0]
            return np.asarray(self.rmatvec(y)).reshape(-1)

        return ScipyOperator((m, n), matvec=matvec, rmatvec=rmatvec, dtype=dt)

    def __repr__(self):
        return f"<polyad linear operator {self.kernel.ir.name} in {self.wrt}>"


class _Transposed:
    def __init__(self, op: LinearOperator):
        self.op = op

    def __call__(self, y):
        return self.op.rmatvec(y)

    __matmul__ = __call__

    @property
    def T(self) -> LinearOperator:
        return self.op

    @property
    def shape(self):
        m, n = self.op.shape
        return (n, m)

    @property
    def dtype(self):
        return self.op.dtype


def linear_operator(kernel, wrt: str, **bound) -> LinearOperator:
    """A kernel linear in ``wrt`` with its other arguments (and sizes) bound, as an operator:
    ``A(x)``, ``A.T(y)`` (the generated adjoint), ``shape``, ``dtype``,
    ``A.aslinearoperator()`` for scipy. Raises ``pa.NotLinearError`` for a kernel that is
    not linear in ``wrt``::

        A = pa.linear_operator(blur, wrt="x", f=f)
    """
    return LinearOperator(kernel, wrt, **bound)


# --------------------------------------------------------------------------
# objectives
# --------------------------------------------------------------------------


class Objective:
    """A scalar kernel as a function of ``wrt`` with the other arguments bound.

    ``obj(x) -> (value, gradient)`` through ``pa.value_and_grad`` (reverse mode);
    ``obj.hvp(x, v)`` through ``pa.hvp``. For a dict ``wrt`` (``label -> parameter``)
    ``x``, the gradient and ``v`` are dicts keyed by label.
    """

    def __init__(self, kernel, wrt, **bound):
        if not isinstance(kernel, Kernel) or kernel.ir.result is None:
            raise TypeError(f"Objective() takes a @pa.kernel returning a scalar, got {kernel!r}")
        self.kernel = kernel
        self.wrt = wrt
        self.bound = bound
        self.labels = list(wrt) if isinstance(wrt, dict) else None
        self._vg = derivatives.value_and_grad(kernel, wrt)
        self.evaluations = 0

    def _args(self, x) -> dict:
        if self.labels is None:
            return {self.wrt: x}
        return {self.wrt[label]: x[label] for label in self.labels}

    def value(self, x) -> float:
        self.evaluations += 1
        return float(self.kernel(**self._args(x), **self.bound))

    def __call__(self, x):
        self.evaluations += 1
        value, g = self._vg(**self._args(x), **self.bound)
        return float(value), g

    def hvp(self, x, v):
        """``H v`` at ``x`` (``pa.hvp``: forward mode over the reverse-mode gradient)."""
        k = derivatives.hvp(self.kernel, self.wrt)
        dots = ({f"{self.wrt}_dot": v} if self.labels is None else
                {f"{self.wrt[label]}_dot": v[label] for label in self.labels})
        return k(**self._args(x), **dots, **self.bound)


# --------------------------------------------------------------------------
# vector arithmetic on arrays or dicts of arrays
# --------------------------------------------------------------------------


def _lin(a, x, b=None, y=None):
    """``a * x + b * y`` for arrays, floats, or dicts or tuples of them."""
    if isinstance(x, dict):
        return {k: _lin(a, x[k], b, None if y is None else y[k]) for k in x}
    if isinstance(x, tuple):
        return tuple(_lin(a, xk, b, None if y is None else y[k]) for k, xk in enumerate(x))
    out = a * np.asarray(x) if np.ndim(x) else a * x
    if y is not None:
        out = out + b * (np.asarray(y) if np.ndim(y) else y)
    return out


def _dot(x, y) -> float:
    if isinstance(x, dict):
        return sum(_dot(x[k], y[k]) for k in x)
    if isinstance(x, tuple):
        return sum(_dot(a, b) for a, b in zip(x, y))
    return float(np.vdot(np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)))


def _norm(x) -> float:
    return math.sqrt(max(_dot(x, x), 0.0))


def _copy(x):
    if isinstance(x, dict):
        return {k: _copy(v) for k, v in x.items()}
    if isinstance(x, tuple):
        return tuple(_copy(v) for v in x)
    return np.array(x, copy=True) if np.ndim(x) else float(x)


# --------------------------------------------------------------------------
# records and progress
# --------------------------------------------------------------------------


@dataclasses.dataclass
class SolveInfo:
    """What a solver did: ``iterations``, ``converged``, ``history`` (the monitored quantity
    per iteration: relative residual for ``cg``, the cost otherwise), ``message``."""

    method: str
    iterations: int = 0
    converged: bool = False
    history: list = dataclasses.field(default_factory=list)
    message: str = ""
    evaluations: int = 0

    @property
    def residuals(self) -> list:
        """``history`` under the name CG users expect."""
        return self.history


class _Progress:
    """One rewritten terminal line per iteration (only when ``stream`` is a terminal or
    ``show`` is True)."""

    def __init__(self, method: str, show: Optional[bool], stream=None):
        self.stream = stream if stream is not None else sys.stderr
        tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.show = tty if show is None else show
        self.tty = tty
        self.method = method

    def update(self, it: int, what: str, value: float, step: Optional[float] = None):
        if not self.show:
            return
        text = f"{self.method}: iteration {it:5d}  {what} {value:.6e}"
        if step is not None:
            text += f"  step {step:.3e}"
        self.stream.write(("\r" + text) if self.tty else text + "\n")
        self.stream.flush()

    def close(self, info: SolveInfo):
        if self.show:
            self.stream.write(("\n" if self.tty else "") + f"{self.method}: {info.message}\n")
            self.stream.flush()


def _stop(callback, it, x, value) -> bool:
    return bool(callback is not None and callback(it, x, value))


def _record_step(info: "SolveInfo", bar: "_Progress", it: int, x, f: float, step: float,
                 callback) -> bool:
    """Book-keep iteration ``it`` of a line-search method (history, progress line);
    True when it must stop: no decrease found, or the callback asked to."""
    info.iterations = it
    info.history.append(f)
    bar.update(it, "cost", f, step)
    if step == 0.0:
        info.message = "the line search found no decrease"
        return True
    if _stop(callback, it, x, f):
        info.message = "stopped by the callback"
        return True
    return False


# --------------------------------------------------------------------------
# conjugate gradients for regularised least squares
# --------------------------------------------------------------------------


def cg(A, y, lam: float = 0.0, R=None, x0=None, tol: float = 1e-8,
       maxiter: Optional[int] = None, callback: Optional[Callable] = None,
       progress: Optional[bool] = None):
    """Minimise ``||y - A x||^2 + lam ||R x||^2`` by conjugate gradients on the normal
    equations ``(A^T A + lam R^T R) x = A^T y``.

    ``A`` and ``R`` are linear operators (``pa.linear_operator``, or anything with
    ``A(x)`` and ``A.T(y)``). Stops when the normal-equation residual relative to
    ``||A^T y||`` is at most ``tol`` or after ``maxiter`` iterations (default: the
    number of unknowns). ``callback(iteration, x, relative_residual)`` is called after
    every iteration; returning True stops. Returns ``(x, SolveInfo)`` with the
    residual history (``info.residuals``; entry 0 is for ``x0``).
    """
    def normal(v):
        out = A.T(A(v))
        if R is not None and lam:
            out = _lin(1.0, out, lam, R.T(R(v)))
        elif lam:
            out = _lin(1.0, out, lam, v)
        return out

    b = A.T(y)
    x = _lin(0.0, b) if x0 is None else _copy(x0)
    r = _lin(1.0, b, -1.0, normal(x)) if x0 is not None else _copy(b)
    bnorm = _norm(b) or 1.0
    p = _copy(r)
    rr = _dot(r, r)
    maxiter = maxiter if maxiter is not None else max(int(np.size(b)), 1)
    info = SolveInfo("cg", history=[math.sqrt(rr) / bnorm])
    bar = _Progress("cg", progress)
    if info.history[0] <= tol:
        info.converged, info.message = True, "converged at the initial guess"
    for it in range(1, maxiter + 1):
        if info.converged:
            break
        q = normal(p)
        pq = _dot(p, q)
        if pq <= 0:
            info.message = "the normal operator is not positive definite along a direction"
            break
        alpha = rr / pq
        x = _lin(1.0, x, alpha, p)
        r = _lin(1.0, r, -alpha, q)
        rr_new = _dot(r, r)
        rel = math.sqrt(rr_new) / bnorm
        info.iterations = it
        info.history.append(rel)
        bar.update(it, "residual", rel, alpha)
        if rel <= tol:
            info.converged = True
            info.message = f"converged: relative residual {rel:.3e} <= {tol:g} in {it} iterations"
            break
        if _stop(callback, it, x, rel):
            info.message = "stopped by the callback"
            break
        p = _lin(1.0, r, rr_new / rr, p)
        rr = rr_new
    else:
        info.message = f"not converged in {maxiter} iterations (relative residual " \
                       f"{info.history[-1]:.3e})"
    if info.converged and callback is not None and info.iterations:
        callback(info.iterations, x, info.history[-1])
    bar.close(info)
    return x, info


# --------------------------------------------------------------------------
# first- and second-order methods on objectives
# --------------------------------------------------------------------------


def _line_search(fun, x, f0, g0, d, step, shrink=0.5, c1=1e-4, max_tries=40):
    """Backtracking (Armijo) along ``d`` from ``step``: (step, x_new, f_new, g_new)."""
    slope = _dot(g0, d)
    for _ in range(max_tries):
        xn = _lin(1.0, x, step, d)
        fn, gn = fun(xn)
        if np.isfinite(fn) and fn <= f0 + c1 * step * slope:
            return step, xn, fn, gn
        step *= shrink
    return 0.0, x, f0, g0


def gradient_descent(fun, x0, step: float = 1.0, tol: float = 1e-6, maxiter: int = 1000,
                     callback: Optional[Callable] = None, progress: Optional[bool] = None):
    """Steepest descent with a backtracking line search (the step grows by 2x after each
    accepted step and shrinks until the Armijo condition holds).

    ``fun(x) -> (value, gradient)``. Stops when ``||g|| <= tol * ||g0||`` or the line search
    cannot decrease the cost. ``callback(iteration, x, value)``; True stops.
    Returns ``(x, SolveInfo)`` with the cost history.
    """
    x = _copy(x0)
    f, g = fun(x)
    g0 = _norm(g) or 1.0
    info = SolveInfo("gradient descent", history=[f])
    bar = _Progress("gradient descent", progress)
    for it in range(1, maxiter + 1):
        if _norm(g) <= tol * g0:
            info.converged = True
            break
        step, x, f, g = _line_search(fun, x, f, g, _lin(-1.0, g), step)
        if _record_step(info, bar, it, x, f, step, callback):
            break
        step *= 2.0
    if info.converged:
        info.message = f"converged: gradient norm reduced by {tol:g} in {info.iterations} " \
                       f"iterations"
    elif not info.message:
        info.message = f"not converged in {maxiter} iterations"
    bar.close(info)
    return x, info


def nonlinear_cg(fun, x0, tol: float = 1e-6, maxiter: int = 1000,
                 callback: Optional[Callable] = None, progress: Optional[bool] = None):
    """Nonlinear conjugate gradients (Polak-Ribiere+, restarted on a non-descent direction)
    with a backtracking line search. Same conventions as ``gradient_descent``."""
    x = _copy(x0)
    f, g = fun(x)
    g0 = _norm(g) or 1.0
    d = _lin(-1.0, g)
    step = 1.0
    info = SolveInfo("nonlinear cg", history=[f])
    bar = _Progress("nonlinear cg", progress)
    for it in range(1, maxiter + 1):
        if _norm(g) <= tol * g0:
            info.converged = True
            break
        if _dot(g, d) >= 0:
            d = _lin(-1.0, g)
        step, xn, fn, gn = _line_search(fun, x, f, g, d, step)
        info.iterations = it
        if step == 0.0:
            info.message = "the line search found no decrease"
            break
        beta = max(0.0, _dot(gn, _lin(1.0, gn, -1.0, g)) / max(_dot(g, g), 1e-300))
        d = _lin(-1.0, gn, beta, d)
        x, f, g = xn, fn, gn
        info.history.append(f)
        bar.update(it, "cost", f, step)
        if _stop(callback, it, x, f):
            info.message = "stopped by the callback"
            break
        step *= 2.0
    if info.converged:
        info.message = f"converged in {info.iterations} iterations"
    elif not info.message:
        info.message = f"not converged in {maxiter} iterations"
    bar.close(info)
    return x, info


def newton_cg(fun, x0, hvp: Optional[Callable] = None, tol: float = 1e-8, maxiter: int = 100,
              cg_maxiter: int = 50, callback: Optional[Callable] = None,
              progress: Optional[bool] = None):
    """Truncated Newton: each step solves ``H p = -g`` approximately by CG with
    Hessian-vector products (``hvp(x, v)``; default ``fun.hvp`` of an ``Objective``, i.e.
    ``pa.hvp``), stopping CG at negative curvature, then a backtracking line search.
    Same conventions as ``gradient_descent``."""
    hvp = hvp if hvp is not None else getattr(fun, "hvp", None)
    if hvp is None:
        raise TypeError("newton_cg needs Hessian-vector products: pass hvp=, or an Objective")
    x = _copy(x0)
    f, g = fun(x)
    g0 = _norm(g) or 1.0
    info = SolveInfo("newton-cg", history=[f])
    bar = _Progress("newton-cg", progress)
    for it in range(1, maxiter + 1):
        gn = _norm(g)
        if gn <= tol * g0:
            info.converged = True
            break
        # inner CG on H p = -g (Eisenstat-Walker-like forcing term)
        eta = min(0.5, math.sqrt(gn / g0)) * gn
        p = _lin(0.0, g)
        r = _lin(-1.0, g)
        d = _copy(r)
        rr = _dot(r, r)
        for _ in range(cg_maxiter):
            hd = hvp(x, d)
            dhd = _dot(d, hd)
            if dhd <= 0:
                if _dot(p, p) == 0:
                    p = _copy(d)
                break
            a = rr / dhd
            p = _lin(1.0, p, a, d)
            r = _lin(1.0, r, -a, hd)
            rr_new = _dot(r, r)
            if math.sqrt(rr_new) <= eta:
                break
            d = _lin(1.0, r, rr_new / rr, d)
            rr = rr_new
        step, x, f, g = _line_search(fun, x, f, g, p, 1.0)
        if _record_step(info, bar, it, x, f, step, callback):
            break
    if info.converged:
        info.message = f"converged in {info.iterations} Newton iterations"
    elif not info.message:
        info.message = f"not converged in {maxiter} iterations"
    bar.close(info)
    return x, info


def adam(fun, params: dict, lr: float = 1e-3, steps: int = 1000, beta1: float = 0.9,
         beta2: float = 0.999, eps: float = 1e-8, tol: Optional[float] = None,
         callback: Optional[Callable] = None, progress: Optional[bool] = None):
    """Adam over a dict of parameter arrays: ``fun(params) -> (loss, grads)`` with ``grads``
    a dict with the same keys (``Objective`` with a dict ``wrt`` gives that).

    Runs ``steps`` updates, or stops early when the loss falls to ``tol``.
    ``callback(step, params, loss)``; True stops. Returns ``(params, SolveInfo)`` with
    the loss history.
    """
    if not isinstance(params, dict):
        raise TypeError("adam() optimises a dict of parameter arrays: {'w': w, ...}")
    p = _copy(params)
    m = {k: np.zeros_like(np.asarray(v, dtype=np.float64)) for k, v in p.items()}
    v = {k: np.zeros_like(np.asarray(x, dtype=np.float64)) for k, x in p.items()}
    info = SolveInfo("adam")
    bar = _Progress("adam", progress)
    for t in range(1, steps + 1):
        loss, g = fun(p)
        info.history.append(loss)
        if tol is not None and loss <= tol:
            info.converged = True
            info.message = f"loss {loss:.3e} <= {tol:g} after {t - 1} steps"
            break
        for k in p:
            gk = np.asarray(g[k], dtype=np.float64)
            m[k] = beta1 * m[k] + (1 - beta1) * gk
            v[k] = beta2 * v[k] + (1 - beta2) * gk * gk
            mh = m[k] / (1 - beta1 ** t)
            vh = v[k] / (1 - beta2 ** t)
            upd = lr * mh / (np.sqrt(vh) + eps)
            p[k] = (np.asarray(p[k]) - upd).astype(np.asarray(params[k]).dtype) \
                if np.ndim(p[k]) else float(p[k] - upd)
        info.iterations = t
        bar.update(t, "loss", loss, lr)
        if _stop(callback, t, p, loss):
            info.message = "stopped by the callback"
            break
    if not info.message:
        info.message = f"{info.iterations} steps, loss {info.history[-1]:.3e}"
    bar.close(info)
    return p, info
