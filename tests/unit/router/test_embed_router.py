"""The embedding router: the least-loaded pick, the legs a request is cut into, load released
on every path (success, refusal, a dead worker retried elsewhere, cancellation), and a pool
that refuses workers returning other vectors."""

from __future__ import annotations

import asyncio

import pytest

from armature.engines.api import EngineDeadError, InvalidRequestError
from armature.protocols.embedding import EmbeddingShape, EmbedRequest, EmbedResult, Pooling
from armature.protocols.engine import EngineLoad
from armature.router.embed_policy import pick_embed_worker, split_prompts
from armature.router.embedding import EmbedRouter

SHAPE = EmbeddingShape(num_dimensions=4, pooling=Pooling.LAST)


class FakeEmbedder:
    """Answers with one 4-byte vector per prompt after `gate` opens; or fails as told."""

    def __init__(self, queued_tokens: int = 0, shape: EmbeddingShape = SHAPE) -> None:
        self.is_alive = True
        self.started = self.stopped = False
        self.queued_tokens = queued_tokens
        self.embedding_shape = shape
        self.fail: BaseException | None = None
        self.gate = asyncio.Event()
        self.gate.set()
        self.seen: list[str] = []

    def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.stopped = True

    def get_load(self) -> EngineLoad:
        return EngineLoad(
            num_active_blocks=0,
            num_total_blocks=0,
            num_waiting=0,
            num_running=0,
            num_prefill_tokens_queued=self.queued_tokens,
        )

    def validate_embed(self, request: EmbedRequest) -> None:
        if any(len(p) > 100 for p in request.prompts):
            raise InvalidRequestError("too long")

    async def embed(self, request: EmbedRequest) -> EmbedResult:
        self.seen.append(request.request_id)
        await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        return EmbedResult(
            request_id=request.request_id,
            vectors=[bytes(4)] * len(request.prompts),
            num_prompt_tokens=sum(len(p) for p in request.prompts),
        )


def req(request_id: str, *lengths: int) -> EmbedRequest:
    return EmbedRequest(request_id=request_id, prompts=[[1] * n for n in lengths])


def test_pick_prefers_least_in_flight_then_least_queued_then_name() -> None:
    assert pick_embed_worker({"b": 5, "a": 9}, {}) == "b"
    assert pick_embed_worker({"b": 0, "a": 0}, {"a": 3, "b": 1}) == "b"
    assert pick_embed_worker({"b": 0, "a": 0}, {}) == "a"


def test_split_prompts_cuts_legs_by_count_and_tokens_in_order() -> None:
    prompts = [[1] * n for n in (3, 3, 3, 9, 1)]
    legs = split_prompts(prompts, max_prompts=2, max_tokens=6)
    assert [[len(p) for p in leg] for leg in legs] == [[3, 3], [3], [9], [1]]
    assert split_prompts([], max_prompts=2, max_tokens=6) == []


async def test_requests_spread_by_tokens_in_flight_and_release_their_load() -> None:
    a, b = FakeEmbedder(), FakeEmbedder()
    router = EmbedRouter({"a": a, "b": b})
    router.start()
    assert a.started and b.started
    a.gate.clear()
    b.gate.clear()
    first = asyncio.create_task(router.embed(req("r1", 10)))
    await asyncio.sleep(0)
    assert router.get_in_flight_tokens() == {"a": 10}
    second = asyncio.create_task(router.embed(req("r2", 3)))
    await asyncio.sleep(0)
    assert router.get_in_flight_tokens() == {"a": 10, "b": 3}
    b.gate.set()
    assert (await second).num_prompt_tokens == 3
    assert router.get_in_flight_tokens() == {"a": 10}
    first.cancel()  # the caller left: its load goes too
    with pytest.raises(asyncio.CancelledError):
        await first
    assert router.get_in_flight_tokens() == {}
    assert (a.seen, b.seen) == (["r1"], ["r2"])


async def test_a_dead_worker_is_skipped_and_the_request_retried_on_another() -> None:
    a, b = FakeEmbedder(), FakeEmbedder(queued_tokens=50)
    a.fail = EngineDeadError("a crashed")
    router = EmbedRouter({"a": a, "b": b})
    result = await router.embed(req("r", 2, 2))
    assert result.vectors == [bytes(4), bytes(4)]
    assert (a.seen, b.seen) == (["r"], ["r"])
    assert router.get_in_flight_tokens() == {}
    b.fail = EngineDeadError("b crashed")
    with pytest.raises(EngineDeadError, match="no embedding worker is serving"):
        await router.embed(req("s", 1))
    assert router.get_in_flight_tokens() == {}


async def test_a_refusal_is_not_retried() -> None:
    a, b = FakeEmbedder(), FakeEmbedder()
    a.fail = InvalidRequestError("bad ids")
    router = EmbedRouter({"a": a, "b": b})
    with pytest.raises(InvalidRequestError):
        await router.embed(req("r", 1))
    assert (a.seen, b.seen) == (["r"], [])
    assert router.get_in_flight_tokens() == {}


async def test_the_pool_refuses_other_vectors_and_forgets_its_shape_when_empty() -> None:
    router = EmbedRouter()
    assert router.shape is None
    router.add_engine("a", FakeEmbedder())
    other = FakeEmbedder(shape=EmbeddingShape(num_dimensions=4, pooling=Pooling.MEAN))
    with pytest.raises(ValueError, match="pooled by mean; the pool returns 4-dimensional"):
        router.add_engine("b", other)
    with pytest.raises(ValueError, match="already routed to"):
        router.add_engine("a", FakeEmbedder())
    await router.remove_engine("a")
    assert router.shape is None and router.engines == {}
    router.add_engine("b", other)
    assert router.shape == other.embedding_shape
