"""The router's capacity: its prefix index holds at most MAX_WORKERS workers (one more is
refused with a clear error before it is started, the router left as it was); a request goes
only to workers whose KV cache holds it."""

from __future__ import annotations

from pathlib import Path

import pytest

from armature.config import RouterConfig
from armature.engines.api import InvalidRequestError
from armature.engines.native.async_engine import AsyncEngine
from armature.engines.native.config import NativeEngineConfig
from armature.protocols.engine import EngineRequest, SamplingParams
from armature.router.prefix_index import MAX_WORKERS
from armature.router.service import EngineRouter, RouterObserver
from armature.sim.mocker import build_mocker_core
from armature.sim.timing import PolynomialTiming
from idle_engine import IdleEngine


def test_a_full_router_refuses_a_worker_before_starting_it() -> None:
    router = EngineRouter({}, RouterConfig())
    for i in range(MAX_WORKERS):
        router.add_engine(f"w{i}", IdleEngine())  # type: ignore[arg-type]
    extra = IdleEngine()
    try:
        router.add_engine("one-too-many", extra)  # type: ignore[arg-type]
    except ValueError as exc:
        assert str(exc) == "the router's prefix index holds at most 4,096 workers"
    else:
        raise AssertionError("the router took a worker past its index's room")
    assert extra.num_starts == 0
    assert "one-too-many" not in router.engines
    assert len(router.engines) == len(router.index.get_workers()) == MAX_WORKERS


async def test_requests_go_only_to_workers_whose_kv_cache_holds_them(
    tiny_llama_dir: Path,
) -> None:
    """Workers of one model with KV caches of different sizes: a request is valid when the
    largest holds it, and is routed only to workers that hold it (it was checked against the
    first worker, a 400 for what another could serve, and the kv router sent it to a worker
    that refused it)."""

    def mocker(num_blocks: int) -> AsyncEngine:
        config = NativeEngineConfig(
            model_dir=tiny_llama_dir, block_size=4, num_kv_blocks=num_blocks
        )
        return AsyncEngine(build_mocker_core(config, timing=PolynomialTiming(speedup_ratio=100.0)))

    class Decisions(RouterObserver):
        def __init__(self) -> None:
            self.workers: list[str] = []

        def decision(self, worker: str, overlap_blocks: int, latency_s: float) -> None:
            self.workers.append(worker)

    observed = Decisions()
    engines = {"small": mocker(4), "large": mocker(64)}  # 16 and 256 tokens
    router = EngineRouter(
        engines,  # type: ignore[arg-type]
        RouterConfig(policy="kv", block_size_tokens=4),
        observer=observed,
    )
    router.start()
    try:

        def request(rid: str, num_prompt: int, max_tokens: int) -> EngineRequest:
            sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
            return EngineRequest(
                request_id=rid, prompt_token_ids=list(range(3, 3 + num_prompt)), sampling=sampling
            )

        for i in range(6):
            big = request(f"big{i}", 20, 5)  # 7 blocks: the small cache has 4
            router.validate(big)
            outputs = [o async for o in router.generate(big)]
            assert sum(len(o.new_token_ids) for o in outputs) == 5
        assert observed.workers == ["large"] * 6
        with pytest.raises(InvalidRequestError, match="this engine holds 256"):
            router.validate(request("huge", 250, 20))
        await router.remove_engine("large")
        with pytest.raises(Exception, match="no live worker's KV cache holds this request"):
            _ = [o async for o in router.generate(request("left", 20, 5))]
        small = [o async for o in router.generate(request("fits", 8, 4))]
        assert sum(len(o.new_token_ids) for o in small) == 4
        # sent to it by name (x-worker-id): its own refusal, a 400 (it read as unknown)
        with pytest.raises(InvalidRequestError, match="this engine holds 16"):
            _ = [o async for o in router.generate(request("named", 20, 5), "small")]
    finally:
        await router.stop()
