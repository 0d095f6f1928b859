"""Disaggregated serving in one process: a DisaggRouter over prefill and decode AsyncEngines
(tiny float32 model) that move KV blocks through real transfer agents. Greedy outputs equal
transformers' (near-tie rule), conditional disaggregation picks the documented path, a failed
prefill pool or an expired handle falls back to local prefill, and every pool ends clean."""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import sys
import threading
from pathlib import Path

import msgspec
import pytest

from idle_engine import HeldEngine
from polling import wait_until

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engines"))
from hf_reference import HfReference
from test_hf_equivalence import check_all, prompts_of

from armature.config import DisaggConfig, RouterConfig
from armature.engines.native.async_engine import AsyncEngine
from armature.engines.native.config import NativeEngineConfig
from armature.engines.native.core import EngineCore
from armature.engines.native.transfer import start_transfer_agent
from armature.frontend.choices import fork_streams
from armature.protocols.engine import (
    EngineOutput,
    EngineRequest,
    FinishReason,
    SamplingParams,
)
from armature.protocols.kv_transfer import ConnectorTransfer, KvHandle
from armature.router.disagg import DisaggRouter, PrefillDecision
from armature.router.policies import RoutingError
from armature.router.service import RouteGroup

NEW_TOKENS = 8


def make_engine(model_dir: Path, name: str, backends: tuple[str, ...], **kw: object) -> AsyncEngine:
    config = NativeEngineConfig(
        model_dir=model_dir,
        dtype="float32",
        num_kv_blocks=128,
        shared_kv_cache="shm" in backends,
        **kw,  # type: ignore[arg-type]
    )
    core = EngineCore(config)
    return AsyncEngine(core, start_transfer_agent(core, worker_id=name, backends=backends))


def request(rid: str, prompt: list[int]) -> EngineRequest:
    sampling = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, min_tokens=NEW_TOKENS)
    return EngineRequest(request_id=rid, prompt_token_ids=prompt, sampling=sampling)


async def run(router: DisaggRouter, req: EngineRequest) -> list[int]:
    tokens: list[int] = []
    async for output in router.generate(req):
        assert output.finish_reason not in (FinishReason.ERROR, FinishReason.TRANSFER)
        tokens.extend(output.new_token_ids)
    return tokens


def build(
    model_dir: Path,
    num_prefill: int = 1,
    backends: tuple[str, ...] = ("shm", "tcp"),
    disagg: DisaggConfig | None = None,
    **kw: object,
) -> DisaggRouter:
    prefill = {f"p{i}": make_engine(model_dir, f"p{i}", backends, **kw) for i in range(num_prefill)}
    decode = {"d0": make_engine(model_dir, "d0", backends, **kw)}
    config = RouterConfig(policy="kv", block_size_tokens=16)
    return DisaggRouter(
        decode, config, disagg or DisaggConfig(max_local_prefill_tokens=0), prefill_engines=prefill
    )


async def settle(router: DisaggRouter) -> None:
    """Wait until every pin is released and freed; then check every pool."""
    engines = [*router.engines.values(), *router.prefill.engines.values()]
    for _ in range(200):
        if all(e.core.pool.get_num_active_blocks() == 0 for e in engines):  # type: ignore[attr-defined]
            break
        await asyncio.sleep(0.01)
    for engine in engines:
        core = engine.core  # type: ignore[attr-defined]
        assert core.pool.get_num_active_blocks() == 0 and len(core.pins) == 0
        core.pool.check_integrity()


@pytest.fixture(scope="module")
def ref(tiny_llama_dir: Path) -> HfReference:
    return HfReference(tiny_llama_dir)


NIXL = pytest.param(
    ("nixl", "tcp"),
    marks=pytest.mark.skipif(
        importlib.util.find_spec("nixl_cu12") is None, reason="NIXL is not installed"
    ),
)


@pytest.mark.parametrize("backends", [("shm", "tcp"), ("tcp",), NIXL])
async def test_disaggregated_outputs_match_transformers(
    tiny_llama_dir: Path, ref: HfReference, backends: tuple[str, ...]
) -> None:
    router = build(tiny_llama_dir, num_prefill=2, backends=backends)
    router.start()
    try:
        prompts = prompts_of([5, 16, 33, 64, 100, 150], 512, seed=21)
        outputs = await asyncio.gather(
            *(run(router, request(f"r{i}", p)) for i, p in enumerate(prompts))
        )
        check_all(ref, prompts, list(outputs))
        assert router.num_prefills == {"remote": 6, "local": 0}
        decode = router.engines["d0"]
        assert decode.num_kv_pull_failures == 0  # type: ignore[attr-defined]
        assert decode.transfer.num_pulls[backends[0]] >= 4  # type: ignore[attr-defined]
        await settle(router)
    finally:
        await router.stop()


