"""Logging for polyad: the standard ``logging`` module, logger ``"polyad"``.

polyad logs compiler command lines and cache hits at DEBUG level, compile
times at INFO. Applications configure it as any other library's logger; for
quick use, the environment variable ``POLYAD_LOG`` (``debug``, ``info``,
``warning`` or ``error``) installs a stderr handler when polyad is imported,
and the command line's ``-v`` does the same at DEBUG level.
"""

from __future__ import annotations

import logging
import os
import sys

logger = logging.getLogger("polyad")

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
          "error": logging.ERROR}


class _StderrHandler(logging.StreamHandler):
    """The handler ``POLYAD_LOG`` / ``-v`` install (one at most; writes to the current stderr)."""

    def __init__(self):
        super().__init__()
        self.setFormatter(logging.Formatter("polyad %(levelname)s: %(message)s"))

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        pass  # always the current sys.stderr (pytest and the CLI replace it)


def enable(level: int | str = logging.DEBUG) -> None:
    """Send polyad's log records of ``level`` and above to stderr (idempotent)."""
    if isinstance(level, str):
        level = LEVELS[level.lower()]
    logger.setLevel(level)
    if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
        logger.addHandler(_StderrHandler())


def configure_from_env() -> None:
    """Apply ``POLYAD_LOG`` if it is set (called when polyad is imported)."""
    value = os.environ.get("POLYAD_LOG", "").strip()
    if not value:
        return
    if value.lower() not in LEVELS:
        print(f"polyad: ignoring POLYAD_LOG={value!r}; use one of {', '.join(LEVELS)}",
              file=sys.stderr)
        return
    enable(value)
