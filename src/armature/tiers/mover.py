"""The bytes of a KV block between the engine's cache (G1), host slots (G2) and encoded blocks
for the stores (G3, G4). Engine-thread calls (`copy_*`, `encode`) read G1 while its contents are
still valid; loader-thread calls (`load_*`) write G1 blocks that no request reads until the
load is settled on the engine thread.

A block's payload is its K for every layer, then its V: [2, layers, block_size, heads, dim].
"""

from __future__ import annotations

import torch

from armature.kv.block_key import BlockKey
from armature.protocols.kv_events import KvTier
from armature.protocols.kv_transfer import KvLayout
from armature.tiers.block_file import decode_block, encode_block
from armature.tiers.host import HostBlocks
from armature.transfer.blocks import copy_block_runs

__all__ = ["BlockMover"]


class BlockMover:
    def __init__(
        self, g1_k: torch.Tensor, g1_v: torch.Tensor, layout: KvLayout, host: HostBlocks | None
    ):
        self.g1_k, self.g1_v = g1_k, g1_v
        self.layout = layout
        self.host = host
        self.on_gpu = g1_k.device.type == "cuda"
        self._block_shape = (
            2,
            layout.num_layers,
            layout.block_size,
            layout.num_kv_heads,
            layout.head_dim,
        )

    def _tensors(self, tier: KvTier) -> tuple[torch.Tensor, torch.Tensor]:
        if tier is KvTier.DEVICE:
            return self.g1_k, self.g1_v
        assert tier is KvTier.HOST and self.host is not None
        return self.host.k, self.host.v

    # ---- engine thread -----------------------------------------------------------------
    def copy_blocks(
        self, src: KvTier, src_slots: list[int], dst: KvTier, dst_slots: list[int]
    ) -> None:
        """dst[dst_slots[i]] = src[src_slots[i]] between G1 and host slots (no slot twice)."""
        src_k, src_v = self._tensors(src)
        dst_k, dst_v = self._tensors(dst)
        copy_block_runs(dst_k, dst_slots, src_k, src_slots)
        copy_block_runs(dst_v, dst_slots, src_v, src_slots)

    def encode(self, tier: KvTier, slot: int, key: BlockKey) -> bytes:
        """Block `slot` of G1 or host as stored bytes (a copy: the slot may be reused)."""
        k, v = self._tensors(tier)
        both = torch.stack((k[:, slot], v[:, slot])).cpu()
        return encode_block(self.layout, key, both.view(torch.uint8).numpy().data)

    # ---- loader threads ----------------------------------------------------------------
    def load_from_host(self, host_slots: list[int], g1_ids: list[int]) -> None:
        self.copy_blocks(KvTier.HOST, host_slots, KvTier.DEVICE, g1_ids)

    def load_encoded(self, data: bytes, seq_hash: int, g1_id: int) -> None:
        """Check `data` (BlockRefusedError if it is not this block) and write it to G1."""
        payload = decode_block(data, self.layout, seq_hash)
        raw = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        both = raw.view(self.g1_k.dtype).view(self._block_shape)
        self.g1_k[:, g1_id].copy_(both[0], non_blocking=self.on_gpu)
        self.g1_v[:, g1_id].copy_(both[1], non_blocking=self.on_gpu)

    def finish_loads(self) -> None:
        """Wait for this thread's asynchronous copies (GPU) before a load is reported done."""
        if self.on_gpu:
            torch.cuda.current_stream(self.g1_k.device).synchronize()
