"""Build the benchmark's own C (hand-written baselines, STREAM triad) and load it with cffi.

Like polyad's runtime (polyad/runtime/toolchain.py and loader.py): the C is
compiled with polyad's flags (``cc -O3 -march=native -fopenmp -shared -fPIC
-std=c99 -ffp-contract=fast -fno-trapping-math -mprefer-vector-width=512`` on x86-64) into a
content-hash named shared library (cached under ``benchmarks/_build/``,
written atomically) and loaded in cffi ABI mode (``ffi.dlopen``).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import cffi
import numpy as np

from polyad.runtime.toolchain import BASE_FLAGS, arithmetic_flags

HERE = Path(__file__).resolve().parent
HANDWRITTEN = HERE / "handwritten"
BUILD_DIR = Path(os.environ.get("POLYAD_BENCH_BUILD_DIR", HERE / "_build"))

# polyad's own flags, so that the hand-written C and polyad's compare like with like
FLAGS = BASE_FLAGS + arithmetic_flags(deterministic=False)

CTYPE = {"f32": "float", "f64": "double"}
NPTYPE = {"f32": np.float32, "f64": np.float64}


def compiler() -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise RuntimeError("no C compiler found: install gcc (with OpenMP) or set $CC")
    return cc


def _includes(path: Path) -> list[Path]:
    """The file and the local headers it includes (for the cache key)."""
    out = [path]
    for name in re.findall(r'#include\s+"([^"]+)"', path.read_text()):
        out += _includes(path.parent / name)
    return out


def build(path: Path, defines: tuple[str, ...] = ()) -> Path:
    """Compile ``path`` (a C file) to a shared library, cached by content hash."""
    cc = compiler()
    flags = FLAGS + tuple(f"-D{d}" for d in defines)
    h = hashlib.sha256()
    for p in _includes(path):
        h.update(p.read_bytes())
    h.update("\0".join((cc,) + flags).encode())
    key = h.hexdigest()[:20]
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    lib = BUILD_DIR / f"{path.stem}_{'_'.join(defines) or 'default'}_{key}.so"
    if lib.exists():
        return lib
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}_", suffix=".so", dir=BUILD_DIR)
    os.close(fd)
    cmd = [cc, *flags, "-I", str(path.parent), "-o", tmp, str(path), "-lm"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        os.unlink(tmp)
        raise RuntimeError(f"compiling {path} failed:\n{' '.join(cmd)}\n{proc.stderr}")
    os.replace(tmp, lib)
    return lib


class CLib:
    """A shared library loaded in cffi ABI mode, with numpy-friendly pointer casts."""

    def __init__(self, path: Path, cdef: str, defines: tuple[str, ...] = ()):
        self.path = build(path, defines)
        self.ffi = cffi.FFI()
        self.ffi.cdef(cdef)
        # RTLD_NODELETE: never unmap the library (and the OpenMP runtime it
        # pulled in) while libgomp's worker threads may still exist, e.g. at
        # interpreter exit.
        self.lib = self.ffi.dlopen(str(self.path), self.ffi.RTLD_NOW | self.ffi.RTLD_NODELETE)

    def ptr(self, a: np.ndarray, ctype: str):
        if not a.flags.c_contiguous:
            raise ValueError("C baselines need C-contiguous arrays")
        return self.ffi.cast(ctype + " *", a.ctypes.data)


def load_baseline(name: str, cdef_template: str, dtype: str) -> CLib:
    """Load ``handwritten/<name>.c`` for ``dtype`` ('f32' or 'f64').

    ``cdef_template`` uses ``real`` for the element type.
    """
    cdef = re.sub(r"\breal\b", CTYPE[dtype], cdef_template)
    defines = ("BENCH_F32",) if dtype == "f32" else ()
    return CLib(HANDWRITTEN / f"{name}.c", cdef, defines)
