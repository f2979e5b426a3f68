"""Automatic differentiation of polyad kernels, on the IR only (IR in, new IR out).

Entry points (each returns an ordinary ``ir.Kernel`` that ``polyad.testing.interpret``
runs and the compiler compiles; it can be differentiated again):

``grad_kernel(k, wrt)``
    ``k`` must return a scalar. Parameters: ``k``'s inputs (its ``in`` and
    in-out parameters, in order, all read-only), then one ``pa.Out``
    parameter ``d_<name>`` per ``wrt`` parameter:

    * for an array ``x``: ``d_x`` has ``x``'s type *including its boundary
      mode* - the adjoint of a read ``x[i - 1]`` is the write
      ``d_x[i - 1] += ...`` through the same mode, which lands on the element
      the read touched (clamped/mirror/circular borders accumulate several
      contributions; zero-mode writes outside are dropped);
    * for a float scalar ``lam``: ``d_lam`` is an array of shape ``[1]``
      (kernels return at most one scalar); the user API unwraps it to a float.

    The primal's ``pa.Out`` arrays become zero-initialised temporaries. The
    derived kernel returns nothing and zeroes its own outputs.

``value_and_grad_kernel(k, wrt)``
    The same parameters; the kernel also returns ``k``'s scalar value.

``vjp_kernel(k, wrt)``
    Parameters: ``k``'s inputs, then a cotangent ``<out>_bar`` (same shape
    and dtype, no boundary mode) for every output array of ``k`` (``pa.Out``
    and in-out arrays, in parameter order), then ``result_bar`` (a scalar)
    when ``k`` returns a scalar, then the ``pa.Out`` parameters ``d_<wrt>``
    as above. It computes ``d_w = sum_o (d o / d w)^T o_bar``.

In-out arrays: the derived kernel never modifies its inputs. An in-out array
``x`` is copied into a temporary ``x_work`` on entry and the primal statements
work on the copy; ``d_x`` is the derivative with respect to ``x``'s value on
entry, and in ``vjp`` ``x_bar`` is the cotangent of its value on exit.

``jvp_kernel(k, wrt)`` / ``forward_grad_kernel(k, wrt)`` / ``hvp_kernel(k, wrt)``
    Forward mode (tangent statements beside the primal ones); see
    ``polyad.ad.forward`` for their parameters.

``adjoint_kernel(k, wrt)``
    The transpose of a kernel linear in ``wrt`` (``polyad.ad.linearity``, which
    also has the conservative ``is_linear`` / ``is_affine`` checks).

``wrt`` is a parameter name, a list of names, or a dict ``label -> name``
(the kernel is the same; the user API returns a dict).

Primal values the adjoint needs are read directly, recomputed, or taped
(``polyad.ad.tape``); only array values a later write overwrites are taped
(``polyad.ad.recorded``, ISL; ``reverse.recorded_reads(k, wrt)`` lists every
decision, ``exact_tapes=False`` turns the analysis off); ``tape_bytes(k, sizes)`` reports the tape memory of a
derived kernel and ``tape_report(k, sizes)`` lists its tapes (for ``pa.explain``). Derivatives of device functions are new device functions
``<f>_d_<param>`` (``polyad.ad.funcs``); intrinsic rules are in
``polyad.ad.rules``. Naming: derived kernels are called
``<kernel>_grad_<wrt...>`` (``_value_and_grad_``, ``_vjp_``); their internal
adjoints ``d_<var>``, self-update temporaries ``t_<stmt>``, tapes
``tape_<stmt>_<var>``.
"""

from .forward import forward_grad_kernel, hvp_kernel, jvp_kernel  # noqa: F401
from .linearity import adjoint_kernel, check_linear, is_affine, is_linear  # noqa: F401
from .reverse import (NoGradientPathWarning, check_wrt, grad_kernel, value_and_grad_kernel,  # noqa: F401
                      vjp_kernel)
from .tape import tape_arrays, tape_bytes, tape_report  # noqa: F401

__all__ = ["jvp_kernel", "forward_grad_kernel", "hvp_kernel", "adjoint_kernel", "is_linear", "is_affine",
           "check_linear", "grad_kernel", "value_and_grad_kernel", "vjp_kernel", "check_wrt", "tape_bytes",
           "tape_arrays", "tape_report", "NoGradientPathWarning"]
