"""The user-facing objects: ``@pa.kernel``, ``@pa.func``, ``pa.sizes``, ``pa.compile``.

This module sits on top of the pipeline (``polyad.pipeline.compile_kernel``:
frontend -> IR -> schedule -> target plan -> emit; then the target's loader)
and ties the stages together for a user.
"""

from __future__ import annotations

import functools
import sys
from typing import Optional, Union

from . import callconv, ir
from .errors import PolyadError
from .frontend.c_frontend import parse_c
from .frontend.python_dsl import parse_func, parse_kernel
from .frontend.sources import function_from_source
from .pipeline import (Artifact, Options, build_kernel, compile_kernel, recent_artifact,
                       schedule_family)
from .target import get_target
from .report import explain
from .runtime.loader import KernelFunction
from .runtime.threads import num_threads
from .schedule import machine
from .schedule.fusion import FINE_CHUNK_ROWS
from .tracebacks import filtered, is_internal, user_facing


class SingleSize(ir.Size):
    """The size ``pa.sizes("N")`` returns for one name. It also unpacks as a 1-tuple,
    so ``N, = pa.sizes("N")`` (the spelling of earlier versions) keeps working."""

    def __iter__(self):
        yield self


def sizes(names: str):
    """Declare symbolic sizes: ``M, N = pa.sizes("M N")`` (names separated by spaces or
    commas) returns a tuple; ``N = pa.sizes("N")`` (one name) returns one size."""
    parts = names.replace(",", " ").split()
    if not parts:
        raise ValueError("pa.sizes() needs at least one name")
    for p in parts:
        if not p.isidentifier():
            raise ValueError(f"size name {p!r} is not an identifier")
    if len(parts) == 1:
        return SingleSize(ir.SizeVar(parts[0]))
    return tuple(ir.Size(ir.SizeVar(p)) for p in parts)


def _alloc(kind):
    def alloc(array_type):
        raise RuntimeError(f"pa.{kind}() is only meaningful inside a @pa.kernel function")
    alloc.__polyad_alloc__ = kind
    alloc.__name__ = kind
    alloc.__doc__ = (f"Inside a kernel: ``t = pa.{kind}(pa.f64[M, N])`` creates a temporary "
                     f"array ({'zero-filled' if kind == 'zeros' else 'uninitialised'}).")
    return alloc


zeros = _alloc("zeros")
empty = _alloc("empty")


class Func:
    """A ``@pa.func`` scalar device function; still callable from Python on scalars."""

    def __init__(self, fn):
        functools.update_wrapper(self, fn)
        self.py = fn
        self.__polyad_func__, self.__polyad_deps__ = parse_func(fn)

    def __call__(self, *args):
        return self.py(*args)


@user_facing
def func(fn=None, *, source: Optional[str] = None, name: Optional[str] = None,
         globals: Optional[dict] = None) -> Func:
    """Decorator: a scalar device function callable from kernels.

    ``pa.func(source=text)`` defines it from source text instead (see ``pa.kernel``).
    """
    if source is not None:
        fn = function_from_source(source, name, _namespace(globals), "pa.func")
        if isinstance(fn, Func):
            return fn
    elif fn is None:
        raise TypeError("pa.func takes a function (@pa.func) or source=text")
    return Func(fn)


