"""C subset -> IR (the second frontend, next to the Python DSL).

``parse_c(source, name, sizes=...)`` preprocesses C text with the system
``cc -E`` (polyad's stand-in system headers in ``c_include/``, since
pycparser cannot parse glibc's), parses it with pycparser and turns function
``name`` into the same ``ir.Kernel`` the Python DSL produces, through the
shared builder of ``frontend.common``:

* parameters: scalars (``double``, ``float``, ``int``, ``long``), arrays with
  extents (``double A[N][M]``, C99 VLA parameters ``int n, double A[n][n]``),
  pointers whose extents a ``/* polyad: x[n] */`` comment gives. An ``int``
  parameter used in an array extent is a *size* (inferred from the arrays
  when the kernel is called); a macro named in ``sizes`` stays symbolic.
* body: ``for`` loops with affine bounds (``< <= > >=``, ``++ -- += -=``),
  ``if``/``else``, ``?:``, scalar locals and local arrays, ``= += -= *= /=``,
  ``x++``, casts, math.h functions (mapped to the intrinsic registry, float
  and double spellings), ``return`` of a scalar at the end; calls of other
  functions of the file: loop functions are inlined like kernel calls,
  scalar functions become device functions.
* boundary modes from exact C idioms: ``A[min(max(e, 0), n - 1)]`` (with
  ``?:``, macros or helper functions spelling min/max) reads ``A`` clamped,
  ``A[(e + n) % n]`` reads it circular; ``/* polyad: A mirror */`` sets a
  mode explicitly.

Anything else raises ``DSLError`` with ``file.c:LINE:COL`` (column 0-based, as
every DSLError), the construct and a hint. C semantics kept on purpose:
``int / int`` truncates, literals are typed as in C (``2.0`` is double,
``2.0f`` float, ``2`` int), arithmetic follows the usual conversions.
Integer ``/`` and ``%`` inside indices and loop bounds are floor division (what
ISL models); they agree with C wherever the dividend is non-negative.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

from pycparser import c_ast, c_generator, c_parser
from pycparser.c_parser import ParseError

from .. import ir
from ..errors import DSLError
from ..ir import (Binary, Call, Const, DType, Expr, Load, Loop, LoopVar, ScalarRef, Select,
                  SizeVar, Unary)
from .common import (KernelBuilder, cast_to, const_value, intrinsic_arity_error, is_affine,
                     is_affine_condition, is_constant, typed_intrinsic)

INCLUDE_DIR = Path(__file__).resolve().parent / "c_include"
_SIZE_PREFIX = "__polyad_size_"

_C_TYPES = {
    ("double",): ir.f64, ("float",): ir.f32,
    ("int",): ir.i32, ("signed", "int"): ir.i32, ("int32_t",): ir.i32,
    ("long",): ir.i64, ("long", "int"): ir.i64, ("long", "long"): ir.i64,
    ("long", "long", "int"): ir.i64, ("int64_t",): ir.i64, ("size_t",): ir.i64,
    ("ptrdiff_t",): ir.i64,
}

# math.h spellings -> (intrinsic, the type C computes it in; None = the argument's)
_MATH: dict[str, tuple[str, Optional[DType]]] = {}
for _name in ("exp", "exp2", "log", "log2", "log10", "sin", "cos", "tan", "sinh", "cosh",
              "tanh", "asin", "acos", "atan", "asinh", "acosh", "atanh", "sqrt", "erf",
              "erfc", "floor", "ceil", "pow", "atan2"):
    _MATH[_name] = (_name, ir.f64)
    _MATH[_name + "f"] = (_name, ir.f32)
_MATH.update({"fabs": ("abs", ir.f64), "fabsf": ("abs", ir.f32), "fmin": ("min", ir.f64),
              "fminf": ("min", ir.f32), "fmax": ("max", ir.f64), "fmaxf": ("max", ir.f32),
              "abs": ("abs", ir.i32), "labs": ("abs", ir.i64)})

_ASSIGN_OPS = {"=": "=", "+=": "+=", "-=": "-=", "*=": "*=", "/=": "/="}
_COMPARE = {"<", "<=", ">", ">=", "==", "!="}

_UNSUPPORTED = {
    c_ast.While: ("'while' loops are not supported",
                  "write a 'for' loop with affine bounds, e.g. for (i = 0; i < n; i++)"),
    c_ast.DoWhile: ("'do ... while' loops are not supported",
                    "write a 'for' loop with affine bounds"),
    c_ast.Goto: ("'goto' is not supported", "structure the code with for/if"),
    c_ast.Label: ("labels are not supported", "structure the code with for/if"),
    c_ast.Break: ("'break' is not supported",
                  "express the early exit as a loop bound or an if-condition"),
    c_ast.Continue: ("'continue' is not supported",
                     "wrap the rest of the loop body in an if-statement instead"),
    c_ast.Switch: ("'switch' is not supported", "use if/else"),
}


# --------------------------------------------------------------------------
# preprocessing and parsing
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class CUnit:
    """A parsed C file: its AST, file name, functions and ``polyad:`` annotations."""

    ast: c_ast.FileAST
    filename: str
    functions: dict
    annotations: dict
    sizes: dict


_ANNOTATION = re.compile(r"/\*\s*polyad:(.*?)\*/", re.S)
_ANNOTATION_ITEM = re.compile(r"^\s*([A-Za-z_]\w*)\s*((?:\[[^\]]*\])*)\s*([A-Za-z_]*)\s*$")


def _annotations(text: str, filename: str) -> dict:
    """``/* polyad: A[n][m] clamped; x[n] */`` -> {name: (extents text or None, mode or None)}."""
    out = {}
    for m in _ANNOTATION.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        for item in m.group(1).split(";"):
            if not item.strip():
                continue
            im = _ANNOTATION_ITEM.match(item)
            mode = im.group(3) if im else ""
            if im is None or mode and mode not in ir.BOUNDARY_MODES:
                raise DSLError(f"cannot read the polyad annotation {item.strip()!r}", filename,
                               line, 0, "write '/* polyad: NAME[extent]... [mode] */' with mode "
                                        f"one of {', '.join(ir.BOUNDARY_MODES)}")
            dims = re.findall(r"\[([^\]]*)\]", im.group(2)) or None
            out[im.group(1)] = (dims, mode or None, line)
    return out


def _blank_defines(text: str, names) -> str:
    """Remove ``#define NAME`` of the macros that stay symbolic (keeping line numbers)."""
    if not names:
        return text
    pat = re.compile(r"^\s*#\s*(define|undef)\s+(%s)\b" % "|".join(map(re.escape, names)))
    lines = text.split("\n")
    k = 0
    while k < len(lines):
        if pat.match(lines[k]):
            while lines[k].rstrip().endswith("\\") and k + 1 < len(lines):
                lines[k] = ""
                k += 1
            lines[k] = ""
        k += 1
    return "\n".join(lines)


