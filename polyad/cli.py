"""The ``polyad`` command line (also ``python -m polyad``).

  polyad show FILE.py:KERNEL [--grad|--vjp|--jvp|--adjoint|--hvp NAME ...] [--format text|json|dot]
  polyad emit FILE.py:KERNEL [--grad|--vjp|--jvp|--adjoint|--hvp NAME ...] -o DIR
  polyad emit FILE.py --all -o DIR
  (FILE.c:FUNCTION works wherever FILE.py:KERNEL does; --sizes N=n keeps a
  #define symbolic)
  polyad demo [--size N]
  polyad bench [--full] [ARGS ...]
  polyad cache info|clear

Exit status: 0 on success; 1 when the kernel's program or the toolchain
fails (a DSL error prints ``FILE:LINE:COL: message``); 2 on a usage error
(bad options, a missing file or kernel, an unknown target).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Optional

from . import api, build, logconf, report
from .errors import DSLError, PolyadError
from .frontend import c_frontend
from .runtime import toolchain
from .target import get_target

EXIT_ERROR = 1
EXIT_USAGE = 2

_DERIVATIONS = {"grad": "grad_kernel", "vjp": "vjp_kernel", "jvp": "jvp_kernel",
                "adjoint": "adjoint_kernel", "hvp": "hvp_kernel"}
_FLAGS = ", ".join(f"--{kind}" for kind in _DERIVATIONS)


class UsageError(Exception):
    """A command line that cannot work as given (exit status 2)."""


# --------------------------------------------------------------------------
# loading kernels from a file
# --------------------------------------------------------------------------


def parse_spec(spec: str) -> tuple[Path, Optional[str]]:
    """``FILE.py:KERNEL`` -> (path, kernel name); ``FILE.py`` -> (path, None)."""
    path, sep, name = spec.rpartition(":")
    if not sep or not name.isidentifier():
        path, name = spec, None
    return Path(path), name


def load_module(path: Path):
    """Import the Python file ``path`` (its directory first on ``sys.path``, as ``python FILE``).

    DSL errors propagate; any other exception while importing becomes a
    PolyadError carrying the traceback from the user's file on.
    """
    if not path.is_file():
        raise UsageError(f"no such file: {path}")
    if path.suffix != ".py":
        raise UsageError(f"{path} is not a Python or C file (expected FILE.py or FILE.c)")
    path = path.resolve()
    name = path.stem if path.stem.isidentifier() and path.stem not in sys.modules \
        else f"__polyad_cli__{abs(hash(str(path)))}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    except DSLError:
        raise
    except SyntaxError as exc:
        raise PolyadError(f"{exc.filename}:{exc.lineno}:{exc.offset or 0}: SyntaxError: "
                          f"{exc.msg}") from None
    except Exception as exc:
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != str(path):
            tb = tb.tb_next
        text = "".join(traceback.format_exception(type(exc), exc, tb or exc.__traceback__))
        raise PolyadError(f"importing {path} failed:\n{text.rstrip()}") from None
    return module


def module_kernels(module) -> dict[str, api.Kernel]:
    """The kernels bound to module-level names, in definition order (aliases once)."""
    out: dict[str, api.Kernel] = {}
    seen = set()
    for name, obj in vars(module).items():
        if isinstance(obj, api.Kernel) and id(obj) not in seen:
            seen.add(id(obj))
            out[name] = obj
    return out


def select_kernel(module, path: Path, name: Optional[str]) -> api.Kernel:
    """The kernel ``name`` of ``module`` (UsageError, listing the kernels, if there is none)."""
    kernels = module_kernels(module)
    if name is None:
        raise UsageError(f"name the kernel: {path}:KERNEL "
                         f"(kernels in {path.name}: {', '.join(kernels) or 'none'})")
    obj = getattr(module, name, None)
    if not isinstance(obj, api.Kernel):
        what = "is not a @pa.kernel" if obj is not None else "is not defined"
        raise UsageError(f"{name!r} {what} in {path} "
                         f"(kernels there: {', '.join(kernels) or 'none'})")
    return obj


def c_sizes(args) -> dict:
    """``--sizes N=n TSTEPS=tsteps`` -> {"N": "n", "TSTEPS": "tsteps"}."""
    out = {}
    for item in getattr(args, "sizes", None) or []:
        macro, sep, name = item.partition("=")
        if not sep or not macro.isidentifier() or not name.isidentifier():
            raise UsageError(f"--sizes {item}: write MACRO=name, e.g. --sizes N=n")
        out[macro] = name
    return out


def load_c_unit(path: Path, args):
    """The parsed C file ``path`` (DSL errors propagate)."""
    if not path.is_file():
        raise UsageError(f"no such file: {path}")
    return c_frontend.load_unit(path, c_sizes(args))


def file_kernel(path: Path, name: Optional[str], args) -> api.Kernel:
    """Kernel ``name`` of a ``.py`` file or C function ``name`` of a ``.c`` file."""
    if path.suffix != ".c":
        if getattr(args, "sizes", None):
            raise UsageError("--sizes applies to C files only")
        return select_kernel(load_module(path), path, name)
    unit = load_c_unit(path, args)
    if name is None or name not in unit.functions:
        listed = ", ".join(c_frontend.kernel_names(unit)) or "none"
        what = "name the function: {p}:FUNCTION" if name is None else f"{name!r} is not " \
            "defined in {p}"
        raise UsageError(what.format(p=path) + f" (functions in {path.name}: {listed})")
    return api.Kernel(ir_kernel=c_frontend.kernel_of(unit, name))


def file_kernels(path: Path, args) -> list:
    """Every kernel of a ``.py`` file, or every non-static function of a ``.c`` file."""
    if path.suffix == ".c":
        unit = load_c_unit(path, args)
        return [api.Kernel(ir_kernel=c_frontend.kernel_of(unit, n))
                for n in c_frontend.kernel_names(unit)]
    return list(module_kernels(load_module(path)).values())


def derive(kernel: api.Kernel, args) -> api.Kernel:
    """The kernel asked for by ``--grad`` / ``--vjp`` / ``--jvp`` / ``--adjoint`` / ``--hvp``
    (or ``kernel`` itself)."""
    asked = [(kind, getattr(args, kind)) for kind in _DERIVATIONS if getattr(args, kind)]
    if not asked:
        return kernel
    if len(asked) > 1:
        raise UsageError(f"give only one of {_FLAGS}")
    kind, names = asked[0]
    params = [p.name for p in kernel.ir.params]
    for n in names:
        if n not in params:
            raise UsageError(f"--{kind} {n}: {kernel.ir.name} has no parameter {n!r} "
                             f"(its parameters: {', '.join(params)})")
    from . import ad
    fn = getattr(ad, _DERIVATIONS[kind], None)
    if fn is None:
        raise UsageError(f"--{kind} is not available yet in this polyad version "
                         f"(polyad.ad has no {_DERIVATIONS[kind]})")
    return api.Kernel(ir_kernel=fn(kernel.ir, names[0] if len(names) == 1 else list(names)))


def _check_target(target: str) -> None:
    try:
        get_target(target)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


# --------------------------------------------------------------------------
# subcommands
# --------------------------------------------------------------------------


def cmd_show(args) -> int:
    """``polyad show``: print ``pa.explain``'s report."""
    _check_target(args.target)
    path, name = parse_spec(args.kernel)
    kernel = derive(file_kernel(path, name, args), args)
    sys.stdout.write(report.explain(kernel, format=args.format, target=args.target,
                                     deterministic=args.deterministic))
    return 0


