"""One KV block as stored in a lower tier (a file on disk, an object in S3), and its name.

    offset 0        MAGIC (4 bytes) + FORMAT_VERSION (u16, big-endian)
    offset 6        header length H (u32, big-endian)
    offset 10       header: a msgpack `BlockHeader` of H bytes
    offset 10 + H   payload: `layout.bytes_per_block` bytes of K and V

`decode_block` checks everything a reader can check (length, magic, header, layout, sequence
hash, xxh3_64 checksum of the payload) and refuses with `BlockRefusedError` for any input bytes,
never with another exception: stored bytes are untrusted (a crash, a full disk, another build or
model writing to a shared store). The header's `local_hash` and `parent_hash` are not under the
checksum; readers take the key from the block's name (`block_name`), not from the header.

Pure: no I/O.
"""

from __future__ import annotations

import re
import struct
from enum import StrEnum

import msgspec
import xxhash

from armature.errors import ArmatureError
from armature.kv.block_key import BlockKey
from armature.protocols.kv_transfer import KvLayout, layout_mismatch

__all__ = [
    "BLOCK_SUFFIX",
    "FORMAT_VERSION",
    "MAGIC",
    "BlockHeader",
    "BlockRefusedError",
    "RefusalReason",
    "block_name",
    "block_name_prefix",
    "decode_block",
    "encode_block",
    "layout_namespace",
    "parse_block_name",
]

MAGIC = b"AKVB"
FORMAT_VERSION = 1
BLOCK_SUFFIX = ".kvb"
_PREFIX = struct.Struct(">4sHI")  # magic, format version, header length
_MAX_HEADER_BYTES = 4096  # a real header is ~150 bytes; a larger length field is corruption
_NAMESPACE_MODEL_CHARS = 64
_NAME_RE = re.compile(r"([0-9a-f]{16})-([0-9a-f]{16})-([0-9a-f]{16}|none)\.kvb")


class RefusalReason(StrEnum):
    """Why stored bytes are not a usable block."""

    TRUNCATED = "truncated"  # a prefix of a block: cut short by a crash or a full disk
    CORRUPT = "corrupt"  # not a block of this format, or its bytes changed
    FOREIGN_LAYOUT = "foreign-layout"  # a block of another KV layout (model, dtype, block size)
    WRONG_HASH = "wrong-hash"  # a valid block, but of another sequence hash


class BlockRefusedError(ArmatureError):
    """Stored bytes that `decode_block` will not return as a block; `reason` says why."""

    def __init__(self, reason: RefusalReason, detail: str) -> None:
        super().__init__(f"KV block refused ({reason}): {detail}")
        self.reason = reason


class BlockHeader(msgspec.Struct, frozen=True, kw_only=True):
    """What a stored block says about itself; `checksum` is xxh3_64 of the payload."""

    version: int
    layout: KvLayout
    seq_hash: int
    local_hash: int
    parent_hash: int | None
    payload_bytes: int
    checksum: int


_HEADER_DECODER = msgspec.msgpack.Decoder(BlockHeader)
_HEADER_ENCODER = msgspec.msgpack.Encoder()


def encode_block(layout: KvLayout, key: BlockKey, payload: bytes | memoryview) -> bytes:
    """The stored form of one block. Raises ValueError when `payload` is not exactly
    `layout.bytes_per_block` bytes (a programmer error: the caller copied the wrong span)."""
    view = _byte_view(payload)
    if view.nbytes != layout.bytes_per_block:
        raise ValueError(
            f"KV block payload is {view.nbytes} bytes, layout needs {layout.bytes_per_block}"
        )
    header = _HEADER_ENCODER.encode(
        BlockHeader(
            version=FORMAT_VERSION,
            layout=layout,
            seq_hash=key.seq_hash,
            local_hash=key.local_hash,
            parent_hash=key.parent_hash,
            payload_bytes=view.nbytes,
            checksum=xxhash.xxh3_64_intdigest(view),
        )
    )
    return b"".join((_PREFIX.pack(MAGIC, FORMAT_VERSION, len(header)), header, view))


