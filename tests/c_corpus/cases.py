"""The C corpus: which function of which file, the inputs it runs on, its sizes.

Each ``Case`` names a C function of ``tests/c_corpus/*.c`` and builds its
arguments (C parameter name -> value) for given dimensions: ``dims`` are
small (tests), ``bench`` large (benchmarks/c_corpus.py). ``macros`` maps the
file's ``#define``s that polyad keeps symbolic to size names (the ``sizes=``
of ``pa.from_c``); their values come from the dimensions and are passed to
gcc as ``-D``. ``wrt`` names the parameter a scalar cost is differentiated
with respect to.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import numpy as np

CORPUS = Path(__file__).resolve().parent


@dataclass
class Case:
    file: str
    func: str
    make: Callable[[np.random.Generator, dict], dict]
    dims: dict
    bench: dict
    macros: dict = field(default_factory=dict)
    rtol: float = 1e-10
    wrt: Optional[str] = None

    @property
    def path(self) -> Path:
        return CORPUS / self.file

    @property
    def id(self) -> str:
        return self.func

    def defines(self, dims: dict) -> dict:
        """-D values of the symbolic macros for these dimensions."""
        return {m: dims[s] for m, s in self.macros.items()}

    def size_keywords(self, dims: dict) -> dict:
        """Sizes the polyad call cannot infer from array shapes (macros in loop bounds)."""
        return {s: dims[s] for s in self.macros.values()}


def _r(rng, *shape):
    return rng.standard_normal(shape)


def _spd(rng, n):
    b = rng.standard_normal((n, n))
    return b @ b.T / n + np.eye(n)


def _dominant_lower(rng, n):
    return np.tril(rng.standard_normal((n, n))) * 0.3 + 2.0 * np.eye(n)


CASES = [
    Case("gemm.c", "kernel_gemm",
         lambda g, d: dict(ni=d["ni"], nj=d["nj"], nk=d["nk"], alpha=1.5, beta=1.2,
                           C=_r(g, d["ni"], d["nj"]), A=_r(g, d["ni"], d["nk"]),
                           B=_r(g, d["nk"], d["nj"])),
         dict(ni=7, nj=6, nk=5), dict(ni=500, nj=550, nk=600)),
    Case("2mm.c", "kernel_2mm",
         lambda g, d: dict(ni=d["ni"], nj=d["nj"], nk=d["nk"], nl=d["nl"], alpha=1.5, beta=1.2,
                           tmp=np.zeros((d["ni"], d["nj"])), A=_r(g, d["ni"], d["nk"]),
                           B=_r(g, d["nk"], d["nj"]), C=_r(g, d["nj"], d["nl"]),
                           D=_r(g, d["ni"], d["nl"])),
         dict(ni=5, nj=6, nk=7, nl=4), dict(ni=400, nj=450, nk=550, nl=600)),
    Case("atax.c", "kernel_atax",
         lambda g, d: dict(m=d["m"], n=d["n"], A=_r(g, d["m"], d["n"]), x=_r(g, d["n"]),
                           y=np.zeros(d["n"]), tmp=np.zeros(d["m"])),
         dict(m=6, n=8), dict(m=1900, n=2100)),
    Case("atax.c", "cost_atax",
         lambda g, d: dict(m=d["m"], n=d["n"], A=_r(g, d["m"], d["n"]), x=_r(g, d["n"]),
                           y=np.zeros(d["n"]), tmp=np.zeros(d["m"])),
         dict(m=6, n=8), dict(m=1900, n=2100), wrt="A"),
    Case("bicg.c", "kernel_bicg",
         lambda g, d: dict(m=d["m"], n=d["n"], A=_r(g, d["n"], d["m"]), s=np.zeros(d["m"]),
                           q=np.zeros(d["n"]), p=_r(g, d["m"]), r=_r(g, d["n"])),
         dict(m=6, n=8), dict(m=1900, n=2100)),
    Case("mvt.c", "kernel_mvt",
         lambda g, d: dict(n=d["n"], x1=_r(g, d["n"]), x2=_r(g, d["n"]), y_1=_r(g, d["n"]),
                           y_2=_r(g, d["n"]), A=_r(g, d["n"], d["n"])),
         dict(n=9), dict(n=2000)),
    Case("syrk.c", "kernel_syrk",
         lambda g, d: dict(n=d["n"], m=d["m"], alpha=1.5, beta=1.2, C=_r(g, d["n"], d["n"]),
                           A=_r(g, d["n"], d["m"])),
         dict(n=7, m=5), dict(n=500, m=400)),
    Case("trmm.c", "kernel_trmm",
         lambda g, d: dict(m=d["m"], n=d["n"], alpha=1.5, A=_r(g, d["m"], d["m"]),
                           B=_r(g, d["m"], d["n"])),
         dict(m=6, n=7), dict(m=200, n=250)),
    Case("gesummv.c", "kernel_gesummv",
         lambda g, d: dict(n=d["n"], alpha=1.5, beta=1.2, A=_r(g, d["n"], d["n"]),
                           B=_r(g, d["n"], d["n"]), tmp=np.zeros(d["n"]), x=_r(g, d["n"]),
                           y=np.zeros(d["n"])),
         dict(n=9), dict(n=2000)),
    Case("jacobi-1d.c", "kernel_jacobi_1d",
         lambda g, d: dict(tsteps=d["tsteps"], n=d["n"], A=_r(g, d["n"]), B=_r(g, d["n"])),
         dict(tsteps=4, n=12), dict(tsteps=100, n=100000)),
    Case("jacobi-1d.c", "cost_jacobi_1d",
         lambda g, d: dict(tsteps=d["tsteps"], n=d["n"], A=_r(g, d["n"]), B=_r(g, d["n"])),
         dict(tsteps=3, n=10), dict(tsteps=50, n=100000), wrt="A"),
    Case("jacobi-2d.c", "kernel_jacobi_2d",
         lambda g, d: dict(A=_r(g, d["n"], d["n"]), B=_r(g, d["n"], d["n"])),
         dict(n=10, tsteps=3), dict(n=500, tsteps=20), macros={"N": "n", "TSTEPS": "tsteps"}),
    Case("jacobi-2d.c", "cost_jacobi_2d",
         lambda g, d: dict(A=_r(g, d["n"], d["n"]), B=_r(g, d["n"], d["n"])),
         dict(n=8, tsteps=2), dict(n=500, tsteps=10), macros={"N": "n", "TSTEPS": "tsteps"},
         wrt="A"),
    Case("heat-3d.c", "kernel_heat_3d",
         lambda g, d: dict(tsteps=d["tsteps"], n=d["n"], A=_r(g, d["n"], d["n"], d["n"]),
                           B=_r(g, d["n"], d["n"], d["n"])),
         dict(tsteps=3, n=6), dict(tsteps=20, n=60)),
    Case("fdtd-2d.c", "kernel_fdtd_2d",
         lambda g, d: dict(tmax=d["tmax"], nx=d["nx"], ny=d["ny"], ex=_r(g, d["nx"], d["ny"]),
                           ey=_r(g, d["nx"], d["ny"]), hz=_r(g, d["nx"], d["ny"]),
                           _fict_=_r(g, d["tmax"])),
         dict(tmax=3, nx=7, ny=8), dict(tmax=20, nx=500, ny=600)),
    Case("seidel-2d.c", "kernel_seidel_2d",
         lambda g, d: dict(tsteps=d["tsteps"], n=d["n"], A=_r(g, d["n"], d["n"])),
         dict(tsteps=3, n=9), dict(tsteps=5, n=500)),
    Case("covariance.c", "kernel_covariance",
         lambda g, d: dict(m=d["m"], n=d["n"], float_n=float(d["n"]), data=_r(g, d["n"], d["m"]),
                           cov=np.zeros((d["m"], d["m"])), mean=np.zeros(d["m"])),
         dict(m=5, n=7), dict(m=400, n=500)),
    Case("correlation.c", "kernel_correlation",
         lambda g, d: dict(m=d["m"], n=d["n"], float_n=float(d["n"]), data=_r(g, d["n"], d["m"]),
                           corr=np.zeros((d["m"], d["m"])), mean=np.zeros(d["m"]),
                           stddev=np.zeros(d["m"])),
         dict(m=5, n=7), dict(m=400, n=500)),
    Case("correlation.c", "cost_correlation",
         lambda g, d: dict(m=d["m"], n=d["n"], float_n=float(d["n"]), data=_r(g, d["n"], d["m"]),
                           corr=np.zeros((d["m"], d["m"])), mean=np.zeros(d["m"]),
                           stddev=np.zeros(d["m"])),
         dict(m=4, n=6), dict(m=200, n=250), wrt="data"),
    Case("lu.c", "kernel_lu",
         lambda g, d: dict(n=d["n"], A=_spd(g, d["n"])),
         dict(n=8), dict(n=500)),
    Case("trisolv.c", "kernel_trisolv",
         lambda g, d: dict(n=d["n"], L=_dominant_lower(g, d["n"]), x=np.zeros(d["n"]),
                           b=_r(g, d["n"])),
         dict(n=9), dict(n=2000)),
    Case("trisolv.c", "cost_trisolv",
         lambda g, d: dict(n=d["n"], L=_dominant_lower(g, d["n"]), x=np.zeros(d["n"]),
                           b=_r(g, d["n"])),
         dict(n=7), dict(n=2000), wrt="L"),
    Case("cholesky.c", "kernel_cholesky",
         lambda g, d: dict(n=d["n"], A=_spd(g, d["n"])),
         dict(n=8), dict(n=500)),
    Case("blur.c", "blur3x3",
         lambda g, d: dict(h=d["h"], w=d["w"], x=_r(g, d["h"], d["w"]),
                           y=np.zeros((d["h"], d["w"]))),
         dict(h=7, w=5), dict(h=1024, w=1024)),
    Case("blur.c", "cost_blur",
         lambda g, d: dict(h=d["h"], w=d["w"], x=_r(g, d["h"], d["w"]),
                           y=np.zeros((d["h"], d["w"])), t=_r(g, d["h"], d["w"])),
         dict(h=6, w=5), dict(h=1024, w=1024), wrt="x"),
    Case("sobel.c", "sobel",
         lambda g, d: dict(h=d["h"], w=d["w"], img=_r(g, d["h"], d["w"]).astype(np.float32),
                           mag=np.zeros((d["h"], d["w"]), np.float32)),
         dict(h=6, w=7), dict(h=1024, w=1024), rtol=1e-5),
    Case("box_circular.c", "smooth_periodic",
         lambda g, d: dict(h=d["h"], w=d["w"], x=_r(g, d["h"], d["w"]),
                           y=np.zeros((d["h"], d["w"]))),
         dict(h=6, w=5), dict(h=1024, w=1024)),
    Case("tv.c", "tv_cost",
         lambda g, d: dict(M=d["M"], N=d["N"], g=_r(g, d["M"], d["N"]),
                           b=_r(g, d["M"], d["N"]), lam=0.3),
         dict(M=6, N=7), dict(M=1024, N=1024), wrt="g"),
    Case("softmax_rows.c", "logsumexp_rows",
         lambda g, d: dict(n=d["n"], m=d["m"], x=_r(g, d["n"], d["m"]), rowmax=np.zeros(d["n"])),
         dict(n=5, m=6), dict(n=1000, m=1000), wrt="x"),
]
