"""The conv layer's inner loop in several forms, one thread, its rows in L1 (``conv_loop_forms.c``).

Builds ``conv_loop_forms.c`` with polyad's flags (``cbuild``), checks every form's sums
against float64, then prints each form's best-of-rounds GFLOP/s and its share of one
core's multiply-add peak (``peak.measure`` over the threads it ran on).

Run directly: ``python benchmarks/conv_loop_forms.py [--passes N] [--rounds R]``.
"""

from __future__ import annotations

import argparse
import functools

import cbuild
import peak

CDEF = """
int clf_count(void);
const char *clf_name(int f);
double clf_error(int f);
double clf_gflops(int f, int passes, int rounds);
"""

@functools.lru_cache(maxsize=None)
def _forms_lib() -> cbuild.CLib:
    """``conv_loop_forms.c`` built and loaded, once per process."""
    return cbuild.CLib(cbuild.HERE / "conv_loop_forms.c", CDEF)


def _forms() -> list:
    """(index, name) of every form the C has."""
    clib = _forms_lib()
    return [(f, clib.ffi.string(clib.lib.clf_name(f)).decode())
            for f in range(clib.lib.clf_count())]


def errors() -> dict:
    """Form name -> the largest relative difference of one pass's sums from float64."""
    return {name: _forms_lib().lib.clf_error(f) for f, name in _forms()}


def rates(passes: int = 200_000, rounds: int = 5) -> dict:
    """Form name -> GFLOP/s (a multiply-add counts as two), best of ``rounds``."""
    return {name: _forms_lib().lib.clf_gflops(f, passes, rounds) for f, name in _forms()}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--passes", type=int, default=200_000,
                    help="output-channel passes over the row per round (default 200000)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds, the best kept (default 5)")
    args = ap.parse_args(argv)
    core = peak.measure()["f32"] / peak.threads()
    err = errors()
    bad = {name: e for name, e in err.items() if not e < 1e-6}
    if bad:
        raise SystemExit(f"forms whose sums differ from float64: {bad}")
    print(f"one core's float32 multiply-add peak: {core:.1f} GFLOP/s")
    print(f"{'form':<10} {'GFLOP/s':>9} {'of peak':>8} {'error':>9}")
    for name, rate in rates(args.passes, args.rounds).items():
        print(f"{name:<10} {rate:9.1f} {rate / core:8.0%} {err[name]:9.1e}")


if __name__ == "__main__":
    main()
