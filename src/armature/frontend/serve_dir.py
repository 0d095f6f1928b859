"""The private directory one `armature serve --workers N` fleet meets in (its file discovery).

It lies where the OS cleans up: $XDG_RUNTIME_DIR (emptied at logout) when set, else the temp
directory. Its name carries the owning process's PID and its `owner` file that process's
start time, so a later serve can tell a directory whose owner is gone (killed outright, with no
chance to clean up) from a live one, and remove it:

    <root>/armature-serve-<pid>-<random>/owner      the owner's start time (/proc, Linux)
    <root>/armature-serve-<pid>-<random>/entries/   the fleet's discovery entries

A directory is stale when no process has its PID, or when the process that has it started at
another time (the PID was reused). Anything else (a live owner, another user's directory, a
name without a PID, as older versions wrote) is left alone.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

__all__ = [
    "PREFIX",
    "create_serve_dir",
    "is_stale",
    "remove_if_orphaned",
    "remove_stale_serve_dirs",
    "serve_dir_root",
]

log = logging.getLogger(__name__)

PREFIX = "armature-serve-"
OWNER_FILE = "owner"
_NAME = re.compile(rf"^{PREFIX}(\d+)-[^/]+$")


def serve_dir_root(environ: Mapping[str, str] = os.environ) -> Path:
    """$XDG_RUNTIME_DIR when it names a writable directory, else the temp directory."""
    runtime_dir = environ.get("XDG_RUNTIME_DIR")
    if runtime_dir and os.path.isdir(runtime_dir) and os.access(runtime_dir, os.W_OK):
        return Path(runtime_dir)
    return Path(tempfile.gettempdir())


def _start_time(pid: int) -> str | None:
    """The start time of process `pid` (clock ticks since boot, from /proc); "" where /proc
    cannot tell (not Linux); None when no process has that PID."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:  # another user's process: it exists
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:  # gone since, or no /proc
        return None if Path("/proc/self").exists() else ""
    # fields 3 on; the command name (field 2) may hold spaces, so count from its closing ")"
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):  # a zombie (dead, not yet reaped by its parent) is gone
        return None
    return fields[19]  # field 22: the start time


def create_serve_dir(root: Path) -> Path:
    """A new private directory under `root`, owned by this process (see the module doc)."""
    pid = os.getpid()
    directory = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{pid}-", dir=root))
    (directory / OWNER_FILE).write_text(_start_time(pid) or "")
    return directory


def is_stale(directory: Path) -> bool:
    """Whether `directory` is a serve directory of this user whose owner is gone."""
    match = _NAME.match(directory.name)
    if match is None or not directory.is_dir() or directory.stat().st_uid != os.getuid():
        return False
    started = _start_time(int(match.group(1)))
    if started is None:
        return True
    try:
        recorded = (directory / OWNER_FILE).read_text()
    except FileNotFoundError:  # its owner is alive and may be writing it now
        return False
    return bool(recorded and started and recorded != started)


def remove_if_orphaned(directory: Path) -> bool:
    """Remove `directory` if it is a serve directory whose owner is gone (see `is_stale`):
    what a serve's worker does as it stops, so that a serve killed outright leaves nothing
    once its workers (sent SIGTERM by the kernel when their parent dies) are gone. Any other
    directory, a live serve's included, is left alone. Whether it was removed."""
    if not is_stale(directory):
        return False
    shutil.rmtree(directory, ignore_errors=True)  # the serve's other workers race us
    log.info("removed %s: the serve that owned it is gone", directory)
    return True


def remove_stale_serve_dirs(root: Path) -> list[Path]:
    """Remove every stale serve directory under `root` (see `is_stale`); the removed ones.
    One that cannot be removed is logged and left: it must not stop this serve."""
    removed = []
    for directory in sorted(root.glob(f"{PREFIX}*")):
        if not is_stale(directory):
            continue
        try:
            shutil.rmtree(directory)
        except FileNotFoundError:  # another serve starting beside us removed it first
            continue
        except OSError as exc:
            log.warning("cannot remove the stale serve directory %s: %s", directory, exc)
            continue
        removed.append(directory)
    if removed:
        log.info("removed %d serve directories left by ended processes", len(removed))
    return removed
