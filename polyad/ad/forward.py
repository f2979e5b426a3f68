"""Forward-mode AD of kernels: IR in, IR out (DESIGN §4, "Forward mode").

Every primal statement ``T op= e`` whose target is *active* (it depends on a
``wrt`` parameter and influences an output) gets a tangent statement right
before it, in the same loop nest, with the same affine conditions and guard:

* ``T = e``            ->  ``T_dot = de``
* ``T += e`` (``-=``)  ->  ``T_dot += de``
* ``T *= e`` (``/=``)  ->  ``T_dot = d(T * e)`` (reads ``T`` before the update)

where ``de`` is the tangent of ``e`` built by ``rules.tangent`` from the same
partial-derivative table reverse mode uses. The tangent statement reads the
same primal values as its primal statement (it runs just before it), so no
tape is needed; it has the primal statement's domain and dependences, so the
scheduler gives it the same parallel loops (a tangent writes ``T_dot`` exactly
where the primal writes ``T``: no atomics).

Entry points:

``jvp_kernel(k, wrt)``
    Parameters: ``k``'s non-output parameters (same intents), then a tangent
    ``<w>_dot`` per ``wrt`` parameter (same type, boundary mode included; a
    scalar for a scalar), then ``k``'s ``pa.Out`` parameters, then the tangent
    outputs: ``<o>_dot`` for every float ``pa.Out`` array ``o``, ``<x>_dot``
    (a ``pa.Out``) for every in-out array ``x`` not in ``wrt`` that depends on
    ``wrt``, and ``result_dot`` (shape ``[1]``) when ``k`` returns a scalar.
    The kernel returns ``k``'s scalar, if any. An in-out array ``x`` in ``wrt``
    keeps the primal's in-place convention: ``x_dot`` is in-out too (the
    tangent of ``x``'s value on entry, then on exit).

``forward_grad_kernel(k, wrt)``
    The gradient of ``k``'s scalar with respect to *scalar* parameters, by one
    tangent sweep per parameter (all in one kernel): the same parameters and
    outputs as ``reverse.grad_kernel`` (``d_<w>`` of shape ``[1]``).

``hvp_kernel(k, wrt)``
    Hessian-vector products: ``jvp_kernel`` applied to ``reverse.grad_kernel``'s
    output, the gradient arrays turned into temporaries.
"""

from __future__ import annotations

import dataclasses
import warnings

from .. import ir
from ..ir import Load, LoopVar, ScalarRef, Statement
from ..looptree import Item, build_tree, flatten, item_of, tree_items
from . import exprs as X
from .activity import analyze, target_name
from .funcs import FuncLibrary
from .reverse import (Names, NoGradientPathWarning, _err, _full_loops, _nest, _user_stacklevel,
                      check_wrt, kernel_names, rename_statement)
from .rules import tangent

__all__ = ["jvp_kernel", "forward_grad_kernel", "hvp_kernel"]


