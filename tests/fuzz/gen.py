"""A generator of random well-formed polyad kernels, rendered twice.

``generate(seed)`` builds one random program (a small tree of loop nests,
statements and expressions) and renders it as

* ``Case.dsl``: a Python module defining the ``@pa.kernel`` (and maybe a
  ``@pa.func``) — written to a file and imported, so polyad reads real source;
* ``Case.ref``: an independent pure-Python translation of the same program
  (explicit loops, explicit boundary-mode index arithmetic) that never touches
  polyad's IR or interpreter. It runs on numpy object arrays whose elements are
  Python floats (the float64 oracle) or JAX scalars (the gradient oracle).

Generated programs are well formed by construction: every loop variable ``v``
is known to lie in ``[0, S)`` for one size ``S``; an array without a boundary
mode is only indexed as ``a*v + c`` (``c >= 0``) with ``S(v)`` the size its
dimension is tied to, and its extents are derived from those accesses, so ISL
can prove every access in bounds.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Optional

MODES = (None, "clamped", "circular", "mirror", "zero")
SIZE_NAMES = ("M", "N")


@dataclass
class Index:
    """One subscript: ``a*v + c + b*S`` (``v`` a loop variable or None)."""

    a: int
    v: Optional[str]
    c: int
    b: int = 0
    size: Optional[str] = None   # S of the b*S term

    def dsl(self) -> str:
        parts = []
        if self.b:
            parts.append(self.size if self.b == 1 else f"{self.b} * {self.size}")
        if self.v is not None:
            term = self.v if self.a == 1 else f"{self.a} * {self.v}"
            if self.a == -1:
                parts.append(f"- {self.v}" if parts else f"-{self.v}")
            else:
                parts.append(f"+ {term}" if parts else term)
        if self.c or not parts:
            if parts:
                parts.append(f"+ {self.c}" if self.c >= 0 else f"- {-self.c}")
            else:
                parts.append(str(self.c))
        return " ".join(parts)


@dataclass
class Arr:
    name: str
    role: str                      # in | inout | out | temp
    sizes: tuple                   # size symbol each dimension is tied to
    mode: Optional[str]
    ext: list = field(default_factory=list)   # (A, B): extent A*S + B per dim

    def extent_dsl(self, d: int) -> str:
        A, B = self.ext[d]
        s = self.sizes[d]
        head = s if A == 1 else f"{A} * {s}"
        return head if B == 0 else f"{head} + {B}"


# ----------------------------------------------------------------------------
# expressions: each node renders as DSL text and as reference Python text
# ----------------------------------------------------------------------------

class E:
    def dsl(self) -> str: ...
    def ref(self) -> str: ...


@dataclass
class Read(E):
    arr: Arr
    idx: list

    def dsl(self):
        return f"{self.arr.name}[{', '.join(i.dsl() for i in self.idx)}]"

    def ref(self):
        return f"L.rd({self.arr.name}, {self.arr.mode!r}, ({', '.join(i.dsl() for i in self.idx)},))"


@dataclass
class Lit(E):
    text: str

    def dsl(self):
        return self.text

    def ref(self):
        return self.text


@dataclass
class Name(E):
    name: str

    def dsl(self):
        return self.name

    def ref(self):
        return self.name


@dataclass
class Bin(E):
    op: str
    a: E
    b: E

    def dsl(self):
        return f"({self.a.dsl()} {self.op} {self.b.dsl()})"

    def ref(self):
        return f"({self.a.ref()} {self.op} {self.b.ref()})"


@dataclass
class SafeDiv(E):
    a: E
    b: E

    def dsl(self):
        return f"({self.a.dsl()} / (1.5 + {self.b.dsl()} * {self.b.dsl()}))"

    def ref(self):
        return f"({self.a.ref()} / (1.5 + {self.b.ref()} * {self.b.ref()}))"


@dataclass
class Call(E):
    fn: str
    args: list

    def dsl(self):
        a = [x.dsl() for x in self.args]
        if self.fn == "sqrtp":
            return f"pa.sqrt({a[0]} * {a[0]} + 1.0)"
        if self.fn == "logp":
            return f"pa.log({a[0]} * {a[0]} + 1.0)"
        if self.fn == "exptanh":
            return f"pa.exp(pa.tanh({a[0]}))"
        if self.fn == "sq":
            return f"({a[0]}) ** 2"
        if self.fn in ("abs", "min", "max") or self.fn.startswith("fz_"):
            return f"{self.fn}({', '.join(a)})"
        return f"pa.{self.fn}({', '.join(a)})"

    def ref(self):
        a = [x.ref() for x in self.args]
        if self.fn == "sqrtp":
            return f"L.sqrt({a[0]} * {a[0]} + 1.0)"
        if self.fn == "logp":
            return f"L.log({a[0]} * {a[0]} + 1.0)"
        if self.fn == "exptanh":
            return f"L.exp(L.tanh({a[0]}))"
        if self.fn == "sq":
            return f"L.sq({a[0]})"
        if self.fn.startswith("fz_"):
            return f"{self.fn}_ref(L, {', '.join(a)})"
        return f"L.{self.fn}({', '.join(a)})"


@dataclass
class Cond:
    lhs: str        # DSL text (same in both renderings) or an E
    op: str
    rhs: str
    data: Optional[E] = None   # data-dependent: data > rhs

    def dsl(self):
        if self.data is not None:
            return f"{self.data.dsl()} {self.op} {self.rhs}"
        return f"{self.lhs} {self.op} {self.rhs}"

    def ref(self):
        if self.data is not None:
            return f"{self.data.ref()} {self.op} {self.rhs}"
        return f"{self.lhs} {self.op} {self.rhs}"


@dataclass
class Ternary(E):
    cond: Cond
    a: E
    b: E

    def dsl(self):
        return f"({self.a.dsl()} if {self.cond.dsl()} else {self.b.dsl()})"

    def ref(self):
        return f"({self.a.ref()} if {self.cond.ref()} else {self.b.ref()})"


# ----------------------------------------------------------------------------
# statements
# ----------------------------------------------------------------------------

@dataclass
class Store:
    arr: Arr
    idx: list
    op: str
    value: E

    def lines(self, ind, ref):
        if ref:
            return [f"{ind}L.wr({self.arr.name}, {self.arr.mode!r}, "
                    f"({', '.join(i.dsl() for i in self.idx)},), {self.op!r}, lambda: {self.value.ref()})"]
        return [f"{ind}{self.arr.name}[{', '.join(i.dsl() for i in self.idx)}] {self.op} "
                f"{self.value.dsl()}"]


@dataclass
class ScalarSet:
    name: str
    op: str
    value: E

    def lines(self, ind, ref):
        return [f"{ind}{self.name} {self.op} {self.value.ref() if ref else self.value.dsl()}"]


@dataclass
class IfStmt:
    cond: Cond
    body: list
    orelse: list

    def lines(self, ind, ref):
        out = [f"{ind}if {self.cond.ref() if ref else self.cond.dsl()}:"]
        for s in self.body:
            out += s.lines(ind + "    ", ref)
        if self.orelse:
            out.append(f"{ind}else:")
            for s in self.orelse:
                out += s.lines(ind + "    ", ref)
        return out


@dataclass
class For:
    var: str
    rng: str          # the range(...) argument text
    body: list

    def lines(self, ind, ref):
        out = [f"{ind}for {self.var} in range({self.rng}):"]
        for s in self.body:
            out += s.lines(ind + "    ", ref)
        return out


@dataclass
class Case:
    seed: int
    dsl: str
    ref: str
    dtype: str
    params: list              # (name, kind, info): kind array|float|int
    arrays: dict              # name -> Arr (params and temps)
    sizes: tuple              # size symbols used
    has_result: bool
    size_sets: list           # list of {size: value}
    int_values: dict          # int param -> value
    features: set


# ----------------------------------------------------------------------------
# the generator
# ----------------------------------------------------------------------------

class _Gen:
    def __init__(self, seed: int):
        self.r = random.Random(seed)
        self.seed = seed
        self.features: set = set()
        self.dtype = "f32" if self.r.random() < 0.2 else "f64"
        self.sizes = ("N",) if self.r.random() < 0.5 else SIZE_NAMES
        self.arrays: dict[str, Arr] = {}
        self.access: dict[str, list] = {}      # name -> [(dim, Index, S(v))]
        self.float_scalar = self.r.random() < 0.4
        self.int_scalar = self.r.random() < 0.25
        self.func = self.r.random() < 0.25
        self.has_result = self.r.random() < 0.5
        self.locals_n = 0
        self.temps_n = 0

    # ---- arrays ----------------------------------------------------------
    def new_array(self, role: str, ndim: int, writable_mode_ok: bool = True) -> Arr:
        r = self.r
        sz = tuple(r.choice(self.sizes) for _ in range(ndim))
        if role in ("in", "inout"):
            mode = r.choice(MODES)
        elif role == "out":
            mode = r.choice((None, None, None, "zero", "clamped"))
        else:
            mode = None
        prefix = {"in": "x", "inout": "z", "out": "y", "temp": "t"}[role]
        name = f"{prefix}{sum(a.role == role for a in self.arrays.values())}"
        a = Arr(name, role, sz, mode)
        self.arrays[name] = a
        self.access[name] = []
        if mode:
            self.features.add(f"mode:{mode}")
        return a

    def index(self, arr: Arr, d: int, scope: list, write: bool) -> Index:
        """A subscript for dimension ``d`` of ``arr`` among loop variables ``scope``."""
        r = self.r
        S = arr.sizes[d]
        same = [v for v, s in scope if s == S]
        if arr.mode is None or (write and arr.mode not in ("zero", "clamped")):
            if not same or r.random() < 0.08:
                c = r.choice((0, 0, 1))
                return Index(0, None, c)
            v = r.choice(same)
            a = r.choice((1, 1, 1, 1, 2))
            c = r.choice((0, 0, 0, 1, 2))
            if a == 2:
                self.features.add("index:2i+c")
            return Index(a, v, c)
        anyv = [v for v, s in scope]
        x = r.random()
        if not anyv or x < 0.06:
            return Index(0, None, r.choice((0, 1, -1)))
        v = r.choice(same) if same and r.random() < 0.7 else r.choice(anyv)
        if x < 0.15:
            self.features.add("index:reverse")
            return Index(-1, v, r.choice((-1, 0)), 1, S)
        a = r.choice((1, 1, 1, 1, 2))
        c = r.choice((-3, -2, -1, -1, 0, 0, 1, 1, 2, 3))
        if a == 2:
            self.features.add("index:2i+c")
        return Index(a, v, c)

    def subscripts(self, arr: Arr, scope: list, write: bool = False) -> list:
        idx = []
        for d in range(len(arr.sizes)):
            ix = self.index(arr, d, scope, write)
            idx.append(ix)
            self.access[arr.name].append((d, ix))
        vs = [i.v for i in idx if i.v]
        if len(vs) >= 2 and vs != sorted(vs, key=lambda n: "ijk".index(n)):
            self.features.add("index:transposed")
        return idx

    def finish_extents(self):
        for a in self.arrays.values():
            a.ext = []
            for d in range(len(a.sizes)):
                if a.mode is not None:
                    A = self.r.choice((1, 1, 1, 2))
                    B = self.r.choice((0, 0, 1, 3))
                    a.ext.append((A, B))
                    continue
                A, B = 1, 0
                for dd, ix in self.access[a.name]:
                    if dd != d:
                        continue
                    if ix.v is None:
                        B = max(B, ix.c + 1)
                    else:
                        A = max(A, ix.a)
                        B = max(B, ix.c - ix.a + 1)
                if self.r.random() < 0.2:
                    B += 1
                a.ext.append((A, B))

    # ---- expressions -----------------------------------------------------
    def readable(self, nest_written: set) -> list:
        return [a for a in self.arrays.values()
                if a.role in ("in", "inout") or (a.role in ("out", "temp") and a.name in
                                                 nest_written)]

    def expr(self, scope, locals_, readable, depth=0) -> E:
        r = self.r
        if depth >= 2 or r.random() < 0.3:
            return self.leaf(scope, locals_, readable)
        x = r.random()
        if x < 0.45:
            op = r.choice(("+", "-", "*", "+", "-"))
            return Bin(op, self.expr(scope, locals_, readable, depth + 1),
                       self.expr(scope, locals_, readable, depth + 1))
        if x < 0.52:
            self.features.add("div")
            return SafeDiv(self.expr(scope, locals_, readable, depth + 1),
                           self.expr(scope, locals_, readable, depth + 1))
        if x < 0.85:
            fns = ["sin", "cos", "tanh", "exptanh", "sqrtp", "logp", "sq", "abs", "min", "max"]
            if self.func:
                fns += ["fz_f", "fz_f"]
            fn = r.choice(fns)
            self.features.add(f"call:{fn}")
            n = 2 if fn in ("min", "max", "fz_f") else 1
            return Call(fn, [self.expr(scope, locals_, readable, depth + 1) for _ in range(n)])
        self.features.add("ternary")
        return Ternary(self.cond(scope, readable, allow_data=True),
                       self.expr(scope, locals_, readable, depth + 1),
                       self.expr(scope, locals_, readable, depth + 1))

    def leaf(self, scope, locals_, readable) -> E:
        r = self.r
        x = r.random()
        if readable and x < 0.6:
            a = r.choice(readable)
            return Read(a, self.subscripts(a, scope))
        if locals_ and x < 0.7:
            return Name(r.choice(locals_))
        if x < 0.8:
            return Lit(r.choice(("0.5", "1.5", "2.0", "0.25", "3.0")))
        if self.float_scalar and x < 0.87:
            return Name("s")
        if scope and x < 0.94:
            self.features.add("loopvar-value")
            return Bin("*", Name(f"float({r.choice(scope)[0]})"), Lit("0.25"))
        if self.int_scalar and x < 0.97:
            return Bin("*", Name("float(q)"), Lit("0.5"))
        return Bin("*", Name(f"float({r.choice(self.sizes)})"), Lit("0.125"))

    def cond(self, scope, readable, allow_data=True) -> Cond:
        r = self.r
        if allow_data and readable and r.random() < 0.4:
            a = r.choice([a for a in readable if a.role in ("in", "inout")] or readable)
            self.features.add("if:data")
            return Cond("", r.choice((">", "<", ">=")), r.choice(("0.0", "0.3", "-0.2")),
                        Read(a, self.subscripts(a, scope)))
        self.features.add("if:affine")
        if not scope:
            return Cond(r.choice(self.sizes), r.choice((">", "<=")), "2")
        v = r.choice(scope)[0]
        x = r.random()
        if x < 0.3 and len(scope) >= 2:
            w = r.choice([s for s, _ in scope if s != v])
            return Cond(v, r.choice(("<", ">", "<=", "==", "!=")), w)
        if x < 0.45:
            return Cond(f"{v} % 2", "==", "0")
        if x < 0.6 and self.int_scalar:
            return Cond(v, "<", "q")
        if x < 0.8:
            S = r.choice(self.sizes)
            return Cond(f"{v} + {r.choice((1, 2))}", r.choice(("<", ">=")), S)
        return Cond(v, r.choice((">", "<", "==")), str(r.choice((0, 1, 2))))

    # ---- statements and nests -------------------------------------------
    def loop_range(self, var, scope) -> tuple[str, str]:
        """(range text, S) for a new loop variable."""
        r = self.r
        x = r.random()
        if scope and x < 0.25:
            u, S = r.choice(scope)
            self.features.add("bounds:triangular")
            return r.choice((u, f"{u}, {S}", f"{u} + 1, {S}")), S
        S = r.choice(self.sizes)
        if x < 0.4:
            self.features.add("bounds:strided")
            return r.choice((f"0, {S}, 2", f"1, {S}, 2", f"0, {S}, 3")), S
        if x < 0.5:
            return r.choice((f"1, {S}", f"1, {S} - 1", f"2, {S}")), S
        return S, S

    def body(self, scope, written, depth_left) -> list:
        r = self.r
        stmts = []
        locals_: list = []
        for _ in range(r.choice((1, 1, 2, 2, 3))):
            x = r.random()
            readable = self.readable(written)
            if x < 0.15:
                name = f"u{self.locals_n}"
                self.locals_n += 1
                stmts.append(ScalarSet(name, "=", self.expr(scope, locals_, readable)))
                locals_.append(name)
                self.features.add("local")
                continue
            if x < 0.3 and self.has_result:
                stmts.append(ScalarSet("acc", r.choice(("+=", "+=", "-=")),
                                       self.expr(scope, locals_, readable)))
                self.features.add("accumulate")
                continue
            st = self.store(scope, locals_, readable, written)
            if r.random() < 0.2:
                cond = self.cond(scope, readable)
                orelse = []
                if r.random() < 0.4:
                    orelse = [self.store(scope, locals_, readable, written)]
                stmts.append(IfStmt(cond, [st], orelse))
            else:
                stmts.append(st)
        return stmts

    def store(self, scope, locals_, readable, written) -> Store:
        r = self.r
        targets = [a for a in self.arrays.values() if a.role in ("out", "temp", "inout")]
        a = r.choice(targets)
        op = r.choice(("=", "=", "=", "+=", "-=", "*="))
        if a.role == "inout":
            self.features.add("inplace")
        value = self.expr(scope, locals_, readable)
        st = Store(a, self.subscripts(a, scope, write=True), op, value)
        written.add(a.name)
        return st

    def nest(self, written) -> For:
        r = self.r
        depth = r.choice((1, 1, 2, 2, 3)) if len(self.sizes) or True else 1
        self.features.add(f"depth:{depth}")
        names = "ijk"
        scope: list = []
        loops = []
        for d in range(depth):
            rng, S = self.loop_range(names[d], scope)
            scope.append((names[d], S))
            loops.append((names[d], rng, list(scope)))
        inner = self.body(list(scope), written, 0)
        node = For(loops[-1][0], loops[-1][1], inner)
        for var, rng, sc in reversed(loops[:-1]):
            pre = []
            if r.random() < 0.2:
                pre = self.body(sc, written, 0)
                self.features.add("imperfect")
            node = For(var, rng, pre + [node])
        return node

    def build(self) -> Case:
        r = self.r
        ins = [self.new_array("in", r.choice((1, 1, 2, 2, 3))) for _ in range(r.choice((1, 1, 2)))]
        if r.random() < 0.35:
            self.new_array("inout", r.choice((1, 2)))
        n_out = r.choice((0, 1, 1, 2)) if self.has_result else r.choice((1, 1, 2))
        for _ in range(n_out):
            self.new_array("out", r.choice((1, 1, 2, 3)))
        if not any(a.role in ("out", "inout") for a in self.arrays.values()):
            self.new_array("out", 1)
        n_nests = r.choice((1, 1, 2, 2, 3))
        temps = []
        if n_nests > 1 and r.random() < 0.5:
            temps.append(self.new_array("temp", r.choice((1, 2))))
            self.features.add("temp")
        written: set = set()
        nests = [self.nest(written) for _ in range(n_nests)]
        if self.has_result and not any("accumulate" == f for f in self.features):
            # make sure the result depends on something
            a = ins[0]
            scope = [("i", a.sizes[0])]
            nests.append(For("i", a.sizes[0], [ScalarSet("acc", "+=", Read(a, self.subscripts(a, scope)))]))
            self.features.add("accumulate")
        for a in self.arrays.values():
            if a.role == "inout" and a.name not in written:
                a.role = "in"       # never written: an input, as polyad sees it
        self.finish_extents()
        del ins, temps
        return self.render(nests)

    # ---- rendering -------------------------------------------------------
    def render(self, nests) -> Case:
        dt = self.dtype
        params = []
        sig = []
        for a in self.arrays.values():
            if a.role == "temp":
                continue
            t = f"pa.{dt}[{', '.join(a.extent_dsl(d) for d in range(len(a.sizes)))}]"
            if a.mode:
                t += f".{a.mode}"
            if a.role == "out":
                t = f"pa.Out({t})"
            sig.append(f"{a.name}: {t}")
            params.append((a.name, "array", a))
        if self.float_scalar:
            sig.append(f"s: pa.{dt}")
            params.append(("s", "float", None))
        if self.int_scalar:
            sig.append("q: pa.i64")
            params.append(("q", "int", None))
        ret = f" -> pa.{dt}" if self.has_result else ""
        lines = ["import polyad as pa", "", f"{', '.join(self.sizes)}, = pa.sizes({' '.join(self.sizes)!r})", ""]
        if self.func:
            lines += ["", "@pa.func", f"def fz_f(a: pa.{dt}, b: pa.{dt}) -> pa.{dt}:",
                      "    return a * pa.tanh(b) + pa.sin(a) * 0.5", ""]
        lines += ["", "@pa.kernel", f"def fz_kernel({', '.join(sig)}){ret}:"]
        ref = ["import math", "", "",
               "def fz_f_ref(L, a, b):", "    return a * L.tanh(b) + L.sin(a) * 0.5", "", "",
               "def reference(L, A, P, Z):"]
        for s in self.sizes:
            ref.append(f"    {s} = Z[{s!r}]")
        for name, kind, _ in params:
            ref.append(f"    {name} = A[{name!r}]" if kind == "array" else f"    {name} = P[{name!r}]")
        body = []
        if self.has_result:
            body.append("    acc = 0.0")
        for a in self.arrays.values():
            if a.role == "temp":
                body.append(f"    {a.name} = pa.zeros(pa.{dt}[{', '.join(a.extent_dsl(d) for d in range(len(a.sizes)))}])")
        rbody = []
        if self.has_result:
            rbody.append("    acc = 0.0")
        for a in self.arrays.values():
            if a.role == "temp":
                rbody.append(f"    {a.name} = L.zeros(({', '.join(a.extent_dsl(d) for d in range(len(a.sizes)))},))")
        for n in nests:
            body += n.lines("    ", False)
            rbody += n.lines("    ", True)
        if self.has_result:
            body.append("    return acc")
            rbody.append("    return acc")
        else:
            rbody.append("    return None")
        lines += body
        ref += rbody
        size_sets = []
        r = self.r
        tiny = (0, 1, 2, 3, 4, 5, 7)
        for _ in range(3):
            size_sets.append({s: r.choice(tiny) for s in self.sizes})
        size_sets.append({s: r.choice((3, 4, 5, 6, 7)) for s in self.sizes})
        int_values = {"q": r.choice((0, 1, 2, 3, 5))} if self.int_scalar else {}
        arrays = dict(self.arrays)
        return Case(self.seed, "\n".join(lines) + "\n", "\n".join(ref) + "\n", dt, params,
                    arrays, self.sizes, self.has_result, size_sets, int_values,
                    set(self.features) | {f"dtype:{dt}"})


def generate(seed: int) -> Case:
    """The random program of ``seed`` (deterministic)."""
    return _Gen(seed).build()
