"""Unit-stride innermost loops: strip-mine and interchange permutable bands of a schedule.

ISL's scheduler picks, among legal schedules, one with outer parallelism and
short dependence distances; it knows nothing of the memory layout. For
``y[j] += A[i, j] * t[i]`` (atax, bicg, the transposed product of mvt) it
makes ``j`` the outer, parallel loop and ``i`` the inner one, and ``A`` is
read down its columns (stride N: one element per cache line fetched).

In a permutable band every order of the members and every tiling are
legal. When the band's innermost member strides through an array and an
outer *coincident* member walks every access at unit stride (or leaves it
invariant), the band is rewritten as

    [floor(m / T)]   (parallel: m is coincident)
    [others..., m]   (m innermost: unit stride, vectorizable)

so that each thread owns a strip of T consecutive columns and streams the
rows of ``A`` through it, and the parallelism of ``m`` is kept by its strips.
The dependence test then runs on the new AST as on any other, so the facts
(parallel or not, reductions) stay proven.
"""

from __future__ import annotations

from typing import Optional

import islpy as isl

from .. import ir
from ..ir import Load
from .nests import ast_children, loop_vars_along, user_statements

# Columns per strip: 256 doubles (2 KiB) of a row per strip keeps the strip of the
# updated vector in L1 while every strip is long enough for hardware prefetching, and
# gives 2-thread machines 8 or more strips from 2048 columns on.
STRIP = 256


def _member_vars(mupa: isl.MultiUnionPwAff, member: int, loop_vars: dict) -> Optional[dict]:
    """Statement -> the loop variable the band member runs over (None: constant in it);
    None when some statement's member is not one loop variable with coefficient +-1."""
    out: dict = {}
    pw_affs = mupa.get_at(member).get_pw_aff_list()
    for j in range(pw_affs.n_pw_aff()):
        pa = pw_affs.get_at(j)
        name = pa.get_domain_space().get_tuple_name(isl.dim_type.set)
        pieces = pa.get_pieces()
        if len(pieces) != 1:
            return None
        aff = pieces[0][1]
        found = None
        for k in range(aff.dim(isl.dim_type.in_)):
            c = aff.get_coefficient_val(isl.dim_type.in_, k).to_python()
            if c == 0:
                continue
            if abs(c) != 1 or found is not None:
                return None
            found = loop_vars[name][k]
        out[name] = found
    return out


def strided_accesses(st: ir.Statement, var: Optional[str]) -> int:
    """How many of ``st``'s array accesses jump more than one element when ``var`` steps."""
    if var is None:
        return 0
    loads = [st.target] if isinstance(st.target, Load) else []
    loads += [ld for e in st.exprs() for ld in ir.loads(e)]
    n = 0
    for ld in loads:
        uses = [var in {x.name for x in ir.walk(ix) if isinstance(x, ir.LoopVar)}
                for ix in ld.index]
        if any(uses[:-1]):
            n += 1
    return n


def has_strided_inner_loop(kernel: ir.Kernel) -> bool:
    """Some statement's innermost loop strides through an array (a column walk) and a
    schedule could move that loop inward: not the loop of a statement that writes a local
    scalar (``u += f[k] * t[m + k - 2, n]``). The scalar's dependences chain all of that
    statement's instances in program order, and the ISL scheduler gets every one of them
    (``_schedule_kernel``), so every valid schedule runs its innermost loop innermost:
    asking ISL for a schedule with fewer column walks is futile for it (the deconvolution
    jvp's pipeline took 1.2 s with that question, 0.5 s without, the same C)."""
    scalars = {name for name, _ in kernel.locals}
    return any(len(st.loops) >= 2 and strided_accesses(st, st.loops[-1].var)
               and not (isinstance(st.target, ir.ScalarRef) and st.target.name in scalars)
               for st in kernel.statements)


