"""The same costs in JAX (``jit(grad)``) and PyTorch (autograd), on CPU, when installed.

Each framework is optional: :func:`jax_available` / :func:`torch_available`
say whether it imports (and why not).  Builders return ``(fwd, grad)``
closures on numpy inputs converted once; ``fwd()`` returns the cost as a
Python float after the computation finished, ``grad()`` the gradient wrt
the benchmark's parameter as a numpy array (conversion to numpy is not
timed separately: for JAX it is a zero-copy view after
``block_until_ready``; for PyTorch ``.numpy()`` is a view too).

Written the way a user of each framework writes them: edge padding
(``jnp.pad(mode="edge")`` / ``F.pad(mode="replicate")``) for clamped
borders, the library convolution (``lax.conv_general_dilated`` /
``F.conv2d``) for the conv layer.
"""

from __future__ import annotations

import os

_jax = None
_jax_error = None
_torch = None
_torch_error = None


# ---------------------------------------------------------------------------
# JAX
# ---------------------------------------------------------------------------

def jax_available(x64: bool = True):
    """(True, version) or (False, reason).  Enables float64 when ``x64``."""
    global _jax, _jax_error
    if _jax is None and _jax_error is None:
        try:
            import jax
            if x64:
                jax.config.update("jax_enable_x64", True)
            import jax.numpy  # noqa: F401
            import jax.lax  # noqa: F401
            _jax = jax
        except Exception as exc:  # ImportError, or a broken install
            _jax_error = f"{type(exc).__name__}: {exc}".splitlines()[0][:60]
    if _jax is None:
        return False, _jax_error
    return True, _jax.__version__


def _jax_costs():
    jax = _jax
    jnp = jax.numpy
    lax = jax.lax

    def tv(g, b, lam):
        gl = jnp.pad(g, ((0, 0), (1, 0)), mode="edge")[:, :-1]
        gu = jnp.pad(g, ((1, 0), (0, 0)), mode="edge")[:-1, :]
        return (jnp.sum((g - b) ** 2) + lam * jnp.sum(jnp.abs(gl - g))
                + lam * jnp.sum(jnp.abs(gu - g)))

    def deconv(x, f, y):
        M, N = x.shape
        xp = jnp.pad(x, ((0, 0), (2, 2)), mode="edge")
        t = sum(f[k] * xp[:, k:k + N] for k in range(5))
        tp = jnp.pad(t, ((2, 2), (0, 0)), mode="edge")
        r = sum(f[k] * tp[k:k + M] for k in range(5)) - y
        return jnp.sum(r * r)

    def conv(x, w, y):
        z = lax.conv_general_dilated(x, w, (1, 1), ((1, 1), (1, 1)),
                                     dimension_numbers=("NCHW", "OIHW", "NCHW"))
        r = jnp.maximum(z, 0) - y
        return jnp.sum(r * r)

    def stencil3d(x, y):
        xp = jnp.pad(x, 1, mode="edge")
        c = xp[1:-1, 1:-1, 1:-1]
        lap = (6 * c - xp[:-2, 1:-1, 1:-1] - xp[2:, 1:-1, 1:-1] - xp[1:-1, :-2, 1:-1]
               - xp[1:-1, 2:, 1:-1] - xp[1:-1, 1:-1, :-2] - xp[1:-1, 1:-1, 2:])
        r = lap - y
        return jnp.sum(r * r)

    return {"tv_cost": tv, "deconv_cost": deconv, "conv_cost": conv, "stencil3d_cost": stencil3d}


_jax_jitted: dict = {}


def make_jax(kernel: str, inputs: tuple, wrt_index: tuple):
    """(fwd, grad) for ``kernel`` (a name from kernels.KERNEL_NAMES); grad() returns a
    tuple of arrays, one per index in ``wrt_index``."""
    import numpy as np
    jax = _jax
    # one jitted forward per cost, one jitted gradient per (cost, argnum); jit itself
    # re-traces per shape and dtype
    if kernel not in _jax_jitted:
        _jax_jitted[kernel] = jax.jit(_jax_costs()[kernel])
    if (kernel, wrt_index) not in _jax_jitted:
        _jax_jitted[(kernel, wrt_index)] = jax.jit(jax.grad(_jax_costs()[kernel],
                                                            argnums=tuple(wrt_index)))
    jf, jg = _jax_jitted[kernel], _jax_jitted[(kernel, wrt_index)]
    args = [jax.device_put(a) if isinstance(a, np.ndarray) else a for a in inputs]

    def fwd():
        return float(jf(*args).block_until_ready())

    def grad():
        return tuple(np.asarray(a) for a in jax.block_until_ready(jg(*args)))
    return fwd, grad


# ---------------------------------------------------------------------------
# PyTorch
# ---------------------------------------------------------------------------

