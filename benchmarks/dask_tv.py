"""TV gradient on a large float32 image: tiled with polyad.dask vs one untiled call.

Each variant runs in its own child process, so its peak resident memory
(``resource.getrusage(RUSAGE_SELF).ru_maxrss``) is its own:

* ``untiled``      numpy inputs, one call of the compiled gradient (OpenMP, all cores).
* ``dask-store``   the same inputs cut into chunks (``da.from_array`` copies them into
                   its graph; the numpy originals are then dropped), ``map_kernel``,
                   ``dask.array.store`` into a fresh numpy array (the same work and
                   result as ``untiled``).
* ``dask-compute`` the same, but ``.compute()``: dask gathers the result blocks and
                   then concatenates them (one more copy of the result).
* ``dask-lazy``    inputs generated chunk by chunk by dask, the gradient reduced
                   chunk by chunk to its squared norm: no full-size array ever
                   exists (the shape of an out-of-core pipeline; its time includes
                   generating the inputs, so it is not a like-for-like time).

Before timing, a small image checks that the tiled gradient equals the untiled
one bit for bit. Times are medians of ``--repeats`` runs after one warm-up run
(compilation happens in the warm-up); the ratio column is against ``untiled``
in the same invocation.

    python benchmarks/dask_tv.py                      # 16384 x 16384 (8192 if memory is short)
    python benchmarks/dask_tv.py --size 4096 --chunk 1024 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

LAM = 0.1
# Bytes per pixel the untiled variant holds at once: g, b, the gradient (float32),
# plus the margin the dask variant needs to gather its blocks into one array.
BYTES_PER_PIXEL = 4 * 5


def _available_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def _inputs(size: int):
    import numpy as np
    rng = np.random.default_rng(0)
    g = rng.random((size, size), dtype=np.float32)
    b = g + np.float32(0.1) * rng.random((size, size), dtype=np.float32)
    return g, b


def _timed(fn, repeats: int) -> list[float]:
    fn()  # warm-up: compiles (or loads from the cache) the kernels
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def child(variant: str, size: int, chunk: int, repeats: int, workers: int) -> dict:
    import dask.array as da
    import numpy as np

    import kernels
    import polyad as pa
    from polyad import dask as pdask

    tv_cost = kernels.load("f32").tv_cost
    grad = pa.grad(tv_cost, wrt="g")
    base_rss = _peak_rss_bytes()
    if variant == "untiled":
        g, b = _inputs(size)
        times = _timed(lambda: grad(g, b, LAM), repeats)
    elif variant in ("dask-store", "dask-compute"):
        g, b = _inputs(size)
        gd, bd = da.from_array(g, chunks=chunk), da.from_array(b, chunks=chunk)
        del g, b  # dask's graph holds copies of the chunks (from_array copies numpy inputs)
        dg = pdask.map_kernel(grad, gd, bd, LAM)

        def store():
            out = np.empty((size, size), np.float32)
            da.store(dg, out, lock=False, scheduler="threads", num_workers=workers)

        times = _timed(store if variant == "dask-store" else
                       lambda: dg.compute(scheduler="threads", num_workers=workers), repeats)
    elif variant == "dask-lazy":
        rs = da.random.default_rng(0)
        gd = rs.random((size, size), dtype=np.float32, chunks=chunk)
        bd = gd + np.float32(0.1) * rs.random((size, size), dtype=np.float32, chunks=chunk)
        norm = (pdask.map_kernel(grad, gd, bd, LAM).astype(np.float64) ** 2).sum()
        times = _timed(lambda: norm.compute(scheduler="threads", num_workers=workers), repeats)
    else:
        raise ValueError(variant)
    return {"variant": variant, "times": times, "peak_rss": _peak_rss_bytes(),
            "base_rss": base_rss}


def check(workers: int) -> None:
    """The tiled gradient equals the untiled one, bit for bit, on a small image."""
    import dask.array as da
    import numpy as np

    import kernels
    import polyad as pa
    from polyad import dask as pdask

    grad = pa.grad(kernels.load("f32").tv_cost, wrt="g")
    g, b = _inputs(1000)
    tiled = pdask.map_kernel(grad, da.from_array(g, chunks=(300, 170)), b, LAM)
    got = tiled.compute(scheduler="threads", num_workers=workers)
    if not np.array_equal(got, grad(g, b, LAM)):
        raise SystemExit("check failed: the tiled TV gradient differs from the untiled one")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=16384, help="image is SIZE x SIZE float32")
    ap.add_argument("--chunk", type=int, default=2048, help="dask chunk edge")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=os.cpu_count(),
                    help="dask threads (each tile runs 1 OpenMP thread)")
    ap.add_argument("--variants", nargs="+",
                    default=["untiled", "dask-store", "dask-compute", "dask-lazy"])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.size, args.chunk, args.repeats, args.workers)))
        return

    size = args.size
    available = _available_bytes()
    if size * size * BYTES_PER_PIXEL > 0.8 * available:
        fallback = 8192
        print(f"only {available / 2**30:.1f} GiB available: {size}x{size} needs about "
              f"{size * size * BYTES_PER_PIXEL / 2**30:.1f} GiB; running {fallback}x{fallback}")
        size = fallback
    check(args.workers)
    print(f"TV gradient, {size}x{size} float32 ({size * size * 4 / 2**30:.2f} GiB per array), "
          f"chunks {args.chunk}x{args.chunk}, {args.workers} dask threads x 1 OpenMP thread "
          f"(untiled: {os.cpu_count()} OpenMP threads), median of {args.repeats}, "
          f"{available / 2**30:.1f} GiB available, load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    rows = []
    for variant in args.variants:
        cmd = [sys.executable, __file__, "--child", variant, "--size", str(size), "--chunk",
               str(args.chunk), "--repeats", str(args.repeats), "--workers", str(args.workers)]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode:
            raise SystemExit(f"{variant} failed:\n{out.stderr}")
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    base = statistics.median(next(r for r in rows if r["variant"] == "untiled")["times"]) \
        if any(r["variant"] == "untiled" for r in rows) else None
    print(f"| {'variant':12} | {'median s':>8} | {'vs untiled':>10} | {'peak RSS GiB':>12} | "
          f"{'RSS after imports GiB':>21} |")
    print(f"|{'-' * 14}|{'-' * 10}:|{'-' * 11}:|{'-' * 13}:|{'-' * 22}:|")
    for r in rows:
        med = statistics.median(r["times"])
        ratio = f"{med / base:.2f}x" if base else "n/a"
        print(f"| {r['variant']:12} | {med:8.3f} | {ratio:>10} | {r['peak_rss'] / 2**30:12.2f} | "
              f"{r['base_rss'] / 2**30:21.2f} |")


if __name__ == "__main__":
    main()
