"""Correctness of the hand-written baselines (``run.py --check``), before anything is timed.

1. The numpy gradients of reference.py against central finite differences
   of the numpy forward costs (float64, tiny sizes, every entry).
2. Each C baseline (forward and gradient, float32 and float64) against the
   numpy reference on many small shapes, including degenerate ones (1x1,
   sizes below the stencil width) and ones long enough to run the
   vectorized loops and their remainders.
3. The vectorized numpy TV gradient that run.py times.

A benchmark whose baseline is wrong is worthless: run.py stops if any
check fails.
"""

from __future__ import annotations

import time

import numpy as np

import baselines
import reference as ref
import suite

SHAPES = {
    "tv": [(1, 1), (1, 5), (6, 1), (2, 2), (7, 9), (37, 53), (5, 70)],
    "deconv": [(1, 1), (1, 6), (5, 1), (2, 3), (3, 4), (4, 4), (5, 7), (37, 53), (6, 70)],
    "conv": [(1, 1, 1, 1, 1), (1, 1, 1, 1, 2), (2, 3, 4, 5, 7), (1, 2, 3, 17, 33),
             (2, 2, 2, 3, 40), (1, 1, 2, 2, 70)],
    "stencil3d": [(1, 1, 1), (1, 1, 2), (2, 3, 4), (5, 6, 7), (9, 11, 19), (3, 3, 40), (2, 2, 70)],
}

TOL = {"f64": 1e-10, "f32": 3e-5}


