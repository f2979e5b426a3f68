"""The ISL model of a kernel: the one module that knows raw islpy tricks.

- ``PolyModel(kernel)`` holds one ``isl.Context`` for one kernel and turns the
  IR into ISL objects: parameter context, statement domains, access relations
  and the original (program-order) schedule map.
- ``split_boundary_pieces(kernel)`` resolves boundary modes: every statement
  whose accesses go through a mode is split into pieces whose accesses are
  plain affine indices (interior code) plus thin border pieces — the
  piecewise-affine access maps of DESIGN §4, returned as IR.
- ``check_bounds(model)`` proves that every access lies inside its array,
  raising ``BoundsError`` with an offending iteration for unchecked arrays and
  collecting the size conditions that circular/mirror pieces need.
- ``dependences(model)`` computes flow, anti and output dependences per array
  (and per scalar) with ``UnionAccessInfo.compute_flow``: value-based, or
  memory-based for ``+=`` accumulators where the caller asks (the scheduler's
  loop test, for which both agree; see ``accumulator_arrays``). Each variable's
  answer is remembered in the process by the text of its input
  (``_variable_analysis``), for the next build of the kernel with other options.
- ``tile_footprint(kernel, axes, ...)`` measures, along each size an array is
  cut along, how many cells past its own elements a tile must see (the
  transitive dataflow from the results it owns), for ``polyad.dask``.

Names inside ISL are the DSL names (statement ``S3``, loop variable ``n``,
size ``N``, array ``g``), so ``pa.explain`` output reads like the source.
"""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import hashlib
import itertools
import math
import os
import select
import signal
import time
import warnings
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Callable, Optional

import islpy as isl

from . import ir
from .errors import BoundsError
from .ir import (Binary, Call, Cast, Condition, Const, Expr, Load, LoopVar, ScalarRef, Select, SizeVar,
                 Statement, Unary)
from .recent import Recent

# ISL failing on the sets and maps a stage builds from a kernel the frontend accepted is a
# bug of polyad's (an input ISL rejects, or an ISL limit not contained): the stages raise
# it as ``pa.InternalError`` naming the stage (``ir.internal_errors(..., also=...)``), like
# their own bugs. The analyses that fall back on ISL's failure catch it inside.
ISL_FAILURES = (isl.Error,)

def coalesced(s):
    """``s.coalesce()`` (a set or map, or a union of them), or ``s`` itself where ISL's
    coalescing fails: it is the same set, only written with more pieces. (Fuzz seed 17924:
    "cannot relax redundant constraint" on the domain of a vjp's zeroing statement, a
    union of 40 pieces, and then on the union of the domains of its position.) Under an
    ``operation_quota`` the failure propagates: the quota's caller gives up on it."""
    try:
        return s.coalesce()
    except isl.Error:
        if s.get_ctx().get_max_operations():
            raise
        return s


# Words the ISL parser reserves; DSL names equal to one of these get a suffix.
_ISL_WORDS = {"and", "or", "not", "mod", "floor", "ceil", "min", "max", "exists", "true",
              "false", "infty", "NaN", "implies", "xor", "domain", "range", "params", "cond"}


def isl_name(name: str) -> str:
    """``name`` as an ISL identifier: ISL's keywords and polyad's own prefix ``pa_`` (its
    parameters, ``schedule.build.SMALL_SIZES``, and the C helpers the AST's names print
    beside) take a trailing underscore, the same rule as ``emit.cexpr.cname``, so that a
    size prints in the AST's C as in the signature."""
    return name + "_" if name in _ISL_WORDS or name.startswith("pa_") else name


def affine_text(e: Expr) -> str:
    """An affine IR expression in ISL syntax (the frontend has checked affinity)."""
    if isinstance(e, Const):
        return str(int(e.value))
    if isinstance(e, (LoopVar, SizeVar, ScalarRef)):
        return isl_name(e.name)
    if isinstance(e, Cast):
        return affine_text(e.a)
    if isinstance(e, Unary) and e.op == "neg":
        return f"(-{affine_text(e.a)})"
    if isinstance(e, Binary):
        a, b = affine_text(e.a), affine_text(e.b)
        if e.op in ("+", "-", "*"):
            return f"({a} {e.op} {b})"
        if e.op == "//":
            return f"floor(({a})/{b})"
        if e.op == "%":
            return f"(({a}) mod {b})"
    if isinstance(e, Call) and e.func in ("min", "max") and not e.dtype.is_float:
        return f"{e.func}({', '.join(affine_text(x) for x in e.args)})"
    raise ValueError(f"not an affine expression: {ir.expr_str(e)}")


def approximate(ld: Load) -> bool:
    """Is ``PolyModel.access_map`` of ``ld`` an over-approximation (an index through min or
    max: a border piece's resolved boundary mode)?"""
    return any(isinstance(x, Call) for e in ld.index for x in ir.walk(e))


@dataclass(frozen=True)
class SizeRequirement:
    """Sizes for which a circular/mirror piece would still fall outside the array."""

    bad_params: isl.Set
    message: str


