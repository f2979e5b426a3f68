"""``python -m tests.fuzz --cases N --seed S [--workers W] [--full] [--asan K] [--cuda-sim K]``.

Runs cases S .. S+N-1 in worker subprocesses (a crash or hang fails only its
case), prints each failure and a summary; exit status 1 when any case failed.
``--full`` runs every check on every case (default: the CI plan, which spreads
gradient, JAX and deterministic checks over the seeds); ``--asan K`` also runs
the first K cases under AddressSanitizer; ``--cuda-sim K`` the first K cases
built for the CUDA target and run by its CPU simulator, with every check.
"""

import argparse
import collections
import sys
import time

from .runner import run_cases


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__)
    ap.add_argument("--cases", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per case")
    ap.add_argument("--full", action="store_true", help="every check on every case")
    ap.add_argument("--asan", type=int, default=0, metavar="K",
                    help="also run the first K cases under AddressSanitizer")
    ap.add_argument("--cuda-sim", type=int, default=0, metavar="K",
                    help="also run the first K cases built for the CUDA target, through its "
                         "CPU simulator (every check but ASan)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print each case's result")
    args = ap.parse_args(argv)
    seeds = list(range(args.seed, args.seed + args.cases))
    start = time.perf_counter()

    def show(r):
        if r["status"] == "fail" or args.verbose:
            print(f"seed {r['seed']}: {r['status']} [{r['stage']}] "
                  f"{r['message'][:2000] if r['status'] != 'ok' else ''}", flush=True)

    results = run_cases(seeds, workers=args.workers, case_timeout=args.timeout,
                        full=args.full, on_result=show)
    asan = []
    if args.asan:
        print(f"-- under ASan: seeds {seeds[:args.asan]}", flush=True)
        asan = run_cases(seeds[:args.asan], workers=args.workers, case_timeout=args.timeout * 3,
                         full=False, sanitize="address", on_result=show)
    cuda = []
    if args.cuda_sim:
        print(f"-- CUDA target (simulator): seeds {seeds[:args.cuda_sim]}", flush=True)
        cuda = run_cases(seeds[:args.cuda_sim], workers=args.workers,
                         case_timeout=args.timeout * 2, full=True, target="cuda-sim",
                         on_result=show)
    elapsed = time.perf_counter() - start
    status = collections.Counter(r["status"] for r in results)
    checks = collections.Counter(c for r in results for c in r["checks"])
    print(f"\n{len(results)} cases (seeds {args.seed}..{args.seed + args.cases - 1}) in "
          f"{elapsed:.1f} s: " + ", ".join(f"{k} {v}" for k, v in sorted(status.items())))
    print("checks: " + ", ".join(f"{k} {v}" for k, v in sorted(checks.items())))
    print(f"size sets polyad refused (sizes too small): "
          f"{sum(r['size_rejected'] for r in results)}")
    unsupported = collections.Counter(r["message"].split("\n")[0][:120] for r in results
                                      if r["status"] == "unsupported")
    for msg, n in unsupported.most_common(10):
        print(f"  unsupported x{n}: {msg}")
    failed = [r["seed"] for r in results + asan + cuda if r["status"] == "fail"]
    if asan:
        print(f"ASan: {len(asan)} cases, failed {sum(r['status'] == 'fail' for r in asan)}")
    if cuda:
        print(f"CUDA (simulator): {len(cuda)} cases, failed "
              f"{sum(r['status'] == 'fail' for r in cuda)}, unsupported "
              f"{sum(r['status'] == 'unsupported' for r in cuda)}")
    if failed:
        print(f"FAILED seeds: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
