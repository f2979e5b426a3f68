"""``pa.explain``: a readable report of how polyad compiles one kernel.

The report is read off the ``Artifact`` of ``polyad.pipeline`` (the very
objects the compiled kernel comes from: nothing is scheduled, planned or
emitted again here):

- the signature (DSL and C) and the size requirements checked at call time;
- every statement with its DSL line, iteration domain and access relations,
  accesses through boundary modes as the piecewise maps ISL works with, and
  the pieces the domain was split into (interior and border code);
- the scatter-to-gather decisions;
- the flow / anti / output dependences, one relation per statement pair;
- the ISL schedule tree and the AST it generates, each loop annotated with
  the dependence test's facts and the target plan's decision (parallel,
  reduction, private, atomic, simd) and why, under the iterator name the
  source uses;
- temporary (and tape) arrays with their sizes;
- the generated source.

``explain(k, format=...)`` renders it as ``text`` (for people), ``json`` (for
tools) or ``dot`` (the dependence graph, for Graphviz).
"""

from __future__ import annotations

import json
import re
from typing import Any, Optional, Union

import islpy as isl

from . import ir
from .emit.cexpr import ast_expr_c
from .ir import Binary, Const, Load, ScalarRef
from .pipeline import Artifact, Options, artifact_of
from .poly import PolyModel, boundary_access_map, maps_of
from .runtime import budget
from .schedule import ScheduledKernel
from .schedule.nests import STATEMENT_GROUP

FORMATS = ("text", "json", "dot")
DEPENDENCE_KINDS = (("flow", "read after write"), ("anti", "write after read"),
                    ("output", "write after write"))


def explain(kernel, format: str = "text", target: str = "openmp",
            deterministic: bool = False, sizes: Optional[dict] = None, tile=None,
            fuse: Union[bool, int, None] = None) -> str:
    """A report of how ``kernel`` (a ``pa.Kernel``, primal or derived) is compiled.

    ``format``: ``"text"`` (sections for people), ``"json"`` (the same
    content as a JSON object, see ``report``) or ``"dot"`` (the dependence
    graph between the scheduled statements, for Graphviz). ``target``: the
    code generator whose source is shown (``"openmp"``); ``deterministic``:
    explain the schedule ``pa.compile(k, deterministic=True)`` uses; ``sizes``
    (sizes and integer parameters, e.g. ``{"N": 1000, "steps": 500}``): the
    checkpointing plan of a derived kernel for a call with these values;
    ``tile``, ``fuse``: explain the schedule ``pa.compile(k, tile=..., fuse=...)`` uses.
    """
    if format not in FORMATS:
        raise ValueError(f"unknown format {format!r}; choose one of {', '.join(FORMATS)}")
    data = report(kernel, target, deterministic, sizes, tile, fuse)
    if format == "json":
        return json.dumps(data, indent=2) + "\n"
    if format == "dot":
        return _dot(data)
    return _text(data)


def report(kernel, target: str = "openmp", deterministic: bool = False,
           sizes: Optional[dict] = None, tile=None, fuse: Union[bool, int, None] = None) -> dict:
    """The report of ``explain`` as a JSON-serialisable dict.

    Keys: ``kernel file line target deterministic params result sizes
    c_signature c_params context requirements statements scatter_to_gather
    dependences dependences_computed dependences_inexact schedule_origin
    schedule_decisions schedule_tree loops ast temporaries tapes source``,
    ``memory_budget`` where the kernel has tapes and ``checkpoints`` where a derived
    kernel's loop can be checkpointed (``polyad.checkpointing``). ISL objects appear in
    ISL's own notation.
    """
    data = artifact_report(artifact_of(kernel, Options(target, deterministic, tile=tile,
                                                       fuse=fuse)))
    if data["tapes"]:
        limit, source = budget.budget_bytes(getattr(kernel, "memory", None))
        data["memory_budget"] = {"bytes": limit, "source": source}
    checkpoints = getattr(kernel, "checkpoint_report", None)
    data["checkpoints"] = checkpoints(sizes) if checkpoints is not None else None
    return data


