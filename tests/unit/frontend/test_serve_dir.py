"""A serve fleet's private directory: where it lies, who owns it, and which ones a new serve
removes (only those whose owner is gone; never a live one, another user's or an unknown one)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from armature.frontend.serve_dir import (
    create_serve_dir,
    is_stale,
    remove_if_orphaned,
    remove_stale_serve_dirs,
    serve_dir_root,
)


def ended_pid() -> int:
    """The PID of a process that has ended (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_the_root_is_the_runtime_dir_when_it_is_usable(tmp_path: Path) -> None:
    assert serve_dir_root({"XDG_RUNTIME_DIR": str(tmp_path)}) == tmp_path
    temp = Path(tempfile.gettempdir())
    assert serve_dir_root({}) == temp
    assert serve_dir_root({"XDG_RUNTIME_DIR": ""}) == temp
    assert serve_dir_root({"XDG_RUNTIME_DIR": str(tmp_path / "missing")}) == temp


def test_a_new_directory_names_its_owner_and_is_live(tmp_path: Path) -> None:
    directory = create_serve_dir(tmp_path)
    assert directory.parent == tmp_path
    assert directory.name.startswith(f"armature-serve-{os.getpid()}-")
    assert (directory / "owner").read_text().isdigit()
    assert not is_stale(directory)
    assert remove_stale_serve_dirs(tmp_path) == []
    assert directory.is_dir()


def test_only_directories_whose_owner_is_gone_are_removed(tmp_path: Path) -> None:
    live = create_serve_dir(tmp_path)
    (live / "entries").mkdir()
    dead = tmp_path / f"armature-serve-{ended_pid()}-abc"
    (dead / "entries").mkdir(parents=True)
    (dead / "entries" / "worker-0").write_text("x")
    reused = tmp_path / f"armature-serve-{os.getpid()}-old"  # our PID, an earlier start
    reused.mkdir()
    (reused / "owner").write_text("1")
    being_made = tmp_path / f"armature-serve-{os.getpid()}-new"  # no owner file yet
    being_made.mkdir()
    legacy = tmp_path / "armature-serve-k3j4l5"  # an older version's name: no PID
    legacy.mkdir()
    not_a_dir = tmp_path / f"armature-serve-{ended_pid()}-file"
    not_a_dir.write_text("")
    other = tmp_path / "armature-1000"
    other.mkdir()

    assert remove_stale_serve_dirs(tmp_path) == sorted([dead, reused])
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted(p.name for p in [live, being_made, legacy, not_a_dir, other])
    assert (live / "entries").is_dir()


def test_a_zombie_owner_is_gone_and_its_worker_removes_the_directory(tmp_path: Path) -> None:
    """A serve killed outright is a zombie until its parent reaps it; its workers, stopping on
    the parent-death signal meanwhile, must already see it gone."""
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    directory = tmp_path / f"armature-serve-{zombie.pid}-abc"
    (directory / "entries").mkdir(parents=True)
    stat = Path(f"/proc/{zombie.pid}/stat")
    while stat.read_text().split(")")[-1].split()[0] != "Z":  # exited, not yet reaped
        time.sleep(0.01)
    (directory / "owner").write_text(stat.read_text().split(")")[-1].split()[19])  # its own
    try:
        assert is_stale(directory)
        assert remove_if_orphaned(directory)
        assert not directory.exists()
    finally:
        zombie.wait()
    live = create_serve_dir(tmp_path)
    assert not remove_if_orphaned(live)  # the owner (this process) is alive
    unknown = tmp_path / "fleet-discovery"  # a directory given with --discovery-dir
    unknown.mkdir()
    assert not remove_if_orphaned(unknown)
    assert live.is_dir() and unknown.is_dir()
