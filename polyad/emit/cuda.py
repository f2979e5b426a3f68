"""CUDA C emitter: __global__ kernels and a host launcher, printed from a CUDA plan.

The plan (``polyad.target.cuda``) chose the grid bands and how carried
dependences are honoured; this module prints it:

- a band becomes one ``__global__`` kernel whose band loops are grid-stride
  loops (``for (i = lo + global thread index; i <= hi; i += threads in grid)``)
  and one launch, the grid sized on the host from the loops' extents (at most
  65535 blocks per dimension; grid-stride loops cover the rest); a distributed
  loop (the plan's ``launches``) becomes one such kernel per part of its body,
  launched in the body's order, the loop of a part that is one (under an ``if``
  without ``else``: its condition guards the kernel's body) a further grid axis;
- scalar reductions: a per-thread partial and ``pa_reduce_add`` (or
  ``pa_reduce_store`` + ``pa_sum_partials`` for deterministic plans);
  privatized arrays: ``pa_privatize_begin/end`` around the band, updates with
  ``atomicAdd`` on the block's copy, or (the plan's ``lanes``) a per-thread
  register array and one ``pa_reduce_add`` per element after the band;
  atomic statements: ``atomicAdd``;
- code outside every band: one-thread kernels; host loops and conditions
  around bands stay on the host;
- scalar locals live in a device struct (``pa_s``); in a band kernel each
  thread keeps its own copy of the scalars it writes.

The host launcher has the C signature of the OpenMP function (same parameter
order and types), but its array and temporary pointers are *device* pointers;
the result pointer is a host pointer. Errors are recorded, never fatal:
``pa_last_error()`` returns the first CUDA error of the calling thread.
The text compiles with nvcc, and with a C++ compiler against the simulator
header (``polyad_cuda_sim.h``, target ``cuda-sim``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

import islpy as isl

from .. import ir
from ..ir import Load
from ..schedule.nests import ast_children, sequence_nodes, skip_marks, statement_names
from .c_openmp import POLYAD_VERSION, _Emitter, _used_scalars, cname, signature
from .cexpr import Dialect

# Threads assumed along a grid dimension whose extent the host cannot compute
# (bounds that depend on another grid loop): grid-stride loops cover the rest.
UNKNOWN_EXTENT = 1024


# pa_bit_get/pa_bit_set (see cexpr.C_BIT_HELPERS) on the device: atomicOr on the word.
CUDA_BIT_HELPERS = """\
static __device__ inline int pa_bit_get(const uint32_t *words, int64_t i) { return (words[i >> 5] >> (i & 31)) & 1u; }
static __device__ inline void pa_bit_set(uint32_t *words, int64_t i, int value)
{
  if (value)
    atomicOr(&words[i >> 5], 1u << (i & 31));
}"""


@dataclass(frozen=True)
class CudaDialect(Dialect):
    """CUDA C++: ``__restrict__``, host-and-device helpers, ``atomicAdd`` updates,
    ``atomicOr`` into packed ``bit`` arrays."""

    def atomic_update(self, target: str, op: str, value: str) -> list[str]:
        if op not in ("+=", "-="):
            raise ValueError(f"no CUDA atomic for {op!r}")
        return [f"atomicAdd(&{target}, {value if op == '+=' else f'-({value})'});"]


CUDA = CudaDialect(name="cuda", restrict="__restrict__",
                   function_qualifier="static __host__ __device__ inline",
                   bit_helpers=CUDA_BIT_HELPERS)


def _element_accesses(lines: list, array: str) -> Optional[list]:
    """The index texts of every ``array[...]`` in ``lines``; None if ``array`` also appears
    otherwise (its address taken, passed whole)."""
    found = []
    for line in lines:
        code = line.split("  // ", 1)[0]
        for m in re.finditer(rf"(&?)(?<![\w.>]){re.escape(array)}\b(\[?)", code):
            if m.group(1) or not m.group(2):
                return None
            depth, j = 1, m.end()
            while depth and j < len(code):
                depth += {"[": 1, "]": -1}.get(code[j], 0)
                j += 1
            found.append(code[m.end():j - 1])
    return found


def _own_elements(lines: list, indent: str, arrays: list, constant: set, c_types: dict) -> list:
    """Keep each thread's own element of ``arrays`` in a register for one iteration of the
    innermost grid loop (``lines``: its body, at ``indent``).

    An array qualifies when the body writes it in two statements or more and every access
    in the body is to one element, ``A[e]`` with the same index text ``e`` whose names are all ``constant`` in the iteration (grid iterators,
    sizes, host iterators, unwritten scalars) or helper calls. The band is parallel and
    ``A``'s updates are not atomic, so no other thread touches ``A[e]`` while this iteration
    runs: it is loaded once (unless the body starts by assigning it), updated in a
    register and stored once. nvcc does not do this itself: it stores after every guarded
    update (six stores per element in the TV gradient).
    """
    for a in arrays:
        accesses = _element_accesses(lines, a)
        if not accesses or len(set(accesses)) != 1:
            continue
        index = accesses[0]
        names = {m.group(1) for m in re.finditer(r"\b([A-Za-z_]\w*)\b(?!\s*\()", index)}
        if not names <= constant:
            continue
        element, local = f"{a}[{index}]", f"{a}_here"
        pattern = re.compile(rf"(?<![\w.>]){re.escape(element)}")
        target = re.compile(rf"\s*{re.escape(element)} [-+*/]?= ")
        if sum(bool(target.match(line)) for line in lines) < 2:
            continue  # written once: the store happens once anyway
        first = next(line for line in lines if pattern.search(line.split("  // ", 1)[0]))
        head = indent + element + " = "
        assigned_first = (first.startswith(head)
                          and not pattern.search(first[len(head):].split("  // ", 1)[0]))
        declaration = (f"{indent}{c_types[a]} {local};  // this thread's {element}, "
                       f"stored once below" if assigned_first else
                       f"{indent}{c_types[a]} {local} = {element};  // this thread's "
                       f"{element}, stored once below")
        lines = ([declaration] + [_replace_in_code(line, pattern, local) for line in lines]
                 + [f"{indent}{element} = {local};"])
    return lines


def _replace_in_code(line: str, pattern, text: str) -> str:
    """``line`` with ``pattern`` replaced by ``text`` before its ``//`` comment (the comment
    quotes the DSL source, which stays as written)."""
    code, sep, comment = line.partition("  // ")
    return pattern.sub(text, code) + sep + comment


def _device_decl(decl: str) -> str:
    return re.sub(r"\brestrict\b", "__restrict__", decl)


class _CudaEmitter(_Emitter):
    def __init__(self, plan):
        super().__init__(plan, CUDA)
        self.deterministic = plan.deterministic
        self.sig = signature(self.k, CUDA)
        self.used = _used_scalars(self.k)
        self.local_types = {n: dt for n, dt in self.k.locals if n in self.used}
        self.struct = f"pa_locals_{self.sig.name}" if self.local_types else None
        self.host_names = dict(plan.names)
        for n in self.local_types:
            self.host_names[n] = f"pa_s->{cname(n)}"
        self.names = self.host_names
        self.device_code: list[str] = []
        self.launch_count = 0

    def _contains_grid(self, node) -> bool:
        lp = self.plan.loop(node)
        if lp is not None and lp.threads:
            return True
        return any(self._contains_grid(c) for c in ast_children(node))

    def _bounds(self, node, iters):
        init = self.ast_c(node.for_get_init(), iters, loop_bound=True)
        cond = self.ast_c(node.for_get_cond(), iters, loop_bound=True)
        inc = self.ast_c(node.for_get_inc(), iters)
        if cond.startswith("(") and cond.endswith(")"):
            cond = cond[1:-1]
        return init, cond, inc

    # ---- kernels ---------------------------------------------------------
    def _params(self, host_iters: dict) -> tuple[list[str], list[str]]:
        """(declarations, argument names) every kernel of this launcher takes."""
        decls, args = [], []
        for p in self.sig.params:
            if p.kind != "result":
                decls.append(p.declaration(self.sig.restrict))
                args.append(p.c_name)
        if self.struct:
            decls.append(f"{self.struct} *__restrict__ pa_s")
            args.append("pa_s")
        for c in host_iters.values():
            decls.append(f"int64_t {c}")
            args.append(c)
        return decls, args

    def _kernel_name(self, kind: str) -> str:
        name = f"{self.sig.name}_{kind}{self.launch_count}"
        self.launch_count += 1
        return name

    def serial_kernel(self, nodes: list, indent: str, host_iters: dict):
        """Code outside every grid band: one thread runs it, in program order."""
        name = self._kernel_name("s")
        decls, args = self._params(host_iters)
        saved, self.lines, self.names = self.lines, [], self.host_names
        for node in nodes:
            self.walk(node, "  ", host_iters, frozenset())
        body, self.lines = self.lines, saved
        names = [n for node in nodes for n in statement_names(node)]
        self.device_code += ([f"/* statements {', '.join(names)}: not in "
                              f"a parallel loop, one thread */",
                              f"__global__ void {name}({', '.join(decls)})", "{"]
                             + body + ["}", ""])
        self.out(indent, f"PA_LAUNCH({name}, dim3(1), dim3(1), 0, {', '.join(args)});")

    def grid_kernel(self, node, indent: str, host_iters: dict, head=None):
        """A grid band: one __global__ kernel with grid-stride loops, and its launch.

        ``head``: one launch of the distributed loop ``node`` (its plan's ``launches``): the
        launch runs the ``head.parts`` of the loop's body, with the loops of a part that
        is a loop (under an ``if`` without ``else``, whose condition then guards the body)
        as the band's further axes."""
        head = head or self.plan.loop(node)
        band, guard = [node], None
        if head.parts:
            chosen = [sequence_nodes(node.for_get_body())[p] for p in head.parts]
            if len(head.band) > 1:
                inner = skip_marks(chosen[0])
                if inner.get_type() == isl.ast_node_type.if_:
                    guard = inner.if_get_cond()
                    inner = skip_marks(inner.if_get_then_node())
                band.append(inner)
        while len(band) < len(head.band):
            band.append(skip_marks(band[-1].for_get_body()))
        body = ([band[-1].for_get_body()] if len(band) > 1 or not head.parts else chosen)
        name = self._kernel_name("k")
        k = self.k
        reductions = head.reductions
        lanes = {a: n for a, n in head.privatized.items() if a in head.lanes}
        privatized = {a: n for a, n in head.privatized.items() if a not in head.lanes}
        stmts = [n for b in body for n in statement_names(b)]
        by_name = {n: self.sk.statement(n) for n in stmts}
        atomic = set(head.atomic) | {n for n, st in by_name.items()
                                     if isinstance(st.target, Load)
                                     and st.target.array in privatized}
        written = set()
        for st in by_name.values():
            if isinstance(st.target, ir.ScalarRef):
                written.add(st.target.name)

        # Names inside the kernel: a thread's own copy of the scalars it writes.
        names = dict(self.host_names)
        for v in written:
            names[v] = cname(v)
        decls, args = self._params(host_iters)
        if privatized:
            decls.append("int64_t pa_smem_bytes")
            args.append("pa_smem")
        partials = {v: f"pa_partials_{cname(v)}" for v in reductions} if head.two_pass else {}
        for v, pname in partials.items():
            decls.append(f"{k.scalar_dtype(v).c_type} *__restrict__ {pname}")
            args.append(pname)

        saved, self.lines, self.names = self.lines, [], names
        saved_arrays = self.printer.array_names
        self.printer.array_names = {**saved_arrays,
                                    **{a: f"{cname(a)}_block" for a in privatized},
                                    **{a: f"{cname(a)}_lane" for a in lanes}}
        prologue = []
        for v in sorted(written):
            dt = k.scalar_dtype(v)
            if v in reductions:
                init = "1" if reductions[v] == "*" else "0"
                prologue.append(f"  {dt.c_type} {cname(v)} = {init};  // this thread's partial "
                                f"{'product' if init == '1' else 'sum'} of {v}")
            else:
                prologue.append(f"  {dt.c_type} {cname(v)} = pa_s->{cname(v)};  "
                                f"// this thread's copy")
        for a, n in sorted(lanes.items()):
            dt = k.array_type(a).dtype
            prologue.append(f"  {dt.c_type} {cname(a)}_lane[{ir.eval_integer(n, {})}] = {{}};  "
                            f"// this thread's partial sums of {a} (registers)")
        smem_terms = []
        for a, n in sorted(privatized.items()):
            dt = k.array_type(a).dtype
            size = self.printer.expr(n, self.host_names)
            offset = " + ".join(smem_terms) or "0"
            prologue.append(f"  {dt.c_type} *{cname(a)}_block = pa_privatize_begin({cname(a)}, "
                            f"{size}, {offset}, pa_smem_bytes);  // this block's copy of {a}")
            smem_terms.append(f"pa_align16(({size}) * (int64_t)sizeof({dt.c_type}))")

        # The grid-stride loops, outermost first.
        iters = dict(host_iters)
        indent_k = "  "
        extents = []
        band_names = []
        axes = []
        for b in band:
            lp = self.plan.loop(b)
            it = b.for_get_iterator().get_id().get_name()
            iters = {**iters, it: lp.iterator}
            init, cond, inc = self._bounds(b, iters)
            scale = "" if inc == "1" else f" * {inc}"
            ax = head.axis if b is node else lp.axis
            axes.append(ax)
            self.out(indent_k, f"for (int64_t {lp.iterator} = {init} + (int64_t)(blockIdx.{ax} * "
                               f"blockDim.{ax} + threadIdx.{ax}){scale}; {cond}; "
                               f"{lp.iterator} += (int64_t)blockDim.{ax} * gridDim.{ax}{scale}) {{")
            indent_k += "  "
            extents.append((ax, self._extent(b, iters, band_names, init, inc)))
            band_names.append(lp.iterator)
        if guard is not None:
            self.out(indent_k, f"if ({self.ast_c(guard, iters)}) {{")
            indent_k += "  "
        start = len(self.lines)
        for b in body:
            self.walk(b, indent_k, iters, frozenset(atomic))
        own = {st.target.array for st in by_name.values()
               if isinstance(st.target, Load) and st.name not in atomic
               and st.target.array not in privatized and st.target.array not in lanes}
        constant = ({cname(s) for s in k.sizes} | set(host_iters.values()) | set(band_names)
                    | {cname(p.name) for p in k.params if not p.is_array} - set(written))
        self.lines[start:] = _own_elements(self.lines[start:], indent_k, sorted(own), constant,
                                           {a: k.array_type(a).dtype.c_type for a in own})
        for depth in range(len(band) + (guard is not None), 0, -1):
            self.out("  " * depth, "}")
        epilogue = []
        for a, n in sorted(privatized.items()):
            size = self.printer.expr(n, self.host_names)
            epilogue.append(f"  pa_privatize_end({cname(a)}, {cname(a)}_block, {size});")
        for a, n in sorted(lanes.items()):
            for e in range(ir.eval_integer(n, {})):
                epilogue.append(f"  pa_reduce_add(&{cname(a)}[{e}], {cname(a)}_lane[{e}]);")
        for v, op in sorted(reductions.items()):
            if head.two_pass:
                epilogue.append(f"  pa_reduce_store({partials[v]}, {cname(v)});")
            else:
                fn = "pa_reduce_mul" if op == "*" else "pa_reduce_add"
                epilogue.append(f"  {fn}(&pa_s->{cname(v)}, {cname(v)});")
        body, self.lines = self.lines, saved
        self.names = self.host_names
        self.printer.array_names = saved_arrays
        where = ""
        if head.parts:
            numbers = ", ".join(str(p + 1) for p in head.parts)
            where = (f"; part{'s' if len(head.parts) > 1 else ''} {numbers} of the body of the "
                     f"loop over {self.plan.loop(node).iterator}")
        self.device_code += ([f"/* {head.decision()}{where} */",
                              f"__global__ void {name}({', '.join(decls)})", "{"]
                             + prologue + body + epilogue + ["}", ""])

        # Host side: grid size, shared memory, deterministic partial buffers.
        threads = dict(zip("xyz", head.block))
        grid = dict((ax, f"pa_blocks({ext}, {threads[ax]})") for ax, ext in extents)
        grid_text = ", ".join(grid[ax] for ax in "xyz"[:len(band)])
        block_text = ", ".join(str(threads[ax]) for ax in "xyz"[:len(band)])
        loops = ", ".join(f"{self.plan.loop(b).iterator} -> {ax}" for b, ax in zip(band, axes))
        self.out(indent, "{")
        inner = indent + "  "
        self.out(inner, f"dim3 pa_grid({grid_text});  // {loops}")
        if privatized:
            self.out(inner, f"int64_t pa_smem = {' + '.join(smem_terms)};")
            self.out(inner, "if (pa_smem > PA_SHARED_LIMIT)")
            self.out(inner, "  pa_smem = 0;  // too large for shared memory: global atomics")
        blocks = "(int64_t)pa_grid.x * pa_grid.y * pa_grid.z"
        for v, pname in partials.items():
            ct = k.scalar_dtype(v).c_type
            self.out(inner, f"{ct} *{pname} = ({ct} *)pa_device_alloc({blocks} * "
                            f"(int64_t)sizeof({ct}));")
            self.out(inner, f"if ({pname})")
            self.out(inner, f"  pa_device_zero({pname}, {blocks} * (int64_t)sizeof({ct}));")
        smem = "pa_smem" if privatized else "0"
        self.out(inner, f"PA_LAUNCH({name}, pa_grid, dim3({block_text}), {smem}, "
                        f"{', '.join(args)});")
        for v, pname in partials.items():
            self.out(inner, f"if ({pname})")
            self.out(inner, f"  pa_sum_partials(&pa_s->{cname(v)}, {pname}, {blocks});")
            self.out(inner, f"pa_device_free({pname});")
        self.out(indent, "}")

    def _extent(self, node, iters, outer_band: list, init: str, inc: str) -> str:
        """Host C text of the loop's iteration count (an estimate when it is not host-known)."""
        cond = node.for_get_cond()
        T = isl.ast_expr_op_type
        it = node.for_get_iterator().get_id().get_name()
        if cond.get_type() != isl.ast_expr_type.op or cond.get_op_type() not in (T.le, T.lt):
            return str(UNKNOWN_EXTENT)
        lhs = cond.get_op_arg(0)
        if lhs.get_type() != isl.ast_expr_type.id or lhs.get_id().get_name() != it:
            return str(UNKNOWN_EXTENT)
        ub = self.ast_c(cond.get_op_arg(1), iters, loop_bound=True)
        text = f"{ub} {init}"
        if any(re.search(rf"\b{re.escape(b)}\b", text) for b in outer_band):
            return str(UNKNOWN_EXTENT)
        last = f"({ub})" if cond.get_op_type() == T.le else f"({ub}) - 1"
        count = f"{last} - ({init})"
        return f"({count}) / {inc} + 1" if inc != "1" else f"{count} + 1"

    # ---- host side ---------------------------------------------------------
    def host(self, nodes: list, indent: str, iters: dict):
        """Host code for a sequence of AST nodes: launches and host control flow."""
        serial: list = []
        for node in nodes:
            if not self._contains_grid(node):
                serial.append(node)
                continue
            if serial:
                self.serial_kernel(serial, indent, iters)
                serial = []
            t = node.get_type()
            lp = self.plan.loop(node)
            if lp is not None and lp.threads:
                for head in lp.launches or (None,):
                    self.grid_kernel(node, indent, iters, head)
            elif t == isl.ast_node_type.block:
                self.host(sequence_nodes(node), indent, iters)
            elif t == isl.ast_node_type.mark:
                self.host([node.mark_get_node()], indent, iters)
            elif t == isl.ast_node_type.for_:
                it = node.for_get_iterator().get_id().get_name()
                inner = {**iters, it: lp.iterator}
                init, cond, inc = self._bounds(node, inner)
                step = f"{lp.iterator} += {inc}" if inc != "1" else f"{lp.iterator}++"
                self.out(indent, f"for (int64_t {lp.iterator} = {init}; {cond}; {step}) {{")
                self.host([node.for_get_body()], indent + "  ", inner)
                self.out(indent, "}")
            elif t == isl.ast_node_type.if_:
                self.out(indent, f"if ({self.ast_c(node.if_get_cond(), iters)}) {{")
                self.host([node.if_get_then_node()], indent + "  ", iters)
                if node.if_has_else_node():
                    self.out(indent, "} else {")
                    self.host([node.if_get_else_node()], indent + "  ", iters)
                self.out(indent, "}")
            else:
                raise NotImplementedError(f"ISL AST node {t} on the host")
        if serial:
            self.serial_kernel(serial, indent, iters)

    def source(self) -> str:
        k, sig = self.k, self.sig
        self.out("  ", "pa_clear_error();")
        if self.struct:
            self.out("  ", f"{self.struct} *pa_s = ({self.struct} *)pa_device_alloc("
                           f"sizeof({self.struct}));")
            self.out("  ", "if (!pa_s)")
            self.out("  ", "  return;")
            self.out("  ", f"pa_device_zero(pa_s, sizeof({self.struct}));")
        self.host([self.sk.ast], "  ", {})
        self.out("  ", "pa_synchronize();")
        if k.result is not None:
            r, dt = k.result
            local = self.local_types[r].c_type  # may differ from the result type
            self.out("  ", f"{local} pa_result = 0;")
            self.out("  ", f"pa_copy_to_host(&pa_result, &pa_s->{cname(r)}, sizeof({local}));")
            self.out("  ", f"*{cname(r)}_out = ({dt.c_type})pa_result;")
        if self.struct:
            self.out("  ", "pa_device_free(pa_s);")

        funcs = []
        for f in k.funcs:
            funcs += self.func_source(f) + [""]
        head = [f"/* Generated by polyad {POLYAD_VERSION} (CUDA) from kernel '{k.name}' "
                f"({k.filename}:{k.line}). */",
                "/* Host launcher: the OpenMP function's parameters (DSL parameters in order, "
                "then the sizes, then temporaries, then the result pointer); arrays and "
                "temporaries are DEVICE pointers, the result pointer a host pointer. "
                "Errors: pa_last_error(). */",
                '#include "polyad_cuda.h"', ""]
        # pa_imin, pa_imax, pa_ifloord and pa_ifmod (ISL's min/max/floor/modulo) are in
        # polyad_cuda.h.
        helpers = list(self.printer.helpers.values())
        if helpers:
            head += helpers + [""]
        struct = []
        if self.struct:
            struct = ["/* the kernel's scalars, in device memory */", f"struct {self.struct} {{"]
            struct += [f"  {dt.c_type} {cname(n)};" for n, dt in self.local_types.items()]
            struct += ["};", ""]
        launcher = [f'extern "C" {sig.declaration()}', "{"] + self.lines + ["}", ""]
        return "\n".join(head + struct + funcs + self.device_code + launcher)


def emit_cuda(plan) -> str:
    """The CUDA C source of a CUDA plan (``polyad.target.cuda.CudaPlan``) of a scheduled kernel.

    ``plan`` has ``scheduled``, ``names``, ``deterministic`` and ``loop(for_node)``
    -> an entry with ``iterator``, ``threads``, ``axis``, ``band``, ``block``,
    ``reductions``, ``privatized``, ``atomic``, ``two_pass`` and ``decision()``.
    """
    return _CudaEmitter(plan).source()
