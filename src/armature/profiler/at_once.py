"""Engines profiled at once (`armature profile --engines-at-once N`): N `armature profile`
processes of the same sweep started together, each point the median of theirs.

A deployment of N workers on one host runs N engines at once: they share its memory
bandwidth and caches, which one engine profiled alone does not see (decode steps, which
stream the weights, are the ones it can slow). Each engine runs in a process of its own, as
each worker does; its log goes to a file in a temporary directory, and the first failed
engine's last line is the command's error.

    config -> N x `armature profile` (the same flags, --engines-at-once 1, own output)
           -> N profiles -> points.median_profile -> one (source.engines_at_once: N)
"""

from __future__ import annotations

import dataclasses
import logging
import subprocess
import sys
import tempfile
from pathlib import Path

from armature.config import ProfileConfig
from armature.config.settings import to_argv
from armature.errors import ConfigError
from armature.protocols.timing_profile import TimingProfile, read_profile

__all__ = ["profile_at_once"]

log = logging.getLogger(__name__)


_CLI_ERROR = "armature: error: "


def _last_line(path: Path) -> str:
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1].removeprefix(_CLI_ERROR) if lines else "no output"


def profile_at_once(config: ProfileConfig) -> list[TimingProfile]:
    """`config.engines_at_once` engines swept at once, each in a process of its own: their
    profiles (`points.median_profile` merges them). ConfigError (the first failed engine's
    own one line) when any of them fails."""
    count = config.engines_at_once
    with tempfile.TemporaryDirectory(prefix="armature-profile-") as tmp:
        run_dir = Path(tmp)
        running = []
        for i in range(count):
            one = dataclasses.replace(
                config, engines_at_once=1, output=str(run_dir / f"engine{i}.json"), report_dir=None
            )
            argv = [sys.executable, "-m", "armature.cli", "profile", *to_argv(one)]
            log_path = run_dir / f"engine{i}.log"
            with log_path.open("w") as log_file:
                proc = subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT
                )
            running.append((proc, log_path))
        log.info("profiling %d engines at once", count)
        failed = None
        try:
            for i, (proc, log_path) in enumerate(running):
                if proc.wait() != 0 and failed is None:
                    failed = f"engine {i + 1} of {count}: {_last_line(log_path)}"
        finally:  # interrupted: stop the engines still sweeping
            for proc, _ in running:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        if failed is not None:
            raise ConfigError(failed)
        return [read_profile(run_dir / f"engine{i}.json") for i in range(count)]
