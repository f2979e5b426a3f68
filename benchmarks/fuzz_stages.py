"""Compile time, stage by stage, of a fuzz case's kernel and of its vjp.

    python benchmarks/fuzz_stages.py SEED [SEED ...] [--without-unit-strides]

For each seed of the differential fuzzer (``tests/fuzz``), the generated kernel is
compiled (``pipeline.compile_kernel``, OpenMP, default options) and so is its vjp
with respect to the inputs the fuzzer differentiates; each line gives the wall time,
the lines of C and the stage times that ``StageClock`` logs. ``--without-unit-strides``
compiles with ``schedule.strides.unit_stride_loops`` replaced by the identity, to
measure what that pass saves (benchmarks/README.md, "nineteenth round").
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import polyad as pa  # noqa: E402
from polyad import pipeline  # noqa: E402
from polyad.schedule import build  # noqa: E402
from tests.fuzz.check import differentiable_inputs  # noqa: E402
from tests.fuzz.gen import generate  # noqa: E402


class _Totals(logging.Handler):
    """Keeps the last per-kernel summary line ``StageClock.close`` logs."""

    def __init__(self):
        super().__init__()
        self.last = ""

    def emit(self, record):
        message = record.getMessage()
        if message.startswith("compile ") and "(" in message:
            self.last = message


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("seeds", type=int, nargs="+")
    ap.add_argument("--without-unit-strides", action="store_true")
    args = ap.parse_args(argv)
    if args.without_unit_strides:
        build.unit_stride_loops = lambda kernel: (kernel, [])
    totals = _Totals()
    logger = logging.getLogger("polyad")
    logger.setLevel(logging.INFO)
    logger.addHandler(totals)
    warnings.simplefilter("ignore")
    workdir = Path(tempfile.mkdtemp(prefix="polyad-fuzz-stages-"))
    for seed in args.seeds:
        case = generate(seed)
        path = workdir / f"fuzz_{seed}.py"
        path.write_text(case.dsl)
        spec = importlib.util.spec_from_file_location(f"fuzz_{seed}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        kernel = module.fz_kernel
        for label, k in (("primal", kernel), ("vjp", pa.vjp(kernel, differentiable_inputs(case)))):
            start = time.perf_counter()
            art = pipeline.compile_kernel(k.ir)
            print(f"seed {seed} {label}: {time.perf_counter() - start:.1f} s, "
                  f"{len(art.source.splitlines())} lines of C")
            print(f"    {totals.last}", flush=True)


if __name__ == "__main__":
    main()
