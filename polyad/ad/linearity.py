"""Is a kernel linear (or affine) in some of its parameters? A conservative symbolic check.

Every value is classified in the lattice

    ZERO  <  CONST, LINEAR  <  AFFINE  <  NONLINEAR

relative to the ``wrt`` parameters ``x``: ZERO is the literal 0; CONST does
not depend on ``x`` at all (through any data flow: values, indices, loop
bounds, guards); LINEAR is a linear function of ``x`` whose coefficients are
CONST; AFFINE is LINEAR plus CONST. Expressions combine classes by the usual
rules (``CONST * LINEAR = LINEAR``, ``LINEAR * LINEAR = NONLINEAR``,
``CONST + LINEAR = AFFINE``, an intrinsic of a non-CONST argument is
NONLINEAR, a select on a non-CONST condition is NONLINEAR, ...), device
functions by interpreting their bodies over classes.

Variables (arrays and scalars, by name) are classified by a fixpoint over the
statements (loops make data flow cyclic), flow-insensitively: a variable's
class joins the classes of everything ever written to it, starting from its
initial value (``wrt`` parameters LINEAR, other inputs CONST, ``pa.Out``
arrays, ``pa.zeros`` temporaries and locals ZERO). A write whose index,
guard or loop bounds are not CONST makes its target NONLINEAR.

The kernel is linear when every output (``pa.Out`` and in-out arrays, the
returned scalar) is ZERO or LINEAR, affine when every output is at most
AFFINE. The check is conservative: it may answer "no" for a kernel that is
linear (for example when a variable holds an affine value and later a linear
one), never "yes" for one that is not.
"""

from __future__ import annotations

from typing import Optional

from .. import ir
from ..errors import NotLinearError
from ..ir import (Binary, Call, Cast, Const, FAssign, FIf, FReturn, Load, LoopVar, ScalarRef,
                  Select, SizeVar, Unary)
from .reverse import check_wrt

ZERO, CONST, LINEAR, AFFINE, NONLINEAR = range(5)
CLASS_NAMES = {ZERO: "zero", CONST: "constant", LINEAR: "linear", AFFINE: "affine",
               NONLINEAR: "nonlinear"}

__all__ = ["classify", "is_linear", "is_affine", "check_linear", "Linearity"]


def join(a: int, b: int) -> int:
    """The class of a value that may be either ``a`` or ``b`` (also of ``a + b``)."""
    if a == ZERO:
        return b
    if b == ZERO:
        return a
    if {a, b} == {CONST, LINEAR}:
        return AFFINE
    return max(a, b)


def _mul(a: int, b: int) -> int:
    if ZERO in (a, b):
        return ZERO
    if a == CONST:
        return b
    if b == CONST:
        return a
    return NONLINEAR


def _div(a: int, b: int) -> int:
    if a == ZERO:
        return ZERO
    if b <= CONST:
        return a
    return NONLINEAR


def _linear(c: int) -> bool:
    """ZERO or LINEAR (CONST is not linear: ``k(2 x) != 2 k(x)``)."""
    return c in (ZERO, LINEAR)


def _opaque(*classes: int) -> int:
    """A function of its arguments that is nonlinear in general (``exp``, ``<``, ``//`` ...)."""
    return CONST if all(c <= CONST for c in classes) else NONLINEAR


