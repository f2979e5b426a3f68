"""Tracebacks of polyad errors without polyad's internal frames (as JAX does).

A ``DSLError`` raised while parsing a kernel passes through a dozen frames
of the frontend, the scheduler or the loader; none of them helps the user,
whose own call and the DSL line in the message say what and where. Public
entry points raise ``PolyadError``\\s with those frames removed and a note
saying so. ``POLYAD_TRACEBACK_FILTERING=off`` (read at every error) keeps
every frame, for debugging polyad itself.
"""

from __future__ import annotations

import functools
import os

from .errors import PolyadError

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_NOTE = ("(polyad removed its internal frames from this traceback; set "
         "POLYAD_TRACEBACK_FILTERING=off to see them)")


def filtering_enabled() -> bool:
    """Whether tracebacks are filtered (``$POLYAD_TRACEBACK_FILTERING`` is not ``off``)."""
    value = os.environ.get("POLYAD_TRACEBACK_FILTERING", "on").strip().lower()
    return value not in ("off", "0", "false", "no")


def is_internal(filename: str) -> bool:
    """Whether a frame's file belongs to the polyad package."""
    return os.path.abspath(filename).startswith(_PACKAGE_DIR)


def filtered(exc: PolyadError) -> PolyadError:
    """``exc`` with polyad's frames removed from its traceback (when filtering is on)."""
    if not filtering_enabled():
        return exc
    kept = []
    tb = exc.__traceback__
    while tb is not None:
        if not is_internal(tb.tb_frame.f_code.co_filename):
            kept.append(tb)
        tb = tb.tb_next
    new_tb = None
    for tb in reversed(kept):
        new_tb = type(tb)(new_tb, tb.tb_frame, tb.tb_lasti, tb.tb_lineno)
    if _NOTE not in getattr(exc, "__notes__", ()) and hasattr(exc, "add_note"):
        exc.add_note(_NOTE)
    return exc.with_traceback(new_tb)


def user_facing(fn):
    """Decorator for public entry points: PolyadErrors leave with filtered tracebacks."""
    @functools.wraps(fn)
    def entry_point(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except PolyadError as exc:
            raise filtered(exc) from exc.__cause__
    return entry_point