async def test_conditional_disaggregation(tiny_llama_dir: Path, ref: HfReference) -> None:
    router = build(tiny_llama_dir, disagg=DisaggConfig(max_local_prefill_tokens=40))
    router.start()
    try:
        short, long = prompts_of([20, 64], 512, seed=22)
        assert router.decide_prefill(request("s", short)) is PrefillDecision.LOCAL_SHORT_PREFILL
        assert router.decide_prefill(request("l", long)) is PrefillDecision.REMOTE
        outs = [await run(router, request("s", short)), await run(router, request("l", long))]
        assert router.num_prefills == {"remote": 1, "local": 1}
        # the decode worker now caches the long prompt's 4 blocks (it imported them): a
        # follow-up with 3 new tokens has 3 uncached tokens and prefills locally
        follow = [*long, 7, 8, 9]
        for _ in range(100):
            await router.sync_events()
            if not router.decide_prefill(request("f", follow)).is_remote:
                break
            await asyncio.sleep(0.01)
        assert router.decide_prefill(request("f", follow)) is PrefillDecision.LOCAL_SHORT_PREFILL
        # the same follow-up scored computes its whole prompt: not short, a remote prefill
        sampling = SamplingParams(max_tokens=NEW_TOKENS, prompt_logprobs=0)
        scored = EngineRequest(request_id="s", prompt_token_ids=follow, sampling=sampling)
        assert router.decide_prefill(scored) is PrefillDecision.REMOTE
        outs.append(await run(router, request("f", follow)))
        check_all(ref, [short, long, follow], outs)
        await settle(router)
    finally:
        await router.stop()


async def test_saturated_or_missing_prefill_pool_serves_locally(tiny_llama_dir: Path) -> None:
    router = build(
        tiny_llama_dir, disagg=DisaggConfig(max_local_prefill_tokens=0, max_prefill_queue_tokens=10)
    )
    router.start()
    try:
        prompt = prompts_of([64], 512, seed=23)[0]
        assert router.decide_prefill(request("a", prompt)) is PrefillDecision.REMOTE
        router.prefill.load.start("other", "p0", prefill_tokens=9, blocks=1)
        assert router.decide_prefill(request("a", prompt)) is PrefillDecision.REMOTE
        router.prefill.load.finish("other")
        router.prefill.load.start("other", "p0", prefill_tokens=10, blocks=1)
        saturated = router.decide_prefill(request("a", prompt))
        assert saturated is PrefillDecision.LOCAL_PREFILL_SATURATED
        router.prefill.load.finish("other")
        await router.prefill.remove_engine("p0")
        no_worker = router.decide_prefill(request("a", prompt))
        assert no_worker is PrefillDecision.LOCAL_NO_PREFILL_WORKER
        assert len(await run(router, request("a", prompt))) == NEW_TOKENS
    finally:
        await router.stop()


async def test_enforce_disagg_refuses_without_prefill_workers(tiny_llama_dir: Path) -> None:
    router = build(tiny_llama_dir, num_prefill=0, disagg=DisaggConfig(enforce_disagg=True))
    router.start()
    try:
        with pytest.raises(RoutingError, match="no prefill worker is available"):
            router.check_route(None)
        with pytest.raises(RoutingError, match="no prefill worker is available"):
            await run(router, request("x", list(range(3, 40))))
    finally:
        await router.stop()


async def test_dead_prefill_pool_falls_back_to_local_prefill(
    tiny_llama_dir: Path, ref: HfReference
) -> None:
    router = build(tiny_llama_dir)
    router.start()
    try:
        await router.prefill.engines["p0"].stop()  # dead, but not yet removed by discovery
        prompt = prompts_of([70], 512, seed=24)[0]
        out = await run(router, request("x", prompt))
        check_all(ref, [prompt], [out])
        assert router.num_prefills == {"remote": 0, "local": 1}
    finally:
        await router.stop()


