"""PolyBench/C 4.2 kernels in the polyad DSL, beside their C in this folder.

Each kernel is the DSL transcription of the ``kernel_<name>`` function of
``<name>.c`` (same statements, same loop order, same parameter names for the
arrays and scalars), so one argument dictionary runs both: the C takes the
sizes as ``int`` parameters, polyad infers them from the array shapes (sizes
that no array has, the time steps, are keywords). ``benchmarks/polybench.py``
times each against its C; ``tests/test_polybench.py`` checks them against the
reference interpreter and asserts the schedule decisions made on them.
"""

import polyad as pa

M, N, NI, NJ, NK, NL = pa.sizes("M N NI NJ NK NL")
NR, NQ, NP, TSTEPS, TMAX, NX, NY = pa.sizes("NR NQ NP TSTEPS TMAX NX NY")


@pa.kernel
def gemm(alpha: pa.f64, beta: pa.f64, C: pa.f64[NI, NJ], A: pa.f64[NI, NK],
         B: pa.f64[NK, NJ]):
    for i in range(NI):
        for j in range(NJ):
            C[i, j] *= beta
        for k in range(NK):
            for j in range(NJ):
                C[i, j] += alpha * A[i, k] * B[k, j]


@pa.kernel
def mm2(alpha: pa.f64, beta: pa.f64, tmp: pa.f64[NI, NJ], A: pa.f64[NI, NK],
        B: pa.f64[NK, NJ], C: pa.f64[NJ, NL], D: pa.f64[NI, NL]):
    for i in range(NI):
        for j in range(NJ):
            tmp[i, j] = 0.0
            for k in range(NK):
                tmp[i, j] += alpha * A[i, k] * B[k, j]
    for i in range(NI):
        for j in range(NL):
            D[i, j] *= beta
            for k in range(NJ):
                D[i, j] += tmp[i, k] * C[k, j]


@pa.kernel
def atax(A: pa.f64[M, N], x: pa.f64[N], y: pa.f64[N], tmp: pa.f64[M]):
    for i in range(N):
        y[i] = 0.0
    for i in range(M):
        tmp[i] = 0.0
        for j in range(N):
            tmp[i] = tmp[i] + A[i, j] * x[j]
        for j in range(N):
            y[j] = y[j] + A[i, j] * tmp[i]


@pa.kernel
def bicg(A: pa.f64[N, M], s: pa.f64[M], q: pa.f64[N], p: pa.f64[M], r: pa.f64[N]):
    for i in range(M):
        s[i] = 0.0
    for i in range(N):
        q[i] = 0.0
        for j in range(M):
            s[j] = s[j] + r[i] * A[i, j]
            q[i] = q[i] + A[i, j] * p[j]


@pa.kernel
def mvt(x1: pa.f64[N], x2: pa.f64[N], y_1: pa.f64[N], y_2: pa.f64[N], A: pa.f64[N, N]):
    for i in range(N):
        for j in range(N):
            x1[i] = x1[i] + A[i, j] * y_1[j]
    for i in range(N):
        for j in range(N):
            x2[i] = x2[i] + A[j, i] * y_2[j]


@pa.kernel
def gemver(alpha: pa.f64, beta: pa.f64, A: pa.f64[N, N], u1: pa.f64[N], v1: pa.f64[N],
           u2: pa.f64[N], v2: pa.f64[N], w: pa.f64[N], x: pa.f64[N], y: pa.f64[N],
           z: pa.f64[N]):
    for i in range(N):
        for j in range(N):
            A[i, j] = A[i, j] + u1[i] * v1[j] + u2[i] * v2[j]
    for i in range(N):
        for j in range(N):
            x[i] = x[i] + beta * A[j, i] * y[j]
    for i in range(N):
        x[i] = x[i] + z[i]
    for i in range(N):
        for j in range(N):
            w[i] = w[i] + alpha * A[i, j] * x[j]


@pa.kernel
def syrk(alpha: pa.f64, beta: pa.f64, C: pa.f64[N, N], A: pa.f64[N, M]):
    for i in range(N):
        for j in range(i + 1):
            C[i, j] *= beta
        for k in range(M):
            for j in range(i + 1):
                C[i, j] += alpha * A[i, k] * A[j, k]


@pa.kernel
def doitgen(A: pa.f64[NR, NQ, NP], C4: pa.f64[NP, NP], sum: pa.f64[NP]):
    for r in range(NR):
        for q in range(NQ):
            for p in range(NP):
                sum[p] = 0.0
                for s in range(NP):
                    sum[p] += A[r, q, s] * C4[s, p]
            for p in range(NP):
                A[r, q, p] = sum[p]