def artifact_report(art: Artifact) -> dict:
    """The report (see ``report``) of one compilation's artifact."""
    k = art.kernel
    sk = art.scheduled
    outline = _Outline(art.plan)
    outline.walk(art.plan.scheduled.ast, 0, {})  # the AST the plan (and the source) is of
    sig = art.signature
    return {
        "kernel": k.name,
        "file": k.filename,
        "line": k.line,
        "target": art.options.target,
        "deterministic": art.options.deterministic,
        "params": [_param(p) for p in k.params],
        "result": None if k.result is None else {"name": k.result[0], "dtype": k.result[1].name},
        "sizes": list(k.sizes),
        "c_signature": sig.declaration(),
        "c_params": [{"kind": p.kind, "name": p.name, "role": p.role,
                      "c": p.declaration(sig.restrict)} for p in sig.params],
        "context": str(sk.model.context),
        "requirements": [r.message for r in sk.requirements],
        "statements": _statements(k, sk),
        "scatter_to_gather": dict(sorted(sk.gather_decisions.items())),
        "dependences": _dependences(sk),
        "dependences_computed": _computed_kinds(sk),
        "dependences_inexact": dict(sorted(sk.deps.inexact.items())),
        "schedule_origin": sk.schedule_origin,
        # the plan's schedule: a target may have added decisions of its own
        "schedule_decisions": list(art.plan.scheduled.schedule_decisions),
        "schedule_tree": _schedule_tree(sk.schedule.get_root()),
        "loops": outline.loops,
        "ast": outline.lines,
        "target_notes": list(getattr(art.plan, "notes", lambda: [])()),
        "temporaries": [_temp(t) for t in k.temps],
        "tapes": [{"name": t.name, "type": repr(t.type), "holds": t.holds,
                   "bytes": budget.size_formula(t)} for t in k.temps if t.role == "tape"],
        "source": art.source,
    }


# --------------------------------------------------------------------------
# collecting
# --------------------------------------------------------------------------


def _param(p: ir.Param) -> dict:
    return {"name": p.name, "kind": "array" if p.is_array else "scalar",
            "type": repr(p.type), "intent": p.intent}