def preprocess(text: str, filename: str, defines: dict) -> str:
    """``cc -E`` of ``text`` with polyad's stand-in system headers; ``defines``: name -> text."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise DSLError("no C compiler found to preprocess the C source", filename,
                       hint="install gcc or set $CC")
    cmd = [cc, "-E", "-nostdinc", "-I", str(INCLUDE_DIR), "-x", "c", "-std=c99"]
    if filename and not filename.startswith("<"):
        cmd += ["-I", str(Path(filename).resolve().parent)]
    cmd += [f"-D{k}={v}" for k, v in defines.items()] + ["-"]
    proc = subprocess.run(cmd, input=text, capture_output=True, text=True)
    if proc.returncode != 0:
        msg = proc.stderr.replace("<stdin>", filename).strip()
        m = re.search(r":(\d+):(\d+): (?:fatal )?error: (.*)", msg)
        line, col = (int(m.group(1)), int(m.group(2)) - 1) if m else (0, 0)
        hint = "kernels may include math.h, stdlib.h, stdint.h, stddef.h, stdbool.h and " \
               "headers next to the file"
        raise DSLError(f"the C preprocessor failed: {m.group(3) if m else msg}", filename,
                       line, col, hint)
    return proc.stdout


def parse_unit(text: str, filename: str = "<c-source>", sizes: Optional[dict] = None) -> CUnit:
    """Preprocess and parse C ``text``; ``sizes`` maps macros (or int parameters) that
    stay symbolic to size names."""
    sizes = dict(sizes or {})
    for k, v in sizes.items():
        if not (isinstance(k, str) and k.isidentifier() and isinstance(v, str)
                and v.isidentifier()):
            raise ValueError(f"sizes maps C names to size names (identifiers), got {k!r}: {v!r}")
    annotations = _annotations(text, filename)
    # a name #defined (or tested) in the file is a macro; any other is an int parameter
    macros = [k for k in sizes
              if re.search(r"^\s*#\s*(define|ifndef|ifdef)\s+%s\b" % re.escape(k), text, re.M)]
    source = _blank_defines(text, macros)
    pre = preprocess(source, filename, {k: _SIZE_PREFIX + k for k in macros})
    parser = c_parser.CParser()
    try:
        tree = parser.parse(pre, filename)
    except ParseError as exc:
        raise _syntax_error(exc, parser, filename) from None
    functions = {ext.decl.name: ext for ext in tree.ext if isinstance(ext, c_ast.FuncDef)}
    params = {p.name for f in functions.values() for p in (f.decl.type.args.params
                                                            if f.decl.type.args else [])
              if isinstance(p, c_ast.Decl)}
    unknown = [k for k in sizes if k not in macros and k not in params]
    if unknown:
        raise DSLError(f"sizes= names {', '.join(map(repr, unknown))}, which is neither "
                       f"#defined in {filename} nor a parameter of its functions", filename,
                       hint="sizes maps #define'd macros (or int parameters) to size names, "
                            "e.g. sizes={'N': 'n'}")
    return CUnit(tree, filename, functions, annotations, sizes)


def _syntax_error(exc: ParseError, parser, filename: str) -> DSLError:
    hint = "polyad parses C99 (no GNU extensions); check the line"
    m = re.match(r"(.*?):(\d+):(\d+): (.*)", str(exc), re.S)
    if m is not None:
        return DSLError(f"C syntax error: {m.group(4)}", _file_name(m.group(1), filename),
                        int(m.group(2)), max(int(m.group(3)) - 1, 0), hint)
    message = str(exc).split(": ", 1)[-1]
    try:  # some pycparser errors carry no position: the token where parsing stopped has one
        coord = parser._tok_coord(parser._peek())
        return DSLError(f"C syntax error: {message}", _file(coord, filename), coord.line,
                        max(coord.column - 1, 0), hint)
    except Exception:
        return DSLError(f"C syntax error: {message}", filename, hint=hint)


def _file_name(name: str, filename: str) -> str:
    return filename if not name or name == "<stdin>" else name


def _file(coord, filename: str) -> str:
    f = getattr(coord, "file", None)
    return filename if not f or f == "<stdin>" else f


def _generate(node) -> str:
    text = c_generator.CGenerator().visit(node)
    return " ".join(text.split()).rstrip(";")


def _base_type(node, unit: CUnit, err) -> DType:
    """The element DType of a type node (TypeDecl / ArrayDecl / PtrDecl chain)."""
    while not isinstance(node, c_ast.TypeDecl):
        node = node.type
    t = node.type
    if not isinstance(t, c_ast.IdentifierType):
        raise err(node, f"type {_generate(t)!r} is not supported",
                  "use double, float, int or long")
    names = tuple(n for n in t.names if n not in ("signed",) or len(t.names) == 1)
    dt = _C_TYPES.get(tuple(t.names)) or _C_TYPES.get(names)
    if dt is None:
        hint = "use double, float, int or long"
        if "unsigned" in t.names:
            hint = "unsigned integers are not supported: use int or long"
        raise err(node, f"type {' '.join(t.names)!r} is not supported", hint)
    return dt


# --------------------------------------------------------------------------
# functions of the unit
# --------------------------------------------------------------------------


def _has_loops_or_arrays(fdef: c_ast.FuncDef) -> bool:
    class V(c_ast.NodeVisitor):
        found = False

        def visit_For(self, node):
            self.found = True

        def visit_ArrayRef(self, node):
            self.found = True

    v = V()
    v.visit(fdef.body)
    params = fdef.decl.type.args.params if fdef.decl.type.args else []
    return v.found or any(isinstance(p.type, (c_ast.ArrayDecl, c_ast.PtrDecl)) for p in params
                          if isinstance(p, c_ast.Decl))


class _CParserBase:
    """Error reporting and expression conversion shared by kernels and device functions."""

    def __init__(self, unit: CUnit, fdef: c_ast.FuncDef, stack: tuple):
        self.unit = unit
        self.fdef = fdef
        self.stack = stack + (fdef.decl.name,)
        self.funcs: dict[str, ir.FuncDef] = {}
        self.affine_ctx = False

    def err(self, node, message: str, hint: str = "") -> DSLError:
        coord = getattr(node, "coord", None)
        line = getattr(coord, "line", 0) or 0
        col = max((getattr(coord, "column", 1) or 1) - 1, 0)
        return DSLError(message, _file(coord, self.unit.filename), line, col, hint)

    def line(self, node) -> int:
        return getattr(getattr(node, "coord", None), "line", 0) or 0

    # ---- names (overridden) ---------------------------------------------
    def name_expr(self, node: c_ast.ID) -> Expr:
        raise NotImplementedError

    def array_ref(self, node: c_ast.ArrayRef) -> Expr:
        raise self.err(node, "array indexing is not allowed here",
                       "device functions work on scalars")

    # ---- expressions ----------------------------------------------------
    def expr(self, node) -> Expr:
        m = getattr(self, "x_" + type(node).__name__, None)
        if m is None:
            raise self.err(node, f"C {type(node).__name__} expressions are not supported "
                                 f"({_generate(node)!r})",
                           "kernels use arithmetic, comparisons, ?:, casts, math.h functions "
                           "and functions of the same file")
        return m(node)

    def x_ID(self, node):
        if node.name.startswith(_SIZE_PREFIX):
            return self.size_expr(node, node.name[len(_SIZE_PREFIX):])
        return self.name_expr(node)

    def size_expr(self, node, macro: str) -> Expr:
        return SizeVar(self.unit.sizes[macro])

    def x_Constant(self, node):
        text = node.value.lower()
        try:
            if node.type in ("int", "long int", "long long int", "unsigned int",
                             "unsigned long int", "unsigned long long int"):
                digits = text.rstrip("ul")
                value = int(digits, 0) if not re.fullmatch(r"0[0-7]+", digits) else int(digits, 8)
                return Const(value, ir.i64 if "l" in text or value >= 2**31 else ir.i32)
            if node.type in ("double", "float", "long double"):
                if text.endswith("f"):
                    return Const(float(text[:-1]), ir.f32)
                return Const(float(text.rstrip("l")), ir.f64)
        except ValueError:
            pass
        raise self.err(node, f"the constant {node.value} ({node.type}) is not supported",
                       "kernels use int and floating-point numbers")

    def x_UnaryOp(self, node):
        op = node.op
        if op in ("p++", "p--", "++", "--"):
            raise self.err(node, f"'{op.lstrip('p')}' inside an expression is not supported",
                           "write the increment as a statement of its own")
        if op == "&":
            raise self.err(node, "taking an address ('&') is not supported",
                           "kernels work on array elements and scalars, not pointers")
        if op == "*":
            raise self.err(node, "pointer dereference ('*p') is not supported",
                           "index the array instead: p[i]")
        if op == "sizeof":
            raise self.err(node, "sizeof is not supported", "use the array extents")
        a = self.expr(node.expr)
        if op == "-":
            if isinstance(a, Const):
                return Const(-a.value, a.dtype)
            return Unary("neg", a, a.dtype)
        if op == "+":
            return a
        if op == "!":
            return Unary("not", a, ir.boolean)
        raise self.err(node, f"operator {op!r} is not supported",
                       "bitwise operators have no meaning for polyad's analyses")

    def x_BinaryOp(self, node):
        op = node.op
        if op in ("&&", "||"):
            return Binary("and" if op == "&&" else "or", self.expr(node.left),
                          self.expr(node.right), ir.boolean)
        if op not in ("+", "-", "*", "/", "%") and op not in _COMPARE:
            raise self.err(node, f"operator {op!r} is not supported",
                           "use + - * / % and comparisons; bitwise operators are not supported")
        return self.c_binary(node, op, self.expr(node.left), self.expr(node.right))

    def c_binary(self, node, op: str, a: Expr, b: Expr) -> Expr:
        """``a op b`` with C's usual arithmetic conversions and integer division."""
        dt = _c_promote(a.dtype, b.dtype)
        if op in _COMPARE:
            return Binary(op, cast_to(a, dt), cast_to(b, dt), ir.boolean)
        a, b = cast_to(a, dt), cast_to(b, dt)
        if op == "%" and dt.is_float:
            raise self.err(node, "'%' of floating-point values is not supported",
                           "use integer operands")
        if op in ("/", "%") and not dt.is_float:
            return self.int_division(node, op, a, b, dt)
        if isinstance(a, Const) and isinstance(b, Const) and op in ("+", "-", "*"):
            val = {"+": a.value + b.value, "-": a.value - b.value, "*": a.value * b.value}[op]
            return Const(val, dt)
        return Binary(op, a, b, dt)

    def int_division(self, node, op, a: Expr, b: Expr, dt: DType) -> Expr:
        """C's truncating ``/`` and ``%``: floor division where they agree (non-negative
        dividend, positive constant divisor) or where ISL needs it (indices, bounds)."""
        floor_op = "//" if op == "/" else "%"
        positive = is_constant(b) and const_value(b) > 0
        if self.affine_ctx or positive and self.nonnegative(a):
            return Binary(floor_op, a, b, dt)
        if is_constant(b) and const_value(b) == 0:
            raise self.err(node, "integer division by zero")
        q = Binary("//", a, b, dt)
        inexact = Binary("!=", Binary("%", a, b, dt), Const(0, dt), ir.boolean)
        signs = Binary("!=", Binary("<", a, Const(0, dt), ir.boolean),
                       Binary("<", b, Const(0, dt), ir.boolean), ir.boolean)
        trunc = Select(Binary("and", inexact, signs, ir.boolean),
                       Binary("+", q, Const(1, dt), dt), q, dt)
        if op == "/":
            return trunc
        return Binary("-", a, Binary("*", b, trunc, dt), dt)

    def nonnegative(self, e: Expr) -> bool:
        """Provably >= 0 (constants, sizes, products and sums of such)."""
        if isinstance(e, Const):
            return e.value >= 0
        if isinstance(e, SizeVar):
            return True
        if isinstance(e, ir.Cast):
            return self.nonnegative(e.a)
        if isinstance(e, Binary) and e.op in ("+", "*", "//", "%"):
            return self.nonnegative(e.a) and self.nonnegative(e.b)
        return False

    def x_TernaryOp(self, node):
        cond = self.expr(node.cond)
        a, b = self.expr(node.iftrue), self.expr(node.iffalse)
        dt = _c_promote(a.dtype, b.dtype)
        return Select(cond, cast_to(a, dt), cast_to(b, dt), dt)

    def x_Cast(self, node):
        dt = _base_type(node.to_type.type, self.unit, self.err)
        if not isinstance(node.to_type.type, c_ast.TypeDecl):
            raise self.err(node, "pointer casts are not supported", "cast scalars only")
        return cast_to(self.expr(node.expr), dt)

    def x_ArrayRef(self, node):
        return self.array_ref(node)

    def x_FuncCall(self, node):
        if not isinstance(node.name, c_ast.ID):
            raise self.err(node, "calls through function pointers are not supported")
        fname = node.name.name
        args = [self.expr(a) for a in (node.args.exprs if node.args else [])]
        if fname in self.unit.functions and fname not in _MATH:
            return self.device_call(node, fname, args)
        if fname in _MATH:
            name, dt = _MATH[fname]
            problem = intrinsic_arity_error(name, len(args))
            if problem:
                raise self.err(node, problem.replace(f"{name}()", f"{fname}()"))
            if dt is not None:
                args = [cast_to(a, dt) for a in args]
            return typed_intrinsic(name, args)
        raise self.err(node, f"call of unknown function {fname!r}",
                       "kernels call math.h functions and functions defined in the same file")

    def device_call(self, node, fname: str, args: list[Expr]) -> Expr:
        if fname in self.stack:
            raise self.err(node, f"recursive call of {fname!r}", "polyad functions cannot recurse")
        fdef = self.unit.functions[fname]
        if _has_loops_or_arrays(fdef):
            raise self.err(node, f"{fname}() has loops or array parameters, so it is inlined "
                                 "and its call must be a statement of its own",
                           f"write '{fname}(...);' or 'v = {fname}(...);' on its own line")
        parser = _FuncParser(self.unit, fdef, self.stack)
        func = parser.parse()
        self.funcs.update(parser.funcs)
        self.funcs[func.name] = func
        if len(args) != len(func.params):
            raise self.err(node, f"{fname}() takes {len(func.params)} arguments, got {len(args)}")
        args = [cast_to(a, dt) for a, (_, dt) in zip(args, func.params)]
        return Call(func.name, tuple(args), func.result)


