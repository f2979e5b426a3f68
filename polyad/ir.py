"""Immutable intermediate representation of polyad kernels.

A kernel is a flat list of statements. Each statement carries its own loop
nest (affine bounds), affine conditions (part of its iteration domain), an
optional non-affine guard (evaluated at run time), a target (array element or
scalar local), an update operator and an expression. Program order is given by
``Statement.position``: the classic "2d+1" schedule interleaves the positions
with the loop variables, ``[p0, i0, p1, i1, ..., pd]``.

All nodes are frozen dataclasses; passes build new nodes. ``map_expr`` is the
identity-preserving rewriter (it returns the very same object when nothing
changed), so passes stay cheap.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional, Union

import numpy as np

from .errors import ArgumentError, InternalError, ShapeError, TypeSpecError

# --------------------------------------------------------------------------
# dtypes
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class DType:
    """A scalar element type: ``name`` (f32, f64, i32, i64, bool, bit), C type, numpy dtype.

    ``bit`` (``bits == 1``) is the one packed type: a ``bit`` array stores its elements
    in row-major order 32 to a ``uint32_t`` word (``c_type``/``np_name`` name the word),
    so it takes ``storage_bytes`` rather than one C object per element. The emitters
    read and write it through ``pa_bit_get``/``pa_bit_set``; only derived kernels make
    such arrays (tapes of branch flags).
    """

    name: str
    c_type: str
    np_name: str
    is_float: bool
    bits: int

    @property
    def np(self) -> np.dtype:
        return np.dtype(self.np_name)

    @property
    def packed(self) -> bool:
        """Several elements per C object (``bit``; ``bool`` is one ``int`` each)."""
        return self.name == "bit"

    def storage_elements(self, count: int) -> int:
        """C objects (``c_type``) holding ``count`` elements of an array of this type."""
        return -(-count // BIT_WORD) if self.packed else count

    def storage_bytes(self, count: int) -> int:
        """Bytes of an array of ``count`` elements of this type."""
        return self.storage_elements(count) * self.np.itemsize

    def __repr__(self) -> str:
        return self.name

    # ``pa.f64[M, N]`` builds an array type.
    def __getitem__(self, shape) -> "ArrayType":
        if not isinstance(shape, tuple):
            shape = (shape,)
        extents = tuple(as_extent(s) for s in shape)
        for e in extents:
            if not is_affine_extent(e):
                raise TypeSpecError(
                    f"array extent {expr_str(e)} of {self.name}[...] is not affine in the sizes",
                    "extents are sums of sizes times integer constants plus a constant, like "
                    "2 * N + 1; pass a flattened size as its own symbol, e.g. NN = pa.sizes('NN')")
        return ArrayType(self, extents)


f32 = DType("f32", "float", "float32", True, 32)
f64 = DType("f64", "double", "float64", True, 64)
i32 = DType("i32", "int32_t", "int32", False, 32)
i64 = DType("i64", "int64_t", "int64", False, 64)
boolean = DType("bool", "int", "bool", False, 1)
bit = DType("bit", "uint32_t", "uint32", False, 1)
BIT_WORD = 32   # elements of a ``bit`` array per uint32_t word
DTYPES = {d.name: d for d in (f32, f64, i32, i64)}


def promote(a: DType, b: DType) -> DType:
    """Result type of a binary arithmetic operation (numpy-like, bool counts as int)."""
    if a == b and a.is_float:
        return a
    if a.is_float or b.is_float:
        if a.is_float and b.is_float:
            return a if a.bits >= b.bits else b
        return a if a.is_float else b
    # Integer arithmetic is 64-bit whatever the operands' width: ``n * n`` of an
    # i32 parameter must not wrap at 46341 (C would do it in 32-bit int).
    return i64


# --------------------------------------------------------------------------
# expressions
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Expr:
    """Base class of expression nodes; every node has a ``dtype``."""

    def children(self) -> tuple["Expr", ...]:
        return ()

    def with_children(self, kids: tuple["Expr", ...]) -> "Expr":
        return self


@dataclass(frozen=True)
class Const(Expr):
    """A literal. ``weak`` literals (Python ``1.0``) take the type of the other operand."""

    value: Union[int, float]
    dtype: DType = f64
    weak: bool = False


@dataclass(frozen=True)
class SizeVar(Expr):
    """A symbolic size (an ISL parameter)."""

    name: str
    dtype: DType = i64


@dataclass(frozen=True)
class LoopVar(Expr):
    """The iterator of an enclosing loop."""

    name: str
    dtype: DType = i64


@dataclass(frozen=True)
class ScalarRef(Expr):
    """A scalar kernel parameter or a scalar local (incl. the returned value)."""

    name: str
    dtype: DType = f64


@dataclass(frozen=True)
class Load(Expr):
    """``array[index...]``: an element read (or, as a statement target, written)."""

    array: str
    index: tuple[Expr, ...]
    dtype: DType = f64

    def children(self):
        return self.index

    def with_children(self, kids):
        return dataclasses.replace(self, index=tuple(kids))


@dataclass(frozen=True)
class Unary(Expr):
    """``-a`` (op ``neg``) or ``not a`` (op ``not``)."""

    op: str
    a: Expr
    dtype: DType = f64

    def children(self):
        return (self.a,)

    def with_children(self, kids):
        return dataclasses.replace(self, a=kids[0])


ARITH_OPS = ("+", "-", "*", "/", "//", "%", "**")
COMPARE_OPS = ("<", "<=", ">", ">=", "==", "!=")
LOGIC_OPS = ("and", "or")


@dataclass(frozen=True)
class Binary(Expr):
    """Arithmetic (``ARITH_OPS``), comparison (``COMPARE_OPS``) or logic (``LOGIC_OPS``)."""

    op: str
    a: Expr
    b: Expr
    dtype: DType = f64

    def children(self):
        return (self.a, self.b)

    def with_children(self, kids):
        return dataclasses.replace(self, a=kids[0], b=kids[1])


@dataclass(frozen=True)
class Select(Expr):
    """``a if cond else b``."""

    cond: Expr
    a: Expr
    b: Expr
    dtype: DType = f64

    def children(self):
        return (self.cond, self.a, self.b)

    def with_children(self, kids):
        return dataclasses.replace(self, cond=kids[0], a=kids[1], b=kids[2])


@dataclass(frozen=True)
class Call(Expr):
    """An intrinsic (``exp``, ``min``, ``abs`` ...) or a device function of the kernel."""

    func: str
    args: tuple[Expr, ...]
    dtype: DType = f64

    def children(self):
        return self.args

    def with_children(self, kids):
        return dataclasses.replace(self, args=tuple(kids))


@dataclass(frozen=True)
class Cast(Expr):
    """Conversion of ``a`` to ``dtype`` (``float(i)``, ``int(x)``, implicit stores)."""

    a: Expr
    dtype: DType = f64

    def children(self):
        return (self.a,)

    def with_children(self, kids):
        return dataclasses.replace(self, a=kids[0])


def map_expr(expr: Expr, fn: Callable[[Expr], Optional[Expr]]) -> Expr:
    """Rewrite ``expr`` bottom-up: ``fn(node)`` returns a replacement or None to keep it.

    The children are rewritten first; a node whose children did not change is
    kept as the same object, so unchanged trees are returned unchanged.
    """
    kids = expr.children()
    if kids:
        new_kids = tuple(map_expr(k, fn) for k in kids)
        if any(n is not o for n, o in zip(new_kids, kids)):
            expr = expr.with_children(new_kids)
    out = fn(expr)
    return expr if out is None else out


def walk(expr: Expr) -> Iterator[Expr]:
    """All nodes of ``expr``, parents before children."""
    yield expr
    for k in expr.children():
        yield from walk(k)


def uses_loop_vars(expr: Expr, names) -> bool:
    """Does ``expr`` read any of the loop variables ``names``?"""
    return any(isinstance(x, LoopVar) and x.name in names for x in walk(expr))


def loads(expr: Expr) -> list[Load]:
    """Every array read in ``expr`` (outermost first)."""
    return [e for e in walk(expr) if isinstance(e, Load)]


def fresh_name(base: str, taken, first: int = 1, separator: str = "") -> str:
    """``base`` if it is not in ``taken``, else ``base`` + ``separator`` + the first number
    from ``first`` on that makes a name not in ``taken`` (``taken`` is not changed)."""
    name, k = base, first
    while name in taken:
        name, k = f"{base}{separator}{k}", k + 1
    return name


# --------------------------------------------------------------------------
# types of kernel parameters
# --------------------------------------------------------------------------

BOUNDARY_MODES = ("clamped", "circular", "mirror", "zero")


@dataclass(frozen=True)
class PackedLayout:
    """Storage of an array whose elements in use form a nest with affine bounds (a
    triangle, a trapezoid, a tetrahedron) instead of its bounding box: only elements
    ``x`` with ``lower[d] <= x[d] < upper[d]`` (integer expressions of the sizes and of
    ``LoopVar(names[k])`` for ``k < d``) are stored, row after row; element ``x`` lives
    at ``offset`` (an integer expression of ``LoopVar(names[d])`` and the sizes, with
    exact integer divisions ``/``) among ``count`` (of the sizes) elements. Tapes of
    derived kernels only (``polyad.ad.layout``)."""

    names: tuple[str, ...]
    lower: tuple[Expr, ...]
    upper: tuple[Expr, ...]
    offset: Expr
    count: Expr

    def __repr__(self) -> str:
        dims = []
        for name, lo, hi in zip(self.names, self.lower, self.upper):
            low = "" if isinstance(lo, Const) and lo.value == 0 else f"{expr_str(lo)} <= "
            dims.append(f"{low}{name} < {expr_str(hi)}")
        return ", ".join(dims)


@dataclass(frozen=True)
class ArrayType:
    """``pa.f64[M, N]`` optionally with a boundary mode (``.clamped`` ...); ``layout``:
    the packed storage of a tape whose elements form a triangle (None: the whole box)."""

    dtype: DType
    shape: tuple[Expr, ...]
    mode: Optional[str] = None
    layout: Optional[PackedLayout] = None

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def elements(self) -> Expr:
        """The number of elements stored, an integer expression of the sizes."""
        if self.layout is not None:
            return self.layout.count
        out: Expr = Const(1, i64)
        for ext in self.shape:
            out = ext if out == Const(1, i64) else Binary("*", out, ext, i64)
        return out

    def _with_mode(self, mode: str) -> "ArrayType":
        return dataclasses.replace(self, mode=mode)

    clamped = property(lambda self: self._with_mode("clamped"))
    circular = property(lambda self: self._with_mode("circular"))
    mirror = property(lambda self: self._with_mode("mirror"))
    zero = property(lambda self: self._with_mode("zero"))

    def __getattr__(self, name):
        # only called for names the class does not have: an unknown boundary mode
        if name.startswith("_"):
            raise AttributeError(name)
        raise TypeSpecError(f"unknown boundary mode {name!r} of {self!r}",
                            f"choose one of {', '.join('.' + m for m in BOUNDARY_MODES)}, "
                            f"or none (accesses proved in bounds)")

    def __repr__(self) -> str:
        dims = repr(self.layout) if self.layout is not None else \
            ", ".join(expr_str(s) for s in self.shape)
        return f"{self.dtype.name}[{dims}]" + (f".{self.mode}" if self.mode else "")


@dataclass(frozen=True)
class Out:
    """``pa.Out(pa.f64[M, N])``: an array the kernel writes (allocated when omitted)."""

    type: ArrayType

    def __post_init__(self):
        if not isinstance(self.type, ArrayType):
            raise TypeSpecError(f"pa.Out() takes an array type such as pa.f64[N], got "
                                f"{self.type!r}",
                                "a scalar result is returned instead: def k(...) -> pa.f64: "
                                "... return value")


@dataclass(frozen=True)
class Size:
    """A symbolic size as the user writes it; arithmetic builds affine extents."""

    expr: Expr

    def _bin(self, op, other, swap=False):
        a, b = self.expr, as_extent(other)
        return Size(Binary(op, b, a, i64) if swap else Binary(op, a, b, i64))

    __add__ = lambda s, o: s._bin("+", o)
    __radd__ = lambda s, o: s._bin("+", o, True)
    __sub__ = lambda s, o: s._bin("-", o)
    __rsub__ = lambda s, o: s._bin("-", o, True)
    __mul__ = lambda s, o: s._bin("*", o)
    __rmul__ = lambda s, o: s._bin("*", o, True)
    __floordiv__ = lambda s, o: s._bin("//", o)

    def __repr__(self) -> str:
        return expr_str(self.expr)


def as_extent(value) -> Expr:
    """An array extent from a Size, an int or an Expr."""
    if isinstance(value, Size):
        return value.expr
    if isinstance(value, Expr):
        return value
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return Const(int(value), i64)
    raise TypeSpecError(f"array extents must be sizes or integers, got {value!r} "
                        f"({type(value).__name__})",
                        "write extents like N, 2 * N + 1 or 16 (integers and pa.sizes symbols)")


def is_affine_extent(e: Expr) -> bool:
    """Affine in sizes with integer coefficients (what an ISL parameter expression can be)."""
    if isinstance(e, Const):
        return not e.dtype.is_float
    if isinstance(e, SizeVar):
        return True
    if isinstance(e, Binary) and e.op in ("+", "-"):
        return is_affine_extent(e.a) and is_affine_extent(e.b)
    if isinstance(e, Binary) and e.op == "*":
        return (isinstance(e.a, Const) and is_affine_extent(e.b)) or \
            (isinstance(e.b, Const) and is_affine_extent(e.a))
    if isinstance(e, Binary) and e.op == "//":
        return isinstance(e.b, Const) and int(e.b.value) > 0 and is_affine_extent(e.a)
    return False


# --------------------------------------------------------------------------
# statements and kernels
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Loop:
    """``for var in range(lo, hi, step)``: ``lo``/``hi`` affine, ``step`` a nonzero int."""

    var: str
    lo: Expr
    hi: Expr
    step: int = 1


def loops_cover(loops, shape) -> bool:
    """Are ``loops`` ``for v in range(0, E)`` with ``E`` the extents of ``shape``, one per
    dimension, in order (every element of an array of that shape, once)?"""
    return len(loops) == len(shape) and all(
        lp.step == 1 and isinstance(lp.lo, Const) and lp.lo.value == 0 and lp.hi == ext
        for lp, ext in zip(loops, shape))


@dataclass(frozen=True)
class Condition:
    """An affine condition of the iteration domain; ``positive=False`` means its negation."""

    expr: Expr
    positive: bool = True


@dataclass(frozen=True)
class Split:
    """One step of a statement's lineage: it is piece ``index`` of statement ``parent``,
    cut by the ``kind`` pass (``boundary``: a boundary-mode piece; ``border``: the one
    border piece of a statement whose boundary cases were too many to split one by one,
    its domain a face of the statement's, lower-dimensional; ``gather``: a piece of a
    scatter rewritten as a gather; ``jam``: the copy for one value of a small loop
    unrolled into the row loop it enclosed, ``schedule.loop_order``; ``first``: the
    instances of an update that reach their element first after its zeroing, written as
    an assignment (index 0), and the rest (index 1), ``schedule.cleanup``; ``block``: the
    copy for value ``L + index`` of a loop ``L`` blocked into the row loop,
    ``schedule.loop_order.block_sums_in_registers``)."""

    parent: str
    kind: str
    index: int


@dataclass(frozen=True)
class Statement:
    """One assignment ``target op= expr`` executed for every point of its domain.

    ``origin`` is the statement's lineage when a pass split it from a statement of the
    kernel it was given: the splits from that statement down to this piece, outermost
    first (empty for a statement that was not split).
    """

    name: str
    loops: tuple[Loop, ...]
    position: tuple[int, ...]
    conditions: tuple[Condition, ...]
    guard: Optional[Expr]
    target: Union[Load, ScalarRef]
    op: str
    expr: Expr
    line: int = 0
    source: str = ""
    origin: tuple[Split, ...] = ()

    @property
    def owner(self) -> str:
        """The name of the statement this one was split from (its own name if never split)."""
        return self.origin[0].parent if self.origin else self.name

    def piece_of(self, name: str) -> bool:
        """Is this statement ``name`` itself or a piece split from statement ``name``?"""
        return self.name == name or any(s.parent == name for s in self.origin)

    @property
    def on_border(self) -> bool:
        """Is this statement (a piece of) a ``border`` piece: instances on a face of its
        statement's domain, whose number grows a dimension slower than the interior's?"""
        return any(s.kind == "border" for s in self.origin)

    def map_exprs(self, fn: Callable[[Expr], Optional[Expr]]) -> "Statement":
        """This statement with ``map_expr(e, fn)`` applied to every expression it holds: the
        target (its indices), the value, the guard and the conditions (loop bounds are
        the caller's: a pass that renames loops rebuilds them)."""
        return dataclasses.replace(
            self, target=map_expr(self.target, fn), expr=map_expr(self.expr, fn),
            guard=None if self.guard is None else map_expr(self.guard, fn),
            conditions=tuple(dataclasses.replace(c, expr=map_expr(c.expr, fn))
                             for c in self.conditions))

    def split(self, kind: str, index: int, name: str) -> "Statement":
        """Piece ``index`` of this statement cut by the ``kind`` pass, named ``name``."""
        return dataclasses.replace(self, name=name,
                                   origin=self.origin + (Split(self.name, kind, index),))

    @property
    def loop_vars(self) -> tuple[str, ...]:
        return tuple(lp.var for lp in self.loops)

    def exprs(self) -> Iterator[Expr]:
        """Every expression the statement evaluates (target indices included)."""
        yield self.expr
        if isinstance(self.target, Load):
            yield from self.target.index
        if self.guard is not None:
            yield self.guard

    def reads(self) -> list[Load]:
        """Array elements read (the target too, for ``+=``-style updates)."""
        return list(self._reads)

    # What a statement reads, found once per statement: a statement never changes (a pass
    # makes a new one), and the passes ask the same statement again and again (a fuzz
    # kernel's adjoint, seed 17409: 100 000 questions to 200 statements, 58 s walking
    # their expressions). Kept in the instance's ``__dict__``, which dataclass
    # comparison, hashing and ``dataclasses.replace`` do not read.
    @functools.cached_property
    def _reads(self) -> tuple:
        out = loads(self.expr)
        if self.guard is not None:
            out += loads(self.guard)
        if isinstance(self.target, Load):
            for ix in self.target.index:
                out += loads(ix)
            if self.op != "=":
                out.append(self.target)
        return tuple(out)

    @functools.cached_property
    def _variables_read(self) -> tuple[frozenset, frozenset]:
        """(arrays, scalars) that ``exprs()`` reads (not a ``+=`` target's implicit read)."""
        nodes = [x for e in self.exprs() for x in walk(e)]
        return (frozenset(x.array for x in nodes if isinstance(x, Load)),
                frozenset(x.name for x in nodes if isinstance(x, ScalarRef)))

    @property
    def target_name(self) -> str:
        """The array or scalar this statement writes."""
        return self.target.array if isinstance(self.target, Load) else self.target.name

    def reads_variable(self, name: str) -> bool:
        """Does the value, a target index or the guard read array or scalar ``name``?

        (The implicit read of a ``+=`` target is not counted: see ``read_names``.)
        """
        arrays, scalars = self._variables_read
        return name in arrays or name in scalars

    def accesses(self, name: str) -> bool:
        """Does the statement read or write array or scalar ``name``?"""
        return self.target_name == name or self.reads_variable(name)

    def read_names(self) -> set[str]:
        """Every array and scalar the statement reads (a ``+=`` target included)."""
        names = self.scalar_reads() | self._variables_read[0]
        if isinstance(self.target, Load) and self.op != "=":
            names.add(self.target.array)
        return names

    def scalar_reads(self) -> set[str]:
        names = set(self._variables_read[1])
        if isinstance(self.target, ScalarRef) and self.op != "=":
            names.add(self.target.name)
        return names


@dataclass(frozen=True)
class Param:
    """A kernel parameter: ``type`` is a DType (scalar) or an ArrayType.

    ``intent`` is ``in``, ``out`` (declared ``pa.Out``) or ``inout`` (an input
    array the kernel also writes).
    """

    name: str
    type: Union[DType, ArrayType]
    intent: str = "in"

    @property
    def is_array(self) -> bool:
        return isinstance(self.type, ArrayType)


TEMP_ROLES = ("user", "primal", "tape", "adjoint", "expansion", "copy", "rows", "sum row",
              "row")


@dataclass(frozen=True)
class Temp:
    """A temporary array of the kernel; ``zero``: zero-filled before the first statement.

    ``role`` says what made it: ``user`` (``pa.zeros`` / ``pa.empty`` in the DSL),
    ``primal`` (a derived kernel's copy of a primal output or in-out array), ``tape``
    (values reverse mode stores for the adjoint), ``adjoint`` (the adjoint of an array),
    ``expansion`` (a scalar local expanded to an array by loop distribution),
    ``copy`` (old values of array elements that index-set splitting keeps across their
    update, ``schedule.split``), ``rows`` (the rolling buffer of a temporary's rows that
    a fused nest keeps per chunk of its outer loop, ``schedule.fusion``) or ``sum row``
    (the row of per-point sums that one iteration of the loops around a row keeps,
    ``schedule.loop_order``) or ``row`` (a temporary that one iteration of its nest's outer
    loops writes and reads only its own row of, shrunk to that row,
    ``schedule.fusion.rows_per_iteration``, or the few rows of a temporary that two
    loops over rows keep once run as one inside those outer loops,
    ``schedule.fusion.fuse_rows_inside``, or the slab of it one iteration of its users'
    shared loops writes and reads, ``schedule.fusion.slabs_per_iteration``). The
    generated code declares ``rows``, ``sum row`` and ``row`` buffers itself, one per
    thread (``per_thread``); callers never pass them, see ``Kernel.caller_temps``.
    ``holds`` describes its content in DSL terms where the name does not (a tape: the
    value taped and the statement that reads it). ``chunk``: for ``rows``, the loop
    variable of the chunk loop whose every iteration has its own copy;
    for a ``sum row`` or a ``row``, the variables (space-separated) of the loops any one
    of whose iterations may have its own copy (``chunk_loops``). ``block``: for a ``sum
    row`` of ``type.shape[0]`` rows, the variable of the loop the generated code runs in
    blocks of that many values, each value of a block on a row of its own (the kernel's
    statements use row 0: ``schedule.loop_order.block_sum_rows_in_registers``).
    ``copy_of``: for a derived kernel's working copy of an in-out array, that array's
    name, which messages give the copy (the caller passes ``x``, not ``x_work``).
    """

    name: str
    type: ArrayType
    zero: bool
    role: str = "user"
    holds: str = ""
    chunk: str = ""
    block: str = ""
    copy_of: str = ""

    def __post_init__(self):
        if self.role not in TEMP_ROLES:
            raise ValueError(f"temporary {self.name!r}: unknown role {self.role!r}")

    @property
    def per_thread(self) -> bool:
        """Does the generated code keep a copy per thread (``rows``, ``sum row``, ``row``)?"""
        return self.role in ("rows", "sum row", "row")

    @property
    def chunk_loops(self) -> tuple[str, ...]:
        """The loop variables whose every iteration may have its own copy."""
        return tuple(self.chunk.split())


# device functions: a tiny structured language over scalars


@dataclass(frozen=True)
class FAssign:
    name: str
    expr: Expr
    line: int = 0


@dataclass(frozen=True)
class FIf:
    cond: Expr
    then: tuple
    orelse: tuple
    line: int = 0


@dataclass(frozen=True)
class FReturn:
    expr: Expr
    line: int = 0


@dataclass(frozen=True)
class FuncDef:
    """A ``@pa.func`` scalar device function."""

    name: str
    params: tuple[tuple[str, DType], ...]
    result: DType
    locals: tuple[tuple[str, DType], ...]
    body: tuple
    filename: str = ""
    line: int = 0


@dataclass(frozen=True)
class Kernel:
    """A whole kernel: signature, locals, temporaries, statements, device functions."""

    name: str
    params: tuple[Param, ...]
    sizes: tuple[str, ...]
    locals: tuple[tuple[str, DType], ...]
    temps: tuple[Temp, ...]
    statements: tuple[Statement, ...]
    result: Optional[tuple[str, DType]] = None
    funcs: tuple[FuncDef, ...] = ()
    filename: str = ""
    line: int = 0
    int_params: tuple[str, ...] = field(default=())

    @property
    def caller_temps(self) -> tuple[Temp, ...]:
        """The temporaries the caller allocates and passes (all but the ``rows`` buffers,
        which the generated code declares itself)."""
        return tuple(t for t in self.temps if not t.per_thread)

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)

    def outputs_assigned_first(self) -> tuple[str, ...]:
        """The ``pa.Out`` arrays whose every element the kernel assigns before anything
        reads it, so their contents before a call never matter: the first statement that
        accesses one (in program order) is ``out[i0, .., ik] = value`` over
        ``for i0 in range(0, extent0)`` .. one loop per dimension, in order, each of
        step 1 over the whole extent, without a guard or condition and with a value that
        does not read ``out``; and every other statement accessing ``out`` is in a later
        top-level nest (one in the same nest could read an element before its iteration
        assigns it). A derived kernel's zeroing of its adjoint outputs is such a
        statement."""
        names = []
        for p in self.params:
            if p.intent != "out" or not p.is_array:
                continue
            users = [st for st in self.statements if st.accesses(p.name)]
            if not users:
                continue
            first = min(users, key=lambda st: st.position)
            if (first.target_name == p.name and first.op == "=" and first.guard is None
                    and not first.conditions and not first.reads_variable(p.name)
                    and first.target.index == tuple(LoopVar(lp.var) for lp in first.loops)
                    and loops_cover(first.loops, p.type.shape)
                    and all(st is first or st.position[0] > first.position[0]
                            for st in users)):
                names.append(p.name)
        return tuple(names)

    def array_type(self, name: str) -> ArrayType:
        """The type of a parameter or temporary array named ``name``."""
        for p in self.params:
            if p.name == name and p.is_array:
                return p.type
        for t in self.temps:
            if t.name == name:
                return t.type
        raise KeyError(name)

    def shown_name(self, array: str) -> str:
        """The name messages give ``array``: for a derived kernel's working copy of an
        in-out array, the array the caller passes (``Temp.copy_of``); else ``array``."""
        for t in self.temps:
            if t.name == array and t.copy_of:
                return t.copy_of
        return array

    def scalar_dtype(self, name: str) -> DType:
        for p in self.params:
            if p.name == name and not p.is_array:
                return p.type
        for n, d in self.locals:
            if n == name:
                return d
        raise KeyError(name)

    def func(self, name: str) -> Optional[FuncDef]:
        for f in self.funcs:
            if f.name == name:
                return f
        return None


