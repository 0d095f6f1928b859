"""The native engine's KvBlockStore: whole blocks in and out of its paged KV cache (for KV
transfers between prefill and decode workers)."""

from __future__ import annotations

import torch

from armature.model.kv_cache import PagedKvCache
from armature.protocols.kv_transfer import KvLayout
from armature.transfer.blocks import KvBlocks, block_runs, copy_block_runs

__all__ = ["PagedCacheStore"]


class PagedCacheStore:
    def __init__(self, cache: PagedKvCache):
        self.cache = cache
        self.layout: KvLayout = cache.layout
        self.shm_path = cache.shm_path

    def read_blocks(self, block_ids: list[int]) -> KvBlocks:
        cache = self.cache
        index = torch.tensor(block_ids, dtype=torch.long, device=cache.k.device)
        k = cache.k.index_select(1, index).cpu()
        v = cache.v.index_select(1, index).cpu()
        return KvBlocks(list(range(len(block_ids))), k, v)

    def wire_views(self, block_ids: list[int]) -> list[torch.Tensor]:
        cache = self.cache
        if cache.k.device.type != "cpu":
            blocks = self.read_blocks(block_ids)
            assert blocks.k is not None and blocks.v is not None
            return [blocks.k, blocks.v]
        runs = block_runs(block_ids)  # layer-major, like read_blocks' [layers, blocks, ...]
        return [
            tensor[layer, start : start + n]
            for tensor in (cache.k, cache.v)
            for layer in range(tensor.shape[0])
            for start, n in runs
        ]

    def write_blocks(self, block_ids: list[int], blocks: KvBlocks) -> None:
        if blocks.k is None or blocks.v is None:
            raise ValueError("a KV payload without data cannot fill a real cache")
        if len(block_ids) != blocks.num_blocks:
            raise ValueError(f"{blocks.num_blocks} blocks for {len(block_ids)} slots")
        copy_block_runs(self.cache.k, block_ids, blocks.k, blocks.block_ids)
        copy_block_runs(self.cache.v, block_ids, blocks.v, blocks.block_ids)

    def transfer_delay_s(self, num_blocks: int) -> float:
        return 0.0

    def kv_tensors(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        return self.cache.k, self.cache.v
