"""Derivatives of ``@pa.func`` device functions.

For a device function ``f(p1, ..., pn)`` and one of its float parameters
``pk``, ``partial_func(f, "pk")`` returns a new device function named
``f_d_pk`` with the same parameters that returns ``d f / d pk`` at the
point. It is obtained by forward (tangent) differentiation of ``f``'s body
with the tangent of ``pk`` set to 1: every local ``v`` gets a tangent local
``v_t``, assigned right before ``v``; branches are kept (the derivative
follows the taken branch); calls of other device functions use *their*
partial functions, derived in turn. A kernel statement ``y = f(a, b)``
differentiates as ``d_a += d_y * f_d_p1(a, b)`` etc.

Each partial function is derived once and cached (keyed by the FuncDef and
the parameter). A user rule registered with ``pa.derivative(f, wrt=...)``
(``rules.FUNC_RULES``) replaces the derived body; the user's function is
renamed ``f_d_pk`` in derived kernels.

Partial functions are ordinary device functions: they can be differentiated
again (``f_d_x_d_x`` is the second derivative).
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Optional

from ..ir import Call, Expr, FAssign, FIf, FReturn, FuncDef, ScalarRef
from .exprs import cast, fconst
from .rules import FUNC_RULES
from .rules import tangent as rules_tangent

_CACHE: dict = {}


def partial_name(fname: str, param: str) -> str:
    return f"{fname}_d_{param}"


class FuncLibrary:
    """The device functions visible to a kernel, plus the partial functions derived so far."""

    def __init__(self, funcs):
        self.funcs: dict[str, FuncDef] = {f.name: f for f in funcs}
        self.order: list[str] = [f.name for f in funcs]

    def get(self, name: str) -> Optional[FuncDef]:
        return self.funcs.get(name)

    def add(self, f: FuncDef):
        if f.name in self.funcs:
            if self.funcs[f.name] != f:
                raise ValueError(f"two different device functions named {f.name!r}")
            return
        self.funcs[f.name] = f
        self.order.append(f.name)

    def partial_call(self, call: Call, k: int, collect: Optional[list] = None) -> Optional[Expr]:
        """``d f(args) / d args[k]`` as an expression (a call of the partial function)."""
        f = self.funcs[call.func]
        pname, pdt = f.params[k]
        if not pdt.is_float or not f.result.is_float:
            return None
        d = self.partial(f, pname, collect)
        return Call(d.name, call.args, d.result)

    def partial(self, f: FuncDef, pname: str, collect: Optional[list] = None) -> FuncDef:
        """The partial function ``f_d_<pname>`` (derived once, cached), added to the library."""
        custom = FUNC_RULES.get(f, {}).get(pname)
        key = (f, pname, custom)
        hit = _CACHE.get(key)
        if hit is None:
            if custom is not None:
                d, deps = custom
                hit = (dataclasses.replace(d, name=partial_name(f.name, pname)), tuple(deps))
            else:
                deps: list = []
                hit = (_derive(f, pname, self, deps), tuple(deps))
            _CACHE[key] = hit
        d, deps = hit
        for dep in deps:
            self.add(dep)
        self.add(d)
        if collect is not None:
            collect.extend(deps)
            collect.append(d)
        return d


def clear_cache():
    """Forget derived partial functions (after a user rule changed)."""
    _CACHE.clear()


def _derive(f: FuncDef, pname: str, lib: FuncLibrary, deps: list) -> FuncDef:
    names = {p for p, _ in f.params} | {n for n, _ in f.locals} | set(lib.funcs)
    dtypes = dict(f.params) | dict(f.locals)
    tan_names: dict[str, str] = {}
    new_locals = list(f.locals)

    def tname(v):
        if v not in tan_names:
            base = f"{v}_t"
            n, k = base, 1
            while n in names:
                n, k = f"{base}{k}", k + 1
            names.add(n)
            tan_names[v] = n
            new_locals.append((n, dtypes[v]))
        return tan_names[v]

    def leaf_tangent(x: Expr) -> Optional[Expr]:
        if isinstance(x, ScalarRef):
            if x.name == pname:
                return fconst(1, x.dtype)
            if x.name in tan_names:
                return ScalarRef(tan_names[x.name], x.dtype)
        return None

    # the library, recording in ``deps`` the partial functions the new body calls
    collecting = SimpleNamespace(get=lib.get,
                                 partial_call=lambda call, k: lib.partial_call(call, k, deps))

    def tangent(e: Expr) -> Optional[Expr]:
        return rules_tangent(e, leaf_tangent, collecting)

    def body(stmts) -> tuple:
        out = []
        for st in stmts:
            if isinstance(st, FAssign):
                if dtypes[st.name].is_float:
                    t = tangent(st.expr)
                    tn = tname(st.name)
                    out.append(FAssign(tn, cast(t, dtypes[st.name]) if t is not None
                                       else fconst(0, dtypes[st.name]), st.line))
                out.append(st)
            elif isinstance(st, FIf):
                out.append(FIf(st.cond, body(st.then), body(st.orelse), st.line))
            elif isinstance(st, FReturn):
                t = tangent(st.expr)
                out.append(FReturn(cast(t, f.result) if t is not None else fconst(0, f.result),
                                   st.line))
            else:
                raise TypeError(f"unknown device function statement {st!r}")
        return tuple(out)

    # locals first assigned in branches need their tangent names before use
    for n, dt in f.locals:
        if dt.is_float:
            tname(n)
    new_body = body(f.body)
    return FuncDef(partial_name(f.name, pname), f.params, f.result, tuple(new_locals),
                   new_body, f.filename, f.line)