class Kernel:
    """A ``@pa.kernel`` function: its IR (``.ir``), compiled lazily on first call.

    Calling it runs the compiled OpenMP C; ``.source`` is that C text.
    Derived kernels (gradients, ...) are Kernel objects built from IR.
    """

    def __init__(self, fn=None, ir_kernel: Optional[ir.Kernel] = None):
        if fn is not None:
            functools.update_wrapper(self, fn)
            ir_kernel = parse_kernel(fn)
        else:
            self.__name__ = ir_kernel.name
        self.ir = ir_kernel
        self.__polyad_kernel__ = ir_kernel
        self._artifacts: dict = {}
        self._own_names = {p.name for p in ir_kernel.params} | set(ir_kernel.sizes)
        self.__signature__ = callconv.signature(ir_kernel, ("num_threads",))
        self.__doc__ = callconv.docstring(ir_kernel, getattr(fn, "__doc__", None) or "")
        self._compiled: dict = {}
        self._default: Optional[KernelFunction] = None  # compile() with default options

    def artifact(self, options: Options = Options()) -> Artifact:
        """The pipeline's result for ``options`` (scheduled, planned, emitted; cached per
        options and host: ``$POLYAD_VECTOR_UNIT`` may change between calls)."""
        key = _per_host(options.source_options)
        source_options, host = key
        if key not in self._artifacts:
            family = schedule_family(get_target(source_options.target))
            shared = next((a.scheduled for (o, h), a in self._artifacts.items()
                           if h == host and o.deterministic == source_options.deterministic
                           and o.tile == source_options.tile and o.fuse == source_options.fuse
                           and schedule_family(a.target) == family), None)
            self._artifacts[key] = recent_artifact(
                self.ir, source_options, lambda: compile_kernel(self.ir, source_options, shared))
        return self._artifacts[key]

    @user_facing
    def compile(self, target: str = "openmp", sanitize: Optional[str] = None,
                deterministic: bool = False, tile=None, fuse: Union[bool, int, None] = None) -> KernelFunction:
        """Schedule, emit and compile (cached per option set); see ``pa.compile``."""
        options = Options(target, deterministic, sanitize, tile, fuse)
        key = _per_host(options)
        if key not in self._compiled:
            build = self._build(options)
            function = options.target_object.load(build, sanitize)
            if build.chunked_extents:
                function.run_other_schedules_when_unbalanced(
                    build.chunked_extents,
                    lambda: self.compile(target, sanitize, deterministic, tile, fuse=False),
                    build.large_sizes,
                    (lambda: self.compile(target, sanitize, deterministic, tile,
                                          fuse=FINE_CHUNK_ROWS)) if build.fine_chunks else None)
            self._compiled[key] = function
        return self._compiled[key]

    @property
    def source(self) -> str:
        """The generated OpenMP C source: the pipeline's output (from its cache, or made),
        without running the C compiler."""
        options = Options()
        compiled = self._compiled.get(_per_host(options))
        if compiled is not None:
            return compiled.source
        return self._build(options).source

    def _build(self, options: Options):
        """The pipeline's ``Build`` for ``options``: from the pipeline cache, else from this
        kernel's artifact (made and kept by ``artifact`` on a miss, so that targets of one
        schedule family share a schedule)."""
        return build_kernel(self.ir, options,
                            self._artifacts.get(_per_host(options.source_options)),
                            lambda: self.artifact(options))

    def explain(self, format: str = "text", target: str = "openmp",
                deterministic: bool = False, tile=None, fuse: Union[bool, int, None] = None) -> str:
        """The report of ``pa.explain(self, ...)``: how this kernel is scheduled and emitted."""
        return explain(self, format, target, deterministic, tile=tile, fuse=fuse)

    def __call__(self, *args, **kwargs):
        """Run the compiled kernel (see ``__signature__`` and ``__doc__`` for its arguments).

        ``num_threads=n`` (unless the kernel has a parameter of that name) runs
        this call on at most ``n`` OpenMP threads, as ``with pa.num_threads(n)``.
        """
        try:
            if kwargs and "num_threads" in kwargs and "num_threads" not in self._own_names:
                with num_threads(kwargs.pop("num_threads")):
                    return self.compile()(*args, **kwargs)
            fn = self._default
            if fn is None:
                fn = self._default = self.compile()
            return fn(*args, **kwargs)
        except PolyadError as exc:
            raise filtered(exc) from exc.__cause__

    def __repr__(self) -> str:
        return f"<polyad kernel {self.ir.name} ({self.ir.filename}:{self.ir.line})>"


def _per_host(options: Options) -> tuple:
    """The key a Kernel keeps an artifact or a compiled function under: ``options`` and the
    host the schedule is sized for (``machine.host_key``; ``$POLYAD_VECTOR_UNIT`` may
    change between calls)."""
    return (options, machine.host_key())


