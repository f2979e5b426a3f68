"""The one public error hierarchy of polyad.

Every error says what went wrong, where (the DSL source line when there is
one) and how to fix it.
"""

from __future__ import annotations


class PolyadError(Exception):
    """Base class of every error polyad raises on purpose."""


class DSLError(PolyadError):
    """A construct of the kernel's source that polyad cannot compile.

    Attributes: ``filename``, ``line``, ``col`` (both 1-based, as editors and
    compilers count; ``col`` is 0 when only the line is known) and ``hint`` (how
    to fix it, may be empty). ``str(err)`` reads ``FILE:LINE:COL: message``
    (``FILE:LINE: message`` without a column) followed by the hint.
    """

    def __init__(self, message: str, filename: str = "<unknown>", line: int = 0,
                 col: int = 0, hint: str = ""):
        self.message = message
        self.filename = filename
        self.line = line
        self.col = col
        self.hint = hint
        text = f"{filename}:{line}:{col}: {message}" if col else f"{filename}:{line}: {message}"
        if hint:
            text += f"\n  hint: {hint}"
        super().__init__(text)


def user_location() -> tuple[str, int]:
    """File and line of the innermost caller outside the polyad package (where the user
    wrote the construct being checked), for errors raised while Python evaluates it."""
    import os
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    frame = sys._getframe(1)
    while frame is not None and (frame.f_code.co_filename == "<string>" or  # dataclass __init__
                                 os.path.abspath(frame.f_code.co_filename).startswith(here)):
        frame = frame.f_back
    if frame is None:
        return "<unknown>", 0
    return frame.f_code.co_filename, frame.f_lineno


class TypeSpecError(DSLError, AttributeError, TypeError):
    """A malformed type annotation (``pa.f64[N * N]``, ``pa.f64[N].reflect``, ``pa.Out(pa.f64)``).

    Raised while Python evaluates the annotation, so it is also an
    ``AttributeError``/``TypeError`` where Python code expects one of those."""

    def __init__(self, message: str, hint: str = ""):
        filename, line = user_location()
        super().__init__(message, filename, line, 0, hint)


class BoundsError(DSLError):
    """An access to an array without boundary mode may fall outside the array."""


class NotDifferentiableError(DSLError):
    """The kernel cannot be differentiated as asked (active index, integer wrt, ...)."""


class ArgumentError(PolyadError, ValueError):
    """A kernel was called with arguments that do not fit its signature."""


class ShapeError(ArgumentError):
    """Wrong ndim, shapes inconsistent with the size symbols, bad layout or aliasing."""


class DTypeError(ArgumentError, TypeError):
    """An argument has the wrong type or dtype (polyad never converts silently)."""


class CompileError(PolyadError):
    """Building or loading the generated code failed: the C compiler is missing or failed
    (its message and the source path are in the text), a sanitized kernel cannot be
    loaded into this process, or ISL could not generate a kernel's loops within its
    operation quota (the kernel's source line is in the text)."""


class TilingError(PolyadError):
    """A kernel cannot be run tile by tile as its arguments are cut (``polyad.dask``)."""


class InternalError(PolyadError, RuntimeError):
    """A bug in polyad: a stage failed on a kernel it had accepted.

    Says which stage, which kernel and, when the failure happened while a DSL
    statement was being processed, which statement and source line; the
    original exception is chained (``__cause__``). Attributes: ``stage``,
    ``kernel``, ``filename``, ``line`` (the statement's line, else the
    kernel's) and ``statement`` (its name, or None).
    """

    def __init__(self, stage: str, kernel: str, filename: str, line: int,
                 statement: str | None, source: str, cause: BaseException):
        self.stage = stage
        self.kernel = kernel
        self.filename = filename
        self.line = line
        self.statement = statement
        where = f"{filename}:{line}: "
        what = f"statement {statement} ({source}) of kernel {kernel!r}" if statement \
            else f"kernel {kernel!r}"
        super().__init__(
            f"{where}internal error in polyad while {stage} {what}: "
            f"{type(cause).__name__}: {cause}\n"
            "  hint: this is a bug in polyad, not in your kernel; please report it with the "
            "kernel's source (the traceback above the error shows where it failed)")


class NotLinearError(DSLError):
    """A kernel is not linear in the parameters an adjoint or linear operator needs it
    linear in; names the statement (and its DSL line) that breaks linearity."""


class DeviceError(PolyadError):
    """No usable CUDA device, or a CUDA call failed; the message carries CUDA's own."""


class MemoryBudgetError(PolyadError, MemoryError):
    """A call's temporaries (a derived kernel's tapes) would exceed the memory budget
    (``memory=`` of ``pa.grad`` & co., ``POLYAD_MEMORY_BUDGET``); names each tape, the
    statement whose values it holds and its size as a formula of the sizes."""
