"""open_remote_store: file:// (a shared directory), the URLs it refuses, and s3:// without
boto3. S3 itself is tested against a real server in test_s3_store.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import armature
from armature.errors import ConfigError
from armature.kv.block_key import BlockKey
from armature.tiers.disk_store import DiskStore
from armature.tiers.remote_store import open_remote_store

Block = Callable[[int], tuple[BlockKey, bytes]]
NS = "model-0123456789ab"


def test_two_stores_on_one_shared_directory_share_blocks(tmp_path: Path, block: Block) -> None:
    url = f"file://{tmp_path}/shared"
    worker_a = open_remote_store(url, endpoint=None, namespace=NS)
    worker_b = open_remote_store(url, endpoint=None, namespace=NS)
    assert isinstance(worker_a, DiskStore)
    assert worker_a.describe() == f"disk:{tmp_path}/shared/{NS}"
    worker_a.put(*block(0))
    worker_a.put(*block(1))
    assert worker_b.get(0x1001) == block(1)[1]  # never listed by b: found by name
    assert sorted(worker_b.list_keys()) == [block(0)[0], block(1)[0]]
    worker_b.delete(0x1000)
    assert worker_a.list_keys() == [block(1)[0]]
    other_model = open_remote_store(url, endpoint=None, namespace="other-0123456789ab")
    assert other_model.list_keys() == []


def test_file_url_spellings(tmp_path: Path) -> None:
    for url in (f"file://localhost{tmp_path}/a", f"file://{tmp_path}/with%20space"):
        store = open_remote_store(url, endpoint=None, namespace=NS)
        assert isinstance(store, DiskStore)
    assert (tmp_path / "a" / NS).is_dir()
    assert (tmp_path / "with space" / NS).is_dir()


@pytest.mark.parametrize(
    ("url", "endpoint", "message"),
    [
        ("", None, "unsupported scheme"),
        ("/shared/kv", None, "unsupported scheme"),
        ("http://127.0.0.1:9000/bucket", None, "unsupported scheme"),
        ("gs://bucket/prefix", None, "unsupported scheme"),
        ("file://host/shared", None, "needs an absolute path"),
        ("file:relative/dir", None, "needs an absolute path"),
        ("file:///tmp/a%00b", None, "its path holds a NUL (%00)"),  # not the model's fault
        ("file:///shared?x=1", None, "query or fragment"),
        ("file:///shared", "http://127.0.0.1:9000", "applies to s3:// only"),
        ("s3://", None, "is not a bucket name"),
        ("s3://Bucket_Name/prefix", None, "is not a bucket name"),
        ("s3://user:pw@bucket/prefix", None, "is not a bucket name"),
        ("s3://bucket:9000/prefix", None, "is not a bucket name"),
        ("s3://bucket/a/../b", None, "prefix needs"),
        ("s3://bucket/a b", None, "prefix needs"),
        ("s3://[bucket/prefix", None, "Invalid IPv6 URL"),
        ("s3://bucket/prefix", "127.0.0.1:9000", "use http(s)://host[:port]"),
        ("s3://bucket/prefix", "ftp://127.0.0.1", "use http(s)://host[:port]"),
        ("s3://bucket/prefix", "http://127.0.0.1:99999", "use http(s)://host[:port]"),
        ("s3://bucket/prefix", "http://127.0.0.1:9000/path", "use http(s)://host[:port]"),
    ],
)
def test_urls_that_cannot_work_are_config_errors(
    url: str, endpoint: str | None, message: str, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)) as e:
        open_remote_store(url, endpoint=endpoint, namespace=NS)
    assert "\n" not in str(e.value)


_WITHOUT_BOTO3 = """
import sys
sys.modules["boto3"] = None  # what an install without the s3 extra sees
from armature.errors import ConfigError
from armature.tiers.remote_store import open_remote_store

open_remote_store("file://" + sys.argv[1], endpoint=None, namespace="ns")
assert "botocore" not in sys.modules
try:
    open_remote_store("s3://bucket/prefix", endpoint=None, namespace="ns")
except ConfigError as error:
    print(error)
"""


def test_s3_without_boto3_is_a_config_error_and_file_urls_work(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(armature.__file__).parents[1])}
    result = subprocess.run(
        [sys.executable, "-c", _WITHOUT_BOTO3, str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "s3:// needs `pip install armature[s3]` (boto3)\n"


def test_a_shared_directory_that_cannot_be_one_is_a_config_error(tmp_path: Path) -> None:
    """A file, or a path under one: a traceback out of the worker's start before."""
    afile = tmp_path / "afile"
    afile.write_bytes(b"")
    for path in (afile, afile / "below"):
        with pytest.raises(
            ConfigError, match=re.escape(f"cannot use --kv-remote file://{path}: ")
        ) as e:
            open_remote_store(f"file://{path}", endpoint=None, namespace=NS)
        assert "\n" not in str(e.value)
