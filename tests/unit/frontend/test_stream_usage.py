"""Usage counts what a stream returned: an engine output that merged several steps and runs
past a stop string counts the tokens up to the stop, not the ones after it."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from pathlib import Path

import pytest
from frontend_fakes import IdleEngine
from tokenizers import Tokenizer

from armature.frontend.detokenizer import IncrementalDetokenizer
from armature.frontend.generation import Usage, delta_batches
from armature.frontend.metrics import FrontendMetrics
from armature.protocols.engine import EngineOutput, FinishReason

HELLO_IDS = [19556, 905, 17, 1073, 359, 346, 47]  # 'Hello' ' world' '!' ' How' ' are' ' you' '?'


async def outputs(*batches: list[int]) -> AsyncGenerator[EngineOutput, None]:
    for i, tokens in enumerate(batches):
        last = i == len(batches) - 1
        yield EngineOutput(
            request_id="r",
            new_token_ids=tokens,
            finish_reason=FinishReason.LENGTH if last else None,
            num_prompt_tokens=3 if i == 0 else 0,
        )


async def run(
    tokenizer: Tokenizer, stop: list[str], *batches: list[int]
) -> tuple[str, Usage, float | None]:
    detokenizer = IncrementalDetokenizer(tokenizer, [1, 2, 3], stop=stop)
    metrics = FrontendMetrics("m", IdleEngine().get_load)
    usage = Usage()
    deltas = delta_batches(outputs(*batches), 3, detokenizer, usage, metrics)
    text = "".join([d.text async for batch in deltas for d in batch])
    return text, usage, metrics.registry.get_sample_value("armature_generation_tokens_total")


@pytest.fixture
def tokenizer(default_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(default_model_dir / "tokenizer.json"))


async def test_a_merged_output_past_a_stop_string_counts_up_to_the_stop(
    tokenizer: Tokenizer,
) -> None:
    # 'Hello' alone, then ' world' '!' ' How' ' are' ' you' merged: " How" stops at its 3rd
    text, usage, counted = await run(tokenizer, [" How"], HELLO_IDS[:1], HELLO_IDS[1:6])
    assert text == "Hello world!"
    assert (usage.prompt_tokens, usage.completion_tokens, counted) == (3, 4, 4.0)


async def test_without_a_stop_every_token_counts(tokenizer: Tokenizer) -> None:
    text, usage, counted = await run(tokenizer, [], HELLO_IDS[:1], HELLO_IDS[1:6], HELLO_IDS[6:])
    assert text == "Hello world! How are you?"
    assert (usage.completion_tokens, counted) == (7, 7.0)
