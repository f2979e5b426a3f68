"""What every frontend shares: typed expression building and kernel assembly.

A frontend (the Python DSL, the C subset) reads its own syntax and calls into
this module to build IR, so that both produce the same IR for the same
program:

* expression typing: ``make_binary`` (numpy-like promotion, weak literals),
  ``cast_to``, ``typed_intrinsic``;
* what ISL can model: ``is_affine``, ``is_affine_condition``, ``is_constant``;
* ``KernelBuilder``: the state of a kernel being built (parameters, locals,
  temporaries, statements in "2d+1" program order, the loop/condition scope)
  and kernel-call inlining, finished by ``build_kernel``.

Errors are raised through the frontend's ``err(node, message, hint)``, so
they carry the frontend's own source location.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

import numpy as np

from .. import ir
from ..errors import DSLError
from ..intrinsics import INTRINSICS
from ..ir import (Binary, Call, Cast, Condition, Const, DType, Expr, Load, Loop, LoopVar,
                  ScalarRef, SizeVar, Statement)

# --------------------------------------------------------------------------
# typed expressions
# --------------------------------------------------------------------------


def weak_fix(a: Expr, b: Expr) -> tuple[Expr, Expr]:
    """Give a weak literal the type of the other operand (``x * 2.0`` stays f32)."""
    if isinstance(a, Const) and a.weak and not (isinstance(b, Const) and b.weak):
        if b.dtype.is_float or not a.dtype.is_float:
            a = Const(a.value if not b.dtype.is_float else float(a.value), b.dtype)
    if isinstance(b, Const) and b.weak and not (isinstance(a, Const) and a.weak):
        if a.dtype.is_float or not b.dtype.is_float:
            b = Const(b.value if not a.dtype.is_float else float(b.value), a.dtype)
    return a, b


def make_binary(op: str, a: Expr, b: Expr) -> Expr:
    """A typed binary node (Python semantics: ``/`` is true division)."""
    a, b = weak_fix(a, b)
    if op in ir.COMPARE_OPS or op in ir.LOGIC_OPS:
        return Binary(op, a, b, ir.boolean)
    dt = ir.promote(a.dtype, b.dtype)
    if op == "/" and not dt.is_float:
        dt = ir.f64
        a, b = Cast(a, dt), Cast(b, dt)
    if op == "**" and not dt.is_float and not (isinstance(b, Const) and b.value >= 0):
        dt = ir.f64
    weak = isinstance(a, Const) and a.weak and isinstance(b, Const) and b.weak
    if weak and op in _FOLD and isinstance(a.value, (int, float)):
        # Python's own arithmetic (arbitrary-precision integers): ``10 ** 20`` is
        # exact here; whether it fits the type it ends up in is checked where it
        # gets one (cast_to's OverflowError, int_constant_overflow).
        val = _FOLD[op](a.value, b.value)
        return Const(val, ir.f64 if isinstance(val, float) else dt, True)
    return Binary(op, a, b, dt)


_FOLD = {"+": lambda x, y: x + y, "-": lambda x, y: x - y, "*": lambda x, y: x * y,
         "/": lambda x, y: x / y, "//": lambda x, y: x // y, "%": lambda x, y: x % y,
         "**": lambda x, y: x ** y}
INT64_MIN, INT64_MAX = -2 ** 63, 2 ** 63 - 1


def int_constant_overflow(e: Expr) -> Optional[Const]:
    """The first integer literal in ``e`` that does not fit in 64 bits, if any."""
    for x in ir.walk(e):
        if isinstance(x, Const) and not x.dtype.is_float and x.dtype != ir.boolean \
                and not INT64_MIN <= int(x.value) <= INT64_MAX:
            return x
    return None


def cast_to(e: Expr, dt: DType) -> Expr:
    """``e`` converted to ``dt`` (constants are converted in place)."""
    if e.dtype == dt:
        return e
    if isinstance(e, Const):
        # float(huge int) raises OverflowError: the frontend reports it at its node
        return Const(float(e.value) if dt.is_float else int(e.value), dt)
    return Cast(e, dt)


def intrinsic_arity_error(name: str, nargs: int) -> Optional[str]:
    """The message when intrinsic ``name`` cannot take ``nargs`` arguments, else None."""
    f = INTRINSICS[name]
    if f.arity == -1 and nargs < 2 or f.arity > 0 and nargs != f.arity:
        n = "at least 2" if f.arity == -1 else str(f.arity)
        return f"{name}() takes {n} arguments, got {nargs}"
    return None


def typed_intrinsic(name: str, args: list[Expr]) -> Expr:
    """A call of intrinsic ``name`` with its arguments promoted to one type.

    ``float_result`` intrinsics compute in floating point; ``min``/``max`` with
    more than two arguments become nested two-argument calls.
    """
    f = INTRINSICS[name]
    if len(args) == 2:
        args = list(weak_fix(*args))
    dt = args[0].dtype
    for a in args[1:]:
        dt = ir.promote(dt, a.dtype)
    if dt == ir.boolean:
        dt = ir.i64
    if f.float_result and not dt.is_float:
        dt = ir.f64
    args = [cast_to(a, dt) for a in args]
    if name in ("min", "max") and len(args) > 2:
        out = Call(name, (args[0], args[1]), dt)
        for a in args[2:]:
            out = Call(name, (out, a), dt)
        return out
    return Call(name, tuple(args), dt)


# --------------------------------------------------------------------------
# what ISL models
# --------------------------------------------------------------------------


def is_affine(e: Expr, int_params: frozenset = frozenset()) -> bool:
    """Quasi-affine in loop variables, sizes and integer parameters (what ISL models)."""
    if isinstance(e, Const):
        return not e.dtype.is_float and isinstance(e.value, (int, np.integer))
    if isinstance(e, (LoopVar, SizeVar)):
        return True
    if isinstance(e, ScalarRef):
        return e.name in int_params
    if isinstance(e, ir.Unary) and e.op == "neg":
        return is_affine(e.a, int_params)
    if isinstance(e, Cast):
        return not e.dtype.is_float and is_affine(e.a, int_params)
    if isinstance(e, Binary):
        if e.op in ("+", "-"):
            return is_affine(e.a, int_params) and is_affine(e.b, int_params)
        if e.op == "*":
            return ((is_constant(e.a) and is_affine(e.b, int_params))
                    or (is_constant(e.b) and is_affine(e.a, int_params)))
        if e.op in ("//", "%"):
            return (is_affine(e.a, int_params) and is_constant(e.b)
                    and const_value(e.b) > 0)
    return False


def is_constant(e: Expr) -> bool:
    """An integer expression of literals only."""
    if isinstance(e, Const):
        return not e.dtype.is_float
    if isinstance(e, ir.Unary) and e.op == "neg":
        return is_constant(e.a)
    if isinstance(e, Binary) and e.op in ("+", "-", "*"):
        return is_constant(e.a) and is_constant(e.b)
    return False


def const_value(e: Expr) -> int:
    """The value of an ``is_constant`` expression."""
    if isinstance(e, Const):
        return int(e.value)
    if isinstance(e, ir.Unary):
        return -const_value(e.a)
    a, b = const_value(e.a), const_value(e.b)
    return {"+": a + b, "-": a - b, "*": a * b}[e.op]


def is_affine_condition(e: Expr, int_params: frozenset) -> bool:
    """A conjunction/disjunction/negation of affine comparisons (part of an ISL domain)."""
    if isinstance(e, Binary) and e.op in ir.LOGIC_OPS:
        return is_affine_condition(e.a, int_params) and is_affine_condition(e.b, int_params)
    if isinstance(e, ir.Unary) and e.op == "not":
        return is_affine_condition(e.a, int_params)
    if isinstance(e, Binary) and e.op in ir.COMPARE_OPS and e.op != "!=":
        return is_affine(e.a, int_params) and is_affine(e.b, int_params)
    return False


# --------------------------------------------------------------------------
# building a kernel
# --------------------------------------------------------------------------


@dataclass
class Scope:
    """Where the statement being built sits: loops, affine conditions, guard."""

    loops: tuple[Loop, ...] = ()
    position: tuple[int, ...] = ()
    conditions: tuple[Condition, ...] = ()
    guard: Optional[Expr] = None


class KernelBuilder:
    """The state of one kernel under construction, shared by every frontend.

    A frontend subclass provides ``err(node, message, hint) -> DSLError`` and
    fills ``params``/``arrays``/``scalars``/``sizes`` from its signature; then
    it walks the body, entering loops and conditions through ``scope`` and
    adding statements with ``emit_statement``; ``build_kernel`` returns the IR.
    """

    def __init__(self):
        self.params: list[ir.Param] = []
        self.arrays: dict[str, ir.ArrayType] = {}
        self.scalars: dict[str, DType] = {}
        self.sizes: dict[str, None] = {}
        self.locals: dict[str, DType] = {}
        self.temps: list[ir.Temp] = []
        self.statements: list[Statement] = []
        self.funcs: dict[str, ir.FuncDef] = {}
        self.counters: list[int] = [0]
        self.scope = Scope()
        self.result: Optional[tuple[str, DType]] = None
        self.int_params: set[str] = set()
        self.written: set[str] = set()
        self.read: set[str] = set()
        self.default_float = ir.f64

    def err(self, node, message: str, hint: str = "") -> DSLError:
        raise NotImplementedError

    # ---- names ----------------------------------------------------------
    def loop_vars(self) -> set[str]:
        """The iterators of the enclosing loops."""
        return {lp.var for lp in self.scope.loops}

    def taken_names(self) -> set[str]:
        """Names a fresh local, temporary or loop variable must not reuse."""
        return self.loop_vars() | set(self.arrays) | set(self.scalars) | set(self.locals)

    def fresh(self, base: str) -> str:
        """``base``, or ``base2``, ``base3``, ... if taken."""
        return ir.fresh_name(base, self.taken_names(), first=2)

    def note_sizes(self, e: Expr) -> None:
        """Record the sizes ``e`` mentions as sizes of the kernel."""
        for x in ir.walk(e):
            if isinstance(x, SizeVar):
                self.sizes[x.name] = None

    def choose_default_float(self) -> None:
        """f32 when every float parameter is f32 (untyped float locals follow it), else f64."""
        floats = [t.dtype for t in self.arrays.values() if t.dtype.is_float] + \
                 [d for d in self.scalars.values() if d.is_float]
        if floats and all(d == ir.f32 for d in floats):
            self.default_float = ir.f32

    # ---- statements -----------------------------------------------------
    def next_position(self) -> tuple[int, ...]:
        """The "2d+1" position of the next statement or loop in the current scope."""
        pos = self.scope.position + (self.counters[-1],)
        self.counters[-1] += 1
        return pos

    def emit_statement(self, target, op: str, value: Expr, line: int, source: str) -> None:
        """Append ``target op= value`` in the current scope (``value`` cast to the target)."""
        value = cast_to(value, target.dtype)
        self.statements.append(Statement(
            name=f"S{len(self.statements)}", loops=self.scope.loops,
            position=self.next_position(), conditions=self.scope.conditions,
            guard=self.scope.guard, target=target, op=op, expr=value, line=line, source=source))

    def enter_loop(self, loop: Loop) -> Scope:
        """Open ``loop`` in the current scope; returns the scope to restore with ``leave``."""
        outer = self.scope
        pos = self.next_position()
        self.scope = Scope(outer.loops + (loop,), pos, outer.conditions, outer.guard)
        self.counters.append(0)
        return outer

    def leave_loop(self, outer: Scope) -> None:
        self.counters.pop()
        self.scope = outer

    def condition_once(self, cond: Expr, written: set, line: int, source: str) -> Expr:
        """The condition of a run-time ``if`` whose branches write the variables ``written``.

        Each statement of the branches tests the condition again (its guard). When a
        branch writes what the condition reads, a later statement would test the new
        value (both branches could run): then the condition's value at the ``if`` is
        kept in a fresh local, assigned before the branches, and the branches test that.
        """
        reads = {x.array if isinstance(x, Load) else x.name for x in ir.walk(cond)
                 if isinstance(x, (Load, ScalarRef))}
        if not reads & written:
            return cond
        kept = ScalarRef(self.fresh(f"cond{line}"), ir.i32)
        self.locals[kept.name] = kept.dtype
        self.emit_statement(kept, "=", ir.Select(cond, Const(1, ir.i32), Const(0, ir.i32),
                                                 ir.i32), line, source)
        return Binary("!=", kept, Const(0, ir.i32), ir.boolean)

    def branch_scope(self, cond: Expr, positive: bool, affine: bool) -> Scope:
        """The scope of one branch of ``if cond``: a domain condition when ``affine``,
        else a run-time guard."""
        outer = self.scope
        if affine:
            return Scope(outer.loops, outer.position,
                         outer.conditions + (Condition(cond, positive),), outer.guard)
        g = cond if positive else ir.Unary("not", cond, ir.boolean)
        g = g if outer.guard is None else Binary("and", outer.guard, g, ir.boolean)
        return Scope(outer.loops, outer.position, outer.conditions, g)

    # ---- kernels calling kernels: inlined, so every later stage sees one kernel ----
    def bind_kernel_args(self, call, callee: ir.Kernel, args,
                         known_sizes: Optional[dict] = None) -> tuple[dict, dict, dict]:
        """Check a call's arguments against ``callee``'s parameters.

        ``args``: one ``(node, value)`` per parameter, ``value`` the name of an
        array of this kernel for array parameters, an Expr for scalars.
        ``known_sizes``: callee sizes bound beforehand (name -> Expr of this kernel).
        Returns (array renames, scalar values, size values) for ``inline_kernel``.
        """
        name = callee.name
        values: dict[str, Expr] = {}
        arrays: dict[str, str] = {}
        sizes: dict[str, Expr] = dict(known_sizes or {})
        for p, (a, value) in zip(callee.params, args):
            if p.is_array:
                mine = self.arrays[value]
                if mine.dtype != p.type.dtype or mine.ndim != p.type.ndim:
                    raise self.err(a, f"{value!r} is {mine!r} but {name}() expects {p.type!r}")
                if p.type.mode is not None and mine.mode != p.type.mode:
                    # The mode belongs to the array: an inlined access can only use the caller's.
                    raise self.err(a, f"{name}() reads {p.name!r} with boundary mode "
                                      f"'{p.type.mode}', but {value!r} has "
                                      f"{repr(mine.mode) if mine.mode else 'none'}",
                                   f"declare {value!r} with .{p.type.mode} in this kernel too")
                for ext, my_ext in zip(p.type.shape, mine.shape):
                    self.bind_extent(a, name, p.name, ext, my_ext, sizes)
                arrays[p.name] = value
                if p.intent != "in":
                    self.written.add(value)
            else:
                values[p.name] = cast_to(value, p.type)
                if p.name in callee.int_params and not is_affine(
                        values[p.name], frozenset(self.int_params | set(self.scalars))):
                    raise self.err(a, f"{name}() uses {p.name!r} in loop bounds or indices, "
                                      "so its argument must be affine")
        missing = [sz for sz in callee.sizes if sz not in sizes]
        if missing:
            raise self.err(call, f"cannot bind size(s) {', '.join(missing)} of {name}()",
                           "every size of the called kernel must appear in an array argument")
        return arrays, values, sizes

    def inline_kernel(self, call, callee: ir.Kernel, arrays: dict, values: dict,
                      sizes: dict) -> Optional[Expr]:
        """Append ``callee``'s statements in the current scope, its parameters bound to
        ``arrays``/``values``/``sizes`` (from ``bind_kernel_args``); returns the
        callee's result as a scalar of this kernel (None when it returns nothing)."""
        name = callee.name
        arrays = dict(arrays)
        renames = self.callee_locals(callee)
        for t in callee.temps:
            arrays[t.name] = self.fresh(f"{name}_{t.name}")
            self.arrays[arrays[t.name]] = _subst_type(t.type, sizes)
            self.temps.append(ir.Temp(arrays[t.name], self.arrays[arrays[t.name]], t.zero))
        taken = self.loop_vars() | set(self.arrays) | set(self.scalars) | set(self.locals)
        loop_names = {}
        for st in callee.statements:
            for lp in st.loops:
                if lp.var not in loop_names:
                    loop_names[lp.var] = lp.var if lp.var not in taken else self.fresh(lp.var)

        def tr(e: Expr) -> Expr:
            def fn(x):
                if isinstance(x, SizeVar):
                    return sizes[x.name]
                if isinstance(x, LoopVar):
                    return LoopVar(loop_names[x.name])
                if isinstance(x, ScalarRef):
                    return values.get(x.name) or ScalarRef(renames[x.name], x.dtype)
                if isinstance(x, Load):
                    return Load(arrays[x.array], x.index, x.dtype)
                return None
            return ir.map_expr(e, fn)

        for sub in callee.funcs:
            self.funcs[sub.name] = sub
        # only values the callee uses in bounds or indices become ISL parameters here
        for x in ir.walk_many(v for n, v in values.items() if n in callee.int_params):
            if isinstance(x, ScalarRef) and x.name in self.scalars:
                self.int_params.add(x.name)
        base = self.counters[-1]
        width = 1 + max((st.position[0] for st in callee.statements), default=-1)
        self.counters[-1] += width
        scope = self.scope
        for st in callee.statements:
            t = st.target
            target = tr(t) if isinstance(t, Load) else ScalarRef(renames[t.name], t.dtype)
            guard = tr(st.guard) if st.guard is not None else None
            if scope.guard is not None:
                guard = scope.guard if guard is None else Binary("and", scope.guard, guard,
                                                                 ir.boolean)
            self.statements.append(Statement(
                name=f"S{len(self.statements)}",
                loops=scope.loops + tuple(Loop(loop_names[lp.var], tr(lp.lo), tr(lp.hi), lp.step)
                                          for lp in st.loops),
                position=scope.position + (base + st.position[0],) + st.position[1:],
                conditions=scope.conditions + tuple(Condition(tr(c.expr), c.positive)
                                                    for c in st.conditions),
                guard=guard, target=target, op=st.op, expr=tr(st.expr), line=st.line,
                source=f"{name}(): {st.source}"))
        if callee.result is None:
            return None
        rname, rdt = callee.result
        return ScalarRef(renames[rname], rdt)

    def bind_extent(self, node, callee, param, ext: Expr, mine: Expr, sizes: dict):
        """Bind the callee's size in extent ``ext`` to this kernel's extent ``mine``."""
        if isinstance(ext, SizeVar) and ext.name not in sizes:
            sizes[ext.name] = mine
            return
        want = ir.substitute_sizes(ext, sizes) if _sizes_bound(ext, sizes) else None
        if want is None or ir.expr_str(ir.fold_integer_constants(want)) != \
                ir.expr_str(ir.fold_integer_constants(mine)):
            raise self.err(node, f"argument {param!r} of {callee}() has extent "
                                 f"{ir.expr_str(mine)} where {ir.expr_str(ext)} is expected",
                           "the called kernel's sizes must match the arrays passed to it")

    def callee_locals(self, callee: ir.Kernel) -> dict:
        """Fresh local names of this kernel for the callee's locals."""
        renames = {}
        for n, dt in callee.locals:
            renames[n] = self.fresh(f"{callee.name}_{n}")
            self.locals[renames[n]] = dt
        return renames

    # ---- the result -----------------------------------------------------
    def build_kernel(self, name: str, filename: str, line: int) -> ir.Kernel:
        """The finished ``ir.Kernel`` (arrays the body writes become ``inout``)."""
        params = []
        for p in self.params:
            if p.is_array and p.intent == "in" and p.name in self.written:
                p = ir.Param(p.name, p.type, "inout")
            params.append(p)
        for st in self.statements:
            for ld in st.reads():
                self.read.add(ld.array)
        return ir.Kernel(
            name=name, params=tuple(params), sizes=tuple(self.sizes),
            locals=tuple(self.locals.items()), temps=tuple(self.temps),
            statements=tuple(self.statements), result=self.result,
            funcs=tuple(self.funcs.values()), filename=filename, line=line,
            int_params=tuple(n for n in self.scalars if n in self.int_params))


def _sizes_bound(e: Expr, sizes: dict) -> bool:
    return all(x.name in sizes for x in ir.walk(e) if isinstance(x, SizeVar))


def _subst_type(at: ir.ArrayType, sizes: dict) -> ir.ArrayType:
    """A callee's array type with its sizes replaced by the caller's extents."""
    return dataclasses.replace(at, shape=tuple(ir.substitute_sizes(e, sizes) for e in at.shape))
