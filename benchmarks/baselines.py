"""Python side of the hand-written OpenMP C baselines (benchmarks/handwritten/*.c).

Each ``make_*`` function loads the baseline for the inputs' dtype and
returns closures over preallocated outputs and workspaces (allocated once,
reused by every call, as a hand-written pipeline would):

    fwd()  -> float                 the cost
    grad() -> tuple of np.ndarray   the gradient(s), in ``wrt`` order (the same
                                    preallocated arrays on every call)

The closures hold the numpy arrays themselves (``keep``), not only cffi
pointers to their data, so that no buffer is freed while C may write to it.
"""

from __future__ import annotations

import os

import numpy as np

import cbuild

TV_CDEF = """
double tv_forward(const real *g, const real *b, real lam, int64_t M, int64_t N);
void tv_gradient(const real *g, const real *b, real lam, int64_t M, int64_t N, real *dg);
"""

DECONV_CDEF = """
double deconv_forward(const real *x, const real *f, const real *y, int64_t M, int64_t N, real *t);
void deconv_grad_x(const real *x, const real *f, const real *y, int64_t M, int64_t N,
                   real *dx, real *t, real *r);
void deconv_grad_f(const real *x, const real *f, const real *y, int64_t M, int64_t N,
                   real *df, real *t, real *r);
void deconv_grad_xf(const real *x, const real *f, const real *y, int64_t M, int64_t N,
                    real *dx, real *df, real *t, real *r);
void deconv_grad_x_lb(const real *x, const real *f, const real *y, int64_t M, int64_t N,
                      real *dx);
void deconv_grad_f_lb(const real *x, const real *f, const real *y, int64_t M, int64_t N,
                      real *df);
void deconv_grad_xf_lb(const real *x, const real *f, const real *y, int64_t M, int64_t N,
                       real *dx, real *df);
"""

CONV_CDEF = """
double conv_forward(const real *x, const real *w, const real *y,
                    int64_t B, int64_t CI, int64_t CO, int64_t H, int64_t W);
void conv_grad_w(const real *x, const real *w, const real *y,
                 int64_t B, int64_t CI, int64_t CO, int64_t H, int64_t W, real *dw);
void conv_grad_x(const real *x, const real *w, const real *y,
                 int64_t B, int64_t CI, int64_t CO, int64_t H, int64_t W, real *dx, real *d);
void conv_grad_wx(const real *x, const real *w, const real *y,
                  int64_t B, int64_t CI, int64_t CO, int64_t H, int64_t W, real *dw, real *dx,
                  real *d);
"""

STENCIL3D_CDEF = """
double stencil3d_forward(const real *x, const real *y, int64_t P, int64_t M, int64_t N);
void stencil3d_grad(const real *x, const real *y, int64_t P, int64_t M, int64_t N,
                    real *dx, real *r);
"""

ALL = (("tv", TV_CDEF), ("deconv", DECONV_CDEF), ("conv", CONV_CDEF),
       ("stencil3d", STENCIL3D_CDEF))

_libs: dict = {}


def _lib(name: str, cdef: str, dtype: str) -> cbuild.CLib:
    key = (name, dtype)
    if key not in _libs:
        _libs[key] = cbuild.load_baseline(name, cdef, dtype)
    return _libs[key]


def build_all(dtypes=("f32", "f64")) -> None:
    """Compile (or find in the cache) every baseline for ``dtypes``, in parallel."""
    from concurrent.futures import ThreadPoolExecutor
    jobs = [(name, cdef, dt) for dt in dtypes for name, cdef in ALL]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        list(pool.map(lambda j: cbuild.build(cbuild.HANDWRITTEN / f"{j[0]}.c",
                                             ("BENCH_F32",) if j[2] == "f32" else ()), jobs))
    for job in jobs:
        _lib(*job)


def _dtype_of(a: np.ndarray) -> str:
    return {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}[a.dtype]


def make_tv(g, b, lam, wrt="g"):
    assert wrt == "g"
    dt = _dtype_of(g)
    L = _lib("tv", TV_CDEF, dt)
    ct = cbuild.CTYPE[dt]
    M, N = g.shape
    dg = np.zeros_like(g)
    pg, pb, pd = L.ptr(g, ct), L.ptr(b, ct), L.ptr(dg, ct)
    lam = float(lam)
    keep = [g, b, dg]

    def fwd():
        assert keep
        return L.lib.tv_forward(pg, pb, lam, M, N)

    def grad():
        assert keep  # hold the buffers, not only pointers to them
        L.lib.tv_gradient(pg, pb, lam, M, N, pd)
        return (dg,)
    return fwd, grad


