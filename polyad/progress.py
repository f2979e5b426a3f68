"""A progress display for compiling many kernels at once (``emit --all``, the build step).

On a terminal the current line is rewritten (``[3/12] tv_cost_grad_g ...``);
otherwise (logs, CI) one line per finished kernel is printed. Every step is
also logged at INFO level through the ``polyad`` logger.
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Iterator, Optional, TextIO

from .logconf import logger


class Progress:
    """Counts ``total`` work items labelled ``what`` (e.g. "compiling") on ``stream``.

    ``enabled=None`` shows the display when there are at least two items.
    Use ``with progress.step(name): ...`` per item and ``progress.close()`` at
    the end (or use the Progress itself as a context manager).
    """

    def __init__(self, total: int, what: str, stream: Optional[TextIO] = None,
                 enabled: Optional[bool] = None):
        self.total = total
        self.what = what
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = total >= 2 if enabled is None else enabled
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.done = 0
        self.start = time.perf_counter()
        self._width = 0

    def _write(self, text: str, final: bool) -> None:
        if not self.enabled:
            return
        if self.tty:
            pad = max(0, self._width - len(text))
            self.stream.write("\r" + text + " " * pad + ("\n" if final else ""))
            self._width = 0 if final else len(text)
        elif final:
            self.stream.write(text + "\n")
        self.stream.flush()

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        """Show ``name`` as the item in progress; on success count it as done."""
        k = self.done + 1
        self._write(f"[{k}/{self.total}] {self.what} {name} ...", final=False)
        t = time.perf_counter()
        yield
        dt = time.perf_counter() - t
        self.done = k
        logger.info("%s %s (%d/%d) in %.2f s", self.what, name, k, self.total, dt)
        if not self.tty:
            self._write(f"[{k}/{self.total}] {self.what} {name} ({dt:.2f} s)", final=True)

    def close(self, failed: bool = False) -> None:
        """End the display: a summary line, or (``failed``) just end the progress line."""
        if not self.tty or not (self.done or self._width):
            return
        if failed:
            self._write(f"[{self.done}/{self.total}] {self.what}: stopped", final=True)
        else:
            self._write(f"{self.what} {self.done} kernel(s): done in "
                        f"{time.perf_counter() - self.start:.2f} s", final=True)

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(failed=exc_type is not None)