# --------------------------------------------------------------------------
# printing (for messages and comments)
# --------------------------------------------------------------------------

_PREC = {"or": 1, "and": 2, "not": 3, "<": 4, "<=": 4, ">": 4, ">=": 4, "==": 4, "!=": 4,
         "+": 5, "-": 5, "*": 6, "/": 6, "//": 6, "%": 6, "neg": 7, "**": 8}


def expr_str(e: Expr, prec: int = 0) -> str:
    """Python-like text of an expression, for messages."""
    if isinstance(e, Const):
        return repr(e.value)
    if isinstance(e, (SizeVar, LoopVar, ScalarRef)):
        return e.name
    if isinstance(e, Load):
        return f"{e.array}[{', '.join(expr_str(i) for i in e.index)}]"
    if isinstance(e, Unary):
        p = _PREC["neg" if e.op == "neg" else "not"]
        s = ("-" if e.op == "neg" else "not ") + expr_str(e.a, p)
    elif isinstance(e, Binary):
        p = _PREC[e.op]
        s = f"{expr_str(e.a, p)} {e.op} {expr_str(e.b, p + 1)}"
    elif isinstance(e, Select):
        p = 0
        s = f"{expr_str(e.a, 1)} if {expr_str(e.cond, 1)} else {expr_str(e.b)}"
    elif isinstance(e, Call):
        return f"{e.func}({', '.join(expr_str(a) for a in e.args)})"
    elif isinstance(e, Cast):
        return f"{e.dtype.name}({expr_str(e.a)})"
    else:
        return repr(e)
    return f"({s})" if p < prec else s


