"""A mocker worker served over the real TCP request plane and found through discovery:
the frontend's router drives RemoteEngines exactly like in-process engines, and the worker's
step records reach them over the event plane."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import msgspec
import pytest

from armature.config import RouterConfig
from armature.engines.api import EngineDeadError, InvalidRequestError
from armature.engines.native.async_engine import AsyncEngine
from armature.engines.native.config import NativeEngineConfig
from armature.protocols.engine import EngineLoad, EngineRequest, SamplingParams, StepRecord
from armature.protocols.guide import JsonObjectGuide
from armature.protocols.kv_events import DUMP_PART_HASHES, KvCleared, KvDump, KvTier
from armature.protocols.worker import WorkerCard, WorkerUpdate, worker_prefix
from armature.router.service import EngineRouter
from armature.runtime.discovery import MemDiscovery, MemStore
from armature.runtime.events import ZmqEventPlane
from armature.runtime.remote_engine import RemoteEngine
from armature.runtime.tcp_client import RequestPlaneClient
from armature.runtime.tcp_server import RequestPlaneServer
from armature.sim.mocker import build_mocker_core
from armature.sim.timing import PolynomialTiming, StepWork
from armature.worker.main import _stop_on_signals, _wait_for_stop
from armature.worker.service import WorkerService


def mocker_engine(model_dir: Path) -> AsyncEngine:
    config = NativeEngineConfig(model_dir=model_dir, block_size=4, num_kv_blocks=256)
    return AsyncEngine(build_mocker_core(config, timing=PolynomialTiming(speedup_ratio=1.0)))


def request(rid: str, prompt: list[int], max_tokens: int = 5) -> EngineRequest:
    return EngineRequest(
        request_id=rid,
        prompt_token_ids=prompt,
        sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
    )


def worker_service(
    engine: AsyncEngine,
    discovery: MemDiscovery,
    plane: ZmqEventPlane,
    model_dir: Path,
    **options: Any,
) -> WorkerService:
    """A WorkerService (not started) over `engine`, a mocker of `model_dir`; `options` are
    WorkerService's keyword arguments beyond the model's."""
    return WorkerService(
        engine,
        discovery,
        namespace="test",
        model_name="tiny",
        model_path=str(model_dir),
        block_size=4,
        max_model_len=engine.core.max_model_len,
        vocab_size=engine.core.arch.vocab_size,
        make_server=lambda handlers: RequestPlaneServer(handlers),
        event_plane=plane,
        **options,
    )


async def start_worker(
    discovery: MemDiscovery, plane: ZmqEventPlane, model_dir: Path, instance: int
) -> WorkerService:
    service = worker_service(
        mocker_engine(model_dir),
        discovery,
        plane,
        model_dir,
        lease_ttl_s=10.0,  # nothing here waits for expiry: a slow loop must not lose it
        instance_id=instance,
    )
    await service.start()
    return service


async def test_remote_workers_route_stream_and_index(tiny_llama_dir: Path) -> None:
    discovery = MemDiscovery(MemStore(), expire_interval_s=0.05)
    plane = ZmqEventPlane()
    workers = [await start_worker(discovery, plane, tiny_llama_dir, i) for i in (1, 2)]
    client = RequestPlaneClient()
    cards = [
        msgspec.msgpack.decode(v, type=WorkerCard)
        for v in (await discovery.list(worker_prefix("test"))).values()
    ]
    assert sorted(c.worker_id for c in cards) == ["worker-1", "worker-2"]
    router = EngineRouter({}, RouterConfig(policy="kv", block_size_tokens=4))
    router.start()
    for card in cards:
        router.add_engine(card.worker_id, RemoteEngine(card, client, plane))
    try:
        prompt = list(range(1, 41))
        first = [o async for o in router.generate(request("a", prompt))]
        assert sum(len(o.new_token_ids) for o in first) == 5
        assert first[-1].finish_reason is not None
        # The in-process mocker gives the same tokens for the same request id and position.
        local = mocker_engine(tiny_llama_dir)
        local.start()
        expected = [o async for o in local.generate(request("a", prompt))]
        await local.stop()
        assert [t for o in first for t in o.new_token_ids] == [
            t for o in expected for t in o.new_token_ids
        ]
        # KV events crossed the wire: the prefix is indexed on the worker that served it.
        for _ in range(100):
            await router.sync_events()
            overlaps = router.index.find_overlaps(
                [
                    h
                    for h, _ in __import__(
                        "armature.kv.hashing", fromlist=["x"]
                    ).compute_block_hashes(prompt, 4)
                ]
            )
            if overlaps:
                break
            await asyncio.sleep(0.02)
        assert list(overlaps.values()) == [10]  # the whole 40-token prompt, 10 blocks of 4
        # Invalid requests fail with the engine's own words.
        with pytest.raises(InvalidRequestError, match="context length"):
            router.validate(request("b", [1], max_tokens=10**7))
        # A client that stops reading cancels the request on the worker.
        stream = router.generate(request("c", prompt, max_tokens=400))  # ~4 s at speed 1
        await anext(stream)
        await stream.aclose()  # type: ignore[attr-defined]
        for _ in range(50):  # well before the 400 tokens could have finished
            if all(w.engine.get_load().num_running == 0 for w in workers):
                break
            await asyncio.sleep(0.02)
        assert all(w.engine.get_load().num_running == 0 for w in workers)
        assert router.load.get_num_tracked() == 0
    finally:
        await router.stop()
        await client.close()
        for w in workers:
            await w.stop()
        await discovery.close()
        await plane.close()
    assert await discovery.list("") == {}


async def test_step_records_reach_a_remote_engine(tiny_llama_dir: Path) -> None:
    """The mocker's records, one per step with exact counts and its modeled step time, cross
    the zmq event plane in WorkerUpdates and are drained from the RemoteEngine in order."""
    discovery = MemDiscovery(MemStore(), expire_interval_s=0.05)
    plane = ZmqEventPlane()
    worker = await start_worker(discovery, plane, tiny_llama_dir, 3)
    client = RequestPlaneClient()
    assert worker.card is not None
    remote = RemoteEngine(worker.card, client, plane)
    remote.start()
    try:
        for i in range(50):  # until the subscription is up (zmq drops what comes before)
            async for _ in remote.generate(request(f"warm-{i}", [100 + i], 1)):
                pass
            await asyncio.sleep(0.05)
            if remote.take_step_records():
                break
        else:
            raise AssertionError("no step record arrived")
        outputs = [o async for o in remote.generate(request("a", list(range(1, 41)), 3))]
        assert sum(len(o.new_token_ids) for o in outputs) == 3
        records: list[StepRecord] = []
        for _ in range(100):
            records += remote.take_step_records()
            if len(records) >= 3:
                break
            await asyncio.sleep(0.02)
        # the 40-token prompt (10 blocks of 4), then decodes over 41 and 42 tokens (11 blocks)
        assert [
            (
                r.num_scheduled_prefill_requests,
                r.num_scheduled_prefill_tokens,
                r.num_queued_prefill_tokens,
                r.num_decode_requests,
                r.num_decode_kv_tokens,
                r.num_kv_tokens_used,
            )
            for r in records
        ] == [(1, 40, 0, 0, 0, 40), (0, 0, 0, 1, 41, 44), (0, 0, 0, 1, 42, 44)]
        prefill_s = PolynomialTiming().step_ms(StepWork(40, 0, 10 / 256)) / 1000.0
        assert records[0].step_wall_s >= prefill_s  # the mocker sleeps the modeled time
        assert remote.take_step_records() == []
    finally:
        await remote.stop()
        await client.close()
        await worker.stop()
        await discovery.close()
        await plane.close()


def test_worker_update_round_trips_and_old_payloads_decode() -> None:
    load = EngineLoad(
        num_active_blocks=3,
        num_total_blocks=10,
        num_waiting=1,
        num_running=2,
        num_prefill_tokens_queued=7,
    )
    record = StepRecord(
        num_scheduled_prefill_requests=1,
        num_scheduled_prefill_tokens=2,
        num_queued_prefill_requests=3,
        num_queued_prefill_tokens=4,
        num_decode_requests=5,
        num_decode_kv_tokens=6,
        num_kv_tokens_used=7,
        step_wall_s=0.008,
    )
    update = WorkerUpdate(kv_events=[KvCleared(event_id=4)], load=load, step_records=[record])
    wire = msgspec.msgpack.encode(update)
    assert msgspec.msgpack.decode(wire, type=WorkerUpdate) == update

    class OldWorkerUpdate(msgspec.Struct, frozen=True, kw_only=True):  # before step records
        kv_events: list[KvCleared]
        load: EngineLoad

    old = msgspec.msgpack.encode(OldWorkerUpdate(kv_events=[KvCleared(event_id=4)], load=load))
    decoded = msgspec.msgpack.decode(old, type=WorkerUpdate)
    assert decoded == WorkerUpdate(kv_events=[KvCleared(event_id=4)], load=load)
    assert decoded.step_records == []
    # a record from a sender that knows fewer fields decodes with zeros for the rest
    partial = msgspec.msgpack.encode({"num_decode_requests": 2, "step_wall_s": 0.5})
    assert msgspec.msgpack.decode(partial, type=StepRecord) == StepRecord(
        num_decode_requests=2, step_wall_s=0.5
    )


async def test_a_card_says_whether_its_engine_enforces_guides(tiny_llama_dir: Path) -> None:
    """The frontend's view of a worker refuses guided requests its card says the worker's
    engine cannot enforce, naming the field and the engine; cards of older workers, which
    lack the field, leave it to the worker."""
    discovery = MemDiscovery(MemStore())
    plane = ZmqEventPlane()
    engine = mocker_engine(tiny_llama_dir)
    service = worker_service(
        engine, discovery, plane, tiny_llama_dir, engine_name="mocker", structured_output=False
    )
    card = await service.start()
    try:
        [wire] = (await discovery.list(worker_prefix("test"))).values()
        assert msgspec.msgpack.decode(wire, type=WorkerCard) == card
        assert (card.engine, card.structured_output) == ("mocker", False)
        remote = RemoteEngine(card, RequestPlaneClient(), plane)
        guide = JsonObjectGuide(param="response_format")
        guided = EngineRequest(
            request_id="g",
            prompt_token_ids=[1, 2],
            sampling=SamplingParams(max_tokens=2, guide=guide),
        )
        with pytest.raises(InvalidRequestError) as caught:
            remote.validate(guided)
        assert caught.value.param == "response_format"
        assert str(caught.value) == (
            "response_format needs structured output (a token mask at each decoding step), "
            "which the mocker engine serving this model does not enforce"
        )
        remote.validate(request("free", [1, 2]))  # unguided requests pass
        old = {k: v for k, v in msgspec.to_builtins(card).items() if k != "structured_output"}
        old_card = msgspec.convert(old, WorkerCard)
        assert old_card.structured_output
        RemoteEngine(old_card, RequestPlaneClient(), plane).validate(guided)
    finally:
        await service.stop()


async def test_a_worker_whose_engine_died_says_so_and_stops_its_heartbeat(
    tiny_llama_dir: Path,
) -> None:
    """The engine thread died of a bug: the worker went on heartbeating its last load, so
    frontends kept routing to it and every request failed. Now its service says the engine
    died (the worker's main then leaves discovery and exits 1) and sends no more updates."""
    discovery = MemDiscovery(MemStore(), expire_interval_s=0.05)
    plane = ZmqEventPlane()
    service = await start_worker(discovery, plane, tiny_llama_dir, 3)
    engine = service.engine
    assert isinstance(engine, AsyncEngine)

    def broken_step() -> list[Any]:
        raise RuntimeError("a bug in the step")

    engine.core.step = broken_step  # type: ignore[method-assign]
    try:
        with pytest.raises(EngineDeadError, match="a bug in the step"):
            [o async for o in engine.generate(request("x", [1, 2, 3]))]
        await asyncio.wait_for(service.engine_died.wait(), 30)
        assert not engine.is_alive
        assert service._pump is not None and service._pump.done()  # no more heartbeats
    finally:
        await service.stop()
        await discovery.close()
        await plane.close()
    assert await discovery.list("") == {}


async def test_the_worker_process_leaves_when_its_engine_dies() -> None:
    """What `armature worker` waits for besides SIGINT and SIGTERM: its engine's death (it
    then leaves discovery and exits 1)."""
    died = asyncio.Event()
    stop = _stop_on_signals()
    waiting = asyncio.ensure_future(_wait_for_stop(died, stop))
    await asyncio.sleep(0)
    assert not waiting.done()
    died.set()
    assert await asyncio.wait_for(waiting, 30) is True
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        assert loop.remove_signal_handler(sig)  # it had installed them


async def test_a_stop_signalled_while_the_worker_registers_is_kept() -> None:
    """SIGTERM between the engine's load and the end of registration (the planner stopping
    a worker it just started): kept, so the worker stops cleanly once started (it died on
    the spot, its card left in discovery for its lease)."""
    stop = _stop_on_signals()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(stop.wait(), 30)
        assert await _wait_for_stop(asyncio.Event(), stop) is False  # a stop, not a death
    finally:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


async def test_a_large_kv_dump_crosses_the_request_plane_in_parts(tiny_llama_dir: Path) -> None:
    """A worker's dump went as one message (past ~116k blocks too large for NATS's 1 MiB):
    it goes in parts and arrives whole."""
    discovery = MemDiscovery(MemStore(), expire_interval_s=0.05)
    plane = ZmqEventPlane()
    engine = mocker_engine(tiny_llama_dir)
    big = KvDump(
        list(range(2 * DUMP_PART_HASHES + 7)), 5, {KvTier.HOST: list(range(DUMP_PART_HASHES))}
    )

    async def dump() -> KvDump:
        return big

    engine.dump_kv_blocks = dump  # type: ignore[method-assign]
    service = worker_service(engine, discovery, plane, tiny_llama_dir, instance_id=3)
    card = await service.start()
    client = RequestPlaneClient()
    remote = RemoteEngine(card, client, plane)
    try:
        assert await remote.dump_kv_blocks() == big
        sent = [len(part) async for part in service._dump(b"")]
        assert len(sent) == 4 and max(sent) < 1 << 19
    finally:
        await client.close()
        await service.stop()
        await discovery.close()
        await plane.close()
