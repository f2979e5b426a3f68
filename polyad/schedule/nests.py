"""Top-level loop nests of a kernel, as the schedule passes see them, and AST children."""

from __future__ import annotations

import islpy as isl

from .. import ir


def loop_nests(kernel: ir.Kernel) -> dict[int, list]:
    """Statements inside loops, grouped by their top-level position (one group per nest)."""
    nests: dict[int, list] = {}
    for st in kernel.statements:
        if st.loops:
            nests.setdefault(st.position[0], []).append(st)
    return nests


def inner_loops(nest: list):
    """(depth, {position of the loop: its statements}) for each depth from 1 (below the
    nest's outermost loop, which threads share) to the deepest loop that still has a
    loop inside it: the loops at that depth and what runs in each."""
    depth = max(len(st.loops) for st in nest)
    for d in range(1, depth - 1):
        nodes: dict = {}
        for st in nest:
            if len(st.loops) > d:
                nodes.setdefault(st.position[:d + 1], []).append(st)
        yield d, nodes


def fresh_statement_name(kernel: ir.Kernel, name: str, taken: frozenset = frozenset()) -> str:
    """``name``, or ``name`` with a number appended, used by no statement, parameter or
    temporary of ``kernel`` (statements and arrays share ISL's tuple names) nor in
    ``taken`` (names a pass has handed out but not yet added)."""
    return ir.fresh_name(name, {s.name for s in kernel.statements} | {p.name for p in kernel.params}
                         | {t.name for t in kernel.temps} | set(taken))


def selected_by_loops(target: ir.Load) -> bool:
    """Does a loop variable select the element ``target`` accesses (not ``d_f[0]``)?"""
    return any(isinstance(x, ir.LoopVar) for e in target.index for x in ir.walk(e))


def rows_selected_by_loops(statements: list, array: str, c: int) -> bool:
    """Does every access to ``array`` in ``statements`` (all inside the same ``c`` outer
    loops) index its first ``c`` dimensions by those loops (``T[m, ...]`` in iteration
    ``m``)?"""
    outer = statements[0].loops[:c]
    return all(len(ld.index) >= c and all(isinstance(e, ir.LoopVar) and e.name == lp.var
                                          for e, lp in zip(ld.index, outer))
               for st in statements for ld in st.reads() + [st.target]
               if isinstance(ld, ir.Load) and ld.array == array)


def common_depth(nest: list) -> int:
    """How many outer loops (same loop, same position) all statements of a nest share."""
    c, first = 0, nest[0]
    while all(len(st.loops) > c and st.loops[c] == first.loops[c]
              and st.position[:c + 1] == first.position[:c + 1] for st in nest):
        c += 1
    return c


def ast_children(node: isl.AstNode) -> list:
    """The child nodes of an ISL AST node (for walkers)."""
    t = node.get_type()
    if t == isl.ast_node_type.for_:
        return [node.for_get_body()]
    if t == isl.ast_node_type.if_:
        kids = [node.if_get_then_node()]
        if node.if_has_else_node():
            kids.append(node.if_get_else_node())
        return kids
    if t == isl.ast_node_type.block:
        ch = node.block_get_children()
        return [ch.get_at(k) for k in range(ch.n_ast_node())]
    if t == isl.ast_node_type.mark:
        return [node.mark_get_node()]
    return []


def skip_marks(node: isl.AstNode) -> isl.AstNode:
    """The node a chain of mark nodes wraps (``node`` itself when it is no mark)."""
    while node.get_type() == isl.ast_node_type.mark:
        node = node.mark_get_node()
    return node


def sequence_nodes(node: isl.AstNode) -> list:
    """The nodes ``node`` runs one after another: a block's children (nested blocks, mere
    sequences, spliced in), else ``node`` itself."""
    if node.get_type() != isl.ast_node_type.block:
        return [node]
    return [kid for child in ast_children(node) for kid in sequence_nodes(child)]


def contains_for(node: isl.AstNode) -> bool:
    """A for-node at or below ``node``."""
    return node.get_type() == isl.ast_node_type.for_ or any(
        contains_for(c) for c in ast_children(node))


def ast_expr_uses(expr: isl.AstExpr, name: str) -> bool:
    """Whether the ISL AST expression ``expr`` mentions the identifier ``name``."""
    t = expr.get_type()
    if t == isl.ast_expr_type.id:
        return expr.get_id().get_name() == name
    if t == isl.ast_expr_type.op:
        return any(ast_expr_uses(expr.get_op_arg(k), name) for k in range(expr.get_op_n_arg()))
    return False


def loop_vars_along(st, call: isl.AstExpr, iterator: str) -> list:
    """The loop variables of statement ``st`` whose values the AST loop ``iterator``
    changes: those whose argument in the statement's AST call (``call``) uses it
    (``c1``, ``N - c1``, ``c0 + c1``)."""
    return [st.loop_vars[k - 1] for k in range(1, call.get_op_n_arg())
            if ast_expr_uses(call.get_op_arg(k), iterator)]


# The name of an AST statement that runs several statements one after the other at
# each of its points (``schedule.build`` groups adjacent statements of equal domains
# for AST generation): their names joined by this character, which no DSL name holds.
STATEMENT_GROUP = "+"


def user_nodes(node: isl.AstNode) -> list:
    """The statement (user) nodes of an AST subtree, in order."""
    if node.get_type() == isl.ast_node_type.user:
        return [node]
    return [n for kid in ast_children(node) for n in user_nodes(kid)]


def statement_names(node: isl.AstNode) -> list[str]:
    """The names of the statements an AST subtree runs, in order (groups split apart)."""
    out = []
    if node.get_type() == isl.ast_node_type.user:
        out.extend(node.user_get_expr().get_op_arg(0).get_id().get_name().split(STATEMENT_GROUP))
    for c in ast_children(node):
        out.extend(statement_names(c))
    return out


def user_statements(node: isl.AstNode, by_name: dict) -> list:
    """``(statement, call)`` for each statement (from ``by_name``) an AST user node runs,
    in order: one, or the statements of a group, which share the node's call expression
    (its arguments are the values of their loop variables)."""
    call = node.user_get_expr()
    names = call.get_op_arg(0).get_id().get_name().split(STATEMENT_GROUP)
    return [(by_name[name], call) for name in names]
