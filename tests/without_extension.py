"""Running a snippet in a fresh interpreter where a native extension cannot be imported: what
an install without a C compiler looks like (its modules fall back to pure Python)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def run_without(module: str, script: str) -> str:
    """Run `script` with `module` unimportable; returns its stdout (fails on a non-zero exit,
    with its stderr)."""
    code = f"import sys\nsys.modules[{module!r}] = None\n{script}"
    env = {k: v for k, v in os.environ.items() if k != "ARMATURE_INDEX_BACKEND"}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), *sys.path])
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout
