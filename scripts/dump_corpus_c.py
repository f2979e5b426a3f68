"""Dump the generated C of the test and benchmark corpora into one file per kernel.

Used to diff the emitted C before and after a change to the compiler:

    python scripts/dump_corpus_c.py OUTDIR
    diff -r BEFORE AFTER

Kernels: every module-level ``pa.Kernel`` of ``tests/*.py``, ``examples/*.py``
and ``benchmarks/kernels.py``, every case of the AD corpus
(``tests/test_ad_corpus.py``), and the reverse-mode gradient of every kernel
that returns a scalar, with respect to each float array parameter. Each is
emitted in the default and the deterministic mode (nothing is compiled).
"""

from __future__ import annotations

import importlib.util
import sys
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]

import polyad as pa  # noqa: E402
from polyad import ad  # noqa: E402


def emitted_source(k: pa.Kernel, deterministic: bool) -> str:
    try:
        from polyad.pipeline import Options, compile_kernel
    except ImportError:
        from polyad.emit.c_openmp import emit_openmp
        from polyad.schedule import schedule_kernel
        return emit_openmp(schedule_kernel(k.ir, deterministic=deterministic))
    return compile_kernel(k.ir, Options(deterministic=deterministic)).source


def load(path: Path):
    spec = importlib.util.spec_from_file_location(f"corpus_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def corpus() -> dict:
    kernels: dict = {}
    paths = sorted((ROOT / "tests").glob("*.py")) + sorted((ROOT / "examples").glob("*.py")) \
        + [ROOT / "benchmarks" / "kernels.py"]
    for path in paths:
        try:
            mod = load(path)
        except Exception:
            print(f"skip {path.name}: import failed", file=sys.stderr)
            continue
        for name, obj in sorted(vars(mod).items()):
            if isinstance(obj, pa.Kernel):
                kernels.setdefault(f"{path.stem}.{name}", obj)
        if path.stem == "test_ad_corpus":
            for case, spec in sorted(mod.CASES.items()):
                k, _ = spec["make"](np.random.default_rng(0))
                kernels.setdefault(f"ad_corpus.{case}", k)
    for key, k in list(kernels.items()):
        if k.ir.result is None:
            continue
        for p in k.ir.params:
            if p.is_array and p.type.dtype.is_float:
                try:
                    kernels[f"{key}.grad_{p.name}"] = pa.Kernel(ir_kernel=ad.grad_kernel(k.ir, p.name))
                except pa.PolyadError:
                    pass
    return kernels


def main(out: str) -> None:
    outdir = Path(out)
    outdir.mkdir(parents=True, exist_ok=True)
    for key, k in corpus().items():
        for det in (False, True):
            path = outdir / f"{key}{'.det' if det else ''}.c"
            try:
                path.write_text(emitted_source(k, det))
            except Exception:
                path.write_text("ERROR\n" + traceback.format_exc(limit=1).splitlines()[-1] + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
