"""Compile times: cold (empty cache) and warm (a new process, cache filled), per kernel.

    python benchmarks/compile_times.py [--limit SECONDS] [--only NAME ...]

Each kernel is compiled, primal and gradient, in a child process with an
empty ``POLYAD_CACHE_DIR`` (cold), then again in another child process with
the cache that the first one filled (warm). The table gives the wall time of
each and the cold compile's stage breakdown (from ``POLYAD_LOG=info``).
A child that runs past ``--limit`` is stopped and reported as such.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = Path(os.environ.get("POLYAD_ROOT", HERE.parent))

# Kernels beyond benchmarks/kernels.py: the ones issue reports quote.
EXTRA = textwrap.dedent('''
    import polyad as pa
    M, N = pa.sizes("M N")
    X, Y, Z = pa.sizes("X Y Z")

    @pa.kernel
    def blur3x3_cost(x: pa.f64[M, N].clamped, y: pa.f64[M, N]) -> pa.f64:
        C = 0.0
        for m in range(M):
            for n in range(N):
                s = 0.0
                for a in range(3):
                    for b in range(3):
                        s += x[m + a - 1, n + b - 1]
                C += (s / 9.0 - y[m, n]) ** 2
        return C

    @pa.kernel
    def energy27(u: pa.f64[X, Y, Z].clamped, w: pa.f64[3, 3, 3]) -> pa.f64:
        E = 0.0
        for i in range(X):
            for j in range(Y):
                for k in range(Z):
                    s = 0.0
                    for a in range(3):
                        for b in range(3):
                            for c in range(3):
                                s += w[a, b, c] * u[i + a - 1, j + b - 1, k + c - 1]
                    E += pa.log(1.0 + s * s) + pa.sqrt(1.0 + (u[i + 1, j, k] - u[i, j, k]) ** 2)
        return E
''')

CASES = [  # (name, module, kernel, wrt)
    ("tv", "bench", "tv_cost", ["g"]),
    ("deconv", "bench", "deconv_cost", ["x"]),
    ("stencil3d", "bench", "stencil3d_cost", ["x"]),
    ("conv layer", "bench", "conv_cost", ["x", "w"]),
    ("blur 3x3 clamped", "extra", "blur3x3_cost", ["x"]),
    ("energy 27-point", "extra", "energy27", ["u", "w"]),
]

CHILD = textwrap.dedent('''
    import json, sys, time
    sys.path.insert(0, {root!r}); sys.path.insert(0, {bench!r}); sys.path.insert(0, {extra!r})
    t0 = time.perf_counter()
    import polyad as pa
    import polyad.pipeline as pipeline
    if {module!r} == "bench":
        import kernels
        k = kernels.kernel({kernel!r}, "f64")
    else:
        import compile_times_extra
        k = getattr(compile_times_extra, {kernel!r})
    t1 = time.perf_counter()
    pa.compile(k)
    t2 = time.perf_counter()
    pa.compile(pa.grad(k, wrt={wrt!r}))
    t3 = time.perf_counter()
    print(json.dumps({{"primal": t2 - t1, "grad": t3 - t2, "runs": getattr(pipeline, "pipeline_runs", -1)}}))
''')

STAGE = re.compile(r"compile (\S+): (.+) (\d+\.\d+) s$")


def run_child(case, cache: str, extra_dir: str, limit: float, log: bool):
    name, module, kernel, wrt = case
    code = CHILD.format(root=str(ROOT), bench=str(HERE), extra=extra_dir, module=module,
                        kernel=kernel, wrt=wrt)
    env = dict(os.environ, POLYAD_CACHE_DIR=cache)
    if log:
        env["POLYAD_LOG"] = "info"
    try:
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        return None, {}
    if proc.returncode != 0:
        raise RuntimeError(f"{name}: {proc.stderr[-2000:]}")
    stages: dict[str, float] = {}
    for line in proc.stderr.splitlines():
        m = STAGE.search(line)
        if m:  # one line per stage (the total line ends in its breakdown, not " s")
            stages[m.group(2)] = stages.get(m.group(2), 0.0) + float(m.group(3))
    return json.loads(proc.stdout.splitlines()[-1]), stages


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=float, default=600.0, help="seconds per child process")
    ap.add_argument("--only", nargs="*", help="case names to run (default: all)")
    args = ap.parse_args(argv)
    extra_dir = tempfile.mkdtemp(prefix="polyad-compile-times-")
    Path(extra_dir, "compile_times_extra.py").write_text(EXTRA)
    print(f"{'kernel':<18} {'cold primal':>11} {'cold grad':>10} {'warm total':>10}  "
          f"cold stages (s, primal + gradient)")
    for case in CASES:
        if args.only and case[0] not in args.only:
            continue
        cache = tempfile.mkdtemp(prefix="polyad-cache-")
        cold, stages = run_child(case, cache, extra_dir, args.limit, log=True)
        if cold is None:
            print(f"{case[0]:<18} {'> %.0f s' % args.limit:>22}   (stopped)")
            continue
        warm, _ = run_child(case, cache, extra_dir, args.limit, log=False)
        top = sorted(stages.items(), key=lambda kv: -kv[1])[:4]
        print(f"{case[0]:<18} {cold['primal']:>10.2f}s {cold['grad']:>9.2f}s "
              f"{warm['primal'] + warm['grad']:>9.3f}s  "
              + ", ".join(f"{k} {v:.2f}" for k, v in top)
              + ("" if warm["runs"] == 0 else f"  (warm ran {warm['runs']} pipelines!)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