def torch_available(threads: int = 0):
    """(True, version) or (False, reason).  Sets torch's intra-op thread count."""
    global _torch, _torch_error
    if _torch is None and _torch_error is None:
        try:
            import torch
            torch.set_num_threads(threads or os.cpu_count() or 1)
            _torch = torch
        except Exception as exc:
            _torch_error = f"{type(exc).__name__}: {exc}".splitlines()[0][:60]
    if _torch is None:
        return False, _torch_error
    return True, _torch.__version__


def _torch_costs():
    torch = _torch
    F = torch.nn.functional

    def tv(g, b, lam):
        g4 = g[None, None]
        gl = F.pad(g4, (1, 0, 0, 0), mode="replicate")[0, 0, :, :-1]
        gu = F.pad(g4, (0, 0, 1, 0), mode="replicate")[0, 0, :-1, :]
        return ((g - b) ** 2).sum() + lam * (gl - g).abs().sum() + lam * (gu - g).abs().sum()

    def deconv(x, f, y):
        M, N = x.shape
        xp = F.pad(x[None, None], (2, 2, 0, 0), mode="replicate")[0, 0]
        t = sum(f[k] * xp[:, k:k + N] for k in range(5))
        tp = F.pad(t[None, None], (0, 0, 2, 2), mode="replicate")[0, 0]
        r = sum(f[k] * tp[k:k + M] for k in range(5)) - y
        return (r * r).sum()

    def conv(x, w, y):
        r = torch.relu(F.conv2d(x, w, padding=1)) - y
        return (r * r).sum()

    def stencil3d(x, y):
        xp = F.pad(x[None, None], (1, 1, 1, 1, 1, 1), mode="replicate")[0, 0]
        c = xp[1:-1, 1:-1, 1:-1]
        lap = (6 * c - xp[:-2, 1:-1, 1:-1] - xp[2:, 1:-1, 1:-1] - xp[1:-1, :-2, 1:-1]
               - xp[1:-1, 2:, 1:-1] - xp[1:-1, 1:-1, :-2] - xp[1:-1, 1:-1, 2:])
        r = lap - y
        return (r * r).sum()

    return {"tv_cost": tv, "deconv_cost": deconv, "conv_cost": conv, "stencil3d_cost": stencil3d}


def make_torch(kernel: str, inputs: tuple, wrt_index: tuple):
    """(fwd, grad): forward under no_grad; gradients (a tuple, one per index in
    ``wrt_index``) by torch.autograd.grad."""
    import numpy as np
    torch = _torch
    cost = _torch_costs()[kernel]
    args = [torch.from_numpy(a) if isinstance(a, np.ndarray) else a for a in inputs]
    gargs = list(args)
    leaves = []
    for i in wrt_index:
        gargs[i] = args[i].detach().clone().requires_grad_(True)
        leaves.append(gargs[i])

    def fwd():
        with torch.no_grad():
            return float(cost(*args))

    def grad():
        return tuple(g.numpy() for g in torch.autograd.grad(cost(*gargs), leaves))
    return fwd, grad


def make_torch_compile(kernel: str, inputs: tuple, wrt_index: tuple):
    """(fwd, grad) of ``torch.compile`` (inductor, C++ on CPU): the cost under no_grad and
    the autograd gradient, each compiled as one function (the compiler that blocks
    channels into registers and vectorizes the conv layer). The first call of each
    compiles (tens of seconds here). When ``torch.compile`` itself fails, both are the
    reason as text (``n/a (...)``), so the row says why instead of stopping the run.

    Dynamo's caches are emptied first: every case compiles the same ``forward`` and
    ``gradient`` code, and past ``torch._dynamo.config.recompile_limit`` (8) compiled
    versions of one code object dynamo runs it eagerly with only a warning (the full
    run's ninth case on: its 4096² "torch.compile" rows timed eager PyTorch)."""
    import numpy as np
    torch = _torch
    torch._dynamo.reset()
    cost = _torch_costs()[kernel]
    args = [torch.from_numpy(a) if isinstance(a, np.ndarray) else a for a in inputs]

    def forward(*xs):
        with torch.no_grad():
            return cost(*xs)

    def gradient(*xs):
        xs = list(xs)
        leaves = []
        for i in wrt_index:
            xs[i] = xs[i].detach().requires_grad_(True)
            leaves.append(xs[i])
        return torch.autograd.grad(cost(*xs), leaves)
    try:
        compiled_fwd = torch.compile(forward)
        compiled_grad = torch.compile(gradient)
    except Exception as exc:  # no C++ compiler, an unsupported platform
        why = f"n/a (torch.compile: {type(exc).__name__}: {str(exc).splitlines()[0][:80]})"
        return why, why

    def fwd():
        return float(compiled_fwd(*args))

    def grad():
        return tuple(g.numpy() for g in compiled_grad(*args))
    return fwd, grad
