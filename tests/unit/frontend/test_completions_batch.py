"""A batch of prompts in one /v1/completions request (a list of texts or of token id lists), as
OpenAI's and vLLM's take it: choice i x n + j is prompt i's j-th, whole and streamed (one
[DONE], one usage chunk summing every prompt's), with echo, best_of per prompt, and the
bounds on what one request may run."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import openai
import pytest
from frontend_fakes import ScriptedEngine, one_engine_frontend, openai_client

from armature.frontend.preprocess import Preprocessor
from armature.protocols.engine import EngineOutput, EngineRequest

pytestmark = pytest.mark.slow  # loads the default model's tokenizer

PROMPTS = ["The capital of France is", "Two plus two is", "Water boils at"]
REPLIES = {PROMPTS[0]: " Paris.", PROMPTS[1]: " four, always.", PROMPTS[2]: " 100 C at sea level."}


class ReplyingEngine(ScriptedEngine):
    """Answers each prompt with its own reply (prompts of a batch run at once, in any order)."""

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        prompt = self.preprocessor.decode(request.prompt_token_ids)
        self.outputs.insert(0, REPLIES[prompt])  # taken before the first output, no await between
        async for output in super().generate(request):
            yield output


@pytest.fixture(scope="module")
def preprocessor(default_model_dir: Path) -> Preprocessor:
    return Preprocessor(default_model_dir)


def serve(preprocessor: Preprocessor) -> tuple[ReplyingEngine, openai.AsyncOpenAI]:
    engine = ReplyingEngine(preprocessor)
    return engine, openai_client(one_engine_frontend(engine))


def num_tokens(preprocessor: Preprocessor, text: str) -> int:
    return len(preprocessor.encode(text, add_special_tokens=False))


async def test_a_batch_gives_each_prompt_its_choices_whole_and_streamed(
    preprocessor: Preprocessor,
) -> None:
    engine, client = serve(preprocessor)
    whole = await client.completions.create(model="m", prompt=PROMPTS, n=2, max_tokens=32)
    assert [(c.index, c.text, c.finish_reason) for c in whole.choices] == [
        (i * 2 + j, REPLIES[p], "stop") for i, p in enumerate(PROMPTS) for j in range(2)
    ]
    assert whole.usage is not None
    prompt_tokens = sum(len(preprocessor.encode(p)) for p in PROMPTS)  # each prompt once
    assert whole.usage.prompt_tokens == prompt_tokens
    assert whole.usage.completion_tokens == 2 * sum(
        num_tokens(preprocessor, r) for r in REPLIES.values()
    )
    assert len(engine.requests) == 6
    assert len({r.request_id for r in engine.requests}) == 6
    stream = await client.completions.create(
        model="m",
        prompt=PROMPTS,
        n=2,
        max_tokens=32,
        stream=True,
        stream_options={"include_usage": True},
    )
    texts: dict[int, str] = {}
    usages = []
    ids = set()
    async for chunk in stream:
        ids.add(chunk.id)
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
        if chunk.usage is not None:
            usages.append(chunk.usage)
    assert texts == {i * 2 + j: REPLIES[p] for i, p in enumerate(PROMPTS) for j in range(2)}
    assert len(ids) == 1  # one response
    [usage] = usages  # one usage chunk, the batch's
    assert (usage.prompt_tokens, usage.completion_tokens) == (
        whole.usage.prompt_tokens,
        whole.usage.completion_tokens,
    )


async def test_a_batch_of_token_id_prompts_with_echo(preprocessor: Preprocessor) -> None:
    engine, client = serve(preprocessor)
    ids = [preprocessor.encode(p, add_special_tokens=False) for p in PROMPTS[:2]]
    whole = await client.completions.create(model="m", prompt=ids, echo=True, max_tokens=32)
    assert [c.text for c in whole.choices] == [p + REPLIES[p] for p in PROMPTS[:2]]
    assert engine.prompts == ids or engine.prompts == ids[::-1]


async def test_best_of_chooses_within_each_prompt(preprocessor: Preprocessor) -> None:
    engine, client = serve(preprocessor)
    whole = await client.completions.create(
        model="m", prompt=PROMPTS[:2], n=1, best_of=3, max_tokens=32
    )
    assert [(c.index, c.text) for c in whole.choices] == [
        (0, REPLIES[PROMPTS[0]]),
        (1, REPLIES[PROMPTS[1]]),
    ]
    assert len(engine.requests) == 6


async def test_a_batch_past_the_bounds_is_a_400_naming_prompt(preprocessor: Preprocessor) -> None:
    engine, client = serve(preprocessor)
    cases = [
        {"prompt": ["x"] * 129},  # prompts
        {"prompt": PROMPTS[:2], "n": 65},  # sequences: 130
        {"prompt": [PROMPTS[0], ""]},  # an empty prompt of the batch
    ]
    for fields in cases:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.completions.create(model="m", max_tokens=4, **fields)  # type: ignore[call-overload]
        assert caught.value.body["param"] == "prompt", fields  # type: ignore[index]
    assert engine.requests == []


async def test_a_batch_scored_with_echo_and_no_tokens(preprocessor: Preprocessor) -> None:
    """How evaluation harnesses score several texts at once: each prompt alone, its tokens'
    logprobs, no completion token."""
    _, client = serve(preprocessor)
    whole = await client.completions.create(
        model="m", prompt=PROMPTS[:2], echo=True, logprobs=0, max_tokens=0
    )
    for choice, prompt in zip(whole.choices, PROMPTS[:2], strict=True):
        assert (choice.text, choice.finish_reason) == (prompt, "length")
        assert choice.logprobs is not None and choice.logprobs.tokens is not None
        ids = preprocessor.encode(prompt)
        assert choice.logprobs.tokens == [preprocessor.token_text(t) for t in ids]
        assert choice.logprobs.token_logprobs is not None
        assert choice.logprobs.token_logprobs[0] is None
    assert whole.usage is not None and whole.usage.completion_tokens == 0