def within_extent(e: Expr, extent: Expr) -> Expr:
    """The condition ``0 <= e < extent``: index ``e`` lies inside a dimension of that extent."""
    zero = Const(0, i64)
    return Binary("and", Binary(">=", e, zero, boolean), Binary("<", e, extent, boolean), boolean)


def fold_integer_constants(e: Expr) -> Expr:
    """Fold integer ``+ - * // %`` of constants and drop ``x + 0``, ``x * 1``, ``x * 0``.

    Used on index expressions after loop variables were replaced by the
    iterators of generated code, so ``g[0 * N + 0]`` reads ``g[0]``.
    """

    def is_int(x, v=None):
        return isinstance(x, Const) and not x.dtype.is_float and (v is None or x.value == v)

    def fn(x):
        if (isinstance(x, Binary) and x.op in ("//", "%") and not x.dtype.is_float
                and is_int(x.a) and is_int(x.b) and x.b.value != 0):  # Python's, as eval_integer
            return Const(x.a.value // x.b.value if x.op == "//" else x.a.value % x.b.value,
                         x.dtype)
        if isinstance(x, Unary) and x.op == "neg" and not x.dtype.is_float:
            if is_int(x.a):
                return Const(-x.a.value, x.dtype)
            if isinstance(x.a, Unary) and x.a.op == "neg":
                return x.a.a
        if isinstance(x, Binary) and not x.dtype.is_float and x.op in ("+", "-", "*"):
            a, b = x.a, x.b
            if is_int(a) and is_int(b):
                return Const({"+": a.value + b.value, "-": a.value - b.value,
                              "*": a.value * b.value}[x.op], x.dtype)
            if x.op == "*" and (is_int(a, 0) or is_int(b, 0)):
                return Const(0, x.dtype)
            if x.op == "*" and is_int(a, 1):
                return b
            if x.op in ("*",) and is_int(b, 1) or x.op in ("+", "-") and is_int(b, 0):
                return a
            if x.op == "+" and is_int(a, 0):
                return b
            if (x.op in ("+", "-") and is_int(b) and isinstance(a, Binary)
                    and a.op in ("+", "-") and is_int(a.b)):  # (e - 1) + 1  ->  e
                inner = a.b.value if a.op == "+" else -a.b.value
                total = inner + (b.value if x.op == "+" else -b.value)
                if total == 0:
                    return a.a
                return Binary("+" if total > 0 else "-", a.a, Const(abs(total), b.dtype), x.dtype)
            if x.op in ("+", "-") and is_int(b) and b.value < 0:
                return Binary("-" if x.op == "+" else "+", a, Const(-b.value, b.dtype), x.dtype)
            if (x.op in ("+", "-") and isinstance(b, Binary) and b.op == "*" and is_int(b.a)
                    and b.a.value < 0):  # a + (-2 * i)  ->  a - 2 * i
                pos = b.b if b.a.value == -1 else Binary("*", Const(-b.a.value, b.a.dtype), b.b,
                                                         b.dtype)
                return Binary("-" if x.op == "+" else "+", a, pos, x.dtype)
        return None

    return map_expr(e, fn)


