"""numpy references: forward costs and hand-derived gradients for every benchmark.

These are the ground truth of ``run.py --check``: each gradient here is
itself checked against central finite differences of the numpy forward cost
(float64, small sizes), then the hand-written C baselines are checked
against them.  Clamped borders follow numpy.pad mode 'edge'; the conv layer
pads with zeros; d|x|/dx at 0 is 0 (sign(0) = 0), as in polyad.

The gradients use ``np.add.at`` to transpose clamped accesses: slow but
obviously right (a scatter that mirrors the forward gather), so that the
gather-form C baselines are checked against an independent formulation.
"""

from __future__ import annotations

import numpy as np

TAPS = 5  # deconvolution filter length (centred: offsets -2..2)


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------

def _clip_idx(n: int, off: int) -> np.ndarray:
    return np.clip(np.arange(n) + off, 0, n - 1)


def take_clamped(a: np.ndarray, axis: int, off: int) -> np.ndarray:
    """``a[..., clamp(i + off), ...]`` along ``axis``."""
    return np.take(a, _clip_idx(a.shape[axis], off), axis=axis)


def scatter_clamped(ga: np.ndarray, axis: int, off: int) -> np.ndarray:
    """Transpose of :func:`take_clamped`: out[clamp(i + off)] += ga[i]."""
    out = np.zeros_like(ga)
    idx = _clip_idx(ga.shape[axis], off)
    moved = np.moveaxis(out, axis, 0)
    np.add.at(moved, idx, np.moveaxis(ga, axis, 0))
    return out


# ---------------------------------------------------------------------------
# TV
# ---------------------------------------------------------------------------

def tv_forward(g, b, lam):
    dh = take_clamped(g, 1, -1) - g
    dv = take_clamped(g, 0, -1) - g
    return float(((g - b) ** 2).sum(dtype=np.float64) + lam * np.abs(dh).sum(dtype=np.float64)
                 + lam * np.abs(dv).sum(dtype=np.float64))


def tv_forward_fast(g, b, lam):
    """The forward as a numpy user would write it (slices; the clamped border
    differences are 0 and drop out); timed."""
    return float(((g - b) ** 2).sum() + lam * np.abs(g[:, :-1] - g[:, 1:]).sum()
                 + lam * np.abs(g[:-1] - g[1:]).sum())


def tv_gradient(g, b, lam):
    """Scatter-form transpose of the forward (independent of the C gather form)."""
    lam = g.dtype.type(lam)
    sh = np.sign(take_clamped(g, 1, -1) - g)
    sv = np.sign(take_clamped(g, 0, -1) - g)
    out = 2 * (g - b) - lam * sh - lam * sv
    out += lam * scatter_clamped(sh, 1, -1)
    out += lam * scatter_clamped(sv, 0, -1)
    return out


def tv_gradient_fast(g, b, lam):
    """The gradient as a numpy user would write it (vectorized, no add.at); timed."""
    lam = g.dtype.type(lam)
    out = 2 * (g - b)
    sh = np.sign(g[:, :-1] - g[:, 1:])  # sign(g[m, n] - g[m, n+1]) for n < N-1
    out[:, :-1] += lam * sh
    out[:, 1:] -= lam * sh
    sv = np.sign(g[:-1, :] - g[1:, :])
    out[:-1, :] += lam * sv
    out[1:, :] -= lam * sv
    return out


# ---------------------------------------------------------------------------
# Deconvolution: separable clamped 5-tap blur + data fidelity
# ---------------------------------------------------------------------------

def _hblur(x, f):
    return sum(f[k] * take_clamped(x, 1, k - 2) for k in range(TAPS))


def _vblur(t, f):
    return sum(f[k] * take_clamped(t, 0, k - 2) for k in range(TAPS))


def deconv_forward(x, f, y):
    r = _vblur(_hblur(x, f), f) - y
    return float((r.astype(np.float64) ** 2).sum())


