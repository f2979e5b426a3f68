"""``polyad demo``: compile the TV cost kernel of DESIGN §1, run it, check it, time it."""

from __future__ import annotations

import time

import numpy as np

from . import api

_SOURCE = '''
import polyad as pa

M, N = pa.sizes("M N")


@pa.kernel
def tv_cost(g: pa.f64[M, N].clamped, b: pa.f64[M, N], lam: pa.f64) -> pa.f64:
    C = 0.0
    for m in range(M):
        for n in range(N):
            C += (g[m, n] - b[m, n]) ** 2
            C += lam * abs(g[m, n - 1] - g[m, n])
            C += lam * abs(g[m - 1, n] - g[m, n])
    return C
'''


def _load_kernel():
    """Import the demo kernel from a real file (the frontend reads kernel source)."""
    import importlib.util
    import tempfile
    from pathlib import Path
    path = Path(tempfile.mkdtemp(prefix="polyad-demo-")) / "tv_demo.py"
    path.write_text(_SOURCE)
    spec = importlib.util.spec_from_file_location("tv_demo", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.tv_cost, path


def _median_time(fn, repeat=7) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def run_demo(size: int = 1024) -> int:
    print("polyad demo: total-variation cost (DESIGN §1)")
    print(_SOURCE)
    tv_cost, path = _load_kernel()
    t = time.perf_counter()
    compiled = api.compile(tv_cost)
    print(f"compiled {path.name}:tv_cost to OpenMP C in {time.perf_counter() - t:.2f} s "
          f"-> {compiled.library}")
    print("generated C:\n" + compiled.source)
    rng = np.random.default_rng(0)
    g = rng.random((size, size))
    b = g + 0.1 * rng.standard_normal((size, size))
    lam = 0.1
    c = tv_cost(g, b, lam)
    gp = np.pad(g, 1, mode="edge")
    ref = (((g - b) ** 2).sum() + lam * np.abs(gp[1:-1, :-2] - g).sum()
           + lam * np.abs(gp[:-2, 1:-1] - g).sum())
    print(f"tv_cost({size}x{size}) = {c:.10g}   numpy reference = {ref:.10g}   "
          f"relative difference {abs(c - ref) / abs(ref):.1e}")
    t_pa = _median_time(lambda: tv_cost(g, b, lam))
    t_np = _median_time(lambda: (((g - b) ** 2).sum()
                                 + lam * np.abs(np.pad(g, 1, mode="edge")[1:-1, :-2] - g).sum()
                                 + lam * np.abs(np.pad(g, 1, mode="edge")[:-2, 1:-1] - g).sum()))
    print(f"median time: polyad {t_pa * 1e3:.2f} ms, numpy {t_np * 1e3:.2f} ms "
          f"(numpy / polyad = {t_np / t_pa:.1f}x)")
    ok = abs(c - ref) <= 1e-9 * abs(ref)
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1
