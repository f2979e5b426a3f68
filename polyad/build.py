"""Put generated kernels into a package's build: emitted sources and a cffi builder.

- ``emit_sources(kernels, directory)`` writes one ``NAME.c`` and one
  documented ``NAME.h`` per kernel (what ``polyad emit`` does), for a C,
  CMake or make build.
- ``ffibuilder(module_name, kernels)`` returns a ``cffi.FFI`` configured
  out of line: list it in a downstream ``setup.py`` as
  ``cffi_modules=["build_kernels.py:ffibuilder"]`` and the kernels are
  compiled into an extension module when the package is built, so nothing is
  compiled at import time.
- ``load(module)`` gives the built module's kernels polyad's Python call
  interface (argument checks, output allocation, the returned value), the
  same code path as JIT-compiled kernels.

The built module carries the kernels' call metadata (IR signature, C
parameter order, size requirements) as JSON, so ``load`` needs no compiler,
no scheduling and no DSL source.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Optional, Union

import cffi
import islpy as isl

from . import callconv, ir
from .derivatives import DerivedKernel, result_packager
from .emit.c_openmp import POLYAD_VERSION, CSignature, cname
from .emit.header import c_header
from .errors import PolyadError
from .logconf import logger
from .pipeline import Artifact, Options, artifact_of, kernel_ir
from .poly import SizeRequirement
from .progress import Progress
from .runtime.loader import KernelFunction, c_prototype
from .runtime.toolchain import NO_LOOP_DISTRIBUTION_FLAG, NO_TRAPS_FLAG, contraction_flag
from .schedule import ScheduledKernel
from .target import get_target

# 2: no C parameter list in the metadata (the loader derives it from the kernel IR).
METADATA_FORMAT = 2

KernelsArg = Union[Iterable, Mapping[str, object]]


def named_kernels(kernels: KernelsArg) -> list[ir.Kernel]:
    """Kernels as IR, checked for unique names.

    ``kernels`` is a list of kernels (each keeps its own name) or a dict
    ``name -> kernel`` (each is renamed: the name is its C function and its
    Python attribute).
    """
    return [k for k, _ in _named(kernels)]


def _named(kernels: KernelsArg) -> list[tuple[ir.Kernel, object]]:
    """(IR named as asked, the kernel object given) pairs; see ``named_kernels``."""
    if isinstance(kernels, Mapping):
        pairs = []
        for name, k in kernels.items():
            if not isinstance(name, str) or not name.isidentifier():
                raise ValueError(f"kernel name {name!r} is not an identifier")
            pairs.append((dataclasses.replace(kernel_ir(k), name=name), k))
    else:
        pairs = [(kernel_ir(k), k) for k in kernels]
    out = [k for k, _ in pairs]
    if not out:
        raise ValueError("no kernels given")
    seen: dict[str, ir.Kernel] = {}
    for k in out:
        c_name = cname(k.name)
        if c_name in seen:
            raise ValueError(f"two kernels are named {k.name!r} ({seen[c_name].filename}:"
                             f"{seen[c_name].line} and {k.filename}:{k.line}); pass a dict "
                             f"{{name: kernel}} to name them")
        seen[c_name] = k
    return pairs


@dataclass
class EmittedKernel:
    """One kernel written by ``emit_sources``: its files and the pipeline's artifact."""

    name: str
    c_file: Path
    h_file: Path
    artifact: Artifact

    @property
    def scheduled(self) -> ScheduledKernel:
        return self.artifact.scheduled

    @property
    def signature(self) -> CSignature:
        return self.artifact.signature