class PolyModel:
    """ISL objects of one kernel, all in one ``isl.Context``.

    One compilation builds one model of its input kernel; each pass that
    rewrites the kernel asks ``model.for_kernel(new)`` for the model of its
    result, which shares the context and the domains of the statements the
    pass kept.
    """

    def __init__(self, kernel: ir.Kernel, _parent: Optional["PolyModel"] = None):
        self.kernel = kernel
        self.ctx = _parent.ctx if _parent is not None else isl.Context()
        self.params = [isl_name(s) for s in kernel.sizes] + \
                      [isl_name(p) for p in kernel.int_params]
        self.param_prefix = f"[{', '.join(self.params)}] -> " if self.params else ""
        cons = [f"{isl_name(s)} >= 0" for s in kernel.sizes]
        for p in kernel.params:
            if p.is_array:
                cons += [f"{affine_text(e)} >= 0" for e in p.type.shape]
        # (not the temporaries' extents: a tape of N - 1 rows at N = 0 is never touched, and
        # assuming N >= 1 from it let the code of the vjp touch it anyway, fuzz seed 1077;
        # the buffers are allocated with negative extents clamped to 0)
        self.context_text = self.param_prefix + "{ : " + (" and ".join(cons) or "true") + " }"
        self.context = isl.Set.read_from_str(self.ctx, self.context_text)
        self.max_depth = max((len(s.loops) for s in kernel.statements), default=0)
        # id(statement) -> (statement, domain): a domain depends on the statement and the
        # context only, so models of one compilation with the same context share them.
        shared = _parent is not None and _parent.context_text == self.context_text
        self._domains: dict[int, tuple[Statement, isl.Set]] = _parent._domains if shared else {}
        # (id(statement), load) -> (statement, access map): like the domains, shared.
        self._access_maps: dict[tuple, tuple[Statement, isl.Map]] = (
            _parent._access_maps if shared else {})
        # (array, None) -> its elements; (array, d) -> indices outside dimension d.
        self._boxes: dict[tuple, isl.Set] = {}
        # schedule_tree's answers (passes ask several times for one kernel's order).
        self._trees: dict[Optional[tuple], isl.Schedule] = {}

    def for_kernel(self, kernel: ir.Kernel) -> "PolyModel":
        """The model of ``kernel`` (this model's kernel rewritten by a pass): this model for
        the same kernel, else one sharing this model's context and kept statements' domains."""
        return self if kernel is self.kernel else PolyModel(kernel, _parent=self)

    # ---- sets ----------------------------------------------------------
    def set(self, tuple_text: str, constraint: str) -> isl.Set:
        s = isl.Set.read_from_str(self.ctx, f"{self.param_prefix}{{ {tuple_text} : {constraint} }}")
        return s.intersect_params(self.context)

    def condition_set(self, st: Statement, e: Expr) -> isl.Set:
        """The points of ``st``'s space where the affine boolean ``e`` holds."""
        tup = self.tuple_text(st)
        if isinstance(e, Binary) and e.op == "and":
            return self.condition_set(st, e.a).intersect(self.condition_set(st, e.b))
        if isinstance(e, Binary) and e.op == "or":
            return self.condition_set(st, e.a).union(self.condition_set(st, e.b))
        if isinstance(e, Unary) and e.op == "not":
            return self.set(tup, "true").subtract(self.condition_set(st, e.a))
        if isinstance(e, Binary) and e.op in ir.COMPARE_OPS:
            op = "=" if e.op == "==" else e.op
            if op == "!=":
                return self.set(tup, "true").subtract(
                    self.set(tup, f"{affine_text(e.a)} = {affine_text(e.b)}"))
            return self.set(tup, f"{affine_text(e.a)} {op} {affine_text(e.b)}")
        raise ValueError(f"not an affine condition: {ir.expr_str(e)}")

    def tuple_text(self, st: Statement) -> str:
        return f"{st.name}[{', '.join(isl_name(v) for v in st.loop_vars)}]"

    def value_map(self, st: Statement, e: Expr) -> isl.Map:
        """``{ S[i, ...] -> [e] }`` over the domain of ``st``: each instance -> the value of
        the affine expression ``e`` of its iterators and the sizes (a loop variable: the
        iteration of that loop the instance runs in)."""
        return isl.Map.read_from_str(
            self.ctx, f"{self.param_prefix}{{ {self.tuple_text(st)} -> [{affine_text(e)}] }}"
        ).intersect_domain(self.domain(st))

    def domain(self, st: Statement) -> isl.Set:
        """The iteration domain of ``st``: its loops and affine conditions."""
        hit = self._domains.get(id(st))
        if hit is not None and hit[0] is st:
            return hit[1]
        cons = []
        for lp in st.loops:
            v, lo, hi = isl_name(lp.var), affine_text(lp.lo), affine_text(lp.hi)
            if lp.step > 0:
                cons.append(f"{lo} <= {v} < {hi}")
                if lp.step != 1:
                    cons.append(f"({v} - {lo}) mod {lp.step} = 0")
            else:
                cons.append(f"{hi} < {v} <= {lo}")
                if lp.step != -1:
                    cons.append(f"({lo} - {v}) mod {-lp.step} = 0")
        dom = self.set(self.tuple_text(st), " and ".join(cons) or "true")
        for c in st.conditions:
            cs = self.condition_set(st, c.expr)
            dom = dom.intersect(cs) if c.positive else dom.subtract(cs)
        dom = coalesced(dom)
        self._domains[id(st)] = (st, dom)
        return dom

    def seed_domain(self, st: Statement, dom: isl.Set) -> None:
        """Record ``dom`` as the domain of ``st`` (a pass that built ``st`` knows it already:
        the boundary pieces are cut from their statement's domain)."""
        self._domains[id(st)] = (st, coalesced(dom))

    def union_domain(self) -> isl.UnionSet:
        return union_of([self.domain(st).to_union_set() for st in self.kernel.statements],
                        isl.UnionSet.empty(self.context.get_space()))

    # ---- arrays ----------------------------------------------------------
    def array_box(self, array: str) -> isl.Set:
        """``{ A[i0, i1, ...] : 0 <= i_d < extent_d }``: the elements of ``array``."""
        key = (array, None)
        if key not in self._boxes:
            at = self.kernel.array_type(array)
            idx = [f"i{d}" for d in range(at.ndim)]
            cons = " and ".join(f"0 <= {v} < {affine_text(ext)}" for v, ext in zip(idx, at.shape))
            self._boxes[key] = self.set(f"{array}[{', '.join(idx)}]", cons or "true")
        return self._boxes[key]

    def outside_dimension(self, array: str, d: int) -> isl.Set:
        """The indices of ``array`` outside its extent along dimension ``d``."""
        key = (array, d)
        if key not in self._boxes:
            at = self.kernel.array_type(array)
            idx = [f"i{k}" for k in range(at.ndim)]
            ext = affine_text(at.shape[d])
            self._boxes[key] = self.set(f"{array}[{', '.join(idx)}]",
                                        f"i{d} < 0 or i{d} >= {ext}")
        return self._boxes[key]

    # ---- accesses --------------------------------------------------------
    def access_map(self, st: Statement, ld: Load) -> isl.Map:
        """``{ S[i] -> A[index(i)] }`` restricted to the domain of ``st``.

        An index through min/max (a border piece's resolved boundary mode, see
        ``split_boundary_pieces``) gives, per part of the domain, the simple hull of the
        exact relation: the cells it touches and a few more next to them. The exact
        relation of ``x[max(0, min(i + a - 1, X - 1)), ...]`` has one piece per
        combination of cases, and the analyses (dependences, the scheduler) would pay
        for their product again; an over-approximation keeps them sound as long as
        such a write counts only as a may-write (``accesses``, ``approximate``).
        ``exact_access_map`` gives the exact relation (the bounds proof).
        """
        key = (id(st), ld)
        hit = self._access_maps.get(key)
        if hit is not None and hit[0] is st:
            return hit[1]
        m = self.exact_access_map(st, ld)
        if approximate(ld):
            hull = isl.Map.empty(m.get_space())
            for part in self.domain(st).get_basic_sets():
                hull = hull.union(m.intersect_domain(part).simple_hull())
            m = hull.intersect_domain(self.domain(st))
        self._access_maps[key] = (st, m)
        return m

    def exact_access_map(self, st: Statement, ld: Load) -> isl.Map:
        """``{ S[i] -> A[index(i)] }`` restricted to the domain of ``st``, exactly."""
        idx = ", ".join(affine_text(e) for e in ld.index)
        m = isl.Map.read_from_str(
            self.ctx, f"{self.param_prefix}{{ {self.tuple_text(st)} -> {ld.array}[{idx}] }}")
        return m.intersect_domain(self.domain(st))

    def scalar_map(self, st: Statement, name: str) -> isl.Map:
        m = isl.Map.read_from_str(
            self.ctx, f"{self.param_prefix}{{ {self.tuple_text(st)} -> {name}[] }}")
        return m.intersect_domain(self.domain(st))

    def accesses(self, statements: Optional[list[Statement]] = None):
        """(reads, must_writes, may_writes) as UnionMaps of ``statements`` (default: all of
        the kernel's); scalars are 0-d arrays.

        A guarded statement's write is only a may-write (the guard may be false), and so
        is a write whose relation ``access_map`` over-approximates.
        """
        space = self.context.get_space()
        reads = isl.UnionMap.empty(space)
        must = isl.UnionMap.empty(space)
        may = isl.UnionMap.empty(space)
        locals_ = dict(self.kernel.locals)
        for st in self.kernel.statements if statements is None else statements:
            for ld in st.reads():
                reads = reads.union(self.access_map(st, ld).to_union_map())
            for name in st.scalar_reads():
                if name in locals_:
                    reads = reads.union(self.scalar_map(st, name).to_union_map())
            t = st.target
            w = self.access_map(st, t) if isinstance(t, Load) else self.scalar_map(st, t.name)
            may = may.union(w.to_union_map())
            if st.guard is None and not (isinstance(t, Load) and approximate(t)):
                must = must.union(w.to_union_map())
        return reads, must, may

    def schedule_tree(self, names: Optional[dict[str, str]] = None,
                      statements: Optional[list[Statement]] = None) -> isl.Schedule:
        """The original program order as a schedule tree: a sequence node where statements
        sit side by side, a one-member band per loop.

        ``names``: statement name -> the name its instances take (several pieces of one
        statement may share one: their domains are united). ``statements``: only these
        (default: all of the kernel's). The same order as ``schedule_map``; isl's
        dependence analysis on a tree compares statements in different children of a
        sequence without any polyhedral work.
        """
        key = (None if names is None else tuple(sorted(names.items())),
               None if statements is None else tuple(st.name for st in statements))
        if key not in self._trees:
            self._trees[key] = self._schedule_tree(
                names, self.kernel.statements if statements is None else statements)
        return self._trees[key]

    def _schedule_tree(self, names: Optional[dict[str, str]], statements) -> isl.Schedule:
        entries = []
        for st in statements:
            dom = self.domain(st)
            if names is not None:
                dom = dom.set_tuple_name(names[st.name])
            entries.append((st, dom))
        if not entries:
            return isl.Schedule.from_domain(isl.UnionSet.empty(self.context.get_space()))
        return self._order_tree(entries, 0)

    def _order_tree(self, entries: list, depth: int) -> isl.Schedule:
        """The program order of ``entries`` ((statement, domain) pairs sharing their loops
        and positions above loop level ``depth``) from that level down."""
        groups: dict[int, list] = {}
        for st, dom in entries:
            groups.setdefault(st.position[depth], []).append((st, dom))
        out = None
        for _, group in sorted(groups.items()):
            domain = isl.UnionSet.empty(self.context.get_space())
            for _, dom in group:
                domain = domain.union(dom.to_union_set())
            looped = [st for st, _ in group if len(st.loops) > depth]
            if not looped:  # one statement (or the pieces of one) at this position
                part = isl.Schedule.from_domain(coalesced(domain))
            elif len(looped) < len(group):
                raise ValueError(f"position {group[0][0].position[:depth + 1]} holds both a "
                                 f"loop and a statement")
            else:
                # the loop's iterator as an affine function of the variables of each
                # statement space (pieces sharing a name share it), defined on the whole
                # space as a band's schedule may be (the tree's domain restricts it):
                # built directly, not from a relation, whose conversion to a function
                # by ISL costs most of the tree's time on piecewise domains
                member, named = None, set()
                for st, dom in group:
                    if dom.get_tuple_name() in named:
                        continue
                    named.add(dom.get_tuple_name())
                    lp = st.loops[depth]
                    aff = isl.Aff.var_on_domain(isl.LocalSpace.from_space(dom.get_space()),
                                                isl.dim_type.set, st.loop_vars.index(lp.var))
                    piece = isl.UnionPwAff.from_pw_aff(isl.PwAff.from_aff(
                        aff if lp.step > 0 else aff.neg()))
                    member = piece if member is None else member.union_add(piece)
                part = self._order_tree(group, depth + 1).insert_partial_schedule(
                    isl.MultiUnionPwAff.from_union_pw_aff(member))
            out = part if out is None else out.sequence(part)
        return out

    def schedule_map(self) -> isl.UnionMap:
        """The original program order as the 2d+1 map ``S[i, j] -> [p0, i, p1, j, p2, ...]``."""
        width = 2 * self.max_depth + 1
        parts = []
        for st in self.kernel.statements:
            dims = []
            for k, lp in enumerate(st.loops):
                dims += [str(st.position[k]), isl_name(lp.var) if lp.step > 0
                         else f"-{isl_name(lp.var)}"]
            dims.append(str(st.position[len(st.loops)]))
            dims += ["0"] * (width - len(dims))
            m = isl.Map.read_from_str(
                self.ctx, f"{self.param_prefix}{{ {self.tuple_text(st)} -> [{', '.join(dims)}] }}")
            parts.append(m.intersect_domain(self.domain(st)).to_union_map())
        return union_of(parts, isl.UnionMap.empty(self.context.get_space()))


# --------------------------------------------------------------------------
# boundary modes -> pieces
# --------------------------------------------------------------------------


def _dim_pieces(e: Expr, extent: Expr, mode: str):
    """(condition, resolved index or None for 'zero') pieces of one index dimension."""
    zero, one, two = Const(0, ir.i64), Const(1, ir.i64), Const(2, ir.i64)
    inside = ir.within_extent(e, extent)
    below = Binary("<", e, zero, ir.boolean)
    above = Binary(">=", e, extent, ir.boolean)
    plus = lambda a, b: Binary("+", a, b, ir.i64)
    minus = lambda a, b: Binary("-", a, b, ir.i64)
    resolved = {
        "clamped": (zero, minus(extent, one)),
        "circular": (plus(e, extent), minus(e, extent)),
        "mirror": (Unary("neg", e, ir.i64), minus(minus(Binary("*", two, extent, ir.i64), two), e)),
        "zero": (None, None),
    }[mode]
    return [(inside, e), (below, resolved[0]), (above, resolved[1])]


def _moded_loads(kernel: ir.Kernel, st: Statement) -> list[Load]:
    """The distinct accesses of ``st`` through a boundary mode (equal loads resolve alike)."""
    found = ir.loads(st.expr) + (ir.loads(st.guard) if st.guard is not None else [])
    if isinstance(st.target, Load):
        found.append(st.target)
    return list(dict.fromkeys(ld for ld in found if kernel.array_type(ld.array).mode))


def model_of(kernel: ir.Kernel, model: Optional[PolyModel] = None) -> PolyModel:
    """The model of ``kernel``: derived from ``model`` (a model of an earlier form of the
    kernel in the same compilation) when given, else a fresh one."""
    return model.for_kernel(kernel) if model is not None else PolyModel(kernel)


# A statement whose boundary cases combine into more pieces than this is split into
# its interior and ONE border piece instead (when every mode it reads through has a
# closed form, see ``_border_index``): each piece is a statement the scheduler and
# ISL's AST generator handle on its own, and their number is the product of the
# cases of every index (a 27-point clamped read alone has 3^3), which made AST
# generation take most of a compile (energy27's gradient: 11 s of 15 s). Up to this
# many the border pieces keep plain affine indices, which the gather passes invert
# (a 3x3 stencil's adjoint, tv's two neighbours, a 5-tap filter).
MAX_FINE_PIECES = 4

# Modes a border piece resolves in closed form: clamped and mirror by a min/max index
# (``_border_index``), zero by a read under a condition (``_zero_border_read``);
# circular is always split case by case.
_BORDER_MODES = ("clamped", "mirror", "zero")


