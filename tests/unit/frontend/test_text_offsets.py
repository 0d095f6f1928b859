"""A completion's `text_offset`s index into the text it returns, streamed or not: a special
token in the output adds no characters (it is not in the text), a character split over
tokens is counted once, and an echoed text prompt's tokens sit where they are in the prompt
as sent (a special token written in it included)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from frontend_fakes import ScriptedEngine, one_engine_frontend, openai_client

from armature.frontend.preprocess import Preprocessor
from armature.frontend.text_offsets import prompt_offsets

CHAT_PROMPT = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
JAPANESE_PROMPT = "Translate to Japanese: Hello -> こんにちは\nThank you ->"
# a special token mid-output (skipped in the text), then characters split over tokens
OUTPUT = " Sure.<|im_end|> おくだけ é done"


@pytest.fixture(scope="module")
def smol(default_model_dir: Path) -> Preprocessor:
    return Preprocessor(default_model_dir)


def check_offsets(smol: Preprocessor, text: str, offsets: list[int], tokens: list[str]) -> None:
    """Every offset within the text, in order; a token of whole characters found at its
    offset; a special token adds nothing."""
    assert offsets == sorted(offsets) and offsets[-1] <= len(text)
    for offset, token in zip(offsets, tokens, strict=True):
        if token in smol.tokenizer.all_special_tokens or "\ufffd" in token:
            continue
        assert text.startswith(token, offset), (offset, token)


async def completion(
    smol: Preprocessor, prompt: str, *, echo: bool, stream: bool
) -> tuple[str, list[int], list[str]]:
    """The choice's text, offsets and tokens."""
    engine = ScriptedEngine(smol)
    engine.outputs = [OUTPUT]
    client = openai_client(one_engine_frontend(engine))
    fields: Any = {"model": "m", "prompt": prompt, "logprobs": 0, "echo": echo}
    if not stream:
        choice = (await client.completions.create(**fields)).choices[0]
        assert choice.logprobs is not None
        return choice.text, choice.logprobs.text_offset or [], choice.logprobs.tokens or []
    text, offsets, tokens = "", list[int](), list[str]()
    async for chunk in await client.completions.create(**fields, stream=True):
        for choice in chunk.choices:
            text += choice.text
            if choice.logprobs is not None:
                offsets += choice.logprobs.text_offset or []
                tokens += choice.logprobs.tokens or []
    return text, offsets, tokens


@pytest.mark.parametrize("prompt", [CHAT_PROMPT, JAPANESE_PROMPT])
@pytest.mark.parametrize("echo", [False, True])
async def test_offsets_index_into_the_returned_text(
    smol: Preprocessor, prompt: str, echo: bool
) -> None:
    text, offsets, tokens = await completion(smol, prompt, echo=echo, stream=False)
    # the same request streamed: the same text, tokens and offsets
    assert await completion(smol, prompt, echo=echo, stream=True) == (text, offsets, tokens)
    assert "<|im_end|>" not in text.removeprefix(prompt)
    check_offsets(smol, text, offsets, tokens)
    if echo:  # the output's first token starts where the prompt ends
        assert offsets[len(smol.encode(prompt))] == len(prompt)


def test_an_echoed_prompt_of_token_ids_is_offset_by_its_decoded_text(smol: Preprocessor) -> None:
    ids = smol.encode(JAPANESE_PROMPT)
    offsets = prompt_offsets(smol.tokenizer, smol.decoder, ids, ids)
    text = smol.decode(ids)
    assert len(offsets) == len(ids) and offsets == sorted(offsets) and offsets[-1] < len(text)
    whole = [i for i, t in enumerate(ids) if "\ufffd" not in smol.token_text(t)]
    for i in whole:
        assert text.startswith(smol.token_text(ids[i]), offsets[i])
    # the text prompt's own spans: <|im_start|> covers its 12 characters
    spans = prompt_offsets(smol.tokenizer, smol.decoder, CHAT_PROMPT, smol.encode(CHAT_PROMPT))
    assert spans[:3] == [0, 12, 16]
