from array import array
from collections.abc import Sequence

def prompt_tokens(
    seed: int,
    hash_ids: Sequence[int],
    num_tokens: int,
    block_tokens: int,
    low: int,
    span: int,
    ints: tuple[int, ...] = ...,
) -> list[int]: ...
def prompt_token_ids_into(
    out: array[int],
    seed: int,
    hash_ids: Sequence[int],
    num_tokens: int,
    block_tokens: int,
    low: int,
    span: int,
) -> None: ...
