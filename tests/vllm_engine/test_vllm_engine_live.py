"""The VllmEngine over a real vLLM engine, in this process: cancellation frees the request in
vLLM, and its KV events build a router index whose overlaps are exactly the prompts' shared
prefixes (and exactly what vLLM itself then reports as cached)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from vllm_servers import MAX_MODEL_LEN, skip_without_vllm

skip_without_vllm()

from armature.engines.vllm.build import VllmEngineConfig, build_vllm_engine  # noqa: E402
from armature.engines.vllm.engine import VllmEngine  # noqa: E402
from armature.kv.hashing import compute_seq_hashes  # noqa: E402
from armature.protocols.engine import EngineRequest, SamplingParams  # noqa: E402
from armature.router.prefix_index import PrefixIndex  # noqa: E402

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.asyncio(loop_scope="module"),
]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(default_model_dir: Path) -> AsyncIterator[VllmEngine]:
    config = VllmEngineConfig(
        model_dir=default_model_dir,
        dtype="float32",
        max_model_len=MAX_MODEL_LEN,
        kv_cache_bytes=256 << 20,
        max_num_seqs=16,
        max_num_batched_tokens=1024,
        enforce_eager=True,
    )
    built = build_vllm_engine(config)
    built.start()
    yield built
    await built.stop()


def request(request_id: str, prompt: list[int], max_tokens: int) -> EngineRequest:
    sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return EngineRequest(request_id=request_id, prompt_token_ids=prompt, sampling=sampling)


async def run(engine: VllmEngine, req: EngineRequest) -> int:
    """Run to the end; the number of prompt tokens vLLM found cached."""
    cached = 0
    async for output in engine.generate(req):
        cached = max(cached, output.num_cached_tokens)
    return cached


async def test_closing_a_stream_frees_the_request_in_vllm(engine: VllmEngine) -> None:
    stream = engine.generate(request("cancel-me", list(range(1000, 1100)), max_tokens=1500))
    for _ in range(3):
        await stream.__anext__()
    assert engine.get_num_active_requests() == 1
    await stream.aclose()  # type: ignore[attr-defined]
    assert engine.get_num_active_requests() == 0
    assert engine.get_load().num_running == 0
    # vLLM's own view: nothing unfinished on the client side, and its scheduler runs only the
    # next request (the aborted one is gone from the engine core)
    assert engine.llm.get_num_unfinished_requests() == 0  # type: ignore[attr-defined]
    next_request = engine.generate(request("after", list(range(2000, 2050)), max_tokens=20))
    async for _ in next_request:
        snapshot = engine.get_scheduler_snapshot()
        assert snapshot.num_running + snapshot.num_waiting <= 1


async def test_cancelling_the_consumer_frees_the_request_in_vllm(engine: VllmEngine) -> None:
    generating = asyncio.Event()

    async def consume() -> None:
        async for _ in engine.generate(request("cancel-task", [7] * 64, max_tokens=1500)):
            generating.set()

    task = asyncio.get_running_loop().create_task(consume())
    await asyncio.wait_for(generating.wait(), 300)  # cancelled mid-generation, not before
    assert engine.get_num_active_requests() == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert engine.get_num_active_requests() == 0
    assert engine.llm.get_num_unfinished_requests() == 0  # type: ignore[attr-defined]


async def test_kv_events_index_matches_shared_prefixes_exactly(engine: VllmEngine) -> None:
    bs = engine.info.block_size
    rng = random.Random(0)
    a = [rng.randrange(100, 40000) for _ in range(4 * bs + 30)]  # 4 full blocks
    b = a[: 2 * bs + 10] + [rng.randrange(100, 40000) for _ in range(2 * bs)]  # shares 2
    c = a[: 2 * bs] + [rng.randrange(100, 40000) for _ in range(bs + 5)]  # shares 2
    engine.take_kv_events()
    index = PrefixIndex()
    index.add_worker("w", engine.info.num_kv_blocks)
    dump = await engine.dump_kv_blocks()  # the blocks cached before this test
    index.load_dump("w", dump.seq_hashes, dump.last_event_id)
    assert index.find_overlaps(compute_seq_hashes(a, bs)) == {}

    await run(engine, request("a", a, max_tokens=1))
    await run(engine, request("b", b, max_tokens=1))

    async def overlap(prompt: list[int]) -> int:
        return index.find_overlaps(compute_seq_hashes(prompt, bs)).get("w", 0)

    for _ in range(50):  # events travel over zmq: give them a moment
        for event in engine.take_kv_events():
            assert index.apply("w", event)
        if await overlap(a) == 4 and await overlap(b) == 4:
            break
        await asyncio.sleep(0.1)
    assert (await overlap(a), await overlap(b), await overlap(c)) == (4, 4, 2)
    # vLLM agrees: the prompt that shares two blocks finds exactly those cached
    assert await run(engine, request("c", c, max_tokens=1)) == 2 * bs
    # and a dump (what a router asks for after a gap) holds what the events said, once c's
    # own block's event has come over zmq
    for _ in range(100):
        for event in engine.take_kv_events():
            assert index.apply("w", event)
        dump = await engine.dump_kv_blocks()
        if set(dump.seq_hashes) == index.get_worker_hashes("w"):
            break
        await asyncio.sleep(0.1)
    assert set(dump.seq_hashes) == index.get_worker_hashes("w")
