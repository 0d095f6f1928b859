"""G2: host memory for KV blocks, shaped like the engine's cache so a block moves as one slice
copy per tensor. Pinned (page-locked) when the engine's cache is on a GPU, so copies between
them can run asynchronously; on a CPU engine it is plain memory. Either way every page is
written once at start (zeroed): a first write to a fresh page faults, and those faults, paid
on the engine thread at eviction time, cost about 5x the copy itself (bench/kv_tiers'
diagnosis, docs/benchmarks.md). The tier's memory is committed at start, as sized."""

from __future__ import annotations

import torch

from armature.protocols.kv_transfer import KvLayout

__all__ = ["HostBlocks"]


class HostBlocks:
    """`num_blocks` host slots: k and v are [layers, num_blocks, block_size, kv_heads, dim]."""

    def __init__(self, layout: KvLayout, num_blocks: int, dtype: torch.dtype, *, pin: bool):
        if num_blocks <= 0:
            raise ValueError("a host tier needs at least one block")
        shape = (
            layout.num_layers,
            num_blocks,
            layout.block_size,
            layout.num_kv_heads,
            layout.head_dim,
        )
        self.layout = layout
        self.num_blocks = num_blocks
        self.k = torch.empty(shape, dtype=dtype, pin_memory=pin).zero_()
        self.v = torch.empty(shape, dtype=dtype, pin_memory=pin).zero_()
