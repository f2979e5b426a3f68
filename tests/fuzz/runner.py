"""Run fuzz cases in worker subprocesses, so that a hang or a crash (an ISL
abort, a segfault in generated code) is recorded as that case's result and
the run goes on.

A worker (``python -m tests.fuzz.runner SEED...``) checks its cases one by
one and prints one JSON line per case; the supervisor (``run_cases``) starts
workers, gives each case ``case_timeout`` seconds, and after a crash or a
timeout records the case and restarts a worker on the remaining seeds.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SELFTEST_CRASH = "POLYAD_FUZZ_SELFTEST_CRASH"   # seed whose worker segfaults on purpose
SELFTEST_HANG = "POLYAD_FUZZ_SELFTEST_HANG"     # seed whose worker hangs on purpose, mid-line
# ... first starting a child that holds the worker's pipes open (as gcc or a forked ISL
# analysis does when a case times out), and writing its pid to this file
SELFTEST_HANG_CHILD = "POLYAD_FUZZ_SELFTEST_HANG_CHILD"
START = "FUZZ-START "
DONE = "FUZZ-RESULT "
SOURCES = "POLYAD_FUZZ_SOURCES"   # where the workers of one run write the cases' modules


def plan(seed: int) -> dict:
    """Which checks a seed gets (the CI slice spreads the expensive ones)."""
    return {"grads": seed % 3 == 0, "use_jax": seed % 6 == 0, "deterministic": seed % 4 == 1}


def worker(seeds, full: bool, sanitize, target: str = "openmp") -> None:
    sys.path.insert(0, REPO)
    from tests.fuzz.check import check_case
    from tests.fuzz.gen import generate
    # the cases' modules where every worker of the run writes them: a kernel's file name
    # is part of its pipeline cache key, so a sanitized worker finds the schedules of
    # the plain one (run_cases)
    shared = os.environ.get(SOURCES)
    workdir = shared or tempfile.mkdtemp(prefix="polyad-fuzz-")
    if shared:
        os.makedirs(shared, exist_ok=True)
    try:
        for seed in seeds:
            print(START + str(seed), flush=True)
            if os.environ.get(SELFTEST_CRASH) == str(seed):   # the supervisor's own test
                os.kill(os.getpid(), signal.SIGSEGV)
            if os.environ.get(SELFTEST_HANG) == str(seed):
                child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
                if os.environ.get(SELFTEST_HANG_CHILD):
                    with open(os.environ[SELFTEST_HANG_CHILD], "w") as f:
                        f.write(str(child.pid))
                time.sleep(1.0)   # so that the partial line arrives on its own
                print("a line the worker never ends", end="", flush=True)
                time.sleep(3600)
            opts = {"grads": True, "use_jax": True, "deterministic": True} if full else plan(seed)
            if sanitize:
                opts["deterministic"] = False
                opts["use_jax"] = False    # jaxlib does not run under an ASan preload
            start = time.perf_counter()
            result = check_case(generate(seed), workdir, sanitize=sanitize, target=target,
                                **opts).as_dict()
            result["seconds"] = round(time.perf_counter() - start, 3)
            print(DONE + json.dumps(result), flush=True)
    finally:
        if not shared:
            shutil.rmtree(workdir, ignore_errors=True)


def gcc_library(name: str):
    """The path of gcc's library ``name`` (``libasan.so``), or None."""
    gcc = shutil.which("gcc")
    if gcc is None:
        return None
    path = subprocess.run([gcc, f"-print-file-name={name}"], capture_output=True,
                          text=True).stdout.strip()
    return path if os.path.isabs(path) and os.path.exists(path) else None


def libasan():
    return gcc_library("libasan.so")


def asan_preload() -> str:
    """``LD_PRELOAD`` for a process that loads sanitized kernels: libasan, and libstdc++
    as ``toolchain.ASAN_COMMAND`` says (islpy's C++ exceptions, caught while polyad
    compiles, abort under ASan otherwise)."""
    return " ".join(p for p in (libasan(), gcc_library("libstdc++.so")) if p)


