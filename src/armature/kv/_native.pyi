from collections.abc import Sequence
from typing import Literal, overload

from armature.kv.hashing import BlockHash

@overload
def hash_blocks(
    token_ids: Sequence[int],
    block_size: int,
    seed: int,
    parent: int | None,
    with_local: Literal[1],
    start: int = 0,
) -> list[tuple[BlockHash, int]]: ...
@overload
def hash_blocks(
    token_ids: Sequence[int],
    block_size: int,
    seed: int,
    parent: int | None,
    with_local: Literal[0],
    start: int = 0,
) -> list[int]: ...
@overload
def hash_blocks(
    token_ids: Sequence[int],
    block_size: int,
    seed: int,
    parent: int | None,
    with_local: Literal[2],
    start: int = 0,
) -> tuple[list[tuple[BlockHash, int]], list[int]]: ...
def xxh3_64(data: bytes, seed: int) -> int: ...
def token_id_range(token_ids: Sequence[int]) -> tuple[int, int] | None: ...
def mock_tokens(prefix: bytes, start: int, stop: int, seed: int, vocab_size: int) -> list[int]: ...
