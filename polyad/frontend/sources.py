"""Where a kernel's source text comes from, when it is not a ``.py`` file.

``inspect`` finds the source of functions defined in files, and of those the
interpreter registered in ``linecache`` (IPython and Jupyter cells, the
Python 3.13 REPL). This module adds the other places a user defines kernels:

* ``python -c "..."``: the command text is ``sys.orig_argv``'s argument after
  ``-c``; it is registered in ``linecache`` under ``<string>``;
* the plain interactive prompt (``<stdin>``, before Python 3.13): the lines
  typed are in readline's history; lines count from the statement's first
  line, as the interpreter's own tracebacks do;
* source text given directly (``pa.kernel(source=...)``), also for code run
  by ``exec`` or read from stdin: ``function_from_source`` registers the text
  in ``linecache`` under a name of its own, compiles and runs it, and returns
  the function it defines; errors carry line numbers within that text.

Anything else (``exec`` of a plain string, a script piped to stdin, a prompt
without readline) has no source to find; the error says to pass ``source=``.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import linecache
import re
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
    if filename == "<stdin>" and hasattr(sys, "ps1"):
        found = _from_interactive_history(fn)
        if found is not None:
            return found
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
                   hint="the interpreter kept no source text for it (exec of a string, a script "
                        "piped to stdin): pass the text instead, pa.kernel(source=text) or "
                        "pa.func(source=text), or define it in a .py file")


def _from_interactive_history(fn) -> Optional[tuple[list[str], int]]:
    """The source of ``fn`` typed at the plain interactive prompt, from readline's history.

    The prompt compiles each statement on its own, so line 1 is the statement's
    first line (the first decorator): the lines found count from there, as
    the interpreter's own tracebacks for ``<stdin>`` do.
    """
    try:
        import readline
    except ImportError:
        return None
    history = [readline.get_history_item(i)
               for i in range(1, readline.get_current_history_length() + 1)]
    header = re.compile(rf"\s*(async\s+)?def\s+{re.escape(fn.__name__)}\s*\(")
    for start in range(len(history) - 1, -1, -1):
        if history[start] and header.match(history[start]):
            break
    else:
        return None
    end = start + 1
    base = len(history[start]) - len(history[start].lstrip())
    while end < len(history) and history[end] and \
            len(history[end]) - len(history[end].lstrip()) > base:
        end += 1
    while start > 0 and history[start - 1] and history[start - 1].lstrip().startswith("@"):
        start -= 1
    lines = [line + "\n" for line in history[start:end]]
    first = fn.__code__.co_firstlineno
    if not _defines(lines, fn.__name__) or first > len(lines):
        return None
    return lines[first - 1:], first


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
