"""Output files written whole or not at all: the data goes to a temporary file beside the
target, which is renamed over it once complete, so that a write that fails (a full disk, a
file size limit, a signal) leaves the file that was there as it was, and a reader never sees
half a file. A symbolic link is followed: its target is replaced, not the link.

Errors are OSError, for the caller to say in its own terms (the CLI: one line naming the
flag)."""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

__all__ = ["replacing", "write_atomically"]


@contextlib.contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """A fresh path beside `path` (same suffix: writers that read the format from it, such
    as matplotlib, write the same), renamed over `path` when the block ends without an
    exception; removed otherwise."""
    target = path.resolve()
    temp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp{target.suffix}")
    try:
        yield temp
        os.replace(temp, target)
    finally:
        temp.unlink(missing_ok=True)


def write_atomically(path: Path, data: bytes | str) -> None:
    """Write `data` (str as UTF-8) to `path`, whole or not at all (`replacing`)."""
    payload = data.encode() if isinstance(data, str) else data
    with replacing(path) as temp:
        # created as open() would (0666 less the umask), not private like mkstemp's files
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "wb") as out:
            out.write(payload)
            out.flush()
            os.fsync(out.fileno())
