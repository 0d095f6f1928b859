"""Request migration: when a worker dies mid-stream, the router re-issues the request to
another worker with the tokens so far; the caller sees one stream whose greedy tokens equal
an uninterrupted run (float32 tiny model, transformers' near-tie rule), prompt usage is
reported once, and the migration limit ends it with a clear error."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import msgspec
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engines"))
from hf_reference import HfReference
from test_hf_equivalence import check_all, prompts_of

from armature.config import RouterConfig
from armature.engines.api import EngineDeadError
from armature.engines.native.async_engine import AsyncEngine
from armature.engines.native.config import NativeEngineConfig
from armature.engines.native.core import EngineCore
from armature.protocols.engine import EngineOutput, EngineRequest, SamplingParams
from armature.router.pressure import WorkerPressure
from armature.router.service import EngineRouter, RouterObserver

NEW_TOKENS = 12


class DiesAfter:
    """An engine that serves through a real AsyncEngine but dies mid-stream once it has sent
    `num_tokens` tokens of an unfinished request (a crashed worker, as the frontend sees it)."""

    def __init__(self, inner: AsyncEngine, num_tokens: int):
        self.inner = inner
        self.num_tokens = num_tokens
        self.dead = False

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    @property
    def is_alive(self) -> bool:
        return not self.dead and self.inner.is_alive

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        if self.dead:
            raise EngineDeadError("gone")
        count = 0
        stream = self.inner.generate(request)
        try:
            async for output in stream:
                # The engine merges outputs that queue up while the consumer is busy, so one
                # output can carry several tokens: send exactly `num_tokens`, then die.
                left = self.num_tokens - count
                if len(output.new_token_ids) >= left and (
                    output.finish_reason is None or len(output.new_token_ids) > left
                ):
                    ids = output.new_token_ids[:left]
                    yield msgspec.structs.replace(output, new_token_ids=ids, finish_reason=None)
                    self.dead = True
                    raise EngineDeadError("worker killed")
                yield output
                count += len(output.new_token_ids)
        finally:
            await stream.aclose()  # type: ignore[attr-defined]


class Counting(RouterObserver):
    def __init__(self) -> None:
        self.migrations = 0

    def migration(self) -> None:
        self.migrations += 1


def real(model_dir: Path) -> AsyncEngine:
    config = NativeEngineConfig(model_dir=model_dir, dtype="float32", num_kv_blocks=128)
    return AsyncEngine(EngineCore(config))


def request(prompt: list[int]) -> EngineRequest:
    sampling = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, min_tokens=NEW_TOKENS)
    return EngineRequest(request_id="r", prompt_token_ids=prompt, sampling=sampling)


async def collect(router: EngineRouter, req: EngineRequest) -> tuple[list[int], int]:
    tokens, prompt_tokens = [], 0
    async for output in router.generate(req):
        tokens.extend(output.new_token_ids)
        prompt_tokens += output.num_prompt_tokens
    return tokens, prompt_tokens


async def test_a_request_migrates_and_matches_an_uninterrupted_run(tiny_llama_dir: Path) -> None:
    ref = HfReference(tiny_llama_dir)
    engines = {n: DiesAfter(real(tiny_llama_dir), 4) for n in "abc"}
    observer = Counting()
    router = EngineRouter(engines, RouterConfig(policy="round-robin"), observer)  # type: ignore[arg-type]
    router.start()
    try:
        prompt = prompts_of([40], 512, seed=31)[0]
        tokens, prompt_tokens = await collect(router, request(prompt))
        check_all(ref, [prompt], [tokens])  # 4 tokens on one, 4 on the next, the rest on the last
        assert observer.migrations == 2 and prompt_tokens == len(prompt)
        for name in "abc":
            core = engines[name].inner.core
            assert core.pool.get_num_active_blocks() == 0
            core.pool.check_integrity()
    finally:
        await router.stop()


async def test_the_migration_limit_ends_the_request(tiny_llama_dir: Path) -> None:
    engines = {n: DiesAfter(real(tiny_llama_dir), 2) for n in "ab"}
    config = RouterConfig(policy="round-robin", migration_limit=1)
    router = EngineRouter(engines, config)  # type: ignore[arg-type]
    router.start()
    try:
        with pytest.raises(EngineDeadError, match="migrated 1 times, the limit"):
            await collect(router, request(list(range(3, 30))))
    finally:
        await router.stop()


class Decisions(RouterObserver):
    def __init__(self) -> None:
        self.workers: list[str] = []

    def decision(self, worker: str, overlap_blocks: int, latency_s: float) -> None:
        self.workers.append(worker)


async def test_busy_workers_are_avoided_while_another_has_room(tiny_llama_dir: Path) -> None:
    """Overload control marks workers busy; routing sends to the others, whatever the policy
    prefers, and falls back to every worker when all are busy."""
    engines = {n: real(tiny_llama_dir) for n in "abc"}
    observer = Decisions()
    busy = {"a", "b"}

    class ByName:
        def get_busy_workers(self, pressures: Mapping[str, WorkerPressure]) -> set[str]:
            assert set(pressures) == {"a", "b", "c"}  # every live worker is weighed
            return busy & set(pressures)

    config = RouterConfig(policy="round-robin")
    router = EngineRouter(engines, config, observer, busy=ByName())  # type: ignore[arg-type]
    sampling = request([]).sampling
    router.start()
    try:
        for i in range(6):
            if i == 3:
                busy = {"a", "b", "c"}
            prompt = list(range(3 + i, 30))
            req = EngineRequest(request_id=f"r{i}", prompt_token_ids=prompt, sampling=sampling)
            await collect(router, req)
        assert observer.workers[:3] == ["c", "c", "c"]
        assert sorted(observer.workers[3:]) == ["a", "b", "c"]
    finally:
        await router.stop()


async def test_the_router_drains_each_workers_step_records(tiny_llama_dir: Path) -> None:
    """What each engine step did reaches the router by worker (the planner's input): the
    worker that served a prompt reports its prefill, the idle one reports nothing."""
    engines = {n: real(tiny_llama_dir) for n in "ab"}
    router = EngineRouter(engines, RouterConfig(policy="round-robin"))  # type: ignore[arg-type]
    router.start()
    try:
        prompt = list(range(3, 30))
        await collect(router, request(prompt))
        records = router.take_step_records()
        assert list(records) == ["a"]
        steps = records["a"]
        assert steps[0].num_scheduled_prefill_tokens == len(prompt)
        assert sum(s.num_scheduled_prefill_tokens for s in steps) == len(prompt)
        assert [s.num_decode_requests for s in steps[1:]] == [1] * (NEW_TOKENS - 1)
        assert router.take_step_records() == {}  # drained
    finally:
        await router.stop()
