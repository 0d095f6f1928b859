"""The seam between the tier policy and a lower tier's storage: `BlockStore`.

A store keeps encoded blocks (`armature.tiers.block_file`) as opaque bytes under their
`BlockKey`; it never decodes them. Its methods block and are called from worker threads, never
from an event loop: an implementation must be safe for concurrent calls on different keys.
"""

from __future__ import annotations

from typing import Protocol

from armature.kv.block_key import BlockKey

__all__ = ["BlockStore"]


class BlockStore(Protocol):
    """Blocking, thread-safe storage of encoded KV blocks, named by sequence hash."""

    def describe(self) -> str:
        """A short name for log lines, e.g. `disk:/var/cache/armature/kv/NS`."""
        ...

    def put(self, key: BlockKey, data: bytes) -> None:
        """Store `data` under `key`, replacing a block of the same sequence hash. A reader
        sees the whole old block or the whole new one, never a part. Raises StoreFullError
        or StoreUnavailableError; after either, no block of `key` is half written."""
        ...

    def get(self, seq_hash: int) -> bytes:
        """The bytes stored under `seq_hash`. Raises BlockMissingError when there are none,
        StoreUnavailableError when the store cannot be read."""
        ...

    def delete(self, seq_hash: int) -> None:
        """Remove the block under `seq_hash`; a missing block is not an error. Raises
        StoreUnavailableError."""
        ...

    def list_keys(self) -> list[BlockKey]:
        """Every block present, oldest first where the store can tell (modification time),
        for a warm restart and for refreshing an index of a shared store. Raises
        StoreUnavailableError."""
        ...
