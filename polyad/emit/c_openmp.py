"""C emitter: walks the ISL AST of a scheduled kernel and prints its target's plan.

The emitted C is deterministic and readable: DSL names for arrays, scalars,
sizes and loop iterators (the plan names them), one statement per line with
a comment naming its DSL line, the loop directives the plan renders
(``LoopPlan.pragma``) and nothing else decided here. The language details
(qualifiers, math spellings, atomics) come from a ``cexpr.Dialect``.

C signature of a kernel (documented in the emitted header comment too):
parameters in DSL order (arrays as pointers, ``const`` when only read;
scalars by value), then the sizes (``int64_t``), then temporary arrays, then
``<result>_out`` (pointer to the returned scalar) when the kernel returns one.

A kernel of several loop nests prints each nest outside every loop as a
function of its own (``NAME_nest1``, ...) between the lines ``UNIT_BEGIN`` and
``UNIT_END``, which the kernel's function calls in order: the runtime compiles
such units in parallel (``runtime.toolchain.translation_units``).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Optional

import islpy as isl

from .. import ir
from ..ir import Load
from ..schedule.build import SMALL_SIZES
from ..schedule.merge import MergedUpdate, merge_updates
from ..schedule.nests import ast_children, sequence_nodes, user_nodes, user_statements
from ..schedule.simplify import simplify_run
from ..version import __version__ as POLYAD_VERSION
from .cexpr import (AST_HELPERS, C99, CPrinter, Dialect, ast_expr_c, ast_expr_ir, cname,
                    unparen)


# The lines around a unit (a loop nest as a function of its own); the runtime splits
# the source at them to compile units in parallel.
UNIT_BEGIN = "/* polyad unit: a loop nest compiled on its own, in parallel with the others */"
UNIT_END = "/* polyad end of unit */"


@dataclass(frozen=True)
class CParam:
    """One parameter of a kernel's C function, as typed fields (never C text to parse).

    ``kind``: ``array`` (a DSL array parameter), ``scalar`` (a DSL scalar, by
    value), ``size`` (``int64_t``), ``temp`` (scratch the caller allocates) or
    ``result`` (pointer receiving the returned scalar). ``role``: ``in``,
    ``out`` or ``inout`` (how the kernel uses the value or pointee), ``temp``
    for scratch. ``dtype`` is the element type of pointers, the value type
    otherwise; ``extents`` the array's shape in sizes (and integer
    parameters), ``()`` for values and the result; ``mode`` its boundary
    mode; ``const`` whether the pointee is only read; ``zero_filled`` (temps)
    whether the kernel expects it zero-filled on entry.
    """

    kind: str
    name: str
    c_name: str
    role: str
    dtype: ir.DType
    extents: tuple = ()
    mode: Optional[str] = None
    const: bool = False
    zero_filled: bool = False

    @property
    def is_pointer(self) -> bool:
        return self.kind in ("array", "temp", "result")

    def c_type(self, restrict: str = "restrict") -> str:
        """The parameter's C type: ``const double *restrict``, ``int64_t``, ...
        (``restrict``: the no-alias qualifier's spelling, ``""`` for none)."""
        if not self.is_pointer:
            return self.dtype.c_type
        return ("const " if self.const else "") + self.dtype.c_type + " *" + restrict

    def declaration(self, restrict: str = "restrict") -> str:
        """``const double *restrict x``; ``restrict=""`` gives ``const double *x`` (C++
        has no ``restrict``; cffi ignores it)."""
        c_type = self.c_type(restrict)
        return f"{c_type}{'' if c_type.endswith('*') else ' '}{self.c_name}"


@dataclass(frozen=True)
class CSignature:
    """A kernel's C function: its name and its parameters (``CParam``) in call order."""

    name: str
    params: tuple
    restrict: str = "restrict"  # the no-alias qualifier as the target's dialect spells it

    def declaration(self, restrict: bool = True) -> str:
        """``void NAME(PARAMS)``; ``restrict=False`` for C++ headers and cffi's ``cdef``."""
        decls = ", ".join(p.declaration(self.restrict if restrict else "") for p in self.params)
        return f"void {self.name}({decls or 'void'})"


def dsl_c_names(kernel: ir.Kernel) -> dict[str, str]:
    """DSL name -> C name of every parameter, size, scalar local and temporary."""
    names = {p.name: cname(p.name) for p in kernel.params}
    names.update({s: cname(s) for s in kernel.sizes})
    names.update({n: cname(n) for n, _ in kernel.locals})
    names.update({t.name: cname(t.name) for t in kernel.temps})
    return names


def signature(kernel: ir.Kernel, dialect: Dialect = C99) -> CSignature:
    """The C signature of ``kernel``'s function (see the module docstring for the order);
    ``dialect`` spells its no-alias qualifier."""
    written = {st.target.array for st in kernel.statements if isinstance(st.target, Load)}
    params = []
    for p in kernel.params:
        if p.is_array:
            at = p.type
            params.append(CParam("array", p.name, cname(p.name), p.intent, at.dtype, at.shape,
                                 at.mode, const=p.name not in written and p.intent == "in"))
        else:
            params.append(CParam("scalar", p.name, cname(p.name), "in", p.type))
    for s in kernel.sizes:
        params.append(CParam("size", s, cname(s), "in", ir.i64))
    for t in kernel.caller_temps:
        params.append(CParam("temp", t.name, cname(t.name), "temp", t.type.dtype, t.type.shape,
                             t.type.mode, zero_filled=t.zero))
    if kernel.result is not None:
        name, dt = kernel.result
        params.append(CParam("result", name, cname(name) + "_out", "out", dt))
    return CSignature(cname(kernel.name), tuple(params), dialect.restrict)


class _Emitter:
    def __init__(self, plan, dialect: Dialect, outline: bool = False):
        self.plan = plan
        self.sk = plan.scheduled
        self.k = self.sk.kernel
        self.by_name = {st.name: st for st in self.k.statements}
        self.dialect = dialect
        self.func_names = {f.name: "pa_fn_" + f.name for f in self.k.funcs}
        self.names = plan.names
        self.printer = CPrinter(self.k, self.func_names, self.names, dialect)
        self.lines: list[str] = []
        self.uses_ast_helpers = False
        self.target_override: dict = {}  # target element -> C text (per-lane partial sums)
        self.shift: Optional[tuple] = None  # (iterator, lane): the iterator reads iterator + lane
        # (iterator, row temporary or '', values q): statements print once per q, the
        # iterator read as iterator + q and the row's row 0 as row q (``LoopPlan.value_blocks``)
        self.block_copies: Optional[tuple] = None
        self.rows = {t.name: t for t in self.k.temps if t.per_thread}
        self.rows_in_scope: set = set()  # row buffers a loop around the current line declares
        self.written = {st.target.array for st in self.k.statements if isinstance(st.target, Load)}
        self.sig = signature(self.k, dialect)
        # loop nests outside every loop printed as functions of their own, when there are
        # several (C only: the CUDA emitter makes kernels of them)
        self.outline = outline and _outer_loop_count(self.sk.ast) >= 2
        self.units: list[list[str]] = []
        # streaming stores printed since the last fence (``streamed_loop``): fenced at the
        # end of the iteration of the thread loop, the 'omp single' or the function that
        # ran them (``fence_streaming_stores``)
        self.unfenced_streams = False

    # ---- statements ------------------------------------------------------
    def substituted(self, st: ir.Statement, args: list) -> ir.Statement:
        """``st`` with its loop variables replaced by the AST's iterator expressions."""
        values = dict(zip(st.loop_vars, args))
        return dataclasses.replace(
            st, target=_subst(st.target, values), expr=_subst(st.expr, values),
            guard=_subst(st.guard, values) if st.guard is not None else None)

    def comment(self, st: ir.Statement) -> str:
        return f"  // line {st.line}: {st.source[:70]}" if st.source else f"  // line {st.line}"

    def target_text(self, st: ir.Statement) -> str:
        t = st.target
        if t in self.target_override:
            return self.target_override[t]
        return self.printer.load(t, self.names) if isinstance(t, Load) else self.names[t.name]

    def statement(self, st: ir.Statement, indent: str, atomic: bool):
        """Print one (substituted) statement, guarded and/or atomic as needed."""
        p = self.printer
        value = p.expr(st.expr, self.names)
        packed = p.store(st.target, value, self.names) if isinstance(st.target, Load) else None
        if packed is not None:
            if st.op != "=":
                raise ValueError(f"{st.name}: a packed array is only assigned, not {st.op!r}")
            lines = [packed + ";"]   # pa_bit_set is atomic itself
        elif atomic:
            lines = self.dialect.atomic_update(self.target_text(st), st.op, value)
        else:
            lines = [f"{self.target_text(st)} {st.op} {value};"]
        lines[-1] += self.comment(st)
        if st.guard is not None:
            self.out(indent, f"if ({p.expr(st.guard, self.names)}) {{")
            for line in lines:
                self.out(indent + "  ", line)
            self.out(indent, "}")
        else:
            for line in lines:
                self.out(indent, line)

    def merged(self, update: MergedUpdate, indent: str):
        """A merged update (``schedule.merge``), a term per line with its statement's comment."""
        head = f"{self.target_text(update)} {update.op} "
        if not update.terms:
            self.out(indent, head + "0;" + self.comment(update.statements[0]))
            return
        pad = " " * (len(head) - 2)
        for k, term in enumerate(update.terms):
            text = self.printer.expr(term.expr, self.names, 7 if term.sign == "-" else 6)
            lead = head + ("-" if term.sign == "-" else "") if k == 0 else f"{pad}{term.sign} "
            end = ";" if k == len(update.terms) - 1 else ""
            self.out(indent, lead + text + end + self.comment(term.statement))

    def out(self, indent, text):
        self.lines.append(indent + text)

    # ---- AST walk ----------------------------------------------------------
    def walk(self, node: isl.AstNode, indent: str, iters: dict, atomic: frozenset,
             team: bool = False):
        """Print ``node``; ``team``: it runs in every thread of a parallel region (the
        plan's ``region`` loops), where what holds no worksharing loop runs in
        'omp single'."""
        t = node.get_type()
        if team and t != isl.ast_node_type.block and not self.plan.shares_work(node):
            self.single([node], indent, iters, atomic)
        elif t == isl.ast_node_type.block:
            kids = sequence_nodes(node)
            if not team:
                self.sequence(kids, indent, iters, atomic)
                return
            alone: list = []
            for kid in kids:
                if not self.plan.shares_work(kid):
                    alone.append(kid)
                    continue
                self.single(alone, indent, iters, atomic)
                alone = []
                self.walk(kid, indent, iters, atomic, team)
            self.single(alone, indent, iters, atomic)
        elif t == isl.ast_node_type.for_:
            if self.outline and not iters and not team:
                self.nest_function(node, indent, atomic)
            else:
                self.for_loop(node, indent, iters, atomic)
        elif t == isl.ast_node_type.if_:
            start = len(self.lines)
            self.out(indent, f"if ({self.ast_c(node.if_get_cond(), iters)}) {{")
            self.walk(node.if_get_then_node(), indent + "  ", iters, atomic, team)
            then_end = len(self.lines)
            if node.if_has_else_node():
                self.out(indent, "} else {")
                self.walk(node.if_get_else_node(), indent + "  ", iters, atomic, team)
                if len(self.lines) == then_end + 1:  # nothing left in the else branch
                    del self.lines[then_end:]
            if len(self.lines) == start + 1:  # nothing left in the branches
                del self.lines[start:]
                return
            self.out(indent, "}")
        elif t == isl.ast_node_type.mark:
            self.walk(node.mark_get_node(), indent, iters, atomic, team)
        elif t == isl.ast_node_type.user:
            self.statements(self.user_statements(node, iters), indent, atomic)
        else:
            raise NotImplementedError(f"ISL AST node {t}")

    def sequence(self, kids: list, indent: str, iters: dict, atomic: frozenset):
        """Print consecutive nodes of a block (runs of statements merged as one)."""
        pending: list = []
        for kid in kids:
            if kid.get_type() == isl.ast_node_type.user:
                pending += self.user_statements(kid, iters)
                continue
            self.statements(pending, indent, atomic)
            pending = []
            self.walk(kid, indent, iters, atomic)
        self.statements(pending, indent, atomic)

    def nest_function(self, node, indent: str, atomic: frozenset):
        """Print the loop nest ``node`` (outside every loop) as a function of its own, a
        unit, and its call. The function takes the kernel's parameters, the row buffers
        of the kernel's function, the scalars the nest reads by value and the ones it
        writes by address (copied in and out: inside, they are locals, as in one
        function)."""
        saved, self.lines = self.lines, []
        self.for_loop(node, "  ", {}, atomic)
        self.fence_streaming_stores("  ")
        body, self.lines = self.lines, saved
        if not body:
            return
        read, written, dsl_lines = set(), set(), set()
        for u in user_nodes(node):
            for st, _ in user_statements(u, self.by_name):
                dsl_lines.add(st.line)
                read |= st.scalar_reads()
                if isinstance(st.target, ir.ScalarRef):
                    written.add(st.target.name)
        # (the units' own names differ in their numbers)
        taken = set(self.names.values())
        kind = "small_sizes_nest" if self.plan.loop(node).facts.small_sizes else "nest"
        name = _fresh(f"{self.sig.name}_{kind}{len(self.units) + 1}", taken)
        kept = [p for p in self.sig.params if p.kind != "result"]
        decls = [p.declaration(self.sig.restrict) for p in kept]
        args = [p.c_name for p in kept]
        for v, t in self.rows.items():
            decls.append(f"{t.type.dtype.c_type} *restrict {self.names[v]}")
            args.append(self.names[v])
        prologue, epilogue = [], []
        for n, dt in self.k.locals:
            c = self.names[n]
            if n in written:
                at = _fresh(c + "_at", taken)
                decls.append(f"{dt.c_type} *restrict {at}")
                args.append("&" + c)
                prologue.append(f"  {dt.c_type} {c} = *{at};")
                epilogue.append(f"  *{at} = {c};")
            elif n in read:
                decls.append(f"{dt.c_type} {c}")
                args.append(c)
        self.units.append([UNIT_BEGIN, f"void {name}({', '.join(decls)})", "{"]
                          + prologue + body + epilogue + ["}", UNIT_END])
        lines = sorted(dsl_lines)
        self.out(indent, f"{name}({', '.join(args)});  // line{'s' if len(lines) > 1 else ''} "
                         + ", ".join(map(str, lines)))

    def single(self, kids: list, indent: str, iters: dict, atomic: frozenset):
        """Nodes inside a parallel region that one thread runs (the others wait at the
        construct's closing barrier)."""
        if not kids:
            return
        self.out(indent, "#pragma omp single")
        self.out(indent, "{")
        self.sequence(kids, indent + "  ", iters, atomic)
        self.fence_streaming_stores(indent + "  ")
        self.out(indent, "}")

    def user_statements(self, node, iters) -> list[ir.Statement]:
        """The statements an AST user node runs, its arguments substituted."""
        pairs = user_statements(node, self.by_name)
        call = pairs[0][1]
        args = [ast_expr_ir(call.get_op_arg(k), iters) for k in range(1, call.get_op_n_arg())]
        if self.shift is not None:
            it, lane = self.shift
            at = {it: ir.Binary("+", ir.LoopVar(it), ir.LoopVar(lane), ir.i64)}
            args = [ir.substitute(a, at) for a in args]
        return [self.substituted(st, args) for st, _ in pairs]

    def copies(self, run: list) -> list:
        """``run`` as the copies of a blocked loop's values run it (``block_copies``): for
        each value ``q`` in turn, every statement with the loop's iterator plus ``q`` and
        the row temporary's row ``q``."""
        if self.block_copies is None:
            return run
        it, row, values = self.block_copies
        out = []
        for q in values:
            at = {it: ir.Binary("+", ir.LoopVar(it), ir.Const(q, ir.i64), ir.i64)} if q else {}

            def fn(x, q=q):
                if row and isinstance(x, Load) and x.array == row:
                    return Load(x.array, (ir.Const(q, ir.i64),) + x.index[1:], x.dtype)
                return None

            def copy(e, at=at, fn=fn):
                return ir.map_expr(ir.substitute(e, at), fn)

            out += [dataclasses.replace(st, target=copy(st.target), expr=copy(st.expr),
                                        guard=None if st.guard is None else copy(st.guard))
                    for st in run]
        return out

    def statements(self, run: list, indent: str, atomic: frozenset):
        """Print a run of consecutive statements of one block, as the merge pass groups them."""
        run = simplify_run(self.copies(run), atomic, frozenset(self.func_names))
        for item in merge_updates(run, atomic):
            if isinstance(item, MergedUpdate):
                self.merged(item, indent)
            else:
                self.statement(item, indent, item.name in atomic)

    def ast_c(self, e, iters, loop_bound: bool = False) -> str:
        text = ast_expr_c(e, iters, loop_bound)
        if "pa_i" in text:
            self.uses_ast_helpers = True
        return text

    def nonempty_sections(self, sections: list, indent: str) -> str:
        """Open the two blocks around a loop whose reduction clause privatizes the array
        sections ``sections`` ((array, elements)) that may have no elements
        (``LoopPlan.sections_maybe_empty``) and return the loop's indent: each array is
        seen in the loop through a pointer to itself where it has elements, else to one
        element of the stack, which the clause's section of at least one element
        (``pa_imax(..., 1)``) then covers; the loop writes none of an empty array (its
        bounds are proven)."""
        self.uses_ast_helpers = True
        self.out(indent, "{")
        for array, elements in sections:
            c_name = self.names[array]
            c_type = self.k.array_type(array).dtype.c_type
            count = self.printer.expr(elements, self.names)
            self.out(indent + "  ", f"{c_type} pa_none_{c_name}[1];  // what gcc's reduction "
                                    f"writes where {c_name} has no elements")
            self.out(indent + "  ", f"{c_type} *restrict pa_sum_{c_name} = ({count} >= 1) ? "
                                    f"{c_name} : pa_none_{c_name};")
        self.out(indent + "  ", "{")
        for array, _ in sections:
            c_name = self.names[array]
            c_type = self.k.array_type(array).dtype.c_type
            self.out(indent + "    ", f"{c_type} *restrict {c_name} = pa_sum_{c_name};")
        return indent + "    "

    def for_loop(self, node, indent, iters, atomic):
        lp = self.plan.loop(node)
        it = node.for_get_iterator().get_id().get_name()
        name = lp.iterator
        iters = {**iters, it: name}
        init = self.ast_c(node.for_get_init(), iters, loop_bound=True)
        cond = self.ast_c(node.for_get_cond(), iters, loop_bound=True)
        inc = self.ast_c(node.for_get_inc(), iters)
        if getattr(lp, "lane_sums", 0) and inc == "1" and \
                self.lane_loop(node, lp, indent, iters, atomic, init):
            return
        if getattr(lp, "value_blocks", ()):
            self.blocked_loop(node, lp, indent, iters, atomic, init)
            return
        cond = unparen(cond)
        start = len(self.lines)
        sections = lp.sections_maybe_empty()
        pragma = lp.pragma(self.names, lambda n: self.printer.expr(n, self.names),
                           lambda e: self.ast_c(e, {}))
        if sections:
            indent = self.nonempty_sections(sections, indent)
        sums = (self.register_sums(node, lp, indent, iters)
                if getattr(lp, "register_sums", ()) else {})
        if sums:
            indent += "  "
            pragma += f" reduction(+:{', '.join(acc for acc, _ in sums.values())})"
        overridden = self.target_override
        self.target_override = {**overridden, **{t: acc for t, (acc, _) in sums.items()}}
        kept = (self.invariant_reads(node, name, iters, atomic, indent)
                if getattr(lp, "simd", False) else {})
        if kept:
            indent += "  "
        if lp.threads:
            atomic = atomic | lp.atomic
        # iterations (chunks of rows) run by threads each have their own buffers; a loop
        # every thread of a team runs, sharing its inner loops, shares the function's
        own = [v for v in lp.facts.row_buffers if v not in self.rows_in_scope] \
            if lp.threads else []
        # ... allocated once per thread, in a region of their own around the loop, where
        # the loop opens the parallel region (``LoopPlan.buffers_per_thread``)
        per_thread = bool(own) and getattr(lp, "buffers_per_thread", False)
        if per_thread:
            region, pragma = lp.thread_region_pragmas(
                self.names, lambda n: self.printer.expr(n, self.names))
            self.out(indent, region)
            self.out(indent, "{")
            for v in own:
                self.out(indent + "  ", self.row_buffer_allocation(v, per_thread=True))
            indent += "  "
        streamed = bool(getattr(lp, "stream", ())) and \
            self.streamed_loop(node, lp, indent, iters, atomic, init)
        if streamed:
            indent += "  "
        if pragma is not None:
            self.out(indent, pragma)
        step = f"{name} += {inc}" if inc != "1" else f"{name}++"
        self.out(indent, f"for (int64_t {name} = {init}; {cond}; {step}) {{")
        if not per_thread:
            for v in own:
                self.out(indent + "  ", self.row_buffer_allocation(v))
        self.rows_in_scope |= set(own)
        body = len(self.lines)
        self.walk(node.for_get_body(), indent + "  ", iters, atomic,
                  lp.region in ("open", "team"))
        if lp.threads:
            self.fence_streaming_stores(indent + "  ")
        self.rows_in_scope -= set(own)
        self.target_override = overridden
        for read in kept:
            del self.printer.kept_reads[read]
        if len(self.lines) == body:
            # every statement of the body simplified away (``schedule.simplify``): a loop
            # without statements does nothing, so neither it nor its directive is printed
            del self.lines[start:]
            return
        frees = [f"free({self.names[v]});" for v in own]
        if not per_thread:
            for line in frees:
                self.out(indent + "  ", line)
        self.out(indent, "}")
        if streamed:
            indent = indent[:-2]
            self.out(indent, "}")
        if per_thread:
            indent = indent[:-2]
            for line in frees:
                self.out(indent + "  ", line)
            self.out(indent, "}")
        for _ in range(2 if sections else 0):  # the blocks of nonempty_sections
            indent = indent[:-2]
            self.out(indent, "}")
        if kept:
            indent = indent[:-2]
            self.out(indent, "}")
        if sums:
            self.updates_after_loop(node, iters, indent, [
                (target, [f"{self.printer.load(target, self.names)} += {acc};"
                          + self.comment(st)]) for target, (acc, st) in sums.items()])
            self.out(indent[:-2], "}")

    def invariant_reads(self, node, name: str, iters: dict, atomic: frozenset,
                        indent: str) -> dict:
        """Open the block of a vector loop that reads elements invariant along it of arrays
        no statement writes: declare each as a local, read once before the loop, and
        return {element: local} (``CPrinter.kept_reads``; the caller closes the block).

        Why: a function outlined for an OpenMP region loses its pointers' ``restrict``,
        so gcc must assume a store of the loop may change ``f[0]`` and reads it again at
        every iteration (a broadcast per tap and vector of the deconvolution and conv
        gradients). Legal: polyad never runs a kernel on arrays that overlap one it
        writes (``KernelFunction._check_aliasing``). Only the reads every iteration makes
        move (statements of the loop body outside any ``if``, without a guard, not under
        a selection), and the block runs when the loop runs at least once (no condition
        where every moved read has constant indices within constant extents), so a
        moved read is one the loop made: in bounds."""
        kids = sequence_nodes(node.for_get_body())
        if any(kid.get_type() != isl.ast_node_type.user for kid in kids):
            return {}
        run = simplify_run(self.copies([st for kid in kids
                                        for st in self.user_statements(kid, iters)]),
                           atomic, frozenset(self.func_names))
        reads: list = []
        for st in run:
            if st.guard is not None:
                continue
            for read in _unconditional_loads(st.expr):
                if (read.array not in self.written and read not in reads
                        and not self.k.array_type(read.array).dtype.packed
                        and _invariant(read, name)):
                    reads.append(read)
        if not reads:
            return {}
        taken = (set(self.names.values()) | set(iters.values())
                 | set(self.printer.kept_reads.values()))
        kept: dict = {}
        for read in reads:
            base = self.names.get(read.array, read.array)
            parts = [_index_part(i) for i in read.index]
            local = _fresh("_".join([base] + parts) if None not in parts
                           else f"{base}_at{len(kept)}", taken)
            kept[read] = local
        if all(self._constant_in_bounds(read) for read in kept):
            self.out(indent, "{")
        else:
            self.out(indent, f"if ({self.loop_runs(node, iters)}) {{  // the loop runs: the "
                             f"reads it makes before it are in bounds")
        for read, local in kept.items():
            c_type = self.k.array_type(read.array).dtype.c_type
            self.out(indent + "  ", f"const {c_type} {local} = "
                                    f"{self.printer.load(read, self.names)};  // "
                                    f"{ir.expr_str(read)}, invariant along {name}")
        self.printer.kept_reads.update(kept)
        return kept

    def loop_runs(self, node, iters: dict) -> str:
        """The C condition that the ISL loop ``node`` makes at least one iteration (its
        condition at its first value), for code before or after the loop that touches
        only what the loop would."""
        it = node.for_get_iterator().get_id().get_name()
        init = self.ast_c(node.for_get_init(), iters, loop_bound=True)
        return unparen(self.ast_c(node.for_get_cond(), {**iters, it: f"({init})"},
                                  loop_bound=True))

    def updates_after_loop(self, node, iters: dict, indent: str, updates: list) -> None:
        """Print ``updates`` ((target element, C text of the statements updating it)) after
        the loop ``node``, under the condition that the loop ran unless every target has
        constant indices within constant extents: where the loop runs no iteration, its
        bounds need not keep the elements inside their arrays (fuzz seed 10204: ``y0[3]``
        of a 3-element ``y0`` at N = 0)."""
        if all(self._constant_in_bounds(t) for t, _ in updates):
            for _, lines in updates:
                for line in lines:
                    self.out(indent, line)
            return
        self.out(indent, f"if ({self.loop_runs(node, iters)}) {{  // the loop ran: its "
                         "updates are in bounds")
        for _, lines in updates:
            for line in lines:
                self.out(indent + "  ", line)
        self.out(indent, "}")

    def _constant_in_bounds(self, read: Load) -> bool:
        """Whether ``read`` has constant indices within its array's constant extents."""
        shape = self.k.array_type(read.array).shape
        return all(isinstance(i, ir.Const) and isinstance(n, ir.Const) and 0 <= i.value < n.value
                   for i, n in zip(read.index, shape))

    def register_sums(self, node, lp, indent: str, iters: dict) -> dict:
        """Open the block of a loop whose updates of ``lp.register_sums`` arrays add into
        elements invariant along it: declare one scalar sum per element (zero) and return
        {element: (scalar, its first statement)} (the loop's statements add into the
        scalar; the caller adds each scalar to its element after the loop and closes the
        block)."""
        taken = set(self.names.values()) | set(iters.values())
        sums: dict = {}
        for u in user_nodes(node.for_get_body()):
            for st in self.user_statements(u, iters):
                t = st.target
                if isinstance(t, Load) and t.array in lp.register_sums and t not in sums:
                    acc = _fresh(f"{self.names.get(t.array, t.array)}_sum{len(sums)}", taken)
                    sums[t] = (acc, st)
        if sums:
            self.out(indent, "{")
            for t, (acc, _) in sums.items():
                c_type = self.k.array_type(t.array).dtype.c_type
                self.out(indent + "  ", f"{c_type} {acc} = 0;  // the sum of "
                                        f"{self.printer.load(t, self.names)} along the loop")
        return sums

    def upper_bound(self, node, iters: dict) -> Optional[tuple[str, str]]:
        """(``"<"`` or ``"<="``, the C text of the bound) where the condition of the ISL loop
        ``node`` compares its iterator with a bound, else None."""
        cond = node.for_get_cond()
        T = isl.ast_expr_op_type
        if (cond.get_type() != isl.ast_expr_type.op or cond.get_op_type() not in (T.le, T.lt)
                or cond.get_op_arg(0).get_type() != isl.ast_expr_type.id
                or cond.get_op_arg(0).get_id().get_name()
                != node.for_get_iterator().get_id().get_name()):
            return None
        return ("<=" if cond.get_op_type() == T.le else "<",
                self.ast_c(cond.get_op_arg(1), iters))

    def lane_loop(self, node, lp, indent: str, iters: dict, atomic: frozenset, init: str) -> bool:
        """Print a loop that only adds into elements invariant along it (``LoopPlan.lane_sums``)
        as blocks of lanes, each summing into its own accumulator, then the remainder, then
        one update of each element; False (nothing printed) when its bound has another form."""
        upper = self.upper_bound(node, iters)
        if upper is None:
            return False
        name, n = lp.iterator, lp.lane_sums
        rel, bound = upper
        users = sequence_nodes(node.for_get_body())
        taken = set(self.names.values()) | set(iters.values())
        lane = _fresh(name + "_lane", taken)
        self.shift = (name, lane)
        shifted = [st for u in users for st in self.user_statements(u, iters)]
        self.shift = None
        funcs = frozenset(self.func_names)
        plain = simplify_run([st for u in users for st in self.user_statements(u, iters)],
                             atomic, funcs)
        if not plain:  # every update simplified away: the loop does nothing
            return True
        sums: dict = {}
        for st in plain:
            if st.target not in sums:
                acc = _fresh(self.names.get(st.target.array, st.target.array) + "_lanes"
                             + (str(len(sums) + 1) if sums else ""), taken)
                sums[st.target] = acc
        c_type = self.k.array_type(plain[0].target.array).dtype.c_type
        inner = indent + "  "
        self.out(indent, "{")
        for target, acc in sums.items():
            self.out(inner, f"{c_type} {acc}[{n}] = {{0}};  // per-lane partial sums of "
                            f"{self.printer.load(target, self.names)} along {name}")
        self.out(inner, f"int64_t {name} = {init};")
        self.out(inner, f"for (; {name} + {n - 1} {rel} {bound}; {name} += {n}) {{")
        self.out(inner + "  ", "#pragma omp simd")
        self.out(inner + "  ", f"for (int64_t {lane} = 0; {lane} < {n}; {lane}++) {{")
        self.target_override = {t: f"{acc}[{lane}]" for t, acc in sums.items()}
        self.statements(shifted, inner + "    ", atomic)
        self.out(inner + "  ", "}")
        self.out(inner, "}")
        self.out(inner, f"for (; {name} {rel} {bound}; {name}++) {{")
        self.target_override = {t: f"{acc}[0]" for t, acc in sums.items()}
        self.statements(plain, inner + "  ", atomic)
        self.target_override = {}
        self.out(inner, "}")
        self.updates_after_loop(node, iters, inner, [
            (target, [f"for (int64_t {lane} = 1; {lane} < {n}; {lane}++) {{",
                      f"  {acc}[0] += {acc}[{lane}];",
                      "}",
                      f"{self.printer.load(target, self.names)} += {acc}[0];"])
            for target, acc in sums.items()])
        self.out(indent, "}")
        return True

    def streamed_loop(self, node, lp, indent: str, iters: dict, atomic: frozenset,
                      init: str) -> bool:
        """Open the ``if`` of a loop whose stores go past the caches where the array is
        large (``LoopPlan.stream``) and print that branch: the iterations up to an element
        aligned for a vector, then blocks of lanes (the loop's statements computed into a
        vector of lanes, 'omp simd' across the lanes, the vector stored by a streaming
        store), then the rest; the fence after them comes later (``fence_streaming_stores``).
        The caller prints the loop as written in the ``else`` branch and closes it. False
        (nothing printed) when the loop's bound has another form or its statements
        simplified away."""
        upper = self.upper_bound(node, iters)
        if upper is None:
            return False
        array, lanes, elements, iterations = lp.stream
        name = lp.iterator
        rel, bound = upper
        users = sequence_nodes(node.for_get_body())
        plain = simplify_run([st for u in users for st in self.user_statements(u, iters)],
                             atomic, frozenset(self.func_names))
        taken = (set(self.names.values()) | set(iters.values())
                 | set(self.printer.kept_reads.values()))
        lane = _fresh(name + "_lane", taken)
        self.shift = (name, lane)
        shifted = [st for u in users for st in self.user_statements(u, iters)]
        self.shift = None
        if not plain or len({st.target for st in shifted}) != 1:
            return False
        at = self.printer.load(plain[0].target, self.names)
        at_type = self.k.array_type(array)
        c_type = at_type.dtype.c_type
        vector = _fresh(f"{self.names[array]}_lanes", taken | {lane})
        count = self.printer.expr(at_type.elements, self.names)
        store = self.stream_helper(at_type.dtype, lanes)
        width = lanes * at_type.dtype.np.itemsize
        inner = indent + "  "
        start = init if re.fullmatch(r"\w+", init) else f"({unparen(init)})"
        self.out(indent, f"if ({count} >= {elements} && {bound} - {start} >= {iterations}) {{  "
                         f"// {self.names[array]} is too large for the caches: stored past them")
        self.out(inner, f"int64_t {name} = {init};")
        self.out(inner, f"for (; {name} {rel} {bound} && (uintptr_t)&{at} % {width} != 0; "
                        f"{name}++) {{  // up to an element aligned for a vector")
        self.statements(plain, inner + "  ", atomic)
        self.out(inner, "}")
        self.out(inner, f"for (; {name} + {lanes - 1} {rel} {bound}; {name} += {lanes}) {{")
        self.out(inner + "  ", f"{c_type} {vector}[{lanes}];")
        self.out(inner + "  ", "#pragma omp simd")
        self.out(inner + "  ", f"for (int64_t {lane} = 0; {lane} < {lanes}; {lane}++) {{")
        saved = self.target_override
        self.target_override = {**saved, shifted[0].target: f"{vector}[{lane}]"}
        self.statements(shifted, inner + "    ", atomic)
        self.target_override = saved
        self.out(inner + "  ", "}")
        self.out(inner + "  ", f"{store}(&{at}, {vector});")
        self.out(inner, "}")
        self.out(inner, f"for (; {name} {rel} {bound}; {name}++) {{")
        self.statements(plain, inner + "  ", atomic)
        self.out(inner, "}")
        self.unfenced_streams = True
        self.out(indent, "} else {")
        return True

    def fence_streaming_stores(self, indent: str) -> None:
        """Print the fence after the streaming stores printed since the last one, if any:
        at the end of an iteration of a thread loop, of an 'omp single' block or of a
        function, so that the stores of each thread reach memory before the barrier or
        the return after which other threads read them (a thread reads its own in program
        order)."""
        if self.unfenced_streams:
            self.out(indent, "pa_stream_fence();  // the streaming stores above reach memory "
                             "before other threads read them")
            self.unfenced_streams = False

    def stream_helper(self, dtype: ir.DType, lanes: int) -> str:
        """The name of the C function that stores ``lanes`` values of ``dtype`` with
        streaming stores at an address aligned to their size (recorded in the printer's
        helpers with ``pa_stream_fence``): the widest of the build's x86 instructions
        that divides the vector, a plain copy where it has none."""
        name = f"pa_stream_{dtype.name}x{lanes}"
        if name in self.printer.helpers:
            return name
        c_type, size = dtype.c_type, dtype.np.itemsize
        suffix = "pd" if dtype == ir.f64 else "ps"
        body = []
        for feature, bits, prefix in (("__AVX512F__", 512, "_mm512"), ("__AVX__", 256, "_mm256"),
                                      ("__SSE2__", 128, "_mm")):
            step = bits // 8 // size
            if lanes % step == 0:
                body += [f"#{'el' if body else ''}if defined({feature})",
                         f"  for (int k = 0; k < {lanes}; k += {step})",
                         f"    {prefix}_stream_{suffix}(at + k, {prefix}_loadu_{suffix}(lanes + k));"]
        body += ["#else", f"  for (int k = 0; k < {lanes}; k++)", "    at[k] = lanes[k];", "#endif"]
        self.printer.helpers.setdefault("stream", "\n".join([
            "/* streaming stores: values written past the caches (LoopPlan.stream) */",
            "#if defined(__x86_64__) || defined(__i386__)",
            "#include <immintrin.h>",
            "#endif",
            "static inline void pa_stream_fence(void)",
            "{",
            "#if defined(__SSE__)",
            "  _mm_sfence();",
            "#endif",
            "}"]))
        self.printer.helpers[name] = "\n".join(
            [f"static inline void {name}({c_type} *restrict at, const {c_type} *restrict lanes)",
             "{"] + body + ["}"])
        return name

    def blocked_loop(self, node, lp, indent: str, iters: dict, atomic: frozenset,
                     init: str) -> None:
        """Print a loop run in blocks (``LoopPlan.value_blocks``; the plan checked its shape): whole
        blocks of ``width`` values, each child of the body holding the plan's statements
        once with their copies side by side, each other child once per value; then the
        values left over, as written."""
        width, row, jammed = lp.value_blocks
        name = lp.iterator
        cond = node.for_get_cond()
        bound = self.ast_c(cond.get_op_arg(1), iters)
        rel = "<=" if cond.get_op_type() == isl.ast_expr_op_type.le else "<"
        inner = indent + "  "
        where = f", each on its row of {self.names.get(row, row)}" if row else ""
        self.out(indent, "{")
        self.out(inner, f"int64_t {name} = {init};")
        self.out(inner, f"for (; {name} + {width - 1} {rel} {bound}; {name} += {width}) {{  "
                        f"// {width} values of {name} per pass{where}")
        for kid in sequence_nodes(node.for_get_body()):
            together = any(st.name in jammed for u in user_nodes(kid)
                           for st, _ in user_statements(u, self.by_name))
            for values in ([range(width)] if together else [(q,) for q in range(width)]):
                self.block_copies = (name, row, tuple(values))
                self.walk(kid, inner + "  ", iters, atomic)
                self.block_copies = None
        self.out(inner, "}")
        self.out(inner, f"for (; {name} {rel} {bound}; {name}++) {{")
        self.walk(node.for_get_body(), inner + "  ", iters, atomic)
        self.out(inner, "}")
        self.out(indent, "}")

    def row_buffer_allocation(self, v: str, per_thread: bool = False) -> str:
        """The declaration of row buffer ``v`` (``schedule.fusion``), on the heap: a
        buffer holds a few rows of a whole image row, too much for a thread's stack.
        ``per_thread``: allocated once per thread for the iterations it runs."""
        t = self.rows[v]
        c_type = t.type.dtype.c_type
        size = " * ".join(f"({self.printer.expr(e, self.names)})" for e in t.type.shape)
        owner = "one per thread, reused by the iterations it runs" if per_thread \
            else "one per iteration"
        return (f"{c_type} *restrict {self.names[v]} = malloc(sizeof({c_type}) * "
                f"(size_t)({size}));  // {t.holds}; {owner}")

    # ---- whole file ----------------------------------------------------
    def func_source(self, f: ir.FuncDef) -> list[str]:
        p = self.printer
        names = {n: cname(n) for n, _ in f.params + f.locals}
        params = ", ".join(f"{dt.c_type} {cname(n)}" for n, dt in f.params) or "void"
        lines = [f"/* @pa.func {f.name} ({f.filename}:{f.line}) */",
                 f"{self.dialect.function_qualifier} {f.result.c_type} {self.func_names[f.name]}({params})", "{"]
        for n, dt in f.locals:
            lines.append(f"  {dt.c_type} {cname(n)};")

        def body(stmts, indent):
            for s in stmts:
                if isinstance(s, ir.FAssign):
                    lines.append(f"{indent}{cname(s.name)} = {p.expr(s.expr, names)};  // line {s.line}")
                elif isinstance(s, ir.FReturn):
                    lines.append(f"{indent}return {p.expr(s.expr, names)};  // line {s.line}")
                elif isinstance(s, ir.FIf):
                    lines.append(f"{indent}if ({p.expr(s.cond, names)}) {{")
                    body(s.then, indent + "  ")
                    if s.orelse:
                        lines.append(f"{indent}}} else {{")
                        body(s.orelse, indent + "  ")
                    lines.append(f"{indent}}}")

        body(f.body, "  ")
        lines.append("}")
        return lines

    def source(self) -> str:
        k = self.k
        sig = signature(k, self.dialect)
        funcs = []
        for f in k.funcs:
            funcs += self.func_source(f) + [""]
        used = _used_scalars(k)
        for n, dt in k.locals:
            if n in used:
                self.out("  ", f"{dt.c_type} {self.names[n]} = 0;")
        for v in self.rows:  # for the statements outside every loop that has its own
            self.out("  ", self.row_buffer_allocation(v))
        self.walk(self.sk.ast, "  ", {}, frozenset())
        self.fence_streaming_stores("  ")
        for v in self.rows:
            self.out("  ", f"free({self.names[v]});")
        if k.result is not None:
            self.out("  ", f"*{cname(k.result[0])}_out = {self.names[k.result[0]]};")
        head = [f"/* Generated by polyad {POLYAD_VERSION} from kernel '{k.name}' "
                f"({k.filename}:{k.line}). */",
                "/* C signature: DSL parameters in order (arrays as row-major pointers), then "
                "the sizes, then temporaries, then the result pointer. */",
                "#include <math.h>", "#include <stdint.h>"]
        if self.rows:
            head.append("#include <stdlib.h>")
        head.append("")
        helpers = list(self.printer.helpers.values())
        if self.uses_ast_helpers:
            helpers.append(AST_HELPERS)
        if helpers:
            head += helpers + [""]
        if self.sk.large_sizes:
            large = " && ".join(f"{self.names[size]} >= {bound}"
                                for size, bound in self.sk.large_sizes)
            head += ["/* 1 where a size is below its bound: the loops below run as one nest per "
                     "band, for large sizes separated per piece (pa.explain) */",
                     f"#define {SMALL_SIZES} (!({large}))", ""]
        units = [line for unit in self.units for line in unit + [""]]
        return "\n".join(head + funcs + units + [sig.declaration(), "{"] + self.lines
                         + ["}", ""])


def _fresh(base: str, taken: set) -> str:
    """``base``, with underscores in front until no name in ``taken`` has it; taken too."""
    name = base
    while name in taken:
        name = "_" + name
    taken.add(name)
    return name


def _index_part(i: ir.Expr) -> Optional[str]:
    """A piece of a local's name for an index: ``0``, ``m1``, ``v``, ``co1`` (``co + 1``)."""
    if isinstance(i, ir.Const):
        return str(i.value).replace("-", "m")
    if isinstance(i, ir.LoopVar) and i.name.isidentifier():
        return i.name
    if (isinstance(i, ir.Binary) and i.op == "+" and isinstance(i.a, ir.LoopVar)
            and i.a.name.isidentifier() and isinstance(i.b, ir.Const) and i.b.value > 0):
        return f"{i.a.name}{i.b.value}"
    return None


def _outer_loop_count(node: isl.AstNode) -> int:
    """The number of loops of the AST ``node`` that no loop encloses."""
    if node.get_type() == isl.ast_node_type.for_:
        return 1
    return sum(_outer_loop_count(kid) for kid in ast_children(node))


def _unconditional_loads(e: ir.Expr) -> list:
    """The reads of ``e`` that every evaluation makes: none under a selection's branches
    or the right operand of ``and`` / ``or``."""
    if isinstance(e, ir.Select):
        return _unconditional_loads(e.cond)
    if isinstance(e, ir.Binary) and e.op in ("and", "or"):
        return _unconditional_loads(e.a)
    found = [e] if isinstance(e, Load) else []
    for kid in e.children():
        found += _unconditional_loads(kid)
    return found


def _invariant(read: Load, iterator: str) -> bool:
    """Whether ``read``'s index is the same at every iteration of the loop over
    ``iterator``: sizes, constants and other loops' iterators only (an opaque AST
    expression, a ``LoopVar`` named by its C text, must not mention ``iterator``)."""
    for e in ir.walk_many(read.index):
        if isinstance(e, (ir.ScalarRef, Load)):
            return False
        if isinstance(e, ir.LoopVar) and (
                e.name == iterator or re.search(rf"\b{re.escape(iterator)}\b", e.name)):
            return False
    return True


def _subst(e: ir.Expr, values: dict) -> ir.Expr:
    return ir.fold_integer_constants(ir.substitute(e, values))


def _used_scalars(k: ir.Kernel) -> set:
    """Locals some statement still reads or writes (transformations may drop others)."""
    used = {k.result[0]} if k.result is not None else set()
    for st in k.statements:
        used |= st.scalar_reads()
        if isinstance(st.target, ir.ScalarRef):
            used.add(st.target.name)
    return used


def emit_c(plan, dialect: Dialect = C99) -> str:
    """The C source of a target's plan of a scheduled kernel.

    ``plan`` has ``scheduled`` (the ScheduledKernel), ``names`` (DSL name ->
    C name) and ``loop(for_node)`` -> an entry with ``iterator``, ``threads``,
    ``atomic`` (statement names) and ``pragma(names, size_text)``.
    """
    return _Emitter(plan, dialect, outline=True).source()