def emit_sources(kernels: KernelsArg, directory: Union[str, os.PathLike],
                 target: str = "openmp", deterministic: bool = False,
                 progress: Optional[bool] = None) -> list[EmittedKernel]:
    """Write ``NAME.c`` and ``NAME.h`` for every kernel into ``directory``.

    The ``.h`` documents the C signature (argument order, types, extents,
    row-major layout, sizes, caller-allocated temporaries, the result
    pointer); the ``.c`` includes it, so the compiler checks that they agree.
    ``progress`` (default: when there are two kernels or more) shows a
    progress display on stderr.
    """
    options = Options(target, deterministic)
    pairs = _named(kernels)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    out = []
    with Progress(len(pairs), "emitting", enabled=progress) as bar:
        for k, obj in pairs:
            with bar.step(k.name):
                # a renamed kernel (dict form) is compiled under its new name
                art = artifact_of(obj if kernel_ir(obj) is k else k, options)
                sig = art.signature
                c_file = directory / f"{sig.name}{art.target.source_suffix}"
                h_file = directory / f"{sig.name}.h"
                note = getattr(art.target, "header_note", None)
                _write(h_file, c_header(art.scheduled, sig, *([note] if note else [])))
                _write(c_file, _with_include(art.source, h_file.name))
                for runtime_header in getattr(art.target, "runtime_headers", ()):
                    _write(directory / runtime_header.name, runtime_header.read_text())
                logger.debug("wrote %s and %s", c_file, h_file)
                out.append(EmittedKernel(k.name, c_file, h_file, art))
    return out


def _with_include(source: str, header: str) -> str:
    """The emitted C with ``#include "NAME.h"`` after its standard (or runtime) includes."""
    for anchor in ("#include <stdint.h>\n", '#include "polyad_cuda.h"\n'):
        if anchor in source:
            return source.replace(anchor, f'{anchor}#include "{header}"\n', 1)
    raise AssertionError("the emitted source has no '#include <stdint.h>' or runtime header line")


def _write(path: Path, text: str) -> None:
    """Write ``text`` unless the file already holds it (keeps make/CMake timestamps)."""
    if path.exists() and path.read_text() == text:
        return
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


# --------------------------------------------------------------------------
# cffi out-of-line builder
# --------------------------------------------------------------------------


def ffibuilder(module_name: str, kernels: KernelsArg, target: str = "openmp", *,
               source_dir: Union[str, os.PathLike, None] = None,
               extra_compile_args: Iterable[str] = (), deterministic: bool = False,
               progress: Optional[bool] = None) -> cffi.FFI:
    """A ``cffi.FFI`` that builds ``module_name`` (e.g. ``"mypkg._kernels"``) from ``kernels``.

    ``kernels``: a list of ``pa.Kernel`` objects (primal or derived, such as
    ``pa.Kernel(ir_kernel=polyad.ad.grad_kernel(k.ir, "x"))``) or a dict
    ``name -> kernel``. Each kernel's ``.c``/``.h`` is written to
    ``source_dir`` (default ``build/polyad/<module_name>`` under the current
    directory) and compiled into the extension with ``-O3 -fopenmp
    -fno-trapping-math -fno-tree-loop-distribution`` (``toolchain.NO_TRAPS_FLAG``,
    ``toolchain.NO_LOOP_DISTRIBUTION_FLAG``) and ``-ffp-contract=off`` when
    ``deterministic`` (``toolchain.contraction_flag``), plus
    ``extra_compile_args`` (``-march=native`` for a build that only runs on
    the build machine). Use it from ``setup.py``:
    ``cffi_modules=["build_kernels.py:ffibuilder"]`` where that file sets
    ``ffibuilder = polyad.build.ffibuilder(...)``; or call ``.compile()`` on
    it. At run time ``polyad.build.load("mypkg._kernels")`` calls them.
    """
    get_target(target)
    if target != "openmp":
        raise ValueError(f"ffibuilder builds OpenMP C with the C compiler cffi uses; target "
                         f"{target!r} is not supported (for CUDA use polyad.build.emit_sources "
                         f"and nvcc, or pa.compile(k, target='cuda'))")
    if not all(part.isidentifier() for part in module_name.split(".")):
        raise ValueError(f"module name {module_name!r} is not a dotted Python name")
    directory = Path(source_dir) if source_dir is not None else \
        Path("build") / "polyad" / module_name
    pairs = _named(kernels)
    emitted = emit_sources({k.name: k for k, _ in pairs}, directory, target, deterministic,
                           progress)
    metadata = {"format": METADATA_FORMAT, "polyad": POLYAD_VERSION, "target": target,
                "kernels": [_kernel_metadata(e, obj) for e, (_, obj) in zip(emitted, pairs)]}
    ffi = cffi.FFI()
    ffi.cdef("\n".join(c_prototype(e.signature) for e in emitted)
             + "\nconst char *polyad_metadata(void);")
    includes = "".join(f'#include "{e.h_file.name}"\n' for e in emitted)
    ffi.set_source(
        module_name,
        includes + f"static const char *polyad_metadata(void)\n{{\n  return "
        f"{_c_string(json.dumps(metadata, separators=(',', ':')))};\n}}\n",
        sources=[str(e.c_file) for e in emitted],
        include_dirs=[str(directory)],
        extra_compile_args=["-O3", "-fopenmp", contraction_flag(deterministic),
                            NO_TRAPS_FLAG, NO_LOOP_DISTRIBUTION_FLAG, *extra_compile_args],
        extra_link_args=["-fopenmp"],
        libraries=["m"])
    logger.info("cffi module %s: %d kernel(s), sources in %s", module_name, len(emitted),
                directory)
    return ffi


