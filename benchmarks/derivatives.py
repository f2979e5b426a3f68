#!/usr/bin/env python
"""Forward mode, Hessian-vector products and adjoints (issue 9) against their baselines.

    python benchmarks/derivatives.py                 # 2048x2048, float64
    python benchmarks/derivatives.py --size 512 --repeats 5

Rows (median of interleaved repeats, ratio = polyad time / baseline time in
the same run, max relative difference of the results):

* jvp of the TV cost (wrt g) and of the deconvolution example's blur (wrt x)
  vs ``jax.jit(jax.jvp)``;
* hvp of the TV cost vs ``jax.jit(jax.jvp(jax.grad))`` (forward over reverse
  in both);
* the generated adjoint of the blur (``pa.adjoint``) vs a hand-written
  gather-form transpose in OpenMP C (``handwritten/blur_t.c``) and vs
  ``jax.jit(jax.linear_transpose)``.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "examples"))
if importlib.util.find_spec("polyad") is None:  # a plain checkout, not pip-installed
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import cbuild  # noqa: E402
import polyad as pa  # noqa: E402
from deconv import FILTER, blur  # noqa: E402
from tv import tv_cost  # noqa: E402  (examples/tv.py: the README's TV cost)


def median_times(calls: dict, repeats: int) -> dict:
    """Median seconds of each callable, repeats interleaved across contenders."""
    samples = {k: [] for k in calls}
    for fn in calls.values():
        fn()   # warm up: compile, fault in pages
    for _ in range(repeats):
        for k, fn in calls.items():
            t = time.perf_counter()
            fn()
            samples[k].append(time.perf_counter() - t)
    return {k: float(np.median(v)) for k, v in samples.items()}


def rel(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=9)
    a = ap.parse_args(argv)
    n = a.size
    rng = np.random.default_rng(0)
    g, b, v = (rng.standard_normal((n, n)) for _ in range(3))
    lam = 0.1
    rows = []

    import jax
    import jax.numpy as jnp
    jax.config.update("jax_enable_x64", True)

    def jtv(g_):
        gp = jnp.pad(g_, 1, mode="edge")
        return (jnp.sum((g_ - b) ** 2) + lam * jnp.sum(jnp.abs(gp[1:-1, :-2] - g_))
                + lam * jnp.sum(jnp.abs(gp[:-2, 1:-1] - g_)))

    def jblur(x_):
        xp = jnp.pad(x_, ((0, 0), (2, 2)), mode="edge")
        t = sum(FILTER[k] * xp[:, k:k + n] for k in range(5))
        tp = jnp.pad(t, ((2, 2), (0, 0)), mode="edge")
        return sum(FILTER[k] * tp[k:k + n, :] for k in range(5))

    # jvp of the TV cost
    pj = pa.jvp(tv_cost, "g")
    jj = jax.jit(lambda g_, v_: jax.jvp(jtv, (g_,), (v_,)))
    got, ref = pj(g, b, lam, v)[1], float(jj(g, v)[1])
    t = median_times({"polyad": lambda: pj(g, b, lam, v),
                      "jax": lambda: jax.block_until_ready(jj(g, v))}, a.repeats)
    rows.append(("jvp", "tv_cost wrt g", "jax.jit(jax.jvp)", t, rel(got, ref)))

    # jvp of the blur
    pb = pa.jvp(blur, "x")
    jb = jax.jit(lambda x_, v_: jax.jvp(jblur, (x_,), (v_,)))
    got, ref = pb(g, FILTER, v)[1], np.asarray(jb(g, v)[1])
    t = median_times({"polyad": lambda: pb(g, FILTER, v),
                      "jax": lambda: jax.block_until_ready(jb(g, v))}, a.repeats)
    rows.append(("jvp", "blur wrt x", "jax.jit(jax.jvp)", t, rel(got, ref)))

    # hvp of the TV cost
    ph = pa.hvp(tv_cost, "g")
    jh = jax.jit(lambda g_, v_: jax.jvp(jax.grad(jtv), (g_,), (v_,))[1])
    got, ref = ph(g, b, lam, v), np.asarray(jh(g, v))
    t = median_times({"polyad": lambda: ph(g, b, lam, v),
                      "jax": lambda: jax.block_until_ready(jh(g, v))}, a.repeats)
    rows.append(("hvp", "tv_cost wrt g", "jax.jit(jvp(grad))", t, rel(got, ref)))

    # adjoint of the blur
    pt = pa.adjoint(blur, "x")
    lib = cbuild.load_baseline("blur_t", "void blur_transpose(const real *w, const real *f, "
                               "real *u, real *xt, int64_t M, int64_t N);", "f64")
    work, xt = np.empty((n, n)), np.empty((n, n))

    def hand():
        lib.lib.blur_transpose(lib.ptr(v, "double"), lib.ptr(FILTER, "double"),
                               lib.ptr(work, "double"), lib.ptr(xt, "double"), n, n)
    hand()
    got = pt(FILTER, v)
    t = median_times({"polyad": lambda: pt(FILTER, v), "hand": hand}, a.repeats)
    rows.append(("adjoint", "blur wrt x", "hand-written C transpose", t, rel(got, xt)))
    jt = jax.jit(lambda w_: jax.linear_transpose(jblur, g)(w_)[0])
    ref = np.asarray(jt(v))
    t = median_times({"polyad": lambda: pt(FILTER, v),
                      "jax": lambda: jax.block_until_ready(jt(v))}, a.repeats)
    rows.append(("adjoint", "blur wrt x", "jax.jit(linear_transpose)", t, rel(got, ref)))

    print(f"derivative kernels, {n}x{n} float64, median of {a.repeats} interleaved repeats")
    print(f"{'what':8s} {'kernel':15s} {'baseline':26s} {'polyad ms':>10s} {'baseline ms':>12s} "
          f"{'ratio':>7s} {'max rel diff':>13s}")
    for what, kernel, base, t, err in rows:
        tp, tb = t["polyad"], [v_ for k, v_ in t.items() if k != "polyad"][0]
        print(f"{what:8s} {kernel:15s} {base:26s} {tp * 1e3:10.2f} {tb * 1e3:12.2f} "
              f"{tp / tb:7.2f} {err:13.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