def substitute(e: Expr, values: dict) -> Expr:
    """Replace loop variables by expressions (``values``: name -> Expr)."""
    return map_expr(e, lambda x: values.get(x.name) if isinstance(x, LoopVar) else None)


def substitute_sizes(e: Expr, sizes: dict) -> Expr:
    """Replace size variables by expressions (``sizes``: name -> Expr)."""
    return map_expr(e, lambda x: sizes.get(x.name) if isinstance(x, SizeVar) else None)


def walk_many(exprs) -> Iterator[Expr]:
    """All nodes of several expressions."""
    for e in exprs:
        yield from walk(e)


def stored_elements(at: ArrayType, env: dict) -> Optional[int]:
    """Elements an array of type ``at`` stores for the sizes ``env`` (negative extents
    count as 0, as allocations take them); None when a size is missing."""
    if at.layout is not None:
        n = eval_integer(at.layout.count, env)
        return None if n is None else max(0, n)
    out = 1
    for ext in at.shape:
        n = eval_integer(ext, env)
        if n is None:
            return None
        out *= max(0, n)
    return out


def eval_integer(e: Expr, env: dict) -> Optional[int]:
    """Value of an integer (affine) expression of sizes, integer parameters and loop
    variables, looked up by name in ``env``; None when a name is missing."""
    if isinstance(e, Const):
        return int(e.value)
    if isinstance(e, (SizeVar, ScalarRef, LoopVar)):
        v = env.get(e.name)
        return None if v is None else int(v)
    if isinstance(e, Cast):
        return eval_integer(e.a, env)
    if isinstance(e, Unary) and e.op == "neg":
        v = eval_integer(e.a, env)
        return None if v is None else -v
    if isinstance(e, Binary) and e.op in ("+", "-", "*", "//", "%"):
        a, b = eval_integer(e.a, env), eval_integer(e.b, env)
        if a is None or b is None or (e.op in ("//", "%") and b == 0):
            return None
        ops = {"+": int.__add__, "-": int.__sub__, "*": int.__mul__, "//": int.__floordiv__,
               "%": int.__mod__}
        return ops[e.op](a, b)
    return None