def split_boundary_pieces(kernel: ir.Kernel, model: Optional[PolyModel] = None) -> ir.Kernel:
    """Resolve boundary modes by splitting statements into affine pieces.

    Returns a kernel whose statements access arrays only through plain affine
    indices or, on a border piece, min/max of them: each statement with accesses
    through ``.clamped``, ``.circular``, ``.mirror`` or ``.zero`` is replaced by
    one piece per combination of index ranges that occurs (named ``S3_0``,
    ``S3_1``, ...; a statement needing no split keeps its name). Reads outside a
    ``.zero`` array become the constant 0; writes outside it drop the piece.
    A statement that would split into more than ``MAX_FINE_PIECES`` pieces, all
    of whose modes are clamped, mirror or zero, becomes two instead when the rest of
    its domain is a face of it (``lower_dimensional``): its interior (every index
    inside its array, the same piece as above) and its border (that rest, split
    kind ``border``), whose indices resolve the mode with min/max (``_border_index``)
    and whose ``.zero`` reads are 0 where they leave the array (``_zero_border_read``).
    """
    model = model_of(kernel, model)
    new_statements = []
    for st in kernel.statements:
        moded = _moded_loads(kernel, st)
        if not moded:
            new_statements.append(st)
            continue
        coarse = all(kernel.array_type(ld.array).mode in _BORDER_MODES for ld in moded)
        pieces = _case_pieces(kernel, model, st, moded, MAX_FINE_PIECES if coarse else None)
        if pieces is None:
            pieces = (_interior_and_border(kernel, model, st, moded)
                      or _case_pieces(kernel, model, st, moded, None))
        for k, (conds, pdom, choice, kind) in enumerate(pieces):
            piece = _resolve_piece(st, choice)
            if piece is None:
                continue
            if len(pieces) > 1:
                piece = piece.split(kind, k, f"{st.name}_{k}")
            piece = dataclasses.replace(piece, conditions=st.conditions + conds)
            model.seed_domain(piece, pdom.set_tuple_name(piece.name))
            new_statements.append(piece)
    return dataclasses.replace(kernel, statements=tuple(new_statements))


def _case_pieces(kernel, model: PolyModel, st: Statement, moded: list[Load],
                 limit: Optional[int]) -> Optional[list]:
    """The pieces of ``st``, one per combination of index cases that occurs:
    (extra conditions, domain, {load: [resolved index | None per dimension]}, split kind);
    None once they would be more than ``limit``."""
    pieces = [((), model.domain(st), {})]
    for ld in moded:
        at = kernel.array_type(ld.array)
        for e, ext in zip(ld.index, at.shape):
            refined = []
            for conds, pdom, choice in pieces:
                for cond, res in _dim_pieces(e, ext, at.mode):
                    cset = model.condition_set(st, cond)
                    sub = pdom.intersect(cset)
                    if sub.is_empty():
                        continue
                    implied = pdom.is_subset(cset)
                    refined.append((conds if implied else conds + (Condition(cond),),
                                    pdom if implied else coalesced(sub),
                                    {**choice, ld: choice.get(ld, []) + [res]}))
            pieces = refined
            if limit is not None and len(pieces) > limit:
                return None
    return [(conds, pdom, choice, "boundary") for conds, pdom, choice in pieces]


def _interior_and_border(kernel, model: PolyModel, st: Statement,
                         moded: list[Load]) -> Optional[list]:
    """``st``'s interior piece (every moded index inside its array: plain indices) and its
    border piece (the rest: each index that leaves the array there resolved by
    ``_border_index``, or by its one case when the border stays on one side), in the form
    of ``_case_pieces``; either is absent when empty. None when the border is not
    lower-dimensional (``x[2 * i]`` over ``i < N``: half the domain), where its own
    nest would be a leading term of the work."""
    dom = model.domain(st)
    inside = []  # (load, dimension, condition, its set) where the domain leaves the array
    for ld in moded:
        at = kernel.array_type(ld.array)
        for d, (e, ext) in enumerate(zip(ld.index, at.shape)):
            cond = _dim_pieces(e, ext, at.mode)[0][0]
            cset = model.condition_set(st, cond)
            if not dom.is_subset(cset):
                inside.append((ld, d, cond, cset))
    interior = dom
    for _, _, _, cset in inside:
        interior = interior.intersect(cset)
    interior = coalesced(interior)
    border = coalesced(dom.subtract(interior))
    plain = {ld: list(ld.index) for ld in moded}
    border_choice = {ld: list(ld.index) for ld in moded}
    leaving: dict[Load, list] = {}  # .zero load -> its dimensions that leave the array
    for ld, d, _, cset in inside:
        if border.is_subset(cset):
            continue
        at = kernel.array_type(ld.array)
        e, ext = ld.index[d], at.shape[d]
        cases = [res for cond, res in _dim_pieces(e, ext, at.mode)
                 if not border.intersect(model.condition_set(st, cond)).is_empty()]
        if at.mode != "zero":
            border_choice[ld][d] = cases[0] if len(cases) == 1 else \
                _border_index(e, ext, at.mode)
        elif len(cases) == 1:
            border_choice[ld][d] = cases[0]  # outside the array on the whole border: 0
        else:
            leaving.setdefault(ld, []).append(d)
    for ld, dims in leaving.items():
        if None in border_choice[ld]:
            continue  # outside the array on the whole border already
        at = kernel.array_type(ld.array)
        within = border
        for d in dims:
            within = within.intersect(model.condition_set(
                st, ir.within_extent(ld.index[d], at.shape[d])))
        if within.is_empty():
            border_choice[ld] = [None] * len(ld.index)  # some index leaves it everywhere
        elif ld == st.target:
            return None  # a write kept on part of the border only: pieces case by case
        else:
            border_choice[ld] = _zero_border_read(ld, dims, at)
    if not lower_dimensional(border):
        return None
    pieces = []
    if not interior.is_empty():
        pieces.append((tuple(Condition(c) for _, _, c, _ in inside), interior, plain,
                       "boundary"))
    if not border.is_empty():
        everywhere_inside = None
        for _, _, c, _ in inside:
            everywhere_inside = c if everywhere_inside is None else \
                Binary("and", everywhere_inside, c, ir.boolean)
        pieces.append(((Condition(everywhere_inside, positive=False),), border, border_choice,
                       "border"))
    return pieces


def lower_dimensional(s: isl.Set) -> bool:
    """Does every part of ``s`` lie in a hyperplane of its space (a face of a loop nest:
    ``S[m = 0, n]``, ``S[m, a, b = 0, n = 0]``), so that it has a dimension fewer?"""
    def pinned(b: isl.BasicSet) -> bool:
        return any(c.is_equality() and any(
            not c.get_coefficient_val(isl.dim_type.set, d).is_zero()
            for d in range(b.dim(isl.dim_type.set)))
            for c in b.affine_hull().get_constraints())
    return all(pinned(b) for b in s.get_basic_sets())


def _border_index(e: Expr, extent: Expr, mode: str) -> Expr:
    """Where index ``e`` lands under ``mode`` on every side at once, as min/max of affine
    expressions (C and ISL both read them): clamped ``max(0, min(e, extent - 1))``;
    mirror ``min(|e|, 2 extent - 2 - e)`` with ``|e| = max(e, -e)``: ``-e`` below the
    array, ``2 extent - 2 - e`` above it, one reflection as in ``_dim_pieces``, so the
    bounds proof asks the sizes for it. (``2 extent - 2 - |e|`` would reflect an index
    below the array a second time, about the far edge, where ``-e >= extent``: the
    primal then ran at sizes its derivatives' pieces refuse; fuzz seed 16295.)"""
    lo = lambda a, b: Call("min", (a, b), ir.i64)
    hi = lambda a, b: Call("max", (a, b), ir.i64)
    zero, one, two = Const(0, ir.i64), Const(1, ir.i64), Const(2, ir.i64)
    last = Binary("-", extent, one, ir.i64)
    if mode == "clamped":
        return hi(zero, lo(e, last))
    assert mode == "mirror", mode
    size = hi(e, Unary("neg", e, ir.i64))
    return lo(size, Binary("-", Binary("*", two, last, ir.i64), e, ir.i64))


def _zero_border_read(ld: Load, dims: list, at: ir.ArrayType) -> Expr:
    """Read ``ld`` of a ``.zero`` array where its indices ``dims`` leave the array on part
    of a border piece: ``(inside ? ld[clamped indices] : 0)``; the clamped indices keep
    the read in bounds where the condition is false (C evaluates only one branch, but the
    bounds proof reads the access as written)."""
    inside = None
    index = list(ld.index)
    for d in dims:
        cond = ir.within_extent(ld.index[d], at.shape[d])
        inside = cond if inside is None else Binary("and", inside, cond, ir.boolean)
        index[d] = _border_index(ld.index[d], at.shape[d], "clamped")
    return Select(inside, dataclasses.replace(ld, index=tuple(index)),
                  Const(0.0 if ld.dtype.is_float else 0, ld.dtype), ld.dtype)


def _resolve_piece(st: Statement, choice: dict) -> Optional[Statement]:
    """``st`` with each moded load replaced by its resolved access, 0, or None if dropped;
    a choice that is an expression (``_zero_border_read``) replaces its load as it is."""

    def resolved(ld: Load) -> Optional[Expr]:
        idx = choice[ld]
        if isinstance(idx, Expr):
            return idx
        return None if any(i is None for i in idx) else dataclasses.replace(ld, index=tuple(idx))

    def fn(e: Expr) -> Optional[Expr]:
        if isinstance(e, Load) and e in choice:
            r = resolved(e)
            return Const(0.0 if e.dtype.is_float else 0, e.dtype) if r is None else r
        return None

    target = st.target
    if isinstance(target, Load) and target in choice:
        target = resolved(target)
        if target is None:
            return None  # a write outside a .zero array is dropped
    guard = ir.map_expr(st.guard, fn) if st.guard is not None else None
    return dataclasses.replace(st, target=target, expr=ir.map_expr(st.expr, fn), guard=guard)


def boundary_access_map(model: PolyModel, st: Statement, ld: Load) -> isl.Map:
    """The access ``ld`` of ``st`` as ISL sees it through the array's boundary mode.

    ``g[m, n - 1]`` on a clamped ``g`` is the piecewise map
    ``{ S[m, n] -> g[m, n - 1] : n >= 1; S[m, 0] -> g[m, 0] }`` (DESIGN §4):
    one piece per combination of index ranges, the same pieces
    ``split_boundary_pieces`` turns into statements. For ``.zero`` arrays the
    pieces outside the array are absent (those reads give 0, writes are
    dropped). ``model`` is the model of the kernel *before* splitting; an
    access to an array without mode is its plain affine map.
    """
    at = model.kernel.array_type(ld.array)
    plain = model.access_map(st, ld)
    if not at.mode:
        return plain
    out = isl.Map.empty(plain.get_space())
    per_dim = [_dim_pieces(e, ext, at.mode) for e, ext in zip(ld.index, at.shape)]
    for combo in itertools.product(*per_dim):
        if any(res is None for _, res in combo):
            continue
        piece = model.access_map(st, dataclasses.replace(ld, index=tuple(r for _, r in combo)))
        for cond, _ in combo:
            piece = piece.intersect_domain(model.condition_set(st, cond))
        out = out.union(piece)
    return coalesced(out)


# --------------------------------------------------------------------------
# bounds proof
# --------------------------------------------------------------------------


