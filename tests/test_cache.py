"""The compile cache (POLYAD_CACHE_DIR, read at compile time) is safe under
concurrent use and is actually used."""

import os
import subprocess
import sys
import textwrap
import time

import numpy as np

import polyad as pa

SCRIPT = textwrap.dedent(
    '''
    import os
    import sys
    import time

    import numpy as np
    import polyad as pa

    M, N = pa.sizes("M N")


    @pa.kernel
    def cache_race_blur(x: pa.f64[M, N].clamped, w: pa.f64, y: pa.Out(pa.f64[M, N])):
        for m in range(M):
            for n in range(N):
                y[m, n] = w * (x[m - 1, n] + x[m + 1, n] + x[m, n - 1] + x[m, n + 1])


    def main():
        go = sys.argv[1]
        if len(sys.argv) > 2:  # tell the parent this process is ready
            open(sys.argv[2], "w").close()
        deadline = time.time() + 120
        while not os.path.exists(go):  # start compiling at the same moment
            if time.time() > deadline:
                sys.exit("go file never appeared")
            time.sleep(0.002)
        x = np.arange(35.0).reshape(5, 7) ** 1.5
        y = cache_race_blur(x, 0.25)
        xp = np.pad(x, 1, mode="edge")
        ref = 0.25 * (xp[:-2, 1:-1] + xp[2:, 1:-1] + xp[1:-1, :-2] + xp[1:-1, 2:])
        np.testing.assert_allclose(y, ref, rtol=1e-12)
        print("CACHE-SCRIPT-OK")


    if __name__ == "__main__":
        main()
    '''
)


def _env(repo_root, cache_dir):
    env = dict(os.environ)
    env["POLYAD_CACHE_DIR"] = str(cache_dir)
    env["PYTHONPATH"] = os.pathsep.join([repo_root] + [p for p in [env.get("PYTHONPATH")] if p])
    return env


def _files_under(d):
    return [os.path.join(r, f) for r, _, fs in os.walk(d) for f in fs]


def test_concurrent_compiles_share_fresh_cache_dir(tmp_path, repo_root):
    script = tmp_path / "cache_race.py"
    script.write_text(SCRIPT)
    cache = tmp_path / "fresh_cache"  # does not exist yet
    go = tmp_path / "go"
    env = _env(repo_root, cache)
    ready = [tmp_path / f"ready{k}" for k in range(2)]
    procs = [
        subprocess.Popen([sys.executable, str(script), str(go), str(r)], env=env,
                         cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
        for r in ready
    ]
    # release both at the same moment, once both have imported polyad and defined the kernel
    deadline = time.time() + 120
    while not all(r.exists() for r in ready) and time.time() < deadline:
        if any(p.poll() is not None for p in procs):
            break
        time.sleep(0.01)
    go.write_text("go")
    results = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, results):
        assert p.returncode == 0, out + err
        assert "CACHE-SCRIPT-OK" in out, out + err
    assert _files_under(cache), "nothing was written to POLYAD_CACHE_DIR"

    # a third run finds the populated cache and still works
    p3 = subprocess.run([sys.executable, str(script), str(go)], env=env, cwd=str(tmp_path),
                        capture_output=True, text=True, timeout=600)
    assert p3.returncode == 0 and "CACHE-SCRIPT-OK" in p3.stdout, p3.stdout + p3.stderr


def test_cache_dir_env_read_at_compile_time(tmp_path, monkeypatch):
    cache = tmp_path / "cache_here"
    monkeypatch.setenv("POLYAD_CACHE_DIR", str(cache))
    (n,) = pa.sizes("N")

    @pa.kernel
    def cache_env_probe(x: pa.f64[n], y: pa.Out(pa.f64[n])):
        for i in range(n):
            y[i] = 3.0 * x[i] - 1.0

    x = np.linspace(0.0, 1.0, 5)
    np.testing.assert_allclose(cache_env_probe(x), 3.0 * x - 1.0, rtol=1e-14)
    assert _files_under(cache), "the kernel was not cached under POLYAD_CACHE_DIR"