def solve_extent(e: Expr, value: int, sizes: dict) -> Optional[tuple[str, int]]:
    """``(size name, its value)`` solving ``e == value`` for the single size of ``e``
    missing from ``sizes`` (``e`` linear in it); None when there is no such single
    unknown or no integer solution."""
    unknown = {x.name for x in walk(e) if isinstance(x, SizeVar) and x.name not in sizes}
    if len(unknown) != 1:
        return None
    name = unknown.pop()
    f0 = eval_integer(e, {**sizes, name: 0})
    f1 = eval_integer(e, {**sizes, name: 1})
    if f0 is None or f1 is None or f1 == f0:
        return None
    x, rem = divmod(value - f0, f1 - f0)
    if rem or eval_integer(e, {**sizes, name: x}) != value:
        return None
    return name, x


def infer_sizes(kernel: "Kernel", shapes: dict, sizes: dict) -> dict:
    """All sizes of ``kernel``: those given in ``sizes`` (name -> int) and those the
    array shapes determine (``shapes``: parameter name -> shape tuple, for the arrays
    passed). Raises ``ShapeError`` when a shape contradicts the declared extents
    (or a size would be negative), ``ArgumentError`` naming the sizes no shape
    determines."""
    sizes = {n: int(v) for n, v in sizes.items()}
    pending = []
    for p in kernel.params:
        if p.is_array and p.name in shapes:
            shape = tuple(shapes[p.name])
            if len(shape) != p.type.ndim:
                raise ShapeError(f"{kernel.name}(): argument {p.name!r} has {len(shape)} "
                                 f"dimension(s), expected {p.type.ndim} ({p.type!r})")
            pending += [(p.name, d, ext, n) for d, (ext, n) in enumerate(zip(p.type.shape, shape))]
    progress = True
    while pending and progress:
        progress = False
        for item in list(pending):
            name, d, ext, n = item
            v = eval_integer(ext, sizes)
            if v is None:
                solved = solve_extent(ext, n, sizes)
                if solved is None:
                    continue
                sizes[solved[0]] = solved[1]
                v = n
            if v != n:
                raise ShapeError(
                    f"{kernel.name}(): dimension {d} of {name!r} has length {n}, but the kernel "
                    f"declares {expr_str(ext)} = {v} "
                    f"(with {', '.join(f'{s} = {sizes[s]}' for s in sorted(sizes))})")
            pending.remove(item)
            progress = True
    missing = [s for s in kernel.sizes if s not in sizes]
    if missing:
        raise ArgumentError(f"{kernel.name}(): cannot infer size(s) {', '.join(missing)} from the "
                            f"arguments; pass them as keywords, e.g. {missing[0]}=...")
    for s in kernel.sizes:
        if sizes[s] < 0:
            raise ShapeError(f"{kernel.name}(): size {s} = {sizes[s]}, but sizes must be >= 0")
    return sizes

