"""Exact to-be-recorded analysis (ISL): which primal array reads the reverse sweep must tape.

The reverse sweep reads primal arrays at their *final* values (it never
restores them). The value a statement instance ``S(i)`` read from ``A[f(i)]``
is therefore available there unless a write to that element comes after the
read in program order: some ``W(j)`` with ``A[g(j)] = A[f(i)]`` and
``S(i) < W(j)``, or ``S(i)``'s own write when ``S`` writes ``A[f(i)]`` (it
writes after it reads). The *recorded set* of the read is

    { S[i] : exists W, j: g_W(j) = f(i) and (S(i) < W(j) or W(j) = S(i)) }

(may-writes under a guard count as writes: conservative). An empty recorded
set means the adjoint reads the final array; otherwise the read is taped.

Tapes are indexed by the iteration vector of the reading statement, minus the
loop dimensions along which the value read cannot change: dimension ``d`` is
dropped when any two instances that differ only in dropped dimensions read the
same element and no write to it runs between them (``s = 0; for k: s +=
W[j, k] * h[k]`` inside ``for t: for j:`` tapes ``h[k]`` per ``(t, k)``, not per
``(t, j, k)``).

The checks ``polyad.ad.tape`` does structurally (conservative, cheap) run
first; this module is asked only about reads they would tape. Accesses ISL
cannot model (indices computed from data or from integer locals) keep the
structural answer.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import islpy as isl

from .. import ir
from ..ir import Load
from ..looptree import Leaf
from ..poly import PolyModel, boundary_access_map, coalesced, isl_name, union_of


class RecordedSets:
    """The ISL view of a kernel's statements (the leaves of its loop tree) for the
    to-be-recorded analysis; ``leaves`` are those of the primal sweep, ``kernel``
    supplies sizes, parameters and array types."""

    def __init__(self, kernel: ir.Kernel, leaves: list[Leaf], arrays: dict):
        self.leaves = list(leaves)
        names = {lf.index: f"L{lf.index}" for lf in self.leaves}
        self.stmt = {lf.index: dataclasses.replace(lf.stmt, name=names[lf.index])
                     for lf in self.leaves}
        temps = tuple(ir.Temp(n, t, False, "primal") for n, t in arrays.items()
                      if not any(p.name == n for p in kernel.params))
        model_kernel = dataclasses.replace(kernel, temps=temps,
                                           statements=tuple(self.stmt.values()))
        self.model = PolyModel(model_kernel)
        self.sched = self.model.schedule_map()
        self.writers: dict[str, list[Leaf]] = {}
        for lf in self.leaves:
            t = lf.stmt.target
            if isinstance(t, Load):
                self.writers.setdefault(t.array, []).append(lf)
        self._access: dict = {}
        self._later: dict = {}

    # -- ISL pieces ------------------------------------------------------------
    def access(self, lf: Leaf, ld: Load) -> isl.Map:
        key = (lf.index, ld)
        if key not in self._access:
            self._access[key] = boundary_access_map(self.model, self.stmt[lf.index], ld)
        return self._access[key]

    def domain(self, lf: Leaf) -> isl.Set:
        return self.model.domain(self.stmt[lf.index])

    def _sched_of(self, lfs) -> isl.UnionMap:
        dom = union_of([self.domain(lf).to_union_set() for lf in lfs],
                       isl.UnionSet.empty(self.model.context.get_space()))
        return self.sched.intersect_domain(dom)

    def later_writes(self, lf: Leaf, ld: Load) -> isl.UnionMap:
        """``{ S[i] -> W[j] }``: writes of the element ``S(i)`` reads that run after the read."""
        key = (lf.index, ld)
        if key in self._later:
            return self._later[key]
        space = self.model.context.get_space()
        ws = self.writers.get(ld.array, [])
        read = self.access(lf, ld).to_union_map()
        writes = union_of([self.access(w, w.stmt.target).to_union_map() for w in ws],
                          isl.UnionMap.empty(space))
        pairs = read.apply_range(writes.reverse())
        order = self._sched_of([lf]).lex_lt_union_map(self._sched_of(ws))
        if any(w is lf for w in ws):   # S(i) writes after it reads
            order = order.union(self._identity(lf))
        out = coalesced(pairs.intersect(order))
        self._later[key] = out
        return out

    def _identity(self, lf: Leaf) -> isl.UnionMap:
        dom = self.domain(lf)
        return isl.Map.identity(dom.get_space().map_from_set()).intersect_domain(dom) \
            .to_union_map()

    # -- the answers ---------------------------------------------------------------
    def recorded(self, lf: Leaf, ld: Load) -> isl.Set:
        """The instances of ``lf`` whose read ``ld`` is overwritten before the reverse sweep."""
        dom = self.later_writes(lf, ld).domain()
        out = isl.Set.empty(self.domain(lf).get_space())
        for s in _sets(dom):
            out = out.union(s)
        return coalesced(out)

    def droppable_dims(self, lf: Leaf, ld: Load) -> list[int]:
        """Loop dimensions of ``lf`` (positions) a tape of ``ld`` need not be indexed by."""
        n = len(lf.stmt.loops)
        if n == 0:
            return []
        read = self.access(lf, ld).to_union_map()
        same_element = read.apply_range(read.reverse())
        s_sched = self._sched_of([lf])
        before = s_sched.lex_lt_union_map(s_sched)
        ws = self.writers.get(ld.array, [])
        # S(i) -> S(i'): a write of S(i)'s element runs between the two reads
        between = self.later_writes(lf, ld).apply_range(
            self._sched_of(ws).lex_lt_union_map(s_sched))
        kept = list(range(n))
        dropped = []
        for d in reversed(range(n)):
            trial = [k for k in kept if k != d]
            pairs = before.intersect(self._agree_on(lf, trial))
            bad = pairs.subtract(same_element).union(between.intersect(pairs))
            if bad.is_empty():
                kept = trial
                dropped.append(d)
        return sorted(dropped)

    def shared_valid(self, members: list[tuple[Leaf, Load]], q: int) -> bool:
        """Can the reads ``members`` (of one array, by leaves sharing their ``q`` outer loops)
        share one tape indexed by those loops and the element read? Yes when any two of
        their instances with the same outer iteration and element read the same value: no
        write of the element runs between them."""
        keys = [self._key(lf, ld, q) for lf, ld in members]
        scheds = [self._sched_of([lf]) for lf, _ in members]
        for a, (lf_a, ld_a) in enumerate(members):
            ws = self.writers.get(ld_a.array, [])
            writes_before = self._sched_of(ws)
            for b, (lf_b, _) in enumerate(members):
                pairs = keys[a].apply_range(keys[b].reverse()).intersect(
                    scheds[a].lex_lt_union_map(scheds[b]))
                if pairs.is_empty():
                    continue
                between = self.later_writes(lf_a, ld_a).apply_range(
                    writes_before.lex_lt_union_map(scheds[b]))
                if not between.intersect(pairs).is_empty():
                    return False
        return True

    def _key(self, lf: Leaf, ld: Load, q: int) -> isl.UnionMap:
        """``{ S[i] -> [i_0, ..., i_(q-1), element read] }``."""
        st = self.stmt[lf.index]
        vs = [isl_name(v) for v in st.loop_vars]
        outer = isl.Map.read_from_str(
            self.model.ctx, f"{self.model.param_prefix}{{ {st.name}[{', '.join(vs)}] -> "
                            f"[{', '.join(vs[:q])}] }}").intersect_domain(self.domain(lf))
        access = self.access(lf, ld).reset_tuple_id(isl.dim_type.out)
        return outer.range_product(access).flatten_range().to_union_map()

    def _agree_on(self, lf: Leaf, dims: list[int]) -> isl.UnionMap:
        st = self.stmt[lf.index]
        vs = [isl_name(v) for v in st.loop_vars]
        ws = [f"{v}__2" for v in vs]
        cons = " and ".join(f"{vs[k]} = {ws[k]}" for k in dims) or "true"
        text = (f"{self.model.param_prefix}{{ {st.name}[{', '.join(vs)}] -> "
                f"{st.name}[{', '.join(ws)}] : {cons} }}")
        return isl.UnionMap.read_from_str(self.model.ctx, text)


def _sets(us: isl.UnionSet) -> list[isl.Set]:
    out = []
    us.foreach_set(out.append)
    return out


def analysable_error_types() -> tuple:
    """Errors meaning ISL cannot model an access (the structural answer stands)."""
    return (ValueError, isl.Error)


def exact_recorded(sets: Optional[RecordedSets], lf: Leaf, ld: Load) -> Optional[isl.Set]:
    """``sets.recorded(lf, ld)``, or None when there is no model or ISL cannot model it."""
    if sets is None:
        return None
    try:
        return sets.recorded(lf, ld)
    except analysable_error_types():
        return None