class _Forward:
    def __init__(self, k: ir.Kernel, wrt, mode: str):
        self.k = k
        self.mode = mode
        self.wrt = check_wrt(k, wrt)
        if mode == "grad":
            if k.result is None:
                raise _err(k, f"{k.name}() returns no scalar: pa.grad needs a scalar-valued "
                              f"kernel", "use pa.jvp(kernel, wrt) for the tangents of its outputs")
            arrays = [w for w in self.wrt if k.param(w).is_array]
            if arrays:
                raise _err(k, f"forward-mode gradients are computed per scalar parameter; "
                              f"{', '.join(arrays)} is an array",
                           "use mode='reverse' (the default for arrays) for array parameters, "
                           "or pa.jvp for directional derivatives")

    # -- names and primal statements ----------------------------------------------
    def prepare(self):
        k = self.k
        params = {p.name: p for p in k.params}
        if self.mode == "jvp":
            reserved = [f"{w}_dot" for w in self.wrt]
            reserved += [f"{p.name}_dot" for p in k.params
                         if p.intent in ("out", "inout") and p.name not in self.wrt]
            if k.result is not None:
                reserved.append("result_dot")
        else:
            reserved = [f"d_{w}" for w in self.wrt]
        self.names = Names(kernel_names(k))
        # a new parameter whose name a parameter already has (the jvp of a jvp) gets a fresh one
        self.param_name = {r: (self.names.fresh(r) if r in params else r) for r in reserved}
        for r in self.param_name.values():
            self.names.take(r)
        mapping = {}
        internal = {n for n, _ in k.locals} | {t.name for t in k.temps}
        for st in k.statements:
            internal |= {lp.var for lp in st.loops}
        for r in self.param_name.values():
            if r in internal:
                mapping[r] = self.names.fresh(r)
        self.temps: list[ir.Temp] = [ir.Temp(mapping.get(t.name, t.name), t.type, t.zero,
                                             "tape" if t.role == "tape" else "user", t.holds)
                                     for t in k.temps]
        self.locals = {mapping.get(n, n): dt for n, dt in k.locals}
        copies = []
        if self.mode == "grad":
            # a gradient kernel leaves its inputs alone and returns only d_<w>: in-out arrays
            # are worked on in a copy, pa.Out arrays become temporaries
            idx = [self.names.fresh(f"i{d}") for d in range(_max_ndim(k))]
            for p in k.params:
                if p.intent == "out":
                    self.temps.append(ir.Temp(p.name, p.type, True))
                elif p.intent == "inout":
                    work = mapping[p.name] = self.names.fresh(f"{p.name}_work")
                    self.temps.append(ir.Temp(work, p.type, False, copy_of=p.name))
                    vs = idx[:p.type.ndim]
                    ix = tuple(LoopVar(v) for v in vs)
                    copies.append(Statement(
                        "copy", _full_loops(p.type.shape, vs), (len(copies),) + (0,) * p.type.ndim,
                        (), None, Load(work, ix, p.type.dtype), "=", Load(p.name, ix, p.type.dtype),
                        k.line, f"copy of in-out array {p.name}"))
        shift = len(copies)
        stmts = [rename_statement(st, mapping) for st in k.statements]
        stmts = [ir.Statement(st.name, st.loops, (st.position[0] + shift,) + st.position[1:],
                              st.conditions, st.guard, st.target, st.op, st.expr, st.line,
                              st.source) for st in stmts]
        self.stmts = copies + stmts
        self.root, self.leaves = build_tree(self.stmts)
        self.arrays = {t.name: t.type for t in self.temps}
        for p in k.params:
            if p.is_array and p.name not in self.arrays:
                self.arrays[mapping.get(p.name, p.name)] = p.type
        self.result = None if k.result is None else (mapping.get(k.result[0], k.result[0]),
                                                     k.result[1])
        self.funcs = FuncLibrary(k.funcs)

    # -- one direction of tangents ------------------------------------------------
    def direction(self, wrt: list[str], suffix: str, seeds: dict, roots: set) -> dict:
        """Tangent variables of one sweep: active name -> tangent name (``seeds``: the
        wrt names whose tangent is a parameter or a constant, name -> expression maker)."""
        act = analyze(self.stmts, wrt, roots, self.funcs.funcs)
        for w in wrt:
            if not act.is_active(w):
                what = "any output" if self.mode == "jvp" else "the returned value"
                warnings.warn(f"{self.k.name}(): {w!r} has no influence on {what}; its "
                              f"derivative is zero", NoGradientPathWarning,
                              stacklevel=_user_stacklevel())
        tan = {}
        for name in sorted(act.active):
            if name in seeds:
                continue
            if name in self.out_tangents:
                tan[name] = self.out_tangents[name]
                continue
            tname = self.names.fresh(f"{name}_dot{suffix}")
            tan[name] = tname
            if name in self.arrays:
                t = next((t for t in self.temps if t.name == name), None)
                taped = t is not None and t.role == "tape"
                self.tan_temps.append(ir.Temp(tname, self.arrays[name],
                                              True if t is None else t.zero,
                                              "tape" if taped else "user",
                                              f"the tangent of {name}" if taped else ""))
            else:
                self.tan_locals[tname] = self.locals[name]
        return tan

    def tangent_items(self, st: Statement, tan: dict, seeds: dict) -> list[Item]:
        T = st.target
        tname = target_name(st)
        if not T.dtype.is_float or tname not in tan:
            return []

        def leaf(x):
            name = x.array if isinstance(x, Load) else x.name
            if name in seeds:
                return seeds[name](x)
            if name not in tan:
                return None
            if isinstance(x, Load):
                return Load(tan[name], x.index, x.dtype)
            return ScalarRef(tan[name], x.dtype)

        Tt = leaf(T)
        op, e = st.op, st.expr
        if op in ("*=", "/="):
            op, e = "=", ir.Binary(op[0], T, e, T.dtype)
        de = tangent(e, leaf, self.funcs)
        src = f"tangent of: {st.source}"
        if op in ("+=", "-="):
            if de is None:
                return []
            return [Item(Tt, op, X.cast(de, T.dtype), st.conditions, st.guard, st.line, src)]
        value = X.fconst(0, T.dtype) if de is None else X.cast(de, T.dtype)
        return [Item(Tt, "=", value, st.conditions, st.guard, st.line, src)]

    # -- build ----------------------------------------------------------------------
    def build(self) -> ir.Kernel:
        self.prepare()
        k = self.k
        self.tan_temps: list[ir.Temp] = []
        self.tan_locals: dict[str, ir.DType] = {}
        line = k.line
        head: list = []
        tail: list = []
        out_params: list[ir.Param] = []
        idx = [self.names.fresh(f"i{d}") for d in range(_max_ndim(k))]
        pn = self.param_name

        def zero_array(p: ir.Param):
            vs = idx[:p.type.ndim]
            body = Item(Load(p.name, tuple(LoopVar(v) for v in vs), p.type.dtype), "=",
                        X.fconst(0, p.type.dtype), line=line, source=f"zero {p.name}")
            return _nest(_full_loops(p.type.shape, vs), body)

        if self.mode == "jvp":
            roots = {p.name for p in k.params if p.intent in ("out", "inout")}
            if self.result is not None:
                roots.add(self.result[0])
            # the tangents of wrt and of the outputs are parameters
            self.out_tangents = {}
            tan_in = []
            for w in self.wrt:
                p = k.param(w)
                self.out_tangents[w] = pn[f"{w}_dot"]
                tan_in.append(ir.Param(pn[f"{w}_dot"], p.type, "inout" if p.intent == "inout"
                                       else "in"))
            for p in k.params:
                if p.intent in ("out", "inout") and p.name not in self.wrt \
                        and p.type.dtype.is_float:
                    self.out_tangents[p.name] = pn[f"{p.name}_dot"]
            tan = self.direction(self.wrt, "", {}, roots)
            for p in k.params:
                if p.name not in self.out_tangents or p.name in self.wrt:
                    continue
                if p.intent == "out" or p.name in tan:
                    op = ir.Param(pn[f"{p.name}_dot"], p.type, "out")
                    out_params.append(op)
                    if p.name not in tan or p.intent == "inout":
                        head.append(zero_array(op))   # a zero tangent, or 0 on entry
            if self.result is not None:
                rname, rdt = self.result
                rdot = ir.Param(pn["result_dot"], ir.ArrayType(rdt, (X.ic(1),)), "out")
                out_params.append(rdot)
                value = ScalarRef(tan[rname], rdt) if rname in tan else X.fconst(0, rdt)
                tail.append(Item(Load(rdot.name, (X.ic(0),), rdt), "=", value, line=line,
                                 source="tangent of the returned value"))
            sweeps = [(tan, {})]
            params = ([p for p in k.params if p.intent != "out"] + tan_in
                      + [p for p in k.params if p.intent == "out"] + out_params)
            result = self.result
        else:
            roots = {self.result[0]}
            self.out_tangents = {}
            sweeps = []
            rname, rdt = self.result
            for w in self.wrt:
                dt = k.param(w).type
                suffix = "" if len(self.wrt) == 1 else f"_{w}"
                seeds = {w: lambda x, dt=dt: X.fconst(1, dt)}
                tan = self.direction([w], suffix, seeds, roots)
                sweeps.append((tan, seeds))
                op = ir.Param(pn[f"d_{w}"], ir.ArrayType(dt, (X.ic(1),)), "out")
                out_params.append(op)
                value = ScalarRef(tan[rname], rdt) if rname in tan else X.fconst(0, rdt)
                tail.append(Item(Load(op.name, (X.ic(0),), dt), "=", X.cast(value, dt),
                                 line=line, source=f"gradient with respect to {w}"))
            params = [ir.Param(p.name, p.type, "in") for p in k.params if p.intent != "out"]
            params += out_params
            result = None

        def leaf_items(lf):
            out = []
            for tan, seeds in sweeps:
                out += self.tangent_items(lf.stmt, tan, seeds)
            return out + [item_of(lf.stmt)]

        items = head + tree_items(self.root, leaf_fn=leaf_items) + tail
        stmts = flatten(items)
        all_locals = dict(self.locals)
        all_locals.update(self.tan_locals)
        suffix = "jvp" if self.mode == "jvp" else "grad_forward"
        return ir.Kernel(name=f"{k.name}_{suffix}_{'_'.join(self.wrt)}", params=tuple(params),
                         sizes=k.sizes, locals=tuple(all_locals.items()),
                         temps=tuple(self.temps + self.tan_temps), statements=tuple(stmts),
                         result=result,
                         funcs=tuple(self.funcs.funcs[n] for n in self.funcs.order),
                         filename=k.filename, line=k.line, int_params=k.int_params)


