"""What the two KV block pools (`armature.kv.block_pool`) share: the errors, the block
snapshot, the argument checks and the shell that owns the sizes, the eviction observer and the
event log. Pure."""

from __future__ import annotations

import abc
from dataclasses import dataclass

from armature.errors import ArmatureError
from armature.kv.event_log import KvEventLog
from armature.kv.eviction import EvictionObserver
from armature.protocols.kv_events import KvEvent

__all__ = ["KvBlock", "NoFreeBlocksError", "PoolShell", "check_allocation", "check_sizes"]


class NoFreeBlocksError(ArmatureError, RuntimeError):
    """Raised by `allocate` when fewer free blocks exist than asked for (nothing is taken)."""


@dataclass
class KvBlock:
    """One block's state (a snapshot: see `BlockPool.blocks`)."""

    block_id: int
    ref_count: int = 0
    seq_hash: int | None = None
    local_hash: int | None = None
    parent_hash: int | None = None  # seq_hash of the block before it (only while cached)
    num_hits: int = 0  # prefix-cache hits since it was cached (tier offload policy reads it)


def check_sizes(num_blocks: int, block_size: int) -> None:
    if num_blocks <= 0 or block_size <= 0:
        raise ValueError("num_blocks and block_size must be positive")


def check_allocation(num_blocks: int, num_free: int) -> None:
    if num_blocks < 0:
        raise ValueError(f"num_blocks must be non-negative, got {num_blocks}")
    if num_blocks > num_free:
        raise NoFreeBlocksError(f"asked for {num_blocks} blocks, {num_free} free")


class PoolShell(abc.ABC):
    """What both pools share: the sizes, the eviction observer and the event log (shared with
    the lower KV tiers so that one worker's event ids stay one sequence; a private one if
    None)."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        *,
        eviction_observer: EvictionObserver | None = None,
        event_log: KvEventLog | None = None,
    ):
        check_sizes(num_blocks, block_size)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._eviction_observer = eviction_observer
        self.event_log = event_log if event_log is not None else KvEventLog()
        self._make_state()

    @abc.abstractmethod
    def _make_state(self) -> None:
        """The implementation's per-block state, empty (called once, by __init__)."""

    def get_last_event_id(self) -> int:
        """Id of the newest event emitted so far (-1 before the first)."""
        return self.event_log.get_last_event_id()

    def take_events(self) -> list[KvEvent]:
        """Drain the events emitted since the last call (by this pool and whatever shares
        its event log), oldest first."""
        return self.event_log.take()
