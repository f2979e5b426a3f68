"""polyad: compile and differentiate loop programs written in a small Python DSL.

See README.md and DESIGN.md for the user guide; the public API is what this
module exports.
"""

from .api import Func, Kernel, compile, empty, from_c, func, kernel, sizes, zeros  # noqa: F401
from .derivatives import (adjoint, check_grad, custom_vjp, derivative, grad,  # noqa: F401
                          hessian, hvp, is_affine, is_linear, jvp, value_and_grad, vjp)
from .errors import (ArgumentError, BoundsError, CompileError, DSLError, DTypeError,  # noqa: F401
                     NotDifferentiableError, NotLinearError, PolyadError, ShapeError,
                     TilingError)
from .intrinsics import INTRINSICS as _INTRINSICS
from .ir import Out, f32, f64, i32, i64  # noqa: F401
from .logconf import configure_from_env as _configure_logging
from .report import explain  # noqa: F401
from . import solvers  # noqa: F401,E402
from .solvers import linear_operator  # noqa: F401,E402

globals().update(_INTRINSICS)  # pa.exp, pa.log, ... (abs/min/max shadow nothing in user code)

__version__ = "0.1.0"

_configure_logging()  # POLYAD_LOG=debug|info|warning|error
