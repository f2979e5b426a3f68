"""Python DSL -> IR.

``parse_kernel(fn)`` reads the source of a ``@pa.kernel`` function with
``ast``, resolves names through its globals and closure (sizes, device
functions, constants, intrinsics) and returns an ``ir.Kernel``;
``parse_func(fn)`` does the same for a ``@pa.func`` device function.

Anything the DSL has no meaning for raises ``DSLError`` with the file, line,
column and a hint.
"""

from __future__ import annotations

import ast
import builtins
import difflib
import inspect
import textwrap
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import ir
from ..errors import DSLError
from ..intrinsics import PYTHON_ALIASES, Intrinsic
from ..ir import (Binary, Call, Const, DType, Expr, Load, Loop, LoopVar, ScalarRef, Select,
                  SizeVar, Unary)
from .common import (KernelBuilder, cast_to, const_value, intrinsic_arity_error, is_affine,
                     int_constant_overflow, is_affine_condition, is_constant, make_binary,
                     typed_intrinsic, weak_fix)
from .sources import source_lines

_BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//",
           ast.Mod: "%", ast.Pow: "**"}
_CMPOPS = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==",
           ast.NotEq: "!="}
_AUGOPS = {ast.Add: "+=", ast.Sub: "-=", ast.Mult: "*=", ast.Div: "/="}

# Constructs with a dedicated message; anything else unknown gets a generic one.
_UNSUPPORTED_STMT = {
    ast.Break: ("'break' is not supported in kernels",
                "express the early exit as a loop bound or an if-condition"),
    ast.Continue: ("'continue' is not supported in kernels",
                   "wrap the rest of the loop body in an if-statement instead"),
    ast.While: ("'while' loops are not supported in kernels",
                "use 'for v in range(lo, hi)' with affine bounds"),
    ast.Try: ("'try' is not supported in kernels", "kernels cannot raise or catch exceptions"),
    ast.With: ("'with' is not supported in kernels", "remove the with-block"),
    ast.FunctionDef: ("nested function definitions are not supported in kernels",
                      "define a device function at module level with @pa.func"),
    ast.Lambda: ("lambda is not supported in kernels",
                 "define a device function at module level with @pa.func"),
    ast.Raise: ("'raise' is not supported in kernels", "kernels cannot raise exceptions"),
    ast.Global: ("'global' is not supported in kernels", "pass the value as a parameter"),
    ast.Nonlocal: ("'nonlocal' is not supported in kernels", "pass the value as a parameter"),
    ast.Delete: ("'del' is not supported in kernels", "remove the statement"),
    ast.Import: ("'import' is not supported in kernels", "import at module level"),
    ast.ImportFrom: ("'import' is not supported in kernels", "import at module level"),
    ast.ClassDef: ("class definitions are not supported in kernels", "define it at module level"),
}


@dataclass
class _Source:
    """The function's source with the mapping back to file lines and columns."""

    filename: str
    tree: ast.FunctionDef
    text: str
    line_offset: int
    col_offset: int

    @classmethod
    def of(cls, fn) -> "_Source":
        lines, start = source_lines(fn)
        raw = "".join(lines)
        text = textwrap.dedent(raw)
        indent = len(lines[0]) - len(lines[0].lstrip()) if lines else 0
        mod = ast.parse(text)
        node = mod.body[0]
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            raise DSLError("a kernel must be a function definition", fn.__code__.co_filename, start)
        return cls(fn.__code__.co_filename, node, text, start - 1, indent)

    def error(self, node, message: str, hint: str = "", cls=DSLError) -> DSLError:
        line = getattr(node, "lineno", 1) + self.line_offset
        col = getattr(node, "col_offset", 0) + self.col_offset + 1  # ast counts from 0
        return cls(message, self.filename, line, col, hint)

    def line(self, node) -> int:
        return getattr(node, "lineno", 1) + self.line_offset

    def segment(self, node) -> str:
        seg = ast.get_source_segment(self.text, node) or ""
        return " ".join(seg.split())


def _namespace(fn) -> dict[str, Any]:
    """Globals, builtins and closure cells visible to ``fn``."""
    ns = dict(vars(builtins))
    ns.update(fn.__globals__)
    code = fn.__code__
    if fn.__closure__:
        for name, cell in zip(code.co_freevars, fn.__closure__):
            try:
                ns[name] = cell.cell_contents
            except ValueError:
                pass
    return ns


def _resolve_annotation(fn, name, ns, src: _Source, node):
    ann = fn.__annotations__.get(name, inspect.Parameter.empty)
    if isinstance(ann, str):
        try:
            ann = eval(ann, ns)
        except Exception as exc:
            raise src.error(node, f"cannot evaluate the annotation of {name!r}: {exc}")
    return ann