def _c_promote(a: DType, b: DType) -> DType:
    """C's usual arithmetic conversions (a comparison's bool counts as int)."""
    a = ir.i32 if a == ir.boolean else a
    b = ir.i32 if b == ir.boolean else b
    return ir.promote(a, b)


# --------------------------------------------------------------------------
# scalar functions -> device functions
# --------------------------------------------------------------------------


class _FuncParser(_CParserBase):
    """A scalar C function (no loops, no arrays) as an ``ir.FuncDef``."""

    def __init__(self, unit, fdef, stack):
        super().__init__(unit, fdef, stack)
        self.params: dict[str, DType] = {}
        self.locals: dict[str, DType] = {}

    def name_expr(self, node):
        n = node.name
        if n in self.params:
            return ScalarRef(n, self.params[n])
        if n in self.locals:
            return ScalarRef(n, self.locals[n])
        raise self.err(node, f"unknown name {n!r}",
                       "a scalar function reads its parameters and locals only")

    def parse(self) -> ir.FuncDef:
        decl = self.fdef.decl
        for p in (decl.type.args.params if decl.type.args else []):
            if isinstance(p, c_ast.Typename):  # f(void)
                continue
            self.params[p.name] = _base_type(p.type, self.unit, self.err)
        self.result = _base_type(decl.type.type, self.unit, self.err)
        body = self.block(self.fdef.body.block_items or [])
        if not _always_returns(body):
            raise self.err(self.fdef, f"function {decl.name!r} may end without 'return'",
                           "return a value on every path")
        return ir.FuncDef(decl.name, tuple(self.params.items()), self.result,
                          tuple(self.locals.items()), body,
                          _file(self.fdef.coord, self.unit.filename), self.line(self.fdef))

    def block(self, items) -> tuple:
        out = []
        for s in items:
            out.extend(self.stmt(s))
        return tuple(out)

    def stmt(self, s) -> list:
        line = self.line(s)
        if isinstance(s, c_ast.Return):
            if s.expr is None:
                raise self.err(s, "a scalar function must return a value")
            return [ir.FReturn(cast_to(self.expr(s.expr), self.result), line)]
        if isinstance(s, c_ast.Decl):
            if not isinstance(s.type, c_ast.TypeDecl):
                raise self.err(s, "scalar functions declare scalar locals only")
            if s.name in self.params or s.name in self.locals:
                raise self.err(s, f"{s.name!r} is already defined", "use a new name")
            self.locals[s.name] = _base_type(s.type, self.unit, self.err)
            if s.init is None:
                return []
            return [ir.FAssign(s.name, cast_to(self.expr(s.init), self.locals[s.name]), line)]
        if isinstance(s, c_ast.Assignment):
            if not isinstance(s.lvalue, c_ast.ID) or s.lvalue.name not in self.locals:
                raise self.err(s, "scalar functions assign to their own locals only",
                               "declare a local, e.g. double t = ...;")
            name = s.lvalue.name
            if s.op not in _ASSIGN_OPS:
                raise self.err(s, f"assignment operator {s.op!r} is not supported",
                               "use =, +=, -=, *= or /=")
            value = self.expr(s.rvalue)
            if s.op != "=":
                value = self.c_binary(s, s.op[0], ScalarRef(name, self.locals[name]), value)
            return [ir.FAssign(name, cast_to(value, self.locals[name]), line)]
        if isinstance(s, c_ast.If):
            then = self.block(_items(s.iftrue))
            orelse = self.block(_items(s.iffalse)) if s.iffalse is not None else ()
            return [ir.FIf(self.expr(s.cond), then, orelse, line)]
        if isinstance(s, c_ast.Compound):
            return list(self.block(s.block_items or []))
        if isinstance(s, (c_ast.EmptyStatement, c_ast.Pragma)):
            return []
        if type(s) in _UNSUPPORTED:
            msg, hint = _UNSUPPORTED[type(s)]
            raise self.err(s, msg, hint)
        raise self.err(s, f"C {type(s).__name__} statements are not supported in scalar "
                          "functions", "use declarations, assignments, if/else and return")


