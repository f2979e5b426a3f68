"""The independent reference for the C corpus: the same .c file compiled directly by
gcc (sequential, no OpenMP, no polyad) and called through cffi.

``gcc_build(path, defines)`` returns a ``Reference`` whose ``call(name, args)``
runs C function ``name`` with ``args`` (C parameter name -> int, float or numpy
array, in any order) the way a C caller would: arrays passed as pointers and
updated in place; it returns the function's result (None for void).
The cffi declarations are derived from the file with pycparser (arrays and
pointers become ``T *``), so every corpus kernel gets one without hand-written
prototypes.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import cffi
import numpy as np
from pycparser import c_ast, c_parser

STAND_IN_HEADERS = Path(__file__).resolve().parents[2] / "polyad" / "frontend" / "c_include"
BUILD_DIR = Path(tempfile.gettempdir()) / f"polyad-c-reference-{os.getuid()}"
GCC_FLAGS = ["-O3", "-march=native", "-std=c99", "-fPIC", "-shared"]


@dataclass
class Prototype:
    name: str
    result: str                     # C type, "void" for none
    params: list[tuple[str, str]]   # (name, C type as cffi takes it)


def _type_text(node) -> str:
    if isinstance(node, (c_ast.ArrayDecl, c_ast.PtrDecl)):
        inner = node.type
        while not isinstance(inner, c_ast.TypeDecl):
            inner = inner.type
        return " ".join(inner.type.names) + " *"
    return " ".join(node.type.names)


def prototypes(path: Path, defines: dict) -> dict[str, Prototype]:
    """Every function defined in ``path``, as cffi declarations."""
    cmd = ["cc", "-E", "-P", "-nostdinc", "-I", str(STAND_IN_HEADERS), "-std=c99"]
    cmd += [f"-D{k}={v}" for k, v in defines.items()] + [str(path)]
    text = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    tree = c_parser.CParser().parse(text, str(path))
    out = {}
    for ext in tree.ext:
        if isinstance(ext, c_ast.FuncDef) and "static" not in (ext.decl.storage or []):
            ftype = ext.decl.type
            params = [(p.name, _type_text(p.type)) for p in (ftype.args.params if ftype.args
                                                               else [])]
            out[ext.decl.name] = Prototype(ext.decl.name, _type_text(ftype.type), params)
    return out


class Reference:
    """A gcc build of one C file (with fixed -D macros), callable through cffi."""

    def __init__(self, path: Path, defines: dict, flags=None, cc: str = "gcc"):
        self.path = Path(path)
        self.protos = prototypes(self.path, defines)
        flags = list(flags or GCC_FLAGS)
        key = hashlib.sha256((self.path.read_text() + repr(sorted(defines.items()))
                              + repr(flags) + cc).encode()).hexdigest()[:16]
        BUILD_DIR.mkdir(parents=True, exist_ok=True)
        lib = BUILD_DIR / f"{self.path.stem}-{key}.so"
        if not lib.exists():
            tmp = lib.with_suffix(f".{os.getpid()}.tmp")
            subprocess.run([cc, *flags, *[f"-D{k}={v}" for k, v in defines.items()],
                            str(self.path), "-o", str(tmp), "-lm"], check=True)
            os.replace(tmp, lib)
        self.ffi = cffi.FFI()
        self.ffi.cdef("\n".join(
            f"{p.result} {p.name}({', '.join(t for _, t in p.params) or 'void'});"
            for p in self.protos.values()))
        self.lib = self.ffi.dlopen(str(lib))

    def call(self, name: str, args: dict):
        """Run function ``name``: arrays in ``args`` are updated in place."""
        proto = self.protos[name]
        cargs = []
        for pname, ctype in proto.params:
            v = args[pname]
            if ctype.endswith("*"):
                assert isinstance(v, np.ndarray) and v.flags.c_contiguous, pname
                cargs.append(self.ffi.cast(ctype, v.ctypes.data))
            else:
                cargs.append(v)
        result = getattr(self.lib, name)(*cargs)
        return None if proto.result == "void" else result


_BUILDS: dict = {}


def gcc_build(path, defines=None, flags=None, cc: str = "gcc") -> Reference:
    """The (cached) build of ``path`` with ``defines`` by ``cc`` (gcc unless told)."""
    key = (str(path), tuple(sorted((defines or {}).items())), tuple(flags or ()), cc)
    if key not in _BUILDS:
        _BUILDS[key] = Reference(Path(path), defines or {}, flags, cc)
    return _BUILDS[key]
