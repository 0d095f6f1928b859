"""Block hashing (DESIGN §3), shared by engines and routers: one function, one scheme.

Full blocks of `block_size` tokens only; a partial block is never hashed.
local hash = xxh3_64(seed) of the block's token ids as little-endian u32;
seq[0] = local[0]; seq[i] = xxh3_64(seed)(le64(seq[i-1]) || le64(local[i])).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import NewType

import xxhash

__all__ = [
    "DEFAULT_HASH_SEED",
    "BlockHash",
    "chain_hash",
    "compute_block_hashes",
    "compute_local_hashes",
    "hash_seed_for_salt",
]

BlockHash = NewType("BlockHash", int)
DEFAULT_HASH_SEED = 1337


def hash_seed_for_salt(salt: str | None) -> int:
    """The xxh3 seed for a salt (e.g. a LoRA name); no salt gives the default seed."""
    if not salt:
        return DEFAULT_HASH_SEED
    return xxhash.xxh3_64_intdigest(salt.encode(), seed=DEFAULT_HASH_SEED)


def compute_local_hashes(
    token_ids: Sequence[int], block_size: int, seed: int = DEFAULT_HASH_SEED
) -> list[int]:
    """Local hash of every full block of `token_ids`."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    num_full_blocks = len(token_ids) // block_size
    out: list[int] = []
    for i in range(num_full_blocks):
        block = token_ids[i * block_size : (i + 1) * block_size]
        data = struct.pack(f"<{block_size}I", *block)
        out.append(xxhash.xxh3_64_intdigest(data, seed=seed))
    return out


def chain_hash(parent_seq_hash: int | None, local_hash: int, seed: int = DEFAULT_HASH_SEED) -> int:
    """Sequence hash of a block given its parent's sequence hash (None for the first block)."""
    if parent_seq_hash is None:
        return local_hash
    return xxhash.xxh3_64_intdigest(struct.pack("<QQ", parent_seq_hash, local_hash), seed=seed)


def compute_block_hashes(
    token_ids: Sequence[int],
    block_size: int,
    seed: int = DEFAULT_HASH_SEED,
    parent_seq_hash: int | None = None,
) -> list[tuple[BlockHash, int]]:
    """(seq_hash, local_hash) of every full block, chained from `parent_seq_hash`."""
    out: list[tuple[BlockHash, int]] = []
    parent = parent_seq_hash
    for local in compute_local_hashes(token_ids, block_size, seed):
        seq = chain_hash(parent, local, seed)
        out.append((BlockHash(seq), local))
        parent = seq
    return out