def make_deconv(x, f, y, wrt="xf"):
    """``wrt``: 'x', 'f' or 'xf' (both)."""
    dt = _dtype_of(x)
    L = _lib("deconv", DECONV_CDEF, dt)
    ct = cbuild.CTYPE[dt]
    M, N = x.shape
    t = np.empty_like(x)
    r = np.empty_like(x)
    dx = np.zeros_like(x)
    df = np.zeros_like(f)
    px, pf, py, pt, pr, pdx, pdf = (L.ptr(a, ct) for a in (x, f, y, t, r, dx, df))
    keep = [x, f, y, t, r, dx, df]

    def fwd():
        assert keep
        return L.lib.deconv_forward(px, pf, py, M, N, pt)

    def grad_x():
        assert keep  # hold the buffers, not only pointers to them
        L.lib.deconv_grad_x(px, pf, py, M, N, pdx, pt, pr)
        return (dx,)

    def grad_f():
        assert keep  # hold the buffers, not only pointers to them
        L.lib.deconv_grad_f(px, pf, py, M, N, pdf, pt, pr)
        return (df,)

    def grad_xf():
        assert keep  # hold the buffers, not only pointers to them
        L.lib.deconv_grad_xf(px, pf, py, M, N, pdx, pdf, pt, pr)
        return (dx, df)
    return fwd, {"x": grad_x, "f": grad_f, "xf": grad_xf}[wrt]


def make_deconv_line_buffered(x, f, y, wrt="xf"):
    """The line-buffered gradient (no full-size temporaries): ``grad()`` only; ``wrt`` as
    for ``make_deconv``. Returns (forward, grad) with the forward of ``make_deconv``
    (the forward is the same code)."""
    dt = _dtype_of(x)
    L = _lib("deconv", DECONV_CDEF, dt)
    ct = cbuild.CTYPE[dt]
    M, N = x.shape
    dx = np.zeros_like(x)
    df = np.zeros_like(f)
    px, pf, py, pdx, pdf = (L.ptr(a, ct) for a in (x, f, y, dx, df))
    keep = [x, f, y, dx, df]

    def grad_x():
        assert keep  # hold the buffers, not only pointers to them
        L.lib.deconv_grad_x_lb(px, pf, py, M, N, pdx)
        return (dx,)

    def grad_f():
        assert keep
        L.lib.deconv_grad_f_lb(px, pf, py, M, N, pdf)
        return (df,)

    def grad_xf():
        assert keep
        L.lib.deconv_grad_xf_lb(px, pf, py, M, N, pdx, pdf)
        return (dx, df)
    return make_deconv(x, f, y, wrt)[0], {"x": grad_x, "f": grad_f, "xf": grad_xf}[wrt]


def make_conv(x, w, y, wrt="wx"):
    """``wrt``: 'w', 'x' or 'wx' (both)."""
    dt = _dtype_of(x)
    L = _lib("conv", CONV_CDEF, dt)
    ct = cbuild.CTYPE[dt]
    B, CI, H, W = x.shape
    CO = w.shape[0]
    dw = np.zeros_like(w)
    dx = np.zeros_like(x)
    d = np.empty_like(y) if "x" in wrt else np.empty(0, x.dtype)
    px, pw, py, pdw, pdx, pd = (L.ptr(a, ct) for a in (x, w, y, dw, dx, d))
    keep = [x, w, y, dw, dx, d]

    def fwd():
        assert keep
        return L.lib.conv_forward(px, pw, py, B, CI, CO, H, W)

    def grad_w():
        assert keep  # hold the buffers, not only pointers to them
        L.lib.conv_grad_w(px, pw, py, B, CI, CO, H, W, pdw)
        return (dw,)

    def grad_x():
        assert keep  # hold the buffers, not only pointers to them
        L.lib.conv_grad_x(px, pw, py, B, CI, CO, H, W, pdx, pd)
        return (dx,)

    def grad_wx():
        assert keep  # hold the buffers, not only pointers to them
        L.lib.conv_grad_wx(px, pw, py, B, CI, CO, H, W, pdw, pdx, pd)
        return (dw, dx)
    return fwd, {"w": grad_w, "x": grad_x, "wx": grad_wx}[wrt]


def make_stencil3d(x, y, wrt="x"):
    assert wrt == "x"
    dt = _dtype_of(x)
    L = _lib("stencil3d", STENCIL3D_CDEF, dt)
    ct = cbuild.CTYPE[dt]
    P, M, N = x.shape
    out = np.zeros_like(x)
    r = np.empty_like(x)
    px, py, po, pr = (L.ptr(a, ct) for a in (x, y, out, r))
    keep = [x, y, out, r]

    def fwd():
        assert keep
        return L.lib.stencil3d_forward(px, py, P, M, N)

    def grad():
        assert keep  # hold the buffers, not only pointers to them
        L.lib.stencil3d_grad(px, py, P, M, N, po, pr)
        return (out,)
    return fwd, grad
