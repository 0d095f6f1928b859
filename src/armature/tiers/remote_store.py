"""The shared remote tier (G4) from its URL: `open_remote_store`.

    file:///shared/path      a directory on a file system every worker mounts: a `DiskStore`
    s3://bucket[/prefix]     an S3 bucket (AWS, or a server named by `endpoint`): an `S3Store`

Blocks live under `<path or prefix>/<namespace>/`, the namespace being
`block_file.layout_namespace(model, layout)`, so that models never share blocks. A URL that
cannot work is a ConfigError with a one-line message (the CLI shows it and exits 2); a store
that cannot be reached shows up later, as StoreUnavailableError from its methods.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import SplitResult, unquote, urlsplit

from armature.errors import ConfigError
from armature.tiers.disk_store import DiskStore
from armature.tiers.errors import StoreError
from armature.tiers.journal import SharedStore

__all__ = ["SHARED_STALE_TEMP_S", "open_remote_store"]

# A temp file in a shared directory is a crash's leftover only when no put can still be
# writing it: far longer than a block write takes, even on a slow network file system.
SHARED_STALE_TEMP_S = 600.0
_FORMS = "use file:///absolute/path or s3://bucket/prefix"
# AWS's bucket naming rules (lowercase, digits, dots, hyphens; 3-63 characters)
_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_KEY_SEGMENT_RE = re.compile(r"[A-Za-z0-9!_.*'()-]+")  # AWS's "safe" key characters


def open_remote_store(url: str, *, endpoint: str | None, namespace: str) -> SharedStore:
    """The store `url` names, for blocks under `namespace`. Raises ConfigError for a URL of
    another scheme or a malformed one, for `endpoint` with a file:// URL or a malformed
    endpoint, and for s3:// without boto3 installed. Sends no request to an S3 store."""
    try:
        parts = urlsplit(url)
    except ValueError as error:
        raise ConfigError(f"remote KV store URL {url!r}: {error}; {_FORMS}") from None
    if parts.query or parts.fragment:
        raise ConfigError(f"remote KV store URL {url!r} has a query or fragment; {_FORMS}")
    if parts.scheme == "file":
        return _open_shared_directory(url, parts, endpoint, namespace)
    if parts.scheme == "s3":
        return _open_s3(url, parts, endpoint, namespace)
    raise ConfigError(f"remote KV store URL {url!r}: unsupported scheme; {_FORMS}")


def _open_shared_directory(
    url: str, parts: SplitResult, endpoint: str | None, namespace: str
) -> DiskStore:
    if endpoint is not None:
        raise ConfigError(f"a KV remote endpoint ({endpoint!r}) applies to s3:// only, not {url!r}")
    path = unquote(parts.path)
    if parts.netloc not in ("", "localhost") or not path.startswith("/"):
        raise ConfigError(f"remote KV store URL {url!r}: needs an absolute path; {_FORMS}")
    if "\0" in path:  # %00: no file system path holds one
        raise ConfigError(f"remote KV store URL {url!r}: its path holds a NUL (%00)")
    try:
        return DiskStore(Path(path), namespace, stale_temp_after_s=SHARED_STALE_TEMP_S)
    except StoreError as error:  # a file, /proc, a directory it may not write
        raise ConfigError(f"cannot use --kv-remote {url}: {error}") from None


def _open_s3(url: str, parts: SplitResult, endpoint: str | None, namespace: str) -> SharedStore:
    if not _BUCKET_RE.fullmatch(parts.netloc):
        raise ConfigError(f"remote KV store URL {url!r}: {parts.netloc!r} is not a bucket name")
    segments = [segment for segment in parts.path.split("/") if segment]
    if any(not _KEY_SEGMENT_RE.fullmatch(s) or s in (".", "..") for s in segments):
        raise ConfigError(f"remote KV store URL {url!r}: prefix needs [A-Za-z0-9!_.*'()-]")
    if endpoint is not None:
        _check_endpoint(endpoint)
    try:
        from armature.tiers import s3_store
    except ModuleNotFoundError as error:
        if error.name not in ("boto3", "botocore"):
            raise
        raise ConfigError("s3:// needs `pip install armature[s3]` (boto3)") from None
    client = s3_store.make_s3_client(endpoint)
    key_prefix = "".join(f"{segment}/" for segment in [*segments, namespace])
    return s3_store.S3Store(client, bucket=parts.netloc, key_prefix=key_prefix)


def _check_endpoint(endpoint: str) -> None:
    try:
        parts = urlsplit(endpoint)
        _ = parts.port  # raises ValueError for a port that is not a number in range
    except ValueError:
        parts = None
    if (
        parts is None
        or parts.scheme not in ("http", "https")
        or not parts.hostname
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
    ):
        raise ConfigError(f"KV remote endpoint {endpoint!r}: use http(s)://host[:port]")