async def test_expired_handle_frees_both_sides_and_decode_recomputes(
    tiny_llama_dir: Path, ref: HfReference
) -> None:
    # long enough that the pins are still there when the first check below runs on a loaded
    # machine; the expiry itself is awaited, not timed
    prefill = make_engine(tiny_llama_dir, "p0", ("tcp",), kv_pin_ttl_s=2.0)
    decode = make_engine(tiny_llama_dir, "d0", ("tcp",))
    prefill.start()
    decode.start()
    try:
        prompt = prompts_of([50], 512, seed=25)[0]
        first = [
            o
            async for o in prefill.generate(
                EngineRequest(
                    request_id="x",
                    prompt_token_ids=prompt,
                    sampling=SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0),
                    remote_prefill=True,
                )
            )
        ]
        [out] = first
        assert out.finish_reason is FinishReason.TRANSFER and out.kv_handle is not None
        assert prefill.core.pins.get_num_pinned_blocks() == 3
        await wait_until(  # the engine thread wakes up by itself at the deadline
            lambda: prefill.core.pool.get_num_active_blocks() == 0, "the expired pins freed"
        )
        assert prefill.core.pins.num_expired == 1
        resumed = EngineRequest(
            request_id="x",
            prompt_token_ids=prompt,
            output_token_ids=out.new_token_ids,
            sampling=SamplingParams(
                max_tokens=NEW_TOKENS - 1, temperature=0.0, min_tokens=NEW_TOKENS
            ),
            kv_handle=out.kv_handle,
        )
        tokens = list(out.new_token_ids)
        async for o in decode.generate(resumed):
            tokens.extend(o.new_token_ids)
        check_all(ref, [prompt], [tokens])
        assert decode.num_kv_pull_failures == 1 and decode.num_kv_pulls == 0
        assert decode.core.pool.get_num_active_blocks() == 0
        decode.core.pool.check_integrity()
        prefill.core.pool.check_integrity()
    finally:
        await prefill.stop()
        await decode.stop()


async def test_a_native_decode_computes_a_connector_handles_prompt(
    tiny_llama_dir: Path, ref: HfReference
) -> None:
    """A handle whose blocks a third-party connector holds (here: a native prefill's handle
    with its transfer swapped for vLLM's) is not pulled, nor counted as a failed pull: the
    decode computes the prompt itself and the output is unchanged."""
    prefill = make_engine(tiny_llama_dir, "p0", ("tcp",))
    decode = make_engine(tiny_llama_dir, "d0", ("tcp",))
    prefill.start()
    decode.start()
    try:
        prompt = prompts_of([50], 512, seed=27)[0]
        [out] = [
            o
            async for o in prefill.generate(
                EngineRequest(
                    request_id="x",
                    prompt_token_ids=prompt,
                    sampling=SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0),
                    remote_prefill=True,
                )
            )
        ]
        assert out.kv_handle is not None and len(out.kv_handle.seq_hashes) == 3
        foreign = msgspec.structs.replace(
            out.kv_handle, transfer=ConnectorTransfer(connector="vllm-nixl", params=b"")
        )
        resumed = EngineRequest(
            request_id="x",
            prompt_token_ids=prompt,
            output_token_ids=out.new_token_ids,
            sampling=SamplingParams(
                max_tokens=NEW_TOKENS - 1, temperature=0.0, min_tokens=NEW_TOKENS
            ),
            kv_handle=foreign,
        )
        tokens = list(out.new_token_ids)
        async for o in decode.generate(resumed):
            tokens.extend(o.new_token_ids)
        check_all(ref, [prompt], [tokens])
        assert (decode.num_kv_pulls, decode.num_kv_pull_failures) == (0, 0)
        assert decode.transfer is not None
        assert decode.transfer.num_pulls == {"shm": 0, "nixl": 0, "tcp": 0}
        assert prefill.core.pins.get_num_pinned_blocks() == 3  # nobody released it
        await prefill.release_kv(out.kv_handle)
        for _ in range(100):
            if prefill.core.pool.get_num_active_blocks() == 0:
                break
            await asyncio.sleep(0.01)
        assert prefill.core.pool.get_num_active_blocks() == 0 and len(prefill.core.pins) == 0
    finally:
        await prefill.stop()
        await decode.stop()


async def test_a_decode_leg_cancelled_during_its_pull_releases_the_handle(
    tiny_llama_dir: Path,
) -> None:
    """Nothing was copied yet: the handle is released at once (it waited for the 30 s
    deadline)."""
    prefill = make_engine(tiny_llama_dir, "p0", ("tcp",))
    decode = make_engine(tiny_llama_dir, "d0", ("tcp",))
    prefill.start()
    decode.start()
    try:
        prompt = prompts_of([50], 512, seed=28)[0]
        params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0)
        first = EngineRequest(
            request_id="x", prompt_token_ids=prompt, sampling=params, remote_prefill=True
        )
        [out] = [o async for o in prefill.generate(first)]
        assert out.kv_handle is not None
        transfer = decode.transfer
        assert transfer is not None
        pulling, go_on = threading.Event(), threading.Event()
        real_pull = transfer.pull

        def held_pull(handle: KvHandle, start_block: int) -> object:
            pulling.set()
            go_on.wait(30)
            return real_pull(handle, start_block)

        transfer.pull = held_pull  # type: ignore[method-assign,assignment]
        resumed = msgspec.structs.replace(
            first, remote_prefill=False, output_token_ids=out.new_token_ids, kv_handle=out.kv_handle
        )
        leg = asyncio.ensure_future(anext(decode.generate(resumed)))  # type: ignore[arg-type]
        await asyncio.to_thread(pulling.wait, 30)
        leg.cancel()
        await asyncio.gather(leg, return_exceptions=True)
        go_on.set()
        await wait_until(lambda: len(prefill.core.pins) == 0, "released")
        assert prefill.core.pins.num_expired == 0  # released, not freed at its deadline
    finally:
        await prefill.stop()
        await decode.stop()


