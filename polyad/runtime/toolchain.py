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
from typing import Optional

from ..emit.c_openmp import UNIT_BEGIN, UNIT_END
from ..errors import CompileError
from ..schedule import machine

log = logging.getLogger("polyad")

# gcc 12 miscompiles a loop it has if-converted (with masked stores, which -march=native
# and NO_TRAPS_FLAG allow) when its loop distribution then splits the loop: the split
# loops lost the order of ``y[c] -= y[c]`` and a guarded ``y[2] += g`` of the same
# iteration (fuzz seed 17743; tests/test_compile_units.py). polyad chooses its loops'
# structure itself: with the flag, of the benchmarks' 40 emitted kernels only the
# deconvolution's one-parameter gradients compile differently, in their border pieces.
NO_LOOP_DISTRIBUTION_FLAG = "-fno-tree-loop-distribution"
BASE_FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c99",
              NO_LOOP_DISTRIBUTION_FLAG)
# A sanitized build is compiled at -O1 (AddressSanitizer's documented level): it checks
# the same accesses (the C's, whatever the level), and gcc builds the conv layer's
# gradient under ASan in 8 s instead of 21 s at -O3.
SANITIZE_FLAGS = {"address": ("-O1", "-fsanitize=address", "-fno-omit-frame-pointer", "-g")}


def contraction_flag(deterministic: bool) -> str:
    """``-ffp-contract=fast``: the C compiler fuses ``a * b + c`` into one fused
    multiply-add, rounded once (``-std=c99`` alone keeps the product rounded apart,
    and gcc's GNU modes fuse). A deterministic build keeps the products rounded
    (``-ffp-contract=off``): some tunings (gcc's for AMD Zen) avoid chains of fused
    multiply-adds in scalar code but not in vector code, so an element's value would
    depend on whether a thread's share of a loop ran it in the vector body or in the
    scalar remainder, that is, on the thread count."""
    return "-ffp-contract=off" if deterministic else "-ffp-contract=fast"


# The generated C never reads the floating-point exception flags, so the C compiler may
# compute an operation whose result a selection then discards: a loop with a selection
# (a ReLU's derivative, ``d_r * (s >= 0 ? 1 : 0)``) vectorizes with blends on machines
# without masked vector operations (AVX2). Without it gcc kept the conv layer's gradient
# loops of the selection scalar, with a branch per element: the whole gradient took 1.3 to
# 1.6 times as long on an AVX2 machine. The values are IEEE's either way (the flag allows
# no reassociation, no contraction and no assumption about NaNs or infinities).
NO_TRAPS_FLAG = "-fno-trapping-math"


def arithmetic_flags(deterministic: bool) -> tuple[str, ...]:
    """The flags that let the C compiler use the machine's arithmetic fully: the
    ``contraction_flag``, ``NO_TRAPS_FLAG`` and, on x86-64, ``-mprefer-vector-width=512``
    (gcc prefers 256-bit vectors on AVX-512 machines). With the first and the last, the
    benchmarks' gradients took 0.84-1.03 of their time and the hand-written C's
    0.78-1.10, in runs whose noise is about 10 % (benchmarks/README.md, "Issue 10,
    eighth round")."""
    wide = ("-mprefer-vector-width=512",) if machine.host_is_x86_64() else ()
    return (contraction_flag(deterministic), NO_TRAPS_FLAG) + wide


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


def load_library(source: str, name: str, sanitize: str | None, ffi, symbol: str,
                 deterministic: bool = False):
    """Compile (cached) and ``dlopen`` ``source``; returns (path, library, function ``symbol``).
    ``deterministic``: as ``compile_c``'s.

    A cache entry that does not load or lacks the kernel's symbol (truncated,
    empty, garbage or another library under this name) is deleted and rebuilt.
    """
    for attempt in (0, 1):
        path = compile_c(source, name, sanitize, rebuild=attempt == 1,
                         deterministic=deterministic)
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
              rebuild: bool = False, deterministic: bool = False) -> Path:
    """Compile ``source`` to a shared library (cached) and return its path.

    ``rebuild=True`` ignores (and replaces) an existing cache entry;
    ``deterministic``: the source of a ``deterministic=True`` build (``arithmetic_flags``).
    Raises CompileError with the compiler's message and the path of the
    kept source file when the compiler fails.
    """
    if sanitize == "address":
        require_asan_runtime()
    cc = c_compiler()
    base = BASE_FLAGS if not sanitize else tuple(f for f in BASE_FLAGS if not f.startswith("-O"))
    flags = base + arithmetic_flags(deterministic) + (SANITIZE_FLAGS[sanitize] if sanitize else ())
    # -march=native: the host's CPU is part of what was built (a library from another
    # machine sharing the cache directory could stop on an illegal instruction here)
    identity = f"{_compiler_identity(cc)}\0{machine.cpu_fingerprint()}"
    return _cached_build(source, name, ".c", [cc, *flags], ["-lm"], identity,
                         rebuild, translation_units(source, compile_jobs()))