# --------------------------------------------------------------------------
# internal failures
# --------------------------------------------------------------------------

# Exceptions that only a bug in polyad lets escape a stage (bad input raises
# PolyadError subclasses, or ValueError where a caller turns it into one).
BUG_EXCEPTIONS = (TypeError, KeyError, IndexError, AttributeError, AssertionError,
                  NotImplementedError, ZeroDivisionError)


@contextlib.contextmanager
def internal_errors(stage: str, kernel: Kernel, also: tuple = ()):
    """Turn a bug escaping ``stage`` (e.g. "scheduling") of ``kernel`` into an
    ``InternalError`` naming the kernel and the DSL statement being processed: the
    innermost frame of the traceback that holds a ``Statement`` names it. ``also``:
    exception types beyond ``BUG_EXCEPTIONS`` that mean a bug in this stage (a later
    stage's library's, e.g. ``isl.Error``)."""
    try:
        yield
    except BUG_EXCEPTIONS + tuple(also) as err:
        st = _statement_of(err.__traceback__)
        raise InternalError(stage, kernel.name, kernel.filename or "<unknown>",
                            st.line if st is not None and st.line else kernel.line,
                            st.name if st is not None else None,
                            st.source if st is not None else "", err) from err


def _statement_of(tb) -> Optional[Statement]:
    found = None
    while tb is not None:
        for value in tb.tb_frame.f_locals.values():
            if isinstance(value, Statement):
                found = value
                break
        tb = tb.tb_next
    return found
