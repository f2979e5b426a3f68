"""Compile generated C into shared libraries, cached by content hash.

The cache directory is ``$POLYAD_CACHE_DIR`` (read at every compile), else
``$XDG_CACHE_HOME/polyad`` or ``~/.cache/polyad``. A library is built under a
unique temporary name in the cache directory and moved into place with
``os.replace``, so concurrent processes never see a half-written file and two
processes compiling the same kernel at once both succeed.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import logging
import os
import re
import shutil
import subprocess
import tempfile
import time
import warnings
from pathlib import Path

from ..errors import CompileError

log = logging.getLogger("polyad")

BASE_FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c99")
SANITIZE_FLAGS = {"address": ("-fsanitize=address", "-fno-omit-frame-pointer", "-g")}


def cache_dir() -> Path:
    """The cache directory; an unusable one (under a file, unwritable) is replaced by a
    private temporary directory for this process, with a warning naming POLYAD_CACHE_DIR."""
    env = os.environ.get("POLYAD_CACHE_DIR")
    if env:
        path = Path(env)
    else:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        path = Path(base) / "polyad"
    try:
        path.mkdir(parents=True, exist_ok=True)
        if not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError(f"{path} is not writable")
    except OSError as exc:
        return _fallback_cache_dir(str(path), str(exc))
    return path


@functools.lru_cache(maxsize=None)
def _fallback_cache_dir(wanted: str, reason: str) -> Path:
    path = Path(tempfile.mkdtemp(prefix="polyad-cache-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    warnings.warn(f"polyad: cannot use the cache directory {wanted} ({reason}); compiled kernels "
                  f"go to {path} for this process. Set POLYAD_CACHE_DIR to a writable "
                  f"directory.", RuntimeWarning, stacklevel=4)
    return path


@functools.lru_cache(maxsize=None)
def c_compiler() -> str:
    """The C compiler: ``$CC`` (read once per process), else ``cc`` or ``gcc`` on the PATH."""
    env = os.environ.get("CC")
    if env:
        if not shutil.which(env):
            raise CompileError(f"$CC is {env!r}, which is not an executable program: set CC to "
                               f"a C compiler with OpenMP (e.g. CC=gcc) or unset it")
        return env
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise CompileError("no C compiler found: install gcc (with OpenMP) or set $CC")
    return cc


@functools.lru_cache(maxsize=None)
def _compiler_identity(cc: str) -> str:
    """The first line of ``cc --version``, remembered in the cache directory per
    compiler binary (path, size, mtime): a warm start then runs no subprocess."""
    try:
        path = shutil.which(cc) or cc
        st = os.stat(path)
    except OSError:
        return cc
    binary = hashlib.sha256(f"{os.path.realpath(path)}\0{st.st_size}\0{st.st_mtime_ns}"
                            .encode()).hexdigest()[:24]
    known = read_cached("compiler", binary, ".id")
    if known is not None:
        return known.decode()
    try:
        out = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=60)
        identity = out.stdout.splitlines()[0] if out.stdout else cc
    except (OSError, subprocess.SubprocessError):
        return cc
    write_cached("compiler", binary, ".id", identity.encode())
    return identity


def load_library(source: str, name: str, sanitize: str | None, ffi, symbol: str):
    """Compile (cached) and ``dlopen`` ``source``; returns (path, library, function ``symbol``).

    A cache entry that does not load or lacks the kernel's symbol (truncated,
    empty, garbage or another library under this name) is deleted and rebuilt.
    """
    for attempt in (0, 1):
        path = compile_c(source, name, sanitize, rebuild=attempt == 1)
        try:
            with open(path, "rb") as f:
                if f.read(4) != b"\x7fELF":
                    raise OSError("not an ELF shared library")
            # Never unmapped: OpenMP worker threads may still spin in libgomp (loaded
            # for this library) when the interpreter exits and frees the handle.
            lib = ffi.dlopen(str(path), ffi.RTLD_NOW | ffi.RTLD_NODELETE)
            return path, lib, getattr(lib, symbol)
        except (OSError, AttributeError) as exc:
            if attempt == 1:
                raise CompileError(f"the freshly built library {path} for kernel {name!r} does "
                                   f"not load: {exc}") from exc
            log.warning("cache entry %s is unusable (%s); rebuilding it", path, exc)
    raise AssertionError("unreachable")


def compile_c(source: str, name: str, sanitize: str | None = None,
              rebuild: bool = False) -> Path:
    """Compile ``source`` to a shared library (cached) and return its path.

    ``rebuild=True`` ignores (and replaces) an existing cache entry.
    Raises CompileError with the compiler's message and the path of the
    kept source file when the compiler fails.
    """
    if sanitize == "address":
        require_asan_runtime()
    cc = c_compiler()
    flags = BASE_FLAGS + (SANITIZE_FLAGS[sanitize] if sanitize else ())
    return _cached_build(source, name, ".c", [cc, *flags], ["-lm"], _compiler_identity(cc),
                         rebuild)


# CUDA C: the runtime header (and the simulator header) live in this folder.
CUDA_INCLUDE = Path(__file__).parent / "include"
NVCC_FLAGS = ("-O3", "-shared", "-Xcompiler", "-fPIC", "-std=c++17")
# The simulator compiles the same .cu text as C++ against polyad_cuda_sim.h.
SIM_FLAGS = ("-O1", "-shared", "-fPIC", "-std=c++17", "-x", "c++")


@functools.lru_cache(maxsize=None)
def nvcc() -> str:
    """The nvcc executable ($NVCC, else on $PATH, else /usr/local/cuda/bin/nvcc)."""
    found = (os.environ.get("NVCC") or shutil.which("nvcc")
             or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None))
    if not found:
        raise CompileError("nvcc not found: install the CUDA toolkit, put nvcc on $PATH or set "
                           "$NVCC (target 'cuda-sim' needs only a C++ compiler)")
    return found


@functools.lru_cache(maxsize=None)
def cxx_compiler() -> str:
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not cxx:
        raise CompileError("no C++ compiler found: install g++ or set $CXX")
    return cxx


def _headers_identity() -> str:
    return "".join(p.read_text() for p in sorted(CUDA_INCLUDE.glob("*.h")))


def compile_cuda(source: str, name: str, arch: str) -> Path:
    """Compile CUDA C ``source`` with nvcc for ``arch`` (``native`` or ``sm_XY``), cached."""
    tool = nvcc()
    cmd = [tool, *NVCC_FLAGS, f"-arch={arch}", f"-I{CUDA_INCLUDE}"]
    return _cached_build(source, name, ".cu", cmd, [],
                         _compiler_identity(tool) + _headers_identity())


def compile_cuda_sim(source: str, name: str) -> Path:
    """Compile CUDA C ``source`` for the CPU simulator with the C++ compiler, cached."""
    cxx = cxx_compiler()
    cmd = [cxx, *SIM_FLAGS, f"-I{CUDA_INCLUDE}"]
    return _cached_build(source, name + "_sim", ".cu", cmd, ["-lm"],
                         _compiler_identity(cxx) + _headers_identity())


def _cached_build(source: str, name: str, suffix: str, cmd_head: list, libs: list,
                  identity: str, rebuild: bool = False) -> Path:
    """Build ``source`` with ``cmd_head ... -o LIB SRC libs`` into the cache (atomic rename);
    ``rebuild=True`` replaces an existing entry."""
    key = hashlib.sha256("\0".join([source, identity] + cmd_head).encode()).hexdigest()[:24]
    directory = cache_dir()
    lib = directory / f"{name}_{key}.so"
    if lib.exists() and not rebuild:
        log.debug("cache hit %s", lib)
        return lib
    src = directory / f"{name}_{key}{suffix}"
    fd, tmp_src = tempfile.mkstemp(prefix=f".{name}_", suffix=suffix, dir=directory)
    with os.fdopen(fd, "w") as f:
        f.write(source)
    os.replace(tmp_src, src)
    fd, tmp_lib = tempfile.mkstemp(prefix=f".{name}_", suffix=".so", dir=directory)
    os.close(fd)
    cmd = [*cmd_head, "-o", tmp_lib, str(src), *libs]
    log.debug("compiling: %s", " ".join(cmd))
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=_compiler_environment())
    except OSError as exc:
        os.unlink(tmp_lib)
        raise CompileError(f"cannot run the compiler {cmd_head[0]!r}: {exc}; set CC to a C "
                           f"compiler with OpenMP (e.g. CC=gcc)") from None
    if proc.returncode != 0:
        os.unlink(tmp_lib)
        raise CompileError(
            f"the compiler failed on the generated code for kernel {name!r} "
            f"(this is a polyad bug; please report it with the source file):\n"
            f"source: {src}\ncommand: {' '.join(cmd)}\n{proc.stderr.strip()}")
    os.replace(tmp_lib, lib)
    log.info("compiled %s in %.2f s -> %s", name, time.perf_counter() - start, lib)
    return lib


def _compiler_environment() -> dict:
    """This process's environment without a preloaded sanitizer runtime: a process
    started with ``LD_PRELOAD=libasan.so`` (as sanitized kernels need) must not pass
    it to the compiler, whose own exit LeakSanitizer would then fail."""
    env = dict(os.environ)
    preload = env.get("LD_PRELOAD")
    if preload:
        kept = [p for p in re.split(r"[\s:]+", preload) if p and "san" not in os.path.basename(p)]
        if kept:
            env["LD_PRELOAD"] = ":".join(kept)
        else:
            del env["LD_PRELOAD"]
    return env


ASAN_COMMAND = ("LD_PRELOAD=$(gcc -print-file-name=libasan.so) ASAN_OPTIONS=detect_leaks=0 "
                "python your_script.py")


def require_asan_runtime() -> None:
    """Raise CompileError unless the ASan runtime is loaded in this process: loading an
    ASan-instrumented library otherwise aborts the whole process ("ASan runtime does
    not come first")."""
    try:
        with open("/proc/self/maps") as maps:
            loaded = any("libasan" in line or "libclang_rt.asan" in line for line in maps)
    except OSError:  # not Linux: let the loader decide
        return
    if not loaded:
        raise CompileError("sanitize='address' needs the AddressSanitizer runtime loaded first, "
                           "when the process starts (loading the kernel now would abort the "
                           f"process): run it as\n  {ASAN_COMMAND}")


def read_cached(name: str, key: str, suffix: str) -> bytes | None:
    """The bytes of cache entry ``NAME_KEY.SUFFIX``, or None if there is none."""
    try:
        return (cache_dir() / f"{name}_{key}{suffix}").read_bytes()
    except FileNotFoundError:
        return None


def write_cached(name: str, key: str, suffix: str, data: bytes) -> Path:
    """Store cache entry ``NAME_KEY.SUFFIX`` atomically (a unique temporary name,
    then ``os.replace``), as libraries are: readers never see half a file."""
    directory = cache_dir()
    fd, tmp = tempfile.mkstemp(prefix=f".{name}_", suffix=suffix, dir=directory)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    path = directory / f"{name}_{key}{suffix}"
    os.replace(tmp, path)
    return path


# Cached libraries and their sources (NAME_<24 hex>.so/.c/.cu), pipeline results
# (NAME_<24 hex>.pipeline), and what an interrupted write leaves behind
# (.NAME_<random>.c/.so/.pipeline from mkstemp).
CACHE_LEVELS = {".pipeline": "pipeline results (IR -> schedule -> source)",
                ".c": "generated sources", ".cu": "generated CUDA sources",
                ".so": "compiled libraries"}
_CACHE_FILE = re.compile(r"(?:.+_[0-9a-f]{24}|\..+_[a-z0-9_]{8})\.(?:c|cu|so|pipeline|id)")


def cache_files() -> list[Path]:
    """polyad's files in the cache directory (other files there are not polyad's)."""
    directory = cache_dir()
    return sorted(p for p in directory.iterdir()
                  if p.is_file() and _CACHE_FILE.fullmatch(p.name))


def clear_cache() -> tuple[int, int]:
    """Delete polyad's files from the cache directory; returns (files, bytes) removed.

    Safe while other processes compile: they write under temporary names and
    rename atomically, so at worst a kernel is compiled again.
    """
    count = size = 0
    for path in cache_files():
        try:
            n = path.stat().st_size
            path.unlink()
        except FileNotFoundError:
            continue
        count += 1
        size += n
    log.debug("cleared %d files (%d bytes) from %s", count, size, cache_dir())
    return count, size