def _max_ndim(k: ir.Kernel) -> int:
    return max([p.type.ndim for p in k.params if p.is_array] + [1])


def jvp_kernel(k: ir.Kernel, wrt) -> ir.Kernel:
    """The pushforward of ``k``: inputs and tangents ``<w>_dot`` -> outputs and their tangents."""
    return _Forward(k, wrt, "jvp").build()


def forward_grad_kernel(k: ir.Kernel, wrt) -> ir.Kernel:
    """The gradient of ``k``'s scalar with respect to scalar parameters, by forward mode."""
    return _Forward(k, wrt, "grad").build()


def hvp_kernel(k: ir.Kernel, wrt) -> ir.Kernel:
    """Hessian-vector products of ``k``'s scalar: forward mode over the reverse-mode gradient
    kernel (AD of AD output). Parameters: ``k``'s inputs, then ``<w>_dot`` (the vector
    ``v``, one per ``wrt`` parameter), then the ``pa.Out`` results ``d_<w>_dot = H v``
    (shape ``[1]`` for a scalar parameter)."""
    from .reverse import grad_kernel
    names = check_wrt(k, wrt)
    g = grad_kernel(k, wrt)
    with warnings.catch_warnings():
        # a gradient that does not depend on wrt is fine here: the Hessian is zero
        warnings.simplefilter("ignore", NoGradientPathWarning)
        j = jvp_kernel(g, wrt)
    grads = {f"d_{w}" for w in names}
    # the gradient itself is not returned: its arrays become temporaries
    return dataclasses.replace(
        j, name=f"{k.name}_hvp_{'_'.join(names)}",
        params=tuple(p for p in j.params if p.name not in grads),
        temps=j.temps + tuple(ir.Temp(p.name, p.type, True) for p in j.params
                              if p.name in grads))
