#!/usr/bin/env python
"""polyad benchmark suite (issue #4): generated forward and gradient kernels against
hand-written OpenMP C, numpy, JAX jit(grad) and PyTorch autograd, in one process.

    python benchmarks/run.py --quick            # 1024x1024, few repeats, < 2 minutes
    python benchmarks/run.py                    # 2048x2048 and 4096x4096, f32 and f64
    python benchmarks/run.py --check            # only verify the baselines (fast)
    python benchmarks/run.py --sizes 2048 --dtype f32 --bench tv deconv_x

For every benchmark, size and dtype it prints the median forward and
gradient times of each contender, their ratios to the hand-written C
measured in the same run, the gradient/forward ratio, the achieved
bandwidth (bytes that must minimally move / median time) and its fraction
of the STREAM triad bandwidth (the better of the run's start and end), the
gradients' fractions of a triad timed in the case's own rounds, for the conv
layer each kernel's share of the multiply-add peak (``peak.py``, measured at
the run's start and end like the triad), and the error of each result
against a float64 reference.  See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
if importlib.util.find_spec("polyad") is None:  # a plain checkout, not pip-installed
    sys.path.insert(0, str(ROOT))

# OpenBLAS's worker threads busy-wait for about 2^28 cycles (0.1 s) after each BLAS call,
# so the numpy rows' np.vdot left both cores spinning while the next contender ran: every
# C kernel of the deconvolution and 3-D stencil rounds took about twice its time. 2^4
# cycles: they sleep at once (numpy stays multithreaded). Set before numpy loads OpenBLAS.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

import numpy as np  # noqa: E402

import check  # noqa: E402
import frameworks  # noqa: E402
import peak  # noqa: E402
import stream  # noqa: E402
import suite  # noqa: E402
from polyad.schedule import machine  # noqa: E402

ALL_BENCHES = list(suite.BENCHES)
DEFAULT_BENCHES = list(suite.DEFAULT_BENCHES)
HW = suite.HAND_WRITTEN  # ratios are to the fastest hand-written row of each column
TRIAD = ("STREAM triad", "run")  # the timer's key of a case's in-round triad
# issue #10: the deconvolution's and 3-D stencil's gradients at this share of the triad
TRIAD_SHARE = 0.5
# issue #10's conv-layer target: gradient time / forward time at most this
CONV_GRAD_OVER_FWD = 2.5

# relative errors above which a result is flagged with '!' in the table: of the cost, and
# of the gradient (float32 gradients may take the other side of a ReLU kink at the few
# points whose value rounds across 0, about 1e-4 in the L2 norm)
ERR_TOL_COST = {"f64": 1e-9, "f32": 1e-4}
ERR_TOL_GRAD = {"f64": 1e-9, "f32": 1e-3}


# ---------------------------------------------------------------------------
# errors (the timing: suite.Timer)
# ---------------------------------------------------------------------------

def rel_err(a, ref) -> float:
    """Relative L2 error ||a - ref|| / ||ref||; for tuples of gradients, the worst of them.

    The L2 norm, not the max norm: at a kink (ReLU, |x|) a float32 result may take the
    other branch than the float64 reference at a handful of points whose value rounds
    across 0, which is correct behaviour; a wrong border row or column still shows
    (about 1e-2 on 4096x4096)."""
    if isinstance(ref, tuple):
        if not isinstance(a, tuple) or len(a) != len(ref):
            return float("inf")
        return max(rel_err(x, r) for x, r in zip(a, ref))
    a = np.asarray(a, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if a.shape != ref.shape:
        return float("inf")
    if not np.all(np.isfinite(a)):
        return float("inf")
    return float(np.linalg.norm((a - ref).ravel()) / max(np.linalg.norm(ref.ravel()), 1e-300))


# ---------------------------------------------------------------------------
# polyad specifics: preallocated gradient output, cold compile time
# ---------------------------------------------------------------------------

def polyad_with_out(case: suite.Case, impl: suite.Impl) -> str:
    """Pass preallocated ``d_<wrt>`` arrays (the derived kernel's documented pa.Out
    parameters) when the kernel has them and zeroes them itself (checked: NaN-filled
    buffers must give the same result as fresh ones).  Returns a note for the table."""
    if not callable(impl.grad):
        return ""
    gk = suite._polyad_grads.get((case.kernel, case.dtype, case.wrt))
    kir = getattr(gk, "ir", None)
    names = [f"d_{w}" for w in case.wrt]
    outs = {p.name for p in kir.params if p.intent == "out"} if kir is not None else set()
    if not set(names) <= outs:
        return "fresh outputs per call"
    bufs = {n: np.full(case.inputs[i].shape, np.nan, dtype=case.inputs[i].dtype)
            for n, i in zip(names, case.wrt_index)}
    try:
        fresh = tuple(np.array(a, copy=True) for a in impl.grad())
        got = gk(*case.inputs, **bufs)
        got = got if isinstance(got, tuple) else (got,)
        tol = 1e-12 if case.dtype == "f64" else 1e-5  # parallel reductions may reassociate
        if all(g is bufs[n] for g, n in zip(got, names)) and rel_err(got, fresh) <= tol:
            inputs = case.inputs

            def grad():
                out = gk(*inputs, **bufs)
                return out if isinstance(out, tuple) else (out,)
            impl.grad = grad
            return "outputs preallocated"
    except Exception:
        pass
    return "fresh outputs per call"


COLD_SCRIPT = textwrap.dedent("""
    import json, sys, time
    t0 = time.perf_counter()
    import numpy as np
    import polyad as pa
    sys.path.insert(0, {bench_dir!r})
    import kernels
    t1 = time.perf_counter()
    k = kernels.kernel("tv_cost", {dtype!r})
    t2 = time.perf_counter()
    out = {{"import_s": t1 - t0, "parse_s": t2 - t1}}
    if callable(getattr(pa, "grad", None)):
        t = time.perf_counter()
        gk = pa.grad(k, wrt="g")
        t_ad = time.perf_counter() - t
        gk.compile()
        out["grad_s"] = time.perf_counter() - t
        out["grad_ad_s"] = t_ad
        g = np.random.rand(5, 6).astype(np.{np_name}); b = g + 1
        gk(g, b, 0.1)
    t = time.perf_counter()
    k.compile()
    out["fwd_s"] = time.perf_counter() - t
    print(json.dumps(out))
