"""Output files written whole or not at all: the data goes to a temporary file beside the
target, which is renamed over it once complete, so that a write that fails (a full disk, a
file size limit, a signal) leaves the file that was there as it was, and a reader never sees
half a file. A symbolic link is followed (its target is replaced, not the link); a file that
was there keeps its permissions. A target that is not a regular file (a device such as
/dev/null, a pipe, /dev/stdout) is written in place: renaming over it would replace it.

Errors are OSError naming the target, for the caller to say in its own terms (the CLI: one
line naming the flag)."""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path

__all__ = ["replacing", "write_atomically"]


@contextlib.contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """A path to write `path`'s new contents to: a fresh one beside it (same suffix: writers
    that read the format from it, such as matplotlib, write the same), renamed over `path`
    when the block ends without an exception, removed otherwise; `path` itself where it is
    not a regular file."""
    try:
        try:
            st_mode: int | None = os.stat(path).st_mode
        except FileNotFoundError:
            st_mode = None
        if st_mode is not None and not stat.S_ISREG(st_mode):
            yield path  # a device or a pipe: written in place
            return
        mode = None if st_mode is None else stat.S_IMODE(st_mode)
        target = path.resolve()
        temp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp{target.suffix}")
        try:
            yield temp
            if mode is not None:
                os.chmod(temp, mode)
            os.replace(temp, target)
        finally:
            temp.unlink(missing_ok=True)
    except OSError as exc:
        if exc.filename is None or exc.filename in (path, str(path)):
            raise
        # the temporary file's name would be a riddle to whoever reads the error
        raise OSError(exc.errno, exc.strerror, str(path)) from exc


def write_atomically(path: Path, data: bytes | str) -> None:
    """Write `data` (str as UTF-8) to `path`, whole or not at all (`replacing`)."""
    payload = data.encode() if isinstance(data, str) else data
    with replacing(path) as temp:
        if temp == path:  # not a regular file
            with path.open("wb") as out:
                out.write(payload)
            return
        # created as open() would (0666 less the umask), not private like mkstemp's files
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "wb") as out:
            out.write(payload)
            out.flush()
            os.fsync(out.fileno())
