"""The paged KV cache tensors: one K and one V tensor per layer, indexed by block id.

k[layer]: [num_blocks, block_size, num_kv_heads, head_dim]
slot = block_id * block_size + offset_in_block

With `shared=True` (CPU only) K and V live in one anonymous shared-memory segment that
decode workers on this host map to copy pinned blocks straight into their own cache.
"""

from __future__ import annotations

import os

import torch

from armature.model.arch import ModelArch
from armature.protocols.kv_transfer import KvLayout

__all__ = ["PagedKvCache", "shared_tensor"]


def shared_tensor(shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, str]:
    """A zeroed tensor in anonymous shared memory (memfd) and the path another process of
    this host opens to map it. The memory is released when every mapping is gone, so a killed
    worker leaves nothing behind in /dev/shm. Its pages are written once here, as
    `torch.zeros` writes a private tensor's: a page of shared memory is otherwise allocated
    and zeroed by the kernel at its first touch, which falls in the engine's steps (a
    prefill worker's first pass over its cache ran its prompt steps ~6% slower)."""
    numel = 1
    for dim in shape:
        numel *= dim
    fd = os.memfd_create("armature-kv", os.MFD_CLOEXEC)
    os.ftruncate(fd, numel * torch.empty((), dtype=dtype).element_size())
    path = f"/proc/{os.getpid()}/fd/{fd}"
    tensor = torch.from_file(path, shared=True, size=numel, dtype=dtype).view(shape)
    tensor.zero_()  # every page now, not at its first step
    return tensor, path


class PagedKvCache:
    def __init__(
        self,
        arch: ModelArch,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
        *,
        shared: bool = False,
    ):
        shape = (arch.num_layers, num_blocks, block_size, arch.num_kv_heads, arch.head_dim)
        self.shm_path: str | None = None
        if shared:
            if device.type != "cpu":
                raise ValueError("a shared-memory KV cache must be on the CPU")
            both, self.shm_path = shared_tensor((2, *shape), dtype)
            self.k, self.v = both[0], both[1]
        else:
            self.k = torch.zeros(shape, dtype=dtype, device=device)
            self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.layout = KvLayout(
            num_layers=arch.num_layers,
            block_size=block_size,
            num_kv_heads=arch.num_kv_heads,
            head_dim=arch.head_dim,
            dtype=str(dtype).removeprefix("torch."),
        )

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k/v [tokens, kv_heads, head_dim] at flat slot indices [tokens]."""
        k_flat = self.k[layer].view(-1, k.shape[1], k.shape[2])
        v_flat = self.v[layer].view(-1, v.shape[1], v.shape[2])
        k_flat.index_copy_(0, slots, k)
        v_flat.index_copy_(0, slots, v)

    def gather(self, layer: int, block_table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V for block tables [..., num_blocks_per_seq] -> [..., tokens, kv_heads, head_dim].
        index_select: about 2x faster than advanced indexing for this copy on CPU."""
        flat = block_table.reshape(-1)
        k = self.k[layer].index_select(0, flat)
        v = self.v[layer].index_select(0, flat)
        lead = block_table.shape[:-1]
        return (
            k.view(*lead, -1, k.shape[-2], k.shape[-1]),
            v.view(*lead, -1, v.shape[-2], v.shape[-1]),
        )
