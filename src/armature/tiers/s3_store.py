"""`S3Store`: a `BlockStore` of one object per block in an S3 bucket (AWS S3, MinIO, Ceph or
any S3-compatible server): key `<key_prefix><block_name(key)>`, so that listing the prefix
gives every block's key. An S3 PUT replaces an object atomically: a reader never sees part of a
block.

Importing this module imports boto3: `armature.tiers.remote_store` imports it only when an
`s3://` store is opened (boto3 is the optional extra `armature[s3]`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from armature.errors import ConfigError
from armature.kv.block_key import BlockKey
from armature.tiers.block_file import block_name, block_name_prefix, parse_block_name
from armature.tiers.errors import (
    BlockMissingError,
    StoreError,
    StoreFullError,
    StoreUnavailableError,
)

__all__ = ["CONNECT_TIMEOUT_S", "MAX_ATTEMPTS", "READ_TIMEOUT_S", "S3Store", "make_s3_client"]

# Short, so that an unreachable store fails a call in seconds: a tier is a cache, and a worker
# thread blocked on it holds a transfer slot. Worst case per call is about
# MAX_ATTEMPTS * (CONNECT_TIMEOUT_S + READ_TIMEOUT_S) plus a backoff under a second.
CONNECT_TIMEOUT_S = 2.0
READ_TIMEOUT_S = 5.0
MAX_ATTEMPTS = 2  # in all: the first try and one retry
MAX_POOL_CONNECTIONS = 32  # concurrent calls from the tier's worker threads
# Error codes that mean "no space": MinIO's 507 XMinioStorageFull, Ceph RGW's quota refusal
_FULL_CODES = frozenset({"XMinioStorageFull", "QuotaExceeded"})
_HTTP_INSUFFICIENT_STORAGE = 507
JOURNAL_PREFIX = "journal/"  # under the store's prefix: its journal (`armature.tiers.journal`)


def make_s3_client(endpoint: str | None) -> Any:
    """A boto3 S3 client with short timeouts and one retry; credentials and region come from
    boto3's usual chain (AWS_* environment variables, ~/.aws, instance roles). `endpoint`
    (e.g. `http://127.0.0.1:9000`) selects an S3-compatible server, addressed path-style.
    Raises ConfigError when boto3 cannot make a client (a broken AWS configuration)."""
    config = Config(
        connect_timeout=CONNECT_TIMEOUT_S,
        read_timeout=READ_TIMEOUT_S,
        # botocore's "max_attempts" counts retries only; "total_max_attempts" counts all
        retries={"total_max_attempts": MAX_ATTEMPTS, "mode": "standard"},
        max_pool_connections=MAX_POOL_CONNECTIONS,
        s3={"addressing_style": "path"} if endpoint else None,
    )
    try:
        # a session of our own: boto3's default session is a global, and not thread-safe
        return boto3.session.Session().client("s3", endpoint_url=endpoint, config=config)
    except (BotoCoreError, ValueError) as error:  # e.g. AWS_PROFILE names no profile
        raise ConfigError(f"S3 client for {endpoint or 'AWS'}: {error}") from None


class S3Store:
    """Blocks as objects under `key_prefix` (ends with "/") in `bucket`, through `client`
    (a boto3 S3 client, thread-safe; `make_s3_client`). Opening sends no request.

    `_keys` (sequence hash -> object key, filled by put and list_keys, guarded by `_lock`)
    spares a listing per get; a block it does not know is looked up by listing its prefix.
    """

    def __init__(self, client: Any, *, bucket: str, key_prefix: str) -> None:
        assert key_prefix == "" or key_prefix.endswith("/"), key_prefix
        self._client = client
        self.bucket = bucket
        self.key_prefix = key_prefix
        self._keys: dict[int, str] = {}
        self._lock = threading.Lock()

    def describe(self) -> str:
        return f"s3://{self.bucket}/{self.key_prefix}"

    def put(self, key: BlockKey, data: bytes) -> None:
        object_key = self.key_prefix + block_name(key)
        with self._errors(f"put {object_key}"):
            self._client.put_object(Bucket=self.bucket, Key=object_key, Body=data)
        with self._lock:
            self._keys[key.seq_hash] = object_key

    def get(self, seq_hash: int) -> bytes:
        with self._lock:
            known = self._keys.get(seq_hash)
        if known is not None:
            data = self._read(known, seq_hash)
            if data is not None:
                return data
        for object_key in self._find(seq_hash):  # written by another worker, or renamed
            data = self._read(object_key, seq_hash)
            if data is not None:
                with self._lock:
                    self._keys[seq_hash] = object_key
                return data
        raise BlockMissingError(f"{self.describe()}: no block {seq_hash:016x}")

    def delete(self, seq_hash: int) -> None:
        with self._lock:
            known = self._keys.pop(seq_hash, None)
        for object_key in [known] if known is not None else self._find(seq_hash):
            with self._errors(f"delete {object_key}"):  # S3 answers 204 for a missing key
                self._client.delete_object(Bucket=self.bucket, Key=object_key)

    def list_keys(self) -> list[BlockKey]:
        found: list[tuple[Any, str, BlockKey]] = []
        with self._errors("list"):
            pages = self._client.get_paginator("list_objects_v2")
            for page in pages.paginate(Bucket=self.bucket, Prefix=self.key_prefix):
                for item in page.get("Contents", []):
                    object_key = str(item["Key"])
                    key = parse_block_name(object_key[len(self.key_prefix) :])
                    if key is not None:
                        found.append((item["LastModified"], object_key, key))
        found.sort(key=lambda entry: (entry[0], entry[1]))  # LastModified has 1 s resolution
        with self._lock:
            self._keys.update((key.seq_hash, object_key) for _, object_key, key in found)
        return [key for _, _, key in found]

    # ---- the journal (`armature.tiers.journal.JournalObjects`) ---------------------------
    def put_journal(self, name: str, data: bytes) -> None:
        object_key = self.key_prefix + JOURNAL_PREFIX + name
        with self._errors(f"put {object_key}"):
            self._client.put_object(Bucket=self.bucket, Key=object_key, Body=data)

    def get_journal(self, name: str) -> bytes | None:
        object_key = self.key_prefix + JOURNAL_PREFIX + name
        try:
            with self._errors(f"get {object_key}"):
                response = self._client.get_object(Bucket=self.bucket, Key=object_key)
                return bytes(response["Body"].read())
        except BlockMissingError:
            return None

    def list_journals(self) -> list[tuple[float, str]]:
        prefix = self.key_prefix + JOURNAL_PREFIX
        found: list[tuple[float, str]] = []
        with self._errors(f"list {prefix}"):
            pages = self._client.get_paginator("list_objects_v2")
            for page in pages.paginate(Bucket=self.bucket, Prefix=prefix):
                for item in page.get("Contents", []):
                    modified_s = float(item["LastModified"].timestamp())
                    found.append((modified_s, str(item["Key"])[len(prefix) :]))
        return found

    def delete_journal(self, name: str) -> None:
        object_key = self.key_prefix + JOURNAL_PREFIX + name
        with self._errors(f"delete {object_key}"):
            self._client.delete_object(Bucket=self.bucket, Key=object_key)

    def learn_names(self, names: Iterable[str]) -> list[BlockKey]:
        known = [(name, key) for name in names if (key := parse_block_name(name)) is not None]
        with self._lock:
            self._keys.update((key.seq_hash, self.key_prefix + name) for name, key in known)
        return [key for _, key in known]

    def _read(self, object_key: str, seq_hash: int) -> bytes | None:
        """The object's bytes; None (and the key forgotten) when it is gone."""
        try:
            with self._errors(f"get {object_key}"):
                response = self._client.get_object(Bucket=self.bucket, Key=object_key)
                return bytes(response["Body"].read())
        except BlockMissingError:
            with self._lock:
                if self._keys.get(seq_hash) == object_key:
                    del self._keys[seq_hash]
            return None

    def _find(self, seq_hash: int) -> list[str]:
        """The object keys of blocks under `seq_hash`, by listing their common prefix."""
        prefix = self.key_prefix + block_name_prefix(seq_hash)
        with self._errors(f"find {seq_hash:016x}"):
            response = self._client.list_objects_v2(Bucket=self.bucket, Prefix=prefix)
        return sorted(
            str(item["Key"])
            for item in response.get("Contents", [])
            if parse_block_name(str(item["Key"])[len(self.key_prefix) :]) is not None
        )

    @contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        """boto3's errors as store errors: NoSuchKey -> BlockMissingError, no space ->
        StoreFullError, anything else (connection, timeout, 5xx, 403, no bucket, no
        credentials) -> StoreUnavailableError."""
        try:
            yield
        except ClientError as error:
            raise _client_error(f"{self.describe()}: {action}", error) from error
        except BotoCoreError as error:
            raise StoreUnavailableError(f"{self.describe()}: {action}: {error}") from error


def _client_error(where: str, error: ClientError) -> StoreError:
    details = error.response.get("Error", {})
    code = str(details.get("Code", ""))
    status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    message = f"{where}: {code or status} {details.get('Message', '')}".rstrip()
    if code == "NoSuchKey":
        return BlockMissingError(message)
    if code in _FULL_CODES or status == _HTTP_INSUFFICIENT_STORAGE:
        return StoreFullError(message)
    return StoreUnavailableError(message)
