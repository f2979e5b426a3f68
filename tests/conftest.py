"""Shared pytest setup for the polyad test suite.

* ``POLYAD_CACHE_DIR`` points to a fresh per-session directory, set at import
  time (before any test compiles a kernel) so that the suite never touches the
  user's compile cache; pytest-xdist's workers share it.
* ``rng`` fixture: a deterministic numpy Generator.
* A test that takes ``monkeypatch`` starts and ends with no artifact remembered
  in this process (``polyad.pipeline.recent_artifact``): one it made with a
  patched compiler must not serve later tests, nor one made before serve it.
* ``tests/`` is put on ``sys.path`` so test modules can import the small numpy
  reference helpers in ``npref.py`` whatever pytest's import mode is.
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

if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)
# Allow running the suite from a plain checkout (package not pip-installed).
if importlib.util.find_spec("polyad") is None:
    sys.path.insert(0, _REPO_ROOT)


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
    from polyad import pipeline
    patched = "monkeypatch" in request.fixturenames
    if patched:
        pipeline._recent_artifacts.clear()
    yield
    if patched:
        pipeline._recent_artifacts.clear()
