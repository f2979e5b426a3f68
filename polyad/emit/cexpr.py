"""The shared C expression printer: IR expressions and ISL AST expressions to C99.

Used by the OpenMP emitter (and later by the CUDA one). Helpers the printed
code needs (floor division, Python modulo, sign, min/max per type) are
recorded in ``CPrinter.helpers`` and emitted once, before the kernel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Optional

import islpy as isl

from .. import ir
from ..ir import (Binary, Call, Cast, Const, Expr, Load, LoopVar, ScalarRef, Select, SizeVar,
                  Unary)

# C spelling of each intrinsic per float type: (float, double).
C_MATH = {
    "exp": ("expf", "exp"), "exp2": ("exp2f", "exp2"), "log": ("logf", "log"),
    "log2": ("log2f", "log2"), "log10": ("log10f", "log10"), "sin": ("sinf", "sin"),
    "cos": ("cosf", "cos"), "tan": ("tanf", "tan"), "sinh": ("sinhf", "sinh"),
    "cosh": ("coshf", "cosh"), "tanh": ("tanhf", "tanh"), "asin": ("asinf", "asin"),
    "acos": ("acosf", "acos"), "atan": ("atanf", "atan"), "asinh": ("asinhf", "asinh"),
    "acosh": ("acoshf", "acosh"), "atanh": ("atanhf", "atanh"), "sqrt": ("sqrtf", "sqrt"),
    "erf": ("erff", "erf"), "erfc": ("erfcf", "erfc"), "floor": ("floorf", "floor"),
    "ceil": ("ceilf", "ceil"), "pow": ("powf", "pow"), "atan2": ("atan2f", "atan2"),
}

_TYPED_HELPERS = {
    "abs": "{q} {t} pa_abs_{n}({t} x) {{ return x < 0 ? -x : x; }}",
    "sign": "{q} {t} pa_sign_{n}({t} x) {{ return ({t})(x > 0) - ({t})(x < 0); }}",
    "min": "{q} {t} pa_min_{n}({t} a, {t} b) {{ return b < a ? b : a; }}",
    "max": "{q} {t} pa_max_{n}({t} a, {t} b) {{ return b > a ? b : a; }}",
    "rsqrt": "{q} {t} pa_rsqrt_{n}({t} x) {{ return ({t})1 / sqrt{f}(x); }}",
    # Integer // and % by 0 give 0 (numpy's result) instead of trapping the process;
    # b == -1 avoids the INT_MIN / -1 trap (the quotient wraps like numpy's).
    "floordiv": ("{q} {t} pa_floordiv_{n}({t} a, {t} b) "
                 "{{ if (b == 0) return 0; if (b == -1) return ({t})(0u - (uint64_t)a); "
                 "{t} q = a / b; return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q; }}"),
    "mod": ("{q} {t} pa_mod_{n}({t} a, {t} b) "
            "{{ if (b == 0 || b == -1) return 0; "
            "{t} r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }}"),
    "fmod": ("{q} {t} pa_mod_{n}({t} a, {t} b) "
             "{{ {t} r = fmod{f}(a, b); return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }}"),
    "ffloordiv": "{q} {t} pa_floordiv_{n}({t} a, {t} b) {{ return floor{f}(a / b); }}",
    "ipow": ("{q} {t} pa_pow_{n}({t} a, {t} b) "
             "{{ {t} r = 1; for ({t} k = 0; k < b; ++k) r *= a; return r; }}"),
}


# Element i of a packed ``bit`` array (ir.bit) is bit i % 32 of word i / 32. The schedule
# sees one element per store, so neighbouring elements - one word - may be stored by
# different threads (a chunk boundary, or threads along the innermost loop): the store ORs
# its bit in atomically. The array is zero-filled, so a 0 needs no store at all.
C_BIT_HELPERS = """\
static inline int pa_bit_get(const uint32_t *words, int64_t i) { return (words[i >> 5] >> (i & 31)) & 1u; }
static inline void pa_bit_set(uint32_t *words, int64_t i, int value)
{
  if (value) {
    #pragma omp atomic
    words[i >> 5] |= 1u << (i & 31);
  }
}"""


@dataclass(frozen=True)
class Dialect:
    """How one C-family language spells what the printers emit.

    ``restrict``: the no-alias pointer qualifier; ``function_qualifier``:
    what precedes helper and device functions; ``math``: intrinsic name ->
    (float spelling, double spelling); ``bit_helpers``: the C of ``pa_bit_get`` and
    ``pa_bit_set`` (packed ``bit`` arrays); ``atomic_update`` prints an update
    that concurrent iterations may race on. A target with another language
    (CUDA) passes its own ``Dialect`` (subclass it to change the atomics).
    """

    name: str = "c99"
    restrict: str = "restrict"
    function_qualifier: str = "static inline"
    math: Mapping = field(default_factory=lambda: dict(C_MATH))

    bit_helpers: str = C_BIT_HELPERS

    def atomic_update(self, target: str, op: str, value: str) -> list[str]:
        """The lines of ``target op= value`` made atomic (no trailing comment)."""
        return ["#pragma omp atomic", f"{target} {op} {value};"]


C99 = Dialect()


def c_literal(value, dtype: ir.DType) -> str:
    if dtype.is_float:
        v = float(value)
        if math.isnan(v):
            return "NAN"
        if math.isinf(v):
            return "INFINITY" if v > 0 else "(-INFINITY)"
        text = repr(v)
        if "e" not in text and "." not in text:
            text += ".0"
        return text + ("f" if dtype == ir.f32 else "")
    v = int(value)
    if abs(v) >= 2 ** 31:
        return f"INT64_C({v})"
    return str(v)


C_RESERVED = set("""
auto break case char const continue default do double else enum extern float for goto if
inline int long register restrict return short signed sizeof static struct switch typedef
union unsigned void volatile while _Bool _Complex main errno int8_t int16_t int32_t int64_t
uint8_t uint16_t uint32_t uint64_t size_t NAN INFINITY
abs labs llabs div exp exp2 expm1 log log2 log10 log1p sin cos tan sinh cosh tanh asin acos atan
atan2 asinh acosh atanh sqrt cbrt pow fabs floor ceil round trunc fmod remainder fmin fmax fma
erf erfc tgamma lgamma gamma j0 j1 jn y0 y1 yn nan rint lrint frexp ldexp modf hypot isnan isinf
signbit copysign nextafter scalbn ilogb logb expf logf sinf cosf sqrtf powf fabsf floorf
""".split())


def cname(name: str) -> str:
    """The C identifier for a DSL name (suffixed when it would clash with C or libm)."""
    return name + "_" if name in C_RESERVED or name.startswith("pa_") else name


class CPrinter:
    """Prints IR expressions as C99 for one kernel.

    ``env`` maps loop variables to the C text of their value (AST iterators)
    and scalars/sizes to their C names; ``array_names`` and ``func_names`` map
    arrays and device functions to their C names.
    """

    def __init__(self, kernel: ir.Kernel, func_names: Mapping[str, str] | None = None,
                 array_names: Mapping[str, str] | None = None, dialect: Optional[Dialect] = None):
        self.kernel = kernel
        self.dialect = dialect or C99
        self.func_names = dict(func_names or {})
        self.array_names = dict(array_names or {})
        self.helpers: dict[str, str] = {}
        # element read -> the local holding it (a read invariant along a vector loop,
        # read once before it: c_openmp._Emitter.invariant_reads)
        self.kept_reads: dict[Load, str] = {}

    def helper(self, kind: str, dtype: ir.DType) -> str:
        n = dtype.name
        key = f"{kind}_{n}"
        if key not in self.helpers:
            tmpl = _TYPED_HELPERS[kind]
            self.helpers[key] = tmpl.format(t=dtype.c_type, n=n, f="f" if dtype == ir.f32 else "",
                                            q=self.dialect.function_qualifier)
        return {"ffloordiv": "pa_floordiv", "fmod": "pa_mod", "ipow": "pa_pow"}.get(kind, "pa_" + kind) + "_" + n

    def index(self, ld: Load, env: Mapping[str, str]) -> str:
        """Row-major flat offset of ``ld`` (``(i0 * E1 + i1) * E2 + i2``), folded; for a
        packed layout (a triangle) the call of its offset function."""
        at = self.kernel.array_type(ld.array)
        if at.layout is not None:
            fn, sizes = self.offset_helper(ld.array, at.layout)
            args = [self.expr(ir.fold_integer_constants(ix), env) for ix in ld.index]
            return f"{fn}({', '.join(args + [self.expr(s, env) for s in sizes])})"
        shape = at.shape
        out = None
        for ix, ext in zip(ld.index, shape):
            out = ix if out is None else Binary("+", Binary("*", out, ext, ir.i64), ix, ir.i64)
        if out is None:
            return "0"
        return self.expr(ir.fold_integer_constants(out), env)

    def offset_helper(self, array: str, layout: ir.PackedLayout) -> tuple[str, list]:
        """The C function ``<array>_at(indices..., sizes...)`` giving the position of an
        element of an array stored with a packed ``layout`` (recorded in ``helpers``),
        and the sizes (IR) it takes after the indices."""
        name = cname(self.array_names.get(array, array)) + "_at"
        sizes = sorted({x for x in ir.walk(layout.offset) if isinstance(x, (SizeVar, ScalarRef))},
                       key=lambda x: x.name)
        if name not in self.helpers:
            names = {n: cname(n) for n in list(layout.names) + [s.name for s in sizes]}
            params = ", ".join(f"int64_t {names[n]}" for n in
                               list(layout.names) + [s.name for s in sizes])
            self.helpers[name] = (
                f"/* {array} stores only its elements {layout!r}, row after row */\n"
                f"{self.dialect.function_qualifier} int64_t {name}({params}) "
                f"{{ return {self.expr(layout.offset, names)}; }}")
        return name, sizes

    def load(self, ld: Load, env) -> str:
        name = self.array_names.get(ld.array, ld.array)
        if self.kernel.array_type(ld.array).dtype.packed:
            self.helpers["bit"] = self.dialect.bit_helpers
            return f"pa_bit_get({name}, {self.index(ld, env)})"
        return f"{name}[{self.index(ld, env)}]"

    def store(self, target: Load, value: str, env) -> Optional[str]:
        """The C statement storing ``value`` into a packed array's element ``target``
        (``pa_bit_set``, no trailing ``;``), None for other arrays (a plain assignment)."""
        if not self.kernel.array_type(target.array).dtype.packed:
            return None
        self.helpers["bit"] = self.dialect.bit_helpers
        name = self.array_names.get(target.array, target.array)
        return f"pa_bit_set({name}, {self.index(target, env)}, {value})"

    def expr(self, e: Expr, env: Mapping[str, str], prec: int = 0) -> str:
        text, p = self._expr(e, env)
        return f"({text})" if p < prec else text

    def _expr(self, e: Expr, env) -> tuple[str, int]:
        # Precedence levels: 1 ?:, 2 ||, 3 &&, 4 ==, 5 <, 6 + -, 7 * / %, 8 unary, 9 atom.
        if isinstance(e, Const):
            text = c_literal(e.value, e.dtype if e.dtype != ir.boolean else ir.i64)
            return text, (9 if not text.startswith("-") and not text.startswith("(") else 8)
        if isinstance(e, LoopVar):
            v = env.get(e.name, e.name)
            return v, 9 if v.isidentifier() or v.lstrip("-").isdigit() and not v.startswith("-") else 0
        if isinstance(e, (SizeVar, ScalarRef)):
            return env.get(e.name, e.name), 9
        if isinstance(e, Load):
            if e in self.kept_reads:
                return self.kept_reads[e], 9
            return self.load(e, env), 9
        if isinstance(e, Unary):
            if e.op == "not":
                return "!" + self.expr(e.a, env, 8), 8
            inner = self.expr(e.a, env, 8)
            return ("-(" + inner + ")" if inner.startswith("-") else "-" + inner), 8
        if isinstance(e, Binary):
            return self.binary(e, env)
        if isinstance(e, Select):
            return (f"{self.expr(e.cond, env, 2)} ? {self.expr(e.a, env, 1)} : "
                    f"{self.expr(e.b, env, 1)}"), 1
        if isinstance(e, Cast):
            return f"({e.dtype.c_type}){self.expr(e.a, env, 8)}", 8
        if isinstance(e, Call):
            return self.call(e, env), 9
        raise TypeError(f"cannot print {e!r}")

    def binary(self, e: Binary, env) -> tuple[str, int]:
        op, dt = e.op, e.dtype
        if op in ("and", "or"):
            p = 3 if op == "and" else 2
            c = "&&" if op == "and" else "||"
            return f"{self.expr(e.a, env, p)} {c} {self.expr(e.b, env, p + 1)}", p
        if op in ir.COMPARE_OPS:
            p = 4 if op in ("==", "!=") else 5
            return f"{self.expr(e.a, env, p + 1)} {op} {self.expr(e.b, env, p + 1)}", p
        if not dt.is_float and (e.a.dtype != dt or e.b.dtype != dt):
            # integer arithmetic is done in the result's (64-bit) type: C would do
            # int32 * int32 in 32 bits and wrap
            e = Binary(op, _widen(e.a, dt), _widen(e.b, dt), dt)
        if op in ("+", "-"):
            return f"{self.expr(e.a, env, 6)} {op} {self.expr(e.b, env, 7)}", 6
        if op in ("*", "/"):
            return f"{self.expr(e.a, env, 7)} {op} {self.expr(e.b, env, 8)}", 7
        if op == "//":
            kind = "ffloordiv" if dt.is_float else "floordiv"
            return f"{self.helper(kind, dt)}({self.expr(e.a, env)}, {self.expr(e.b, env)})", 9
        if op == "%" and not dt.is_float and isinstance(e.b, Const) and int(e.b.value) > 0:
            # by a positive constant: plain C remainders (the helper's call, in the inner
            # loop of a large function gcc no longer inlines, stops vectorization there)
            b = int(e.b.value)
            return f"({self.expr(e.a, env, 7)} % {b} + {b}) % {b}", 7
        if op == "%":
            kind = "fmod" if dt.is_float else "mod"
            return f"{self.helper(kind, dt)}({self.expr(e.a, env)}, {self.expr(e.b, env)})", 9
        if op == "**":
            b = e.b
            if isinstance(b, Const) and float(b.value) in (1.0, 2.0, 3.0):
                a = self.expr(e.a, env, 8)
                return " * ".join([a] * int(b.value)), 7
            if isinstance(b, Const) and float(b.value) == 0.5 and dt.is_float:
                return f"{self.dialect.math['sqrt'][dt == ir.f64]}({self.expr(e.a, env)})", 9
            if not dt.is_float:
                return f"{self.helper('ipow', dt)}({self.expr(e.a, env)}, {self.expr(e.b, env)})", 9
            return f"{self.dialect.math['pow'][dt == ir.f64]}({self.expr(e.a, env)}, {self.expr(e.b, env)})", 9
        raise TypeError(op)

    def call(self, e: Call, env) -> str:
        args = ", ".join(self.expr(a, env) for a in e.args)
        if e.func in self.func_names:
            return f"{self.func_names[e.func]}({args})"
        if e.func in ("abs", "sign", "min", "max", "rsqrt"):
            if e.func == "abs" and e.dtype.is_float:
                return f"{'fabsf' if e.dtype == ir.f32 else 'fabs'}({args})"
            return f"{self.helper(e.func, e.dtype)}({args})"
        if e.func in self.dialect.math:
            if not e.dtype.is_float:
                raise TypeError(f"{e.func} on integers")
            return f"{self.dialect.math[e.func][e.dtype == ir.f64]}({args})"
        raise KeyError(f"no C spelling for intrinsic {e.func!r}")


def unparen(text: str) -> str:
    """``text`` without the parentheses around all of it, if one pair encloses it all
    (``(a) < (b)`` keeps its own)."""
    if not (text.startswith("(") and text.endswith(")")):
        return text
    depth = 0
    for k, c in enumerate(text):
        depth += {"(": 1, ")": -1}.get(c, 0)
        if depth == 0 and k < len(text) - 1:
            return text
    return text[1:-1]


def ast_expr_ir(e: isl.AstExpr, names: Mapping[str, str]) -> Expr:
    """An ISL AST expression as an IR integer expression (iterators renamed).

    Operations other than + - * and negation become an opaque ``LoopVar`` whose
    name is their C text (printed as is).
    """
    t = e.get_type()
    if t == isl.ast_expr_type.id:
        n = e.get_id().get_name()
        return LoopVar(names.get(n, n))
    if t == isl.ast_expr_type.int:
        return Const(e.get_val().to_python(), ir.i64)
    T = isl.ast_expr_op_type
    op = e.get_op_type()
    ops = {T.add: "+", T.sub: "-", T.mul: "*"}
    if op in ops:
        return Binary(ops[op], ast_expr_ir(e.get_op_arg(0), names),
                      ast_expr_ir(e.get_op_arg(1), names), ir.i64)
    if op == T.minus:
        return Unary("neg", ast_expr_ir(e.get_op_arg(0), names), ir.i64)
    return LoopVar(f"({ast_expr_c(e, names)})")


def ast_expr_c(e: isl.AstExpr, names: Mapping[str, str], loop_bound: bool = False) -> str:
    """An ISL AST expression as C (iterators renamed through ``names``).

    ``loop_bound``: the expression is a loop's init or condition. ISL writes
    ``pdiv_q``/``pdiv_r`` (C ``/`` and ``%``, exact for a non-negative dividend)
    where the dividend is non-negative whenever the loop runs, so in a bound it
    can be negative exactly when the loop should run zero times -- and C's
    truncating ``%`` then makes it run (a loop over ``c0 >= ((M - 1) % 3) - M + 1``
    ran once at ``M = 0``, fuzz seed 210). Bounds get floor semantics.
    """
    t = e.get_type()
    if t == isl.ast_expr_type.id:
        n = e.get_id().get_name()
        return names.get(n, n)
    if t == isl.ast_expr_type.int:
        return str(e.get_val().to_python())
    op = e.get_op_type()
    args = [ast_expr_c(e.get_op_arg(k), names, loop_bound) for k in range(e.get_op_n_arg())]
    T = isl.ast_expr_op_type
    if loop_bound and op in (T.pdiv_q, T.pdiv_r):
        return f"{'pa_ifloord' if op == T.pdiv_q else 'pa_ifmod'}({args[0]}, {args[1]})"
    binops = {T.add: "+", T.sub: "-", T.mul: "*", T.lt: "<", T.le: "<=", T.gt: ">",
              T.ge: ">=", T.eq: "==", T.and_: "&&", T.or_: "||", T.and_then: "&&",
              T.or_else: "||", T.pdiv_q: "/", T.pdiv_r: "%", T.zdiv_r: "%", T.div: "/"}
    if op in binops:
        a, b = args
        if op == T.add and b.startswith("-"):
            return f"({a} - {b[1:]})" if b[1:].isidentifier() or b[1:].isdigit() else f"({a} + {b})"
        return f"({a} {binops[op]} {b})"
    if op == T.minus:
        return f"-{args[0]}" if args[0].isidentifier() or args[0].isdigit() else f"-({args[0]})"
    if op in (T.max, T.min):
        fn = "pa_imax" if op == T.max else "pa_imin"
        out = args[0]
        for a in args[1:]:
            out = f"{fn}({out}, {a})"
        return out
    if op == T.fdiv_q:
        return f"pa_ifloord({args[0]}, {args[1]})"
    if op in (T.select, T.cond):
        return f"({args[0]} ? {args[1]} : {args[2]})"
    raise NotImplementedError(f"ISL AST operation {op}")


AST_HELPERS = (
    "static inline int64_t pa_imin(int64_t a, int64_t b) { return b < a ? b : a; }\n"
    "static inline int64_t pa_imax(int64_t a, int64_t b) { return b > a ? b : a; }\n"
    "static inline int64_t pa_ifloord(int64_t a, int64_t b) "
    "{ return (a >= 0) ? a / b : -((-a + b - 1) / b); }\n"
    "static inline int64_t pa_ifmod(int64_t a, int64_t b) "
    "{ return a - b * pa_ifloord(a, b); }"
)


def _widen(e: Expr, dt: ir.DType) -> Expr:
    """``e`` converted to the integer type ``dt`` of the operation it is an operand of."""
    if e.dtype == dt or e.dtype == ir.boolean:
        return e
    return Const(int(e.value), dt) if isinstance(e, Const) else ir.Cast(e, dt)