def _temp(t: ir.Temp) -> dict:
    elements = t.type.elements
    size: ir.Expr = Const(t.type.dtype.bits // 8, ir.i64)
    for ext in t.type.shape if t.type.layout is None else (elements,):
        size = Binary("*", size, ext, ir.i64)
    if t.type.dtype.packed:   # whole 4-byte words of 32 elements
        size = Binary("*", Const(t.type.dtype.np.itemsize, ir.i64),
                      Binary("//", Binary("+", elements, Const(ir.BIT_WORD - 1, ir.i64), ir.i64),
                             Const(ir.BIT_WORD, ir.i64), ir.i64), ir.i64)
    return {"name": t.name, "type": repr(t.type), "zero_filled": t.zero,
            "role": t.role, "tape": t.role == "tape",
            "elements": ir.expr_str(ir.fold_integer_constants(elements)),
            "bytes": ir.expr_str(ir.fold_integer_constants(size))}


def _statement_text(st: ir.Statement) -> str:
    t = st.target
    target = ir.expr_str(t) if isinstance(t, Load) else t.name
    return f"{target} {st.op} {ir.expr_str(st.expr)}"


def _access_list(st: ir.Statement) -> tuple[list[Load], list[Load]]:
    """(array reads, array writes) of ``st``, each distinct access once, in source order."""
    reads = list(dict.fromkeys(ld for ld in st.reads()))
    writes = [st.target] if isinstance(st.target, Load) else []
    return reads, writes


def _why_unscheduled(st: ir.Statement, sk: ScheduledKernel, model: PolyModel) -> str:
    """Why no piece of ``st`` reached the schedule."""
    if model.domain(st).is_empty():
        return "it never runs: its conditions hold for no iteration"
    if any(n == st.name or n.startswith(st.name + "_") for n in sk.removed_statements):
        return ("removed as dead: nothing the kernel writes out or returns depends on it, "
                "or it adds zero")
    return "every write falls outside a .zero array"


def _show(obj, model: PolyModel) -> str:
    """ISL text of a set or relation, without the constraints every size satisfies."""
    return str(obj.gist_params(model.context))


def _statements(k: ir.Kernel, sk: ScheduledKernel) -> list[dict]:
    model = sk.model.for_kernel(k)
    pieces: dict[str, list[ir.Statement]] = {st.name: [] for st in k.statements}
    for piece in sk.kernel.statements:
        if piece.owner in pieces:
            pieces[piece.owner].append(piece)
    local_names = {n for n, _ in k.locals}
    out = []
    for st in k.statements:
        reads, writes = _access_list(st)
        t = st.target
        out.append({
            "name": st.name,
            "line": st.line,
            "source": st.source,
            "ir": _statement_text(st),
            "loops": [f"for {lp.var} in range({ir.expr_str(lp.lo)}, {ir.expr_str(lp.hi)}"
                      + (f", {lp.step})" if lp.step != 1 else ")") for lp in st.loops],
            "conditions": [("" if c.positive else "not ") + ir.expr_str(c.expr)
                           for c in st.conditions],
            "guard": None if st.guard is None else ir.expr_str(st.guard),
            "domain": _show(model.domain(st), model),
            "reads": [_access(model, st, ld, k) for ld in reads],
            "writes": [_access(model, st, ld, k) for ld in writes],
            "scalar_reads": sorted(n for n in st.scalar_reads() if n in local_names),
            "scalar_writes": [t.name] if isinstance(t, ScalarRef) else [],
            "pieces": [_piece(sk, p) for p in pieces[st.name]],
            "unscheduled": None if pieces[st.name] else _why_unscheduled(st, sk, model),
            "scatter_to_gather": {n: why for n, why in sorted(sk.gather_decisions.items())
                                  if any(p.piece_of(n) for p in pieces[st.name])},
            "loop_order": sk.loop_orders.get(st.name),
        })
    return out


def _access(model: PolyModel, st: ir.Statement, ld: Load, k: ir.Kernel) -> dict:
    return {"access": ir.expr_str(ld), "mode": k.array_type(ld.array).mode,
            "relation": _show(boundary_access_map(model, st, ld), model)}


def _piece(sk: ScheduledKernel, st: ir.Statement) -> dict:
    reads, writes = _access_list(st)
    m = sk.model
    return {"name": st.name, "ir": _statement_text(st),
            "domain": _show(m.domain(st), m),
            "reads": [{"access": ir.expr_str(ld), "relation": _show(m.access_map(st, ld), m)}
                      for ld in reads],
            "writes": [{"access": ir.expr_str(ld), "relation": _show(m.access_map(st, ld), m)}
                       for ld in writes]}


def _dependences(sk: ScheduledKernel) -> list[dict]:
    sk.deps.order_accumulators()
    out = []
    for kind, _ in DEPENDENCE_KINDS:
        for var, umap in sorted(getattr(sk.deps, kind).items()):
            rows = [{"kind": kind, "variable": var,
                     "source": m.get_tuple_name(isl.dim_type.in_),
                     "sink": m.get_tuple_name(isl.dim_type.out),
                     "relation": _show(m, sk.model)} for m in maps_of(umap)]
            out += sorted(rows, key=lambda r: (r["source"], r["sink"], r["relation"]))
    return out


def _computed_kinds(sk: ScheduledKernel) -> dict[str, list[str]]:
    """Variable -> the dependence kinds the scheduler computed for it (passes ask only for
    what they use: e.g. flow only for scalar locals)."""
    sk.deps.order_accumulators()
    out: dict[str, list[str]] = {}
    for kind, _ in DEPENDENCE_KINDS:
        for var in getattr(sk.deps, kind):
            out.setdefault(var, []).append(kind)
    return dict(sorted(out.items()))


_LOOP_TYPES = {isl.ast_loop_type.default: "default", isl.ast_loop_type.atomic: "atomic",
               isl.ast_loop_type.unroll: "unroll", isl.ast_loop_type.separate: "separate"}


def _schedule_tree(node: isl.ScheduleNode) -> dict:
    """The ISL schedule tree as nested dicts (type, content, children)."""
    T = isl.schedule_node_type
    t = node.get_type()
    out: dict[str, Any] = {"type": str(t).split(".")[-1]}
    if t == T.domain:
        out["domain"] = str(node.domain_get_domain())
        out["statements"] = _by_statement(node.domain_get_domain())
    elif t == T.filter:
        out["filter"] = str(node.filter_get_filter())
        out["statements"] = _by_statement(node.filter_get_filter())
    elif t == T.mark:
        out["mark"] = node.mark_get_id().get_name()
    elif t == T.context:
        out["context"] = str(node.context_get_context())
    elif t == T.guard:
        out["guard"] = str(node.guard_get_guard())
    elif t == T.band:
        mupa = node.band_get_partial_schedule()
        out["permutable"] = bool(node.band_get_permutable())
        out["members"] = [{
            "coincident": bool(node.band_member_get_coincident(k)),
            "ast_loop_type": _LOOP_TYPES.get(node.band_member_get_ast_loop_type(k), "default"),
            "schedule": _member_schedule(mupa.get_at(k)),
        } for k in range(node.band_n_member())]
    children = [_schedule_tree(node.get_child(k)) for k in range(node.n_children())]
    children = [c for c in children if c["type"] != "leaf"]
    if children:
        out["children"] = children
    return out


def _by_statement(uset: isl.UnionSet) -> dict[str, str]:
    """Statement name -> its part of ``uset`` (ISL text), sorted by name."""
    sets: list[isl.Set] = []
    uset.foreach_set(sets.append)
    return dict(sorted((s.get_tuple_name(), str(s)) for s in sets))


_AFF_BODY = re.compile(r"\{\s*\w+\[[^\]]*\]\s*->\s*\[\((.*)\)\]\s*\}$")


def _member_schedule(upa: isl.UnionPwAff) -> dict[str, str]:
    """Statement name -> its schedule expression in one band member (domain gisted away)."""
    pwaffs: list[isl.PwAff] = []
    upa.foreach_pw_aff(pwaffs.append)
    out = {}
    for pa in pwaffs:
        name = pa.get_domain_space().get_tuple_name(isl.dim_type.set)
        pa = pa.gist(pa.domain())
        text = str(pa)
        m = _AFF_BODY.search(text)
        out[name] = m.group(1) if m else text
    return dict(sorted(out.items()))


# --------------------------------------------------------------------------
# the AST with the loop decisions
# --------------------------------------------------------------------------


def loop_reasons(lp, sk: ScheduledKernel) -> list[str]:
    """Why the dependence test (``lp.facts``) and the target's plan (``lp``) decided so."""
    info = lp.facts
    if not info.parallel:
        return [info.why_not_parallel] + ([lp.mapping] if lp.mapping else [])
    out = []
    if not info.carried:
        out.append("no dependence is carried by this loop")
    for var, op in sorted(info.reductions.items()):
        out.append(f"scalar {var!r} is only updated with '{op}=' here: its carried dependences "
                   f"are reduction dependences, honoured by a reduction clause")
    for var in sorted(info.private):
        out.append(f"scalar {var!r} is written before it is read in every iteration: "
                   f"each thread gets a private copy")
    for var, n in sorted(lp.privatized.items()):
        out.append(f"{var!r} is a small scatter target ({ir.expr_str(n)} elements): each thread "
                   f"adds into its own copy, summed at the end (array-section reduction)")
    for name in sorted(lp.atomic):
        st = sk.statement(name)
        target = st.target.array if isinstance(st.target, Load) else st.target.name
        out.append(f"{name} scatters into {target!r} with '{st.op}' across iterations: "
                   f"parallel with atomic updates")
    if lp.mapping:
        out.append(lp.mapping)
    return out


class _Outline:
    """Walks the ISL AST: C-like lines with each loop's decision, and the loop records."""

    def __init__(self, plan):
        self.plan = plan
        self.sk = plan.scheduled
        self.lines: list[str] = []
        self.loops: list[dict] = []

    def out(self, depth: int, text: str) -> None:
        self.lines.append("  " * depth + text)

    def walk(self, node: isl.AstNode, depth: int, names: dict) -> None:
        T = isl.ast_node_type
        t = node.get_type()
        if t == T.block:
            ch = node.block_get_children()
            for k in range(ch.n_ast_node()):
                self.walk(ch.get_at(k), depth, names)
        elif t == T.for_:
            self.for_loop(node, depth, names)
        elif t == T.if_:
            self.out(depth, f"if {_paren(ast_expr_c(node.if_get_cond(), names))}")
            self.walk(node.if_get_then_node(), depth + 1, names)
            if node.if_has_else_node():
                self.out(depth, "else")
                self.walk(node.if_get_else_node(), depth + 1, names)
        elif t == T.mark:
            self.out(depth, f"mark {node.mark_get_id().get_name()}")
            self.walk(node.mark_get_node(), depth + 1, names)
        elif t == T.user:
            call = node.user_get_expr()
            args = [ast_expr_c(call.get_op_arg(k), names) for k in range(1, call.get_op_n_arg())]
            for name in call.get_op_arg(0).get_id().get_name().split(STATEMENT_GROUP):
                self.out(depth, f"{name}({', '.join(args)})")

    def for_loop(self, node: isl.AstNode, depth: int, names: dict) -> None:
        lp = self.plan.loop(node)
        info = lp.facts
        it = node.for_get_iterator().get_id().get_name()
        name = lp.iterator
        names = {**names, it: name}
        init = ast_expr_c(node.for_get_init(), names)
        cond = _strip(ast_expr_c(node.for_get_cond(), names))
        inc = ast_expr_c(node.for_get_inc(), names)
        key = f"L{len(self.loops)}"
        decision = lp.decision()
        self.out(depth, f"for ({name} = {init}; {cond}; {name} += {inc})    [{key}: {decision}]")
        self.loops.append({
            "id": key, "annotation": info.key,
            "iterator": name, "depth": info.depth,
            "statements": sorted(info.statements), "decision": decision,
            "parallel": info.parallel, "omp_parallel": lp.threads, "simd": lp.simd,
            "carried": info.carried, "reductions": dict(sorted(info.reductions.items())),
            "private": sorted(info.private), "atomic": sorted(lp.atomic),
            "privatized": {a: ir.expr_str(n) for a, n in sorted(lp.privatized.items())},
            "lane_sums": getattr(lp, "lane_sums", 0),
            "why": loop_reasons(lp, self.sk)})
        self.walk(node.for_get_body(), depth + 1, names)


def _strip(text: str) -> str:
    return text[1:-1] if text.startswith("(") and text.endswith(")") else text


def _paren(text: str) -> str:
    return text if text.startswith("(") and text.endswith(")") else f"({text})"


# --------------------------------------------------------------------------
# rendering
# --------------------------------------------------------------------------


def _section(lines: list[str], title: str) -> None:
    lines += ["", title, "-" * len(title)]


def _text(d: dict) -> str:
    title = (f"kernel {d['kernel']}  ({d['file']}:{d['line']}, target {d['target']}"
             + (", deterministic" if d["deterministic"] else "") + ")")
    lines = [title, "=" * len(title)]

    _section(lines, "signature")
    width = max((len(p["name"]) for p in d["params"]), default=0)
    for p in d["params"]:
        lines.append(f"  {p['name']:<{width}}  {p['type']}  ({p['intent']})")
    if d["result"]:
        lines.append(f"  returns {d['result']['dtype']} (the value of {d['result']['name']!r})")
    if d["sizes"]:
        lines.append(f"  sizes: {', '.join(d['sizes'])}   context {d['context']}")
    lines.append(f"  C: {d['c_signature']}")
    for r in d["requirements"]:
        lines.append(f"  checked at call time: {r}")

    _section(lines, "statements, domains and access relations")
    for st in d["statements"]:
        lines.append(f"  {st['name']}  line {st['line']}: {st['source'] or st['ir']}")
        for lp in st["loops"]:
            lines.append(f"      {lp}")
        for c in st["conditions"]:
            lines.append(f"      if {c}")
        if st["guard"]:
            lines.append(f"      guard (run time): {st['guard']}")
        lines.append(f"    domain   {st['domain']}")
        for kind in ("reads", "writes"):
            for a in st[kind]:
                mode = f" ({a['mode']})" if a["mode"] else ""
                lines.append(f"    {kind[:-1]:<7}  {a['access']}{mode}: {a['relation']}")
        if st["scalar_reads"]:
            lines.append(f"    reads    scalar {', '.join(st['scalar_reads'])}")
        if st["scalar_writes"]:
            lines.append(f"    writes   scalar {', '.join(st['scalar_writes'])}")
        pieces = st["pieces"]
        if len(pieces) != 1 or pieces[0]["name"] != st["name"] or pieces[0]["ir"] != st["ir"]:
            lines.append(f"    scheduled as {len(pieces)} piece(s)"
                         + (" (boundary modes / scatter-to-gather split the domain):"
                            if pieces else f" ({st['unscheduled']})"))
            for p in pieces:
                lines.append(f"      {p['name']}: {p['ir']}")
                lines.append(f"        domain {p['domain']}")
        for name, why in st["scatter_to_gather"].items():
            lines.append(f"    scatter-to-gather of {name}: {why}")
        if st["loop_order"]:
            lines.append(f"    {st['loop_order']}")

    _section(lines, "dependences (between scheduled statements)")
    partial = {var: kinds for var, kinds in d["dependences_computed"].items()
               if len(kinds) < len(DEPENDENCE_KINDS)}
    for var, kinds in partial.items():
        lines.append(f"  {var}: only {'/'.join(kinds)} dependences computed (all the "
                     f"scheduler uses for it)")
    for var, why in d["dependences_inexact"].items():
        lines.append(f"  {var}: memory-based (every earlier access of an element, not only "
                     f"the last write before it; more order than needed, never less): {why}")
    if not d["dependences"]:
        lines.append("  none")
    for kind, meaning in DEPENDENCE_KINDS:
        rows = [r for r in d["dependences"] if r["kind"] == kind]
        if rows:
            lines.append(f"  {kind} ({meaning}):")
            for r in rows:
                lines.append(f"    {r['variable']}: {r['source']} -> {r['sink']}  {r['relation']}")

    _section(lines, f"schedule tree (ISL; {d['schedule_origin']})")
    lines += [f"  decision: {why}" for why in d["schedule_decisions"]]
    _tree_text(d["schedule_tree"], 1, lines)

    _section(lines, "AST and loop decisions")
    lines += ["  " + line for line in d["ast"]]
    for lp in d["loops"]:
        lines.append(f"  {lp['id']} (loop over {lp['iterator']}, statements "
                     f"{', '.join(lp['statements'])}): {lp['decision']}")
        lines += [f"      why: {w}" for w in lp["why"]]

    if d["target_notes"]:
        _section(lines, f"target {d['target']}")
        lines += [f"  {note}" for note in d["target_notes"]]

    if d["temporaries"]:
        _section(lines, "temporary and tape arrays (the Python wrapper allocates them; "
                        "C callers pass them)")
        for t in d["temporaries"]:
            fill = "zero-filled" if t["zero_filled"] else "uninitialised"
            kind = "tape" if t["tape"] else "temporary"
            lines.append(f"  {t['name']}  {t['type']}  {kind}, {fill}: {t['elements']} "
                         f"elements = {t['bytes']} bytes")

    if d.get("tapes"):
        _section(lines, "tapes (primal values the reverse sweep reads back: only those a later "
                        "write overwrites)")
        for t in d["tapes"]:
            lines.append(f"  {t['name']}  {t['type']} = {t['bytes']} bytes: {t['holds']}")
        b = d["memory_budget"]
        lines.append(f"  total: {' + '.join(t['bytes'] for t in d['tapes'])} bytes; a call "
                     f"whose temporaries exceed {budget.human(b['bytes'])} ({b['source']}) "
                     f"raises MemoryBudgetError" + (
                         ", unless it checkpoints (below)" if d.get("checkpoints") else ""))

    c = d.get("checkpoints")
    if c:
        _section(lines, f"checkpoints (the loop over {c['loop']}, line {c['line']}: "
                        f"{c['statement']})")
        lines.append(f"  checkpointed {c['when']} ({budget.human(c['budget']['bytes'])}, "
                     f"{c['budget']['source']}); a call runs the pieces with OpenMP, "
                     f"pa.compile(g, target='cuda') compiles them for CUDA")
        for s in c["state"]:
            lines.append(f"  snapshot of {s['name']}  {s['type']} = {s['bytes']} bytes")
        lines.append(f"  one snapshot: {c['snapshot_bytes']} bytes")
        lines.append(f"  strategy: {c['strategy']}")
        for note in c["step"]:
            lines.append(f"  step kernel: {note}")
        p = c["plan"]
        if p:
            lines.append(f"  for {', '.join(f'{k}={v}' for k, v in p['sizes'].items())}: "
                         f"{p['snapshots']} snapshot(s) of {budget.human(p['snapshot_bytes'])} "
                         f"besides the start, {budget.human(p['fixed_bytes'])} of working "
                         f"arrays; {p['strategy']}")

    _section(lines, f"generated source ({d['target']})")
    lines += d["source"].rstrip("\n").split("\n")
    return "\n".join(lines) + "\n"


def _tree_text(node: dict, depth: int, lines: list[str]) -> None:
    pad = "  " * depth
    t = node["type"]
    if t == "band":
        lines.append(f"{pad}band, {len(node['members'])} member(s)"
                     + (", permutable" if node["permutable"] else ""))
        for k, m in enumerate(node["members"]):
            groups: dict[str, list[str]] = {}
            for stmt, expr in m["schedule"].items():
                groups.setdefault(expr, []).append(stmt)
            flags = ([m["ast_loop_type"]] if m["ast_loop_type"] != "default" else []) + \
                (["coincident"] if m["coincident"] else [])
            lines.append(f"{pad}  member {k}{' (' + ', '.join(flags) + ')' if flags else ''}: "
                         + "; ".join(f"{', '.join(s)} -> {e}" for e, s in groups.items()))
    elif t in ("sequence", "set"):
        lines.append(f"{pad}{t}")
    elif t in ("domain", "filter"):
        lines.append(f"{pad}{t}:")
        lines += [f"{pad}  {text}" for text in node["statements"].values()]
    else:
        lines.append(f"{pad}{t}: {node.get(t, '')}")
    for child in node.get("children", ()):
        _tree_text(child, depth + 1, lines)


def _dot_str(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


_DOT_STYLE = {"flow": "solid", "anti": "dashed", "output": "dotted"}


def _dot(d: dict) -> str:
    legend = (f"{d['kernel']}: dependences between scheduled statements; solid flow (RAW), "
              f"dashed anti (WAR), dotted output (WAW); gray: reduction dependences")
    lines = [f"digraph {_dot_str(d['kernel'])} {{",
             f"  label={_dot_str(legend)};",
             "  labelloc=t;",
             '  node [shape=box, fontname="monospace"];']
    for k, st in enumerate(d["statements"]):
        pieces = st["pieces"]
        lines.append(f"  subgraph cluster_{k} {{")
        lines.append(f"    label={_dot_str(st['name'] + '  line ' + str(st['line']) + ': ' + (st['source'] or st['ir']))};")
        for p in pieces:
            lines.append(f"    {_dot_str(p['name'])} [label={_dot_str(p['name'] + chr(10) + p['ir'])}];")
        lines.append("  }")
    reductions = {(lp_st, var) for lp in d["loops"] for var in lp["reductions"]
                  for lp_st in lp["statements"]}
    seen = set()
    for r in d["dependences"]:
        key = (r["kind"], r["variable"], r["source"], r["sink"])
        if key in seen:
            continue
        seen.add(key)
        attrs = [f"label={_dot_str(r['kind'] + ' ' + r['variable'])}",
                 f"style={_DOT_STYLE[r['kind']]}"]
        if (r["source"], r["variable"]) in reductions and (r["sink"], r["variable"]) in reductions:
            attrs.append('color="gray50"')
        lines.append(f"  {_dot_str(r['source'])} -> {_dot_str(r['sink'])} [{', '.join(attrs)}];")
    lines.append("}")
    return "\n".join(lines) + "\n"
