"""Fixtures of the tier store tests.

- `layout`: a small KV layout (64-byte blocks) and `block(i)`: block i's key and encoded bytes.
- `s3_env`: dummy AWS credentials and region in the environment (the client's only), no AWS
  configuration files, so that boto3 never reads the machine's.
- `moto_s3`: one real S3-compatible server (moto) for the module, on a free loopback port,
  stopped by its PID at the end; `bucket`: a fresh bucket on it for each test.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from armature.kv.block_key import BlockKey
from armature.protocols.kv_transfer import KvLayout
from armature.tiers.block_file import encode_block
from servers import MotoS3

LAYOUT = KvLayout(num_layers=2, block_size=4, num_kv_heads=1, head_dim=2, dtype="float16")
_bucket_numbers = itertools.count()


def make_block(i: int, layout: KvLayout = LAYOUT) -> tuple[BlockKey, bytes]:
    """Block i of a chain: seq hash 0x1000 + i, parent block i - 1 (none for i == 0), and a
    payload of bytes (i + j) % 256."""
    key = BlockKey(0x1000 + i, 0x2000 + i, None if i == 0 else 0x1000 + i - 1)
    payload = bytes((i + j) % 256 for j in range(layout.bytes_per_block))
    return key, encode_block(layout, key, payload)


@pytest.fixture
def layout() -> KvLayout:
    return LAYOUT


@pytest.fixture
def block() -> Callable[[int], tuple[BlockKey, bytes]]:
    return make_block


@pytest.fixture
def s3_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture(scope="module")
def moto_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoS3]:
    server = MotoS3(tmp_path_factory.mktemp("moto"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


def create_bucket(server: MotoS3) -> str:
    """A new empty bucket on `server` (needs `s3_env`)."""
    from armature.tiers.s3_store import make_s3_client

    name = f"kv-{next(_bucket_numbers)}"
    make_s3_client(server.url).create_bucket(Bucket=name)
    return name


@pytest.fixture
def bucket(moto_s3: MotoS3, s3_env: None) -> str:
    return create_bucket(moto_s3)