@pa.kernel
def covariance(float_n: pa.f64, data: pa.f64[N, M], cov: pa.f64[M, M], mean: pa.f64[M]):
    for j in range(M):
        mean[j] = 0.0
        for i in range(N):
            mean[j] += data[i, j]
        mean[j] /= float_n
    for i in range(N):
        for j in range(M):
            data[i, j] -= mean[j]
    for i in range(M):
        for j in range(i, M):
            cov[i, j] = 0.0
            for k in range(N):
                cov[i, j] += data[k, i] * data[k, j]
            cov[i, j] /= float_n - 1.0
            cov[j, i] = cov[i, j]


@pa.kernel
def lu(A: pa.f64[N, N]):
    for i in range(N):
        for j in range(i):
            for k in range(j):
                A[i, j] -= A[i, k] * A[k, j]
            A[i, j] /= A[j, j]
        for j in range(i, N):
            for k in range(i):
                A[i, j] -= A[i, k] * A[k, j]


@pa.kernel
def cholesky(A: pa.f64[N, N]):
    for i in range(N):
        for j in range(i):
            for k in range(j):
                A[i, j] -= A[i, k] * A[j, k]
            A[i, j] /= A[j, j]
        for k in range(i):
            A[i, i] -= A[i, k] * A[i, k]
        A[i, i] = pa.sqrt(A[i, i])


@pa.kernel
def trisolv(L: pa.f64[N, N], x: pa.f64[N], b: pa.f64[N]):
    for i in range(N):
        x[i] = b[i]
        for j in range(i):
            x[i] -= L[i, j] * x[j]
        x[i] = x[i] / L[i, i]


@pa.kernel
def floyd_warshall(path: pa.f64[N, N]):
    for k in range(N):
        for i in range(N):
            for j in range(N):
                path[i, j] = min(path[i, j], path[i, k] + path[k, j])


@pa.kernel
def jacobi_2d(A: pa.f64[N, N], B: pa.f64[N, N]):
    for t in range(TSTEPS):
        for i in range(1, N - 1):
            for j in range(1, N - 1):
                B[i, j] = 0.2 * (A[i, j] + A[i, j - 1] + A[i, 1 + j] + A[1 + i, j] + A[i - 1, j])
        for i in range(1, N - 1):
            for j in range(1, N - 1):
                A[i, j] = 0.2 * (B[i, j] + B[i, j - 1] + B[i, 1 + j] + B[1 + i, j] + B[i - 1, j])


@pa.kernel
def seidel_2d(A: pa.f64[N, N]):
    for t in range(TSTEPS):
        for i in range(1, N - 1):
            for j in range(1, N - 1):
                A[i, j] = (A[i - 1, j - 1] + A[i - 1, j] + A[i - 1, j + 1]
                           + A[i, j - 1] + A[i, j] + A[i, j + 1]
                           + A[i + 1, j - 1] + A[i + 1, j] + A[i + 1, j + 1]) / 9.0


@pa.kernel
def heat_3d(A: pa.f64[N, N, N], B: pa.f64[N, N, N]):
    for t in range(1, TSTEPS + 1):
        for i in range(1, N - 1):
            for j in range(1, N - 1):
                for k in range(1, N - 1):
                    B[i, j, k] = (0.125 * (A[i + 1, j, k] - 2.0 * A[i, j, k] + A[i - 1, j, k])
                                  + 0.125 * (A[i, j + 1, k] - 2.0 * A[i, j, k] + A[i, j - 1, k])
                                  + 0.125 * (A[i, j, k + 1] - 2.0 * A[i, j, k] + A[i, j, k - 1])
                                  + A[i, j, k])
        for i in range(1, N - 1):
            for j in range(1, N - 1):
                for k in range(1, N - 1):
                    A[i, j, k] = (0.125 * (B[i + 1, j, k] - 2.0 * B[i, j, k] + B[i - 1, j, k])
                                  + 0.125 * (B[i, j + 1, k] - 2.0 * B[i, j, k] + B[i, j - 1, k])
                                  + 0.125 * (B[i, j, k + 1] - 2.0 * B[i, j, k] + B[i, j, k - 1])
                                  + B[i, j, k])


@pa.kernel
def fdtd_2d(ex: pa.f64[NX, NY], ey: pa.f64[NX, NY], hz: pa.f64[NX, NY], _fict_: pa.f64[TMAX]):
    for t in range(TMAX):
        for j in range(NY):
            ey[0, j] = _fict_[t]
        for i in range(1, NX):
            for j in range(NY):
                ey[i, j] = ey[i, j] - 0.5 * (hz[i, j] - hz[i - 1, j])
        for i in range(NX):
            for j in range(1, NY):
                ex[i, j] = ex[i, j] - 0.5 * (hz[i, j] - hz[i, j - 1])
        for i in range(NX - 1):
            for j in range(NY - 1):
                hz[i, j] = hz[i, j] - 0.7 * (ex[i, j + 1] - ex[i, j] + ey[i + 1, j] - ey[i, j])