def check_bounds(kernel: ir.Kernel, model: PolyModel,
                 written: Optional[ir.Kernel] = None) -> list[SizeRequirement]:
    """Prove every access of the (piece-split) ``kernel`` lies inside its array.

    Raises ``BoundsError`` naming the access and an iteration that falls
    outside when the array has no boundary mode and the access is wrong even
    for large sizes. Out-of-bounds cases that only small sizes produce
    (circular/mirror pieces whose offset exceeds the size, a stencil written
    for N >= 2 called with N = 1, ``x[i, 0]`` with N = 0) are returned as
    requirements the runtime checks before calling the C code. ``written``: the
    kernel ``split_boundary_pieces`` split into ``kernel``, whose accesses (as the
    DSL wrote them) the requirements of boundary modes then name.
    """
    requirements = []
    written_statements = {st.name: st for st in written.statements} if written else {}
    for st in kernel.statements:
        accesses = [(ld, "reads") for ld in st.reads() if ld is not st.target]
        if isinstance(st.target, Load):
            accesses.append((st.target, "writes"))
        # reads the statement's run-time guard alone makes (its line is the statement's)
        guard_loads = set(ir.loads(st.guard)) - set(ir.loads(st.expr)) - {st.target} \
            if st.guard is not None else set()
        seen = set()
        for ld, verb in accesses:
            key = (ld.array, ld.index, verb)
            if key in seen:
                continue
            seen.add(key)
            at = kernel.array_type(ld.array)
            acc_map = model.exact_access_map(st, ld)
            if acc_map.range().is_subset(model.array_box(ld.array)):
                continue  # (most accesses: one test instead of one per dimension)
            for d, ext in enumerate(at.shape):
                bad = acc_map.intersect_range(model.outside_dimension(ld.array, d)).domain()
                if bad.is_empty():
                    continue
                name = kernel.shown_name(ld.array)
                bad_sizes = coalesced(bad.params())
                if at.mode is None and _persists_for_large_sizes(bad_sizes, model):
                    raise _bounds_error(kernel, st, ld, verb, d, bad, model, name)
                # Out of bounds only for finitely many (small) sizes: a call-time check.
                shown = _as_written(ld, written, written_statements.get(
                    st.origin[-1].parent if st.origin else st.name))
                shown_index = ", ".join(ir.expr_str(i) for i in shown.index)
                where = (f"in the condition of the if guarding line {st.line}"
                         if ld in guard_loads else f"at line {st.line}")
                why = (f"the {at.mode} access {name}[{shown_index}] {where} "
                       f"needs the size of dimension {d} of {name!r} ({ir.expr_str(ext)}) "
                       f"to exceed its offset"
                       if at.mode else
                       f"{name}[{shown_index}] {where} would fall outside {name!r} "
                       f"for these sizes")
                requirements.append(SizeRequirement(bad_sizes, why))
    return requirements


def guard_requirements(kernel: ir.Kernel) -> list[SizeRequirement]:
    """The size requirements of the run-time guards of ``kernel`` (as written) whose
    statement writes a ``.zero`` array: the DSL tests a guard at its ``if``, as Python
    does, in every iteration, also where the write is dropped, and
    ``split_boundary_pieces`` drops those instances with their guard. Each such guard is
    checked here as a statement of its own over its statement's whole domain, one that
    reads nothing else, so that its reads through a mode ask the sizes what any read asks
    (fuzz seed 17810: the clamped read of an empty array in the condition of a dropped
    write ran instead of refusing the sizes)."""
    probes = tuple(
        dataclasses.replace(st, target=ScalarRef(f"{st.name}_guard", ir.i64), op="=",
                            expr=Const(0, ir.i64))
        for st in kernel.statements
        if st.guard is not None and isinstance(st.target, Load)
        and kernel.array_type(st.target.array).mode == "zero"
        and any(kernel.array_type(ld.array).mode for ld in ir.loads(st.guard)))
    if not probes:
        return []
    written = dataclasses.replace(kernel, statements=probes)
    model = PolyModel(written)
    split = split_boundary_pieces(written, model)
    return check_bounds(split, model.for_kernel(split), written=written)


def _as_written(ld: Load, written: Optional[ir.Kernel], st: Optional[Statement]) -> Load:
    """The access of statement ``st`` of ``written`` (the kernel before
    ``split_boundary_pieces``) that ``ld``, an access of one of its pieces, resolves
    through its array's boundary mode: the load of the same array each of whose indices
    resolves to ``ld``'s (a case of ``_dim_pieces`` or the border form
    ``_border_index``); ``ld`` itself where none does, or without a mode."""
    if st is None or written is None or not written.array_type(ld.array).mode:
        return ld
    at = written.array_type(ld.array)

    def resolves(e: Expr, ext: Expr, piece_index: Expr) -> bool:
        forms = [res for _, res in _dim_pieces(e, ext, at.mode)]
        if at.mode in ("clamped", "mirror"):
            forms.append(_border_index(e, ext, at.mode))
        return piece_index in forms

    for cand in _moded_loads(written, st):
        if cand.array == ld.array and all(
                resolves(e, ext, i) for e, ext, i in zip(cand.index, at.shape, ld.index)):
            return cand
    return ld


# Sizes at least this large exceed any offset a real kernel uses: an access that is
# out of bounds even when every size is this large is a bug in the kernel, not a
# small-size corner case.
LARGE_SIZE = 1 << 16


def _persists_for_large_sizes(bad_sizes: isl.Set, model: PolyModel) -> bool:
    """True if some access falls outside its array even when every size is large."""
    large = " and ".join(f"{isl_name(s)} >= {LARGE_SIZE}" for s in model.kernel.sizes)
    if not large:
        return not bad_sizes.is_empty()
    big = isl.Set.read_from_str(model.ctx, f"{model.param_prefix}{{ : {large} }}")
    return not bad_sizes.intersect(big).is_empty()


def _bounds_error(kernel, st, ld, verb, d, bad: isl.Set, model: PolyModel, name: str):
    """The BoundsError of access ``ld`` of ``st`` outside dimension ``d`` at a point of
    ``bad``; ``name``: the array's name in messages (``Kernel.shown_name``)."""
    pt = bad.sample_point()
    dsl_params = list(kernel.sizes) + list(kernel.int_params)  # model.params, unmangled
    env = {p: pt.get_coordinate_val(isl.dim_type.param, k).to_python()
           for k, p in enumerate(dsl_params)}
    env.update({v: pt.get_coordinate_val(isl.dim_type.set, k).to_python()
                for k, v in enumerate(st.loop_vars)})
    idx = [ir.eval_integer(i, env) for i in ld.index]
    ext = ir.eval_integer(kernel.array_type(ld.array).shape[d], env)
    where = ", ".join(f"{v} = {env[v]}" for v in st.loop_vars) or "its only iteration"
    index_params = [p for p in kernel.int_params
                    if any(isinstance(x, ir.ScalarRef) and x.name == p
                           for x in ir.walk(ld.index[d]))]
    sizes = ", ".join(f"{s} = {env[s]}" for s in (*kernel.sizes, *index_params))
    access = f"{name}[{', '.join(ir.expr_str(i) for i in ld.index)}]"
    msg = (f"{access} {verb} {name}[{', '.join(map(str, idx))}] at {where}"
           f"{' when ' + sizes if sizes else ''}, outside dimension {d} of {name!r} "
           f"(extent {ir.expr_str(kernel.array_type(ld.array).shape[d])} = {ext})")
    mode = f"pa.{kernel.array_type(ld.array)}.clamped"
    if index_params:
        names = ", ".join(repr(p) for p in index_params)
        hint = (f"the index depends on the integer parameter(s) {names}, which a caller may set "
                f"to any value, so polyad cannot prove the access in bounds: declare a boundary "
                f"mode on {name!r}, such as {mode} (an index outside is clamped; .zero reads 0 "
                f"and drops writes), or index with loop variables and sizes only")
    else:
        hint = (f"declare a boundary mode on {name!r}, such as {mode} (or .zero, .circular, "
                f".mirror), or shrink the loop bounds")
    return BoundsError(msg, kernel.filename, st.line, 0, hint)


# --------------------------------------------------------------------------
# dependences
# --------------------------------------------------------------------------


@dataclass
class Dependences:
    """Flow (RAW), anti (WAR) and output (WAW) dependences, one UnionMap per variable.

    ``anti`` holds the read-to-write dependences that are not also output
    dependences (where removing those ran past ``ANTI_DUPLICATES_QUOTA``, some are in
    both), so ``anti | output`` is every false dependence.
    ``memory_based``: the variables whose dependences are memory-based (every
    earlier access of the same element, not only the last one; see
    ``dependences``), the others' are value-based except those of the ``rows``
    buffers of fused nests (``schedule.fusion``), memory-based too, flow, anti and
    output: value-based analysis of a buffer indexed modulo its height costs minutes,
    and loops inside one chunk (the only ones that read these) are sequential under
    either where the buffer carries a row.

    For the memory-based accumulators, ``same_element`` holds every pair of write
    instances of one element, in both orders (each instance with itself too): a loop
    carries a memory-based output dependence iff it runs the two instances of such a
    pair in different iterations of one execution, which is all the loop test asks.
    Their ordered dependences (``output``, and ``flow``: the pairs into a reader), which
    a schedule's legality check needs, are made from those pairs when first asked for
    (``order_accumulators``; ``all`` does): ordering the pairs costs more than finding
    them, and most compilations never ask.
    """

    flow: dict[str, isl.UnionMap] = field(default_factory=dict)
    anti: dict[str, isl.UnionMap] = field(default_factory=dict)
    output: dict[str, isl.UnionMap] = field(default_factory=dict)
    memory_based: frozenset = frozenset()
    same_element: dict[str, isl.UnionMap] = field(default_factory=dict)
    # the program order the accumulators' pairs are ordered by, and their readers
    order: Optional[isl.Schedule] = None
    readers: dict[str, isl.UnionSet] = field(default_factory=dict)
    # variable -> why its dependences are memory-based where value-based ones were asked
    # for (ISL's exact analysis failed or ran past ``DEPENDENCE_QUOTA``): ``pa.explain``
    inexact: dict[str, str] = field(default_factory=dict)

    def order_accumulators(self) -> None:
        """Fill ``output`` and ``flow`` of the memory-based accumulators from their
        ``same_element`` pairs: the pairs whose first instance runs first."""
        missing = [v for v in self.same_element if v not in self.output]
        if not missing:
            return
        sched = self.order.get_map()
        for var in missing:
            output = _in_order(self.same_element[var], sched)
            self.output[var] = output
            self.flow[var] = coalesced(output.intersect_range(self.readers[var]))
            self.anti[var] = isl.UnionMap.empty(output.get_space())

    def accumulator_order(self, var: str) -> isl.UnionMap:
        """The pairs of updates of the memory-based accumulator ``var`` whose first
        instance runs first: the output dependences ``order_accumulators`` stores, here
        made without storing them (a compilation that asks for one variable's pays for
        that one only)."""
        if var in self.output:
            return self.output[var]
        return _in_order(self.same_element[var], self.order.get_map())

    def all(self, space) -> isl.UnionMap:
        self.order_accumulators()
        return coalesced(union_of([m for d in (self.flow, self.anti, self.output)
                                   for m in d.values()], isl.UnionMap.empty(space)))


def _by_variable(umap: isl.UnionMap) -> dict[str, isl.UnionMap]:
    parts: dict[str, list] = {}
    umap.foreach_map(lambda m: parts.setdefault(m.get_tuple_name(isl.dim_type.out), [])
                     .append(m.to_union_map()))
    return {name: union_of(maps, isl.UnionMap.empty(umap.get_space()))
            for name, maps in parts.items()}


