"""Kernels from anywhere: python -c, source text (pa.kernel(source=...)), exec and
stdin, with correct 1-based lines and columns; filtered tracebacks."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import polyad as pa

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N = pa.sizes("N")


def run_python(args, stdin=None, env=None):
    env = {**os.environ, "PYTHONPATH": REPO, **(env or {})}
    return subprocess.run([sys.executable, *args], input=stdin, capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=300)


KERNEL_TEXT = textwrap.dedent('''\
    import numpy as np
    import polyad as pa
    N = pa.sizes("N")

    @pa.kernel
    def box(x: pa.f64[N].clamped, y: pa.Out(pa.f64[N])):
        for i in range(N):
            y[i] = x[i - 1] + x[i] + x[i + 1]

    print(box(np.arange(4.0)).tolist())
''')


def test_python_dash_c_kernel_compiles_and_runs():
    proc = run_python(["-c", KERNEL_TEXT])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[1.0, 3.0, 6.0, 8.0]"


def test_python_dash_c_dsl_error_points_into_the_command():
    text = KERNEL_TEXT.replace("x[i - 1] + x[i]", "x[i - 1] + len(x)")
    proc = run_python(["-c", text])
    assert proc.returncode == 1
    line = text.splitlines()[7]
    col = line.index("len(x)") + 1
    assert f"<string>:8:{col}: len(x) is not available in kernels" in proc.stderr, proc.stderr


def test_stdin_and_exec_without_source_say_how_to_pass_it():
    proc = run_python(["-"], stdin=KERNEL_TEXT)
    assert proc.returncode == 1
    assert "<stdin>:5: cannot read the source of 'box'" in proc.stderr, proc.stderr
    assert "pa.kernel(source=text)" in proc.stderr
    ns = {}
    with pytest.raises(pa.DSLError, match=r"cannot read the source of 'box'.*\n.*"
                                          r"pa\.kernel\(source=text\)"):
        exec(KERNEL_TEXT.replace("print(", "(lambda v: v)("), ns)


def test_source_text_with_helper_function_and_name():
    box = pa.kernel(source='''
        @pa.func
        def mean2(a: pa.f64, b: pa.f64) -> pa.f64:
            return 0.5 * (a + b)

        def box(x: pa.f64[N].clamped, y: pa.Out(pa.f64[N])):
            for i in range(N):
                y[i] = mean2(x[i - 1], x[i + 1])
        ''', name="box")
    np.testing.assert_array_equal(box(np.arange(4.0)), [0.5, 1.0, 2.0, 2.5])
    assert box.ir.filename.startswith("<polyad-source-")
    import inspect
    assert "def box" in inspect.getsource(box.__wrapped__)


def test_source_text_errors_give_lines_and_columns_within_the_text():
    text = "def bad(x: pa.f64[N]) -> pa.f64:\n    s = 0.0\n    for i in range(N):\n" \
           "        s += x.shape[0]\n    return s\n"
    with pytest.raises(pa.DSLError) as info:
        pa.kernel(source=text)
    e = info.value
    assert e.filename.startswith("<polyad-source-") and e.line == 4
    assert e.col == text.splitlines()[3].index("x.shape") + 1
    with pytest.raises(pa.DSLError, match=r":2:\d+: the source is not valid Python"):
        pa.kernel(source="def f(x: pa.f64[N]):\n    for i in range(N)\n        x[i] = 1.0\n")
    with pytest.raises(pa.DSLError, match=r"defines 2 functions \(a, b\).*\n.*name="):
        pa.kernel(source="def a(x: pa.f64[N]):\n    pass\ndef b(x: pa.f64[N]):\n    pass\n")
    with pytest.raises(pa.DSLError, match=r"no function 'c'"):
        pa.kernel(source="def a(x: pa.f64[N]):\n    pass\n", name="c")


def test_source_text_resolves_names_in_given_globals():
    M = pa.sizes("M")
    fill = pa.kernel(source="def fill(y: pa.Out(pa.f64[M]), v: pa.f64):\n"
                            "    for i in range(M):\n        y[i] = v * K\n",
                     globals={"pa": pa, "M": M, "K": 3.0})
    np.testing.assert_array_equal(fill(v=2.0, M=3), [6.0, 6.0, 6.0])


def test_func_from_source():
    twice = pa.func(source="def twice(a: pa.f64) -> pa.f64:\n    return 2.0 * a\n")
    assert twice(4.0) == 8.0

    @pa.kernel
    def use(x: pa.f64[N], y: pa.Out(pa.f64[N])):
        for i in range(N):
            y[i] = twice(x[i])

    np.testing.assert_array_equal(use(np.arange(3.0)), [0.0, 2.0, 4.0])


BAD_SCRIPT = textwrap.dedent('''\
    import numpy as np
    import polyad as pa
    N = pa.sizes("N")

    @pa.kernel
    def bad(x: pa.f64[N]) -> pa.f64:
        s = 0.0
        for i in range(N):
            s += x[i + 1]
        return s

    bad(np.ones(3))
''')


def test_tracebacks_hide_polyad_frames_unless_asked(tmp_path):
    script = tmp_path / "bad.py"
    script.write_text(BAD_SCRIPT)
    proc = run_python([str(script)])
    assert "BoundsError" in proc.stderr and f"{script}:9: x[i + 1] reads x[1]" in proc.stderr
    frames = [ln for ln in proc.stderr.splitlines() if ln.startswith('  File "')]
    internal = [f for f in frames if os.path.join(REPO, "polyad") in f]
    assert len(frames) == 2 and len(internal) == 1, proc.stderr     # the script, the re-raise
    assert "POLYAD_TRACEBACK_FILTERING=off" in proc.stderr
    full = run_python([str(script)], env={"POLYAD_TRACEBACK_FILTERING": "off"})
    frames = [ln for ln in full.stderr.splitlines() if ln.startswith('  File "')]
    assert len(frames) > 4 and "POLYAD_TRACEBACK_FILTERING" not in full.stderr


def test_dsl_error_traceback_in_process_keeps_only_user_frames():
    with pytest.raises(pa.DSLError) as info:
        @pa.kernel
        def uses_len(x: pa.f64[N]) -> pa.f64:
            s = 0.0
            for i in range(N):
                s += len(x)
            return s
    files = {str(entry.path) for entry in info.traceback}
    assert not any(os.path.join(REPO, "polyad", "frontend") in f for f in files)
    assert __file__ in files


def run_interactive(lines, home):
    """Type ``lines`` at a plain ``python -i`` prompt on a pseudo-terminal (so the
    interpreter uses readline, as for a person); returns everything it printed."""
    pty = pytest.importorskip("pty")
    import select
    import time
    pytest.importorskip("readline")
    master, slave = pty.openpty()
    env = {**os.environ, "PYTHONPATH": REPO, "HOME": str(home), "TERM": "dumb"}
    proc = subprocess.Popen([sys.executable, "-i", "-q"], stdin=slave, stdout=slave,
                            stderr=slave, env=env, cwd=str(home), close_fds=True)
    os.close(slave)
    out = b""
    try:
        for line in [*lines, "print('DONE-' + 'TYPING')"]:
            os.write(master, (line + "\n").encode())
        deadline = time.time() + 240
        while b"DONE-TYPING" not in out and time.time() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                try:
                    out += os.read(master, 65536)
                except OSError:
                    break
    finally:
        proc.kill()
        proc.wait()
        os.close(master)
    return out.decode(errors="replace").replace("\r\n", "\n")


def test_plain_interactive_prompt_kernels_compile_with_prompt_line_numbers(tmp_path):
    out = run_interactive([
        "import numpy as np, polyad as pa",
        "N = pa.sizes('N')",
        "@pa.kernel",
        "def dbl(x: pa.f64[N], y: pa.Out(pa.f64[N])):",
        "    for i in range(N):",
        "        y[i] = 2.0 * x[i]",
        "",
        "print('RESULT', dbl(np.arange(3.0)).tolist())",
        "@pa.kernel",
        "def bad(x: pa.f64[N]) -> pa.f64:",
        "    return 1.0 * len(x)",
        "",
    ], tmp_path)
    assert "RESULT [0.0, 2.0, 4.0]" in out, out
    assert "<stdin>:3:18: len(x) is not available in kernels" in out, out