def _spawn(seeds, full, sanitize, target, env):
    """A worker on ``seeds``, in a process group of its own (``_kill``)."""
    cmd = [sys.executable, "-m", "tests.fuzz.runner"] + (["--full"] if full else []) + \
          (["--sanitize"] if sanitize else []) + [f"--target={target}"] + [str(s) for s in seeds]
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _kill(p) -> None:
    """Kill worker ``p`` and what it started (a C compiler, a forked ISL analysis): left
    running, they would hold its pipes open and keep compiling a case given up on."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait()


def _read_available(stream) -> str:
    """What a non-blocking text pipe holds now ("" when nothing: a text stream's read
    raises TypeError where its raw read finds no data but the pipe is still open)."""
    try:
        return stream.read() or ""
    except (TypeError, OSError):
        return ""


def _env(sanitize, cache_dir):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([REPO] + [p for p in [env.get("PYTHONPATH")] if p])
    env.setdefault("POLYAD_CACHE_DIR", cache_dir)
    env[SOURCES] = os.path.join(cache_dir, "fuzz-cases")
    env["JAX_PLATFORMS"] = "cpu"
    env["OMP_WAIT_POLICY"] = "passive"
    if sanitize:
        env["LD_PRELOAD"] = asan_preload()
        env["ASAN_OPTIONS"] = "detect_leaks=0"
    return env


def run_cases(seeds, workers: int = 2, case_timeout: float = 120.0, full: bool = False,
              sanitize=None, cache_dir=None, on_result=None, target: str = "openmp") -> list[dict]:
    """Check ``seeds`` in ``workers`` parallel subprocesses, built for ``target``
    (``check.check_case``); returns one dict per seed."""
    own_cache = cache_dir is None
    cache_dir = cache_dir or tempfile.mkdtemp(prefix="polyad-fuzz-cache-")
    if sanitize:
        # ISL reports a failure it recovers from (the scheduler unable to carry a
        # dependence, an operation quota) as a C++ exception, which aborts a process with
        # ASan preloaded (seed 7100): plain workers schedule the kernels first, and the
        # sanitized ones read the schedules from the pipeline cache they share
        run_cases(seeds, workers, case_timeout, full, None, cache_dir)
    env = _env(sanitize, cache_dir)
    chunks = [list(seeds[i::workers]) for i in range(workers)]
    results: dict = {}
    procs = {}
    sel = selectors.DefaultSelector()

    def start(chunk):
        if not chunk:
            return
        p = _spawn(chunk, full, sanitize, target, env)
        procs[p] = {"pending": list(chunk), "current": None, "since": time.monotonic(),
                    "stderr": [], "partial": b""}
        sel.register(p.stdout, selectors.EVENT_READ, p)
        # Both pipes are read without blocking: a worker that prints part of a
        # line and then hangs must not stop the supervisor's timeout clock.
        os.set_blocking(p.stdout.fileno(), False)
        os.set_blocking(p.stderr.fileno(), False)

    def finish(p, status, message):
        st = procs.pop(p)
        sel.unregister(p.stdout)
        cur = st["current"]
        if cur is not None and cur not in results:
            err = "".join(st["stderr"]) + _read_available(p.stderr)
            results[cur] = {"seed": cur, "status": "fail", "stage": status,
                            "message": f"{message}\n{err[-4000:]}", "checks": [],
                            "features": [], "size_rejected": 0}
            if on_result:
                on_result(results[cur])
            st["pending"] = st["pending"][st["pending"].index(cur) + 1:]
        elif cur is None and st["pending"] and status != "exit":
            st["pending"] = st["pending"][1:]
        rest = [s for s in st["pending"] if s not in results]
        start(rest)

    for c in chunks:
        start(c)
    try:
        while procs:
            events = sel.select(timeout=1.0)
            for key, _ in events:
                p = key.data
                st = procs[p]
                try:
                    data = os.read(p.stdout.fileno(), 1 << 16)
                except BlockingIOError:
                    continue
                if not data:
                    _kill(p)
                    finish(p, "exit" if p.returncode == 0 else "crash",
                           f"worker exited with status {p.returncode}")
                    continue
                *lines, st["partial"] = (st["partial"] + data).split(b"\n")
                for line in (raw.decode(errors="replace") for raw in lines):
                    if line.startswith(START):
                        st["current"] = int(line[len(START):])
                        st["since"] = time.monotonic()
                    elif line.startswith(DONE):
                        r = json.loads(line[len(DONE):])
                        results[r["seed"]] = r
                        st["current"] = None
                        if on_result:
                            on_result(r)
            now = time.monotonic()
            for p in list(procs):
                st = procs[p]
                chunk = _read_available(p.stderr)
                if chunk:
                    st["stderr"] = ["".join(st["stderr"] + [chunk])[-8000:]]
                if st["current"] is not None and now - st["since"] > case_timeout:
                    _kill(p)
                    finish(p, "timeout", f"case took more than {case_timeout} s")
    finally:
        for p in procs:
            _kill(p)
        if own_cache:
            shutil.rmtree(cache_dir, ignore_errors=True)
    return [results[s] for s in seeds if s in results]


if __name__ == "__main__":
    args = sys.argv[1:]
    full = "--full" in args
    san = "address" if "--sanitize" in args else None
    target = next((a.split("=", 1)[1] for a in args if a.startswith("--target=")), "openmp")
    worker([int(a) for a in args if not a.startswith("--")], full, san, target)