def same_element(sources: isl.UnionMap, sinks: isl.UnionMap) -> isl.UnionMap:
    """{source instance -> sink instance : they access the same element}."""
    return coalesced(sources.apply_range(sinks.reverse()))


def statement_schedules(sched: isl.UnionMap) -> dict[str, isl.Map]:
    """``sched``'s map of each statement, by the statement's name."""
    return {m.get_tuple_name(isl.dim_type.in_): m for m in maps_of(sched)}


def pairs_run_in_order(pairs: isl.Map, schedules: dict[str, isl.Map],
                       backwards: bool = False) -> isl.Map:
    """The pairs of ``pairs`` (instances of one statement to instances of one statement)
    whose first instance the statement schedules ``schedules`` run before the second
    (``backwards``: after it). Maps of one statement pair, not the order relation of a
    whole union schedule, which has a map for every pair of statements (the blocked
    copies of a conv layer's row sums, 60 statements, spent 8.8 s building it, most of
    it for copies that never touch one another's elements)."""
    first = schedules[pairs.get_tuple_name(isl.dim_type.in_)]
    then = schedules[pairs.get_tuple_name(isl.dim_type.out)]
    return pairs.intersect(first.lex_gt_map(then) if backwards else first.lex_lt_map(then))


def union_of(parts: list, empty):
    """The union of ``parts`` (union sets or union maps), ``empty`` when there are none.

    By halves: each ``a.union(b)`` copies both operands (islpy hands ISL copies of its
    arguments, so nothing is updated in place), and adding n parts one at a time to a
    growing union is quadratic: the 14742 statement pairs of a fuzz kernel's adjoint
    scatter (seed 17409) took 43 s to add up that way."""
    while len(parts) > 1:
        parts = [parts[k].union(parts[k + 1]) if k + 1 < len(parts) else parts[k]
                 for k in range(0, len(parts), 2)]
    return parts[0] if parts else empty


def _in_order(pairs: isl.UnionMap, sched: isl.UnionMap) -> isl.UnionMap:
    """The pairs of ``pairs`` whose first instance ``sched`` runs first, statement pair
    by statement pair, for the pairs that access one element at all."""
    schedules = statement_schedules(sched)
    return coalesced(union_of([pairs_run_in_order(m, schedules).to_union_map()
                               for m in maps_of(pairs) if not m.is_empty()],
                              isl.UnionMap.empty(pairs.get_space())))


def _ordered_pairs(sources: isl.UnionMap, sinks: isl.UnionMap,
                   sched: isl.UnionMap) -> isl.UnionMap:
    """{source instance -> sink instance : same element, source scheduled first}."""
    return _in_order(same_element(sources, sinks), sched)


def dependences(model: PolyModel, variables: Optional[set] = None,
                 flow_only: frozenset = frozenset(),
                 memory_based_accumulators: bool = False) -> Dependences:
    """Dependences of the kernel in program order.

    ``variables`` limits the analysis to those arrays/scalars; for the ones in
    ``flow_only`` only flow dependences are computed (dependence analysis is
    the expensive part of compilation, so passes ask only for what they use).

    ``memory_based_accumulators``: for the arrays ``accumulator_arrays`` names,
    give memory-based dependences (every earlier write of the same element, no
    kills) instead of value-based ones (the last write only). Value-based
    analysis of a clamped stencil's adjoint scatter ``d_u[i + a - 1, ...] +=``
    (27 pieces whose accesses differ) costs tens of seconds; the memory-based
    ones come from the pairs of writes of one element (``Dependences.same_element``),
    ordered only when asked for. The caller must need no more than what both
    answers agree on: a loop carries a dependence of such an array under one iff
    it does under the other (the argument is in ``accumulator_arrays``), which is
    all the loop test asks of an array; both are valid constraints for a
    scheduler (ISL's proximity objective may still pick a different schedule, so
    ``schedule_kernel`` gives the ISL scheduler value-based ones). The same flag gives
    memory-based dependences for the temporaries of scalar expansion (role
    ``expansion``) that the unrolled copies of a loop update
    (``loop_order.jam_small_loops``; ISL's exact analysis of which copy wrote last is
    slow): a superset of the value-based ones, and each such temporary holds one element
    per iteration of the loops it expands, indexed by their variables, so every pair of
    accesses of one element lies in one such iteration and at one value of each of those
    loops: no loop that threads or vector lanes run separates a pair under either answer
    (the CUDA target's conv-layer row sum ``s_rows[b, co, h, v]``, three taps updating it
    in a row, cost the exact analysis a quarter of a second). Per-thread buffers
    (``Temp.per_thread``) always get memory-based dependences: their elements are reused.
    """
    # A pass asking about a few variables pays only for the statements that touch them.
    variables = None if variables is None else set(variables)
    statements = None if variables is None else [
        st for st in model.kernel.statements
        if st.target_name in variables or st.read_names() & variables]
    reads, must, may = model.accesses(statements)
    tree = model.schedule_tree(statements=statements)
    r_by, must_by, may_by = _by_variable(reads), _by_variable(must), _by_variable(may)
    # Boundary pieces of one statement share its place in program order. Where the
    # union of the pieces' accesses of a variable is one affine relation per statement
    # (scalars, always grouped; arrays whose index no boundary mode resolves, like the
    # filter gradient d_w[a, b, c] of a clamped stencil), analyse each statement once
    # over the union of its pieces and hand every piece its share of the answer (exact:
    # the pieces partition the statement's domain): 27 pieces of a 3x3x3 clamped
    # stencil otherwise make 27^2 flow problems. Accesses that stay piecewise keep
    # per-piece analysis: compute_flow on piecewise relations is slower, not faster.
    group_names, to_group = _program_order_groups(model, statements)
    group_tree = model.schedule_tree(group_names, statements) \
        if len(set(group_names.values())) < len(group_names) else None
    scalars = {n for n, _ in model.kernel.locals}
    memory_based = accumulator_arrays(model.kernel) if memory_based_accumulators else frozenset()
    deps = Dependences(memory_based=frozenset(v for v in memory_based if v in may_by and (
        variables is None or v in variables)))
    space = model.context.get_space()
    jammed = {st.target_name for st in model.kernel.statements
              if any(s.kind == "jam" for s in st.origin)}
    memory_based_temps = {t.name for t in model.kernel.temps if t.per_thread or (
        memory_based_accumulators and t.role == "expansion" and t.name in jammed)}
    for var in may_by:
        if variables is not None and var not in variables:
            continue
        per_piece = [m.get(var, isl.UnionMap.empty(space)) for m in (r_by, must_by, may_by)]
        if var in deps.memory_based:
            writes = per_piece[2]
            deps.same_element[var] = same_element(writes, writes)
            deps.readers[var] = per_piece[0].domain()
            deps.order = tree
            continue
        accesses, var_tree = per_piece, tree
        if group_tree is not None:
            grouped = [coalesced(m.apply_domain(to_group)) for m in per_piece]
            if var in scalars or all(_one_relation_per_statement(m) for m in grouped):
                accesses, var_tree = grouped, group_tree
        var_deps, inexact = _variable_analysis(accesses, var_tree, var in memory_based_temps,
                                               var in flow_only)
        if inexact:
            deps.inexact[var] = inexact
        for kind, umap in zip((deps.flow, deps.output, deps.anti), var_deps):
            if umap is None:
                continue
            if var_tree is group_tree:
                to_piece = to_group.reverse()
                umap = umap.apply_domain(to_piece).apply_range(to_piece)
            kind[var] = umap if var in memory_based_temps else coalesced(umap)
    return deps


def accumulator_arrays(kernel: ir.Kernel) -> frozenset:
    """The arrays of ``kernel`` that only ``+=``/``-=`` updates touch inside loops.

    Every statement accessing such an array ``V`` either updates it with
    ``+=``/``-=`` and reads ``V`` nowhere else (value, indices, guard), or
    writes it with ``=`` without reading it, sharing no loop with any other
    statement accessing ``V`` (the zero-initialization of an adjoint) but updates
    of the element it writes, ``V[i, j, k]`` in its loops i, j, k (the zeroing
    fused into the first nest of updates).

    For these arrays memory-based and value-based dependences agree on which
    loops carry a dependence, for any schedule that respects either. Take
    instances ``x`` before ``y`` touching one element in the same execution of
    a loop, in different iterations of it (a memory-based dependence the loop
    carries). Every instance executed between them runs inside that loop
    execution, and every read of ``V`` is an update that also writes the
    element. The writes of the element from ``x`` up to the last one before
    ``y`` form a chain of value-based output dependences (each the last write
    before the next), ending in a flow or output dependence into ``y``; some
    link of the chain crosses from one iteration to a later one. The converse
    holds since value-based dependences are memory-based ones. No loop holds
    an ``=`` write of ``V`` next to an update in program order, so the loop
    test sees only updates, which all reduce by ``+``: which kinds are carried
    is never reported (a scatter is; only a loop of ISL's scheduler that fuses
    the zeroing with the updates reports them, as output dependences), and
    memory-based anti dependences without output ones are empty (every read
    instance writes its element).
    """
    scalars = {n for n, _ in kernel.locals}

    def apart(init: Statement, other: Statement) -> bool:
        """``init`` shares no loop with ``other``, or (the zeroing fused into the nest
        of the updates) writes the element of its own iteration, ``V[i, j, k]`` under
        loops i, j, k, and ``other`` is an update of that same element inside those
        loops: no loop both share carries a dependence between them under either
        analysis, and the loops inside hold updates only (the argument above)."""
        if not init.loops or not other.loops or init.position[0] != other.position[0]:
            return True
        c = len(init.loops)
        own = tuple(LoopVar(lp.var) for lp in init.loops)
        return (init.target.index == own and other.op in ("+=", "-=")
                and other.target.index == own and other.loops[:c] == init.loops
                and other.position[:c] == init.position[:c])

    statements: dict[str, list[Statement]] = {}
    for st in kernel.statements:
        names = {st.target_name} | {x.array for e in st.exprs() for x in ir.walk(e)
                                     if isinstance(x, Load)}
        for name in names - scalars:
            statements.setdefault(name, []).append(st)
    out = []
    for name, users in statements.items():
        if any(st.reads_variable(name) for st in users):
            continue
        updates = [st for st in users if st.op in ("+=", "-=")]
        inits = [st for st in users if st.op == "="]
        if len(updates) + len(inits) != len(users) or not updates:
            continue
        if all(apart(st, other) for st in inits for other in users if other is not st):
            out.append(name)
    return frozenset(out)


# The answers of this process's recent analyses of one variable's dependences
# (``_variable_analysis``), by a digest of the text of their input: the builds of one
# kernel for several options (deterministic, unfused, another target) run the same first
# passes on the same statements, and ask the same questions of them (the deconvolution
# gradient's dead-code elimination took 0.7-0.9 s of each build after the first, 0.14 s
# with this memory).
recent_analyses = Recent(512)