def cmd_emit(args) -> int:
    """``polyad emit``: write ``.c`` and ``.h`` files; prints their paths."""
    _check_target(args.target)
    path, name = parse_spec(args.kernel)
    if args.all:
        if name is not None:
            raise UsageError("--all emits every kernel of a file: give FILE.py, not FILE.py:KERNEL")
        if any(getattr(args, kind) for kind in _DERIVATIONS):
            raise UsageError(f"{_FLAGS.replace(', ', '/')} apply to one kernel: give "
                             "FILE.py:KERNEL instead of --all")
        kernels = file_kernels(path, args)
        if not kernels:
            what = "non-static function" if path.suffix == ".c" else "@pa.kernel"
            raise UsageError(f"{path} defines no {what}")
    else:
        kernels = [derive(file_kernel(path, name, args), args)]
    emitted = build.emit_sources(kernels, args.output, args.target, args.deterministic,
                                 progress=False if args.quiet else None)
    for e in emitted:
        print(e.c_file)
        print(e.h_file)
    return 0


def cmd_demo(args) -> int:
    """``polyad demo``: the README's first command."""
    from .demo import run_demo
    return run_demo(size=args.size)


def find_benchmarks() -> Path:
    """``benchmarks/run.py`` of the current directory or of polyad's source checkout."""
    candidates = [Path.cwd() / "benchmarks" / "run.py",
                  Path(__file__).resolve().parent.parent / "benchmarks" / "run.py"]
    for c in candidates:
        if c.is_file():
            return c
    raise UsageError("the benchmark suite (benchmarks/run.py) was not found in "
                     f"{candidates[0].parent} or {candidates[1].parent}; it ships with "
                     "polyad's source (a checkout or the sdist), not with the wheel: run "
                     "'polyad bench' in the source directory")


