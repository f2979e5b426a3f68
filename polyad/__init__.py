"""polyad: compile and differentiate loop programs written in a small Python DSL.

Write a kernel with ``@pa.kernel`` (sizes from ``pa.sizes``, types ``pa.f64``
& co.), call it on numpy arrays, differentiate it with ``pa.grad`` /
``pa.value_and_grad`` / ``pa.vjp``, inspect it with ``pa.explain``. The
public API is what ``dir(polyad)`` lists; the bridges ``polyad.torch`` and
``polyad.jax`` are imported on their own (``import polyad.torch``).

Documentation: ``docs/`` in the source distribution and repository
(``docs/tutorial.md``, ``docs/api.md``, ``docs/dsl.md``,
``docs/architecture.md``); ``help(pa.kernel)`` and friends for each function.
"""

from .api import Func, Kernel, compile, empty, from_c, func, kernel, sizes, zeros  # noqa: F401
from .derivatives import (adjoint, check_grad, custom_vjp, derivative, grad,  # noqa: F401
                          hessian, hvp, is_affine, is_linear, jvp, value_and_grad, vjp)
from .errors import (ArgumentError, BoundsError, CompileError, DeviceError, DSLError,  # noqa: F401
                     DTypeError, InternalError, MemoryBudgetError, NotDifferentiableError,
                     NotLinearError, PolyadError, ShapeError, TilingError)
from .intrinsics import INTRINSICS as _INTRINSICS
from .ir import Out, f32, f64, i32, i64  # noqa: F401
from .logconf import configure_from_env as _configure_logging
from .report import explain  # noqa: F401
from .runtime.threads import num_threads  # noqa: F401
from .version import __version__  # noqa: F401
from . import solvers  # noqa: F401,E402
from .solvers import linear_operator  # noqa: F401,E402

globals().update(_INTRINSICS)  # pa.exp, pa.log, ... (abs/min/max shadow nothing in user code)

__all__ = sorted([
    "kernel", "func", "from_c", "sizes", "compile", "zeros", "empty", "Kernel", "Func",
    "f32", "f64", "i32", "i64", "Out",
    "grad", "value_and_grad", "vjp", "jvp", "hvp", "hessian", "adjoint", "is_linear",
    "is_affine", "check_grad", "derivative", "custom_vjp", "linear_operator", "solvers",
    "explain", "num_threads",
    "PolyadError", "DSLError", "BoundsError", "NotDifferentiableError", "NotLinearError",
    "ArgumentError",
    "ShapeError", "DTypeError", "CompileError", "DeviceError", "TilingError", "InternalError",
    "MemoryBudgetError",
    *_INTRINSICS,
])


def __dir__():
    """The public API only: submodules (``polyad.api``, ``polyad.ir``, ...) stay importable
    but do not clutter ``pa.<TAB>``."""
    return __all__ + ["__version__"]


_configure_logging()  # POLYAD_LOG=debug|info|warning|error
