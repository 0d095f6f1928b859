"""Output files written whole or not at all (armature.outputs): a write that fails for real
(the kernel's file size limit, in a child process) leaves the file that was there as it was,
and no temporary file beside it; a symbolic link's target is what is replaced."""

from __future__ import annotations

import os
import resource
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from armature.outputs import write_atomically

LIMIT_BYTES = 1024


def _write_limited(path: Path, num_bytes: int) -> subprocess.CompletedProcess[str]:
    """write_atomically of `num_bytes` to `path` in a child process whose files may not
    grow past LIMIT_BYTES."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT_BYTES, LIMIT_BYTES))

    code = (
        "import sys\nfrom pathlib import Path\nfrom armature.outputs import write_atomically\n"
        f"write_atomically(Path(sys.argv[1]), b'x' * {num_bytes})\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code, str(path)],
        preexec_fn=limit,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_write_that_fails_keeps_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "report.json"
    path.write_text('{"kept": true}\n')
    failed = _write_limited(path, 4 * LIMIT_BYTES)
    assert failed.returncode != 0 and "File too large" in failed.stderr
    assert path.read_text() == '{"kept": true}\n'  # not a truncated new one
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]  # no temporary left
    assert _write_limited(path, LIMIT_BYTES // 2).returncode == 0  # under the limit: written
    assert path.read_bytes() == b"x" * (LIMIT_BYTES // 2)


def test_a_link_is_followed_and_the_mode_is_an_ordinary_files(tmp_path: Path) -> None:
    target = tmp_path / "real.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    write_atomically(link, "new")
    assert link.is_symlink() and target.read_text() == "new"
    fresh = tmp_path / "fresh.json"
    write_atomically(fresh, b"1")
    umask = os.umask(0o022)
    os.umask(umask)
    # as open() makes it (0666 less the umask), not a temporary file's private 0600
    assert fresh.stat().st_mode & 0o777 == 0o666 & ~umask


def test_a_file_that_was_there_keeps_its_permissions(tmp_path: Path) -> None:
    path = tmp_path / "private.json"
    path.write_text("old")
    path.chmod(0o600)
    write_atomically(path, "new")
    assert (path.read_text(), path.stat().st_mode & 0o777) == ("new", 0o600)


def test_a_target_that_is_not_a_regular_file_is_written_in_place(tmp_path: Path) -> None:
    """A pipe (as /dev/stdout or /dev/null are not regular files either): renaming a file
    over it replaced it with a regular file."""
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(pipe.read_bytes()))
    reader.start()
    write_atomically(pipe, b"through the pipe")
    reader.join(timeout=30)
    assert got == [b"through the pipe"]
    assert stat.S_ISFIFO(pipe.stat().st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["pipe"]


def test_an_error_names_the_target_not_the_temporary_file(tmp_path: Path) -> None:
    target = tmp_path / "not made" / "report.json"
    with pytest.raises(FileNotFoundError) as caught:
        write_atomically(target, "x")
    assert caught.value.filename == str(target)
    assert not target.parent.exists()