def decode_block(data: bytes | memoryview, layout: KvLayout, seq_hash: int) -> memoryview:
    """The payload of a stored block of `layout` under `seq_hash`: a view into `data`, no copy.
    Raises BlockRefusedError, and nothing else, for any bytes that are not such a block."""
    view = _byte_view(data)
    size_bytes = view.nbytes
    seen = bytes(view[: len(MAGIC)])
    if seen != MAGIC[: len(seen)]:
        raise BlockRefusedError(RefusalReason.CORRUPT, "bad magic")
    if size_bytes < _PREFIX.size:
        raise BlockRefusedError(RefusalReason.TRUNCATED, f"{size_bytes} bytes, no header")
    _, version, header_bytes = _PREFIX.unpack_from(view)
    if version != FORMAT_VERSION:
        raise BlockRefusedError(
            RefusalReason.CORRUPT, f"format version {version}, this build reads {FORMAT_VERSION}"
        )
    if header_bytes > _MAX_HEADER_BYTES:
        raise BlockRefusedError(RefusalReason.CORRUPT, f"header length {header_bytes}")
    payload_at = _PREFIX.size + header_bytes
    if size_bytes < payload_at:
        raise BlockRefusedError(RefusalReason.TRUNCATED, f"{size_bytes} bytes, header cut short")
    header = _decode_header(view[_PREFIX.size : payload_at])
    mismatch = layout_mismatch(layout, header.layout)
    if mismatch is not None:
        raise BlockRefusedError(RefusalReason.FOREIGN_LAYOUT, mismatch)
    if header.seq_hash != seq_hash:
        raise BlockRefusedError(
            RefusalReason.WRONG_HASH, f"block of {header.seq_hash:#x}, asked {seq_hash:#x}"
        )
    if header.version != FORMAT_VERSION or header.payload_bytes != layout.bytes_per_block:
        raise BlockRefusedError(RefusalReason.CORRUPT, "header disagrees with its layout")
    payload = view[payload_at:]
    if payload.nbytes < header.payload_bytes:
        raise BlockRefusedError(
            RefusalReason.TRUNCATED,
            f"payload {payload.nbytes} of {header.payload_bytes} bytes",
        )
    if payload.nbytes > header.payload_bytes:
        raise BlockRefusedError(RefusalReason.CORRUPT, "trailing bytes after the payload")
    if xxhash.xxh3_64_intdigest(payload) != header.checksum:
        raise BlockRefusedError(RefusalReason.CORRUPT, "payload checksum mismatch")
    return payload


def _decode_header(raw: memoryview) -> BlockHeader:
    try:
        return _HEADER_DECODER.decode(raw)
    # ValidationError is a DecodeError; a string field of invalid UTF-8 raises the builtin
    except (msgspec.DecodeError, UnicodeDecodeError) as error:
        raise BlockRefusedError(RefusalReason.CORRUPT, f"undecodable header: {error}") from None


def _byte_view(data: bytes | memoryview) -> memoryview:
    view = memoryview(data)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def block_name(key: BlockKey) -> str:
    """The file / object name of a block: `<seq>-<local>-<parent or none>.kvb`, each hash as
    16 lowercase hex digits, so that listing a store gives every block's key."""
    assert all(0 <= h < 1 << 64 for h in key if h is not None), key
    parent = "none" if key.parent_hash is None else f"{key.parent_hash:016x}"
    return f"{key.seq_hash:016x}-{key.local_hash:016x}-{parent}{BLOCK_SUFFIX}"


def parse_block_name(name: str) -> BlockKey | None:
    """The key a `block_name` encodes; None for any other name (temp files, strays)."""
    match = _NAME_RE.fullmatch(name)
    if match is None:
        return None
    seq, local, parent = match.groups()
    return BlockKey(int(seq, 16), int(local, 16), None if parent == "none" else int(parent, 16))


def block_name_prefix(seq_hash: int) -> str:
    """The start every name of a block under `seq_hash` shares (for a lookup by listing)."""
    return f"{seq_hash:016x}-"


def layout_namespace(model_name: str, layout: KvLayout, weights: str) -> str:
    """The directory / key prefix of one model's blocks in a store: its name made safe for
    file systems and S3 keys (`[A-Za-z0-9._-]`, at most 64 characters), then 12 hex digits of
    xxh3_64 over the exact model name, its weights' fingerprint (`weights`:
    model/fingerprint.py), the layout and the format version. Two models, two checkpoints
    served under one name, two layouts of one model or two format versions never share a
    namespace, even when their names sanitize alike."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", model_name).strip("-.")[:_NAMESPACE_MODEL_CHARS]
    fields = (
        f"{model_name}\0{layout.num_layers}\0{layout.block_size}\0{layout.num_kv_heads}"
        f"\0{layout.head_dim}\0{layout.dtype}\0{FORMAT_VERSION}\0{weights}"
    )
    digest = xxhash.xxh3_64_hexdigest(fields.encode())[:12]
    return f"{safe.rstrip('-.') or 'model'}-{digest}"