class Linearity:
    """The classes of every variable of a kernel relative to ``wrt`` (see the module doc)."""

    def __init__(self, k: ir.Kernel, wrt):
        self.k = k
        self.wrt = check_wrt(k, wrt)
        self.funcs = {f.name: f for f in k.funcs}
        cls: dict[str, int] = {}
        for p in k.params:
            if p.name in self.wrt:
                cls[p.name] = LINEAR
            elif p.intent == "out":
                cls[p.name] = ZERO
            else:
                cls[p.name] = CONST
        for t in k.temps:
            cls[t.name] = ZERO
        for n, _ in k.locals:
            cls.setdefault(n, ZERO)
        self.cls = cls
        # name -> the statement that first made it more than linear (for messages)
        self.origin: dict[str, ir.Statement] = {}
        changed = True
        while changed:
            changed = False
            for st in k.statements:
                t = st.target_name
                new = join(cls[t], self.written(st))
                if new != cls[t]:
                    if not _linear(new) and _linear(cls[t]):
                        self.origin[t] = self._blame(st, t)
                    cls[t] = new
                    changed = True

    # -- expressions ----------------------------------------------------------------
    def expr(self, e: ir.Expr, env: Optional[dict] = None) -> int:
        """The class of ``e`` (``env``: classes of a device function's parameters/locals)."""
        if isinstance(e, Const):
            return ZERO if e.value == 0 else CONST
        if isinstance(e, (SizeVar, LoopVar)):
            return CONST
        if isinstance(e, ScalarRef):
            if env is not None:
                return env.get(e.name, ZERO)
            return self.cls.get(e.name, CONST)
        if isinstance(e, Load):
            if any(self.expr(i, env) > CONST for i in e.index):
                return NONLINEAR
            return self.cls.get(e.array, CONST)
        if isinstance(e, Unary):
            a = self.expr(e.a, env)
            return a if e.op == "neg" else _opaque(a)
        if isinstance(e, Cast):
            a = self.expr(e.a, env)
            return a if e.dtype.is_float and e.a.dtype.is_float else _opaque(a)
        if isinstance(e, Select):
            if self.expr(e.cond, env) > CONST:
                return NONLINEAR
            return join(self.expr(e.a, env), self.expr(e.b, env))
        if isinstance(e, Binary):
            a, b = self.expr(e.a, env), self.expr(e.b, env)
            if not e.dtype.is_float:
                return _opaque(a, b)
            if e.op in ("+", "-"):
                return join(a, b)
            if e.op == "*":
                return _mul(a, b)
            if e.op == "/":
                return _div(a, b)
            if e.op == "**" and isinstance(e.b, Const) and e.b.value == 1:
                return a
            return _opaque(a, b)
        if isinstance(e, Call):
            args = [self.expr(x, env) for x in e.args]
            f = self.funcs.get(e.func)
            if f is not None and not all(c <= CONST for c in args):
                return self.device_function(f, args)
            return _opaque(*args)
        return NONLINEAR

    def device_function(self, f: ir.FuncDef, args: list[int]) -> int:
        """The class of ``f``'s result for arguments of classes ``args``."""
        env = {p: c for (p, _), c in zip(f.params, args)}
        out = ZERO

        def block(stmts) -> int:
            nonlocal out
            for s in stmts:
                if isinstance(s, FAssign):
                    env[s.name] = join(env.get(s.name, ZERO), self.expr(s.expr, env))
                elif isinstance(s, FIf):
                    if self.expr(s.cond, env) > CONST:
                        return NONLINEAR
                    if block(s.then) == NONLINEAR or block(s.orelse) == NONLINEAR:
                        return NONLINEAR
                elif isinstance(s, FReturn):
                    out = join(out, self.expr(s.expr, env))
            return out

        # two passes: a local assigned in one branch and read after the other stays joined
        block(f.body)
        return block(f.body)

    # -- statements -------------------------------------------------------------------
    def control(self, st: ir.Statement) -> int:
        """CONST when the statement's instances and target element do not depend on x."""
        exprs = [c.expr for c in st.conditions]
        exprs += [b for lp in st.loops for b in (lp.lo, lp.hi)]
        if st.guard is not None:
            exprs.append(st.guard)
        if isinstance(st.target, Load):
            exprs += list(st.target.index)
        return _opaque(*(self.expr(e) for e in exprs))

    def written(self, st: ir.Statement) -> int:
        """The class of the value statement ``st`` leaves in its target."""
        if self.control(st) > CONST:
            return NONLINEAR
        v = self.expr(st.expr)
        t = self.cls[st.target_name]
        if st.op in ("+=", "-="):
            return join(t, v)
        if st.op == "*=":
            return _mul(t, v)
        if st.op == "/=":
            return _div(t, v)
        return v

    def _blame(self, st: ir.Statement, target: str) -> ir.Statement:
        """The statement to blame for ``target`` becoming more than linear at ``st``: the
        origin of a more-than-linear variable ``st`` reads, else ``st`` itself."""
        for name in sorted(st.read_names() - {target}):
            if self.cls.get(name, CONST) > LINEAR and name in self.origin:
                return self.origin[name]
        return st

    # -- the kernel ---------------------------------------------------------------------
    def outputs(self) -> dict[str, int]:
        """Class of every output: ``pa.Out``/in-out arrays, and the returned scalar."""
        out = {p.name: self.cls[p.name] for p in self.k.params if p.intent in ("out", "inout")}
        if self.k.result is not None:
            out[self.k.result[0]] = self.cls[self.k.result[0]]
        return out

    def kernel_class(self) -> int:
        c = ZERO
        for v in self.outputs().values():
            c = join(c, v)
        return c

    def error(self) -> NotLinearError:
        """The NotLinearError for the first output that is not linear."""
        k = self.k
        wrt = ", ".join(self.wrt)
        for name, c in self.outputs().items():
            if _linear(c):
                continue
            what = "the returned value" if k.result is not None and name == k.result[0] \
                else f"output {name!r}"
            st = self.origin.get(name)
            if st is None:
                return NotLinearError(f"{k.name}() is not linear in {wrt}: {what} is "
                                      f"{CLASS_NAMES[c]} in {wrt}", k.filename or "<kernel>",
                                      k.line, 0, "pa.adjoint needs a kernel linear in wrt")
            own = self.written(st)
            why = ("adds a term that does not depend on " + wrt if own in (CONST, AFFINE)
                   else "is not linear in " + wrt)
            return NotLinearError(
                f"{k.name}() is not linear in {wrt}: {what} is {CLASS_NAMES[c]}; the statement "
                f"`{st.source.strip() or st.name}` {why}", k.filename or "<kernel>", st.line, 0,
                "pa.adjoint and pa.linear_operator need a kernel linear in wrt (no constant "
                "terms, no products or functions of wrt, no conditions or indices depending on it)")
        raise ValueError(f"{k.name}() is linear in {wrt}")


