"""Reverse-mode AD of kernels: IR in, IR out (see ``polyad.ad`` for the conventions).

Statement-level reverse mode (DESIGN §4). For a primal statement
``T op= e(R1, R2, ...)`` with active target ``T``:

* ``T += e``             ->  ``dRk += dT * de/dRk``       (``-=``: ``e -> -e``)
* ``T = e`` (no self-read) ->  ``dRk += dT * de/dRk; dT = 0``  (the zeroing is
  skipped for arrays written once per element: nobody reads ``dT`` again)
* self-updates ``T = f(T, R...)`` (also ``*=``, ``/=``, and ``+=`` whose
  right side reads ``T``) go through a temporary:
  ``t = dT; dRk += t * df/dRk; dT = t * df/dT`` for a scalar, and
  ``t = dT; dT = 0; dRk += t * df/dRk`` (``T``'s own reads included) for an
  array element (a read of the same array may alias ``T`` through a boundary
  mode).

Adjoint statements keep the primal statement's affine conditions and guard
(evaluated on primal values: the derivative follows the taken branch) and run
in reverse program order: every loop of the primal appears reversed (negative
step) in the reverse sweep, positions reversed. Primal values are obtained as
described in ``polyad.ad.tape``.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Optional, Union

from .. import ir
from ..errors import NotDifferentiableError
from ..ir import Binary, Expr, Load, Loop, LoopVar, ScalarRef, Statement
from ..looptree import Item, Leaf, LoopItem, Node, build_tree, filter_items, flatten, item_of, \
    tree_items, walk_items
from ..poly import ISL_FAILURES
from . import exprs as X
from .activity import all_reads, analyze, diff_reads, target_name
from .funcs import FuncLibrary
from .rules import partials
from .recorded import RecordedSets, analysable_error_types
from .tape import Resolver, injective_index, plainly_in_bounds


class NoGradientPathWarning(UserWarning):
    """A ``wrt`` parameter does not influence the differentiated outputs (its gradient is 0)."""


# --------------------------------------------------------------------------
# names
# --------------------------------------------------------------------------


class Names:
    """Fresh-name allocator over every name a kernel uses."""

    def __init__(self, used=()):
        self.used = set(used)

    def fresh(self, base: str) -> str:
        """``base``, or ``base_1``, ``base_2``, ... if used; used from now on."""
        name = ir.fresh_name(base, self.used, separator="_")
        self.used.add(name)
        return name

    def take(self, name: str) -> None:
        """Reserve ``name`` (a name forward mode keeps as it is)."""
        self.used.add(name)


def kernel_names(k: ir.Kernel) -> set[str]:
    used = {p.name for p in k.params} | {n for n, _ in k.locals} | {t.name for t in k.temps}
    used |= set(k.sizes) | {f.name for f in k.funcs} | {k.name}
    for st in k.statements:
        used |= {lp.var for lp in st.loops}
    return used


def rename_expr(e: Expr, mapping: dict) -> Expr:
    if not mapping:
        return e

    def fn(x):
        if isinstance(x, ScalarRef) and x.name in mapping:
            return ScalarRef(mapping[x.name], x.dtype)
        if isinstance(x, LoopVar) and x.name in mapping:
            return LoopVar(mapping[x.name], x.dtype)
        if isinstance(x, Load) and x.array in mapping:
            return Load(mapping[x.array], x.index, x.dtype)
        return None

    return ir.map_expr(e, fn)


def rename_statement(st: Statement, mapping: dict) -> Statement:
    if not mapping:
        return st
    loops = tuple(Loop(mapping.get(lp.var, lp.var), rename_expr(lp.lo, mapping),
                       rename_expr(lp.hi, mapping), lp.step) for lp in st.loops)
    conds = tuple(ir.Condition(rename_expr(c.expr, mapping), c.positive) for c in st.conditions)
    guard = None if st.guard is None else rename_expr(st.guard, mapping)
    return dataclasses.replace(st, loops=loops, conditions=conds, guard=guard,
                               target=rename_expr(st.target, mapping),
                               expr=rename_expr(st.expr, mapping))


# --------------------------------------------------------------------------
# wrt
# --------------------------------------------------------------------------


def _err(k: ir.Kernel, message: str, hint: str = "", line: int = 0):
    return NotDifferentiableError(message, k.filename or "<kernel>", line or k.line, 0, hint)


def check_wrt(k: ir.Kernel, wrt) -> list[str]:
    """Normalise ``wrt`` (a name, a list of names or a dict label -> name) to parameter names.

    Raises NotDifferentiableError for names that are not float input parameters.
    """
    if isinstance(wrt, str):
        names = [wrt]
    elif isinstance(wrt, dict):
        names = list(wrt.values())
    elif isinstance(wrt, (list, tuple)):
        names = list(wrt)
    else:
        raise TypeError(f"wrt must be a parameter name, a list of names or a dict, got {wrt!r}")
    if not names:
        raise _err(k, "wrt names no parameter", "pass wrt='x' or wrt=['x', 'y']")
    seen = set()
    params = {p.name: p for p in k.params}
    for n in names:
        if not isinstance(n, str):
            raise TypeError(f"wrt entries must be parameter names (str), got {n!r}")
        if n in seen:
            raise _err(k, f"wrt names parameter {n!r} twice")
        seen.add(n)
        p = params.get(n)
        if p is None:
            raise _err(k, f"{k.name}() has no parameter {n!r} to differentiate with respect to",
                       f"parameters: {', '.join(params)}")
        dt = p.type.dtype if p.is_array else p.type
        if not dt.is_float:
            raise _err(k, f"cannot differentiate with respect to integer parameter {n!r} "
                          f"({dt.name})",
                       "derivatives exist for float (f32/f64) parameters only")
        if p.intent == "out":
            raise _err(k, f"{n!r} is an output (pa.Out) of {k.name}(), not an input",
                       "differentiate with respect to inputs; use pa.vjp to pull back a "
                       "cotangent of an output")
    return names


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


def reverse_loop(lp: Loop) -> Loop:
    """The same iterations, in the opposite order.

    A strided loop starts at its last iteration, ``lo + s * ((hi - lo - 1) // s)``; the
    schedule stage's ``strides._reversal`` recognises exactly this form (and runs the
    loop over its iteration numbers, without the floor), so a change here changes it too.
    """
    s = lp.step
    if s == 1:
        return Loop(lp.var, X.isub(lp.hi, X.ic(1)), X.isub(lp.lo, X.ic(1)), -1)
    if s == -1:
        return Loop(lp.var, X.iadd(lp.hi, X.ic(1)), X.iadd(lp.lo, X.ic(1)), 1)
    if s > 1:
        last = X.iadd(lp.lo, X.imul(s, X.ifloordiv(X.isub(X.isub(lp.hi, lp.lo), X.ic(1)), s)))
        return Loop(lp.var, last, X.isub(lp.lo, X.ic(1)), -s)
    a = -s
    last = X.isub(lp.lo, X.imul(a, X.ifloordiv(X.isub(X.isub(lp.lo, lp.hi), X.ic(1)), a)))
    return Loop(lp.var, last, X.iadd(lp.lo, X.ic(1)), a)


def _full_loops(shape, vars_) -> tuple[Loop, ...]:
    return tuple(Loop(v, X.ic(0), ext, 1) for v, ext in zip(vars_, shape))


def _item_names(it: Item) -> set[str]:
    """Names an item reads."""
    out = set()
    es = [it.expr] + ([it.guard] if it.guard is not None else [])
    if isinstance(it.target, Load):
        es += list(it.target.index)
    for c in it.conditions:
        es.append(c.expr)
    for e in es:
        for x in ir.walk(e):
            if isinstance(x, ScalarRef):
                out.add(x.name)
            elif isinstance(x, Load):
                out.add(x.array)
    if it.op != "=":
        out.add(it.target.array if isinstance(it.target, Load) else it.target.name)
    return out


def _item_target(it: Item) -> str:
    return it.target.array if isinstance(it.target, Load) else it.target.name


# --------------------------------------------------------------------------
# the transformation
# --------------------------------------------------------------------------


class _Reverse:
    def __init__(self, k: ir.Kernel, wrt, mode: str, exact_tapes: bool = True,
                 packed_tapes: bool = True):
        self.k = k
        self.mode = mode
        self.exact_tapes = exact_tapes
        self.packed_tapes = packed_tapes
        self.wrt = check_wrt(k, wrt)
        if mode in ("grad", "value_and_grad") and k.result is None:
            raise _err(k, f"{k.name}() returns no scalar: pa.grad needs a scalar-valued kernel",
                       "use pa.vjp(kernel, wrt) to pull back cotangents of its outputs")

    # -- setup ------------------------------------------------------------
    def prepare(self):
        k = self.k
        params = {p.name: p for p in k.params}
        self.inputs = [p for p in k.params if p.intent in ("in", "inout")]
        self.outputs = [p for p in k.params if p.intent in ("out", "inout")]
        # names of the new parameters (user-visible, fixed)
        reserved = [f"d_{w}" for w in self.wrt]
        if self.mode == "vjp":
            reserved += [f"{p.name}_bar" for p in self.outputs]
            if k.result is not None:
                reserved.append("result_bar")
        for r in reserved:
            if r in params and params[r].intent != "out":
                raise _err(k, f"the derived kernel needs a parameter named {r!r}, but {k.name}() "
                              f"already has an input of that name", "rename that parameter")
        internal = ({n for n, _ in k.locals} | {t.name for t in k.temps}
                    | {p.name for p in k.params if p.intent == "out"})
        for st in k.statements:
            internal |= {lp.var for lp in st.loops}
        self.names = Names(kernel_names(k) | set(reserved))
        mapping = {}
        for r in reserved:
            if r in internal:
                mapping[r] = self.names.fresh(r)
        # inout arrays: the derived kernel works on a copy and leaves the input alone
        for p in k.params:
            if p.intent == "inout":
                mapping[p.name] = self.names.fresh(f"{p.name}_work")
        self.rename = mapping
        ren = lambda n: mapping.get(n, n)  # noqa: E731
        self.reserved = reserved

        stmts = [rename_statement(st, mapping) for st in k.statements]
        self.idx_vars = [self.names.fresh(f"i{d}") for d in range(self._max_ndim())]
        # copy-in statements for inout arrays, at the very beginning
        copies = []
        for p in k.params:
            if p.intent == "inout":
                at = p.type
                vs = self.idx_vars[:at.ndim]
                ix = tuple(LoopVar(v) for v in vs)
                copies.append(Statement(
                    "copy", _full_loops(at.shape, vs), (len(copies),) + (0,) * at.ndim, (), None,
                    Load(ren(p.name), ix, at.dtype), "=", Load(p.name, ix, at.dtype),
                    k.line, f"copy of in-out array {p.name}"))
        shift = len(copies)
        stmts = [dataclasses.replace(st, position=(st.position[0] + shift,) + st.position[1:])
                 for st in stmts]
        self.stmts = copies + stmts
        self.root, self.leaves = build_tree(self.stmts)

        # variables of the primal program
        self.locals = {ren(n): dt for n, dt in k.locals}
        self.scalar_params = {p.name: p.type for p in k.params if not p.is_array}
        self.arrays: dict[str, ir.ArrayType] = {}
        self.temps: list[ir.Temp] = []
        for p in k.params:
            if p.is_array:
                self.arrays[p.name] = p.type
                if p.intent == "out":
                    self.arrays.pop(p.name)
                    self.arrays[ren(p.name)] = p.type
                    self.temps.append(ir.Temp(ren(p.name), p.type, True, "primal"))
                elif p.intent == "inout":
                    self.arrays[ren(p.name)] = p.type
                    self.temps.append(ir.Temp(ren(p.name), p.type, False, "primal",
                                              copy_of=p.name))
        for t in k.temps:
            self.arrays[ren(t.name)] = t.type
            self.temps.append(dataclasses.replace(t, name=ren(t.name)))
        self.result = None if k.result is None else (ren(k.result[0]), k.result[1])
        self.funcs = FuncLibrary(k.funcs)

    def _max_ndim(self):
        return max([p.type.ndim for p in self.k.params if p.is_array] + [1])

    # -- analysis ---------------------------------------------------------
    def analyze(self):
        k = self.k
        roots = set()
        if self.result is not None:
            roots.add(self.result[0])
        if self.mode == "vjp":
            roots |= {self.rename.get(p.name, p.name) for p in self.outputs}
        self.roots = roots
        self.act = analyze(self.stmts, self.wrt, roots, self.funcs.funcs)
        for w in self.wrt:
            if not self.act.is_active(w):
                what = "the returned value" if self.mode != "vjp" else "any output"
                warnings.warn(f"{k.name}(): {w!r} has no influence on {what}; its derivative "
                              f"is zero", NoGradientPathWarning, stacklevel=_user_stacklevel())
        # active indices and loop bounds cannot be differentiated
        tainted = self.act.tainted
        for lf in self.leaves:
            st = lf.stmt
            if target_name(st) not in self.act.useful:
                continue
            idx_exprs = []
            if isinstance(st.target, Load):
                idx_exprs += [("index", st.target, ix) for ix in st.target.index]
            for e in [st.expr] + ([st.guard] if st.guard is not None else []):
                for ld in ir.loads(e):
                    idx_exprs += [("index", ld, ix) for ix in ld.index]
            for what, ld, ix in idx_exprs:
                bad = all_reads(ix) & tainted
                if bad:
                    raise _err(k, f"the index {ir.expr_str(ix)} of {ir.expr_str(ld)} depends on "
                                  f"{', '.join(sorted(bad))}, which depends on the differentiated "
                                  f"input(s) {', '.join(self.wrt)} (an active index)",
                               "indices must not depend on differentiated data; compute the "
                               "index from inputs you do not differentiate", st.line)
            for lp in st.loops:
                bad = (all_reads(lp.lo) | all_reads(lp.hi)) & tainted
                if bad:
                    raise _err(k, f"the bounds of loop {lp.var!r} depend on "
                                  f"{', '.join(sorted(bad))}, which depends on the differentiated "
                                  f"input(s) {', '.join(self.wrt)} (an active loop bound)",
                               "loop bounds must not depend on differentiated data", st.line)

    # -- adjoint variables ----------------------------------------------------
    def make_adjoints(self):
        self.adj: dict[str, str] = {}
        self.adj_scalars: dict[str, ir.DType] = {}
        self.adj_temps: list[ir.Temp] = []
        self.out_params: list[ir.Param] = []
        self.acc_params: dict[str, str] = {}    # scalar wrt -> its Out param
        active = self.act.active
        for w in self.wrt:
            if w in self.arrays:
                at = self.arrays[w]
                self.adj[w] = f"d_{w}"
                self.out_params.append(ir.Param(f"d_{w}", at, "out"))
            else:
                dt = self.scalar_params[w]
                self.adj[w] = self.names.fresh(f"d_{w}_acc")
                self.adj_scalars[self.adj[w]] = dt
                self.acc_params[w] = f"d_{w}"
                self.out_params.append(ir.Param(f"d_{w}", ir.ArrayType(dt, (X.ic(1),)), "out"))
        for name in sorted(active - set(self.wrt)):
            if name in self.arrays:
                self.adj[name] = self.names.fresh(f"d_{name}")
                self.adj_temps.append(ir.Temp(self.adj[name], self.arrays[name], True, "adjoint",
                                              holds=f"the adjoint of {name}"))
            elif name in self.locals:
                self.adj[name] = self.names.fresh(f"d_{name}")
                self.adj_scalars[self.adj[name]] = self.locals[name]

    def adj_ref(self, x: Union[Load, ScalarRef]) -> Union[Load, ScalarRef]:
        if isinstance(x, Load):
            return Load(self.adj[x.array], x.index, x.dtype)
        return ScalarRef(self.adj[x.name], x.dtype)

    def expr_active(self, e: Expr) -> bool:
        return bool(diff_reads(e, self.funcs.funcs) & self.act.active)

    # -- chain rule -----------------------------------------------------------
    def backprop(self, e: Expr, bar: Expr) -> list[tuple[Expr, Expr]]:
        """Adjoint contributions ``[(active read, bar * d e / d read)]`` (one per read; the
        partials of a read appearing several times are summed before multiplying; a read
        whose partials sum to zero contributes nothing)."""
        acc: dict = {}

        def rec(x: Expr, b: Optional[Expr]):
            if b is None or not x.dtype.is_float or not self.expr_active(x):
                return
            if isinstance(x, (Load, ScalarRef)):
                acc[x] = X.add(acc.get(x), b)
                return
            if isinstance(x, ir.Select):
                rec(x.a, X.select(x.cond, b, None))
                rec(x.b, X.select(x.cond, None, b))
                return
            if isinstance(x, ir.Cast):
                rec(x.a, X.cast(b, x.a.dtype))
                return
            if isinstance(x, ir.Call) and self.funcs.get(x.func) is not None:
                for i, a in enumerate(x.args):
                    if a.dtype.is_float and self.expr_active(a):
                        rec(a, X.mul(b, self.funcs.partial_call(x, i)))
                return
            ps = partials(x)
            if ps is None:
                raise TypeError(f"no derivative rule for {ir.expr_str(x)}")
            for child, p in zip(x.children(), ps):
                if p is not None:
                    rec(child, X.mul(b, p))

        rec(e, X.fconst(1, e.dtype))
        # (partials that cancel, as in ``y[i] - y[i]``, sum to zero: no contribution)
        products = [(r, X.mul(bar, g)) for r, g in acc.items()]
        return [(r, g) for r, g in products if g is not None]

    # -- adjoint of one statement ----------------------------------------------
    def single_assignment(self, lf: Leaf) -> bool:
        t = lf.stmt.target
        if not isinstance(t, Load):
            return False
        if self.resolver.writes.get(t.array) != [lf]:
            return False
        at = self.arrays[t.array]
        if at.mode not in (None, "zero") and not plainly_in_bounds(t.index, lf.stmt.loops,
                                                                   at.shape):
            return False
        return injective_index(t.index, lf.stmt.loop_vars)

    def adjoint_items(self, lf: Leaf) -> list[Item]:
        st = lf.stmt
        T = st.target
        tname = target_name(st)
        if not T.dtype.is_float or not self.act.is_active(tname):
            return []
        R = self.resolver
        is_arr = isinstance(T, Load)

        def reads_target(e):
            return tname in (X.array_names(e) if is_arr else X.scalar_names(e))

        op, e = st.op, st.expr
        selfread = reads_target(e)
        if op == "-=":
            e, op = X.neg(e), "+="
        elif op in ("*=", "/="):
            e, op, selfread = Binary(op[0], T, e, T.dtype), "=", True
        if op == "+=" and selfread:
            e, op = Binary("+", T, e, T.dtype), "="
        guard = R.primal(st.guard, lf)
        src = f"adjoint of: {st.source}"
        conditions = R.runs_under(st)  # (the tape stores run under the same)

        def mk(target, o, expr):
            return Item(target, o, expr, conditions, guard, st.line, src)

        def contrib_items(contribs, skip=None):
            out = []
            for r, g in contribs:
                if skip is not None and r == skip:
                    continue
                tgt = self.adj_ref(r)
                out.append(mk(tgt, "+=", X.cast(R.primal(g, lf), tgt.dtype)))
            return out

        dT = self.adj_ref(T)
        zero = X.fconst(0, T.dtype)
        if op == "+=":
            return contrib_items(self.backprop(e, dT))
        if not selfread:
            items = contrib_items(self.backprop(e, dT))
            if not self.single_assignment(lf):
                items.append(mk(dT, "=", zero))
            return items
        if not is_arr:
            contribs = self.backprop(e, dT)
            if all(r == T for r, _ in contribs):
                g = contribs[0][1] if contribs else None
                return [mk(dT, "=", zero if g is None else X.cast(R.primal(g, lf), T.dtype))]
            tb = ScalarRef(self.names.fresh(f"t_{st.name}"), T.dtype)
            self.tmp_scalars[tb.name] = T.dtype
            contribs = self.backprop(e, tb)
            g_self = dict(contribs).get(T)
            return ([mk(tb, "=", dT)] + contrib_items(contribs, skip=T)
                    + [mk(dT, "=", zero if g_self is None
                          else X.cast(R.primal(g_self, lf), T.dtype))])
        tb = ScalarRef(self.names.fresh(f"t_{st.name}"), T.dtype)
        self.tmp_scalars[tb.name] = T.dtype
        return [mk(tb, "=", dT), mk(dT, "=", zero)] + contrib_items(self.backprop(e, tb))

    # -- reverse sweep ----------------------------------------------------------
    def reverse_items(self, node: Node) -> tuple[list, bool]:
        items, has = [], False
        for c in reversed(node.children):
            if isinstance(c, Leaf):
                its = self.adj_items.get(c.index, [])
                if its:
                    items.extend(its)
                    has = True
            else:
                sub, h = self.reverse_items(c)
                if h:
                    items.append(LoopItem(reverse_loop(c.loop), sub))
                    has = True
        if node.loop is not None and has:
            self.first_touch_assign(node, items)
            items = self.resolver.recompute_items(node) + items
        return items, has

    # -- private adjoints of loop-local scalars -----------------------------------
    def private_scalars(self, node: Node) -> dict[str, ir.Statement]:
        """Active locals killed at the top of every iteration of loop ``node`` and dead
        after it: name -> the killing statement. Their adjoint is zero at the start of
        every reversed iteration."""
        q = len(node.path)
        out = {}
        for name in self.act.active:
            if name not in self.locals:
                continue
            touching = [lf for lf in self.leaves if lf.path[:q] == node.path
                        and (name in lf.stmt.scalar_reads() or target_name(lf.stmt) == name)]
            kills = [lf for lf in touching
                     if len(lf.path) == q + 1 and lf.stmt.op == "=" and lf.stmt.guard is None
                     and isinstance(lf.stmt.target, ScalarRef) and target_name(lf.stmt) == name
                     and name not in X.scalar_names(lf.stmt.expr)]
            if not kills:
                continue
            kill = min(kills, key=lambda lf: lf.path)
            if any(lf is not kill and (lf.path[q] <= kill.path[q]
                                       or not set(kill.stmt.conditions) <= set(lf.stmt.conditions))
                   for lf in touching):
                continue
            if name in self.live_after.get(node.path, set()):
                continue
            out[name] = kill.stmt
        return out

    def first_touch_assign(self, node: Node, items: list):
        """Turn the first ``d_s += e`` of a reversed iteration into ``d_s = e`` for the
        private scalars of ``node`` (the zeroing at the end of the iteration then dies)."""
        for name, kill in self.private_scalars(node).items():
            adj = self.adj[name]
            for k, it in enumerate(items):
                touches = (adj in _item_names(it) or _item_target(it) == adj) \
                    if isinstance(it, Item) else any(
                        adj in _item_names(x) or _item_target(x) == adj for x in walk_items([it]))
                if not touches:
                    continue
                if (isinstance(it, Item) and it.op == "+=" and _item_target(it) == adj
                        and it.guard is None and set(it.conditions) == set(kill.conditions)
                        and adj not in _item_names(Item(it.target, "=", it.expr, it.conditions,
                                                        it.guard))):
                    items[k] = Item(it.target, "=", it.expr, it.conditions, it.guard, it.line,
                                    it.source)
                break

    def recorded_sets(self) -> Optional[RecordedSets]:
        """The exact to-be-recorded analysis of the primal sweep (None when switched off or
        when ISL cannot model the kernel: the structural checks then decide alone)."""
        if not self.exact_tapes:
            return None
        try:
            return RecordedSets(self.k, self.leaves, self.arrays)
        except analysable_error_types():
            return None

    # -- build ------------------------------------------------------------------
    def build(self) -> ir.Kernel:
        self.prepare()
        self.analyze()
        self.make_adjoints()
        k = self.k
        self.tmp_scalars: dict[str, ir.DType] = {}
        self.resolver = R = Resolver(self.root, self.leaves, set(self.locals), self.arrays,
                                     self.names, self.recorded_sets(), self.packed_tapes)
        self.live_after = _primal_liveness(self.root, self.roots)
        self.adj_items = {}
        for lf in reversed(self.leaves):
            self.adj_items[lf.index] = self.adjoint_items(lf)
        rev, _ = self.reverse_items(self.root)

        line = k.line
        head: list = []      # before the forward sweep
        seeds: list = []     # start of the reverse sweep
        tail: list = []      # end
        # zero the gradient outputs (never rely on the caller)
        for p in self.out_params:
            at = p.type
            vs = self.idx_vars[:at.ndim]
            body = Item(Load(p.name, tuple(LoopVar(v) for v in vs), at.dtype), "=",
                        X.fconst(0, at.dtype), line=line, source=f"zero {p.name}")
            head.append(_nest(_full_loops(at.shape, vs), body))
        for name, dt in R.init_scalars.items():
            head.append(Item(ScalarRef(name, dt), "=", X.fconst(0, dt), line=line,
                             source=f"initialise {name} (taped before its first assignment)"))
        forward = tree_items(self.root, before=lambda c: R.tape_before.get(c.path, []))

        # value of the kernel (value_and_grad): copy it if the reverse sweep recomputes it
        result = None
        if self.mode == "value_and_grad":
            rname, rdt = self.result
            if R.writes_in_slices(rname):
                vname = self.names.fresh("value")
                self.tmp_scalars[vname] = rdt
                forward.append(Item(ScalarRef(vname, rdt), "=", ScalarRef(rname, rdt),
                                    line=line, source="the kernel's value"))
                result = (vname, rdt)
            else:
                result = self.result

        # cotangent parameters (vjp) and adjoint initial values
        cot_params: list[ir.Param] = []
        seeded = set()
        if self.mode == "vjp":
            for p in self.outputs:
                at = p.type
                bar = ir.Param(f"{p.name}_bar", ir.ArrayType(at.dtype, at.shape), "in")
                cot_params.append(bar)
                inner = self.rename.get(p.name, p.name)
                if self.act.is_active(inner) and at.dtype.is_float:
                    vs = self.idx_vars[:at.ndim]
                    ix = tuple(LoopVar(v) for v in vs)
                    seeds.append(_nest(_full_loops(at.shape, vs), Item(
                        Load(self.adj[inner], ix, at.dtype), "=", Load(bar.name, ix, at.dtype),
                        line=line, source=f"seed: cotangent of {p.name}")))
            if self.result is not None:
                cot_params.append(ir.Param("result_bar", self.result[1], "in"))
        if self.result is not None:
            rname, rdt = self.result
            if self.act.is_active(rname):
                seed = ScalarRef("result_bar", rdt) if self.mode == "vjp" else X.fconst(1, rdt)
                seeds.append(Item(ScalarRef(self.adj[rname], rdt), "=", seed, line=line,
                                  source="seed: d(result)"))
                seeded.add(rname)
        for name in sorted(self.act.active):
            if name in self.locals and name not in seeded:
                dt = self.locals[name]
                seeds.append(Item(ScalarRef(self.adj[name], dt), "=", X.fconst(0, dt),
                                  line=line, source=f"zero {self.adj[name]}"))
        for w, pname in self.acc_params.items():
            dt = self.scalar_params[w]
            seeds.append(Item(ScalarRef(self.adj[w], dt), "=", X.fconst(0, dt), line=line,
                              source=f"zero {self.adj[w]}"))
            tail.append(Item(Load(pname, (X.ic(0),), dt), "=", ScalarRef(self.adj[w], dt),
                             line=line, source=f"gradient with respect to {w}"))

        items = head + forward + seeds + rev + tail

        # parameters
        params = [ir.Param(p.name, p.type, "in") for p in self.inputs]
        params += cot_params + self.out_params
        keep = {p.name for p in params if p.intent == "out"}
        if result is not None:
            keep.add(result[0])
        items = _dead_code(items, keep)
        if self.result is not None and self.mode != "vjp" and self.result[0] in seeded:
            items = _constant_seed(items, self.adj[self.result[0]])
        stmts = flatten(items)
        used = set()
        for it in walk_items(items):
            used |= _item_names(it) | {_item_target(it)}
        all_locals = dict(self.locals)
        all_locals.update(self.adj_scalars)
        all_locals.update(self.tmp_scalars)
        all_locals.update(dict(R.tape_scalars))
        if result is not None:
            all_locals.setdefault(result[0], result[1])
        locals_ = tuple((n, dt) for n, dt in all_locals.items() if n in used)
        temps = tuple(t for t in self.temps + self.adj_temps + R.tape_arrays if t.name in used)
        suffix = {"grad": "grad", "value_and_grad": "value_and_grad", "vjp": "vjp"}[self.mode]
        name = f"{k.name}_{suffix}_{'_'.join(self.wrt)}"
        return ir.Kernel(name=name, params=tuple(params), sizes=k.sizes, locals=locals_,
                         temps=temps, statements=tuple(stmts), result=result,
                         funcs=tuple(self.funcs.funcs[n] for n in self.funcs.order),
                         filename=k.filename, line=k.line, int_params=k.int_params)


def _user_stacklevel() -> int:
    """``stacklevel`` for ``warnings.warn`` that points at the first frame outside polyad."""
    import os
    import sys
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    level, f = 1, sys._getframe(1)
    while f is not None and os.path.abspath(f.f_code.co_filename).startswith(pkg + os.sep):
        f = f.f_back
        level += 1
    return level


def _nest(loops, body: Item):
    out = body
    for lp in reversed(loops):
        out = LoopItem(lp, [out])
    return out


def _primal_liveness(root: Node, keep: set) -> dict[tuple, set]:
    """Names live right after each loop of the primal (conservative: every statement's
    reads count, unconditional scalar ``=`` kills)."""
    after: dict[tuple, set] = {}

    def block(node: Node, live_out: set) -> set:
        live = set(live_out)
        for c in reversed(node.children):
            if isinstance(c, Node):
                live = loop(c, live)
                continue
            st = c.stmt
            t = target_name(st)
            if (st.op == "=" and isinstance(st.target, ScalarRef) and not st.conditions
                    and st.guard is None):
                live.discard(t)
            live |= _item_names(item_of(st))
        return live

    def loop(node: Node, live_out: set) -> set:
        after.setdefault(node.path, set()).update(live_out)
        live = set(live_out)
        while True:
            new = live_out | block(node, live)
            if new == live:
                return live
            live = new

    block(root, set(keep))
    return after


def _constant_seed(items: list, name: str) -> list:
    """``items`` with the scalar ``name`` replaced by its value where its only write is
    one top-level ``name = <literal>`` that no item before it reads, and that write
    dropped.

    This is the result's adjoint of a gradient: it is seeded with 1 and, unless a
    statement such as ``C = 2 * C`` scales it, never written again, so every
    adjoint term's ``d_C * (...)`` is the term itself. Exact: ``x * 1`` is ``x``
    in IEEE arithmetic for every ``x``, so the values are bit-for-bit those of
    the multiplied form; the generated code loses a multiplication per term and
    a parameter per loop nest."""
    writes = [it for it in walk_items(items) if _item_target(it) == name]
    if len(writes) != 1:
        return items
    (seed,) = writes
    at = next((k for k, it in enumerate(items) if it is seed), None)
    if (at is None or seed.op != "=" or seed.conditions or seed.guard is not None
            or not isinstance(seed.expr, ir.Const)
            or any(name in _item_names(it) for it in walk_items(items[:at]))):
        return items
    value = seed.expr

    def rewrite(x: Expr):
        if isinstance(x, ScalarRef) and x.name == name:
            return X.cast(value, x.dtype)
        if isinstance(x, Binary) and x.op == "*" and (X.is_const(x.a) or X.is_const(x.b)):
            return X.cast(X.mul(x.a, x.b), x.dtype)
        return None

    def item(it: Item) -> Item:
        return dataclasses.replace(
            it, expr=ir.map_expr(it.expr, rewrite),
            guard=None if it.guard is None else ir.map_expr(it.guard, rewrite),
            target=it.target if isinstance(it.target, ScalarRef)
            else ir.map_expr(it.target, rewrite))

    def block(its: list) -> list:
        return [LoopItem(it.loop, block(it.body)) if isinstance(it, LoopItem) else item(it)
                for it in its if it is not seed]

    return block(items)


def _dead_code(items: list, keep: set) -> list:
    """Drop statements whose value is never needed for ``keep`` (the outputs).

    Backward liveness over the loop tree: variables are tracked by name; an
    unconditional plain ``=`` to a scalar kills it (so the forward sweep's
    values of a scalar that the reverse sweep recomputes are dead), array
    element writes never kill; a loop's body runs zero or more times (fixpoint).
    """
    needed: set[int] = set()

    def block(its, live_out: set) -> set:
        live = set(live_out)
        for it in reversed(its):
            if isinstance(it, LoopItem):
                live = loop(it, live)
                continue
            t = _item_target(it)
            if t not in live:
                continue
            needed.add(id(it))
            if (it.op == "=" and isinstance(it.target, ScalarRef) and not it.conditions
                    and it.guard is None):
                live.discard(t)
            live |= _item_names(it)
        return live

    def loop(it: LoopItem, live_out: set) -> set:
        live = set(live_out)
        while True:
            new = live_out | block(it.body, live)
            if new == live:
                return live
            live = new

    block(items, set(keep))
    return filter_items(items, lambda it: id(it) in needed)


# --------------------------------------------------------------------------
# entry points
# --------------------------------------------------------------------------


def _build(derivation: "_Reverse") -> ir.Kernel:
    """The derived kernel; a bug escaping the derivation is an InternalError (the arguments
    were checked when ``derivation`` was made)."""
    with ir.internal_errors("differentiating", derivation.k, also=ISL_FAILURES):
        return derivation.build()


def vjp_kernel(k: ir.Kernel, wrt, exact_tapes: bool = True) -> ir.Kernel:
    """The pullback of ``k``: inputs, cotangents ``<out>_bar`` (and ``result_bar``) ->
    ``d_<wrt>``. ``exact_tapes=False``: tape by the structural checks alone (the
    reference the exact to-be-recorded analysis is tested against)."""
    return _build(_Reverse(k, wrt, "vjp", exact_tapes))


def grad_kernel(k: ir.Kernel, wrt, exact_tapes: bool = True,
                packed_tapes: bool = True) -> ir.Kernel:
    """The gradient of the scalar ``k`` returns: inputs -> ``d_<wrt>``. ``packed_tapes=
    False``: tapes over triangular loops take their bounding box (``polyad.ad.layout``;
    what ``benchmarks/memory.py --table packing`` compares the packed tapes with)."""
    return _build(_Reverse(k, wrt, "grad", exact_tapes, packed_tapes))


def value_and_grad_kernel(k: ir.Kernel, wrt, exact_tapes: bool = True) -> ir.Kernel:
    """Like ``grad_kernel``, and the derived kernel returns ``k``'s value."""
    return _build(_Reverse(k, wrt, "value_and_grad", exact_tapes))


def recorded_reads(k: ir.Kernel, wrt, mode: str = "grad") -> list[dict]:
    """The to-be-recorded decision for every primal array read the adjoint of ``k`` needs:
    ``statement`` (DSL source), ``line``, ``read`` (the access), ``final`` (read from the
    final array), ``how`` (which check decided), ``recorded`` (the ISL set of instances
    whose value is overwritten before the reverse sweep; None when ISL was not asked or
    cannot model the access) and ``tape`` (the tape's name, None when not taped)."""
    derivation = _Reverse(k, wrt, mode)
    _build(derivation)
    return [{key: v for key, v in r.items() if key != "leaf"}
            for r in derivation.resolver.records]
