"""RouteGroup: the members of a group (the choices of n > 1) follow the first to its worker,
whatever the policy would pick, and find its prompt in that worker's prefix cache; a dead
group worker sends them back to the policy."""

from __future__ import annotations

import asyncio
from pathlib import Path

from armature.config import RouterConfig
from armature.engines.native.async_engine import AsyncEngine
from armature.engines.native.config import NativeEngineConfig
from armature.engines.native.core import EngineCore
from armature.protocols.engine import EngineOutput, EngineRequest, SamplingParams
from armature.router.service import EngineRouter, RouteGroup, RouterObserver
from idle_engine import HeldEngine

PROMPT = list(range(3, 3 + 50))  # 3 full blocks of 16 and 2 tokens


class Decisions(RouterObserver):
    def __init__(self) -> None:
        self.made: list[tuple[str, int]] = []

    def decision(self, worker: str, overlap_blocks: int, latency_s: float) -> None:
        self.made.append((worker, overlap_blocks))


def request(request_id: str) -> EngineRequest:
    sampling = SamplingParams(max_tokens=3, temperature=0.0)
    return EngineRequest(request_id=request_id, prompt_token_ids=PROMPT, sampling=sampling)


async def run(router: EngineRouter, req: EngineRequest, group: RouteGroup) -> EngineOutput:
    """The request's first output (prompt and cached counts), after running it to the end."""
    outputs = [o async for o in router.generate(req, group=group)]
    return outputs[0]


def engines(model_dir: Path) -> dict[str, AsyncEngine]:
    config = NativeEngineConfig(model_dir=model_dir, dtype="float32", num_kv_blocks=64)
    return {name: AsyncEngine(EngineCore(config)) for name in "ab"}


def round_robin(workers: dict[str, AsyncEngine], observer: Decisions) -> EngineRouter:
    router = EngineRouter(workers, RouterConfig(policy="round-robin"), observer)  # type: ignore[arg-type]
    router.start()
    return router


async def test_members_follow_the_first_and_hit_its_prompt(tiny_llama_dir: Path) -> None:
    observer = Decisions()
    workers = engines(tiny_llama_dir)
    router = round_robin(workers, observer)
    try:
        group = RouteGroup()
        first = await run(router, request("r-0"), group)
        assert group.worker == observer.made[0][0]
        others = [await run(router, request(f"r-{i}"), group) for i in (1, 2)]
        # round-robin alone would have alternated; the group kept them on one worker, which
        # the router counts as holding every full block but the last token's
        assert observer.made == [(group.worker, 0), (group.worker, 3), (group.worker, 3)]
        assert first.num_cached_tokens == 0
        assert [o.num_cached_tokens for o in others] == [48, 48]
        # outside the group, the policy decides again
        await run(router, request("solo"), RouteGroup())
        assert observer.made[-1][0] != group.worker
    finally:
        await router.stop()


async def test_a_dead_group_worker_sends_members_back_to_the_policy(tiny_llama_dir: Path) -> None:
    observer = Decisions()
    workers = engines(tiny_llama_dir)
    router = round_robin(workers, observer)
    try:
        group = RouteGroup()
        await run(router, request("r-0"), group)
        gone = group.worker
        assert gone is not None
        await router.remove_engine(gone)
        second = await run(router, request("r-1"), group)
        [other] = [w for w in workers if w != gone]
        assert group.worker == other
        assert observer.made[-1] == (other, 0)
        assert second.num_cached_tokens == 0  # its prompt is computed anew there
    finally:
        await router.stop()


async def test_a_resumed_leg_counts_its_carried_output_as_prefill(tiny_llama_dir: Path) -> None:
    """A migrated request recomputes its prompt and the tokens it carries: the router counts
    them all as the worker's prefill until its first output (it counted the prompt only)."""
    held = HeldEngine(engines(tiny_llama_dir)["a"])
    router = EngineRouter({"a": held}, RouterConfig(policy="round-robin"))  # type: ignore[dict-item]
    router.start()
    try:
        carried = EngineRequest(
            request_id="m",
            prompt_token_ids=PROMPT,
            output_token_ids=[7] * 30,
            sampling=SamplingParams(max_tokens=3, temperature=0.0),
        )
        stream = router.generate(carried)
        started = asyncio.ensure_future(anext(stream))  # type: ignore[arg-type]
        await asyncio.wait_for(held.asked.wait(), 30)
        load = router.load.get("a")
        assert (load.active_prefill_tokens, load.active_blocks) == (80, 5)  # 50 + 30; 80 / 16
        started.cancel()
        await asyncio.gather(started, return_exceptions=True)
        await stream.aclose()  # type: ignore[attr-defined]
    finally:
        await router.stop()


async def test_scored_members_count_no_cached_prefix(tiny_llama_dir: Path) -> None:
    """Members that want their prompt's logprobs compute all of it where they follow: the
    router counted the first's prompt as cached there (its load, and the prefix hits it
    reports, over-stated)."""
    observer = Decisions()
    workers = engines(tiny_llama_dir)
    router = round_robin(workers, observer)
    sampling = SamplingParams(max_tokens=3, temperature=0.0, prompt_logprobs=0)
    try:
        group = RouteGroup()
        outputs = [
            await run(
                router,
                EngineRequest(request_id=f"s-{i}", prompt_token_ids=PROMPT, sampling=sampling),
                group,
            )
            for i in range(3)
        ]
        assert observer.made == [(group.worker, 0)] * 3
        assert [o.num_cached_tokens for o in outputs] == [0, 0, 0]
        assert all(o.prompt_logprobs is not None for o in outputs)
    finally:
        await router.stop()


def test_a_resumed_scored_leg_hits_the_cache() -> None:
    """A migrated leg of a scored request carries its output so far: the first leg gave the
    prompt's logprobs, and this one is served from the cache like any other."""
    sampling = SamplingParams(max_tokens=3, prompt_logprobs=0)
    first = EngineRequest(request_id="s", prompt_token_ids=PROMPT, sampling=sampling)
    resumed = EngineRequest(
        request_id="s", prompt_token_ids=PROMPT, sampling=sampling, output_token_ids=[7]
    )
    assert first.computes_whole_prompt and not resumed.computes_whole_prompt
    assert not request("plain").computes_whole_prompt