def _items(node) -> list:
    if node is None:
        return []
    if isinstance(node, c_ast.Compound):
        return node.block_items or []
    return [node]


def _always_returns(body: tuple) -> bool:
    for st in body:
        if isinstance(st, ir.FReturn):
            return True
        if isinstance(st, ir.FIf) and st.orelse and _always_returns(st.then) \
                and _always_returns(st.orelse):
            return True
    return False


# --------------------------------------------------------------------------
# kernels
# --------------------------------------------------------------------------


@dataclass
class _CParam:
    """A parameter of the C function: its role in the IR (size, array or scalar)."""

    name: str
    role: str  # "size" | "array" | "scalar"
    node: object


class _KernelParser(_CParserBase, KernelBuilder):
    def __init__(self, unit: CUnit, fdef: c_ast.FuncDef, stack: tuple = ()):
        _CParserBase.__init__(self, unit, fdef, stack)
        KernelBuilder.__init__(self)
        self.c_params: list[_CParam] = []
        self.size_params: dict[str, str] = {}       # C int parameter -> size name
        self.names: list[dict[str, tuple]] = [{}]   # C block scopes: name -> binding
        self.loop_counters: dict[str, str] = {}      # C counter -> IR loop variable
        self.modes: dict[str, tuple[str, object]] = {}
        self.int_scalars: set[str] = set()

    # ---- names ----------------------------------------------------------
    def lookup(self, name: str) -> Optional[tuple]:
        for scope in reversed(self.names):
            if name in scope:
                return scope[name]
        return None

    def name_expr(self, node):
        n = node.name
        if n in self.loop_counters:
            return LoopVar(self.loop_counters[n])
        b = self.lookup(n)
        if b is None:
            if n in self.unit.functions:
                raise self.err(node, f"function {n!r} used as a value", "call it")
            raise self.err(node, f"unknown name {n!r}",
                           "declare it, pass it as a parameter, or #define it")
        kind, irname = b[0], b[1]
        if kind == "size":
            return SizeVar(irname)
        if kind == "array":
            raise self.err(node, f"array {n!r} used without an index",
                           "kernels work element by element: index the array, e.g. x[i]")
        if kind == "scalar":
            dt = self.scalars[irname]
            if not dt.is_float:
                self.int_params.add(irname)
            return ScalarRef(irname, dt)
        if kind == "counter":
            raise self.err(node, f"loop counter {n!r} is read outside its loop",
                           "a polyad loop counter has no value after its loop; use the bound "
                           "instead")
        return ScalarRef(irname, self.locals[irname])

    def size_expr(self, node, macro):
        name = self.unit.sizes[macro]
        self.sizes[name] = None
        return SizeVar(name)

    # ---- arrays and boundary idioms ---------------------------------------
    def array_ref(self, node: c_ast.ArrayRef) -> Load:
        idx_nodes = []
        base = node
        while isinstance(base, c_ast.ArrayRef):
            idx_nodes.append(base.subscript)
            base = base.name
        idx_nodes.reverse()
        if not isinstance(base, c_ast.ID):
            raise self.err(node, f"{_generate(base)!r} cannot be indexed",
                           "index parameter arrays and local arrays by name")
        b = self.lookup(base.name)
        if b is None or b[0] != "array":
            raise self.err(base, f"{base.name!r} is not an array of this kernel",
                           "only array parameters and local arrays can be indexed")
        name = b[1]
        at = self.arrays[name]
        if len(idx_nodes) != at.ndim:
            raise self.err(node, f"array {base.name!r} has {at.ndim} dimension(s) but is "
                                 f"indexed with {len(idx_nodes)}",
                           "pointer arithmetic and partial indexing are not supported; "
                           "index every dimension")
        ip = frozenset(self.int_params | self.int_scalars)
        idx = []
        for d, i_node in enumerate(idx_nodes):
            saved, self.affine_ctx = self.affine_ctx, True
            try:
                e = self.expr(i_node)
            finally:
                self.affine_ctx = saved
            if e.dtype.is_float:
                raise self.err(i_node, f"index {_generate(i_node)!r} of {base.name!r} is "
                                       "floating-point", "indices must be integer expressions")
            e, mode = self.boundary_idiom(_inline_calls(e, self.funcs), at.shape[d])
            if mode is not None:
                self.set_mode(i_node, name, mode)
            if not is_affine(e, ip):
                raise self.err(i_node, f"index {_generate(i_node)!r} of {base.name!r} is "
                                       "not affine",
                               "indices must be affine in loop counters, sizes and int "
                               "parameters (2*i + 1, i / 2); indices read from arrays are not "
                               "supported; borders: min(max(e, 0), n - 1) or (e + n) % n")
            for x in ir.walk(e):
                if isinstance(x, ScalarRef):
                    self.int_params.add(x.name)
            idx.append(cast_to(e, ir.i64))
        return Load(name, tuple(idx), at.dtype)

    def boundary_idiom(self, e: Expr, extent: Expr) -> tuple[Expr, Optional[str]]:
        """``min(max(x, 0), ext-1)`` -> (x, clamped); ``(x + ext) % ext`` -> (x, circular)."""
        e = _as_min_max(_strip_int_casts(e))
        last = _key(Binary("-", extent, Const(1, ir.i64), ir.i64))
        zero = _key(Const(0, ir.i64))
        if isinstance(e, Call) and e.func in ("min", "max") and len(e.args) == 2:
            other = "max" if e.func == "min" else "min"
            bound = last if e.func == "min" else zero
            inner_bound = zero if e.func == "min" else last
            for inner, b in ((e.args[0], e.args[1]), (e.args[1], e.args[0])):
                if _key(b) == bound and isinstance(inner, Call) and inner.func == other \
                        and len(inner.args) == 2:
                    for x, c in ((inner.args[0], inner.args[1]), (inner.args[1], inner.args[0])):
                        if _key(c) == inner_bound:
                            return x, "clamped"
        if isinstance(e, Binary) and e.op == "%" and _key(e.b) == _key(extent):
            x = e.a
            if isinstance(x, Binary) and x.op == "+" and _key(x.b) == _key(extent):
                return x.a, "circular"
            if isinstance(x, Binary) and x.op == "+" and _key(x.a) == _key(extent):
                return x.b, "circular"
            if isinstance(x, Binary) and x.op == "-" and isinstance(x.a, Binary) \
                    and x.a.op == "+" and _key(x.a.b) == _key(extent):
                return Binary("-", x.a.a, x.b, x.dtype), "circular"
            return x, "circular"
        return e, None

    def set_mode(self, node, name: str, mode: str):
        old = self.modes.get(name)
        if old is not None and old[0] != mode:
            raise self.err(node, f"array {name!r} is read both {old[0]} (line "
                                 f"{self.line(old[1])}) and {mode}",
                           "polyad gives each array one boundary mode; copy it into a second "
                           "array for the other mode")
        if old is None:
            self.modes[name] = (mode, node)

    # ---- signature ------------------------------------------------------
    def signature(self):
        decl = self.fdef.decl
        params = [p for p in (decl.type.args.params if decl.type.args else [])
                  if not isinstance(p, c_ast.Typename)]
        for p in params:
            if isinstance(p, c_ast.EllipsisParam):
                raise self.err(p, "variadic functions are not supported")
        scalar_ints = set()
        for p in params:
            if isinstance(p.type, c_ast.TypeDecl) and \
                    not _base_type(p.type, self.unit, self.err).is_float:
                scalar_ints.add(p.name)
        # int parameters that give array extents (VLA) are sizes
        for p in params:
            t = p.type
            while isinstance(t, c_ast.ArrayDecl):
                for x in _ids(t.dim):
                    if x in scalar_ints:
                        self.size_params[x] = self.unit.sizes.get(x, x)
                t = t.type
        for n in scalar_ints:
            if n in self.unit.sizes:
                self.size_params[n] = self.unit.sizes[n]
        for p in params:
            if p.name in self.size_params:
                size = self.size_params[p.name]
                self.names[0][p.name] = ("size", size)
                self.sizes[size] = None
        for p in params:
            if p.name in self.size_params:
                self.c_params.append(_CParam(p.name, "size", p))
                continue
            t = p.type
            dt = _base_type(t, self.unit, self.err)
            if isinstance(t, c_ast.TypeDecl):
                self.scalars[p.name] = dt
                if not dt.is_float:
                    self.int_scalars.add(p.name)
                self.names[0][p.name] = ("scalar", p.name)
                self.params.append(ir.Param(p.name, dt, "in"))
                self.c_params.append(_CParam(p.name, "scalar", p))
                continue
            shape = self.array_shape(p, t)
            at = ir.ArrayType(dt, shape)
            self.arrays[p.name] = at
            self.names[0][p.name] = ("array", p.name)
            self.params.append(ir.Param(p.name, at, "in"))
            self.c_params.append(_CParam(p.name, "array", p))
            ann = self.unit.annotations.get(p.name)
            if ann and ann[1]:
                self.modes[p.name] = (ann[1], p)
        self.choose_default_float()
        ret = decl.type.type
        self.return_type = None
        if not (isinstance(ret, c_ast.TypeDecl) and isinstance(ret.type, c_ast.IdentifierType)
                and ret.type.names == ["void"]):
            if not isinstance(ret, c_ast.TypeDecl):
                raise self.err(decl, "a kernel returns a scalar or nothing",
                               "write array results into array parameters")
            self.return_type = _base_type(ret, self.unit, self.err)

    def array_shape(self, p, t) -> tuple:
        dims = []
        ann = self.unit.annotations.get(p.name)
        if isinstance(t, c_ast.PtrDecl):
            if not isinstance(t.type, c_ast.TypeDecl):
                raise self.err(p, f"pointer-to-pointer parameter {p.name!r} is not supported",
                               "declare a multi-dimensional array: double A[n][m]")
            if ann is None or ann[0] is None:
                raise self.err(p, f"pointer parameter {p.name!r} has no extent",
                               f"declare it as an array (double {p.name}[n]) or annotate it: "
                               f"/* polyad: {p.name}[n] */")
            for text in ann[0]:
                dims.append(self.extent_text(p, text))
            return tuple(dims)
        while isinstance(t, c_ast.ArrayDecl):
            if t.dim is None:
                if ann is None or ann[0] is None:
                    raise self.err(p, f"array parameter {p.name!r} has an open extent",
                                   f"give it (double {p.name}[n]) or annotate it: "
                                   f"/* polyad: {p.name}[n]... */")
                return tuple(self.extent_text(p, text) for text in ann[0])
            dims.append(self.extent(t.dim))
            t = t.type
        if not isinstance(t, c_ast.TypeDecl):
            raise self.err(p, f"parameter {p.name!r}: arrays of pointers are not supported")
        return tuple(dims)

    def extent_text(self, p, text: str) -> Expr:
        try:
            tree = c_parser.CParser().parse(f"long __polyad_extent = {text};")
        except ParseError:
            raise self.err(p, f"cannot read the extent {text!r} of {p.name!r} in its "
                              "polyad annotation") from None
        node = tree.ext[0].init
        node.coord = p.coord
        return self.extent(node)

    def extent(self, node) -> Expr:
        e = cast_to(self.expr(node), ir.i64)
        if not is_affine(e) or any(isinstance(x, ScalarRef) for x in ir.walk(e)):
            raise self.err(node, f"array extent {_generate(node)!r} is not affine in sizes",
                           "extents are integers, int parameters and #define'd sizes, "
                           "combined affinely (2*n + 1)")
        for x in ir.walk(e):
            if isinstance(x, SizeVar):
                self.sizes[x.name] = None
        return e

    # ---- statements -----------------------------------------------------
    def emit(self, node, target, op, value: Expr):
        self.emit_statement(target, op, value, self.line(node), _generate(node))

    def block(self, items):
        self.names.append({})
        try:
            for s in items:
                self.stmt(s)
        finally:
            self.names.pop()

    def stmt(self, s):
        m = getattr(self, "s_" + type(s).__name__, None)
        if m is None:
            if type(s) in _UNSUPPORTED:
                msg, hint = _UNSUPPORTED[type(s)]
                raise self.err(s, msg, hint)
            raise self.err(s, f"C {type(s).__name__} statements are not supported in kernels",
                           "kernels use for, if/else, declarations, assignments and calls")
        m(s)

    def s_Compound(self, s):
        self.block(s.block_items or [])

    def s_EmptyStatement(self, s):
        pass

    def s_Pragma(self, s):
        pass  # '#pragma omp ...' / '#pragma scop': polyad makes its own schedule

    def s_DeclList(self, s):
        for d in s.decls:
            self.s_Decl(d)

    def s_Decl(self, s):
        if s.name is None or isinstance(s.type, c_ast.FuncDecl):
            raise self.err(s, "declarations inside a kernel declare variables only")
        if "static" in (s.storage or []):
            raise self.err(s, f"static local {s.name!r} is not supported",
                           "static locals keep state between calls; pass it as a parameter")
        dt = _base_type(s.type, self.unit, self.err)
        if isinstance(s.type, c_ast.ArrayDecl):
            return self.local_array(s, dt)
        if not isinstance(s.type, c_ast.TypeDecl):
            raise self.err(s, f"local pointer {s.name!r} is not supported",
                           "declare a local array: double t[n]")
        if s.name in self.loop_counters:
            raise self.err(s, f"{s.name!r} shadows a loop counter", "use a new name")
        irname = s.name if s.name not in self.taken_names() else self.fresh(s.name)
        if s.init is None and not dt.is_float:
            # 'int i, j;' at the top of a PolyBench kernel: loop counters, until assigned
            self.names[-1][s.name] = ("counter", irname, dt)
            return
        self.names[-1][s.name] = ("local", irname)
        self.locals[irname] = dt
        if s.init is not None:
            if isinstance(s.init, c_ast.InitList):
                raise self.err(s.init, "initializer lists are only supported for local arrays")
            self.emit(s, ScalarRef(irname, dt), "=", self.expr(s.init))

    def local_array(self, s, dt):
        if self.scope.loops or self.scope.conditions or self.scope.guard is not None:
            raise self.err(s, "local arrays must be declared at the top level of the kernel",
                           "move the declaration before the loops")
        dims = []
        t = s.type
        while isinstance(t, c_ast.ArrayDecl):
            if t.dim is None:
                raise self.err(s, f"local array {s.name!r} needs its extents")
            dims.append(self.extent(t.dim))
            t = t.type
        zero = False
        if s.init is not None:
            if not (isinstance(s.init, c_ast.InitList) and len(s.init.exprs) == 1
                    and isinstance(s.init.exprs[0], c_ast.Constant)
                    and float(s.init.exprs[0].value.rstrip("fFlLuU")) == 0):
                raise self.err(s.init, "a local array can only be initialized with {0}",
                               "assign its elements in a loop")
            zero = True
        irname = s.name if s.name not in self.taken_names() else self.fresh(s.name)
        at = ir.ArrayType(dt, tuple(dims))
        self.arrays[irname] = at
        self.temps.append(ir.Temp(irname, at, zero))
        self.names[-1][s.name] = ("array", irname)

    def s_Assignment(self, s):
        op = _ASSIGN_OPS.get(s.op)
        if op is None:
            raise self.err(s, f"assignment operator {s.op!r} is not supported",
                           "use =, +=, -=, *= or /=")
        if isinstance(s.rvalue, c_ast.Assignment):
            raise self.err(s, "chained assignment (a = b = c) is not supported",
                           "assign one target per statement")
        if isinstance(s.rvalue, c_ast.FuncCall) and self.is_kernel_call(s.rvalue):
            result = self.kernel_call(s.rvalue)
            if result is None:
                raise self.err(s.rvalue, f"{s.rvalue.name.name}() returns nothing")
            return self.assign_value(s, s.lvalue, op, result)
        op, rvalue = _as_update(op, s.lvalue, s.rvalue)
        self.assign_value(s, s.lvalue, op, self.expr(rvalue))

    def assign_value(self, s, lvalue, op, value: Expr):
        if isinstance(lvalue, c_ast.ArrayRef):
            target = self.array_ref(lvalue)
            self.written.add(target.array)
            if op != "=":
                self.read.add(target.array)
        elif isinstance(lvalue, c_ast.ID):
            name = lvalue.name
            if name in self.loop_counters:
                raise self.err(lvalue, f"assignment to loop counter {name!r} inside its loop",
                               "loop counters change only in the for-header")
            b = self.lookup(name)
            if b is None:
                raise self.err(lvalue, f"unknown name {name!r}", "declare it first")
            if b[0] == "counter":  # a declared int that is used as a scalar after all
                self.names_set(name, ("local", b[1]))
                self.locals[b[1]] = b[2]
                b = ("local", b[1])
            if b[0] == "array":
                raise self.err(lvalue, f"assignment to array {name!r} without an index",
                               f"assign elements: {name}[i] = ...")
            if b[0] in ("scalar", "size"):
                raise self.err(lvalue, f"assignment to parameter {name!r}",
                               "parameters are read-only in polyad kernels; copy it into a "
                               "local first")
            target = ScalarRef(b[1], self.locals[b[1]])
        else:
            if isinstance(lvalue, c_ast.UnaryOp) and lvalue.op == "*":
                raise self.err(lvalue, "pointer dereference ('*p') is not supported",
                               "index the array instead: p[i]")
            raise self.err(lvalue, "assignment target must be an array element or a local")
        self.emit(s, target, op, value)

    def names_set(self, name, binding):
        for scope in reversed(self.names):
            if name in scope:
                scope[name] = binding
                return

    def s_UnaryOp(self, s):
        if s.op not in ("p++", "p--", "++", "--"):
            raise self.err(s, "an expression statement has no effect in a kernel",
                           "assign the value to an array element or a local")
        op = "+=" if "++" in s.op else "-="
        self.assign_value(s, s.expr, op, Const(1, ir.i32))

    def s_FuncCall(self, s):
        if not self.is_kernel_call(s):
            raise self.err(s, "a call whose result is not used has no effect in a kernel",
                           "assign the result, or call a function of this file that has loops")
        if self.kernel_call(s) is not None:
            raise self.err(s, f"the result of {s.name.name}() is dropped",
                           "assign it: v = f(...);")

    def is_kernel_call(self, call) -> bool:
        return isinstance(call.name, c_ast.ID) and call.name.name in self.unit.functions \
            and _has_loops_or_arrays(self.unit.functions[call.name.name])

    def kernel_call(self, call) -> Optional[Expr]:
        """Inline a call of a loop function of the same file; returns its result."""
        fname = call.name.name
        if fname in self.stack:
            raise self.err(call, f"recursive call of {fname!r}", "polyad kernels cannot recurse")
        callee_parser = _KernelParser(self.unit, self.unit.functions[fname], self.stack)
        callee = callee_parser.parse()
        args = call.args.exprs if call.args else []
        if len(args) != len(callee_parser.c_params):
            raise self.err(call, f"{fname}() takes {len(callee_parser.c_params)} arguments, "
                                 f"got {len(args)}")
        bound, size_args = [], []
        for cp, a in zip(callee_parser.c_params, args):
            if cp.role == "size":
                size_args.append((cp, a))
                continue
            if cp.role == "array":
                b = self.lookup(a.name) if isinstance(a, c_ast.ID) else None
                if b is None or b[0] != "array":
                    raise self.err(a, f"argument {cp.name!r} of {fname}() must be an array of "
                                      "this kernel", "pass the array itself, not an offset or "
                                                     "a part of it")
                mode = callee.array_type(cp.name).mode
                if mode is not None:
                    self.set_mode(a, b[1], mode)
                    self.arrays[b[1]] = _with_mode(self.arrays[b[1]], mode)
                bound.append((a, b[1]))
            else:
                bound.append((a, self.expr(a)))
        # a macro size is the same symbol in both functions of the file
        macro_sizes = {v: SizeVar(v) for k, v in self.unit.sizes.items()
                       if v in callee.sizes and k not in callee_parser.size_params}
        for v in macro_sizes:
            self.sizes[v] = None
        arrays, values, sizes = self.bind_kernel_args(call, callee, bound, macro_sizes)
        for cp, a in size_args:
            want = sizes.get(callee_parser.size_params[cp.name])
            got = cast_to(self.expr(a), ir.i64)
            if want is not None and _key(got) != _key(want):
                raise self.err(a, f"size argument {cp.name!r} of {fname}() is "
                                  f"{_generate(a)}, but the arrays passed give "
                                  f"{ir.expr_str(want)}",
                               "pass the arrays' own extents")
            if want is None:
                sizes[callee_parser.size_params[cp.name]] = got
        return self.inline_kernel(call, callee, arrays, values, sizes)

    def s_For(self, s):
        var, lo = self.loop_init(s)
        hi, step = self.loop_cond_step(s, var)
        if var in self.loop_counters:
            raise self.err(s, f"loop counter {var!r} is already the counter of an enclosing "
                              "loop", "use a new counter")
        irname = var if var not in self.loop_vars() and var not in self.locals \
            and var not in self.arrays and var not in self.scalars else self.fresh(var)
        outer = self.enter_loop(Loop(irname, lo, hi, step))
        self.loop_counters[var] = irname
        try:
            self.block(_items(s.stmt))
        finally:
            del self.loop_counters[var]
            self.leave_loop(outer)

    def bound(self, node) -> Expr:
        saved, self.affine_ctx = self.affine_ctx, True
        try:
            e = _inline_calls(self.expr(node), self.funcs)
        finally:
            self.affine_ctx = saved
        ip = frozenset(self.int_params | self.int_scalars)
        if e.dtype.is_float or not is_affine(e, ip):
            raise self.err(node, f"loop bound {_generate(node)!r} is not affine",
                           "loop bounds must be affine in sizes, int parameters and enclosing "
                           "loop counters (min/max of bounds: split the loop)")
        for x in ir.walk(e):
            if isinstance(x, ScalarRef):
                self.int_params.add(x.name)
        return cast_to(e, ir.i64)

    def loop_init(self, s) -> tuple[str, Expr]:
        init = s.init
        hint = "write for (i = lo; i < hi; i++) with an int counter"
        if isinstance(init, c_ast.DeclList) and len(init.decls) == 1 \
                and init.decls[0].init is not None:
            d = init.decls[0]
            if _base_type(d.type, self.unit, self.err).is_float:
                raise self.err(d, f"loop counter {d.name!r} is floating-point", hint)
            return d.name, self.bound(d.init)
        if isinstance(init, c_ast.Assignment) and init.op == "=" \
                and isinstance(init.lvalue, c_ast.ID):
            name = init.lvalue.name
            b = self.lookup(name)
            if b is None:
                raise self.err(init, f"unknown name {name!r}", "declare the counter: int i;")
            if b[0] == "local":
                # C leaves the final count in it; a polyad loop counter has no value after
                # its loop, and the local would keep its old value
                raise self.err(init, f"{name!r} is a variable assigned outside for-headers, so "
                                     "it cannot be a loop counter",
                               "count with a variable of its own: for (int k = lo; k < hi; k++)")
            if b[0] != "counter":
                raise self.err(init, f"{name!r} cannot be a loop counter", hint)
            return name, self.bound(init.rvalue)
        raise self.err(s, "the for-loop needs one counter initialised in its header", hint)

    def loop_cond_step(self, s, var) -> tuple[Expr, int]:
        hint = "write i < hi, i <= hi, i > lo or i >= lo with an affine bound"
        step = self.loop_step(s, var)
        c = s.cond
        if not isinstance(c, c_ast.BinaryOp) or c.op not in ("<", "<=", ">", ">="):
            raise self.err(c or s, "the loop condition must compare the counter with a bound",
                           hint)
        op, other = c.op, None
        if isinstance(c.left, c_ast.ID) and c.left.name == var:
            other = c.right
        elif isinstance(c.right, c_ast.ID) and c.right.name == var:
            other = c.left
            op = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}[op]
        if other is None:
            raise self.err(c, f"the loop condition must compare the counter {var!r} itself",
                           hint)
        if any(x == var for x in _ids(other)):
            raise self.err(other, "the loop bound depends on the loop's own counter", hint)
        bound = self.bound(other)
        one = Const(1, ir.i64)
        if op in ("<", "<="):
            if step < 0:
                raise self.err(c, "the loop counts down but its condition is an upper bound",
                               "use i > lo or i >= lo with a decrement")
            return (bound if op == "<" else Binary("+", bound, one, ir.i64)), step
        if step > 0:
            raise self.err(c, "the loop counts up but its condition is a lower bound",
                           "use i < hi or i <= hi with an increment")
        return (bound if op == ">" else Binary("-", bound, one, ir.i64)), step

    def loop_step(self, s, var) -> int:
        n = s.next
        hint = "use i++, i--, i += c or i -= c with an integer constant c"
        if isinstance(n, c_ast.UnaryOp) and n.op in ("p++", "++", "p--", "--") \
                and isinstance(n.expr, c_ast.ID) and n.expr.name == var:
            return 1 if "++" in n.op else -1
        if isinstance(n, c_ast.Assignment) and isinstance(n.lvalue, c_ast.ID) \
                and n.lvalue.name == var:
            rv = n.rvalue
            if n.op in ("+=", "-="):
                e = self.expr(rv)
                if is_constant(e) and const_value(e) != 0:
                    return const_value(e) * (1 if n.op == "+=" else -1)
            elif n.op == "=" and isinstance(rv, c_ast.BinaryOp) and rv.op in ("+", "-") \
                    and isinstance(rv.left, c_ast.ID) and rv.left.name == var:
                e = self.expr(rv.right)
                if is_constant(e) and const_value(e) != 0:
                    return const_value(e) * (1 if rv.op == "+" else -1)
        raise self.err(n or s, "the loop step must be a nonzero integer constant", hint)

    def s_If(self, s):
        cond = self.expr(s.cond)
        ip = frozenset(self.int_params | self.int_scalars)
        outer = self.scope
        affine = is_affine_condition(cond, ip)
        if affine:
            for x in ir.walk(cond):
                if isinstance(x, ScalarRef):
                    self.int_params.add(x.name)
        else:
            cond = self.condition_once(cond, _written_names(s.iftrue) | _written_names(s.iffalse),
                                       self.line(s), f"if ({_generate(s.cond)})")
        for body, positive in ((s.iftrue, True), (s.iffalse, False)):
            if body is None:
                continue
            self.scope = self.branch_scope(cond, positive, affine)
            try:
                self.block(_items(body))
            finally:
                self.scope = outer

    def s_Return(self, s):
        if self.scope.loops or self.scope.conditions or self.scope.guard is not None:
            raise self.err(s, "'return' is only allowed at the end of the kernel, outside loops "
                              "and conditions",
                           "accumulate into a local and return it after the loops")
        if self.return_type is None:
            if s.expr is None:
                return
            raise self.err(s, "a void function returns a value")
        if s.expr is None:
            raise self.err(s, "the function must return a value")
        value = self.expr(s.expr)
        if isinstance(value, ScalarRef) and value.name in self.locals \
                and self.locals[value.name] == self.return_type:
            name = value.name
        else:
            name = self.fresh("result")
            self.locals[name] = self.return_type
            self.emit(s, ScalarRef(name, self.return_type), "=", value)
        self.result = (name, self.return_type)

    def parse(self) -> ir.Kernel:
        self.signature()
        items = self.fdef.body.block_items or []
        for k, s in enumerate(items):
            if isinstance(s, c_ast.Return) and k != len(items) - 1:
                raise self.err(items[k + 1], "statements after 'return' are never executed",
                               "remove them or move the return to the end")
        # parameters live in the outermost scope; the body's declarations in the next
        self.block(items)
        if self.return_type is not None and self.result is None:
            raise self.err(self.fdef, "the function returns a value but has no final 'return'",
                           "return the accumulated value at the end of the function")
        for name, (mode, _) in self.modes.items():
            self.arrays[name] = _with_mode(self.arrays[name], mode)
        self.params = [ir.Param(p.name, self.arrays[p.name], p.intent) if p.is_array else p
                       for p in self.params]
        self.temps = [ir.Temp(t.name, self.arrays[t.name], t.zero) for t in self.temps]
        return self.build_kernel(self.fdef.decl.name, _file(self.fdef.coord, self.unit.filename),
                                 self.line(self.fdef))


