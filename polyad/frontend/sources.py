"""Where a kernel's source text comes from, when it is not a ``.py`` file.

``inspect`` finds the source of functions defined in files, and of those the
interpreter registered in ``linecache`` (IPython and Jupyter cells, the
Python 3.13 REPL). This module adds the other places a user defines kernels:

* ``python -c "..."``: the command text is ``sys.orig_argv``'s argument after
  ``-c``; it is registered in ``linecache`` under ``<string>``;
* source text given directly (``pa.kernel(source=...)``), also for code run
  by ``exec`` or read from stdin: ``function_from_source`` registers the text
  in ``linecache`` under a name of its own, compiles and runs it, and returns
  the function it defines; errors carry line numbers within that text.

Anything else (the pre-3.13 REPL, ``exec`` of a plain string) has no source
to find; the error says to pass ``source=``.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import linecache
import sys
import textwrap
import types
from typing import Optional

from ..errors import DSLError

_SOURCE_NAMES = itertools.count(1)


def source_lines(fn) -> tuple[list[str], int]:
    """``inspect.getsourcelines(fn)``, also for functions defined by ``python -c``;
    raises DSLError saying how to pass the source when there is none."""
    try:
        return inspect.getsourcelines(fn)
    except (OSError, TypeError) as exc:
        reason = exc
    filename = getattr(getattr(fn, "__code__", None), "co_filename", "<unknown>")
    if filename == "<string>" and _register_command_line():
        try:
            lines, start = inspect.getsourcelines(fn)
        except (OSError, TypeError):
            pass
        else:
            if _defines(lines, fn.__name__):
                return lines, start
    name = getattr(fn, "__name__", fn)
    raise DSLError(f"cannot read the source of {name!r}: {reason}", filename,
                   getattr(getattr(fn, "__code__", None), "co_firstlineno", 0), 0,
                   hint="the interpreter kept no source text for it (the plain REPL, exec of a "
                        "string): pass the text instead, pa.kernel(source=text) or "
                        "pa.func(source=text), or define it in a .py file")


def _register_command_line() -> bool:
    """Register the ``python -c`` command in ``linecache`` as ``<string>``."""
    argv = getattr(sys, "orig_argv", [])
    if "-c" not in argv[:-1]:
        return False
    if "<string>" not in linecache.cache:
        text = argv[argv.index("-c") + 1]
        linecache.cache["<string>"] = (len(text), None, text.splitlines(True), "<string>")
    return True


def _defines(lines: list[str], name: str) -> bool:
    """Whether ``lines`` (what inspect found) define function ``name`` (``<string>`` is
    also the file name of every ``exec``: the command line may be the wrong text)."""
    try:
        node = ast.parse(textwrap.dedent("".join(lines))).body[0]
    except (SyntaxError, IndexError):
        return False
    return isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name


def function_from_source(source: str, name: Optional[str], namespace: dict, what: str):
    """Run ``source`` (text defining one or more functions) in a copy of ``namespace``
    and return the function called ``name`` (or the only one defined).

    The text is registered in ``linecache`` under ``<polyad-source-N>``, so
    ``inspect`` and tracebacks find it and errors give lines within it.
    """
    if not isinstance(source, str):
        raise TypeError(f"{what}(source=...) takes the source text as a str, got "
                        f"{type(source).__name__}")
    text = textwrap.dedent(source)
    filename = f"<polyad-source-{next(_SOURCE_NAMES)}>"
    linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
    try:
        code = compile(text, filename, "exec")
    except SyntaxError as exc:
        raise DSLError(f"the source is not valid Python: {exc.msg}", filename, exc.lineno or 0,
                       exc.offset or 1, hint="fix the syntax of the text passed as source=")
    ns = dict(namespace)
    exec(code, ns)
    found = {k: v for k, v in ns.items() if _defined_in(v, filename)}
    if name is not None:
        if name not in found:
            raise DSLError(f"the source defines no function {name!r} (it defines "
                           f"{sorted(found) or 'none'})", filename, 1, 1,
                           hint=f"pass name= one of {sorted(found)}" if found else
                           "the text must contain a 'def'")
        return found[name]
    if len(found) != 1:
        raise DSLError(f"the source defines {len(found)} functions "
                       f"({', '.join(sorted(found)) or 'none'}); {what}(source=...) needs one",
                       filename, 1, 1, hint="pass name= to choose one" if found else
                       "the text must contain a 'def'")
    return next(iter(found.values()))


def _defined_in(value, filename: str) -> bool:
    fn = getattr(value, "__wrapped__", value)
    return isinstance(fn, types.FunctionType) and fn.__code__.co_filename == filename