def cmd_bench(args) -> int:
    """``polyad bench``: ``benchmarks/run.py --quick`` (``--full`` drops ``--quick``)."""
    script = find_benchmarks()
    extra = list(args.args)
    if extra and extra[0] == "--":
        extra = extra[1:]
    cmd = [sys.executable, str(script)] + ([] if args.full else ["--quick"]) + extra
    logconf.logger.debug("running %s", " ".join(cmd))
    return subprocess.call(cmd, cwd=script.parent.parent)


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def cmd_cache(args) -> int:
    """``polyad cache info|clear``."""
    directory = toolchain.cache_dir()
    origin = "$POLYAD_CACHE_DIR" if os.environ.get("POLYAD_CACHE_DIR") else "default"
    if args.action == "info":
        files = toolchain.cache_files()
        libs = [f for f in files if f.suffix == ".so" and not f.name.startswith(".")]
        size = sum(f.stat().st_size for f in files)
        print(f"cache directory: {directory} ({origin})")
        print(f"compiled kernels: {len(libs)}")
        for suffix, what in toolchain.CACHE_LEVELS.items():
            level = [f for f in files if f.suffix == suffix and not f.name.startswith(".")]
            print(f"  {what}: {len(level)}, {_mib(sum(f.stat().st_size for f in level))}")
        print(f"files: {len(files)}, {_mib(size)}")
    else:
        count, size = toolchain.clear_cache()
        print(f"removed {count} file(s), {_mib(size)}, from {directory}")
    return 0


# --------------------------------------------------------------------------
# argument parsing
# --------------------------------------------------------------------------


def _add_kernel_options(p: argparse.ArgumentParser) -> None:
    derived = p.add_mutually_exclusive_group()
    derived.add_argument("--grad", nargs="+", metavar="NAME",
                         help="use the gradient of the (scalar) kernel with respect to NAME ...")
    derived.add_argument("--vjp", nargs="+", metavar="NAME",
                         help="use the vector-Jacobian product with respect to NAME ...")
    derived.add_argument("--jvp", nargs="+", metavar="NAME",
                         help="use the forward-mode derivative with respect to NAME ...")
    derived.add_argument("--adjoint", nargs="+", metavar="NAME",
                         help="use the transpose of the kernel, linear in NAME ...")
    derived.add_argument("--hvp", nargs="+", metavar="NAME",
                         help="use the Hessian-vector product of the (scalar) kernel with "
                              "respect to NAME ...")
    p.add_argument("--target", default="openmp", metavar="TARGET",
                   help="code generator: openmp (default), cuda (CUDA C for nvcc) or cuda-sim "
                        "(the same CUDA C, run on the CPU)")
    p.add_argument("--sizes", nargs="+", metavar="MACRO=NAME",
                   help="C files: keep #define MACRO symbolic as size NAME (pa.from_c's sizes=)")
    p.add_argument("--deterministic", action="store_true",
                   help="the schedule of pa.compile(k, deterministic=True): no parallel form "
                        "that reorders floating-point sums")