def _as_update(op: str, lvalue, rvalue) -> tuple[str, object]:
    """``x = x + e`` -> (``+=``, e), and ``- * /`` alike (``x = e + x`` and ``x = e * x``
    too): the update form the IR and AD know as an accumulation. C evaluates both the
    same way, to the bit."""
    if op != "=" or not isinstance(rvalue, c_ast.BinaryOp) or rvalue.op not in "+-*/":
        return op, rvalue
    target = _generate(lvalue)
    if _generate(rvalue.left) == target:
        return rvalue.op + "=", rvalue.right
    if rvalue.op in "+*" and _generate(rvalue.right) == target:
        return rvalue.op + "=", rvalue.left
    return op, rvalue


def _with_mode(at: ir.ArrayType, mode: str) -> ir.ArrayType:
    return ir.ArrayType(at.dtype, at.shape, mode)


def _written_names(node) -> set:
    """The names a C statement may write: the variable or array of an assignment's or an
    increment's target, and the arguments of calls (a called kernel may write its arrays;
    a call of a math function counts too, which only costs a local)."""
    out = set()

    def root(n):
        while isinstance(n, (c_ast.ArrayRef, c_ast.UnaryOp)):
            n = n.name if isinstance(n, c_ast.ArrayRef) else n.expr
        if isinstance(n, c_ast.ID):
            out.add(n.name)

    class V(c_ast.NodeVisitor):
        def visit_Assignment(self, n):
            root(n.lvalue)
            self.generic_visit(n)

        def visit_UnaryOp(self, n):
            if n.op in ("++", "--", "p++", "p--"):
                root(n.expr)
            self.generic_visit(n)

        def visit_FuncCall(self, n):
            for a in (n.args.exprs if n.args is not None else []):
                root(a)
            self.generic_visit(n)

    if node is not None:
        V().visit(node)
    return out