def deconv_gradients(x, f, y):
    """(dC/dx, dC/df)."""
    t = _hblur(x, f)
    gB = 2 * (_vblur(t, f) - y)
    gt = sum(f[k] * scatter_clamped(gB, 0, k - 2) for k in range(TAPS))
    gx = sum(f[k] * scatter_clamped(gt, 1, k - 2) for k in range(TAPS))
    gf = np.array([(gB.astype(np.float64) * take_clamped(t, 0, k - 2)).sum()
                   + (gt.astype(np.float64) * take_clamped(x, 1, k - 2)).sum()
                   for k in range(TAPS)]).astype(x.dtype)
    return gx, gf


def deconv_forward_fast(x, f, y):
    """Forward as a numpy user would write it (edge padding + slices); timed."""
    M, N = x.shape
    xp = np.pad(x, ((0, 0), (2, 2)), mode="edge")
    t = f[0] * xp[:, 0:N]
    for k in range(1, TAPS):
        t += f[k] * xp[:, k:k + N]
    tp = np.pad(t, ((2, 2), (0, 0)), mode="edge")
    r = f[0] * tp[0:M]
    for k in range(1, TAPS):
        r += f[k] * tp[k:k + M]
    r -= y
    return float(np.vdot(r, r))


# ---------------------------------------------------------------------------
# Conv layer: NCHW, 3x3 same conv with zero padding, ReLU, squared error
# ---------------------------------------------------------------------------

def _conv_z(x, w):
    B, CI, H, W = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    z = np.zeros((B, w.shape[0], H, W), dtype=x.dtype)
    for kh in range(3):
        for kw in range(3):
            z += np.einsum("oi,bihw->bohw", w[:, :, kh, kw], xp[:, :, kh:kh + H, kw:kw + W])
    return z


def conv_forward(x, w, y):
    r = np.maximum(_conv_z(x, w), 0) - y
    return float((r.astype(np.float64) ** 2).sum())


def conv_gradients(x, w, y):
    """(dC/dx, dC/dw)."""
    B, CI, H, W = x.shape
    z = _conv_z(x, w)
    d = 2 * (np.maximum(z, 0) - y) * (z > 0)
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    gw = np.zeros(w.shape, dtype=np.float64)
    gxp = np.zeros(xp.shape, dtype=x.dtype)
    for kh in range(3):
        for kw in range(3):
            gw[:, :, kh, kw] = np.einsum("bohw,bihw->oi", d.astype(np.float64),
                                         xp[:, :, kh:kh + H, kw:kw + W].astype(np.float64))
            gxp[:, :, kh:kh + H, kw:kw + W] += np.einsum("oi,bohw->bihw", w[:, :, kh, kw], d)
    return gxp[:, :, 1:-1, 1:-1].copy(), gw.astype(x.dtype)


# ---------------------------------------------------------------------------
# 3-D 7-point stencil, clamped
# ---------------------------------------------------------------------------

def _lap3(x):
    out = 6 * x
    for ax in range(3):
        for off in (-1, 1):
            out = out - take_clamped(x, ax, off)
    return out


def stencil3d_forward(x, y):
    r = _lap3(x) - y
    return float((r.astype(np.float64) ** 2).sum())


def stencil3d_forward_fast(x, y):
    """Edge padding + slices, as a numpy user would write it; timed."""
    xp = np.pad(x, 1, mode="edge")
    r = 6 * x - y
    r -= xp[:-2, 1:-1, 1:-1]
    r -= xp[2:, 1:-1, 1:-1]
    r -= xp[1:-1, :-2, 1:-1]
    r -= xp[1:-1, 2:, 1:-1]
    r -= xp[1:-1, 1:-1, :-2]
    r -= xp[1:-1, 1:-1, 2:]
    return float(np.vdot(r, r))


def stencil3d_gradient(x, y):
    r2 = 2 * (_lap3(x) - y)
    out = 6 * r2
    for ax in range(3):
        for off in (-1, 1):
            out = out - scatter_clamped(r2, ax, off)
    return out


# ---------------------------------------------------------------------------
# finite differences
# ---------------------------------------------------------------------------

def fd_gradient(fun, x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Central differences of scalar ``fun`` wrt every entry of float64 ``x``."""
    g = np.zeros_like(x, dtype=np.float64)
    flat = x.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + eps
        fp = fun()
        flat[i] = old - eps
        fm = fun()
        flat[i] = old
        g.reshape(-1)[i] = (fp - fm) / (2 * eps)
    return g
