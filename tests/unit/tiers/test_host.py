"""G2 host slots: shaped like the engine's cache, every page written (zeroed) at start."""

from __future__ import annotations

import pytest
import torch

from armature.protocols.kv_transfer import KvLayout
from armature.tiers.host import HostBlocks

LAYOUT = KvLayout(num_layers=3, block_size=4, num_kv_heads=2, head_dim=8, dtype="float32")


def test_host_slots_are_shaped_like_the_cache_and_start_zeroed() -> None:
    host = HostBlocks(LAYOUT, 5, torch.float32, pin=False)
    assert host.k.shape == host.v.shape == (3, 5, 4, 2, 8)
    assert host.k.dtype == host.v.dtype == torch.float32
    assert host.k.count_nonzero().item() == host.v.count_nonzero().item() == 0
    assert host.k.numel() * 4 * 2 == 5 * LAYOUT.bytes_per_block


def test_a_host_tier_needs_a_block() -> None:
    with pytest.raises(ValueError, match="at least one block"):
        HostBlocks(LAYOUT, 0, torch.float32, pin=False)
