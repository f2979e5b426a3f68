"""polyad: compile and differentiate loop programs written in a small Python DSL.

See README.md and DESIGN.md for the user guide; the public API is what this
module exports.
"""

from .api import Func, Kernel, compile, empty, func, kernel, sizes, zeros  # noqa: F401
from .errors import (ArgumentError, BoundsError, CompileError, DSLError, DTypeError,  # noqa: F401
                     NotDifferentiableError, PolyadError, ShapeError)
from .intrinsics import INTRINSICS as _INTRINSICS
from .ir import Out, f32, f64, i32, i64  # noqa: F401

globals().update(_INTRINSICS)  # pa.exp, pa.log, ... (abs/min/max shadow nothing in user code)

__version__ = "0.1.0"
