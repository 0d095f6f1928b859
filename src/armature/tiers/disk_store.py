"""`DiskStore`: a `BlockStore` of one file per block in `root/namespace/`, named by
`block_file.block_name(key)`, so that a directory listing gives every key.

A put writes a temp file (`.<name>.<random>.tmp`) in the same directory and renames it over
the final name with `os.replace`, so a crash never leaves a partial block under a block's
name. There is no fsync: after a power loss a renamed file may be short, and `decode_block`
refuses it as truncated (the caller then deletes it). The same format and code serve a
directory on a shared file system (G4, `file://`); there each worker is one `DiskStore`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from armature.kv.block_key import BlockKey
from armature.tiers.block_file import block_name, block_name_prefix, parse_block_name
from armature.tiers.errors import (
    BlockMissingError,
    StoreError,
    StoreFullError,
    StoreUnavailableError,
)

__all__ = ["DiskStore"]

_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
_TEMP_SUFFIX = ".tmp"
_FILE_MODE = 0o644  # shared stores: other workers (maybe other users) read our blocks
JOURNAL_DIR = "journal"  # a shared directory's journal objects (`armature.tiers.journal`)


class DiskStore:
    """Blocks as files under `root / namespace`, created at open if missing.

    Thread-safe: file operations need no lock (distinct keys are distinct files; one key's
    puts race only to an atomic rename), and `_names` (sequence hash -> file name, filled by
    put and list_keys) is guarded by `_lock`.

    `stale_temp_after_s`: at open, temp files older than this are removed as a crash's
    leftovers. 0 (a local disk with one owner) removes them all; a shared directory needs a
    grace period so that one worker's open does not delete another's put in flight.
    """

    def __init__(self, root: Path, namespace: str, *, stale_temp_after_s: float = 0.0) -> None:
        assert namespace and "/" not in namespace and not namespace.startswith("."), namespace
        self.directory = root / namespace
        self._names: dict[int, str] = {}
        self._lock = threading.Lock()
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise _store_error(self, "open", error) from error
        self._remove_stale_temp_files(stale_temp_after_s)

    def describe(self) -> str:
        return f"disk:{self.directory}"

    def put(self, key: BlockKey, data: bytes) -> None:
        name = block_name(key)
        try:
            _write_whole(self.directory, name, data)
        except OSError as error:
            raise _store_error(self, f"put {name}", error) from error
        with self._lock:
            self._names[key.seq_hash] = name

    def get(self, seq_hash: int) -> bytes:
        with self._lock:
            known = self._names.get(seq_hash)
        if known is not None:
            data = self._read(known, seq_hash)
            if data is not None:
                return data
        for name in self._glob_names(seq_hash):  # not put or listed here: another writer's
            data = self._read(name, seq_hash)
            if data is not None:
                with self._lock:
                    self._names[seq_hash] = name
                return data
        raise BlockMissingError(f"{self.describe()}: no block {seq_hash:016x}")

    def delete(self, seq_hash: int) -> None:
        with self._lock:
            known = self._names.pop(seq_hash, None)
        for name in [known] if known is not None else self._glob_names(seq_hash):
            try:
                (self.directory / name).unlink(missing_ok=True)
            except OSError as error:
                raise _store_error(self, f"delete {name}", error) from error

    def list_keys(self) -> list[BlockKey]:
        """Every block's key, the least recently used first (`prefix_order`: by the files'
        times, which a read renews, a block as recent as its most recent descendant)."""
        found: list[tuple[int, str, BlockKey]] = []
        try:
            with os.scandir(self.directory) as entries:
                for entry in entries:
                    key = parse_block_name(entry.name)
                    if key is None:
                        continue
                    try:
                        if entry.is_file():  # a directory under a block's name is none
                            found.append((entry.stat().st_mtime_ns, entry.name, key))
                    except FileNotFoundError:
                        continue  # deleted between the listing and the stat
        except OSError as error:
            raise _store_error(self, "list", error) from error
        found = prefix_order(found)
        with self._lock:
            self._names.update((key.seq_hash, name) for _, name, key in found)
        return [key for _, _, key in found]

    # ---- the journal of a shared directory (`armature.tiers.journal.JournalObjects`) ----
    def put_journal(self, name: str, data: bytes) -> None:
        journal = self.directory / JOURNAL_DIR
        try:
            journal.mkdir(exist_ok=True)
            _write_whole(journal, name, data)
        except OSError as error:
            raise _store_error(self, f"put {JOURNAL_DIR}/{name}", error) from error

    def get_journal(self, name: str) -> bytes | None:
        try:
            return (self.directory / JOURNAL_DIR / name).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as error:
            raise _store_error(self, f"get {JOURNAL_DIR}/{name}", error) from error

    def list_journals(self) -> list[tuple[float, str]]:
        found: list[tuple[float, str]] = []
        try:
            with os.scandir(self.directory / JOURNAL_DIR) as entries:
                for entry in entries:
                    if entry.name.startswith("."):  # a put's temp file
                        continue
                    try:
                        found.append((entry.stat().st_mtime, entry.name))
                    except FileNotFoundError:
                        continue  # deleted between the listing and the stat
        except FileNotFoundError:
            return []  # no journal written here yet
        except OSError as error:
            raise _store_error(self, f"list {JOURNAL_DIR}", error) from error
        return found

    def delete_journal(self, name: str) -> None:
        try:
            (self.directory / JOURNAL_DIR / name).unlink(missing_ok=True)
        except OSError as error:
            raise _store_error(self, f"delete {JOURNAL_DIR}/{name}", error) from error

    def learn_names(self, names: Iterable[str]) -> list[BlockKey]:
        known = [(name, key) for name in names if (key := parse_block_name(name)) is not None]
        with self._lock:
            self._names.update((key.seq_hash, name) for name, key in known)
        return [key for _, key in known]

    def _read(self, name: str, seq_hash: int) -> bytes | None:
        """The file's bytes; None (and `name` forgotten) when it is gone, perhaps deleted
        by another worker sharing the directory."""
        path = self.directory / name
        try:
            data = path.read_bytes()
        except (FileNotFoundError, IsADirectoryError):  # gone, or never a block
            with self._lock:
                if self._names.get(seq_hash) == name:
                    del self._names[seq_hash]
            return None
        except OSError as error:
            raise _store_error(self, f"get {name}", error) from error
        with contextlib.suppress(OSError):  # its use renews it: recency outlives a restart
            os.utime(path)
        return data

    def _glob_names(self, seq_hash: int) -> list[str]:
        pattern = f"{block_name_prefix(seq_hash)}*"
        try:
            return sorted(
                path.name
                for path in self.directory.glob(pattern)
                if parse_block_name(path.name) is not None
            )
        except OSError as error:
            raise _store_error(self, f"find {seq_hash:016x}", error) from error

    def _remove_stale_temp_files(self, stale_after_s: float) -> None:
        now_s = time.time()
        temps = f".*{_TEMP_SUFFIX}"
        try:
            journal_temps = self.directory.glob(f"{JOURNAL_DIR}/{temps}")
            for path in [*self.directory.glob(temps), *journal_temps]:
                try:
                    if now_s - path.stat().st_mtime >= stale_after_s:
                        path.unlink()
                except FileNotFoundError:
                    continue  # another worker renamed or removed it meanwhile
        except OSError as error:
            raise _store_error(self, "open", error) from error


def _write_whole(directory: Path, name: str, data: bytes) -> None:
    """`data` as `directory / name`, through a temp file renamed over it: never a part."""
    temp = directory / f".{name}.{secrets.token_hex(6)}{_TEMP_SUFFIX}"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _FILE_MODE)
    try:
        with open(fd, "wb", closefd=True) as out:
            out.write(data)
        os.replace(temp, directory / name)
    finally:
        temp.unlink(missing_ok=True)  # gone after the replace; a failed write's rest


def prefix_order(
    found: list[tuple[int, str, BlockKey]],
) -> list[tuple[int, str, BlockKey]]:
    """(time, name, key) of stored blocks, the first to evict first: by time, where a block
    counts as recent as its most recent descendant (its prefix is needed to use them), and
    of blocks equally recent the later written (a prompt's later blocks) first. Evicting
    from the front then leaves whole prefixes: by file times alone a prompt's first block,
    written first, went first, leaving the rest stored and of no use."""
    recency = {key.seq_hash: time_ns for time_ns, _, key in found}
    parents = {key.seq_hash: key.parent_hash for _, _, key in found}
    for time_ns, _, key in sorted(found, reverse=True):  # newest first: each raised once
        parent = key.parent_hash
        while parent is not None and recency.get(parent, time_ns) < time_ns:
            recency[parent] = time_ns
            parent = parents[parent]
    return sorted(found, key=lambda f: (recency[f[2].seq_hash], -f[0], f[1]))


def _store_error(store: DiskStore, action: str, error: OSError) -> StoreError:
    """The store error an OSError means: full for ENOSPC / EDQUOT / EFBIG, else unavailable."""
    message = f"{store.describe()}: {action}: {error.strerror or error}"
    if error.errno in _FULL_ERRNOS:
        return StoreFullError(message)
    return StoreUnavailableError(message)
