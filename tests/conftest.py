"""Shared pytest setup for the polyad test suite.

* ``POLYAD_CACHE_DIR`` points to a fresh per-session directory, set at import
  time (before any test compiles a kernel) so that the suite never touches the
  user's compile cache; pytest-xdist's workers share it.
* ``rng`` fixture: a deterministic numpy Generator.
* A test that takes ``monkeypatch`` starts with no artifact remembered in this
  process (``polyad.pipeline.recent_artifacts``), nor dependence analysis
  (``polyad.poly.recent_analyses``), and ends with those remembered before it:
  one it made with a patched compiler must not serve later tests, nor one made
  before serve it. (Emptying the memory after such a test instead made the later
  tests schedule the benchmark gradients again: 159 s of ISL in a run.)
* The process remembers up to ``RECENT_ARTIFACTS_IN_TESTS`` artifacts instead of
  polyad's default: the test files inspect some 40 variants of the benchmark
  gradients (each 5-25 MB of ISL objects, 4-15 s to schedule).
* ``tests/`` is put on ``sys.path`` so test modules can import the small numpy
  reference helpers in ``npref.py`` whatever pytest's import mode is.
* ``POLYAD_VECTOR_UNIT`` is ``512x32`` (AVX-512's unit), set at import time for the
  workers and the subprocesses alike: the schedules the tests assert (the conv
  gradient's filter sums blocked over 2 output channels, 32 lanes of floats) do not
  depend on the machine the suite runs on. The tests of other units set it themselves
  (``tests/test_machine.py``).
"""

import atexit
import importlib.util
import os
import shutil
import sys
import tempfile

import numpy as np
import pytest

_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
_REPO_ROOT = os.path.dirname(_TESTS_DIR)

# pytest-xdist's workers inherit the environment of the process that starts them, which
# has imported this file first: they share its directory, so a kernel one worker built
# is not built again by another (the cache is safe for concurrent processes: entries
# are written under temporary names and moved into place). The process that made the
# directory removes it.
_SESSION_CACHE_VARIABLE = "POLYAD_TEST_SESSION_CACHE_DIR"
_CACHE_DIR = os.environ.get(_SESSION_CACHE_VARIABLE) if os.environ.get("PYTEST_XDIST_WORKER") else None
if not _CACHE_DIR or not os.path.isdir(_CACHE_DIR):
    _CACHE_DIR = tempfile.mkdtemp(prefix="polyad-test-cache-")
    os.environ[_SESSION_CACHE_VARIABLE] = _CACHE_DIR
    atexit.register(shutil.rmtree, _CACHE_DIR, ignore_errors=True)
os.environ["POLYAD_CACHE_DIR"] = _CACHE_DIR
os.environ["POLYAD_VECTOR_UNIT"] = "512x32"

if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)
# Allow running the suite from a plain checkout (package not pip-installed).
if importlib.util.find_spec("polyad") is None:
    sys.path.insert(0, _REPO_ROOT)


RECENT_ARTIFACTS_IN_TESTS = 96


@pytest.fixture(autouse=True, scope="session")
def _more_remembered_artifacts():
    """See the module docstring."""
    from polyad import pipeline
    default = pipeline.recent_artifacts.bound
    pipeline.recent_artifacts.bound = RECENT_ARTIFACTS_IN_TESTS
    yield
    pipeline.recent_artifacts.bound = default


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture(scope="session")
def repo_root():
    """Root of the checkout (for subprocess tests: put it on PYTHONPATH)."""
    return _REPO_ROOT


@pytest.fixture(autouse=True)
def _no_remembered_artifacts_around_patches(request):
    """See the module docstring: artifacts and monkeypatched compilers stay apart."""
    from polyad import pipeline, poly
    if "monkeypatch" not in request.fixturenames:
        yield
        return
    memories = [pipeline.recent_artifacts, poly.recent_analyses]
    before = [remembered.items() for remembered in memories]
    for remembered in memories:
        remembered.clear()
    yield
    for remembered, items in zip(memories, before):
        remembered.replace(items)
