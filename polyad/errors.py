"""The one public error hierarchy of polyad.

Every error says what went wrong, where (the DSL source line when there is
one) and how to fix it.
"""

from __future__ import annotations


class PolyadError(Exception):
    """Base class of every error polyad raises on purpose."""


class DSLError(PolyadError):
    """A construct of the kernel's source that polyad cannot compile.

    Attributes: ``filename``, ``line``, ``col`` (1-based line, 0-based column
    as in Python's ``ast``) and ``hint`` (how to fix it, may be empty).
    ``str(err)`` reads ``FILE:LINE:COL: message`` followed by the hint.
    """

    def __init__(self, message: str, filename: str = "<unknown>", line: int = 0,
                 col: int = 0, hint: str = ""):
        self.message = message
        self.filename = filename
        self.line = line
        self.col = col
        self.hint = hint
        text = f"{filename}:{line}:{col}: {message}"
        if hint:
            text += f"\n  hint: {hint}"
        super().__init__(text)


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
    """The C compiler failed on generated code; carries its message and the source path."""


class TilingError(PolyadError):
    """A kernel cannot be run tile by tile as its arguments are cut (``polyad.dask``)."""


class DeviceError(PolyadError):
    """No usable CUDA device, or a CUDA call failed; the message carries CUDA's own."""
