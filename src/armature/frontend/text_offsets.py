"""Where each token of a completion's logprobs starts in the text returned (OpenAI's
`text_offset`): character offsets into the echoed prompt, then into the output.

A prompt sent as text is echoed as sent: its tokens' offsets are the tokenizer's own spans
of that text (a special token written in it, `<|im_start|>`, spans its characters; one the
tokenizer adds, a BOS, starts at 0). A prompt of token ids is echoed decoded: each token
starts where the text decoded before it ends (a token that ends inside a multi-byte
character shares its offset with the token that completes it). Output tokens start where
the text streamed before them ends, as the service counts it."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from armature.frontend.detokenizer import IncrementalDetokenizer

__all__ = ["prompt_offsets"]


def prompt_offsets(
    tokenizer: Any, decoder: Any, prompt: str | Sequence[int], prompt_ids: Sequence[int]
) -> list[int]:
    """Each of `prompt_ids`' offsets into the echoed prompt: `prompt`'s text as sent, or the
    decoded token ids. `tokenizer`: a transformers fast tokenizer (the text's spans);
    `decoder`: the ids' decoder (detokenizer.TokenDecoder)."""
    if isinstance(prompt, str):
        encoded = tokenizer(prompt, return_offsets_mapping=True)
        if list(encoded["input_ids"]) == list(prompt_ids):
            return [start for start, _ in encoded["offset_mapping"]]
        # ids that are not the text's tokenization (never for our encoders): by decoding,
        # within the text
        return [min(o, len(prompt)) for o in _decoded_offsets(decoder, prompt_ids)]
    return _decoded_offsets(decoder, prompt_ids)


def _decoded_offsets(decoder: Any, token_ids: Sequence[int]) -> list[int]:
    if not token_ids:
        return []
    texts, _ = IncrementalDetokenizer(decoder, ()).update_each(token_ids)
    return [0, *itertools.accumulate(len(t) for t in texts[:-1])]