# A source shorter than this compiles in about the time of starting the compiler.
MIN_SPLIT_LINES = 150


def compile_jobs() -> int:
    """How many compiler processes one build may run at once: ``$POLYAD_COMPILE_JOBS``,
    else the number of cores this process may run on."""
    env = os.environ.get("POLYAD_COMPILE_JOBS")
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            raise CompileError(f"$POLYAD_COMPILE_JOBS is {env!r}: set it to a number of "
                               f"processes (1 compiles each kernel in one piece)") from None
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def translation_units(source: str, jobs: int) -> list[str]:
    """``source`` cut into at most ``jobs`` C files that compile separately and link into
    the same library: the first holds the kernel's function and some units (the loop
    nests the emitter prints as functions between ``UNIT_BEGIN`` and ``UNIT_END``), each
    other one the text before the first unit (includes, helpers) and more units; a
    unit compiled elsewhere leaves its prototype. The units are dealt by size (lines),
    largest first, to the file with the fewest lines so far. One file (``[source]``)
    when ``jobs`` is 1, the source has fewer than two units or ``MIN_SPLIT_LINES``."""
    lines = source.split("\n")
    starts = [k for k, line in enumerate(lines) if line == UNIT_BEGIN]
    if jobs < 2 or len(starts) < 2 or len(lines) < MIN_SPLIT_LINES:
        return [source]
    units = [(a, lines.index(UNIT_END, a) + 1) for a in starts]
    weight = [len(lines) - sum(b - a for a, b in units)] + [0] * (min(jobs, len(units) + 1) - 1)
    where: dict = {}
    for a, b in sorted(units, key=lambda u: u[0] - u[1]):
        file = weight.index(min(weight))
        where[a] = file
        weight[file] += b - a
    head = lines[:starts[0]]
    files = []
    for file in range(len(weight)):
        if file == 0:
            text, last = [], 0
            for a, b in units:  # a unit compiled elsewhere leaves its declaration line
                text += lines[last:a] + (lines[a:b] if where[a] == 0 else [lines[a + 1] + ";"])
                last = b
            text += lines[last:]
        else:
            text = head + [line for a, b in units if where[a] == file for line in lines[a:b]]
        files.append("\n".join(text) + "\n")
    return files


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
    identity = _compiler_identity(cxx) + _headers_identity()
    pch = _simulator_pch_dir(cxx, identity)
    cmd = [cxx, *SIM_FLAGS, *([f"-I{pch}"] if pch else []), f"-I{CUDA_INCLUDE}"]
    return _cached_build(source, name + "_sim", ".cu", cmd, ["-lm"], identity)


# The precompiled runtime header of the simulator's builds: a directory ``pch_KEY`` of
# the cache holding ``polyad_cuda.h.gch``. In C++, polyad_cuda.h's <math.h> brings in
# <cmath>, about 20 000 lines that took 0.3 of the 0.4 s g++ spent on a one-line kernel;
# with the precompiled header it took 0.12 s (the CUDA corpora's 123 simulator builds:
# 62 -> 33 s of g++). g++ looks for ``polyad_cuda.h.gch`` in each include directory
# before ``polyad_cuda.h`` and uses it only where it was built with the same compiler
# and flags; otherwise (another compiler, clang) it reads the header itself, so a stale
# or foreign file costs time, never a wrong build.
PCH_HEADER = "polyad_cuda.h"
_PCH_DIR = re.compile(r"pch_[0-9a-f]{24}")


def _simulator_pch_dir(cxx: str, identity: str) -> Optional[Path]:
    """The cache's directory holding the simulator's precompiled ``polyad_cuda.h``
    for ``cxx`` (built there once, atomically), or None where ``cxx`` cannot build it."""
    flags = [f for f in SIM_FLAGS if f not in ("-shared", "-x", "c++")]
    return _built_pch(cache_dir() / f"pch_{_cache_key([identity, cxx, *flags])}", (cxx, *flags))


def _cache_key(parts: list) -> str:
    """The 24 hex digits that name a cache entry made from ``parts`` (texts)."""
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]


@functools.lru_cache(maxsize=None)
def _built_pch(directory: Path, cmd_head: tuple) -> Optional[Path]:
    """``directory`` once ``PCH_HEADER`` is precompiled into it by ``cmd_head`` (the
    compiler and the builds' flags), or None where that fails; remembered per process."""
    gch = directory / f"{PCH_HEADER}.gch"
    if gch.exists():
        return directory
    tmp = None
    try:
        directory.mkdir(exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{PCH_HEADER}.", suffix=".gch", dir=directory)
        os.close(fd)
        cmd = [*cmd_head, "-x", "c++-header", f"-I{CUDA_INCLUDE}",
               str(CUDA_INCLUDE / PCH_HEADER), "-o", tmp]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=_compiler_environment())
        if proc.returncode == 0:
            os.replace(tmp, gch)
            return directory
        why = f"{' '.join(cmd)} failed: {proc.stderr.strip()[:500]}"
    except OSError as exc:  # a full disk, a compiler that does not start
        why = str(exc)
    if tmp is not None and os.path.exists(tmp):
        os.unlink(tmp)
    # the builds read the header itself, as without a precompiled one
    log.info("no precompiled header for the simulator: %s", why)
    return None