def _kernel_metadata(e: EmittedKernel, obj) -> dict:
    sk = e.scheduled
    return {"name": e.name, "c_name": e.signature.name,
            "param_names": list(sk.model.params),
            "requirements": [[str(r.bad_params), r.message] for r in sk.requirements],
            "kernel": _to_json(sk.kernel),
            "derived": _derived_metadata(obj)}


def _derived_metadata(obj) -> Optional[dict]:
    """For a ``pa.grad``-style kernel: what its ``package`` needs to shape the results."""
    if not isinstance(obj, DerivedKernel):
        return None
    primal = kernel_ir(obj.primal)
    return {"kind": obj.kind, "wrt": obj.wrt, "wrt_names": list(obj.wrt_names),
            "primal": _to_json(dataclasses.replace(primal, statements=(), funcs=()))}


def _c_string(text: str) -> str:
    """``text`` (ASCII) as adjacent C string literals of moderate length."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("?", "\\?")
    chunks = [escaped[i:i + 100] for i in range(0, len(escaped), 100)] or [""]
    # Never split an escape sequence between two literals.
    merged: list[str] = []
    for c in chunks:
        if merged and _ends_in_escape(merged[-1]):
            merged[-1] += c
        else:
            merged.append(c)
    return "\n    ".join(f'"{c}"' for c in merged)


def _ends_in_escape(chunk: str) -> bool:
    trailing = len(chunk) - len(chunk.rstrip("\\"))
    return trailing % 2 == 1


def _to_json(x):
    """IR (frozen dataclasses, DTypes, tuples, numbers, strings) as JSON values."""
    if isinstance(x, ir.DType):
        return {"dtype": x.name}
    if dataclasses.is_dataclass(x):
        out = {"node": type(x).__name__}
        for f in dataclasses.fields(x):
            out[f.name] = _to_json(getattr(x, f.name))
        return out
    if isinstance(x, (tuple, list)):
        return [_to_json(v) for v in x]
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    raise TypeError(f"cannot serialise {type(x).__name__} in kernel metadata")


_DTYPES = {**ir.DTYPES, ir.boolean.name: ir.boolean}
_NODES = {name: cls for name, cls in vars(ir).items()
          if isinstance(cls, type) and dataclasses.is_dataclass(cls) and cls is not ir.DType}


def _from_json(x):
    if isinstance(x, dict):
        if "node" in x:
            cls = _NODES[x["node"]]
            return cls(**{k: _from_json(v) for k, v in x.items() if k != "node"})
        return _DTYPES[x["dtype"]]
    if isinstance(x, list):
        return tuple(_from_json(v) for v in x)
    return x


# --------------------------------------------------------------------------
# run time: the built module's kernels
# --------------------------------------------------------------------------


class DerivedFunction:
    """A built derivative kernel (``pa.grad`` & co.): its results shaped as ``pa.grad``'s.

    ``raw`` is the underlying ``KernelFunction`` (IR-level outputs such as
    ``d_lam`` as a one-element array); calling this object returns what the
    ``DerivedKernel`` it was built from returns (a float for a scalar ``wrt``,
    a tuple or dict for several).
    """

    def __init__(self, raw: KernelFunction, derived: dict):
        self.raw = raw
        self.kernel = raw.kernel
        self.kind = derived["kind"]
        wrt = derived["wrt"]
        self.wrt = tuple(wrt) if isinstance(wrt, list) else wrt
        self.wrt_names = list(derived["wrt_names"])
        self.primal = _from_json(derived["primal"])
        self._package = result_packager(self.kind, self.wrt, self.wrt_names, self.primal)
        self.__name__ = raw.kernel.name
        self.__signature__ = raw.__signature__
        self.__doc__ = callconv.docstring(
            raw.kernel, f"{self.kind} of {self.primal.name} with respect to {self.wrt!r}.",
            DerivedKernel._returns_doc(self))

    def __call__(self, *args, **kwargs):
        return self._package(self.raw(*args, **kwargs))

    def __repr__(self) -> str:
        return f"<polyad prebuilt {self.kind} kernel {self.__name__}{self.__signature__}>"


class KernelModule:
    """The kernels of a module built by ``ffibuilder``, as attributes (and by name).

    ``mod.tv_cost(g, b, 0.1)`` calls the compiled kernel with the same
    argument checks, output allocation and return values as a JIT-compiled
    ``pa.Kernel``; ``mod.names`` lists the kernels.
    """

    def __init__(self, module):
        try:
            raw = module.ffi.string(module.lib.polyad_metadata()).decode("ascii")
        except AttributeError:
            raise PolyadError(f"module {module.__name__!r} was not built by "
                              f"polyad.build.ffibuilder") from None
        meta = json.loads(raw)
        if meta.get("format") != METADATA_FORMAT:
            raise PolyadError(f"module {module.__name__!r} was built by polyad "
                              f"{meta.get('polyad')} with metadata format {meta.get('format')}; "
                              f"this polyad ({POLYAD_VERSION}) reads format {METADATA_FORMAT}: "
                              f"rebuild the package")
        self.__name__ = module.__name__
        self.module = module
        target = get_target(meta["target"])
        ctx = isl.Context()
        self._kernels: dict = {}
        for entry in meta["kernels"]:
            kernel = _from_json(entry["kernel"])
            reqs = [SizeRequirement(isl.Set.read_from_str(ctx, text), message)
                    for text, message in entry["requirements"]]
            fn = KernelFunction(kernel, target.signature(kernel), reqs, entry["param_names"],
                                module.ffi, getattr(module.lib, entry["c_name"]))
            derived = entry.get("derived")
            self._kernels[entry["name"]] = fn if derived is None else DerivedFunction(fn, derived)

    @property
    def names(self) -> list[str]:
        """The kernel names, in the order given to ``ffibuilder``."""
        return list(self._kernels)

    def __getattr__(self, name: str):
        kernels = self.__dict__.get("_kernels", {})
        if name in kernels:
            return kernels[name]
        raise AttributeError(f"module {self.__dict__.get('__name__')!r} has no kernel {name!r}; "
                             f"it has {', '.join(kernels) or 'none'}")

    def __getitem__(self, name: str):
        try:
            return self._kernels[name]
        except KeyError:
            raise KeyError(f"no kernel {name!r}; this module has {', '.join(self._kernels)}") \
                from None

    def __iter__(self):
        return iter(self._kernels)

    def __len__(self) -> int:
        return len(self._kernels)

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(self._kernels))

    def __repr__(self) -> str:
        return f"<polyad kernels of {self.__name__}: {', '.join(self._kernels)}>"


def load(module) -> KernelModule:
    """The kernels of a built module (the module object or its dotted name).

    ``module`` is the extension module ``ffibuilder`` configured, e.g.
    ``polyad.build.load("mypkg._kernels")``. Nothing is compiled.
    """
    if isinstance(module, str):
        module = importlib.import_module(module)
    return KernelModule(module)