async def test_the_choices_of_n_wait_for_the_first_s_kv_on_its_decode_worker(
    tiny_llama_dir: Path, ref: HfReference
) -> None:
    """n = 3 over a remote prefill: the other choices start once the first has its first
    token (the prefill worker's), and follow it to its decode worker. They went on at once
    and each computed the whole prompt there before the first's KV had arrived; now they
    wait for it and find the prompt cached (all but the last token's block)."""
    router = build(tiny_llama_dir)
    router.start()
    try:
        prompt = prompts_of([64], 512, seed=29)[0]
        group = RouteGroup()
        starts = [
            functools.partial(router.generate, request(f"x-{i}", prompt), group=group)
            for i in range(3)
        ]
        outputs: dict[int, list[EngineOutput]] = {0: [], 1: [], 2: []}
        async for index, output in fork_streams(starts):  # type: ignore[arg-type]
            outputs[index].append(output)
        assert router.num_prefills == {"remote": 1, "local": 2}
        cached = [
            next(o for o in outputs[i] if o.num_prompt_tokens).num_cached_tokens for i in (1, 2)
        ]
        assert cached == [48, 48]
        texts = [[t for o in outputs[i] for t in o.new_token_ids] for i in range(3)]
        assert texts[1] == texts[2] == texts[0]
        check_all(ref, [prompt], [texts[0]])
        await settle(router)
    finally:
        await router.stop()


async def test_a_client_gone_once_the_decode_leg_was_asked_leaves_the_handle_to_it(
    tiny_llama_dir: Path,
) -> None:
    """The decode engine releases the handle after it has copied the blocks in; the router
    released it too when the client left before the decode leg's first output, so the
    prefill worker could reuse blocks a shared-memory copy had still to read (the decode
    worker's prefix cache then held another prompt's KV under this prompt's hashes)."""
    router = build(tiny_llama_dir)
    held = HeldEngine(router.engines["d0"])
    router.engines["d0"] = held  # type: ignore[assignment]
    prefill_engine = router.prefill.engines["p0"]
    released: list[str] = []

    async def record_release(handle: KvHandle) -> None:
        released.append(handle.handle_id)

    prefill_engine.release_kv = record_release  # type: ignore[method-assign]
    router.start()
    try:
        stream = router.generate(request("x", prompts_of([64], 512, seed=27)[0]))
        await anext(stream)  # type: ignore[arg-type]  # the prefill worker's token
        pending = asyncio.ensure_future(anext(stream))  # type: ignore[arg-type]
        await asyncio.wait_for(held.asked.wait(), 30)
        # the decode leg computes what its handle lacks: the first token, carried (it was
        # counted as the whole 64-token prompt on the decode worker until its first output)
        assert router.load.get("d0").active_prefill_tokens == 1
        pending.cancel()
        await asyncio.gather(pending, return_exceptions=True)
        await stream.aclose()  # type: ignore[attr-defined]
        await asyncio.gather(*router._releases)
        assert released == []  # the router sent none (it did, at once)
        prefill = prefill_engine.core  # type: ignore[attr-defined]
        assert prefill.pins.get_num_pinned_blocks() == 4  # the decode side's, or the deadline's
    finally:
        router.engines["d0"] = held.engine
        del prefill_engine.release_kv
        await router.stop()


async def test_a_client_gone_after_the_first_token_frees_the_prefill_blocks(
    tiny_llama_dir: Path,
) -> None:
    router = build(tiny_llama_dir)
    router.start()
    try:
        stream = router.generate(request("x", prompts_of([64], 512, seed=26)[0]))
        first = await anext(stream)  # type: ignore[arg-type]
        assert first.new_token_ids and first.finish_reason is None
        prefill = router.prefill.engines["p0"].core  # type: ignore[attr-defined]
        assert prefill.pins.get_num_pinned_blocks() == 4
        await stream.aclose()  # type: ignore[attr-defined]
        await settle(router)  # released at once, not at the 30 s deadline
        assert prefill.pins.num_expired == 0
    finally:
        await router.stop()
