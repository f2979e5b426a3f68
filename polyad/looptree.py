"""The loop tree of a kernel: statements' 2d+1 positions as a nested structure.

``build_tree(statements)`` turns the flat statement list (each with its loop
nest and position ``[p0, i0, p1, i1, ..., pd]``) into a tree of ``Node``
(a loop, or the root) and ``Leaf`` (a statement) objects. Every tree node has
a ``path``: the child indices from the root, so that program order is the
lexicographic order of paths and "shares a loop with" is "shares a path
prefix".

``Item``/``LoopItem`` are the mutable building blocks of derived kernels:
``flatten(items)`` assigns loops, positions and fresh names ``S0, S1, ...``.

A middle stage right after ``ir`` (it imports nothing else of polyad): reverse
mode builds on it, and so can forward mode, other targets and frontends.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Union

from . import ir


@dataclass(eq=False)
class Leaf:
    stmt: ir.Statement
    index: int                 # position in the kernel's statement list
    path: tuple = ()
    parent: Optional["Node"] = None

    @property
    def depth(self) -> int:
        """Number of enclosing loops."""
        return len(self.path) - 1


@dataclass(eq=False)
class Node:
    loop: Optional[ir.Loop]    # None for the root
    children: list = field(default_factory=list)
    path: tuple = ()
    parent: Optional["Node"] = None
    keys: list = field(default_factory=list)


def build_tree(statements) -> tuple[Node, list[Leaf]]:
    """The loop tree of ``statements`` and its leaves (in the order of ``statements``)."""
    root = Node(None)
    leaves = []
    for n, st in enumerate(statements):
        node = root
        for d, lp in enumerate(st.loops):
            key = st.position[d]
            child = _child(node, key)
            if child is None:
                child = Node(lp, parent=node)
                _insert(node, key, child)
            elif not isinstance(child, Node) or child.loop != lp:
                raise ValueError(f"statement {st.name}: position {st.position} clashes with "
                                 f"another statement or loop")
            node = child
        key = st.position[len(st.loops)]
        if _child(node, key) is not None:
            raise ValueError(f"statement {st.name}: position {st.position} is not unique")
        leaf = Leaf(st, n, parent=node)
        _insert(node, key, leaf)
        leaves.append(leaf)
    _assign_paths(root, ())
    return root, leaves


def _child(node: Node, key):
    for k, c in zip(node.keys, node.children):
        if k == key:
            return c
    return None


def _insert(node: Node, key, child):
    import bisect
    i = bisect.bisect(node.keys, key)
    node.keys.insert(i, key)
    node.children.insert(i, child)


def _assign_paths(node: Node, path: tuple):
    node.path = path
    for i, c in enumerate(node.children):
        if isinstance(c, Node):
            _assign_paths(c, path + (i,))
        else:
            c.path = path + (i,)


def loops_of(root: Node, path: tuple) -> tuple[ir.Loop, ...]:
    """The loops enclosing the node at ``path`` (the node itself excluded)."""
    out = []
    node = root
    for i in path[:-1]:
        node = node.children[i]
        out.append(node.loop)
    return tuple(out)


# --------------------------------------------------------------------------
# building derived kernels
# --------------------------------------------------------------------------


@dataclass(eq=False)
class Item:
    """A statement of a derived kernel; loops and position are filled by ``flatten``."""

    target: Union[ir.Load, ir.ScalarRef]
    op: str
    expr: ir.Expr
    conditions: tuple = ()
    guard: Optional[ir.Expr] = None
    line: int = 0
    source: str = ""


@dataclass(eq=False)
class LoopItem:
    loop: ir.Loop
    body: list


def item_of(st: ir.Statement, source: Optional[str] = None) -> Item:
    return Item(st.target, st.op, st.expr, st.conditions, st.guard, st.line,
                st.source if source is None else source)


def tree_items(node: Node, leaf_fn=None, before=None) -> list:
    """The subtree of ``node`` as items (a copy); ``leaf_fn(leaf)`` may return a list
    of items for a leaf (default: the statement itself), ``before(child)`` a list of
    items to put right before a child."""
    out = []
    for c in node.children:
        if before is not None:
            out.extend(before(c))
        if isinstance(c, Leaf):
            out.extend([item_of(c.stmt)] if leaf_fn is None else leaf_fn(c))
        else:
            body = tree_items(c, leaf_fn, before)
            if body:
                out.append(LoopItem(c.loop, body))
    return out


def walk_items(items):
    for it in items:
        if isinstance(it, LoopItem):
            yield from walk_items(it.body)
        else:
            yield it


def filter_items(items, keep) -> list:
    out = []
    for it in items:
        if isinstance(it, LoopItem):
            body = filter_items(it.body, keep)
            if body:
                out.append(LoopItem(it.loop, body))
        elif keep(it):
            out.append(it)
    return out


def flatten(items) -> list[ir.Statement]:
    """Statements with loops, 2d+1 positions and names S0, S1, ... in program order."""
    out: list[ir.Statement] = []

    def rec(items, loops, pos):
        for k, it in enumerate(items):
            if isinstance(it, LoopItem):
                rec(it.body, loops + (it.loop,), pos + (k,))
            else:
                out.append(ir.Statement(
                    name=f"S{len(out)}", loops=loops, position=pos + (k,),
                    conditions=tuple(it.conditions), guard=it.guard, target=it.target,
                    op=it.op, expr=it.expr, line=it.line, source=it.source))

    rec(items, (), ())
    return out
