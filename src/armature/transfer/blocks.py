"""KV block payloads and the store seam that engines implement for transfers.

`KvBlocks` names blocks inside K/V tensors shaped [layers, blocks, block_size, kv_heads,
head_dim]: either a contiguous staging copy (blocks 0..n-1, the TCP path) or a peer's whole
cache mapped from shared memory (the pinned block ids, the zero-staging path). A store copies
them into its own blocks run by run, so consecutive ids move as one slice copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from armature.protocols.kv_transfer import KvLayout

if TYPE_CHECKING:
    import torch

__all__ = [
    "KvBlockStore",
    "KvBlocks",
    "ModeledKvStore",
    "block_runs",
    "copy_block_runs",
]


@dataclass(frozen=True)
class KvBlocks:
    """Blocks `block_ids` of `k`/`v`; tensors are None for a modeled (mocker) payload."""

    block_ids: list[int]
    k: torch.Tensor | None
    v: torch.Tensor | None

    @property
    def num_blocks(self) -> int:
        return len(self.block_ids)


class KvBlockStore(Protocol):
    layout: KvLayout
    shm_path: str | None  # where peers on this host map the blocks (None: not shared)

    def read_blocks(self, block_ids: list[int]) -> KvBlocks:
        """A contiguous CPU copy of `block_ids` (ids 0..n-1 in the result)."""
        ...

    def wire_views(self, block_ids: list[int]) -> list[torch.Tensor]:
        """Contiguous CPU tensors whose bytes, in order, are `read_blocks(block_ids)`'s K
        then V (views into the cache where it can, so sending copies nothing)."""
        ...

    def write_blocks(self, block_ids: list[int], blocks: KvBlocks) -> None:
        """Copy `blocks` into this store's `block_ids` (same count)."""
        ...

    def transfer_delay_s(self, num_blocks: int) -> float:
        """Extra time a transfer of `num_blocks` takes (a modeled store; 0 for real data)."""
        ...

    def kv_tensors(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The whole K and V caches (for backends that register memory); None: no data."""
        ...


def block_runs(block_ids: list[int]) -> list[tuple[int, int]]:
    """(start, length) runs of consecutive ids."""
    return [(s, n) for _, s, n in _runs(block_ids, block_ids)]


def _runs(dst_ids: list[int], src_ids: list[int]) -> list[tuple[int, int, int]]:
    """(dst_start, src_start, length) runs where both id lists advance by one."""
    out: list[tuple[int, int, int]] = []
    for dst, src in zip(dst_ids, src_ids, strict=True):
        if out:
            d0, s0, n = out[-1]
            if dst == d0 + n and src == s0 + n:
                out[-1] = (d0, s0, n + 1)
                continue
        out.append((dst, src, 1))
    return out


def copy_block_runs(
    dst: torch.Tensor, dst_ids: list[int], src: torch.Tensor, src_ids: list[int]
) -> None:
    """dst[:, dst_ids[i]] = src[:, src_ids[i]] for all i, one slice copy per run."""
    for d0, s0, n in _runs(dst_ids, src_ids):
        dst[:, d0 : d0 + n].copy_(src[:, s0 : s0 + n])


class ModeledKvStore:
    """The mocker's store: no data, a transfer costs bytes / bandwidth (divided by speedup)."""

    def __init__(self, layout: KvLayout, bandwidth_bytes_s: float, speedup_ratio: float = 1.0):
        if bandwidth_bytes_s <= 0 or speedup_ratio <= 0:
            raise ValueError("bandwidth_bytes_s and speedup_ratio must be positive")
        self.layout = layout
        self.shm_path: str | None = None
        self.bandwidth_bytes_s = bandwidth_bytes_s
        self.speedup_ratio = speedup_ratio

    def read_blocks(self, block_ids: list[int]) -> KvBlocks:
        return KvBlocks(list(range(len(block_ids))), None, None)

    def wire_views(self, block_ids: list[int]) -> list[torch.Tensor]:
        return []

    def write_blocks(self, block_ids: list[int], blocks: KvBlocks) -> None:
        if len(block_ids) != blocks.num_blocks:
            raise ValueError(f"{blocks.num_blocks} blocks for {len(block_ids)} slots")

    def kv_tensors(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        return None

    def transfer_delay_s(self, num_blocks: int) -> float:
        nbytes = num_blocks * self.layout.bytes_per_block
        return nbytes / self.bandwidth_bytes_s / self.speedup_ratio
