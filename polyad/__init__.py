"""polyad: compile and differentiate loop programs written in a small Python DSL.

See README.md and DESIGN.md for the user guide; the public API is what this
module exports.
"""

from .api import Func, Kernel, compile, empty, from_c, func, kernel, sizes, zeros  # noqa: F401
from .derivatives import (check_grad, custom_vjp, derivative, grad, value_and_grad,  # noqa: F401
                          vjp)
from .errors import (ArgumentError, BoundsError, CompileError, DeviceError, DSLError,  # noqa: F401
                     DTypeError, NotDifferentiableError, PolyadError, ShapeError, TilingError)
from .intrinsics import INTRINSICS as _INTRINSICS
from .ir import Out, f32, f64, i32, i64  # noqa: F401
from .logconf import configure_from_env as _configure_logging
from .report import explain  # noqa: F401

globals().update(_INTRINSICS)  # pa.exp, pa.log, ... (abs/min/max shadow nothing in user code)

__version__ = "0.1.0"

_configure_logging()  # POLYAD_LOG=debug|info|warning|error
