"""Python-like text of a kernel's IR (loops nested by position), for inspection.

``format_kernel(k)`` prints what a derived kernel does without compiling it::

    print(format_kernel(grad_kernel(tv_cost.ir, "g")))
"""

from __future__ import annotations

from .. import ir
from ..looptree import Leaf, build_tree


def _loop_str(lp: ir.Loop) -> str:
    lo, hi = ir.expr_str(lp.lo), ir.expr_str(lp.hi)
    if lp.step == 1:
        rng = f"{hi}" if lo == "0" else f"{lo}, {hi}"
    else:
        rng = f"{lo}, {hi}, {lp.step}"
    return f"for {lp.var} in range({rng}):"


def _stmt_str(st: ir.Statement) -> str:
    t = ir.expr_str(st.target)
    s = f"{t} {st.op} {ir.expr_str(st.expr)}"
    conds = [(ir.expr_str(c.expr) if c.positive else f"not ({ir.expr_str(c.expr)})")
             for c in st.conditions]
    if st.guard is not None:
        conds.append(f"[{ir.expr_str(st.guard)}]")
    if conds:
        s = f"if {' and '.join(conds)}: {s}"
    return s


def format_kernel(k: ir.Kernel, comments: bool = True) -> str:
    """Readable pseudo-Python of ``k``: signature, temporaries, nested statements."""
    def ptype(p):
        t = repr(p.type)
        return f"pa.Out({t})" if p.intent == "out" else t
    sig = ", ".join(f"{p.name}: {ptype(p)}" for p in k.params)
    ret = f" -> {k.result[1].name}" if k.result else ""
    lines = [f"def {k.name}({sig}){ret}:"]
    for t in k.temps:
        lines.append(f"    {t.name} = pa.{'zeros' if t.zero else 'empty'}({t.type!r})")
    root, _ = build_tree(k.statements)

    def rec(node, depth):
        pad = "    " * depth
        for c in node.children:
            if isinstance(c, Leaf):
                s = pad + _stmt_str(c.stmt)
                if comments and c.stmt.source:
                    s += f"    # {c.stmt.name}: {c.stmt.source}"
                lines.append(s)
            else:
                lines.append(pad + _loop_str(c.loop))
                rec(c, depth + 1)

    rec(root, 1)
    if k.result:
        lines.append(f"    return {k.result[0]}")
    for f in k.funcs:
        lines.append(f"# device function {f.name}({', '.join(n for n, _ in f.params)})")
    return "\n".join(lines)
