"""Block hashing (DESIGN §3), shared by engines and routers: one function, one scheme.

Full blocks of `block_size` tokens only; a partial block is never hashed.
local hash = xxh3_64(seed) of the block's token ids as little-endian u32;
seq[0] = local[0]; seq[i] = xxh3_64(seed)(le64(seq[i-1]) || le64(local[i])).

Whole prompts are hashed in one native call (`armature.kv._native`, built from _native.c at
install) when the extension is present, else in Python; both give the same hashes and raise
the same errors. `backend=` picks one explicitly (tests, benchmarks); None takes the fastest.
"""

from __future__ import annotations

import enum
import struct
import sys
from array import array
from collections.abc import Sequence
from typing import NewType

import xxhash

from armature.errors import ArmatureError

try:
    from armature.kv import _native
except ImportError:  # built without a C compiler: the pure-Python path below
    _native = None  # type: ignore[assignment]

__all__ = [
    "DEFAULT_HASH_SEED",
    "BlockHash",
    "HashBackend",
    "HashBackendUnavailableError",
    "chain_hash",
    "compute_block_and_seq_hashes",
    "compute_block_hashes",
    "compute_block_hashes_py",
    "compute_local_hashes",
    "compute_seq_hashes",
    "get_token_id_range",
    "has_native_hashing",
    "hash_seed_for_salt",
]


class HashBackend(enum.StrEnum):
    """Which implementation hashes a whole prompt."""

    NATIVE = "native"  # armature.kv._native, the C extension (present if it was built)
    PYTHON = "python"  # xxhash per block from Python: always present, the reference


class HashBackendUnavailableError(ArmatureError, RuntimeError):
    """`backend=HashBackend.NATIVE` was asked for, but the extension was not built."""


BlockHash = NewType("BlockHash", int)
_PAIR = struct.Struct("<QQ")
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
    data = _le_u32_bytes(token_ids[: num_full_blocks * block_size])
    step = block_size * 4
    digest = xxhash.xxh3_64_intdigest
    return [digest(data[i * step : (i + 1) * step], seed) for i in range(num_full_blocks)]


def _le_u32_bytes(token_ids: Sequence[int]) -> bytes:
    """Token ids as little-endian u32 bytes: one packing call for the whole prompt, about 3x
    faster than packing block by block (256 blocks: 117 us vs 398 us)."""
    try:
        packed = array("I", token_ids)
    except (OverflowError, TypeError):  # TypeError: not an int; the native path says the same
        raise ValueError("token ids must fit in an unsigned 32-bit integer") from None
    assert packed.itemsize == 4
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tobytes()


def chain_hash(parent_seq_hash: int | None, local_hash: int, seed: int = DEFAULT_HASH_SEED) -> int:
    """Sequence hash of a block given its parent's sequence hash (None for the first block)."""
    if parent_seq_hash is None:
        return local_hash
    return xxhash.xxh3_64_intdigest(struct.pack("<QQ", parent_seq_hash, local_hash), seed=seed)


def get_token_id_range(token_ids: Sequence[int]) -> tuple[int, int]:
    """(min, max) of a non-empty `token_ids`: one native pass over a list of small ints (what
    validating a long prompt costs), else min() and max()."""
    if _native is not None:
        found = _native.token_id_range(token_ids)
        if found is not None:
            return found
    return min(token_ids), max(token_ids)


def has_native_hashing() -> bool:
    """Whether the native extension was built (and so is the default backend)."""
    return _native is not None


def _use_native(backend: HashBackend | None) -> bool:
    if backend is None:
        return _native is not None
    if backend is HashBackend.PYTHON:
        return False
    if _native is None:
        raise HashBackendUnavailableError(
            "armature.kv._native was not built (no C compiler at install); use HashBackend.PYTHON"
        )
    return True


def compute_block_hashes(
    token_ids: Sequence[int],
    block_size: int,
    seed: int = DEFAULT_HASH_SEED,
    parent_seq_hash: int | None = None,
    *,
    start: int = 0,
    backend: HashBackend | None = None,
) -> list[tuple[BlockHash, int]]:
    """(seq_hash, local_hash) of every full block of `token_ids[start:]`, chained from
    `parent_seq_hash`. `start` instead of a slice: the native path reads the tokens in place
    (a slice of a long prompt copies it, a reference taken and dropped per token)."""
    if _use_native(backend):
        return _native.hash_blocks(token_ids, block_size, seed, parent_seq_hash, 1, start)
    if not 0 <= start <= len(token_ids):
        raise ValueError(f"start must be in [0, {len(token_ids)}], got {start}")
    tokens = token_ids[start:] if start else token_ids
    return compute_block_hashes_py(tokens, block_size, seed, parent_seq_hash)


def compute_block_and_seq_hashes(
    token_ids: Sequence[int],
    block_size: int,
    seed: int = DEFAULT_HASH_SEED,
    *,
    backend: HashBackend | None = None,
) -> tuple[list[tuple[BlockHash, int]], list[int]]:
    """`compute_block_hashes` of a whole prompt and the list of its sequence hashes, from one
    pass (the simulator hashes a prompt once for the engine and the router)."""
    if _use_native(backend):
        pairs, seqs = _native.hash_blocks(token_ids, block_size, seed, None, 2)
        return pairs, seqs
    pairs = compute_block_hashes_py(token_ids, block_size, seed)
    return pairs, [seq for seq, _ in pairs]


def compute_seq_hashes(
    token_ids: Sequence[int],
    block_size: int,
    seed: int = DEFAULT_HASH_SEED,
    parent_seq_hash: int | None = None,
    *,
    backend: HashBackend | None = None,
) -> list[int]:
    """Only the sequence hashes (what the router indexes) of every full block."""
    if _use_native(backend):
        return _native.hash_blocks(token_ids, block_size, seed, parent_seq_hash, 0)
    return [h for h, _ in compute_block_hashes_py(token_ids, block_size, seed, parent_seq_hash)]


def compute_block_hashes_py(
    token_ids: Sequence[int],
    block_size: int,
    seed: int = DEFAULT_HASH_SEED,
    parent_seq_hash: int | None = None,
) -> list[tuple[BlockHash, int]]:
    """The pure-Python reference for `compute_block_hashes`."""
    out: list[tuple[BlockHash, int]] = []
    parent = parent_seq_hash
    digest = xxhash.xxh3_64_intdigest
    pack = _PAIR.pack
    for local in compute_local_hashes(token_ids, block_size, seed):
        seq = local if parent is None else digest(pack(parent, local), seed)
        out.append((BlockHash(seq), local))
        parent = seq
    return out
