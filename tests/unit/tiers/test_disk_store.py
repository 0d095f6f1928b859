"""DiskStore on a real directory: exact files, atomic replace, warm restart, threads, and real
OS failures (a file size limit for a full disk, a file where the directory should be)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import armature
from armature.kv.block_key import BlockKey
from armature.protocols.kv_transfer import KvLayout
from armature.tiers.block_file import block_name, decode_block, encode_block
from armature.tiers.disk_store import DiskStore
from armature.tiers.errors import BlockMissingError, StoreUnavailableError

Block = Callable[[int], tuple[BlockKey, bytes]]
NS = "model-0123456789ab"


def _files(store: DiskStore) -> list[str]:
    return sorted(os.listdir(store.directory))


def test_put_get_delete_list_keys(tmp_path: Path, block: Block) -> None:
    store = DiskStore(tmp_path, NS)
    (k0, d0), (k1, d1) = block(0), block(1)
    store.put(k0, d0)
    store.put(k1, d1)
    assert store.describe() == f"disk:{tmp_path / NS}"
    assert _files(store) == [
        "0000000000001000-0000000000002000-none.kvb",
        "0000000000001001-0000000000002001-0000000000001000.kvb",
    ]
    assert store.get(0x1000) == d0
    assert store.get(0x1001) == d1
    assert sorted(store.list_keys()) == [k0, k1]
    store.delete(0x1000)
    store.delete(0x1000)  # missing: not an error
    store.delete(0x9999)
    assert _files(store) == ["0000000000001001-0000000000002001-0000000000001000.kvb"]
    assert store.list_keys() == [k1]
    with pytest.raises(BlockMissingError, match="no block 0000000000001000"):
        store.get(0x1000)


def test_put_replaces_a_block_of_the_same_key(tmp_path: Path, block: Block) -> None:
    store = DiskStore(tmp_path, NS)
    key, data = block(0)
    store.put(key, b"old")
    store.put(key, data)
    assert store.get(key.seq_hash) == data
    assert _files(store) == ["0000000000001000-0000000000002000-none.kvb"]


def test_list_keys_is_oldest_first_and_skips_strays(tmp_path: Path, block: Block) -> None:
    """Oldest first, a block as recent as its most recent descendant, and of blocks equally
    recent the later written first; ties by name; strays and directories left out."""
    store = DiskStore(tmp_path, NS)
    keys = [block(i)[0] for i in range(4)]  # one chain: 0 <- 1 <- 2 <- 3
    for i in range(4):
        store.put(*block(i))
    for key, mtime_s in zip(keys, (300, 100, 200, 100), strict=True):
        os.utime(store.directory / block_name(key), (mtime_s, mtime_s))
    (store.directory / "notes.txt").write_text("not a block")
    (store.directory / "00000000000000ab-cd.kvb").write_bytes(b"")
    (store.directory / "00000000000000ab-00000000000000cd-none.kvb").mkdir()
    # 1 is as recent as 2 (200), then 2 before 1 (written later)
    assert store.list_keys() == [keys[3], keys[2], keys[1], keys[0]]


def chain(store: DiskStore, first: int, times_s: list[int]) -> list[BlockKey]:
    """A prompt's blocks, stored with these file times (seconds), first block first."""
    keys: list[BlockKey] = []
    for i, time_s in enumerate(times_s):
        key = BlockKey(first + i, first + i, keys[-1].seq_hash if keys else None)
        store.put(key, b"kv")
        os.utime(store.directory / block_name(key), (time_s, time_s))
        keys.append(key)
    return keys


def test_a_restart_evicts_a_prompts_last_blocks_first(tmp_path: Path) -> None:
    """Prompts A (written at 1-3 s) and B (4-5 s): after a restart the tier evicts from the
    front of the listing; by file times alone A's first block went first, leaving its other
    two stored and of no use. Now A goes from its end, and B after A."""
    store = DiskStore(tmp_path, NS)
    a = chain(store, 0xA0, [1, 2, 3])
    b = chain(store, 0xB0, [4, 5])
    assert store.list_keys() == [a[2], a[1], a[0], b[1], b[0]]


def test_a_read_renews_a_block_so_its_prefix_outlives_a_restart(tmp_path: Path) -> None:
    store = DiskStore(tmp_path, NS)
    a = chain(store, 0xA0, [1, 2, 3])
    b = chain(store, 0xB0, [4, 5])
    assert store.get(a[0].seq_hash) == b"kv"  # A's first block served: used now
    listed = DiskStore(tmp_path, NS).list_keys()  # a restart
    assert listed == [a[2], a[1], b[1], b[0], a[0]]


def test_a_directory_under_a_blocks_name_is_a_missing_block(tmp_path: Path) -> None:
    """Not an unavailable store (which turned every disk read off, again and again)."""
    store = DiskStore(tmp_path, NS)
    [key] = chain(store, 0xA0, [1])
    path = store.directory / block_name(key)
    path.unlink()
    path.mkdir()
    with pytest.raises(BlockMissingError):
        store.get(key.seq_hash)
    assert store.list_keys() == []


def test_a_reopened_store_finds_earlier_blocks(tmp_path: Path, block: Block) -> None:
    first = DiskStore(tmp_path, NS)
    for i in range(3):
        first.put(*block(i))
    restarted = DiskStore(tmp_path, NS)
    assert restarted.get(0x1002) == block(2)[1]  # no listing yet: found by its name
    assert sorted(restarted.list_keys()) == [block(i)[0] for i in range(3)]
    assert restarted.get(0x1000) == block(0)[1]