def rel_err(a, b) -> float:
    """max |a - b| / max(max |b|, 1): relative for O(1)+ values, absolute below."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return float(np.abs(a - b).max() / max(float(np.abs(b).max()), 1.0))


class Checker:
    def __init__(self, verbose: bool):
        self.verbose = verbose
        self.failures: list[str] = []
        self.count = 0

    def expect(self, what: str, err: float, tol: float) -> None:
        self.count += 1
        ok = err <= tol
        if not ok:
            self.failures.append(f"{what}: error {err:.2e} > {tol:.0e}")
        if self.verbose or not ok:
            print(f"  {'ok  ' if ok else 'FAIL'} {what:58s} err {err:.1e} (tol {tol:.0e})")


def check_fd(c: Checker) -> None:
    rng = np.random.default_rng(7)
    g, b, lam = suite.make_inputs("tv", (5, 6), "f64", rng)
    fd = ref.fd_gradient(lambda: ref.tv_forward(g, b, lam), g)
    c.expect("numpy TV gradient vs finite differences", rel_err(ref.tv_gradient(g, b, lam), fd), 1e-7)
    x, f, y = suite.make_inputs("deconv_x", (6, 7), "f64", rng)
    gx, gf = ref.deconv_gradients(x, f, y)
    c.expect("numpy deconv grad x vs finite differences",
             rel_err(gx, ref.fd_gradient(lambda: ref.deconv_forward(x, f, y), x)), 1e-7)
    c.expect("numpy deconv grad f vs finite differences",
             rel_err(gf, ref.fd_gradient(lambda: ref.deconv_forward(x, f, y), f)), 1e-7)
    x, w, y = suite.make_inputs("conv_x", (2, 2, 3, 4, 5), "f64", rng)
    gx, gw = ref.conv_gradients(x, w, y)
    c.expect("numpy conv grad x vs finite differences",
             rel_err(gx, ref.fd_gradient(lambda: ref.conv_forward(x, w, y), x)), 1e-7)
    c.expect("numpy conv grad w vs finite differences",
             rel_err(gw, ref.fd_gradient(lambda: ref.conv_forward(x, w, y), w)), 1e-7)
    x, y = suite.make_inputs("stencil3d", (3, 4, 5), "f64", rng)
    c.expect("numpy stencil3d grad vs finite differences",
             rel_err(ref.stencil3d_gradient(x, y),
                     ref.fd_gradient(lambda: ref.stencil3d_forward(x, y), x)), 1e-7)


def _up(inputs):
    return tuple(a.astype(np.float64) if isinstance(a, np.ndarray) else a for a in inputs)


def check_baselines(c: Checker, dtype: str) -> None:
    rng = np.random.default_rng(11)
    tol = TOL[dtype]
    for shape in SHAPES["tv"]:
        inp = suite.make_inputs("tv", shape, dtype, rng)
        fwd, grad = baselines.make_tv(*inp)
        up = _up(inp)
        c.expect(f"C tv forward {dtype} {shape}", rel_err(fwd(), ref.tv_forward(*up)), tol)
        c.expect(f"C tv gradient {dtype} {shape}", rel_err(grad()[0], ref.tv_gradient(*up)), tol)
        c.expect(f"numpy tv forward (timed form) {dtype} {shape}",
                 rel_err(ref.tv_forward_fast(*inp), ref.tv_forward(*up)), tol)
        c.expect(f"numpy tv gradient (timed form) {dtype} {shape}",
                 rel_err(ref.tv_gradient_fast(*inp), ref.tv_gradient(*up)), tol)
    for shape in SHAPES["deconv"]:
        inp = suite.make_inputs("deconv_x", shape, dtype, rng)
        fwd, gx = baselines.make_deconv(*inp, wrt="x")
        _, gf = baselines.make_deconv(*inp, wrt="f")
        _, gxf = baselines.make_deconv(*inp, wrt="xf")
        up = _up(inp)
        rx, rf = ref.deconv_gradients(*up)
        c.expect(f"C deconv forward {dtype} {shape}", rel_err(fwd(), ref.deconv_forward(*up)), tol)
        c.expect(f"numpy deconv forward (timed form) {dtype} {shape}",
                 rel_err(ref.deconv_forward_fast(*inp), ref.deconv_forward(*up)), tol)
        c.expect(f"C deconv grad x {dtype} {shape}", rel_err(gx()[0], rx), tol)
        c.expect(f"C deconv grad f {dtype} {shape}", rel_err(gf()[0], rf), tol)
        both = gxf()
        c.expect(f"C deconv grad (x, f) {dtype} {shape}",
                 max(rel_err(both[0], rx), rel_err(both[1], rf)), tol)
        for wrt, want in (("x", (rx,)), ("f", (rf,)), ("xf", (rx, rf))):
            got = baselines.make_deconv_line_buffered(*inp, wrt=wrt)[1]()
            c.expect(f"C deconv grad line-buffered ({wrt}) {dtype} {shape}",
                     max(rel_err(a, b) for a, b in zip(got, want)), tol)
    for shape in SHAPES["conv"]:
        inp = suite.make_inputs("conv_x", shape, dtype, rng)
        fwd, gx = baselines.make_conv(*inp, wrt="x")
        _, gw = baselines.make_conv(*inp, wrt="w")
        _, gwx = baselines.make_conv(*inp, wrt="wx")
        up = _up(inp)
        rx, rw = ref.conv_gradients(*up)
        c.expect(f"C conv forward {dtype} {shape}", rel_err(fwd(), ref.conv_forward(*up)), tol)
        c.expect(f"C conv grad x {dtype} {shape}", rel_err(gx()[0], rx), tol)
        c.expect(f"C conv grad w {dtype} {shape}", rel_err(gw()[0], rw), tol)
        both = gwx()
        c.expect(f"C conv grad (w, x) {dtype} {shape}",
                 max(rel_err(both[0], rw), rel_err(both[1], rx)), tol)
    for shape in SHAPES["stencil3d"]:
        inp = suite.make_inputs("stencil3d", shape, dtype, rng)
        fwd, grad = baselines.make_stencil3d(*inp)
        up = _up(inp)
        c.expect(f"C stencil3d forward {dtype} {shape}",
                 rel_err(fwd(), ref.stencil3d_forward(*up)), tol)
        c.expect(f"numpy stencil3d forward (timed form) {dtype} {shape}",
                 rel_err(ref.stencil3d_forward_fast(*inp), ref.stencil3d_forward(*up)), tol)
        c.expect(f"C stencil3d gradient {dtype} {shape}",
                 rel_err(grad()[0], ref.stencil3d_gradient(*up)), tol)


def run_checks(dtypes=("f32", "f64"), verbose: bool = False) -> bool:
    t0 = time.perf_counter()
    baselines.build_all(dtypes)
    c = Checker(verbose)
    check_fd(c)
    for dt in dtypes:
        check_baselines(c, dt)
    dt = time.perf_counter() - t0
    if c.failures:
        print(f"check: {len(c.failures)} of {c.count} checks FAILED ({dt:.1f} s):")
        for f in c.failures:
            print("  " + f)
        return False
    print(f"check: all {c.count} baseline checks passed "
          f"(numpy gradients vs finite differences, C baselines vs numpy; {dt:.1f} s)")
    return True
