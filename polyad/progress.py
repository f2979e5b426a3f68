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


# A compile that has run this long gets a progress line on a terminal.
LONG_COMPILE_S = 2.0


class StageClock:
    """Times the stages of one kernel's compilation (``with clock.stage("ast", n): ...``).

    Every stage's time is logged at INFO level (``POLYAD_LOG=info``). On a
    terminal, once the compilation has run ``LONG_COMPILE_S`` seconds, a line
    ``polyad: compiling NAME: STAGE (N statements, 3.2 s)`` is shown and
    rewritten at each later stage, then closed with the total time, so a long
    compile never looks like a hang.
    """

    def __init__(self, kernel_name: str, stream: Optional[TextIO] = None):
        self.kernel_name = kernel_name
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.start = time.perf_counter()
        self.times: dict[str, float] = {}
        self._shown = False

    @contextlib.contextmanager
    def stage(self, name: str, statements: Optional[int] = None) -> Iterator[None]:
        elapsed = time.perf_counter() - self.start
        if self.tty and elapsed >= LONG_COMPILE_S:
            count = f"{statements} statements, " if statements is not None else ""
            self.stream.write(f"\rpolyad: compiling {self.kernel_name}: {name} "
                              f"({count}{elapsed:.1f} s)\x1b[K")
            self.stream.flush()
            self._shown = True
        t = time.perf_counter()
        yield
        dt = time.perf_counter() - t
        self.times[name] = self.times.get(name, 0.0) + dt
        logger.info("compile %s: %s %.3f s", self.kernel_name, name, dt)

    def close(self) -> None:
        total = time.perf_counter() - self.start
        logger.info("compile %s: %.3f s (%s)", self.kernel_name, total,
                    ", ".join(f"{k} {v:.2f}" for k, v in self.times.items()))
        if self._shown:
            self.stream.write(f"\rpolyad: compiled {self.kernel_name} in {total:.1f} s\x1b[K\n")
            self.stream.flush()
