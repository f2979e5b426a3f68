"""Primal values in the reverse sweep: read directly, recompute, or tape.

The adjoint of a statement ``S`` needs the primal values ``S`` read (the
partial derivatives are functions of them, and so is ``S``'s guard). In the
reverse sweep the primal arrays hold their *final* values and scalar locals
hold whatever the forward sweep (or a recomputation) left in them. For every
value an adjoint needs, ``Resolver`` picks one of (DESIGN §4):

(a) **direct**: the value cannot have changed after ``S``. For an array: every
    statement writing it completes before ``S`` starts (no shared loop), or
    writes the very element ``S`` reads through the same injective index in
    an earlier point of the same iteration (``t[i] = ...; ... t[i]``). For a
    scalar: no write to it can execute after ``S``.
(b) **recompute** (scalars): the scalar is *loop-local* in an enclosing loop
    ``L`` - every iteration of ``L`` kills it with a plain ``=`` before
    reading it, and it is not written after ``S`` within the iteration. The
    forward statements that compute it (the backward slice inside ``L``'s
    body: ``s = 0; for k: s += w[k] * x[i + k]``, or ``w = sigmoid(...)``)
    are replayed at the start of each iteration of the reversed ``L``. Their
    own inputs must be available (arrays direct, scalars killed in the same
    iteration or resolvable at an outer loop).
(c) **tape**: anything else (``r = r * x[i]``: the old ``r``; in-place array
    updates ``x[i] = f(x[i])``). The forward sweep stores the value into a
    privatized tape array indexed by the iteration vector of the point where
    it is read, right before that point - at the outermost loop level where
    the value is still constant (a scalar that only changes in the outer loop
    is taped once per outer iteration). The tape extents are the bounding
    box of the loop nest, affine in the sizes (``tape_bytes`` reports them);
    where an inner loop's bounds depend on an outer one (``for j in
    range(i)``) the tape stores only the nest, packed row after row
    (``polyad.ad.layout``: a triangle takes half its box, a tetrahedron a
    sixth).

The checks above are structural on the loop tree (conservative: when in
doubt, tape). An array read they would tape is then asked of the exact
to-be-recorded analysis (``polyad.ad.recorded``, ISL): when no write after the
read touches the element it read, the adjoint reads the final array after all.
Otherwise, in order of preference:

* the condition of ``a if c else b`` (``min``, ``max``, ``abs``...) whose
  compared values are overwritten is taped as one bit (an ``ir.bit`` array,
  packed 32 flags to a word, zero-filled; a store sets its bit with an atomic OR
  since neighbouring flags may be stored by other threads): the adjoint needs
  the branch taken, not the values;
* reads of one array under the same outer loops that see the same value for
  the same element share one tape indexed by those loops and the element
  (a stencil step: one slice per step, not one tape per read), where that has
  no more dimensions than a tape of the read alone;
* a tape of the read alone, indexed by the loops around it except those
  along which the value read cannot change.

``records`` keeps every decision for ``recorded_reads`` and the tests.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from .. import ir
from ..ir import Binary, Expr, Load, LoopVar, ScalarRef
from ..looptree import Item, Leaf, Node, item_of, loops_of, tree_items
from . import exprs as X
from .layout import packed_layout
from .recorded import RecordedSets, analysable_error_types, exact_recorded

DIRECT = ("direct",)

TAPE_PREFIX = "tape_"


def _common_prefix(a: tuple, b: tuple) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def injective_index(index: tuple, loop_vars) -> bool:
    """Does ``index`` map the iteration vector of ``loop_vars`` injectively (syntactically)?

    Every index dimension is affine in at most one of the loop variables, every
    loop variable appears in some dimension, and no other loop variable is used.
    """
    loop_vars = set(loop_vars)
    seen = set()
    for ix in index:
        f = X.affine_form(ix)
        if f is None:
            return False
        vs = [a for a, c in f[0].items() if isinstance(a, LoopVar)]
        opaque = [a for a in f[0] if isinstance(a, Binary)]
        if opaque and any(X.loop_var_names(a) for a in opaque):
            return False
        if len(vs) > 1:
            return False
        for v in vs:
            if v.name not in loop_vars:
                return False
            seen.add(v.name)
    return seen == loop_vars


def plainly_in_bounds(index: tuple, loops, shape) -> bool:
    """Is every index dimension a loop variable running over exactly ``range(extent)``?
    (Then a boundary mode never applies to the access.)"""
    by_var = {lp.var: lp for lp in loops}
    for ix, ext in zip(index, shape):
        if not isinstance(ix, LoopVar) or ix.name not in by_var:
            return False
        lp = by_var[ix.name]
        if lp.step != 1 or X.simplify_int(lp.lo) != X.ic(0) \
                or X.simplify_int(lp.hi) != X.simplify_int(ext):
            return False
    return True


def written_inside(array_types: dict, target) -> tuple:
    """Conditions under which a write to ``target`` happens: a write outside a ``.zero``
    array is dropped (the primal statement does not run there), so neither its adjoint
    nor its tape stores may run there, nor make the accesses they would make valid only
    if it did (the mirror read a dropped instance never makes; fuzz seeds 1050, 16189)."""
    at = array_types.get(target.array) if isinstance(target, Load) else None
    if at is None or at.mode != "zero":
        return ()
    return tuple(ir.Condition(ir.within_extent(e, ext)) for e, ext in zip(target.index, at.shape))


class Resolver:
    """Decides how the reverse sweep obtains each primal value (see module doc)."""

    def __init__(self, root: Node, leaves: list[Leaf], local_names: set, array_types: dict,
                 names, exact: Optional[RecordedSets] = None, packed: bool = True):
        self.root = root
        self.leaves = leaves
        self.local_names = set(local_names)       # primal scalar locals
        self.array_types = dict(array_types)      # primal arrays (params, temps) -> ArrayType
        self.names = names
        self.writes: dict[str, list[Leaf]] = {}
        for lf in leaves:
            t = lf.stmt.target
            self.writes.setdefault(t.array if isinstance(t, Load) else t.name, []).append(lf)
        self.slices: dict[tuple, set] = {}        # loop path -> leaf indices to replay
        self.tape_before: dict[tuple, list] = {}  # node path -> tape store items
        self.tapes: dict = {}                     # key -> replacement expression
        self.scalar_tapes: dict = {}              # (name, path, conditions) -> tape ref
        self.tape_arrays: list[ir.Temp] = []
        self.tape_scalars: list[tuple[str, ir.DType]] = []
        self.init_scalars: dict[str, ir.DType] = {}
        self._memo: dict = {}
        self.exact = exact                        # the ISL analysis, None: structural only
        self.packed = packed                      # triangular tapes packed (with ``exact``)
        self.records: list[dict] = []             # one per array read the adjoint needs
        self._final: dict = {}
        self.shared: dict = {}                    # (array, loop path, depth) -> tape, reads

    # ------------------------------------------------------------------
    # substitution
    # ------------------------------------------------------------------
    def primal(self, e: Optional[Expr], leaf: Leaf) -> Optional[Expr]:
        """``e`` (built from values read by ``leaf``) with every primal read resolved."""
        if e is None:
            return None
        e = self.tape_conditions(e, leaf)

        def fn(x):
            if isinstance(x, ScalarRef) and x.name in self.local_names:
                return self.scalar_value(x, leaf)
            if isinstance(x, Load) and x.array in self.array_types:
                return self.load_value(x, leaf)
            return None

        return ir.map_expr(e, fn)

    def tape_conditions(self, e: Expr, leaf: Leaf) -> Expr:
        """``e`` with the condition of every ``a if cond else b`` that reads an overwritten
        array element replaced by a taped flag: the adjoint of ``min``/``max``/``if``
        needs which branch was taken, not the values compared (one bit per instance
        instead of 8 bytes per value read). Off with the structural checks alone (the reference
        the trimmed tapes are tested against)."""
        if self.exact is None:
            return e

        def fn(x):
            if not isinstance(x, ir.Select):
                return None
            final = [self.array_final(ld, leaf) for ld in ir.loads(x.cond)
                     if ld.array in self.array_types]
            if all(final):
                return None
            return dataclasses.replace(x, cond=self.tape_condition(x.cond, leaf))

        return ir.map_expr(e, fn)

    def tape_condition(self, cond: Expr, leaf: Leaf) -> Expr:
        key = ("cond", cond, leaf.index)
        if key not in self.tapes:
            st = leaf.stmt
            holds = f"which branch ({ir.expr_str(cond)}) of: {st.source} (line {st.line})"
            ref = self._new_tape(leaf.path, ir.bit, f"{st.name}_branch", holds, zero=True)
            flag = ir.Select(cond, ir.Const(1, ir.bit), ir.Const(0, ir.bit), ir.bit)
            self.tape_before.setdefault(leaf.path, []).append(
                Item(ref, "=", flag, self.runs_under(st), None, st.line, f"tape: {holds}"))
            reads = {ir.expr_str(ld) for ld in ir.loads(cond)}
            for r in self.records:
                if r["leaf"] == leaf.index and r["read"] in reads and not r["final"]:
                    r["tape"] = ref.array if isinstance(ref, Load) else ref.name
            self.tapes[key] = Binary("!=", ref, ir.Const(0, ir.bit), ir.boolean)
        return self.tapes[key]

    def scalar_value(self, ref: ScalarRef, leaf: Leaf) -> Expr:
        st = leaf.stmt
        r = self.resolve_scalar(ref.name, leaf.path, leaf.depth, st.conditions, st.guard)
        if r[0] == "recompute":
            self._merge(self.slices, r[1])
            return ref
        if r[0] == "direct":
            return ref
        return self.tape_scalar(ref, r[1], leaf)

    def load_value(self, ld: Load, leaf: Leaf) -> Expr:
        if self.array_final(ld, leaf):
            return ld
        return self.tape_load(ld, leaf)

    def array_final(self, ld: Load, leaf: Leaf) -> bool:
        """Does the reverse sweep find the value ``leaf`` read as ``ld`` in the final array
        (structurally, else by the exact analysis)?"""
        key = (ld, leaf.index)
        if key in self._final:
            return self._final[key]
        rec = None
        if self.array_valid(ld, leaf):
            final, how = True, "structural: no later write"
        else:
            rec = exact_recorded(self.exact, leaf, ld)
            final = rec is not None and rec.is_empty()
            how = ("no ISL model of the access" if rec is None
                   else "exact: no later write" if final else "exact: overwritten later")
        self.records.append({"statement": leaf.stmt.source, "line": leaf.stmt.line,
                             "read": ir.expr_str(ld), "final": final, "how": how,
                             "recorded": None if rec is None else rec, "tape": None,
                             "leaf": leaf.index})
        self._final[key] = final
        return final

    # ------------------------------------------------------------------
    # arrays
    # ------------------------------------------------------------------
    def array_valid(self, ld: Load, leaf: Leaf) -> bool:
        """Is the element ``leaf`` reads still unchanged at the end of the forward sweep?"""
        for w in self.writes.get(ld.array, []):
            if w is leaf:
                return False
            c = _common_prefix(w.path, leaf.path)
            if c == 0:
                if w.path[0] < leaf.path[0]:
                    continue
                return False
            if w.path[c] > leaf.path[c]:
                return False
            # w precedes leaf inside the innermost shared loop body: fine if w writes
            # exactly the element leaf reads, through an index injective in the shared loops
            at = self.array_types[ld.array]
            wt = w.stmt.target
            if at.mode not in (None, "zero") and not plainly_in_bounds(
                    wt.index, w.stmt.loops, at.shape):
                return False
            if wt.index != ld.index:
                return False
            shared = [lp.var for lp in loops_of(self.root, leaf.path)[:c]]
            if not injective_index(ld.index, shared):
                return False
        return True

    # ------------------------------------------------------------------
    # scalars
    # ------------------------------------------------------------------
    def resolve_scalar(self, name: str, xpath: tuple, q: int, rconds, rguard):
        """How to get the value of local ``name`` read at node ``xpath`` (a child of the
        block at depth ``q``): ("direct",), ("recompute", additions) or ("fail", xpath')."""
        if name not in self.local_names:
            return DIRECT
        key = (name, xpath, q, tuple(rconds), rguard)
        if key in self._memo:
            return self._memo[key]
        ws = self.writes.get(name, [])
        if q == 0:
            res = DIRECT if all(w.path[0] < xpath[0] for w in ws) else ("fail", xpath[:1])
        else:
            bp = xpath[:q]
            inside = [w for w in ws if w.path[:q] == bp]
            if not inside:
                res = self.resolve_scalar(name, bp, q - 1, rconds, rguard)
            elif any(w.path[q] >= xpath[q] for w in inside):
                res = ("fail", xpath[:q + 1])
            else:
                adds = self.build_slice(bp, q, [(name, xpath, tuple(rconds), rguard)])
                res = ("fail", xpath[:q + 1]) if adds is None else ("recompute", adds)
        self._memo[key] = res
        return res

    @staticmethod
    def _dominates(kill: ir.Statement, rconds, rguard) -> bool:
        if not set(kill.conditions) <= set(rconds):
            return False
        kc = X.conjuncts(kill.guard)
        rc = X.conjuncts(rguard)
        return all(any(k == r for r in rc) for k in kc)

    def build_slice(self, bp: tuple, q: int, initial):
        """Statements of the loop body at ``bp`` to replay so that the needed scalars
        get their values back; None when that is not possible."""
        adds: dict = {}
        chosen: set = set()
        seen = set()
        work = list(initial)
        while work:
            name, rpath, rconds, rguard = work.pop()
            if (name, rpath) in seen or name not in self.local_names:
                continue
            seen.add((name, rpath))
            inside = [w for w in self.writes.get(name, []) if w.path[:q] == bp]
            if not inside:
                r = self.resolve_scalar(name, bp, q - 1, rconds, rguard)
                if r[0] == "fail":
                    return None
                if r[0] == "recompute":
                    self._merge(adds, r[1])
                continue
            before = [w for w in inside if w.path[q] <= rpath[q]]
            kills = [w for w in before
                     if w.path[q] < rpath[q] and len(w.path) == q + 1 and w.stmt.op == "="
                     and name not in X.scalar_names(w.stmt.expr)
                     and self._dominates(w.stmt, rconds, rguard)]
            if not kills:
                return None
            k0 = max(w.path[q] for w in kills)
            for w in before:
                if w.path[q] < k0 or w.index in chosen:
                    continue
                chosen.add(w.index)
                st = w.stmt
                for t in sorted(st.scalar_reads()):
                    work.append((t, w.path, st.conditions, st.guard))
                for ld in ir.loads(st.expr) + (ir.loads(st.guard) if st.guard is not None else []):
                    if ld.array in self.array_types and not self.array_final(ld, w):
                        return None
        self._merge(adds, {bp: chosen})
        return adds

    @staticmethod
    def _merge(into: dict, adds: dict):
        for k, v in adds.items():
            into.setdefault(k, set()).update(v)

    def recompute_items(self, node: Node) -> list:
        chosen = self.slices.get(node.path)
        if not chosen:
            return []

        def leaf_fn(lf):
            if lf.index in chosen:
                return [item_of(lf.stmt, f"recompute: {lf.stmt.source}")]
            return []

        return tree_items(node, leaf_fn)

    def writes_in_slices(self, name: str) -> bool:
        idx = {lf.index for lf in self.writes.get(name, [])}
        return any(idx & s for s in self.slices.values())

    # ------------------------------------------------------------------
    # tapes
    # ------------------------------------------------------------------
    def _bbox(self, path: tuple):
        """Per enclosing loop of the node at ``path``: (index expr, extent expr, first
        index: what the index subtracts from the loop variable)."""
        env: dict[str, tuple[Expr, Expr]] = {}
        out = []
        for lp in loops_of(self.root, path):
            if lp.step > 0:
                lo = self.bounds(lp.lo, env)[0]
                hi = X.isub(self.bounds(lp.hi, env)[1], X.ic(1))
            else:
                lo = X.iadd(self.bounds(lp.hi, env)[0], X.ic(1))
                hi = self.bounds(lp.lo, env)[1]
            env[lp.var] = (lo, hi)
            out.append((X.isub(LoopVar(lp.var), lo), X.iadd(X.isub(hi, lo), X.ic(1)), lo))
        return out

    def _layout(self, loops, box) -> Optional[ir.PackedLayout]:
        """The packed layout of a tape indexed by ``loops`` shifted by ``box`` (its
        ``_bbox`` entries) when they nest as a triangle (``polyad.ad.layout``); None for
        the bounding box. Off with the structural checks alone (the untrimmed reference
        keeps boxes) and when asked (``packed=False``)."""
        if self.exact is None or not self.packed or not loops:
            return None
        dims = []
        for lp, (_, extent, first) in zip(loops, box):
            if lp.step == 1:
                lo, hi = lp.lo, lp.hi
            elif lp.step == -1:
                lo, hi = X.iadd(lp.hi, X.ic(1)), X.iadd(lp.lo, X.ic(1))
            else:
                return None
            dims.append((lp.var, first, lo, hi, extent))
        return packed_layout(dims)

    def bounds(self, e: Expr, env) -> tuple[Expr, Expr]:
        """Inclusive lower and upper bounds of the integer expression ``e`` over ``env``."""
        f = X.affine_form(e)
        if f is None:
            raise ValueError(f"cannot bound the loop bound {ir.expr_str(e)}")
        lo: Expr = X.ic(f[1])
        hi: Expr = X.ic(f[1])
        for atom, c in f[0].items():
            if isinstance(atom, LoopVar):
                al, ah = env[atom.name]
            elif isinstance(atom, Binary) and atom.op == "//":
                il, ih = self.bounds(atom.a, env)
                d = int(atom.b.value)
                al, ah = X.ifloordiv(il, d), X.ifloordiv(ih, d)
            elif isinstance(atom, Binary) and atom.op == "%":
                al, ah = X.ic(0), X.ic(int(atom.b.value) - 1)
            else:
                al = ah = atom
            if c > 0:
                lo, hi = X.iadd(lo, X.imul(c, al)), X.iadd(hi, X.imul(c, ah))
            else:
                lo, hi = X.iadd(lo, X.imul(c, ah)), X.iadd(hi, X.imul(c, al))
        return lo, hi

    def _new_tape(self, path: tuple, dtype: ir.DType, base: str, holds: str,
                  drop=(), zero: bool = False) -> Expr:
        """A tape of ``dtype`` values stored at node ``path``: a scalar local, or an array
        over the bounding box of the loops around it but those at positions ``drop``
        (``zero``: zero-filled before the kernel runs); ``holds``: its content, for
        reports."""
        bbox = self._bbox(path)
        kept = [d for d in range(len(bbox)) if d not in set(drop)]
        box = [bbox[d] for d in kept]
        name = self.names.fresh(f"{TAPE_PREFIX}{base}")
        if not box:
            self.tape_scalars.append((name, dtype))
            return ScalarRef(name, dtype)
        loops = loops_of(self.root, path)
        at = ir.ArrayType(dtype, tuple(ext for _, ext, _ in box),
                          layout=self._layout([loops[d] for d in kept], box))
        self.tape_arrays.append(ir.Temp(name, at, zero, "tape", holds))
        return Load(name, tuple(ix for ix, _, _ in box), dtype)

    # Tape stores run under the affine conditions of the point they tape, never under a
    # guard: the adjoint evaluates the guard on primal values - possibly the taped one -
    # so the tape must hold the value also where the guard was false. (Guards are not
    # part of the iteration domain: the access is valid either way.)
    def runs_under(self, st: ir.Statement) -> tuple:
        """The affine conditions of ``st``'s instances: its own, and where its target is a
        ``.zero`` array, the target in range (``written_inside``). Its tape stores and its
        adjoint statements (``reverse``) run under them."""
        return st.conditions + written_inside(self.array_types, st.target)

    def tape_load(self, ld: Load, leaf: Leaf) -> Expr:
        key = ("load", ld, leaf.index)
        if key not in self.tapes:
            st = leaf.stmt
            holds = f"{ir.expr_str(ld)} read by: {st.source} (line {st.line})"
            drop = self.droppable(ld, leaf)
            ref = self.shared_tape(ld, leaf, len(st.loops) - len(drop))
            if ref is None:
                ref = self._new_tape(leaf.path, ld.dtype, f"{st.name}_{ld.array}", holds, drop)
            for r in self.records:
                if r["leaf"] == leaf.index and r["read"] == ir.expr_str(ld):
                    r["tape"] = ref.array if isinstance(ref, Load) else ref.name
            self.tape_before.setdefault(leaf.path, []).append(
                Item(ref, "=", ld, self.runs_under(st), None, st.line, f"tape: {holds}"))
            self.tapes[key] = ref
        return self.tapes[key]

    def shared_tape(self, ld: Load, leaf: Leaf, kept: int) -> Optional[Load]:
        """A tape indexed by the ``q`` outermost loops around ``leaf`` and the element read,
        shared by every read of the array under those loops that reads the same value for
        the same index (``A[i - 1, j]``, ``A[i + 1, j]``, ``A[i, j]`` of one time step: one
        slice of the array per step instead of one tape per read). Only where it has no
        more dimensions than the tape of ``ld`` alone (``kept``); None where no ``q`` fits."""
        at = self.array_types[ld.array]
        if self.exact is None or at.mode is not None:
            return None
        for q in range(0, kept - len(ld.index) + 1):
            key = (ld.array, leaf.path[:q], q)
            name, members = self.shared.get(key, (None, []))
            try:
                ok = self.exact.shared_valid(members + [(leaf, ld)], q)
            except analysable_error_types():
                return None
            if not ok:
                continue
            box = self._bbox(leaf.path)[:q]
            members = members + [(leaf, ld)]
            outer = [lp.var for lp in leaf.stmt.loops[:q]]
            by_stmt: dict = {}
            for lf, r in members:
                by_stmt.setdefault((lf.stmt.source, lf.stmt.line), []).append(ir.expr_str(r))
            holds = f"{ld.array} per element" + (
                f" and iteration of {', '.join(outer)}" if outer else "") + "; " + "; ".join(
                f"{', '.join(reads)} read by: {src} (line {line})"
                for (src, line), reads in by_stmt.items())
            tape_type = ir.ArrayType(ld.dtype, tuple(ext for _, ext, _ in box) + tuple(at.shape),
                                     layout=self._shared_layout(members, box, at))
            if name is None:
                name = self.names.fresh(f"{TAPE_PREFIX}{ld.array}")
                self.tape_arrays.append(ir.Temp(name, tape_type, False, "tape", holds))
            else:
                k = next(j for j, t in enumerate(self.tape_arrays) if t.name == name)
                self.tape_arrays[k] = dataclasses.replace(self.tape_arrays[k], type=tape_type,
                                                          holds=holds)
            self.shared[key] = (name, members)
            return Load(name, tuple(ix for ix, _, _ in box) + tuple(ld.index), ld.dtype)
        return None

    def _shared_layout(self, members, box, at: ir.ArrayType) -> Optional[ir.PackedLayout]:
        """The packed layout of a shared tape (outer loops ``box``, then the element) when
        every read is of the element its own loops run over (``A[i, j]`` inside ``for i:
        for j in range(i)``: the elements stored are the triangle of the loops)."""
        loops = loops_of(self.root, members[0][0].path)
        inner = loops[len(box):]
        if any(loops_of(self.root, lf.path) != loops
               or r.index != tuple(LoopVar(lp.var) for lp in inner) for lf, r in members):
            return None
        element = [(LoopVar(lp.var), ext, X.ic(0)) for lp, ext in zip(inner, at.shape)]
        return self._layout(loops, list(box) + element)

    def droppable(self, ld: Load, leaf: Leaf) -> list[int]:
        """Loop dimensions (positions) a tape of ``ld`` read by ``leaf`` need not index."""
        if self.exact is None:
            return []
        try:
            return self.exact.droppable_dims(leaf, ld)
        except analysable_error_types():
            return []

    def tape_scalar(self, ref: ScalarRef, xpath: tuple, leaf: Leaf) -> Expr:
        key = ("scalar", ref.name, xpath)
        if key in self.tapes:
            return self.tapes[key]
        st = leaf.stmt
        outer = {lp.var for lp in loops_of(self.root, xpath)}
        conds = tuple(c for c in st.conditions if X.loop_var_names(c.expr) <= outer)
        if xpath != leaf.path or st.guard is not None:
            # the store may run where the primal never assigned the local yet
            self.init_scalars[ref.name] = ref.dtype
        # share a tape of the same value stored at another point of the same block
        q = len(xpath) - 1
        block = xpath[:q]
        for (name, xp, cds), tref in self.scalar_tapes.items():
            if name != ref.name or len(xp) != len(xpath) or xp[:q] != block \
                    or not set(cds) <= set(conds):
                continue
            lo, hi = min(xp[q], xpath[q]), max(xp[q], xpath[q])
            if any(w.path[:q] == block and lo <= w.path[q] < hi
                   for w in self.writes.get(ref.name, [])):
                continue
            self.tapes[key] = tref
            return tref
        holds = f"{ref.name} read by: {st.source} (line {st.line})"
        tref = self._new_tape(xpath, ref.dtype, f"{st.name}_{ref.name}", holds)
        self.tape_before.setdefault(xpath, []).append(
            Item(tref, "=", ref, conds, None, st.line, f"tape: {holds}"))
        self.tapes[key] = tref
        self.scalar_tapes[(ref.name, xpath, conds)] = tref
        return tref


# --------------------------------------------------------------------------
# tape size
# --------------------------------------------------------------------------


def _eval_int(e: Expr, env) -> int:
    v = ir.eval_integer(e, env)
    if v is None:
        raise ValueError(f"cannot evaluate extent {ir.expr_str(e)}: give every size it uses")
    return v


def tape_arrays(k: ir.Kernel) -> list[ir.Temp]:
    """The tape arrays of a derived kernel (its temporaries of role ``tape``)."""
    return [t for t in k.temps if t.role == "tape"]


def tape_report(k: ir.Kernel, sizes=None) -> list[dict]:
    """One entry per tape array of a derived kernel, for ``pa.explain``:
    ``name``, ``type`` (text, e.g. ``f64[N]``), ``what`` (the value taped and the
    statement that reads it, as in the DSL) and ``bytes`` (None without ``sizes``)."""
    out = []
    for t in tape_arrays(k):
        nbytes = None
        if sizes is not None:
            n = ir.stored_elements(t.type, sizes)
            if n is None:
                _eval_int(t.type.elements, sizes)     # raises, naming the size missing
            nbytes = t.type.dtype.storage_bytes(n)
        out.append({"name": t.name, "type": repr(t.type), "what": t.holds, "bytes": nbytes})
    return out


def tape_bytes(k: ir.Kernel, sizes) -> int:
    """Bytes of tape memory ``k`` (a derived kernel) allocates for the given sizes.

    ``sizes`` maps size names (and integer parameters used in loop bounds) to values.
    Tape scalars (loop-invariant values taped once) live in registers and are not
    counted.
    """
    return sum(entry["bytes"] for entry in tape_report(k, sizes))
