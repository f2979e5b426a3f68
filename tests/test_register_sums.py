"""The OpenMP plan's scalar sums: an 'omp simd' loop whose statements add into elements of
a privatized array invariant along it (the deconvolution's filter gradient
``d_f[k] += d_r[m, n] * t[m + k - 2, n]`` beside the ``d_t`` gather along a row) sums
each element in a scalar of its own under the reduction clause, instead of an
array-section reduction, which gcc 12 sets up and combines on every entry of the loop
and vectorizes poorly (2x on the float32 deconvolution gradient, one thread).
"""

import re
import numpy as np
import pytest

import polyad as pa
from polyad.pipeline import Options, artifact_of
from polyad.testing import interpret

from deconv_kernels import deconvolution

deconv64, deconv32 = deconvolution("f64"), deconvolution("f32")

N, T = pa.sizes("N T")


@pa.kernel
def steps_with_sums(x: pa.f32[N], s: pa.f32[2]):
    for t in range(T):
        for n in range(N):
            s[0] += x[n]
            s[1] += x[n] * x[n]
        for n in range(N):
            x[n] = 0.5 * x[n] + 1.0


def _plan(kernel, **options):
    return artifact_of(pa.grad(kernel, wrt=["x", "f"]), Options(**options)).plan


def test_filter_gradient_sums_in_scalars_along_the_row():
    p = _plan(deconv32)
    summed = [lp for lp in p.loops.values() if lp.register_sums]
    assert summed and all(lp.register_sums == ("d_f",) and lp.simd and "d_f" not in lp.privatized
                          for lp in summed)
    src = pa.grad(deconv32, wrt=["x", "f"]).source
    assert "float d_f_sum0 = 0;  // the sum of d_f[0] along the loop" in src
    assert "reduction(+:d_f_sum0, d_f_sum1, d_f_sum2, d_f_sum3, d_f_sum4)" in src
    assert "d_f_sum2 += d_r_expanded_rows[" in src  # (the residual's rows, fused)
    # every simd loop over a row sums in scalars: no array section is reduced per row
    assert "#pragma omp simd reduction(+:d_f[0:5])" not in src
    # each element gets its scalar once, after the loop, with its DSL line
    assert any(line.strip().startswith("d_f[4] += d_f_sum4;  // line ") for line in src.splitlines())
    assert "sums of d_f in scalars" in pa.explain(pa.grad(deconv32, wrt=["x", "f"]))


def test_a_worksharing_loop_in_a_parallel_region_keeps_the_array_section():
    """A sequential time loop runs in one thread team: its 'omp for' loops cannot reduce
    into scalars private to the team's threads, so they keep reduction(+:s[0:2])."""
    artifact = artifact_of(steps_with_sums, Options())
    worksharing = [lp for lp in artifact.plan.loops.values() if lp.region == "for"]
    assert worksharing and not any(lp.register_sums for lp in worksharing)
    assert re.search(r"#pragma omp for (simd )?schedule\(static\) reduction\(\+:s\[0:2\]\)",
                     artifact.source)
    rng = np.random.default_rng(10)
    for n, steps in [(1, 1), (5, 3), (40, 4)]:
        x, s = rng.standard_normal(n).astype(np.float32), rng.standard_normal(2).astype(np.float32)
        _, want = interpret(steps_with_sums.ir, dict(x=x.copy(), s=s.copy()), dict(N=n, T=steps))
        x_got, s_got = x.copy(), s.copy()
        pa.compile(steps_with_sums)(x_got, s_got, T=steps)
        np.testing.assert_allclose(s_got, want["s"], rtol=1e-5)
        np.testing.assert_allclose(x_got, want["x"], rtol=1e-6)


@pytest.mark.parametrize("kernel, rtol", [(deconv64, 1e-12), (deconv32, 2e-5)],
                         ids=["f64", "f32"])
@pytest.mark.parametrize("options", [{}, {"deterministic": True}],
                         ids=["default", "deterministic"])
def test_scalar_sums_match_the_interpreter(kernel, rtol, options):
    grad = pa.grad(kernel, wrt=["x", "f"])
    fn = pa.compile(grad, **options)
    dtype = np.float32 if kernel is deconv32 else np.float64
    rng = np.random.default_rng(7)
    for m, n in [(1, 1), (2, 3), (4, 4), (5, 2), (9, 37), (70, 65)]:
        x, y = rng.standard_normal((m, n)).astype(dtype), rng.standard_normal((m, n)).astype(dtype)
        f = rng.standard_normal(5).astype(dtype)
        dx, df = fn(x, f, y)
        _, want = interpret(grad.ir, dict(x=x.astype(np.float64), f=f.astype(np.float64),
                                          y=y.astype(np.float64)), dict(M=m, N=n))
        scale = np.abs(want["d_f"]).max()
        np.testing.assert_allclose(dx, want["d_x"], rtol=rtol, atol=rtol * np.abs(want["d_x"]).max())
        np.testing.assert_allclose(df, want["d_f"], rtol=rtol, atol=rtol * scale)
