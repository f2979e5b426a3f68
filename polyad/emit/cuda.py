"""CUDA C emitter: __global__ kernels and a host launcher for a scheduled kernel.

Mapping (recorded in ``CudaPlan``, which ``pa.explain`` prints):

- The outermost parallel loop and the parallel loops perfectly nested in it
  (at most 3) go to the grid: the innermost of them to ``x`` (unit stride,
  coalesced), blocks of 256 threads (256, 32x8 or 32x4x2), *grid-stride*
  loops so any grid size is correct; the host sizes the grid from the loop
  extents (at most 65535 blocks per dimension). Loops inside run sequentially
  per thread.
- Scalar reductions carried by the grid loops: a per-thread partial, combined
  per block by ``pa_reduce_add`` (warp shuffles, shared memory, one
  ``atomicAdd`` per block); with ``deterministic=True`` the block sums go to a
  buffer that a second pass adds in a fixed order.
- Small scatter targets (a filter gradient): a block-private copy in shared
  memory (``pa_privatize_begin/end``), shared-memory ``atomicAdd`` per update,
  one global ``atomicAdd`` per element and block; other scatters: global
  ``atomicAdd``. Gathers need nothing.
- Code outside any grid loop runs in one-thread kernels (sequential loops with
  a grid loop inside run on the host and launch per iteration).
- Scalar locals live in a device struct (``pa_s``); inside a grid kernel a
  thread keeps its own copy of the scalars it writes.

The host launcher has the C signature of the OpenMP function (same parameter
order and types), but its array and temporary pointers are *device* pointers;
the result pointer is a host pointer. Errors are recorded, never fatal:
``pa_last_error()`` returns the first CUDA error of the calling thread.
The text compiles with nvcc, and with g++ against the simulator header
(``polyad_cuda_sim.h``) for ``target="cuda-sim"``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

import islpy as isl

from .. import ir
from ..ir import Load
from ..schedule import ScheduledKernel
from ..schedule.build import ast_children, loop_info
from .c_openmp import POLYAD_VERSION, _Emitter, _flat_block, _used_scalars, cname, signature
from .cexpr import AST_HELPERS

BLOCK_SHAPES = {1: (256, 1, 1), 2: (32, 8, 1), 3: (32, 4, 2)}
# Threads assumed along a grid dimension whose extent the host cannot compute
# (bounds that depend on another grid loop): grid-stride loops cover the rest.
UNKNOWN_EXTENT = 1024
DEFAULT_ARCH = "sm_80"


@dataclass
class Launch:
    """One kernel launch of the host launcher (an entry of the CUDA plan)."""

    name: str
    kind: str                      # "grid" or "serial"
    loops: tuple = ()              # grid loops, outermost first: (iterator, axis)
    block: tuple = (1, 1, 1)
    reductions: dict = field(default_factory=dict)   # scalar -> (op, "block reduce"|"two-pass")
    privatized: dict = field(default_factory=dict)   # array -> flat size (IR expression)
    atomic: tuple = ()             # statement names updated with global atomicAdd
    private: tuple = ()            # scalars each thread keeps its own copy of
    statements: tuple = ()
    why: str = ""


@dataclass
class CudaPlan:
    """How a scheduled kernel maps onto CUDA: the launches in host order."""

    launches: list
    deterministic: bool
    arch_note: str = (f"nvcc -arch=native when a GPU is present, else -arch={DEFAULT_ARCH} "
                      f"(double atomicAdd needs sm_60+)")

    def describe(self) -> list[str]:
        """One line per launch and decision, for ``pa.explain``."""
        out = [f"architecture: {self.arch_note}"]
        for ln in self.launches:
            if ln.kind == "serial":
                out.append(f"{ln.name}<<<1, 1>>>: {', '.join(ln.statements)} run in one "
                           f"thread ({ln.why})")
                continue
            axes = ", ".join(f"{it} -> {ax}" for it, ax in ln.loops)
            out.append(f"{ln.name}<<<grid, {'x'.join(map(str, ln.block[:len(ln.loops)]))}>>>: "
                       f"grid-stride loops {axes}")
            for var, (op, how) in sorted(ln.reductions.items()):
                out.append(f"  scalar {var!r} ({op}=): per-thread partial, {how}")
            for arr, n in sorted(ln.privatized.items()):
                out.append(f"  {arr!r} ({ir.expr_str(n)} elements): block-private copy in shared "
                           f"memory, one atomicAdd per element and block (global atomics "
                           f"when it exceeds 48 KiB)")
            if ln.atomic:
                out.append(f"  global atomicAdd: {', '.join(ln.atomic)}")
            if ln.private:
                out.append(f"  per-thread scalars: {', '.join(ln.private)}")
            if ln.why:
                out.append(f"  {ln.why}")
        return out


def _loop_key(node: isl.AstNode) -> Optional[str]:
    if node.get_type() != isl.ast_node_type.for_:
        return None
    try:
        return node.get_annotation().get_name()
    except isl.Error:
        return None


def _device_decl(decl: str) -> str:
    return re.sub(r"\brestrict\b", "__restrict__", decl)


class _CudaEmitter(_Emitter):
    def __init__(self, sk: ScheduledKernel, deterministic: bool):
        super().__init__(sk)
        self.deterministic = deterministic
        self.sig = signature(self.k)
        self.used = _used_scalars(self.k)
        self.local_types = {n: dt for n, dt in self.k.locals if n in self.used}
        self.struct = f"pa_locals_{self.sig.name}" if self.local_types else None
        self.host_names = dict(self.names)
        for n in self.local_types:
            self.host_names[n] = f"pa_s->{cname(n)}"
        self.device_code: list[str] = []
        self.launches: list[Launch] = []
        self.grid_bands: dict[str, list] = {}
        self._choose_grid(sk.ast, [])

    # ---- which loops go to the grid ----------------------------------------
    def _eligible(self, info) -> bool:
        if info is None or not info.parallel:
            return False
        if not self.deterministic:
            return True
        k = self.k
        if info.atomic or any(k.array_type(a).dtype.is_float for a in info.privatized):
            return False  # no fixed-order form for scatters: leave it sequential
        return all(op == "+" or not k.scalar_dtype(v).is_float
                   for v, op in info.reductions.items())

    def _band(self, node) -> list:
        band = [node]
        while len(band) < 3:
            body = band[-1].for_get_body()
            while body.get_type() == isl.ast_node_type.mark:
                body = body.mark_get_node()
            if body.get_type() != isl.ast_node_type.for_ or not self._eligible(
                    loop_info(body, self.sk.loops)):
                break
            band.append(body)
        return band

    def _clean_inside(self, node) -> bool:
        """Is there an eligible loop below without atomics and with many iterations?"""
        for c in ast_children(node):
            info = loop_info(c, self.sk.loops)
            if self._eligible(info) and not info.atomic and not info.small:
                return True
            if self._clean_inside(c):
                return True
        return False

    def _choose_grid(self, node, path: list):
        info = loop_info(node, self.sk.loops)
        if self._eligible(info):
            band = self._band(node)
            infos = [loop_info(b, self.sk.loops) for b in band]
            all_small = all(i.small for i in infos)
            atomics = any(i.atomic for i in infos)
            if not ((all_small or atomics) and self._clean_inside(band[-1])):
                self.grid_bands[_loop_key(node)] = band
                return
        for c in ast_children(node):
            self._choose_grid(c, path)

    def _contains_grid(self, node) -> bool:
        if _loop_key(node) in self.grid_bands:
            return True
        return any(self._contains_grid(c) for c in ast_children(node))

    # ---- device statements ---------------------------------------------------
    def statement(self, st: ir.Statement, indent: str, atomic: bool):
        if not atomic:
            return super().statement(st, indent, False)
        p = self.printer
        value = p.expr(st.expr, self.names, 8 if st.op == "-=" else 0)
        value = f"-{value}" if st.op == "-=" else value
        dt = self.k.array_type(st.target.array).dtype
        fn = "pa_atomic_add" if dt == ir.i64 else "atomicAdd"
        body = f"{fn}(&{self.target_text(st)}, {value});"
        if st.guard is not None:
            self.out(indent, f"if ({p.expr(st.guard, self.names)}) {{")
            self.out(indent + "  ", body + self.comment(st))
            self.out(indent, "}")
        else:
            self.out(indent, body + self.comment(st))

    def for_loop(self, node, indent, iters, atomic):
        it = node.for_get_iterator().get_id().get_name()
        name = self.iterator_name(node, it, iters)
        iters = {**iters, it: name}
        init, cond, inc = self._bounds(node, iters)
        step = f"{name} += {inc}" if inc != "1" else f"{name}++"
        self.out(indent, f"for (int64_t {name} = {init}; {cond}; {step}) {{")
        self.walk(node.for_get_body(), indent + "  ", iters, atomic)
        self.out(indent, "}")

    def _bounds(self, node, iters):
        init = self.ast_c(node.for_get_init(), iters)
        cond = self.ast_c(node.for_get_cond(), iters)
        inc = self.ast_c(node.for_get_inc(), iters)
        if cond.startswith("(") and cond.endswith(")"):
            cond = cond[1:-1]
        return init, cond, inc

    # ---- kernels ---------------------------------------------------------
    def _statement_names(self, nodes) -> list[str]:
        out = []

        def visit(n):
            if n.get_type() == isl.ast_node_type.user:
                out.append(n.user_get_expr().get_op_arg(0).get_id().get_name())
            for c in ast_children(n):
                visit(c)
        for n in nodes:
            visit(n)
        return out

    def _params(self, host_iters: dict) -> tuple[list[str], list[str]]:
        """(declarations, argument names) every kernel of this launcher takes."""
        decls, args = [], []
        for kind, name, decl in self.sig.params:
            if kind != "result":
                decls.append(_device_decl(decl))
                args.append(cname(name))
        if self.struct:
            decls.append(f"{self.struct} *__restrict__ pa_s")
            args.append("pa_s")
        for c in host_iters.values():
            decls.append(f"int64_t {c}")
            args.append(c)
        return decls, args

    def serial_kernel(self, nodes: list, indent: str, host_iters: dict):
        name = f"{self.sig.name}_s{len(self.launches)}"
        stmts = self._statement_names(nodes)
        self.launches.append(Launch(name, "serial", statements=tuple(stmts),
                                    why="not in a parallel loop"))
        decls, args = self._params(host_iters)
        saved, self.lines, self.names = self.lines, [], self.host_names
        for node in nodes:
            self.walk(node, "  ", host_iters, frozenset())
        body, self.lines = self.lines, saved
        self.device_code += [f"__global__ void {name}({', '.join(decls)})", "{"] + body + ["}", ""]
        self.out(indent, f"PA_LAUNCH({name}, dim3(1), dim3(1), 0, {', '.join(args)});")

    def grid_kernel(self, node, indent: str, host_iters: dict):
        band = self.grid_bands[_loop_key(node)]
        infos = [loop_info(b, self.sk.loops) for b in band]
        name = f"{self.sig.name}_k{len(self.launches)}"
        stmts = self._statement_names([node])
        k = self.k
        reductions = {}
        privatized, atomic = {}, set()
        for info in infos:
            reductions.update(info.reductions)
            privatized.update(info.privatized)
            atomic |= set(info.atomic)
        by_name = {n: self.sk.statement(n) for n in stmts}
        atomic |= {n for n, st in by_name.items()
                   if isinstance(st.target, Load) and st.target.array in privatized}
        touched = set()
        written = set()
        for st in by_name.values():
            touched |= st.scalar_reads()
            if isinstance(st.target, ir.ScalarRef):
                touched.add(st.target.name)
                written.add(st.target.name)
        two_pass = self.deterministic
        launch = Launch(name, "grid", block=BLOCK_SHAPES[len(band)], statements=tuple(stmts),
                        reductions={v: (op, "pairwise per block, then one global atomic per block"
                                        if not two_pass else
                                        "block sums stored, then added in a fixed order "
                                        "(deterministic=True)")
                                    for v, op in sorted(reductions.items())},
                        privatized=dict(sorted(privatized.items())),
                        atomic=tuple(sorted(atomic - {n for n, st in by_name.items()
                                                      if isinstance(st.target, Load)
                                                      and st.target.array in privatized})),
                        private=tuple(sorted(written - set(reductions))))
        self.launches.append(launch)

        # Names inside the kernel: a thread's own copy of the scalars it writes.
        names = dict(self.host_names)
        for v in written:
            names[v] = cname(v)
        for a in privatized:
            names[a] = f"{cname(a)}_block"
        decls, args = self._params(host_iters)
        if privatized:
            decls.append("int64_t pa_smem_bytes")
            args.append("pa_smem")
        partials = {v: f"pa_partials_{cname(v)}" for v in reductions} if two_pass else {}
        for v, pname in partials.items():
            decls.append(f"{k.scalar_dtype(v).c_type} *__restrict__ {pname}")
            args.append(pname)

        saved, self.lines, self.names = self.lines, [], names
        saved_arrays = self.printer.array_names
        self.printer.array_names = {**saved_arrays,
                                    **{a: f"{cname(a)}_block" for a in privatized}}
        head = []
        for v in sorted(written):
            dt = k.scalar_dtype(v)
            if v in reductions:
                init = "1" if reductions[v] == "*" else "0"
                head.append(f"  {dt.c_type} {cname(v)} = {init};  // this thread's partial "
                            f"{'product' if init == '1' else 'sum'} of {v}")
            else:
                head.append(f"  {dt.c_type} {cname(v)} = pa_s->{cname(v)};")
        offset = "0"
        smem_terms = []
        for a, n in sorted(privatized.items()):
            dt = k.array_type(a).dtype
            size = self.printer.expr(n, self.host_names)
            head.append(f"  {dt.c_type} *{cname(a)}_block = pa_privatize_begin({cname(a)}, "
                        f"{size}, {offset}, pa_smem_bytes);")
            term = f"pa_align16(({size}) * (int64_t)sizeof({dt.c_type}))"
            smem_terms.append(term)
            offset = " + ".join(smem_terms)

        # The grid-stride loops, outermost first; the innermost goes to x.
        axes = "xyz"[:len(band)][::-1]
        iters = dict(host_iters)
        indent_k = "  "
        extents = []
        loops = []
        band_names = []
        for b, axis in zip(band, axes):
            it = b.for_get_iterator().get_id().get_name()
            cname_it = self.iterator_name(b, it, iters)
            iters = {**iters, it: cname_it}
            band_names.append(cname_it)
            init, cond, inc = self._bounds(b, iters)
            scale = "" if inc == "1" else f" * {inc}"
            self.out(indent_k, f"for (int64_t {cname_it} = {init} + (int64_t)(blockIdx.{axis} * "
                               f"blockDim.{axis} + threadIdx.{axis}){scale}; {cond}; "
                               f"{cname_it} += (int64_t)blockDim.{axis} * gridDim.{axis}{scale}) {{")
            indent_k += "  "
            loops.append((cname_it, axis))
            extents.append(self._extent(b, iters, band_names[:-1], init, inc))
        launch.loops = tuple(loops)
        self.walk(band[-1].for_get_body(), indent_k, iters, frozenset(atomic))
        for depth in range(len(band), 0, -1):
            self.out("  " * depth, "}")
        tail = []
        for a, n in sorted(privatized.items()):
            size = self.printer.expr(n, self.host_names)
            tail.append(f"  pa_privatize_end({cname(a)}, {cname(a)}_block, {size});")
        for v, op in sorted(reductions.items()):
            if two_pass:
                tail.append(f"  pa_reduce_store({partials[v]}, {cname(v)});")
            else:
                fn = "pa_reduce_mul" if op == "*" else "pa_reduce_add"
                tail.append(f"  {fn}(&pa_s->{cname(v)}, {cname(v)});")
        body, self.lines = self.lines, saved
        self.names = self.host_names
        self.printer.array_names = saved_arrays
        self.device_code += ([f"__global__ void {name}({', '.join(decls)})", "{"] + head + body
                             + tail + ["}", ""])

        # Host side: grid size, shared memory, deterministic partial buffers.
        bx, by, bz = launch.block
        threads = dict(zip("xyz", (bx, by, bz)))
        grid = {ax: f"pa_blocks({ext}, {threads[ax]})" for ax, ext in zip(axes, extents)}
        grid_text = ", ".join(grid.get(ax, "1") for ax in "xyz"[:len(band)])
        block_text = ", ".join(str(t) for t in launch.block[:len(band)])
        self.out(indent, "{")
        inner = indent + "  "
        self.out(inner, f"dim3 pa_grid({grid_text});  // {', '.join(f'{i} -> {a}' for i, a in loops)}")
        if privatized:
            total = " + ".join(smem_terms)
            self.out(inner, f"int64_t pa_smem = {total};")
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
        self.out(inner, f"PA_LAUNCH({name}, pa_grid, dim3({block_text}), {smem}, {', '.join(args)});")
        for v, pname in partials.items():
            self.out(inner, f"pa_sum_partials(&pa_s->{cname(v)}, {pname}, {blocks});")
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
        ub = self.ast_c(cond.get_op_arg(1), iters)
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
            if _loop_key(node) in self.grid_bands:
                self.grid_kernel(node, indent, iters)
            elif t == isl.ast_node_type.block:
                self.host(_flat_block(node), indent, iters)
            elif t == isl.ast_node_type.mark:
                self.host([node.mark_get_node()], indent, iters)
            elif t == isl.ast_node_type.for_:
                it = node.for_get_iterator().get_id().get_name()
                name = self.iterator_name(node, it, iters)
                inner = {**iters, it: name}
                init, cond, inc = self._bounds(node, inner)
                step = f"{name} += {inc}" if inc != "1" else f"{name}++"
                self.out(indent, f"for (int64_t {name} = {init}; {cond}; {step}) {{")
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
        self.names = self.host_names
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
            self.out("  ", f"pa_copy_to_host({cname(r)}_out, &pa_s->{cname(r)}, "
                           f"sizeof({dt.c_type}));")
        if self.struct:
            self.out("  ", "pa_device_free(pa_s);")

        funcs = []
        for f in k.funcs:
            lines = self.func_source(f)
            lines[1] = lines[1].replace("static inline", "static __host__ __device__ inline", 1)
            funcs += lines + [""]
        head = [f"/* Generated by polyad {POLYAD_VERSION} (CUDA) from kernel '{k.name}' "
                f"({k.filename}:{k.line}). */",
                "/* Host launcher signature: DSL parameters in order (arrays as row-major DEVICE "
                "pointers), then the sizes, then temporaries (device), then the result pointer "
                "(host). Errors: pa_last_error(). */",
                '#include "polyad_cuda.h"', ""]
        helpers = [_host_device(h) for h in self.printer.helpers.values()]
        if self.uses_ast_helpers:
            helpers += [_host_device(h) for h in AST_HELPERS.splitlines()]
        if helpers:
            head += helpers + [""]
        struct = []
        if self.struct:
            struct = [f"/* the kernel's scalars, in device memory */", f"struct {self.struct} {{"]
            struct += [f"  {dt.c_type} {cname(n)};" for n, dt in self.local_types.items()]
            struct += ["};", ""]
        launcher = [f'extern "C" {_device_decl(sig.declaration())}', "{"] + self.lines + ["}", ""]
        return "\n".join(head + struct + funcs + self.device_code + launcher)


def _host_device(helper: str) -> str:
    return helper.replace("static inline", "static __host__ __device__ inline", 1)


def emit_cuda(sk: ScheduledKernel, deterministic: bool = False) -> tuple[str, CudaPlan]:
    """The CUDA C source of a scheduled kernel and the plan it implements."""
    em = _CudaEmitter(sk, deterministic)
    text = em.source()
    return text, CudaPlan(em.launches, deterministic)