def _ids(node) -> list[str]:
    """The identifiers an expression node mentions."""
    out = []

    class V(c_ast.NodeVisitor):
        def visit_ID(self, n):
            out.append(n.name)

    if node is not None:
        V().visit(node)
    return out


# ---- index idioms ----------------------------------------------------------


def _strip_int_casts(e: Expr) -> Expr:
    return ir.map_expr(e, lambda x: x.a if isinstance(x, ir.Cast) and not x.dtype.is_float
                       and not x.a.dtype.is_float else None)


def _as_min_max(e: Expr) -> Expr:
    """``a < b ? a : b`` -> ``min(a, b)`` and the like (how C spells min/max)."""
    def fn(x):
        if isinstance(x, Select) and isinstance(x.cond, Binary) and x.cond.op in ("<", "<=",
                                                                                  ">", ">="):
            a, b = _key(x.cond.a), _key(x.cond.b)
            ta, tb = _key(x.a), _key(x.b)
            less = x.cond.op in ("<", "<=")
            if (ta, tb) == (a, b):
                return Call("min" if less else "max", (x.cond.a, x.cond.b), x.dtype)
            if (ta, tb) == (b, a):
                return Call("max" if less else "min", (x.cond.a, x.cond.b), x.dtype)
            # v < lo ? lo : min(v, hi)  ->  max(min(v, hi), lo)   (a clamp, lo <= hi)
            inner = "min" if less else "max"
            if ta == b and isinstance(x.b, Call) and x.b.func == inner \
                    and a in (_key(x.b.args[0]), _key(x.b.args[1])):
                return Call("max" if less else "min", (x.b, x.a), x.dtype)
        return None
    return ir.map_expr(e, fn)