def _cached_build(source: str, name: str, suffix: str, cmd_head: list, libs: list,
                  identity: str, rebuild: bool = False, units: Optional[list] = None) -> Path:
    """Build ``source`` with ``cmd_head ... -o LIB SRC libs`` into the cache (atomic rename);
    ``rebuild=True`` replaces an existing entry. ``units``: the same program as several
    sources (``translation_units``), compiled at once with ``-c`` and then linked."""
    key = _cache_key([source, identity, *cmd_head])
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
    start = time.perf_counter()
    parallel = units is not None and len(units) > 1
    try:
        if parallel:
            _build_units(units, name, suffix, cmd_head, libs, src, tmp_lib, directory)
        else:
            _run_compiler([*cmd_head, "-o", tmp_lib, str(src), *libs], name, src)
    except CompileError:
        os.unlink(tmp_lib)
        raise
    os.replace(tmp_lib, lib)
    log.info("compiled %s in %.2f s%s -> %s", name, time.perf_counter() - start,
             f" ({len(units)} units at once)" if parallel else "", lib)
    return lib


def _build_units(units: list, name: str, suffix: str, cmd_head: list, libs: list, src: Path,
                 out: str, directory: Path) -> None:
    """Compile each source of ``units`` to an object file, all at once, and link them
    into ``out``; ``src`` (the whole source) is what an error names."""
    with tempfile.TemporaryDirectory(prefix=f".{name}_", dir=directory) as work:
        cmds, objects = [], []
        for k, text in enumerate(units):
            path = Path(work, f"unit{k}{suffix}")
            path.write_text(text)
            objects.append(str(path.with_suffix(".o")))
            cmds.append([*cmd_head, "-c", "-o", objects[-1], str(path)])
        try:
            procs = [subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                      text=True, env=_compiler_environment()) for cmd in cmds]
        except OSError as exc:
            raise _cannot_run(cmd_head[0], exc) from None
        errors = [(cmd, proc.communicate()[1]) for cmd, proc in zip(cmds, procs)]
        for (cmd, err), proc in zip(errors, procs):
            if proc.returncode != 0:
                raise _compiler_failed(name, src, cmd, err)
        _run_compiler([*cmd_head, "-o", out, *objects, *libs], name, src)


def _run_compiler(cmd: list, name: str, src: Path) -> None:
    log.debug("compiling: %s", " ".join(cmd))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=_compiler_environment())
    except OSError as exc:
        raise _cannot_run(cmd[0], exc) from None
    if proc.returncode != 0:
        raise _compiler_failed(name, src, cmd, proc.stderr)


def _cannot_run(compiler: str, exc: OSError) -> CompileError:
    return CompileError(f"cannot run the compiler {compiler!r}: {exc}; set CC to a C "
                        f"compiler with OpenMP (e.g. CC=gcc)")


def _compiler_failed(name: str, src: Path, cmd: list, stderr: str) -> CompileError:
    return CompileError(
        f"the compiler failed on the generated code for kernel {name!r} "
        f"(this is a polyad bug; please report it with the source file):\n"
        f"source: {src}\ncommand: {' '.join(cmd)}\n{stderr.strip()}")


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


# libstdc++ too: islpy raises C++ exceptions that polyad catches while it compiles (ISL's
# scheduler stopped at its operation quota); ASan's interceptor of the throw aborts the
# process when the C++ runtime was loaded after it
ASAN_COMMAND = ('LD_PRELOAD="$(gcc -print-file-name=libasan.so) '
                '$(gcc -print-file-name=libstdc++.so)" ASAN_OPTIONS=detect_leaks=0 '
                'python your_script.py')


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
                ".so": "compiled libraries",
                ".gch": "precompiled headers (the CUDA simulator's)"}
_CACHE_FILE = re.compile(r"(?:.+_[0-9a-f]{24}|\..+_[a-z0-9_]{8})\.(?:c|cu|so|pipeline|id)")


def cache_files() -> list[Path]:
    """polyad's files in the cache directory (other files there are not polyad's),
    with the precompiled headers in its ``pch_KEY`` directories."""
    directory = cache_dir()
    found = []
    for p in directory.iterdir():
        if p.is_file() and _CACHE_FILE.fullmatch(p.name):
            found.append(p)
        elif p.is_dir() and _PCH_DIR.fullmatch(p.name):
            found += [f for f in p.iterdir() if f.is_file() and f.name.startswith(
                (PCH_HEADER, f".{PCH_HEADER}.")) and f.name.endswith(".gch")]
    return sorted(found)


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
    for path in cache_dir().iterdir():
        if path.is_dir() and _PCH_DIR.fullmatch(path.name):
            shutil.rmtree(path, ignore_errors=True)
    _built_pch.cache_clear()
    log.debug("cleared %d files (%d bytes) from %s", count, size, cache_dir())
    return count, size