def _variable_analysis(accesses, tree: isl.Schedule, memory_based: bool, flow_only: bool):
    """``((flow, output, anti), why)`` for one variable whose ``accesses`` are (reads,
    must-writes, writes) under the schedule ``tree``: memory-based (``_memory_based_pairs``)
    where ``memory_based``, else ``_variable_dependences``'s answer (output and anti None
    when ``flow_only``), and why it is memory-based (None where ISL's exact analysis
    answered).

    The answer is a function of the accesses and of the order of their statements only,
    so it is remembered by the text of those (``recent_analyses``) and, when asked again,
    read back from its text into the context of ``tree`` (text is all that crosses ISL
    contexts; each compilation has its own): the same relations. (Read back on every
    call, remembered or not, the relations made the passes after slower, not faster.)"""
    reads, must, writes = accesses
    tree = tree.intersect_domain(writes.domain().union(reads.domain()))
    key = hashlib.sha256("\0".join((
        str(memory_based), str(flow_only), reads.to_str(), must.to_str(), writes.to_str(),
        tree.to_str())).encode()).hexdigest()
    answer = recent_analyses.get(key)
    if answer is None:
        if memory_based:
            found = (_memory_based_pairs(writes, reads, tree),
                     _memory_based_pairs(writes, writes, tree),
                     _memory_based_pairs(reads, writes, tree))
            why = None
        else:
            *found, why = _variable_dependences(reads, must, writes, tree, flow_only)
        recent_analyses.keep(key, (tuple(None if m is None else m.to_str() for m in found), why))
        return tuple(found), why
    texts, why = answer
    ctx = tree.get_ctx()
    return tuple(None if t is None else isl.UnionMap.read_from_str(ctx, t) for t in texts), why


def _memory_based_pairs(sources: isl.UnionMap, sinks: isl.UnionMap,
                        tree: isl.Schedule) -> isl.UnionMap:
    """``{ source access -> later sink access of the same element }`` under ``tree``: the
    pairs of instances accessing one element, ordered by the tree's schedule map.
    (``compute_flow`` with may-sources only gives the same relation at up to 7x the time:
    the deconvolution gradient's rolling row buffers, indexed modulo their height, took
    2.1 s there and 0.9 s here.)"""
    sched = tree.get_map().intersect_domain(sources.domain().union(sinks.domain()))
    return _ordered_pairs(sources, sinks, sched)


def _one_relation_per_statement(umap: isl.UnionMap) -> bool:
    """True if every map of ``umap`` is a single basic map (no piecewise access)."""
    return all(m.n_basic_map() == 1 for m in maps_of(umap))


def maps_of(umap: isl.UnionMap) -> list[isl.Map]:
    """The maps of a union map, one per pair of statement spaces."""
    out: list[isl.Map] = []
    umap.foreach_map(out.append)
    return out


def projected_accesses(model: "PolyModel", statements: list, c: int, arrays: set):
    """(writes, touches): the elements of ``arrays`` that ``statements`` write, and
    access at all, as union maps from the values of their ``c`` outer loops (None
    when there are none)."""
    writes = touches = None
    for st in statements:
        found = [ld for ld in st.reads() if ld.array in arrays]
        wrote = isinstance(st.target, Load) and st.target.array in arrays
        if wrote:
            found.append(st.target)
        for ld in found:
            m = model.access_map(st, ld)
            m = m.project_out(isl.dim_type.in_, c, m.dim(isl.dim_type.in_) - c) \
                .reset_tuple_id(isl.dim_type.in_).to_union_map()
            touches = m if touches is None else touches.union(m)
            if wrote and ld is st.target:
                writes = m if writes is None else writes.union(m)
    return writes, touches


def within_outer_iterations(dep: isl.Map, c: int) -> bool:
    """True if every pair of ``dep`` has equal first ``c`` iterators in source and
    target: the dependence stays inside one iteration of the ``c`` shared outer loops."""
    same = dep
    for k in range(c):
        same = same.equate(isl.dim_type.in_, k, isl.dim_type.out, k)
    return dep.is_subset(same)


@contextlib.contextmanager
def operation_quota(ctx: isl.Context, operations: int):
    """ISL calls on ``ctx`` inside the block raise ``isl.Error`` once they have made
    ``operations`` operations; the bound is cleared on the way out, whatever happens (a
    context left with a spent quota fails every later call)."""
    ctx.reset_operations()
    ctx.set_max_operations(operations)
    try:
        yield
    finally:
        ctx.set_max_operations(0)
        ctx.reset_operations()


def quota_spent(exc: isl.Error) -> bool:
    """Whether ``exc`` is ISL's error for a spent ``operation_quota`` (islpy's errors
    carry ISL's message, not its error code)."""
    return "maximal number of operations exceeded" in str(exc)