def _inline_calls(e: Expr, funcs: dict) -> Expr:
    """Replace calls of one-line integer device functions (``return e;``) by their body,
    so helpers like ``clampi(i, 0, n - 1)`` in an index become ISL-readable."""
    def fn(x):
        f = funcs.get(x.func) if isinstance(x, Call) else None
        if f is None or f.locals or len(f.body) != 1 or not isinstance(f.body[0], ir.FReturn) \
                or f.result.is_float:
            return None
        values = {n: a for (n, _), a in zip(f.params, x.args)}
        body = ir.map_expr(f.body[0].expr, lambda y: values.get(y.name)
                           if isinstance(y, ScalarRef) else None)
        return _inline_calls(body, funcs)
    return ir.map_expr(e, fn)


def _key(e: Expr) -> str:
    """A canonical text of an integer expression, for matching idioms."""
    return ir.expr_str(ir.fold_integer_constants(_strip_int_casts(_retype(e))))


def _retype(e: Expr) -> Expr:
    """Integer constants and arithmetic as i64 (C's int and long compare equal here)."""
    def fn(x):
        if isinstance(x, Const) and not x.dtype.is_float:
            return Const(int(x.value), ir.i64)
        if isinstance(x, Binary) and x.dtype in (ir.i32, ir.i64):
            return Binary(x.op, x.a, x.b, ir.i64)
        return None
    return ir.map_expr(e, fn)