def classify(k: ir.Kernel, wrt) -> int:
    """The class (ZERO, CONST, LINEAR, AFFINE, NONLINEAR) of ``k``'s outputs in ``wrt``."""
    return Linearity(k, wrt).kernel_class()


def is_linear(k: ir.Kernel, wrt) -> bool:
    """Conservative: True only when every output of ``k`` is linear in ``wrt``."""
    return _linear(classify(k, wrt))


def is_affine(k: ir.Kernel, wrt) -> bool:
    """Conservative: True only when every output of ``k`` is affine in ``wrt``."""
    return classify(k, wrt) <= AFFINE


def check_linear(k: ir.Kernel, wrt) -> None:
    """Raise NotLinearError, naming the offending statement and its line, unless ``k`` is
    linear in ``wrt``."""
    lin = Linearity(k, wrt)
    if not _linear(lin.kernel_class()):
        raise lin.error()


def adjoint_kernel(k: ir.Kernel, wrt) -> ir.Kernel:
    """The transpose of a kernel linear in ``wrt``, as a kernel.

    Parameters: ``k``'s inputs other than ``wrt`` (the linear map's coefficients),
    then a cotangent ``<out>_bar`` per output array (``result_bar`` for a returned
    scalar), then the ``pa.Out`` parameters ``d_<w>``: ``d_w = A^T out_bar``. It is the
    vjp kernel (scheduled like any adjoint: scatter-to-gather, no atomics for
    stencils) without the ``wrt`` inputs, which a linear map's transpose never reads.
    Raises NotLinearError unless ``k`` is linear in ``wrt``.
    """
    import dataclasses

    from .reverse import vjp_kernel
    names = check_wrt(k, wrt)
    check_linear(k, wrt)
    v = vjp_kernel(k, wrt)
    readers = [st for st in v.statements if any(st.accesses(n) for n in names)]
    if readers:
        st = readers[0]
        raise NotLinearError(f"the transpose of {k.name}() would read {', '.join(names)} "
                             f"(statement `{st.source}`)", k.filename or "<kernel>",
                             st.line, 0, "pa.adjoint needs a kernel linear in wrt")
    return dataclasses.replace(v, name=f"{k.name}_adjoint_{'_'.join(names)}",
                               params=tuple(p for p in v.params if p.name not in names))