def strided_inner_accesses(ast: isl.AstNode, kernel: ir.Kernel) -> int:
    """Strided accesses of the deepest statements (those with the most loops: they run
    most often) along the innermost AST loop around them, summed over the statements.

    The cost the unit-stride choices minimize: a statement whose innermost loop walks
    an array down a column fetches a cache line per element and does not vectorize.
    The loop variable an AST loop runs over is the statement's argument that uses its
    iterator (an argument ``-c3`` or ``c0 + 1`` counts; two such arguments: a skewed
    loop, counted as one strided access). A statement the AST prints more than once
    (a peeled first iteration) counts its most strided occurrence.
    """
    by_name = {st.name: st for st in kernel.statements}
    deepest = max((len(st.loops) for st in kernel.statements), default=0)
    strided: dict = {}

    def walk(node: isl.AstNode, iterator: Optional[str]) -> None:
        t = node.get_type()
        if t == isl.ast_node_type.for_:
            iterator = node.for_get_iterator().get_id().get_name()
        if t == isl.ast_node_type.user:
            for st, call in user_statements(node, by_name):
                if iterator is None or len(st.loops) != deepest:
                    continue
                uses = loop_vars_along(st, call, iterator)
                n = strided_accesses(st, uses[0]) if len(uses) == 1 else int(len(uses) > 1)
                strided[st.name] = max(strided.get(st.name, 0), n)
            return
        for child in ast_children(node):
            walk(child, iterator)

    walk(ast, None)
    return sum(strided.values())


def unit_stride_bands(schedule: isl.Schedule, kernel: ir.Kernel) -> tuple[isl.Schedule, list]:
    """``schedule`` with its permutable bands strip-mined and interchanged for unit-stride
    innermost loops (see the module docstring), and one line per band changed."""
    by_name = {st.name: st for st in kernel.statements}
    loop_vars = {st.name: [lp.var for lp in st.loops] for st in kernel.statements}
    decisions: list = []

    def cost(stride_vars: dict) -> int:
        """Strided accesses of the band's deepest statements (the ones that run most
        often: a statement with fewer loops, like the copy after a dot product, runs
        a loop's trip count fewer times) when the member is innermost."""
        deepest = max(len(by_name[s].loops) for s in stride_vars)
        return sum(strided_accesses(by_name[s], v) for s, v in stride_vars.items()
                   if len(by_name[s].loops) == deepest)

    errors: list = []

    def visit(node: isl.ScheduleNode) -> isl.ScheduleNode:
        try:
            return rewrite(node)
        except BaseException as exc:  # an exception escaping an isl callback aborts the process
            errors.append(exc)
            return node

    def rewrite(node: isl.ScheduleNode) -> isl.ScheduleNode:
        if node.get_type() != isl.schedule_node_type.band or node.band_n_member() < 2 \
                or not node.band_get_permutable():
            return node
        mupa = node.band_get_partial_schedule()
        n = node.band_n_member()
        members = [_member_vars(mupa, k, loop_vars) for k in range(n)]
        if any(m is None for m in members):
            return node
        inner = cost(members[-1])
        if inner == 0:
            return node
        chosen = next((k for k in range(n - 1)
                       if node.band_member_get_coincident(k) and cost(members[k]) == 0), None)
        if chosen is None:
            return node
        order = [k for k in range(n) if k != chosen] + [chosen]
        space = mupa.get_space()
        points = isl.MultiUnionPwAff.from_union_pw_aff_list(
            space, _upa_list(mupa, order))
        strip = mupa.get_at(chosen).scale_down_val(isl.Val.int_from_si(node.get_ctx(), STRIP)) \
            .floor()
        strips = isl.MultiUnionPwAff.from_union_pw_aff_list(
            space.drop_dims(isl.dim_type.set, 1, n - 1), _upa_list_of([strip]))
        node = node.delete().insert_partial_schedule(points).band_set_permutable(1)
        node = node.insert_partial_schedule(strips).band_member_set_coincident(0, 1)
        loops = ", ".join(f"{s} over {v}" for s, v in sorted(members[chosen].items()) if v)
        decisions.append(
            f"unit stride: the parallel loop ({loops}) interchanged innermost, replacing one "
            f"with {inner} strided access{'es' if inner > 1 else ''}; strips of {STRIP} of "
            f"its iterations run in parallel outside")
        return node

    out = schedule.map_schedule_node_bottom_up(visit)
    if errors:
        raise errors[0]
    return out, decisions


def _upa_list(mupa: isl.MultiUnionPwAff, order: list) -> isl.UnionPwAffList:
    return _upa_list_of([mupa.get_at(k) for k in order])


def _upa_list_of(upas: list) -> isl.UnionPwAffList:
    out = isl.UnionPwAffList.alloc(upas[0].get_ctx(), len(upas))
    for u in upas:
        out = out.add(u)
    return out