def test_a_block_deleted_by_another_store_is_missing(tmp_path: Path, block: Block) -> None:
    ours, theirs = DiskStore(tmp_path, NS), DiskStore(tmp_path, NS)
    ours.put(*block(0))
    theirs.delete(0x1000)
    with pytest.raises(BlockMissingError):
        ours.get(0x1000)


def test_open_removes_leftover_temp_files(tmp_path: Path, block: Block) -> None:
    store = DiskStore(tmp_path, NS)
    store.put(*block(0))
    leftover = store.directory / ".0000000000001001-0000000000002001-none.kvb.0a1b2c.tmp"
    leftover.write_bytes(b"half a blo")
    DiskStore(tmp_path, NS)
    assert _files(store) == ["0000000000001000-0000000000002000-none.kvb"]


def test_a_shared_directory_keeps_temp_files_younger_than_the_grace(tmp_path: Path) -> None:
    directory = tmp_path / NS
    directory.mkdir()
    fresh, stale = directory / ".a.kvb.1.tmp", directory / ".b.kvb.2.tmp"
    fresh.write_bytes(b"in flight")
    stale.write_bytes(b"crashed")
    an_hour_ago_s = time.time() - 3600
    os.utime(stale, (an_hour_ago_s, an_hour_ago_s))
    DiskStore(tmp_path, NS, stale_temp_after_s=600)
    assert sorted(os.listdir(directory)) == [".a.kvb.1.tmp"]


def test_concurrent_puts_of_different_keys(tmp_path: Path, block: Block) -> None:
    store = DiskStore(tmp_path, NS)
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda i: store.put(*block(i)), range(200)))
    assert sorted(store.list_keys()) == [block(i)[0] for i in range(200)]
    assert len(_files(store)) == 200
    with ThreadPoolExecutor(max_workers=8) as pool:
        assert list(pool.map(store.get, (0x1000 + i for i in range(200)))) == [
            block(i)[1] for i in range(200)
        ]


def test_readers_never_see_part_of_a_block(tmp_path: Path, layout: KvLayout) -> None:
    """Writers replace one key again and again with different payloads while readers decode
    it: every read is one whole block (a partial file would be refused as truncated)."""
    store = DiskStore(tmp_path, NS)
    key = BlockKey(7, 8, None)
    payloads = [bytes([n]) * layout.bytes_per_block for n in range(4)]
    store.put(key, encode_block(layout, key, payloads[0]))
    done = threading.Event()
    seen: set[bytes] = set()

    def write(n: int) -> None:
        for _ in range(100):
            store.put(key, encode_block(layout, key, payloads[n]))

    def read() -> None:
        while not done.is_set():
            seen.add(bytes(decode_block(store.get(7), layout, 7)))

    with ThreadPoolExecutor(max_workers=6) as pool:
        readers = [pool.submit(read) for _ in range(2)]
        list(pool.map(write, range(4)))
        done.set()
        for reader in readers:
            reader.result()
    assert seen <= set(payloads) and seen
    assert _files(store) == ["0000000000000007-0000000000000008-none.kvb"]


_PUT_UNDER_A_FILE_SIZE_LIMIT = """
import resource, signal, sys
from pathlib import Path
from armature.kv.block_key import BlockKey
from armature.tiers.disk_store import DiskStore
from armature.tiers.errors import StoreFullError

store = DiskStore(Path(sys.argv[1]), sys.argv[2])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
_, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (16384, hard))
try:
    store.put(BlockKey(1, 2, None), bytes(65536))
except StoreFullError as error:
    print("full:", error)
else:
    print("stored")
"""


def test_a_write_past_the_file_size_limit_is_store_full(tmp_path: Path) -> None:
    """A real failed write (EFBIG under RLIMIT_FSIZE, no root needed), in a child process."""
    src = str(Path(armature.__file__).parents[1])
    env = {**os.environ, "PYTHONPATH": src, "PYTHONDONTWRITEBYTECODE": "1"}
    result = subprocess.run(
        [sys.executable, "-c", _PUT_UNDER_A_FILE_SIZE_LIMIT, str(tmp_path), NS],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"full: disk:{tmp_path / NS}: put 0000000000000001-"), (
        result.stdout
    )
    assert "File too large" in result.stdout
    assert os.listdir(tmp_path / NS) == []  # neither the block nor its temp file


def test_a_file_where_the_directory_should_be_is_unavailable(tmp_path: Path) -> None:
    (tmp_path / NS).write_text("not a directory")
    with pytest.raises(StoreUnavailableError, match=f"disk:{tmp_path / NS}: open"):
        DiskStore(tmp_path, NS)


def test_a_directory_removed_under_the_store_is_unavailable(tmp_path: Path, block: Block) -> None:
    store = DiskStore(tmp_path, NS)
    store.put(*block(0))
    for name in os.listdir(store.directory):
        os.unlink(store.directory / name)
    store.directory.rmdir()
    store.directory.write_text("not a directory")
    with pytest.raises(StoreUnavailableError, match="put 0000000000001001"):
        store.put(*block(1))
    with pytest.raises(StoreUnavailableError, match="list"):
        store.list_keys()
    with pytest.raises(StoreUnavailableError, match="get 0000000000001000"):
        store.get(0x1000)