# --------------------------------------------------------------------------
# entry points
# --------------------------------------------------------------------------


def parse_c(source: Union[str, os.PathLike], name: str, sizes: Optional[dict] = None,
            filename: Optional[str] = None) -> ir.Kernel:
    """The IR of C function ``name`` in ``source`` (C text, or a path to a .c file: a
    ``pathlib.Path`` or a one-line string naming an existing ``.c`` file).

    ``sizes`` maps C macros (``#define N 1000``) or int parameters to the names
    of symbolic sizes, e.g. ``{"N": "n", "TSTEPS": "tsteps"}``; int parameters
    used as array extents are sizes without being named here.
    """
    unit = load_unit(source, sizes, filename)
    return kernel_of(unit, name)


def load_unit(source: Union[str, os.PathLike], sizes: Optional[dict] = None,
              filename: Optional[str] = None) -> CUnit:
    """Read (if a path), preprocess and parse a C translation unit."""
    if isinstance(source, str) and "\n" not in source and source.endswith((".c", ".h")) \
            and Path(source).is_file():  # a file name is never a whole C program
        source = Path(source)
    if isinstance(source, os.PathLike):
        path = Path(source)
        text = path.read_text()
        filename = filename or str(path)
    else:
        text = source
    return parse_unit(text, filename or "<c-source>", sizes)


def kernel_of(unit: CUnit, name: str) -> ir.Kernel:
    """The IR of function ``name`` of a parsed unit."""
    fdef = unit.functions.get(name)
    if fdef is None:
        raise DSLError(f"no function {name!r} is defined in {unit.filename}", unit.filename,
                       hint=f"functions there: {', '.join(unit.functions) or 'none'}")
    return _KernelParser(unit, fdef).parse()


def kernel_names(unit: CUnit) -> list[str]:
    """The functions of a unit that are kernels: not ``static`` (helpers usually are)."""
    return [n for n, f in unit.functions.items() if "static" not in (f.decl.storage or [])]
