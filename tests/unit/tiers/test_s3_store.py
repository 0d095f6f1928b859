"""S3Store against a real S3-compatible server (moto's, a subprocess on a free loopback port):
exact objects, two workers sharing a bucket, and a killed or hung server failing calls fast."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from armature.kv.block_key import BlockKey
from armature.tiers.errors import BlockMissingError, StoreUnavailableError
from armature.tiers.journal import JournaledStore
from armature.tiers.remote_store import open_remote_store
from armature.tiers.s3_store import S3Store, make_s3_client
from servers import MotoS3

Block = Callable[[int], tuple[BlockKey, bytes]]
NS = "model-0123456789ab"
FAIL_FAST_S = 15.0  # a call on a dead or hung store must fail within this (hang = failure)


def _open(server: MotoS3, bucket: str, prefix: str = "kv/tiers") -> S3Store:
    store = open_remote_store(f"s3://{bucket}/{prefix}", endpoint=server.url, namespace=NS)
    assert isinstance(store, S3Store)
    return store


def _object_keys(server: MotoS3, bucket: str) -> list[str]:
    response = make_s3_client(server.url).list_objects_v2(Bucket=bucket)
    return sorted(item["Key"] for item in response.get("Contents", []))


def test_put_get_delete_list_keys(moto_s3: MotoS3, bucket: str, block: Block) -> None:
    store = _open(moto_s3, bucket)
    assert store.describe() == f"s3://{bucket}/kv/tiers/{NS}/"
    (k0, d0), (k1, d1) = block(0), block(1)
    store.put(k0, d0)
    store.put(k1, d1)
    assert _object_keys(moto_s3, bucket) == [
        f"kv/tiers/{NS}/0000000000001000-0000000000002000-none.kvb",
        f"kv/tiers/{NS}/0000000000001001-0000000000002001-0000000000001000.kvb",
    ]
    assert store.get(0x1000) == d0
    assert store.get(0x1001) == d1
    assert sorted(store.list_keys()) == [k0, k1]
    store.delete(0x1000)
    store.delete(0x1000)  # missing: not an error
    store.delete(0x9999)
    assert store.list_keys() == [k1]
    with pytest.raises(BlockMissingError, match="no block 0000000000001000"):
        store.get(0x1000)


def test_a_second_worker_reads_what_the_first_wrote(
    moto_s3: MotoS3, bucket: str, block: Block
) -> None:
    writer, reader = _open(moto_s3, bucket), _open(moto_s3, bucket)
    for i in range(3):
        writer.put(*block(i))
    assert reader.get(0x1002) == block(2)[1]  # never listed by the reader: found by prefix
    assert sorted(reader.list_keys()) == [block(i)[0] for i in range(3)]
    reader.delete(0x1001)
    with pytest.raises(BlockMissingError):
        writer.get(0x1001)  # the writer's map still names it: the object is gone
    assert sorted(writer.list_keys()) == [block(0)[0], block(2)[0]]


def test_a_second_worker_learns_the_first_ones_puts_from_its_journal(
    moto_s3: MotoS3, bucket: str, block: Block
) -> None:
    """The journal's objects on a real S3 server: written beside the blocks (not among the
    keys a listing gives), read by the other worker, deleted after the retention."""
    now_s = [0.0]
    writer, reader = (
        JournaledStore(
            _open(moto_s3, bucket),
            retention_s=100.0,
            clock=lambda: now_s[0],
            wall_clock_s=lambda: 1_700_000_000.0,
            writer_id=writer_id,
        )
        for writer_id in ("aaaaaaaaaaaa", "bbbbbbbbbbbb")
    )
    assert reader.list_keys() == writer.list_keys() == []
    for i in range(2):
        writer.put(*block(i))
    _open(moto_s3, bucket).put(*block(2))  # no journal names it
    writer.flush_journal()
    journal = f"kv/tiers/{NS}/journal/1700000000000-aaaaaaaaaaaa-00000000.jnl"
    assert journal in _object_keys(moto_s3, bucket)
    assert sorted(reader.list_keys()) == [block(i)[0] for i in range(3)]  # no journal object
    writer.put(*block(3))
    writer.flush_journal()
    assert reader.list_new_keys() == [block(3)[0]]
    assert reader.get(0x1003) == block(3)[1]
    assert reader.list_new_keys() == []
    now_s[0] = 100.0
    writer.flush_journal()  # both objects expired
    assert [k for k in _object_keys(moto_s3, bucket) if "/journal/" in k] == []


def test_prefixes_and_namespaces_are_apart(moto_s3: MotoS3, bucket: str, block: Block) -> None:
    ours = _open(moto_s3, bucket)
    other_prefix = _open(moto_s3, bucket, prefix="elsewhere")
    other_model = open_remote_store(
        f"s3://{bucket}/kv/tiers", endpoint=moto_s3.url, namespace="other-0123456789ab"
    )
    ours.put(*block(0))
    client = make_s3_client(moto_s3.url)
    client.put_object(Bucket=bucket, Key=f"kv/tiers/{NS}/notes.txt", Body=b"stray")
    client.put_object(Bucket=bucket, Key=f"kv/tiers/{NS}/sub/{'0' * 16}-{'0' * 16}-none.kvb")
    assert ours.list_keys() == [block(0)[0]]
    assert other_prefix.list_keys() == []
    assert other_model.list_keys() == []
    with pytest.raises(BlockMissingError):
        other_prefix.get(0x1000)


def test_list_keys_reads_every_page(moto_s3: MotoS3, bucket: str) -> None:
    """More blocks than one list_objects_v2 page (1000 keys)."""
    store = _open(moto_s3, bucket)
    keys = [BlockKey(i, i, None) for i in range(1005)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda key: store.put(key, b"x"), keys))
    assert sorted(store.list_keys()) == keys


def test_a_missing_bucket_is_unavailable(moto_s3: MotoS3, s3_env: None, block: Block) -> None:
    store = _open(moto_s3, "no-such-bucket")
    with pytest.raises(StoreUnavailableError, match="NoSuchBucket"):
        store.put(*block(0))
    with pytest.raises(StoreUnavailableError, match="NoSuchBucket"):
        store.list_keys()


@pytest.fixture
def own_server(tmp_path: Path, s3_env: None) -> Iterator[MotoS3]:
    """A server of this test's own, for the tests that kill or pause it."""
    server = MotoS3(tmp_path / "moto")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _fails_fast(call: Callable[[], Any]) -> float:
    started_s = time.monotonic()
    with pytest.raises(StoreUnavailableError):
        call()
    elapsed_s = time.monotonic() - started_s
    assert elapsed_s < FAIL_FAST_S
    return elapsed_s


def test_a_killed_server_fails_every_call_fast(own_server: MotoS3, block: Block) -> None:
    make_s3_client(own_server.url).create_bucket(Bucket="kv-tier")
    store = _open(own_server, "kv-tier")
    store.put(*block(0))
    assert store.get(0x1000) == block(0)[1]
    own_server.kill()
    _fails_fast(lambda: store.get(0x1000))
    _fails_fast(lambda: store.get(0x1001))
    _fails_fast(lambda: store.put(*block(1)))
    _fails_fast(store.list_keys)
    _fails_fast(lambda: store.delete(0x1000))


def test_a_hung_server_fails_a_get_within_the_timeouts(own_server: MotoS3, block: Block) -> None:
    """SIGSTOP: connections are accepted and never answered; the read timeout ends the call."""
    make_s3_client(own_server.url).create_bucket(Bucket="kv-tier")
    store = _open(own_server, "kv-tier")
    store.put(*block(0))
    own_server.pause()
    elapsed_s = _fails_fast(lambda: store.get(0x1000))
    assert elapsed_s >= 5.0  # it waited for the read timeout, so the server really hung