@user_facing
def kernel(fn=None, *, source: Optional[str] = None, name: Optional[str] = None,
           globals: Optional[dict] = None) -> Kernel:
    """Decorator: parse ``fn`` as a polyad kernel (DSLError on unsupported constructs).

    Works wherever the function's source can be found: files, ``python -c``,
    the interactive prompt, IPython/Jupyter cells. Where there is none
    (``exec`` of a string, a script piped to stdin), pass the text::

        blur = pa.kernel(source='''
        def blur(x: pa.f64[N].clamped, y: pa.Out(pa.f64[N])):
            for i in range(N):
                y[i] = (x[i - 1] + x[i] + x[i + 1]) / 3.0
        ''')

    The text may define several functions (``name=`` picks the kernel; the
    others, e.g. ``@pa.func`` helpers, are visible to it); its names resolve
    in ``globals`` (default: the caller's module globals); error messages give
    lines within the text, under the file name ``<polyad-source-N>``.
    """
    if source is not None:
        fn = function_from_source(source, name, _namespace(globals), "pa.kernel")
        if isinstance(fn, Kernel):
            return fn
    elif fn is None:
        raise TypeError("pa.kernel takes a function (@pa.kernel) or source=text")
    return Kernel(fn)


@user_facing
def from_c(source, name: str, sizes: Optional[dict] = None,
           filename: Optional[str] = None) -> Kernel:
    """A kernel from C: function ``name`` of ``source`` (C text, or a ``pathlib.Path``).

    ``sizes`` maps ``#define``d macros (or int parameters) that stay symbolic to
    size names: ``pa.from_c(src, "kernel_jacobi_2d", sizes={"N": "n", "TSTEPS":
    "tsteps"})``; int parameters that give array extents (``int n, double
    A[n][n]``) are sizes anyway. Arrays the C writes are updated in place.
    ``filename`` names the source in error messages (``file.c:LINE:COL``).
    """
    return Kernel(ir_kernel=parse_c(source, name, sizes, filename))


def _namespace(namespace: Optional[dict]) -> dict:
    """The names source text resolves against: ``namespace``, else the globals of the
    nearest caller outside polyad."""
    if namespace is not None:
        return namespace
    frame = sys._getframe(1)
    while frame is not None and is_internal(frame.f_code.co_filename):
        frame = frame.f_back
    return frame.f_globals if frame is not None else {}


@user_facing
def compile(k: Kernel, target: str = "openmp", sanitize: Optional[str] = None,
            deterministic: bool = False, tile=None, fuse: Union[bool, int, None] = None) -> KernelFunction:
    """Compile kernel ``k`` now; returns a callable with ``.source`` (the generated C).

    ``sanitize="address"`` builds with AddressSanitizer. Its runtime must be
    loaded when the process starts, or ``CompileError`` says so (instead of
    the process aborting)::

        LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libstdc++.so)" ASAN_OPTIONS=detect_leaks=0 python app.py

    (``detect_leaks=0``: the Python interpreter itself does not free
    everything at exit). polyad removes the preload from the compiler's
    environment, so compiling in that process works.
    ``deterministic=True`` avoids every parallel form that reorders
    floating-point sums (reduction clauses, privatized copies, atomics): the
    result is the same bit for bit on every run and any number of threads.
    ``tile``: nests of three or more loops (a matrix product's) run in rectangular
    tiles, a stencil's time loop in time-skewed tiles (parallelograms, in parallel
    wavefronts), whose sizes a cache model picks (None), of the given sizes
    (``tile=(32, 32, 64)``, outermost loop first), or untiled (``tile=False``);
    ``pa.explain`` shows the decision ("tiled 128x128x128", "time-skewed tiled
    64x64x256").
    ``fuse`` (OpenMP): a nest that reads a temporary another nest writes, within a
    bounded window of rows, runs in that nest's loop, a few rows behind it, and the
    temporary shrinks to the rows still live, per thread (``pa.explain``: "fused the
    nests of S2 into the nest of S4 at depth 1 ...: t kept as 5 rows per thread").
    None (default): where a producer runs ahead, and at run time only for the calls
    whose chunks of 64 rows keep every thread busy or that are small (the others, of 2^20
    points or more, run chunks of 16 rows where those balance the threads and a chunk
    recomputes at most 2 rows, else the unfused schedule, compiled on first use); True:
    also where none runs ahead, at every size; a positive integer: as True, in chunks of
    that many rows; False: never.
    """
    if not isinstance(k, Kernel):
        raise TypeError(f"pa.compile() takes a @pa.kernel, got {type(k).__name__}")
    return k.compile(target, sanitize, deterministic, tile, fuse)
