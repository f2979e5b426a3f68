#!/usr/bin/env python
"""Memory of gradients through in-place loop programs (issue 19).

    python benchmarks/memory.py                  # the table of benchmarks/README.md
    python benchmarks/memory.py --quick          # smaller sizes, 1 repeat
    python benchmarks/memory.py --only cholesky rnn --repeats 5
    python benchmarks/memory.py --table checkpointed   # the checkpointed rows alone
    python benchmarks/memory.py --table packing        # packed vs boxed triangular tapes

For cholesky, lu, floyd-warshall, seidel-2d, an explicit nonlinear diffusion
and a recurrent cell (``tests/tape_kernels.py``), ``pa.grad`` of a scalar cost
with respect to the in-place matrix (the recurrent cell: its inputs, weights
and state), each row measured in a child process:

* ``tape formula``: the tapes of the derived kernel (``pa.explain`` lists the
  same), and their bytes at this size, with the exact to-be-recorded analysis
  and without it (``exact_tapes=False``, the structural checks polyad used
  before; predicted from the formula, measured only where it fits);
* ``extra RSS``: the gradient call's peak resident memory over the forward
  call's (``VmHWM`` of the child, reset through ``/proc/self/clear_refs``
  before each; the inputs, the compiled code and polyad itself are resident
  before both);
* ``grad/fwd``: median gradient time over median forward time, same child.

Rows whose tapes exceed the memory budget (``--memory``, default 3GB here)
say ``over budget``: with ``checkpoint=False`` polyad raises ``MemoryBudgetError``
before allocating (``tests/test_ad_recorded.py`` checks that it does); they are not
run. One OpenMP thread (``OMP_NUM_THREADS=1``): the machine these numbers come from
has two cores shared with other jobs.

A second table runs gradients whose tapes exceed a small budget, so that polyad
checkpoints their loop (``polyad.checkpointing``; the diffusion at N = 1000,
T = 500 under 256 MB): the snapshots and recomputed steps the binomial schedule
chose, the bytes of one snapshot, extra RSS and grad/fwd measured as above.

A third table (``--table packing``, not part of ``both``) compares tapes over
triangular loops stored packed (``polyad/ad/layout.py``) with the same
gradient's tapes in their bounding box (``packed_tapes=False``): bytes, and
gradient time with the two compiled gradients called alternately in one
process (one thread), medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tests"))
if "polyad" not in sys.modules:
    import importlib.util
    if importlib.util.find_spec("polyad") is None:  # a plain checkout, not pip-installed
        sys.path.insert(0, str(ROOT))

#: name -> (size, steps) of the full run and of --quick
SIZES = {
    "cholesky": [(400, 0), (1500, 0)],
    "lu": [(400, 0), (1000, 0)],
    "floyd-warshall": [(200, 0), (800, 0)],
    "seidel-2d": [(1000, 100)],
    "diffusion": [(200, 100), (1000, 50), (1000, 500)],
    "rnn": [(256, 1000)],
}
QUICK = {
    "cholesky": [(200, 0)], "lu": [(200, 0)], "floyd-warshall": [(100, 0)],
    "seidel-2d": [(200, 20)], "diffusion": [(100, 20)], "rnn": [(64, 100)],
}
#: name -> sizes of the packing rows (full run, --quick)
PACKING = {"cholesky": [1500], "lu": [1000], "triangles": [400]}
PACKING_QUICK = {"cholesky": [300], "lu": [300], "triangles": [100]}
#: name -> (size, steps, budget) of the checkpointed rows (full run, --quick)
CHECKPOINTED = {"diffusion": [(1000, 500, "256MB")]}
CHECKPOINTED_QUICK = {"diffusion": [(100, 20, "1.5MB")]}


def hwm_kib() -> int:
    """Peak resident set of this process since the last reset, KiB."""
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError("no VmHWM in /proc/self/status")


def reset_hwm() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def child(name: str, n: int, steps: int, exact: bool, repeats: int, memory: str) -> dict:
    """One measurement (runs in a fresh process): see the module docstring."""
    import numpy as np

    import polyad as pa
    from polyad import ad, checkpointing
    from polyad.derivatives import DerivedKernel
    from tape_kernels import KERNELS, make_args

    kernel, wrt = KERNELS[name]
    if exact:
        # checkpointed when the tapes exceed ``memory`` (the second table's rows)
        g = pa.grad(kernel, wrt, memory=memory)
    else:
        g = DerivedKernel(ad.grad_kernel(kernel.ir, wrt, exact_tapes=False), "grad", kernel, wrt)
        g.memory = memory
        g.checkpoint = False
    args = make_args(name, n, np.random.default_rng(0), steps=max(steps, 1))

    def fresh():
        return {k: np.copy(v) if isinstance(v, np.ndarray) else v for k, v in args.items()}

    fwd_fn = pa.compile(kernel)
    if exact and checkpointing.needs_checkpointing(g, (), fresh()):
        checkpointing.checkpointer(g).compile_all()   # compile outside the measurement
    else:
        g.compile()
    fwd_args, grad_args = fresh(), fresh()
    reset_hwm()
    base = hwm_kib()
    fwd_fn(**fwd_args)
    fwd_peak = hwm_kib()
    reset_hwm()
    try:
        g(**grad_args)
    except pa.MemoryBudgetError as exc:
        return {"error": str(exc).split("\n")[0]}
    grad_peak = hwm_kib()

    def median(fn):
        samples = []
        for _ in range(repeats):
            a = fresh()
            t = time.perf_counter()
            fn(**a)
            samples.append(time.perf_counter() - t)
        return statistics.median(samples)

    t_fwd, t_grad = median(fwd_fn), median(g)
    plan = checkpointing.checkpointer(g).last_plan if exact and g.__dict__.get(
        "_checkpointer") else None
    return {"base_kib": base, "fwd_peak_kib": fwd_peak, "grad_peak_kib": grad_peak,
            "t_fwd": t_fwd, "t_grad": t_grad,
            "plan": None if plan is None else {"snapshots": plan.snapshots,
                                               "advances": plan.advances,
                                               "steps": plan.steps,
                                               "snapshot_bytes": plan.snapshot_bytes}}


def tape_info(name: str, n: int, steps: int, exact: bool) -> tuple[str, int]:
    """(tape formula, tape bytes at this size) of the derived kernel."""
    from polyad import ad
    from polyad.runtime.budget import size_formula
    from tape_kernels import KERNELS

    kernel, wrt = KERNELS[name]
    gk = ad.grad_kernel(kernel.ir, wrt, exact_tapes=exact)
    sizes = {"N": n, "T": steps, "steps": steps}
    counts: dict = {}
    for t in ad.tape_arrays(gk):
        counts[size_formula(t)] = counts.get(size_formula(t), 0) + 1
    formula = " + ".join(f if c == 1 else f"{c} x {f}" for f, c in counts.items()) or "0"
    return formula, ad.tape_bytes(gk, sizes)


def run_child(name, n, steps, exact, repeats, memory) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    cmd = [sys.executable, __file__, "--child", name, str(n), str(steps), str(int(exact)),
           str(repeats), memory]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": f"child failed: {proc.stderr.strip().splitlines()[-1:]}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def mib(n_bytes: float) -> str:
    return f"{n_bytes / 2 ** 20:,.1f} MiB" if n_bytes < 2 ** 30 else f"{n_bytes / 2 ** 30:.1f} GiB"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--memory", default="3GB", help="the gradient's memory budget")
    ap.add_argument("--table", choices=("both", "taped", "checkpointed", "packing"),
                    default="both", help="print only the first table (taped), the second "
                                         "(checkpointed), or the packed-vs-boxed tapes")
    ap.add_argument("--child", nargs=6, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        name, n, steps, exact, repeats, memory = a.child
        print(json.dumps(child(name, int(n), int(steps), bool(int(exact)), int(repeats), memory)))
        return 0
    from polyad.runtime.budget import parse_bytes
    table = QUICK if a.quick else SIZES
    repeats = 1 if a.quick else a.repeats
    if a.table == "packing":
        packing(PACKING_QUICK if a.quick else PACKING, a.only, max(repeats, 3))
        return 0
    print(f"pa.grad memory and time, one OpenMP thread, median of {repeats}"
          + (f", budget {a.memory}" if a.table != "checkpointed" else ""))
    head = ("kernel", "size", "tapes now (formula)", "tapes now", "tapes before",
            "extra RSS now", "extra RSS before", "grad/fwd now", "grad/fwd before", "fwd s")
    if a.table != "checkpointed":
        print(" | ".join(head))
    for name, cases in table.items() if a.table != "checkpointed" else ():
        if a.only and name not in a.only:
            continue
        for n, steps in cases:
            size = f"N={n}" + (f", T={steps}" if steps else "")
            formula, now_bytes = tape_info(name, n, steps, True)
            _, before_bytes = tape_info(name, n, steps, False)
            cells = {}
            for exact in (True, False):
                if (now_bytes if exact else before_bytes) > parse_bytes(a.memory):
                    cells[exact] = ("over budget", "—", None)
                    continue
                r = run_child(name, n, steps, exact, repeats, a.memory)
                if "error" in r:
                    cells[exact] = ("over budget" if "budget" in r["error"] else r["error"], "—",
                                    None)
                    continue
                extra = max(0, r["grad_peak_kib"] - r["fwd_peak_kib"]) * 1024
                cells[exact] = (mib(extra), f"{r['t_grad'] / r['t_fwd']:.1f}", r["t_fwd"])
            t_fwd = cells[True][2] if cells[True][2] is not None else cells[False][2]
            print(" | ".join([name, size, formula, mib(now_bytes), mib(before_bytes),
                              cells[True][0], cells[False][0], cells[True][1], cells[False][1],
                              "—" if t_fwd is None else f"{t_fwd:.3f}"]), flush=True)
    if a.table != "taped":
        checkpointed(CHECKPOINTED_QUICK if a.quick else CHECKPOINTED, a.only, repeats)
    return 0


def packing(table: dict, only, repeats: int) -> None:
    """The third table: triangular tapes packed vs in their bounding box (same gradient)."""
    import numpy as np

    import polyad as pa
    from polyad import ad
    from polyad.derivatives import DerivedKernel
    from tape_kernels import KERNELS, make_args

    print(f"tapes over triangular loops, packed vs boxed: one OpenMP thread, the two "
          f"gradients called alternately, median of {repeats}")
    print(" | ".join(("kernel", "size", "packed tapes", "boxed tapes", "grad s packed",
                      "grad s boxed", "packed/boxed", "same gradient")))
    for name, sizes in table.items():
        if only and name not in only:
            continue
        kernel, wrt = KERNELS[name]
        fns = {packed: pa.compile(DerivedKernel(
            ad.grad_kernel(kernel.ir, wrt, packed_tapes=packed), "grad", kernel, wrt))
            for packed in (True, False)}
        for n in sizes:
            args = make_args(name, n, np.random.default_rng(0))
            times: dict = {True: [], False: []}
            outs = {}
            with pa.num_threads(1):
                for _ in range(repeats):
                    for packed, fn in fns.items():
                        a = {k: np.copy(v) if isinstance(v, np.ndarray) else v
                             for k, v in args.items()}
                        t = time.perf_counter()
                        outs[packed] = fn(**a)
                        times[packed].append(time.perf_counter() - t)
            same = all(np.array_equal(x, y) for x, y in zip(
                *(o if isinstance(o, tuple) else (o,) for o in outs.values())))
            t_packed, t_boxed = statistics.median(times[True]), statistics.median(times[False])
            tape = {p: ad.tape_bytes(fn.kernel, {"N": n}) for p, fn in fns.items()}
            print(" | ".join([name, f"N={n}", mib(tape[True]), mib(tape[False]),
                              f"{t_packed:.3f}", f"{t_boxed:.3f}", f"{t_packed / t_boxed:.2f}",
                              "yes" if same else "no"]), flush=True)


def checkpointed(table: dict, only, repeats: int) -> None:
    """The second table: gradients checkpointed under a budget their tapes exceed."""
    from polyad.checkpointing import checkpointer
    from polyad.derivatives import grad
    from tape_kernels import KERNELS
    print()
    print("checkpointed gradients (the tapes exceed the budget)")
    head = ("kernel", "size", "budget", "tapes unchecked", "snapshot (formula)", "snapshots",
            "steps recomputed / reversed", "extra RSS", "grad/fwd", "fwd s")
    print(" | ".join(head))
    for name, cases in table.items():
        if only and name not in only:
            continue
        kernel, wrt = KERNELS[name]
        formula = checkpointer(grad(kernel, wrt, checkpoint=True)).state_formula()
        for n, steps, memory in cases:
            size = f"N={n}" + (f", T={steps}" if steps else "")
            _, tape_bytes = tape_info(name, n, steps, True)
            r = run_child(name, n, steps, True, repeats, memory)
            if "error" in r:
                print(" | ".join([name, size, memory, mib(tape_bytes), formula, r["error"]]))
                continue
            p = r["plan"] or {}
            extra = max(0, r["grad_peak_kib"] - r["fwd_peak_kib"]) * 1024
            print(" | ".join([name, size, memory, mib(tape_bytes), formula,
                              str(p.get("snapshots", "not checkpointed")),
                              f"{p.get('advances', 0)} / {p.get('steps', 0)}", mib(extra),
                              f"{r['t_grad'] / r['t_fwd']:.1f}", f"{r['t_fwd']:.3f}"]),
                  flush=True)


if __name__ == "__main__":
    sys.exit(main())
