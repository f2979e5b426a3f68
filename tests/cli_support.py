"""Helpers for tests that run polyad's command line and the README's snippets.

* ``console_script(directory)`` writes a ``polyad`` executable into
  ``directory``: the same script pip generates for the ``polyad = polyad.cli:main``
  entry point, bound to the running interpreter.
* ``cli_env(bin_dir)`` is the environment for such subprocesses: this checkout
  first on ``PYTHONPATH``, ``bin_dir`` first on ``PATH``, the test session's
  compile cache.
* ``readme_blocks()`` parses README.md into fenced blocks with the test
  annotation written just before each (``<!-- test: sh -->``,
  ``<!-- test: file NAME -->``) and their line numbers.
"""

from __future__ import annotations

import os
import re
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

REPO_ROOT = Path(__file__).resolve().parent.parent
README = REPO_ROOT / "README.md"


def console_script(directory: Path) -> Path:
    """A ``polyad`` console script in ``directory`` (as pip writes it)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "polyad"
    path.write_text(f"#!{sys.executable}\n"
                    "import sys\n"
                    "from polyad.cli import main\n"
                    "if __name__ == '__main__':\n"
                    "    sys.exit(main())\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def cli_env(bin_dir: Optional[Path] = None, **extra: str) -> dict:
    """Environment for running polyad in a subprocess from this checkout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    if bin_dir is not None:
        env["PATH"] = str(bin_dir) + os.pathsep + env.get("PATH", "")
    env.pop("POLYAD_LOG", None)
    env.update(extra)
    return env


@dataclass
class Block:
    """A fenced block of README.md: language, text, annotation, first line number."""

    lang: str
    text: str
    annotation: str
    line: int


_FENCE = re.compile(r"^```(\w*)\s*$")
_ANNOTATION = re.compile(r"^<!--\s*test:\s*(.*?)\s*-->\s*$")


def readme_blocks() -> list[Block]:
    """Every fenced block of README.md, in order."""
    return markdown_blocks(README)


def markdown_blocks(path: Path) -> list[Block]:
    """Every fenced block of the Markdown file ``path``, in order."""
    lines = path.read_text().split("\n")
    blocks = []
    k = 0
    while k < len(lines):
        m = _FENCE.match(lines[k])
        if not m:
            k += 1
            continue
        prev = lines[k - 1] if k > 0 else ""
        ann = _ANNOTATION.match(prev)
        end = k + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        blocks.append(Block(m.group(1), "\n".join(lines[k + 1:end]) + "\n",
                            ann.group(1) if ann else "", k + 2))
        k = end + 1
    return blocks


def readme_files() -> dict[str, str]:
    """The files README.md spells out (``<!-- test: file NAME -->`` blocks)."""
    out = {}
    for b in readme_blocks():
        if b.annotation.startswith("file "):
            out[b.annotation[len("file "):].strip()] = b.text
    return out
