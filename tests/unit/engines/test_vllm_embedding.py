"""The vLLM embedding adapter over a fake AsyncLLM (vLLM's `encode` stream of pooling
outputs): one encode call per prompt, vectors back in prompt order as unit float32 bytes,
load counted while they run, a cancelled request aborted, bad requests and generation
refused."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from armature.engines.api import EngineDeadError, InvalidRequestError
from armature.engines.vllm.embedding import VllmEmbeddingEngine
from armature.protocols.embedding import EmbeddingShape, EmbedRequest, Pooling
from armature.protocols.engine import EngineRequest, SamplingParams


@dataclass
class FakePooled:
    data: list[float]


@dataclass
class FakePoolingOutput:
    outputs: FakePooled
    finished: bool = True


class FakePoolingLlm:
    """`encode` yields one output whose vector is (sum of the prompt, its length, 0, ...),
    once `release` is set."""

    def __init__(self) -> None:
        self.errored = False
        self.calls: list[tuple[list[int], Any, str]] = []
        self.release = asyncio.Event()
        self.cancelled: list[str] = []
        self.shut_down = False

    async def encode(self, prompt: list[int], pooling: Any, request_id: str) -> AsyncIterator[Any]:
        self.calls.append((prompt, pooling, request_id))
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled.append(request_id)
            raise
        yield FakePoolingOutput(FakePooled([float(sum(prompt)), float(len(prompt)), 0.0, 0.0]))

    def shutdown(self) -> None:
        self.shut_down = True


def engine(llm: FakePoolingLlm) -> VllmEmbeddingEngine:
    built = VllmEmbeddingEngine(
        llm,
        EmbeddingShape(num_dimensions=4, pooling=Pooling.MEAN),
        vocab_size=100,
        max_model_len=8,
        make_prompt=lambda ids: ids,
        make_pooling=lambda: "embed",
    )
    built.start()
    return built


async def test_vectors_in_prompt_order_unit_float32() -> None:
    llm = FakePoolingLlm()
    eng = engine(llm)
    task = asyncio.ensure_future(eng.embed(EmbedRequest(request_id="r", prompts=[[3, 4], [5]])))
    while len(llm.calls) < 2:
        await asyncio.sleep(0)
    assert (eng.get_load().num_running, eng.get_load().num_prefill_tokens_queued) == (2, 3)
    llm.release.set()
    result = await task
    assert [c[2] for c in llm.calls] == ["r-0", "r-1"]
    assert [c[1] for c in llm.calls] == ["embed", "embed"]
    vectors = [np.frombuffer(v, dtype="<f4") for v in result.vectors]
    assert np.allclose(vectors[0], np.array([7, 2, 0, 0]) / np.hypot(7, 2))
    assert np.allclose(vectors[1], np.array([5, 1, 0, 0]) / np.hypot(5, 1))
    assert result.num_prompt_tokens == 3
    assert eng.get_load().num_running == 0
    await eng.stop()
    assert llm.shut_down and not eng.is_alive
    with pytest.raises(EngineDeadError):
        await eng.embed(EmbedRequest(request_id="late", prompts=[[1]]))


async def test_cancelling_aborts_every_prompt_in_vllm() -> None:
    llm = FakePoolingLlm()
    eng = engine(llm)
    task = asyncio.ensure_future(eng.embed(EmbedRequest(request_id="c", prompts=[[1], [2]])))
    while len(llm.calls) < 2:
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert sorted(llm.cancelled) == ["c-0", "c-1"]
    assert eng.get_load().num_running == 0


async def test_bad_requests_and_generation_are_refused() -> None:
    eng = engine(FakePoolingLlm())
    with pytest.raises(InvalidRequestError, match="context length is 8"):
        await eng.embed(EmbedRequest(request_id="long", prompts=[[1] * 9]))
    with pytest.raises(InvalidRequestError, match=r"token ids must be in \[0, 100\)"):
        eng.validate_embed(EmbedRequest(request_id="v", prompts=[[100]]))
    request = EngineRequest(
        request_id="g", prompt_token_ids=[1], sampling=SamplingParams(max_tokens=1)
    )
    with pytest.raises(InvalidRequestError, match="computes embeddings"):
        eng.validate(request)
    assert eng.take_kv_events() == [] and eng.take_step_records() == []