# --------------------------------------------------------------------------
# expressions shared by kernels and device functions
# --------------------------------------------------------------------------


def did_you_mean(word: str, candidates) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``candidates``, or nothing."""
    close = difflib.get_close_matches(word, [c for c in candidates if isinstance(c, str)], n=1,
                                      cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


class _ExprParser:
    """Converts Python expression ASTs into typed IR expressions."""

    def __init__(self, src: _Source, ns: dict[str, Any]):
        self.src = src
        self.ns = ns
        self.funcs: dict[str, ir.FuncDef] = {}

    # hooks overridden by the kernel parser
    def name_expr(self, node: ast.Name) -> Expr:
        raise NotImplementedError

    def subscript_expr(self, node: ast.Subscript) -> Expr:
        raise self.src.error(node, "array indexing is not allowed here")

    def err(self, node, message, hint=""):
        return self.src.error(node, message, hint)

    def global_value(self, node: ast.AST):
        """The Python object an ``a.b.c`` or name expression refers to, or raise."""
        if isinstance(node, ast.Name):
            if node.id not in self.ns:
                raise self.err(node, f"unknown name {node.id!r}{did_you_mean(node.id, self.ns)}",
                               "define it at module level, pass it as a parameter, or fix the spelling")
            return self.ns[node.id]
        if isinstance(node, ast.Attribute):
            self.array_query(node)
            base = self.global_value(node.value)
            if not hasattr(base, node.attr):
                public = [a for a in dir(base) if not a.startswith("_")]
                raise self.err(node, f"{ast.unparse(node.value)!s} has no attribute {node.attr!r}"
                                     f"{did_you_mean(node.attr, public)}")
            return getattr(base, node.attr)
        raise self.err(node, f"cannot evaluate {ast.unparse(node)!r} here")

    def constant(self, node, value) -> Expr:
        if isinstance(value, bool):
            return Const(int(value), ir.boolean)
        if isinstance(value, (int, np.integer)):
            return Const(int(value), ir.i64, weak=True)
        if isinstance(value, (float, np.floating)):
            return Const(float(value), ir.f64, weak=True)
        raise self.err(node, f"the DSL has no meaning for the constant {value!r}",
                       "kernels use numbers, arrays, sizes and scalars only")

    def expr(self, node: ast.AST) -> Expr:
        m = getattr(self, "x_" + type(node).__name__, None)
        if m is None:
            what = type(node).__name__
            hint = "kernels use arithmetic, comparisons, calls of intrinsics and device functions"
            if isinstance(node, (ast.List, ast.Dict, ast.Set, ast.Tuple, ast.ListComp,
                                 ast.DictComp, ast.SetComp, ast.GeneratorExp)):
                hint = "use arrays passed as parameters or pa.zeros(...) temporaries"
            if isinstance(node, ast.Lambda):
                hint = "define a device function at module level with @pa.func"
            raise self.err(node, f"{what} expressions are not supported in kernels", hint)
        return m(node)

    def x_Constant(self, node):
        return self.constant(node, node.value)

    def x_Name(self, node):
        return self.name_expr(node)

    def x_Attribute(self, node):
        value = self.global_value(node)
        return self.constant(node, value)

    def x_Subscript(self, node):
        return self.subscript_expr(node)

    def x_UnaryOp(self, node):
        a = self.expr(node.operand)
        if isinstance(node.op, ast.USub):
            if isinstance(a, Const):
                return Const(-a.value, a.dtype, a.weak)
            return Unary("neg", a, a.dtype)
        if isinstance(node.op, ast.UAdd):
            return a
        if isinstance(node.op, ast.Not):
            return Unary("not", a, ir.boolean)
        raise self.err(node, "bitwise '~' is not supported in kernels")

    def x_BinOp(self, node):
        op = _BINOPS.get(type(node.op))
        if op is None:
            raise self.err(node, f"operator {type(node.op).__name__} is not supported in kernels",
                           "use + - * / // % **")
        left, right = self.expr(node.left), self.expr(node.right)
        if op in ("//", "%") and isinstance(right, Const) and right.value == 0:
            raise self.err(node, f"{'integer division' if op == '//' else 'modulo'} by zero "
                                 f"in {ast.unparse(node)!r}",
                           "the divisor is the literal 0; divide by a nonzero value")
        try:
            return make_binary(op, left, right)
        except ZeroDivisionError:
            raise self.err(node, f"division by zero in {ast.unparse(node)!r}",
                           "the divisor is a constant that evaluates to 0") from None
        except OverflowError:
            raise self.err(node, f"{ast.unparse(node)!r} overflows a float",
                           "constants must fit in a float64") from None

    def x_BoolOp(self, node):
        op = "and" if isinstance(node.op, ast.And) else "or"
        vals = [self.expr(v) for v in node.values]
        out = vals[0]
        for v in vals[1:]:
            out = Binary(op, out, v, ir.boolean)
        return out

    def x_Compare(self, node):
        left = self.expr(node.left)
        out = None
        for op, comp in zip(node.ops, node.comparators):
            if type(op) not in _CMPOPS:
                raise self.err(node, f"comparison {type(op).__name__} is not supported",
                               "use < <= > >= == !=")
            right = self.expr(comp)
            c = make_binary(_CMPOPS[type(op)], left, right)
            out = c if out is None else Binary("and", out, c, ir.boolean)
            left = right
        return out

    def x_IfExp(self, node):
        cond = self.expr(node.test)
        a, b = self.expr(node.body), self.expr(node.orelse)
        a, b = weak_fix(a, b)
        dt = ir.promote(a.dtype, b.dtype) if a.dtype != b.dtype else a.dtype
        return Select(cond, cast_to(a, dt), cast_to(b, dt), dt)

    def array_query(self, node) -> None:
        """Hook: raise a helpful error for ``len(x)`` / ``x.shape`` on a kernel array."""

    def x_Call(self, node):
        self.array_query(node)
        if node.keywords:
            raise self.err(node, "keyword arguments are not supported in kernel calls")
        target = self.global_value(node.func) if isinstance(node.func, (ast.Name, ast.Attribute)) \
            else None
        if isinstance(node.func, ast.Name) and node.func.id in ("range",):
            raise self.err(node, "range() is only allowed as a for-loop iterable")
        if getattr(target, "__polyad_kernel__", None) is not None:
            raise self.err(node, "a kernel call must be a statement of its own",
                           "write 'other(x, y)' or 'v = other(x)' on its own line")
        args = [self.expr(a) for a in node.args]
        if target is float or target is int or isinstance(target, DType):
            if len(args) != 1:
                raise self.err(node, "a conversion takes exactly one argument")
            dt = ir.f64 if target is float else ir.i64 if target is int else target
            if isinstance(args[0], Const) and not args[0].dtype.is_float and not dt.is_float:
                self.check_fits(node, args[0], dt)
            # int() truncates toward zero in Python and in C alike.
            try:
                return cast_to(args[0], dt)
            except OverflowError:
                raise self.err(node, f"{ast.unparse(node)!r}: the constant "
                                     f"{args[0].value} does not fit in {dt.np_name}",
                               "use a smaller constant") from None
        name = None
        if isinstance(target, Intrinsic):
            name = target.name
        elif target in PYTHON_ALIASES:
            name = PYTHON_ALIASES[target]
        if name is not None:
            return self.intrinsic_call(node, name, args)
        from_func = getattr(target, "__polyad_func__", None)
        if from_func is not None:
            return self.func_call(node, target, args)
        raise self.err(node, f"call of unknown function {ast.unparse(node.func)!r}",
                       "kernels can call intrinsics (pa.exp, abs, min, ...) and @pa.func functions")

    def check_fits(self, node, e: Expr, dt: DType = ir.i64) -> None:
        """DSLError when an integer literal in ``e`` does not fit the 64-bit integer type."""
        big = int_constant_overflow(e)
        if big is None and isinstance(e, Const) and not e.dtype.is_float and dt != ir.boolean \
                and dt.np is not None and not dt.is_float:
            info = np.iinfo(dt.np)
            if not info.min <= int(e.value) <= info.max:
                big = e
        if big is not None:
            raise self.err(node, f"the integer constant {big.value} in {ast.unparse(node)!r} "
                                 f"does not fit in {dt.np_name if dt != ir.boolean else 'int64'}",
                           "integer arithmetic is 64-bit; write a float (1e20) or a smaller "
                           "constant")

    def intrinsic_call(self, node, name, args) -> Expr:
        problem = intrinsic_arity_error(name, len(args))
        if problem:
            raise self.err(node, problem)
        return typed_intrinsic(name, args)

    def func_call(self, node, fobj, args) -> Expr:
        fdef: ir.FuncDef = fobj.__polyad_func__
        if len(args) != len(fdef.params):
            raise self.err(node, f"{fdef.name}() takes {len(fdef.params)} arguments, got {len(args)}")
        for sub in fobj.__polyad_deps__:
            self.funcs[sub.name] = sub
        self.funcs[fdef.name] = fdef
        args = [cast_to(a, dt) for a, (_, dt) in zip(args, fdef.params)]
        return Call(fdef.name, tuple(args), fdef.result)


# --------------------------------------------------------------------------
# device functions
# --------------------------------------------------------------------------


class _FuncParser(_ExprParser):
    def __init__(self, fn, src, ns):
        super().__init__(src, ns)
        self.fn = fn
        self.params: dict[str, DType] = {}
        self.locals: dict[str, DType] = {}

    def name_expr(self, node):
        n = node.id
        if n in self.params:
            return ScalarRef(n, self.params[n])
        if n in self.locals:
            return ScalarRef(n, self.locals[n])
        if n == self.fn.__name__:
            raise self.err(node, f"recursive call of {n!r}", "device functions cannot recurse")
        return self.x_Attribute(node)

    def x_Call(self, node):
        if isinstance(node.func, ast.Name) and node.func.id == self.fn.__name__:
            raise self.err(node, f"recursive call of {node.func.id!r}",
                           "device functions cannot recurse; write the recursion as a loop in a kernel")
        return super().x_Call(node)

    def parse(self) -> ir.FuncDef:
        fdef = self.src.tree
        for a in fdef.args.args:
            ann = _resolve_annotation(self.fn, a.arg, self.ns, self.src, a)
            if not isinstance(ann, DType):
                raise self.err(a, f"device function parameter {a.arg!r} needs a scalar type annotation",
                               "annotate it, e.g. x: pa.f64")
            self.params[a.arg] = ann
        ret = _resolve_annotation(self.fn, "return", self.ns, self.src, fdef)
        if not isinstance(ret, DType):
            raise self.err(fdef, "a device function needs a scalar return annotation",
                           "annotate it, e.g. -> pa.f64")
        self.result = ret
        body = self.block(fdef.body)
        if not _always_returns(body):
            raise self.err(fdef, f"device function {fdef.name!r} may end without 'return'",
                           "return a value on every path")
        return ir.FuncDef(fdef.name, tuple(self.params.items()), ret, tuple(self.locals.items()),
                          body, self.src.filename, self.src.line(fdef))

    def block(self, stmts) -> tuple:
        out = []
        for s in stmts:
            if isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant):
                continue  # docstring
            out.append(self.stmt(s))
        return tuple(out)

    def stmt(self, s):
        line = self.src.line(s)
        if isinstance(s, ast.Return):
            if s.value is None:
                raise self.err(s, "a device function must return a value")
            return ir.FReturn(cast_to(self.expr(s.value), self.result), line)
        if isinstance(s, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            target = s.targets[0] if isinstance(s, ast.Assign) else s.target
            if isinstance(s, ast.Assign) and len(s.targets) != 1 or not isinstance(target, ast.Name):
                raise self.err(s, "device functions assign to plain local names only")
            name = target.id
            if name in self.params:
                raise self.err(s, f"assignment to parameter {name!r}", "use a new local name")
            value = self.expr(s.value)
            if isinstance(s, ast.AugAssign):
                if name not in self.locals:
                    raise self.err(s, f"{name!r} is updated before it is assigned")
                op = _BINOPS.get(type(s.op))
                value = make_binary(op, ScalarRef(name, self.locals[name]), value)
            if name not in self.locals:
                dt = value.dtype
                if isinstance(value, Const) and value.weak:
                    dt = self.result if self.result.is_float or not dt.is_float else ir.f64
                self.locals[name] = ir.f64 if dt == ir.boolean else dt
            return ir.FAssign(name, cast_to(value, self.locals[name]), line)
        if isinstance(s, ast.If):
            return ir.FIf(self.expr(s.test), self.block(s.body), self.block(s.orelse), line)
        if isinstance(s, ast.Pass):
            return ir.FIf(Const(1, ir.boolean), (), (), line)
        raise self.unsupported(s)

    def unsupported(self, s):
        if type(s) in _UNSUPPORTED_STMT:
            msg, hint = _UNSUPPORTED_STMT[type(s)]
            return self.err(s, msg.replace("kernels", "device functions"), hint)
        if isinstance(s, ast.For):
            return self.err(s, "loops are not supported in device functions",
                            "put the loop in the kernel")
        return self.err(s, f"{type(s).__name__} statements are not supported in device functions")


def _always_returns(body: tuple) -> bool:
    for st in body:
        if isinstance(st, ir.FReturn):
            return True
        if isinstance(st, ir.FIf) and st.orelse and _always_returns(st.then) \
                and _always_returns(st.orelse):
            return True
    return False


def parse_func(fn) -> tuple[ir.FuncDef, tuple[ir.FuncDef, ...]]:
    """Parse a ``@pa.func`` device function: its FuncDef and the device functions it calls."""
    src = _Source.of(fn)
    p = _FuncParser(fn, src, _namespace(fn))
    fdef = p.parse()
    return fdef, tuple(p.funcs.values())


# --------------------------------------------------------------------------
# kernels
# --------------------------------------------------------------------------


class _KernelParser(_ExprParser, KernelBuilder):
    def __init__(self, fn, src: _Source, ns: dict[str, Any]):
        _ExprParser.__init__(self, src, ns)
        KernelBuilder.__init__(self)
        self.fn = fn

    # ---- names --------------------------------------------------------
    def taken_names(self) -> set[str]:
        return super().taken_names() | set(self.ns)

    def name_expr(self, node: ast.Name) -> Expr:
        n = node.id
        if n in self.loop_vars():
            return LoopVar(n)
        if n in self.arrays:
            raise self.err(node, f"array {n!r} used without an index",
                           "kernels work element by element: index the array, e.g. x[i]")
        if n in self.scalars:
            if not self.scalars[n].is_float:
                self.int_params.add(n)
            return ScalarRef(n, self.scalars[n])
        if n in self.locals:
            return ScalarRef(n, self.locals[n])
        if n == self.fn.__name__:
            raise self.err(node, f"recursive use of kernel {n!r}", "kernels cannot recurse")
        if n not in self.ns:
            known = [*self.ns, *self.arrays, *self.scalars, *self.locals, *self.loop_vars()]
            raise self.err(node, f"unknown name {n!r}{did_you_mean(n, known)}",
                           "define it before use, pass it as a parameter, or fix the spelling")
        return self.global_constant(node, self.ns[n])

    def x_Attribute(self, node):
        return self.global_constant(node, self.global_value(node))

    def global_constant(self, node, value) -> Expr:
        """A module-level value used in the kernel body (``N``, ``dsl.N``, ``2.5``): a size
        becomes its expression and is a size of the kernel (also when only a loop bound
        uses it), anything else a constant."""
        if isinstance(value, ir.Size):
            for e in ir.walk(value.expr):
                if isinstance(e, SizeVar):
                    self.sizes[e.name] = None
            return value.expr
        return self.constant(node, value)

    def array_query(self, node) -> None:
        """``len(x)``, ``x.shape[d]``, ``x.shape``, ``x.size``, ``x.ndim`` on an array: the
        kernel's sizes are the way to say these; name the one that fits."""
        if isinstance(node, ast.Subscript):
            base, dim = node.value, node.slice
        else:
            base, dim = node, None
        if (isinstance(base, ast.Call) and isinstance(base.func, ast.Name)
                and base.func.id == "len" and len(base.args) == 1):
            arr, what, dim = base.args[0], f"len({ast.unparse(base.args[0])})", ast.Constant(0)
        elif isinstance(base, ast.Attribute) and base.attr in ("shape", "size", "ndim"):
            arr, what = base.value, ast.unparse(node)
        else:
            return
        if not isinstance(arr, ast.Name) or arr.id not in self.arrays:
            return
        at = self.arrays[arr.id]
        extents = [ir.expr_str(e) for e in at.shape]
        if isinstance(dim, ast.Constant) and isinstance(dim.value, int) and \
                -at.ndim <= dim.value < at.ndim:
            hint = f"use the size it stands for: {what} is {extents[dim.value]} here"
        elif base is node and base.attr == "ndim":
            hint = f"{arr.id} has {at.ndim} dimension(s)"
        else:
            hint = f"use the sizes: {arr.id} is declared {at!r}, shape ({', '.join(extents)})"
        raise self.err(node, f"{what} is not available in kernels (array shapes are the "
                             f"kernel's sizes)", hint)

    def subscript_expr(self, node: ast.Subscript) -> Expr:
        self.array_query(node)
        if not isinstance(node.value, ast.Name) or node.value.id not in self.arrays:
            base = ast.unparse(node.value)
            raise self.err(node, f"{base!r} is not an array of this kernel"
                                 f"{did_you_mean(base, self.arrays)}",
                           "only parameter arrays and pa.zeros/pa.empty temporaries can be indexed")
        name = node.value.id
        at = self.arrays[name]
        idx_nodes = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if any(isinstance(i, ast.Slice) for i in idx_nodes):
            raise self.err(node, "slices are not supported in kernels", "write a loop over the elements")
        if len(idx_nodes) != at.ndim:
            raise self.err(node, f"array {name!r} has {at.ndim} dimension(s) but is indexed "
                                 f"with {len(idx_nodes)}",
                           f"write {name}[{', '.join('i%d' % k for k in range(at.ndim))}]")
        idx = []
        ip = frozenset(self.int_params | {s for s, d in self.scalars.items() if not d.is_float})
        for i_node in idx_nodes:
            e = self.expr(i_node)
            if e.dtype.is_float:
                raise self.err(i_node, f"index {ast.unparse(i_node)!r} of {name!r} is a float",
                               "indices must be integer affine expressions of loop variables and sizes")
            if not is_affine(e, ip):
                raise self.err(i_node, f"index {ast.unparse(i_node)!r} of {name!r} is not affine",
                               "indices must be affine in loop variables, sizes and integer "
                               "parameters (like 2*i + 1, i // 2, (i + 1) % 4); indices read "
                               "from arrays are not supported")
            for x in ir.walk(e):
                if isinstance(x, ScalarRef):
                    self.int_params.add(x.name)
            idx.append(cast_to(e, ir.i64))
        return Load(name, tuple(idx), at.dtype)

    # ---- signature ----------------------------------------------------
    def signature(self):
        fdef = self.src.tree
        args = fdef.args
        if args.vararg or args.kwarg or args.kwonlyargs or args.posonlyargs:
            raise self.err(fdef, "kernels take plain positional parameters only")
        for a in args.args:
            ann = _resolve_annotation(self.fn, a.arg, self.ns, self.src, a)
            if isinstance(ann, ir.Out):
                self.arrays[a.arg] = ann.type
                self.params.append(ir.Param(a.arg, ann.type, "out"))
            elif isinstance(ann, ir.ArrayType):
                self.arrays[a.arg] = ann
                self.params.append(ir.Param(a.arg, ann, "in"))
            elif isinstance(ann, DType):
                self.scalars[a.arg] = ann
                self.params.append(ir.Param(a.arg, ann, "in"))
            else:
                raise self.err(a, f"parameter {a.arg!r} needs a polyad type annotation",
                               "annotate it, e.g. x: pa.f64[N], y: pa.Out(pa.f64[N]), lam: pa.f64")
            if isinstance(ann, (ir.Out, ir.ArrayType)):
                for ext in (ann.type if isinstance(ann, ir.Out) else ann).shape:
                    for e in ir.walk(ext):
                        if isinstance(e, SizeVar):
                            self.sizes[e.name] = None
        self.choose_default_float()
        ret = _resolve_annotation(self.fn, "return", self.ns, self.src, fdef)
        self.return_type = None
        if ret is not inspect.Parameter.empty and ret is not None:
            if not isinstance(ret, DType):
                raise self.err(fdef, "a kernel returns a scalar (-> pa.f64) or nothing",
                               "write results into pa.Out(...) array parameters")
            self.return_type = ret

    # ---- statements ---------------------------------------------------
    def emit(self, node, target, op, value: Expr):
        self.check_fits(node, value)
        try:
            value = cast_to(value, target.dtype)
        except OverflowError:
            raise self.err(node, f"the constant {value.value} does not fit in "
                                 f"{target.dtype.np_name}", "use a smaller constant") from None
        if isinstance(value, Const) and not value.dtype.is_float:
            self.check_fits(node, value, value.dtype)
        self.emit_statement(target, op, value, self.src.line(node), self.src.segment(node))

    def block(self, stmts):
        for s in stmts:
            self.stmt(s)

    def stmt(self, s):
        m = getattr(self, "s_" + type(s).__name__, None)
        if m is None:
            if type(s) in _UNSUPPORTED_STMT:
                msg, hint = _UNSUPPORTED_STMT[type(s)]
                raise self.err(s, msg, hint)
            raise self.err(s, f"{type(s).__name__} statements are not supported in kernels")
        m(s)

    def s_Pass(self, s):
        pass

    def s_Expr(self, s):
        if isinstance(s.value, ast.Constant) and isinstance(s.value.value, str):
            return  # docstring
        if self.kernel_call(s, s.value, None):
            return
        call = s.value
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and \
                call.func.id == "print":
            raise self.err(s, "print() is not supported in kernels (they run as compiled C)",
                           "write the value into a pa.Out array (or return it) and print it "
                           "after the call")
        raise self.err(s, "an expression statement has no effect in a kernel",
                       "assign the value to an array element or a local")

    def temp_decl(self, s, name, call: ast.Call) -> bool:
        f = self.global_value(call.func) if isinstance(call.func, (ast.Name, ast.Attribute)) else None
        kind = getattr(f, "__polyad_alloc__", None)
        if kind is None:
            return False
        if self.scope.loops or self.scope.conditions or self.scope.guard is not None:
            raise self.err(s, "temporary arrays must be created at the top level of the kernel",
                           "move the pa.zeros/pa.empty call before the loops")
        if len(call.args) != 1 or call.keywords:
            raise self.err(call, f"pa.{kind}() takes one array type, e.g. pa.{kind}(pa.f64[M, N])")
        try:
            at = eval(compile(ast.Expression(call.args[0]), self.src.filename, "eval"), self.ns)
        except Exception as exc:
            raise self.err(call.args[0], f"cannot evaluate the array type of pa.{kind}(): {exc}")
        if not isinstance(at, ir.ArrayType):
            raise self.err(call, f"pa.{kind}() takes an array type such as pa.f64[M, N]")
        if name in self.arrays or name in self.scalars or name in self.locals:
            raise self.err(s, f"{name!r} is already defined", "use a new name for the temporary")
        for ext in at.shape:
            for e in ir.walk(ext):
                if isinstance(e, SizeVar):
                    self.sizes[e.name] = None
        self.arrays[name] = at
        self.temps.append(ir.Temp(name, at, kind == "zeros"))
        return True

    def s_Assign(self, s):
        if len(s.targets) != 1 or isinstance(s.targets[0], ast.Tuple):
            raise self.err(s, "multiple assignment targets are not supported",
                           "assign one target per statement")
        target = s.targets[0]
        if isinstance(target, ast.Name) and isinstance(s.value, ast.Call) \
                and (self.temp_decl(s, target.id, s.value)
                     or self.kernel_call(s, s.value, target)):
            return
        self.assign(s, target, "=", s.value)

    # ---- kernels calling kernels: inlined, so every later stage sees one kernel ----
    def kernel_call(self, s, call, result_target) -> bool:
        if not isinstance(call, ast.Call) or not isinstance(call.func, (ast.Name, ast.Attribute)):
            return False
        callee = getattr(self.global_value(call.func), "__polyad_kernel__", None)
        if callee is None:
            return False
        name = callee.name
        if call.keywords or len(call.args) != len(callee.params):
            raise self.err(call, f"kernel {name}() takes {len(callee.params)} positional "
                                 f"arguments, got {len(call.args)}",
                           "inside a kernel every parameter, pa.Out arrays included, is passed")
        args = []
        for p, a in zip(callee.params, call.args):
            if p.is_array:
                if not isinstance(a, ast.Name) or a.id not in self.arrays:
                    raise self.err(a, f"argument {p.name!r} of {name}() must be an array of "
                                      f"this kernel")
                args.append((a, a.id))
            else:
                args.append((a, self.expr(a)))
        arrays, values, sizes = self.bind_kernel_args(call, callee, args)
        result = self.inline_kernel(call, callee, arrays, values, sizes)
        if result_target is not None:
            if result is None:
                raise self.err(call, f"kernel {name}() returns nothing")
            self.assign_value(s, result_target, result)
        return True

    def s_AnnAssign(self, s):
        if s.value is None:
            raise self.err(s, "a declaration without value is not supported", "assign a value")
        self.assign(s, s.target, "=", s.value)

    def s_AugAssign(self, s):
        op = _AUGOPS.get(type(s.op))
        if op is None:
            raise self.err(s, f"augmented assignment {type(s.op).__name__} is not supported",
                           "use =, +=, -=, *= or /=")
        self.assign(s, s.target, op, s.value)

    def assign(self, s, target_node, op, value_node):
        self.assign_value(s, target_node, self.expr(value_node), op)

    def assign_value(self, s, target_node, value: Expr, op: str = "="):
        if isinstance(target_node, ast.Subscript):
            target = self.subscript_expr(target_node)
            self.written.add(target.array)
            if op != "=":
                self.read.add(target.array)
        elif isinstance(target_node, ast.Name):
            name = target_node.id
            if name in self.loop_vars():
                raise self.err(target_node, f"assignment to loop variable {name!r}",
                               "loop variables are read-only; use a new local name")
            if name in self.arrays:
                raise self.err(target_node, f"assignment to array {name!r} without an index",
                               f"assign elements: {name}[i] = ...")
            if name in self.scalars:
                raise self.err(target_node, f"assignment to scalar parameter {name!r}",
                               "parameters are read-only; use a new local name")
            if name not in self.locals:
                if op != "=":
                    raise self.err(target_node, f"{name!r} is updated before it is assigned",
                                   f"initialise it first, e.g. {name} = 0.0")
                if isinstance(self.ns.get(name), ir.Size):
                    raise self.err(target_node, f"assignment to size {name!r}")
                dt = value.dtype
                if isinstance(value, Const) and value.weak or dt == ir.boolean:
                    dt = self.default_float
                self.locals[name] = dt
            target = ScalarRef(name, self.locals[name])
        else:
            raise self.err(target_node, "assignment target must be an array element or a name")
        self.emit(s, target, op, value)

    def s_For(self, s):
        if s.orelse:
            raise self.err(s, "for-else is not supported in kernels")
        if not isinstance(s.target, ast.Name):
            raise self.err(s.target, "the loop variable must be a plain name")
        var = s.target.id
        it = s.iter
        if not (isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "range"
                and self.ns.get("range") is range):
            raise self.err(it, "kernel loops must iterate over range(...)",
                           "write 'for i in range(lo, hi[, step])' with affine bounds")
        if it.keywords or not 1 <= len(it.args) <= 3:
            raise self.err(it, "range() takes 1 to 3 positional arguments")
        if var in self.loop_vars() or var in self.arrays or var in self.scalars or var in self.locals:
            raise self.err(s.target, f"loop variable {var!r} shadows another name",
                           "use a fresh name for the loop variable")
        if var in self.sizes or isinstance(self.ns.get(var), ir.Size):
            raise self.err(s.target, f"loop variable {var!r} shadows the size {var!r}",
                           "use a fresh name for the loop variable (sizes are symbols of the "
                           "whole kernel)")
        args = [self.expr(a) for a in it.args]
        for a, a_node in zip(args, it.args):
            self.check_fits(a_node, a)
        ip = frozenset(n for n, d in self.scalars.items() if not d.is_float)
        for a, a_node in zip(args, it.args):
            if a.dtype.is_float or not is_affine(a, ip):
                raise self.err(a_node, f"loop bound {ast.unparse(a_node)!r} is not affine",
                               "loop bounds must be affine in sizes, integer parameters and "
                               "enclosing loop variables")
            for x in ir.walk(a):
                if isinstance(x, ScalarRef):
                    self.int_params.add(x.name)
        if len(args) == 1:
            lo, hi, step = Const(0, ir.i64), args[0], 1
        else:
            lo, hi = args[0], args[1]
            step = 1
            if len(args) == 3:
                if not is_constant(args[2]) or const_value(args[2]) == 0:
                    raise self.err(it.args[2], "the loop step must be a nonzero integer constant")
                step = const_value(args[2])
        lo, hi = cast_to(lo, ir.i64), cast_to(hi, ir.i64)
        outer = self.enter_loop(Loop(var, lo, hi, step))
        try:
            self.block(s.body)
        finally:
            self.leave_loop(outer)

    def s_If(self, s):
        cond = self.expr(s.test)
        self.check_fits(s.test, cond)
        ip = frozenset(n for n, d in self.scalars.items() if not d.is_float)
        outer = self.scope
        affine = is_affine_condition(cond, ip)
        if affine:
            for x in ir.walk(cond):
                if isinstance(x, ScalarRef):
                    self.int_params.add(x.name)
        else:
            cond = self.condition_once(cond, _written_names(s.body + s.orelse),
                                       self.src.line(s), "if " + self.src.segment(s.test))
        branches = [(s.body, True), (s.orelse, False)]
        for body, positive in branches:
            if not body:
                continue
            self.scope = self.branch_scope(cond, positive, affine)
            try:
                self.block(body)
            finally:
                self.scope = outer

    def s_Return(self, s):
        if self.scope.loops or self.scope.conditions or self.scope.guard is not None:
            raise self.err(s, "'return' is only allowed at the end of the kernel, outside loops "
                              "and conditions",
                           "accumulate into a local and return it after the loops")
        if self.return_type is None:
            raise self.err(s, "the kernel returns a value but has no return annotation",
                           "annotate the result type, e.g. def k(...) -> pa.f64:")
        if s.value is None:
            raise self.err(s, "a kernel with a return annotation must return a value")
        value = self.expr(s.value)
        if isinstance(value, ScalarRef) and value.name in self.locals:
            name = value.name
        else:
            name = "result"
            while name in self.locals or name in self.scalars or name in self.arrays:
                name = "_" + name
            self.locals[name] = self.return_type
            self.emit(s, ScalarRef(name, self.return_type), "=", value)
        self.result = (name, self.return_type)

    def parse(self) -> ir.Kernel:
        self.signature()
        body = self.src.tree.body
        for k, s in enumerate(body):
            if isinstance(s, ast.Return) and k != len(body) - 1:
                raise self.err(body[k + 1], "statements after 'return' are never executed",
                               "remove them or move the return to the end")
            self.stmt(s)
        if self.return_type is not None and self.result is None:
            raise self.err(self.src.tree, "the kernel has a return annotation but no 'return'",
                           "return the accumulated value at the end of the kernel")
        return self.build_kernel(self.src.tree.name, self.src.filename,
                                 self.src.line(self.src.tree))


def parse_kernel(fn) -> ir.Kernel:
    """Parse a ``@pa.kernel`` Python function into an ``ir.Kernel`` (raises DSLError)."""
    src = _Source.of(fn)
    return _KernelParser(fn, src, _namespace(fn)).parse()


def _written_names(statements: list) -> set:
    """The names the Python statements may write: assignment targets (the array of an
    element), and the arguments of calls made as statements or assigned as a whole
    (``v = k(x, y)``: a called kernel may write its arrays; a call inside an expression
    computes a value)."""
    out = set()
    for node in (n for st in statements for n in ast.walk(st)):
        if isinstance(node, ast.Assign):
            targets = list(node.targets) + (
                list(node.value.args) if isinstance(node.value, ast.Call) else [])
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            targets = list(node.value.args) + [kw.value for kw in node.value.keywords]
        else:
            continue
        while targets:
            t = targets.pop()
            while isinstance(t, ast.Subscript):
                t = t.value
            if isinstance(t, ast.Name):
                out.add(t.id)
            elif isinstance(t, (ast.Tuple, ast.List)):
                targets += t.elts
    return out