def text_within_seconds(compute: Callable[[], Optional[str]], seconds: float) \
        -> tuple[Optional[str], str]:
    """(``compute()``, '') run in a forked child process that may take ``seconds`` of wall
    time; (None, why) when it returns None, raises, crashes or runs past them (it is then
    killed). ``compute`` does ISL work and returns its result as text (``Schedule.to_str``),
    which the caller reads back into its own context. Where ``os.fork`` is missing,
    ``compute`` runs in this process, unbounded.

    Why: ISL's operation quota does not bound all of its work. A fuzz kernel (seed 10591)
    made the scheduler return in 0.08 s under a quota of 500 000 operations and run for
    minutes under one of 1 000 000; no quota separates such kernels from the ones whose
    schedules the benchmarks need. A crash of ISL (a segfault, a C++ exception where the
    process preloads ASan) stays in the child too."""
    gave_up = "ISL gave up (an error, or its operation quota)"
    if not hasattr(os, "fork"):
        try:
            text = compute()
        except isl.Error:
            return None, gave_up
        return (text, "") if text is not None else (None, gave_up)
    r, w = os.pipe()
    with warnings.catch_warnings():
        # JAX warns at every fork that its threads make the child deadlock-prone; this
        # child runs ISL only (C and malloc, which glibc keeps usable across fork) and
        # leaves by os._exit, and a child that hung would be killed at the deadline
        warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called",
                                category=RuntimeWarning)
        pid = os.fork()
    if pid == 0:  # the child: compute, write the text, leave without Python's clean-up
        code = 1
        try:
            faulthandler.disable()  # a crash is reported by the parent, not dumped here
            os.close(r)
            text = compute()
            if text is not None:
                data = text.encode()
                while data:
                    data = data[os.write(w, data):]
                code = 0
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    chunks, deadline, why = [], time.monotonic() + seconds, ""
    try:
        while True:
            left = deadline - time.monotonic()
            ready = select.select([r], [], [], left)[0] if left > 0 else []
            if not ready:
                why = f"it ran past {seconds:g} s"
                os.kill(pid, signal.SIGKILL)
                break
            chunk = os.read(r, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(r)
        _, status = os.waitpid(pid, 0)
    if why:
        return None, why
    if os.WIFSIGNALED(status):
        return None, f"ISL crashed (signal {os.WTERMSIG(status)})"
    if os.WEXITSTATUS(status) != 0:
        return None, gave_up
    return b"".join(chunks).decode(), ""


# Seconds a forked child may take for the exact dependence analysis of strided
# statements (``_variable_dependences``), which crashed ISL in this process; past them,
# the memory-based dependences.
STRIDED_PROBE_SECONDS = 60.0

# Seconds a forked child may take for the separated AST generation of strided domains
# (``strided_ast_build_crashes``); past them, one loop per band. The separated builds
# that succeed take well under a second (the corpora's, the fuzzer's); the one that
# crashed ISL (seed 13148) did so after about a minute of work on this machine, which
# every compile of its kernel waited for under the dependence analysis' bound.
AST_PROBE_SECONDS = 10.0


def _has_existentials(instances: isl.UnionSet) -> bool:
    """Whether some of the sets of ``instances`` need existential variables (statements
    of a loop ``range(a, b, s)`` with ``s`` > 1: ``(i) mod 3 = 0``, where ISL has crashed;
    a projection's range)."""
    found = []
    instances.foreach_set(lambda s: found.append(set_has_existentials(s)))
    return any(found)


def set_has_existentials(s: isl.Set) -> bool:
    """Whether some piece of ``s`` needs existential variables (a ``mod`` or ``floor``
    constraint)."""
    return any(b.dim(isl.dim_type.div) > 0 for b in s.get_basic_sets())


def strided_ast_build_crashes(context: isl.Set, tree: isl.Schedule) -> bool:
    """Whether ISL's AST generation of ``tree`` under ``context`` crashes or runs past
    ``AST_PROBE_SECONDS``, probed in a forked child (``text_within_seconds``) where
    the domain has existential variables (``_has_existentials``); False for other
    domains. A fuzz kernel's vjp (seed 13148: a loop ``range(1, M, 2)``, clamped writes
    of an output) made ``node_from_schedule`` segfault on its separation options; built
    with one loop per band it does not. The probe costs one more AST generation, for
    strided domains only."""
    if not _has_existentials(tree.get_domain()):
        return False

    def build() -> str:
        isl.AstBuild.from_context(context).node_from_schedule(tree)
        return "built"

    text, _ = text_within_seconds(build, AST_PROBE_SECONDS)
    return text is None


# Bound on the ISL operations of one exact (value-based) dependence analysis: past it,
# the memory-based answer. An 11-line kernel of the fuzzer (seed 9620: strided and
# triangular loops, clamped transposed writes into one array) spent 22 s in one array's
# exact analysis (5 s with this bound). The heaviest analyses of the benchmarks and the
# test suite (the deconvolution gradient's) need 1-2 million operations.
DEPENDENCE_QUOTA = 5_000_000

# Bound on the ISL operations of removing, from one variable's anti dependences, the
# pairs that are output dependences too. The removal only drops duplicates, so past the
# bound they stay. Unbounded, it ran for more than ten minutes on a fuzz kernel's vjp
# (seed 8109: 170 maps of anti pairs less 80 of output ones; the vjp compiles in 10 s
# with the bound); the benchmarks' C is the same with and without it.
ANTI_DUPLICATES_QUOTA = 5_000_000


def _variable_dependences(var_reads, must_w, writes, tree: isl.Schedule, flow_only: bool):
    """(flow, output, anti) dependences of one variable under the schedule ``tree``, and
    why they are memory-based (None where ISL's exact analysis answered); output and anti
    are None when ``flow_only``.

    ``tree``: the schedule as a tree, its domain the statements that touch this variable
    (``_variable_analysis`` restricts it; restricting it again here took minutes of ISL's
    time on a fuzz kernel's vjp, seed 19650, for the same tree). (isl's schedule-*map*
    path of compute_flow, ``set_schedule_map``, drops must-sources of statements whose
    domain fixes a schedule dimension to a constant next to a strided (``mod``) loop: the
    boundary piece ``k = 1`` of a clamped read under ``for i in range(0, N, 3)`` lost its
    dependences and was scheduled after writes it precedes, fuzz seed 144.)"""
    why = None

    def exact(sink, must_src, may_src) -> isl.UnionMap:
        ai = isl.UnionAccessInfo.from_sink(sink).set_must_source(must_src) \
            .set_may_source(may_src).set_schedule(tree)
        with operation_quota(tree.get_ctx(), DEPENDENCE_QUOTA):
            return ai.compute_flow().get_may_dependence()

    def flow(sink, must_src, may_src):
        nonlocal why

        def memory_based() -> isl.UnionMap:
            # every earlier access of the same element: a superset of the exact answer,
            # which is safe for every use of dependences
            return _ordered_pairs(must_src.union(may_src), sink, tree.get_map())

        if any(_has_existentials(m.domain()) for m in (sink, must_src, may_src)):
            # ISL's exact analysis of strided statements segfaulted (fuzz seed 14125: a
            # vjp of a clamped output written under ``range(0, M, 3)``), which killed
            # the process compiling it: analysed in a forked child
            text, failed = text_within_seconds(
                lambda: exact(sink, must_src, may_src).to_str(), STRIDED_PROBE_SECONDS)
            if text is not None:
                return isl.UnionMap.read_from_str(tree.get_ctx(), text)
            why = f"ISL's exact analysis, in a forked child: {failed}"
            return memory_based()
        try:
            return exact(sink, must_src, may_src)
        except isl.Error:
            # ISL's exact analysis fails on some piecewise accesses ("affine
            # expression involves some of the domain dimensions") or runs past its
            # quota (islpy's error does not say which)
            why = (f"ISL's exact analysis gave up (an access it cannot analyse, or past "
                   f"its quota of {DEPENDENCE_QUOTA:_} operations)")
            return memory_based()

    may_w = writes.subtract(must_w)
    flow_deps = coalesced(flow(var_reads, must_w, may_w))
    if flow_only:
        return flow_deps, None, None, why
    output = coalesced(flow(writes, must_w, may_w))
    # Reads after the last definite write before each write; writes kill
    # older reads, which keeps this cheap (their order is implied through
    # output dependences). Pairs that are output dependences already are
    # not repeated here, unless removing them runs past ``ANTI_DUPLICATES_QUOTA``.
    anti = flow(writes, must_w, var_reads)
    try:
        with operation_quota(tree.get_ctx(), ANTI_DUPLICATES_QUOTA):
            anti = anti.subtract(output)
    except isl.Error:
        pass    # the duplicates stay: ``anti | output`` is the same relation
    return flow_deps, output, anti, why


def _program_order_groups(model: PolyModel, statements: Optional[list[Statement]] = None) \
        -> tuple[dict[str, str], isl.UnionMap]:
    """Statement name -> group name, and ``{ S3_0[i] -> G0[i] : i in dom(S3_0);
    S3_1[i] -> G0[i] ...; S5[j] -> G1[j] }``, for ``statements`` (default: all).

    Statements at the same program-order position with the same loops are the
    boundary pieces of one statement (the order gives no other two statements
    the same position); each group is named ``G<k>``.
    """
    keys: dict[tuple, str] = {}
    names: dict[str, str] = {}
    renames = []
    for st in model.kernel.statements if statements is None else statements:
        key = (st.position, tuple((lp.var, lp.step > 0) for lp in st.loops))
        group = names[st.name] = keys.setdefault(key, f"G{len(keys)}")
        dom = model.domain(st)
        rename = isl.Map.identity(dom.get_space().map_from_set()).intersect_domain(dom) \
            .set_tuple_name(isl.dim_type.out, group)
        renames.append(rename.to_union_map())
    return names, union_of(renames, isl.UnionMap.empty(model.context.get_space()))


# --------------------------------------------------------------------------
# ISL affine objects -> IR (for transformations that build new statements)
# --------------------------------------------------------------------------


def param_exprs(kernel: ir.Kernel) -> dict[str, Expr]:
    """ISL parameter name -> the IR expression it stands for."""
    out: dict[str, Expr] = {isl_name(s): SizeVar(s) for s in kernel.sizes}
    for p in kernel.int_params:
        out[isl_name(p)] = ScalarRef(p, kernel.scalar_dtype(p))
    return out


def _fraction(v: isl.Val) -> Fraction:
    return Fraction(v.get_num_si(), v.get_den_val().get_num_si())


def aff_to_expr(aff: isl.Aff, in_names: list[str], params: dict[str, Expr]) -> Expr:
    """An integer-valued quasi-affine ``isl.Aff`` as an IR expression over ``in_names``.

    Integer divisions (ISL "divs") become floor divisions ``//`` by constants.
    (Pure arithmetic on values: no islpy call that may raise, since islpy
    exceptions abort processes running under AddressSanitizer.)
    """
    coefs: list[tuple[Fraction, Expr]] = []
    for k, name in enumerate(in_names):
        coefs.append((_fraction(aff.get_coefficient_val(isl.dim_type.in_, k)), LoopVar(name)))
    for k in range(aff.dim(isl.dim_type.param)):
        pname = aff.get_dim_name(isl.dim_type.param, k)
        coefs.append((_fraction(aff.get_coefficient_val(isl.dim_type.param, k)), params[pname]))
    for k in range(aff.dim(isl.dim_type.div)):
        if aff.get_coefficient_val(isl.dim_type.div, k).is_zero():
            continue  # (the local space of a div's own expression lists the divs too)
        div = aff.get_div(k)
        dd = div.get_denominator_val().get_num_si()
        inner = aff_to_expr(div.scale_val(isl.Val.int_from_si(aff.get_ctx(), dd)),
                            in_names, params)
        coefs.append((_fraction(aff.get_coefficient_val(isl.dim_type.div, k)),
                      Binary("//", inner, Const(dd, ir.i64), ir.i64) if dd != 1 else inner))
    const = _fraction(aff.get_constant_val())
    den = math.lcm(const.denominator, *(c.denominator for c, _ in coefs))
    terms: list[Expr] = []
    for c, e in coefs:
        n = int(c * den)
        if n == 1:
            terms.append(e)
        elif n:
            terms.append(Binary("*", Const(n, ir.i64), e, ir.i64))
    c0 = int(const * den)
    if c0 or not terms:
        terms.append(Const(c0, ir.i64))
    out = terms[0]
    for t in terms[1:]:
        out = Binary("+", out, t, ir.i64)
    if den != 1:
        out = Binary("//", out, Const(den, ir.i64), ir.i64)
    return ir.fold_integer_constants(out)


def set_to_condition(s: isl.Set, names: list[str], params: dict[str, Expr]) -> Expr:
    """An ISL set (over ``names``) as an IR affine boolean expression.

    Its existential variables are given explicit expressions first (``compute_divs``):
    a projection, such as the range of an access map, can leave some without one, and
    ISL cannot write a constraint over such a variable as an affine expression (fuzz
    seed 18137: the elements a vjp's first updates reach, a strided loop's)."""
    disjuncts = []
    if _has_existentials(s.to_union_set()):
        # (only then: on every set, it made the benchmark kernels' 24 compiles 5 % slower)
        s = s.compute_divs()
    for bset in _basic_sets(coalesced(s)):
        conj = None
        for c in bset.get_constraints():
            e = aff_to_expr(c.get_aff(), names, params)
            atom = Binary("==" if c.is_equality() else ">=", e, Const(0, ir.i64), ir.boolean)
            conj = atom if conj is None else Binary("and", conj, atom, ir.boolean)
        conj = conj if conj is not None else Binary("==", Const(0, ir.i64), Const(0, ir.i64),
                                                    ir.boolean)
        disjuncts.append(conj)
    out = disjuncts[0] if disjuncts else Binary("==", Const(0, ir.i64), Const(1, ir.i64),
                                                ir.boolean)
    for d in disjuncts[1:]:
        out = Binary("or", out, d, ir.boolean)
    return out


def _basic_sets(s: isl.Set) -> list:
    out = []
    s.foreach_basic_set(out.append)
    return out


def large_sizes(model: PolyModel) -> tuple:
    """``((size, bound), ...)``: the sizes above which the pieces of ``model``'s statements
    keep one shape (none when every size is one already); ``schedule.build._size_versions``
    separates loops per piece only there.

    A size's bound is 2 * reach + 2, where ``reach`` is the largest offset from it in
    the statements' domain constraints (``n <= N - 3``: 2 past the last index, ``N - 1``;
    ``m >= M - 4``: 4), so that the pieces at its two ends are apart with an interior
    between them; and past any size a piece needs (``N >= 4``). Constraints relating a
    loop to a chunk of its rows (``fusion``: ``64 * m_chunk <= m``) bound no piece's
    shape."""
    bound: dict[int, int] = {}
    n_params = model.context.dim(isl.dim_type.param)
    for st in model.kernel.statements:
        for bset in model.domain(st).get_basic_sets():
            n_set = bset.dim(isl.dim_type.set)
            for c in bset.get_constraints():
                loops = [abs(c.get_coefficient_val(isl.dim_type.set, d).to_python())
                         for d in range(n_set)]
                if any(a > 1 for a in loops):
                    continue
                constant = c.get_constant_val().to_python()
                for i in range(n_params):
                    a = c.get_coefficient_val(isl.dim_type.param, i).to_python()
                    if a == 0:
                        continue
                    if not any(loops):  # a * p + constant >= 0: the piece needs p >= this
                        need = -(constant // a) + 1 if a > 0 else 0
                    else:  # v <= p + constant (p - 1: no offset), or v >= p - constant
                        reach = abs(constant + 1) if a > 0 else abs(constant)
                        need = 2 * (reach // abs(a)) + 2 if reach else 0
                    if need > 1:
                        bound[i] = max(bound.get(i, 0), need)
    names = list(model.kernel.sizes) + list(model.kernel.int_params)
    return tuple((names[i], bound[i]) for i in sorted(bound))


def values_without_divs(values: isl.Set) -> Optional[isl.Set]:
    """The one-dimensional ``values`` (a loop's, in the sizes) where they need no
    existential variables, else a superset without them whose minimum and maximum ISL
    computes cheaply: their simple hull where it bounds them both ways, else the pieces
    with their existential variables projected out; None where the result is unbounded
    (ISL has no minimum or maximum of it). The exact max - min of the points of tiles
    (``256 * floor(i / 256) <= N - 257``) took minutes on a fuzz vjp's loop (seed 15320);
    the simple hull of pieces bounded by different sizes (``3 i < N`` or ``i <= M + 1``)
    keeps none of their bounds (seed 15364, where ISL then failed on an unbounded
    maximum)."""
    if _has_existentials(values.to_union_set()):
        values = values.remove_divs()
        hull = isl.Set.from_basic_set(values.simple_hull())
        if _bounded_both_ways(hull):
            values = hull
    return values if _bounded_both_ways(values) else None


def _bounded_both_ways(values: isl.Set) -> bool:
    """Whether every piece of the one-dimensional ``values`` has a lower and an upper bound."""
    return values.dim_has_lower_bound(isl.dim_type.set, 0) \
        and values.dim_has_upper_bound(isl.dim_type.set, 0)


def few_values(dom: isl.Set, k: int, limit: int) -> Optional[tuple[isl.Aff, int, int]]:
    """(an end value of dimension ``k`` of ``dom`` as an ``isl.Aff`` of the sizes, +1 if it
    is the lowest, -1 if the highest, how many values) where that dimension takes 2 to
    ``limit`` values for every value of the sizes (``M - 2 <= m <= M - 1``: M - 1, -1,
    2), else None (one value, more, or ends that are min/max of several expressions)."""
    n = dom.dim(isl.dim_type.set)
    values = dom.project_out(isl.dim_type.set, k + 1, n - k - 1).project_out(
        isl.dim_type.set, 0, k)
    low, high = values.dim_min(0), values.dim_max(0)
    try:
        width = high.sub(low).max_val()
    except isl.Error:
        # ISL bounds only integer affine widths; an end with a rational coefficient (the
        # bound of a strided or halved index, fuzz seed 10208) gets no answer: not "few"
        return None
    if not width.is_int() or not 0 < width.to_python() < limit:
        return None
    for end, direction in ((low, 1), (high, -1)):
        if end.n_piece() == 1:
            affs = []
            end.foreach_piece(lambda _, aff: affs.append(aff))
            return affs[0], direction, width.to_python() + 1
    return None


def inverse_pieces(access: isl.Map, keep: tuple[int, ...] = ()
                   ) -> Optional[list[tuple[isl.Set, list[isl.Aff]]]]:
    """Invert ``S[i] -> A[j]`` extended by the iteration dims ``keep``: ``S[i] -> [j, i_keep]``.

    Returns pieces (set of ``[j, i_keep]``, [each ``i_k`` as an Aff of them]),
    or None when that map is not injective (several iterations would write
    the same element for the same kept dims), i.e. no gather exists.
    """
    if keep:
        proj = access.domain().identity()
        n = proj.dim(isl.dim_type.out)
        for k in reversed(range(n)):
            if k not in keep:
                proj = proj.project_out(isl.dim_type.out, k, 1)
        access = access.range_product(proj).flatten_range()
    if not access.is_injective():
        return None
    pma = isl.PwMultiAff.from_map(access.reverse())
    pieces = []
    pma.foreach_piece(lambda s, ma: pieces.append(
        (s, [ma.get_at(k) for k in range(ma.dim(isl.dim_type.out))])))
    return pieces


# --------------------------------------------------------------------------
# tiling footprint (what one tile of a kernel needs around what it owns)
# --------------------------------------------------------------------------

# Two sizes far beyond any offset a kernel uses: a footprint that is the same at
# both is independent of the size; one that changes grows with the array.
_TILE_PROBE_SIZES = (LARGE_SIZE, 2 * LARGE_SIZE + 1)


def loop_position_vars(st: Statement, axes) -> dict[str, str]:
    """For each size in ``axes``, the loop variable of ``st`` that walks along it.

    A loop walks along size ``S`` when it runs over ``range(c, S + c')`` (or the
    reversed ``range(S + c' - 1, c - 1, -1)`` of an adjoint) for constants
    ``c, c'``. Sizes no loop walks along, or more than one does, are left out.
    """
    out: dict[str, str] = {}
    ambiguous = set()
    for lp in st.loops:
        first, end = (lp.lo, lp.hi) if lp.step > 0 else (lp.hi, lp.lo)
        for axis in axes:
            if offset_from_size(end, axis) is not None and offset_from_size(first, None) \
                    is not None:
                if axis in out:
                    ambiguous.add(axis)
                out[axis] = lp.var
    return {a: v for a, v in out.items() if a not in ambiguous}


def constant_value(e: Expr, sizes) -> Optional[int]:
    """The integer the affine ``e`` of the kernel's ``sizes`` equals whatever their values
    (``(H + 1) - 1 - H``: 0), or None where it depends on them or is not affine."""
    try:
        text = affine_text(e)
    except ValueError:
        return None
    value = isl.PwAff(f"[{', '.join(isl_name(n) for n in sizes)}] -> {{ [({text})] }}")
    return value.as_aff().get_constant_val().to_python() if value.is_cst() else None


def offset_from_size(e: Expr, size: Optional[str]) -> Optional[int]:
    """``c`` if ``e`` is ``size + c`` (``size=None``: the constant ``c``) for a constant ``c``;
    ``size`` may name a loop variable too (``h - 1``: -1 for ``"h"``)."""
    names = {x.name for x in ir.walk(e) if isinstance(x, (SizeVar, ScalarRef, LoopVar))}
    if names - ({size} if size else set()):
        return None
    at0 = ir.eval_integer(e, {size: 0} if size else {})
    if size is None:
        return at0
    at1 = ir.eval_integer(e, {size: 1000})
    return at0 if at0 is not None and at1 == at0 + 1000 else None


@dataclass(frozen=True)
class AxisReach:
    """How far a tile must see beyond its owned elements along one tiled size.

    ``halo`` cells on each side suffice, or ``halo`` is None and ``why`` says
    which dependence reaches an unbounded distance along the size. ``full``:
    every loop along the size runs exactly over all of it (none stops short
    of an end or runs past one), so tiles can wrap around like a circular array.
    """

    halo: Optional[int]
    why: str = ""
    full: bool = True


def tile_footprint(kernel: ir.Kernel, axes, references: dict[str, dict[str, Expr]],
                   values: dict[str, int], reductions=frozenset()) -> dict[str, AxisReach]:
    """The halo each tiled size needs so a tile computes its owned results exactly.

    ``axes``: the sizes the arrays are cut along. ``references``: the sink
    statements (those writing the results a tile owns) by name, each with the
    affine position along every axis of the result it produces (the written
    element's index, or a loop variable for a reduction's contribution).
    ``values``: every other size and integer parameter. ``reductions``: the
    results that tiles compute as partial sums over the instances they own
    (added up afterwards); the dependences of their accumulation are not
    followed, since no tile sees another tile's partial sum.

    The reach follows the dataflow: the flow dependences' transitive closure
    from each sink instance to every statement instance it depends on, then
    (1) the inputs those instances read, (2) the instances themselves, which
    must exist in a tile that starts ``halo`` cells early (their loops' distance
    from the ends of the size counts), and (3) a guard for writes whose index
    is offset from their loop through a boundary mode (at a tile's cut, the
    mode folds them into the first cells, which therefore must be halo).
    Distances are measured on plain affine indices (the interior of the
    arrays): at the arrays' true border the kernel's own boundary modes apply.
    """
    model = PolyModel(kernel)
    inputs = {p.name for p in kernel.params if p.is_array and p.intent in ("in", "inout")}
    positions = {st.name: loop_position_vars(st, axes) for st in kernel.statements}
    per_probe = []
    for probe in _TILE_PROBE_SIZES:
        point = {**values, **{a: probe for a in axes}}
        per_probe.append(_tile_distances(kernel, model, axes, references, reductions,
                                         positions, inputs, point))
    reach = {a: 0 for a in axes}
    margin = {a: 0 for a in axes}
    guard = {a: 0 for a in axes}
    why: dict[str, str] = {}
    full = {a: True for a in axes}
    order = {"read": 0, "instance": 1, "margin": 2, "guard": 3}  # the clearest reason first
    for key in sorted(per_probe[0].keys() | per_probe[1].keys(),
                      key=lambda key: (order[key[1]], key)):
        axis, kind, what = key
        lo, hi = per_probe[0].get(key, (0, 0))
        if per_probe[1].get(key, (0, 0)) != (lo, hi):
            why.setdefault(axis, what)
        elif kind == "margin":
            margin[axis] = max(margin[axis], lo, hi)
            full[axis] = full[axis] and (lo, hi) == (0, 0)
        elif kind == "guard":
            guard[axis] = max(guard[axis], -lo + 1, hi + 1)
        else:
            reach[axis] = max(reach[axis], -lo, hi)
    return {a: AxisReach(None, why[a], False) if a in why else
            AxisReach(reach[a] + margin[a] + guard[a], full=full[a]) for a in axes}


def _tile_distances(kernel, model, axes, references, reductions, positions, inputs, point
                    ) -> dict:
    """(axis, kind, description) -> (min, max) distances with every size fixed to ``point``."""
    pset = isl.Set.read_from_str(model.ctx, model.param_prefix + "{ : " + " and ".join(
        f"{isl_name(p)} = {point[q]}" for p, q in zip(model.params, list(kernel.sizes) +
                                                      list(kernel.int_params))) + " }")
    stmts = {st.name: st for st in kernel.statements}
    flow = isl.UnionMap.empty(model.context.get_space())
    followed = {st.target_name for st in kernel.statements} - set(reductions)
    for m in dependences(model, variables=followed, flow_only=frozenset(followed)).flow.values():
        flow = flow.union(m)
    flow = flow.reverse().intersect_params(pset)  # each read instance -> the writes it reads
    closure = flow.transitive_closure()[0] if not flow.is_empty() else flow
    domains = model.union_domain().intersect_params(pset)
    closure = coalesced(closure.union(domains.identity()))

    def one_dim(st: Statement, e: Expr) -> isl.Map:
        return model.value_map(st, e).intersect_params(pset)

    def extent(s) -> Optional[tuple[int, int]]:
        s = coalesced(s)
        if s.is_empty():
            return None
        return s.dim_min_val(0).to_python(), s.dim_max_val(0).to_python()

    def deltas(umap: isl.UnionMap) -> Optional[tuple[int, int]]:
        d = umap.deltas()
        return None if d.is_empty() else extent(isl.Set.from_union_set(d))

    out: dict = {}

    def record(key, rng):
        if rng is not None:
            lo, hi = out.get(key, rng)
            out[key] = (min(lo, rng[0]), max(hi, rng[1]))

    for sink_name, ref in references.items():
        sink = stmts[sink_name]
        for axis in axes:
            if axis not in ref:
                continue
            start = one_dim(sink, ref[axis]).reverse().to_union_map().apply_range(closure)
            for st in kernel.statements:
                for ld in st.reads():
                    if ld.array not in inputs:
                        continue
                    dims = [d for d, e in enumerate(kernel.array_type(ld.array).shape)
                            if isinstance(e, SizeVar) and e.name == axis]
                    for d in dims:
                        reads = one_dim(st, ld.index[d]).to_union_map()
                        record((axis, "read", f"{sink.target_name} (line {sink.line}) reads "
                                f"{ld.array!r} along its dimension {d} ({axis}) at distances "
                                f"that grow with {axis}"),
                               deltas(start.apply_range(reads)))
                var = positions[st.name].get(axis)
                if var is not None:
                    inst = one_dim(st, LoopVar(var)).to_union_map()
                    record((axis, "instance", f"{sink.target_name} (line {sink.line}) depends "
                            f"on the statement at line {st.line} at distances along {axis} "
                            f"that grow with {axis}"), deltas(start.apply_range(inst)))
    for st in kernel.statements:
        for axis, var in positions[st.name].items():
            loop = one_dim(st, LoopVar(var))
            rng = extent(loop.range())
            if rng is not None:
                # How far the loop stops short of each end of the size.
                record((axis, "margin", f"the loop over {var!r} at line {st.line} does not "
                        f"run a fixed distance from the ends of {axis}"),
                       (rng[0], point[axis] - 1 - rng[1]))
            if isinstance(st.target, Load):
                at = kernel.array_type(st.target.array)
                for d, e in enumerate(at.shape):
                    if at.mode in (None, "zero") or not (isinstance(e, SizeVar) and e.name == axis):
                        continue
                    offsets = deltas(loop.reverse().apply_range(
                        one_dim(st, st.target.index[d])).to_union_map())
                    if offsets is not None and offsets != (0, 0):
                        record((axis, "guard", f"the write {st.target.array}[...] at line "
                                f"{st.line} is offset from its loop by a distance that grows "
                                f"with {axis}"), offsets)
    return out