def make_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``polyad`` command."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="log compiler command lines and cache hits (as POLYAD_LOG=debug)")
    parser = argparse.ArgumentParser(
        prog="polyad", parents=[common],
        description="Compile, differentiate, inspect and emit polyad kernels.",
        epilog="Exit status: 0 success, 1 error in the kernel or toolchain, 2 usage error.")
    parser.add_argument("--version", action="version", version=f"polyad {build.POLYAD_VERSION}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    show = sub.add_parser("show", parents=[common], help="report how a kernel is compiled",
                          description="Print pa.explain's report of one kernel: statements, "
                                      "domains, accesses, dependences, schedule, loop "
                                      "decisions, generated source.")
    show.add_argument("kernel", metavar="FILE.py:KERNEL",
                      help="a Python file and the module-level name of a @pa.kernel in it, "
                           "or FILE.c:FUNCTION")
    _add_kernel_options(show)
    show.add_argument("--format", choices=report.FORMATS, default="text",
                      help="text (default), json, or dot (dependence graph for Graphviz)")
    show.set_defaults(func=cmd_show, parser=show)

    emit = sub.add_parser("emit", parents=[common], help="write .c and .h files for a C build",
                          description="Write NAME.c and a documented NAME.h per kernel.")
    emit.add_argument("kernel", metavar="FILE.py[:KERNEL]",
                      help="a Python file and a @pa.kernel in it, or FILE.c:FUNCTION (only the "
                           "file with --all)")
    emit.add_argument("--all", action="store_true",
                      help="emit every kernel of FILE.py (every non-static function of FILE.c)")
    emit.add_argument("-o", "--output", required=True, metavar="DIR",
                      help="directory for the files (created if needed)")
    emit.add_argument("-q", "--quiet", action="store_true", help="no progress display")
    _add_kernel_options(emit)
    emit.set_defaults(func=cmd_emit, parser=emit)

    demo = sub.add_parser("demo", parents=[common],
                          help="compile, check and time the TV cost kernel")
    demo.add_argument("--size", type=int, default=1024, help="image side (default 1024)")
    demo.set_defaults(func=cmd_demo, parser=demo)

    bench = sub.add_parser("bench", parents=[common], help="run the benchmark suite (quick mode)")
    bench.add_argument("--full", action="store_true", help="the full suite, not --quick")
    bench.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS",
                       help="passed on to benchmarks/run.py")
    bench.set_defaults(func=cmd_bench, parser=bench)

    cache = sub.add_parser("cache", parents=[common], help="inspect or clear the compile cache")
    cache.add_argument("action", choices=("info", "clear"))
    cache.set_defaults(func=cmd_cache, parser=cache)
    return parser


def main(argv=None) -> int:
    """Run the command line; returns the exit status (argparse usage errors exit 2)."""
    parser = make_parser()
    args = parser.parse_args(argv)
    if getattr(args, "verbose", False):
        logconf.enable("debug")
    try:
        return args.func(args)
    except UsageError as exc:
        args.parser.print_usage(sys.stderr)
        print(f"polyad {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except DSLError as exc:
        print(exc, file=sys.stderr)
        return EXIT_ERROR
    except (PolyadError, ValueError, OSError) as exc:
        print(f"polyad {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
