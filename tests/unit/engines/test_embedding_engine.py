"""The native embedding engine against transformers: for each pooling, in float32, every
vector has cosine >= 0.999 with transformers' sentence embedding of the same prompt, whether
prompts run alone or batched across requests (a small token budget splits them over several
forwards). Also: its load while requests wait, cancellation, and what it refuses."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import numpy as np
import pytest

from armature.engines.api import InvalidRequestError
from armature.engines.native.config import NativeEngineConfig
from armature.engines.native.embed_queue import EmbedQueue
from armature.engines.native.embedding_engine import NOT_GENERATING, NativeEmbeddingEngine
from armature.engines.native.embedding_runner import EmbeddingRunner
from armature.protocols.embedding import EmbedRequest, Pooling
from armature.protocols.engine import EngineRequest, SamplingParams
from hf_embeddings import MIN_COSINE, HfEmbeddings, cosine
from polling import wait_until

pytestmark = pytest.mark.slow  # loads the default model twice (ours and transformers')

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hi",
    "Embeddings pool the last hidden states of a decoder model into a single vector, which "
    "retrieval systems compare by cosine similarity.",
    "Paris is the capital of France.",
]


@pytest.fixture(scope="module")
def hf(default_model_dir: Path) -> HfEmbeddings:
    return HfEmbeddings(default_model_dir)


@pytest.fixture(scope="module")
def prompts(default_model_dir: Path) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(default_model_dir))
    return [tokenizer(text)["input_ids"] for text in TEXTS]


def runner(model_dir: Path, pooling: Pooling) -> EmbeddingRunner:
    config = NativeEngineConfig(model_dir=model_dir, dtype="float32", max_model_len=512)
    return EmbeddingRunner(config, pooling)


@pytest.mark.parametrize("pooling", list(Pooling))
async def test_vectors_match_transformers_alone_and_batched(
    pooling: Pooling, default_model_dir: Path, hf: HfEmbeddings, prompts: list[list[int]]
) -> None:
    # a 16-token budget: prompts of 10, 1, 24 and 7 tokens run as [10, 1], [24] (longer than
    # the budget: alone), [7]
    engine = NativeEmbeddingEngine(runner(default_model_dir, pooling), EmbedQueue(16, 8))
    engine.start()
    try:
        alone = [
            await engine.embed(EmbedRequest(request_id=f"a{i}", prompts=[p]))
            for i, p in enumerate(prompts)
        ]
        together = await asyncio.gather(
            engine.embed(EmbedRequest(request_id="b0", prompts=prompts[:2])),
            engine.embed(EmbedRequest(request_id="b1", prompts=prompts[2:])),
        )
        steps = engine.get_load().num_steps
    finally:
        await engine.stop()
    assert [len(p) for p in prompts] == [10, 1, 24, 7]
    assert steps == len(prompts) + 3
    batched = together[0].vectors + together[1].vectors
    assert [r.num_prompt_tokens for r in together] == [
        sum(len(p) for p in prompts[:2]),
        sum(len(p) for p in prompts[2:]),
    ]
    for prompt, one, many in zip(prompts, alone, batched, strict=True):
        reference = hf.embed(prompt, pooling)
        for vector in (np.frombuffer(one.vectors[0], "<f4"), np.frombuffer(many, "<f4")):
            assert vector.shape == (576,)
            assert abs(float(np.linalg.norm(vector)) - 1.0) < 1e-5
            assert cosine(vector, reference) >= MIN_COSINE


async def test_refuses_generation_and_requests_it_cannot_serve(default_model_dir: Path) -> None:
    engine = NativeEmbeddingEngine(runner(default_model_dir, Pooling.LAST), EmbedQueue(64, 4))
    generation = EngineRequest(
        request_id="g", prompt_token_ids=[1], sampling=SamplingParams(max_tokens=1)
    )
    with pytest.raises(InvalidRequestError, match="computes embeddings"):
        engine.validate(generation)
    with pytest.raises(InvalidRequestError, match=re.escape(NOT_GENERATING)):
        async for _ in engine.generate(generation):
            pass
    for prompts, message in [
        ([], "no prompt to embed"),
        ([[1], []], "prompt 1 is empty"),
        ([[1] * 513], "prompt 0 has 513 tokens; the context length is 512"),
        ([[49152]], r"prompt 0: token ids must be in \[0, 49152\)"),
    ]:
        with pytest.raises(InvalidRequestError, match=message):
            engine.validate_embed(EmbedRequest(request_id="x", prompts=prompts))
    assert await engine.dump_kv_blocks() == await engine.dump_kv_blocks()
    assert engine.take_kv_events() == []


async def test_a_cancelled_caller_leaves_no_work_and_load_counts_the_queue(
    default_model_dir: Path,
) -> None:
    engine = NativeEmbeddingEngine(runner(default_model_dir, Pooling.MEAN), EmbedQueue(8, 1))
    engine.start()
    try:
        long = [[5] * 8 for _ in range(40)]  # 40 forwards of one prompt each
        task = asyncio.create_task(engine.embed(EmbedRequest(request_id="c", prompts=long)))
        await wait_until(
            lambda: engine.get_load().num_prefill_tokens_queued > 0, "the request queued"
        )
        load = engine.get_load()
        assert load.num_running + load.num_waiting == 1
        assert 0 < load.num_prefill_tokens_queued <= 40 * 8
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(200):  # the batch computing when it left finishes, then nothing
            if engine.get_load().num_running == 0:
                break
            await asyncio.sleep(0.01)
        load = engine.get_load()
        assert (load.num_running, load.num_waiting, load.num_prefill_tokens_queued) == (0, 0, 0)
        records = engine.take_step_records()
        assert records and all(r.num_scheduled_prefill_tokens == 8 for r in records)
        assert len(records) < 40
    finally:
        await engine.stop()
    assert not engine.is_alive
