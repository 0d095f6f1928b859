"""Prompt text for load generation, built from a tokenizer's "word" tokens: tokens that are a
space plus 2-8 ASCII letters and re-encode to themselves. A run of such tokens decodes to text
that the tokenizer turns back into exactly those tokens, so a prompt of N synthetic tokens is
N tokens on the server, and requests sharing their first k blocks share exactly those tokens.

    TextSynth(tokenizer).text(n, seed)          n tokens of text, fixed by seed
    TextSynth(...).trace_text(trace_request)    a Mooncake request's prompt: one block of
                                                512 tokens per hash id, equal ids -> equal text
"""

from __future__ import annotations

import random
from typing import Any

from armature.workload.traces import TRACE_BLOCK_TOKENS, TraceRequest

__all__ = ["TextSynth"]


class TextSynth:
    def __init__(self, tokenizer: Any, seed: int = 0):
        self.tokenizer = tokenizer
        self.seed = seed
        vocab: dict[str, int] = tokenizer.get_vocab()
        candidates = sorted(
            i
            for piece, i in vocab.items()
            if piece[:1] in ("Ġ", "▁") and piece[1:].isascii() and piece[1:].isalpha()
            and 2 <= len(piece) - 1 <= 8
        )  # fmt: skip
        self.words = [
            i
            for i in candidates[:20000]
            if tokenizer.encode(tokenizer.decode([i]), add_special_tokens=False) == [i]
        ]
        if len(self.words) < 100:
            raise ValueError("this tokenizer has too few plain word tokens to synthesize text")

    def token_ids(self, num_tokens: int, key: str) -> list[int]:
        rng = random.Random(f"{self.seed}:{key}")
        return [rng.choice(self.words) for _ in range(num_tokens)]

    def decode(self, token_ids: list[int]) -> str:
        return str(self.tokenizer.decode(token_ids))

    def text(self, num_tokens: int, key: str) -> str:
        return self.decode(self.token_ids(num_tokens, key))

    def trace_text(self, request: TraceRequest) -> str:
        ids: list[int] = []
        for hash_id in request.hash_ids:
            ids.extend(self.token_ids(TRACE_BLOCK_TOKENS, f"block:{hash_id}"))
        return self.decode(ids[: request.input_length])

    def count(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False))