""")


def cold_compile(dtype: str) -> dict:
    """Cold compile of the TV gradient and forward: a fresh process and an empty
    POLYAD_CACHE_DIR (so parse, AD, ISL scheduling, emission and the C compiler all run)."""
    with tempfile.TemporaryDirectory(prefix="polyad-bench-cold-") as cache:
        env = dict(os.environ, POLYAD_CACHE_DIR=cache)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        script = COLD_SCRIPT.format(bench_dir=str(HERE), dtype=dtype,
                                    np_name={"f32": "float32", "f64": "float64"}[dtype])
        proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                              text=True, timeout=600)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1][:100]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def error_text(exc: Exception, limit: int = 160) -> str:
    """The first line of ``exc``'s message, and the next non-empty one when the first only
    introduces it (torch.compile's "backend='inductor' raised:")."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()] or [""]
    text = lines[0]
    if text.endswith(":") and len(lines) > 1:
        text += " " + lines[1]
    return text[:limit]


# ---------------------------------------------------------------------------
# one case
# ---------------------------------------------------------------------------

def run_case(case: suite.Case, timer: suite.Timer, args) -> dict:
    impls = suite.implementations(case, with_jax=not args.no_jax, with_torch=not args.no_torch,
                                  with_torch_compile=not args.no_torch_compile)
    ref_cost, ref_grad = suite.reference_results(case)
    rows = []
    calls = {}
    for impl in impls:
        row = {"impl": impl.name, "note": "", "fwd": None, "grad": None, "fwd_na": None,
               "grad_na": None, "err_fwd": None, "err_grad": None, "first_s": 0.0}
        for kind in ("fwd", "grad"):
            fn = getattr(impl, kind)
            if not callable(fn):
                row[kind + "_na"] = fn
                continue
            t = time.perf_counter()
            try:
                val = fn()  # warm-up: compiles / JITs on the first call
            except Exception as exc:
                row[kind + "_na"] = f"error: {type(exc).__name__}: {error_text(exc)}"
                setattr(impl, kind, None)
                continue
            row["first_s"] += time.perf_counter() - t
            if kind == "fwd":
                row["err_fwd"] = abs(float(val) - ref_cost) / max(abs(ref_cost), 1e-300)
            else:
                row["err_grad"] = rel_err(val, ref_grad)
        if impl.name == "polyad" and callable(impl.grad):
            row["note"] = polyad_with_out(case, impl)
        for kind in ("fwd", "grad"):
            fn = getattr(impl, kind)
            if callable(fn):
                calls[(impl.name, kind)] = fn
        rows.append(row)
    # the triad over arrays of the gradient's minimal traffic, in the same rounds: what the
    # memory system gave while the kernels ran (the run's STREAM lines give its best)
    triad = stream.Triad(case.grad_bytes)
    calls[TRIAD] = triad
    med = timer.run(calls)
    triad_s, triad_n = med.pop(TRIAD)
    triad_gbs = triad.gbs(triad_s)
    for row in rows:
        for kind in ("fwd", "grad"):
            if (row["impl"], kind) in med:
                row[kind], row[kind + "_n"] = med[(row["impl"], kind)]
    hw = {kind: min((r[kind] for r in rows if r["impl"] in HW and r[kind]), default=None)
          for kind in ("fwd", "grad")}
    for row in rows:
        for kind, nbytes in (("fwd", case.fwd_bytes), ("grad", case.grad_bytes)):
            t = row[kind]
            row[kind + "_ratio"] = t / hw[kind] if t and hw[kind] else None
            row[kind + "_gbs"] = nbytes / t / 1e9 if t else None
        row["grad_over_fwd"] = row["grad"] / row["fwd"] if row["grad"] and row["fwd"] else None
    return {"bench": case.bench, "title": case.title, "size": case.size, "dtype": case.dtype,
            "shape": case.shape, "fwd_bytes": case.fwd_bytes, "grad_bytes": case.grad_bytes,
            "fwd_flops": case.fwd_flops, "grad_flops": case.grad_flops,
            "rows": rows, "triad_gbs": triad_gbs, "triad_n": triad_n}


def add_bandwidth(res: dict, bw: float) -> None:
    """Fractions of the STREAM triad bandwidth: ``<kind>_bw`` of ``bw`` (GB/s, the run's
    best), ``<kind>_bw_rounds`` of the triad timed in the case's own rounds
    (``res['triad_gbs']``)."""
    res["triad_best_gbs"] = bw
    rounds = res.get("triad_gbs")
    for row in res["rows"]:
        for kind in ("fwd", "grad"):
            gbs = row[kind + "_gbs"]
            row[kind + "_bw"] = gbs / bw if gbs and bw else None
            row[kind + "_bw_rounds"] = gbs / rounds if gbs and rounds else None


def add_peak(res: dict, rates: dict) -> None:
    """Shares of the multiply-add peak (``rates``: GFLOP/s by dtype, ``peak.measure``):
    ``<kind>_peak`` of each row, where the case counts its multiply-adds."""
    rate = rates.get(res["dtype"])
    res["peak_gflops"] = rate
    for row in res["rows"]:
        for kind in ("fwd", "grad"):
            flops, t = res.get(kind + "_flops"), row[kind]
            row[kind + "_peak"] = flops / t / 1e9 / rate if flops and t and rate else None


# ---------------------------------------------------------------------------
# printing
# ---------------------------------------------------------------------------

COLS = ("{impl:<15s} {fwd:>9s} {fwdr:>6s} {grad:>9s} {gradr:>6s} {gf:>6s} "
        "{fgbs:>6s} {fbw:>5s} {ggbs:>6s} {gbw:>5s} {errc:>7s} {errg:>7s} {first:>6s}")
HEADER = COLS.format(impl="implementation", fwd="fwd ms", fwdr="/hw", grad="grad ms",
                     gradr="/hw", gf="g/f", fgbs="fGB/s", fbw="f%BW", ggbs="gGB/s",
                     gbw="g%BW", errc="errC", errg="errG", first="1st s")


def _ms(t):
    if t is None:
        return "-"
    ms = t * 1e3
    return f"{ms:.3g}" if ms < 100 else f"{ms:.0f}"


def _x(r):
    return "-" if r is None else f"{r:.2f}"


def _pct(f):
    return "-" if f is None else f"{100 * f:.0f}%"


def _gbs(v):
    return "-" if v is None else f"{v:.1f}"


def _err(e, tol):
    if e is None:
        return "-"
    flag = "!" if e > tol else ""
    return f"{flag}{e:.0e}" if e > 0 else "0"


def format_case(res: dict) -> str:
    mib = 1e6
    lines = [f"{res['bench']}: {res['title']}",
             f"  {res['shape']} {res['dtype']}; minimal traffic fwd {res['fwd_bytes'] / mib:.1f} MB,"
             f" grad {res['grad_bytes'] / mib:.1f} MB", "  " + HEADER]
    for row in res["rows"]:
        if row["fwd"] is None and row["grad"] is None:
            lines.append("  " + f"{row['impl']:<15s} {row['fwd_na'] or row['grad_na']}")
            continue
        line = COLS.format(
            impl=row["impl"], fwd=_ms(row["fwd"]), fwdr=_x(row["fwd_ratio"]),
            grad=_ms(row["grad"]) if row["grad"] is not None else "-",
            gradr=_x(row["grad_ratio"]), gf=_x(row["grad_over_fwd"]),
            fgbs=_gbs(row["fwd_gbs"]), fbw=_pct(row["fwd_bw"]), ggbs=_gbs(row["grad_gbs"]),
            gbw=_pct(row["grad_bw"]), errc=_err(row["err_fwd"], ERR_TOL_COST[res["dtype"]]),
            errg=_err(row["err_grad"], ERR_TOL_GRAD[res["dtype"]]), first=f"{row['first_s']:.2f}")
        if row["grad"] is None and row["grad_na"] and row["grad_na"] != "-":
            line += f"  grad: {row['grad_na']}"
        elif row["note"]:
            line += f"  ({row['note']})"
        lines.append("  " + line)
    if res.get("grad_flops") and res.get("peak_gflops"):
        shares = "; ".join(
            f"{row['impl']} fwd {_pct(row['fwd_peak'])}, grad {_pct(row['grad_peak'])}"
            for row in res["rows"] if row["fwd_peak"] or row["grad_peak"])
        more = res["grad_flops"] / res["fwd_flops"]
        lines.append(f"  multiply-adds: fwd {res['fwd_flops'] / 2e6:.0f} M, grad "
                     f"{res['grad_flops'] / 2e6:.0f} M ({more:.0f}x); of the {res['dtype']} "
                     f"multiply-add peak ({res['peak_gflops']:.0f} GFLOP/s, this run): "
                     f"{shares or '-'}")
    if res.get("triad_gbs"):
        shares = ", ".join(f"{row['impl']} {_pct(row['grad_bw_rounds'])}" for row in res["rows"]
                           if row["grad_bw_rounds"] and (row["impl"] == "polyad" or row["impl"] in HW))
        lines.append(f"  STREAM triad in these rounds: {res['triad_gbs']:.1f} GB/s ({res['triad_n']} "
                     f"rounds; the run's best {res['triad_best_gbs']:.1f}); of it, the gradients: "
                     f"{shares or '-'}")
    return "\n".join(lines)


def summarize_targets(results: list, cold: dict) -> list[str]:
    """The issue's targets, evaluated on this run."""
    out = []

    def row(res, name):
        return next((r for r in res["rows"] if r["impl"] == name), None)

    for res in results:
        if res["bench"].startswith("conv"):
            out.append(conv_targets(res))
            continue
        if res["bench"] in ("deconv", "stencil3d"):
            out.append(triad_share_target(res))
        if res["bench"] not in ("tv", "deconv", "deconv_x", "deconv_f"):
            continue
        p = row(res, "polyad")
        tag = f"{res['bench']:<9s} {res['shape']:>9s} {res['dtype']}"
        if p is None or p["grad"] is None:
            out.append(f"{tag}: polyad gradient n/a ({(p or {}).get('grad_na')})")
            continue
        r = p["grad_ratio"]
        s = f"{tag}: polyad grad / hand-written = {r:.2f} ({'PASS' if r <= 1.15 else 'FAIL'} <= 1.15)"
        for other in ("jax jit(grad)", "torch autograd"):
            o = row(res, other)
            if o is not None and o["grad"] is not None:
                sp = o["grad"] / p["grad"]
                s += f"; {other.split()[0]} / polyad = {sp:.1f} ({'PASS' if sp > 1 else 'FAIL'})"
        if res["bench"] == "tv":
            gf = p["grad_over_fwd"]
            s += f"; grad/fwd = {gf:.2f} ({'PASS' if gf <= 3 else 'FAIL'} <= 3)"
        out.append(s)
    for dt, c in cold.items():
        if "error" in c:
            out.append(f"TV gradient cold compile ({dt}): error {c['error']}")
        elif "grad_s" in c:
            out.append(f"TV gradient cold compile ({dt}): {c['grad_s']:.2f} s "
                       f"({'PASS' if c['grad_s'] < 3 else 'FAIL'} < 3 s; AD {c['grad_ad_s']:.2f} s, "
                       f"then schedule + emit + cc); forward cold compile {c['fwd_s']:.2f} s; "
                       f"import polyad {c['import_s']:.2f} s")
        else:
            out.append(f"TV gradient cold compile ({dt}): n/a (AD not available); forward cold "
                       f"compile {c['fwd_s']:.2f} s")
    return out


def triad_share_target(res: dict) -> str:
    """Issue #10's bandwidth target: the gradient at ``TRIAD_SHARE`` of the triad or more,
    against the triad timed in the case's own rounds (the machine's bandwidth while the
    kernels ran), with the share of the run's best triad beside it."""
    p = next((r for r in res["rows"] if r["impl"] == "polyad"), None)
    tag = f"{res['bench']:<9s} {res['shape']:>9s} {res['dtype']}"
    if p is None or p["grad"] is None or not p.get("grad_bw_rounds"):
        return f"{tag}: polyad gradient's share of the triad n/a"
    share = p["grad_bw_rounds"]
    return (f"{tag}: polyad grad at {_pct(share)} of the triad in its rounds "
            f"({'PASS' if share >= TRIAD_SHARE else 'FAIL'} >= {_pct(TRIAD_SHARE)}), "
            f"{_pct(p['grad_bw'])} of the run's best triad")


def conv_targets(res: dict) -> str:
    """Issue #10's conv-layer targets: gradient at most the hand-written C's time, at least
    as fast as torch.compile's (float32), gradient/forward at most ``CONV_GRAD_OVER_FWD``."""
    rows = {r["impl"]: r for r in res["rows"]}
    p = rows.get("polyad")
    tag = f"{res['bench']:<9s} {res['shape']:>9s} {res['dtype']}"
    if p is None or p["grad"] is None:
        return f"{tag}: polyad gradient n/a ({(p or {}).get('grad_na')})"
    r = p["grad_ratio"]
    s = f"{tag}: polyad grad / hand-written = {r:.2f} ({'PASS' if r <= 1.0 else 'FAIL'} <= 1.0)"
    tc = rows.get("torch.compile")
    if tc is not None and tc["grad"] is not None:
        sp = tc["grad"] / p["grad"]
        s += f"; torch.compile / polyad = {sp:.2f} ({'PASS' if sp >= 1 else 'FAIL'} >= 1)"
    gf = p["grad_over_fwd"]
    if gf is not None:
        s += (f"; grad/fwd = {gf:.2f} ({'PASS' if gf <= CONV_GRAD_OVER_FWD else 'FAIL'} "
              f"<= {CONV_GRAD_OVER_FWD})")
        if p.get("fwd_peak") and p.get("grad_peak"):
            # at the forward's efficiency g/f would be the ratio of multiply-adds (3 for
            # both gradients): the target asks the gradient to use the peak that much better
            more = res["grad_flops"] / res["fwd_flops"]
            s += (f" (its multiply-adds {more:.0f}x the forward's: {CONV_GRAD_OVER_FWD} asks "
                  f"for {more / CONV_GRAD_OVER_FWD:.2f}x the forward's share of the peak; it has "
                  f"{p['grad_peak'] / p['fwd_peak']:.2f}x)")
    return s


def polyad_revision(pkg_dir: Path) -> str:
    """``git <commit>[+uncommitted changes]`` of the polyad package being benchmarked."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=pkg_dir,
                              capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return ""
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "."], cwd=pkg_dir,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return f"(git {head.stdout.strip()}{'+uncommitted changes' if dirty else ''})"
    except (OSError, subprocess.SubprocessError):
        return ""


def last_level_cache() -> str:
    """``", L3 260 MiB"``: the size of cpu 0's last cache level, as Linux reports it
    (``polyad.schedule.machine.last_level_cache``; a case whose arrays fit in it may run
    from it: its share of a triad over larger arrays can pass 100 %); empty where not
    reported."""
    found = machine.last_level_cache()
    if found is None:
        return ""
    level, size = found
    kib = size >> 10
    return f", L{level} {kib // 1024} MiB" if kib >= 1024 else f", L{level} {kib} KiB"


def machine_info() -> list[str]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        cc = subprocess.run([os.environ.get("CC", "cc"), "--version"], capture_output=True,
                            text=True).stdout.splitlines()[0]
    except (OSError, IndexError):
        cc = "?"
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0, 0, 0)
    versions = [f"python {platform.python_version()}", f"numpy {np.__version__}"]
    import polyad as pa
    versions.append(f"polyad {pa.__version__} {polyad_revision(Path(pa.__file__).parent)}"
                    + ("" if callable(getattr(pa, "grad", None)) else " (no pa.grad)"))
    return [f"machine: {cpu}, {os.cpu_count()} cores{last_level_cache()}, OMP_NUM_THREADS="
            f"{os.environ.get('OMP_NUM_THREADS', 'unset')}; {cc}",
            f"versions: {', '.join(versions)}",
            f"load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
            + ("  (busy machine: timings are noisy, ratios are interleaved)" if load[0] > 0.5 else "")]


# ---------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------

def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description="Time polyad's generated forward and gradient kernels against "
                    "hand-written OpenMP C, numpy, JAX and PyTorch.",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=textwrap.dedent("""
        columns: fwd ms / grad ms = median times; /hw = time / the fastest hand-written C time
        (same run; > 1 is slower); g/f = gradient time / forward time of the same
        implementation; fGB/s, gGB/s = minimal bytes / time; f%BW, g%BW = that as a
        fraction of the STREAM triad bandwidth (the run's best); below each table, the
        gradients' fractions of a triad over arrays of their minimal traffic timed in the
        same rounds (the bandwidth while they ran); err = max relative error of cost and
        gradient vs a float64 reference ('!' = above tolerance); 1st s = first calls
        (compile / JIT) in seconds."""))
    ap.add_argument("--quick", action="store_true",
                    help="1024x1024 (conv 4x(256x256)), few repeats: under 2 minutes")
    ap.add_argument("--check", action="store_true",
                    help="only verify the hand-written baselines (and the numpy references) "
                         "against numpy and finite differences, then exit")
    ap.add_argument("--sizes", type=int, nargs="+", help="nominal image sizes (default "
                    "2048 4096; --quick: 1024)")
    ap.add_argument("--dtype", choices=("f32", "f64", "both"),
                    help="element type(s) (default: both; --quick: f64)")
    ap.add_argument("--bench", nargs="+", choices=ALL_BENCHES + ["all"], default=DEFAULT_BENCHES,
                    help=f"benchmarks to run (default: {' '.join(DEFAULT_BENCHES)}; 'all' adds "
                         f"the one-parameter gradients deconv_x deconv_f conv_w conv_x)")
    ap.add_argument("--repeats", type=int, help="timed rounds (default 9 quick, 15 full)")
    ap.add_argument("--stat", choices=("median", "min"), default="median",
                    help="statistic of the timed rounds (default median; min is steadier "
                         "on a machine shared with other work)")
    ap.add_argument("--no-jax", action="store_true", help="skip JAX even when installed")
    ap.add_argument("--no-torch", action="store_true", help="skip PyTorch even when installed")
    ap.add_argument("--no-torch-compile", action="store_true",
                    help="skip the torch.compile rows (their first calls compile for tens of "
                         "seconds each)")
    ap.add_argument("--no-cold-compile", action="store_true",
                    help="skip the cold compile-time measurement")
    ap.add_argument("--json", metavar="FILE", help="also write all numbers as JSON")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every check")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    dtype = args.dtype or ("f64" if args.quick else "both")
    dtypes = ("f32", "f64") if dtype == "both" else (dtype,)
    t_start = time.perf_counter()

    if not check.run_checks(dtypes, verbose=args.verbose):
        print("baselines are wrong: not timing anything", file=sys.stderr)
        return 1
    if args.check:
        return 0

    sizes = args.sizes or ([1024] if args.quick else [2048, 4096])
    repeats = args.repeats or (9 if args.quick else 15)
    timer = suite.Timer(repeats, budget_s=0.4 if args.quick else 3.0, stat=args.stat)
    if not args.no_torch:
        frameworks.torch_available(threads=os.cpu_count() or 1)

    print("\n".join(machine_info()))
    stream_mib, stream_reps = (64, 5) if args.quick else (256, 10)
    bw = stream.measure(mib_per_array=stream_mib, repeats=stream_reps)
    print(f"STREAM (same run, OpenMP C, best of {stream_reps}): triad {bw['triad']:.1f} GB/s, "
          f"copy {bw['copy']:.1f} GB/s, read-only sum {bw['sum']:.1f} GB/s; "
          f"%BW columns are fractions of the triad (measured again at the end)", flush=True)
    rates = peak.measure()
    print(f"multiply-add peak (same run, OpenMP C, best of 5): float32 {rates['f32']:.0f} GFLOP/s, "
          f"float64 {rates['f64']:.0f} GFLOP/s; the conv layer's kernels are given as shares "
          f"of it (measured again at the end)", flush=True)
    for name, avail in (("jax", None if args.no_jax else frameworks.jax_available(x64=True)),
                        ("torch", None if args.no_torch else frameworks.torch_available())):
        if avail is None:
            print(f"{name}: skipped (--no-{name})")
        else:
            print(f"{name}: {avail[1] if avail[0] else 'not available (' + avail[1] + ')'}")
    cmd = "python benchmarks/run.py " + " ".join(argv if argv is not None else sys.argv[1:])
    print(f"command: {cmd.strip()}")
    print(f"timing: {args.stat} of {repeats} interleaved rounds (an entry past its time budget "
          f"stops after 3); "
          f"sizes {sizes}; dtypes {list(dtypes)}")
    sys.stdout.flush()

    cold = {}
    if not args.no_cold_compile:
        for dt in dtypes:
            cold[dt] = cold_compile(dt)

    results = []
    benches = ALL_BENCHES if "all" in args.bench else args.bench
    todo = [(size, dt, bench) for size in sizes for dt in dtypes for bench in benches]
    for i, (size, dt, bench) in enumerate(todo, 1):
        t = time.perf_counter()
        case = suite.make_case(bench, size, dt)
        results.append(run_case(case, timer, args))
        del case
        gc.collect()
        print(f"[{i}/{len(todo)}] {bench} {size} {dt}: {time.perf_counter() - t:.0f} s",
              file=sys.stderr, flush=True)

    # STREAM again at the end; the %BW columns use the better of the two measurements
    # (the machine's bandwidth, not a moment when other work was running)
    bw_end = stream.measure(mib_per_array=stream_mib, repeats=stream_reps)
    best = max(bw["triad"], bw_end["triad"])
    print(f"STREAM triad at the end: {bw_end['triad']:.1f} GB/s; the %BW columns use "
          f"{best:.1f} GB/s, the better of start and end")
    rates_end = peak.measure()
    best_rates = {dt: max(rates[dt], rates_end[dt]) for dt in rates}
    print(f"multiply-add peak at the end: float32 {rates_end['f32']:.0f} GFLOP/s, float64 "
          f"{rates_end['f64']:.0f} GFLOP/s; the shares use the better of start and end")
    for res in results:
        add_bandwidth(res, best)
        add_peak(res, best_rates)
        print()
        print(format_case(res))
    print()
    print("targets (issues #4, #10):")
    for line in summarize_targets(results, cold):
        print("  " + line)
    total = time.perf_counter() - t_start
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0, 0, 0)
    print(f"load average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
          f"total time {total:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": cmd, "machine": machine_info(), "stream": bw,
                       "stream_end": bw_end, "peak": rates, "peak_end": rates_end, "cold": cold,
                       "results": results, "total_s": total}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
