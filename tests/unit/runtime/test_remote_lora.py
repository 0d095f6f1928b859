"""LoRA adapters across processes' seams: mocker workers (adapters by name: their salt changes
the block hashes) served over the real TCP request plane. Cards advertise adapters, the router
sends a request only to workers holding its adapter and finds its blocks only under the
adapter's salt, and the frontend's admin loads and unloads on every worker."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import msgspec
import pytest
from safetensors.torch import load_file, save_file

from armature.config import RouterConfig
from armature.engines.api import EngineDeadError
from armature.engines.native.async_engine import AsyncEngine
from armature.engines.native.config import NativeEngineConfig
from armature.engines.native.core import EngineCore
from armature.engines.native.lora_set import served_lora_name
from armature.frontend.errors import ApiError
from armature.frontend.lora_admin import LoraAdmin
from armature.kv.hashing import compute_seq_hashes, hash_seed_for_salt
from armature.protocols.engine import EngineRequest, SamplingParams
from armature.protocols.lora import LoraAdapter, LoraState
from armature.protocols.worker import WorkerCard, worker_prefix
from armature.router.disagg import DisaggRouter
from armature.runtime.discovery import MemDiscovery, MemStore
from armature.runtime.events import ZmqEventPlane
from armature.runtime.remote_engine import RemoteEngine
from armature.runtime.tcp_client import RequestPlaneClient
from armature.runtime.tcp_server import RequestPlaneServer
from armature.sim.mocker import build_mocker_core
from armature.sim.timing import PolynomialTiming
from armature.worker.service import WorkerService
from lora_adapters import make_adapter

BLOCK = 4
PROMPT = list(range(1, 41))  # 10 full blocks


def _request(rid: str, lora: str | None) -> EngineRequest:
    return EngineRequest(
        request_id=rid,
        prompt_token_ids=PROMPT,
        sampling=SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True),
        lora_name=lora,
    )


async def _worker(
    discovery: MemDiscovery,
    plane: ZmqEventPlane,
    model_dir: Path,
    instance: int,
    loras: list[str],
    core: EngineCore | None = None,
) -> WorkerService:
    """A worker of `core`, by default the mocker's (adapters by name only)."""
    if core is None:
        config = NativeEngineConfig(model_dir=model_dir, block_size=BLOCK, num_kv_blocks=256)
        core = build_mocker_core(config, timing=PolynomialTiming(speedup_ratio=100.0))
    engine = AsyncEngine(core)
    for name in loras:
        engine.core.loras.add(served_lora_name(name))
    service = WorkerService(
        engine,
        discovery,
        namespace="lora",
        model_name="tiny",
        model_path=str(model_dir),
        block_size=BLOCK,
        max_model_len=engine.core.max_model_len,
        vocab_size=engine.core.arch.vocab_size,
        instance_id=instance,
        make_server=lambda handlers: RequestPlaneServer(handlers),
        event_plane=plane,
    )
    await service.start()
    return service


async def _overlaps(router: DisaggRouter, seed: int) -> dict[str, int]:
    """The router's index overlaps of PROMPT hashed with `seed`, once events have arrived."""
    hashes = compute_seq_hashes(PROMPT, BLOCK, seed)
    for _ in range(200):
        await router.sync_events()
        if router.index.find_overlaps(hashes):
            break
        await asyncio.sleep(0.02)
    return router.index.find_overlaps(hashes)


async def test_adapters_route_salt_and_load_across_workers(tiny_llama_dir: Path) -> None:
    discovery = MemDiscovery(MemStore(), expire_interval_s=0.05)
    plane = ZmqEventPlane()
    workers = [
        await _worker(discovery, plane, tiny_llama_dir, 1, ["a"]),
        await _worker(discovery, plane, tiny_llama_dir, 2, []),
    ]
    client = RequestPlaneClient()
    cards = sorted(
        (
            msgspec.msgpack.decode(v, type=WorkerCard)
            for v in (await discovery.list(worker_prefix("lora"))).values()
        ),
        key=lambda c: c.instance_id,
    )
    assert [c.lora_adapters for c in cards] == [[LoraAdapter("a", "a")], []]
    router = DisaggRouter({}, RouterConfig(policy="round-robin", block_size_tokens=BLOCK))
    router.start()
    for card in cards:
        router.add_engine(card.worker_id, RemoteEngine(card, client, plane))
    admin = LoraAdmin(router, "tiny", lambda: False)
    try:
        assert router.get_lora_adapters() == {"a": LoraAdapter("a", "a")}
        # round-robin over two workers, yet every request of adapter a goes to worker 1
        for i in range(4):
            outputs = [o async for o in router.generate(_request(f"a{i}", "a"))]
            assert sum(len(o.new_token_ids) for o in outputs) == 3
        assert workers[1].engine.core.pool.get_num_cached_blocks() == 0  # type: ignore[attr-defined]
        # its blocks are indexed under a's salt only: the base model's hashes find nothing
        salted = await _overlaps(router, hash_seed_for_salt("a"))
        assert salted == {"worker-1": 10}
        assert router.index.find_overlaps(compute_seq_hashes(PROMPT, BLOCK)) == {}
        # an adapter nobody serves
        with pytest.raises(EngineDeadError, match="no worker serves LoRA adapter 'zzz'"):
            async for _ in router.generate(_request("z", "zzz")):
                pass
        # loaded at runtime: every worker takes it, the router sees it at once
        adapter = await admin.load("b", "/not/read/by/the/mocker")
        assert adapter == LoraAdapter("b", "b")
        assert sorted(router.get_lora_adapters()) == ["a", "b"]
        assert [w.engine.get_lora_adapters() for w in workers] == [
            [LoraAdapter("a", "a"), LoraAdapter("b", "b")],
            [LoraAdapter("b", "b")],
        ]
        served_by = set()
        for i in range(2):
            async for _ in router.generate(_request(f"b{i}", "b")):
                pass
        for i, w in enumerate(workers):
            if w.engine.core.pool.get_num_cached_blocks():  # type: ignore[attr-defined]
                served_by.add(i)
        assert served_by == {0, 1}  # round-robin spread b over both
        with pytest.raises(ApiError, match="already loaded") as exists:
            await admin.load("a", "/x")
        assert exists.value.status_code == 400
        with pytest.raises(ApiError, match="base model's name"):
            await admin.load("tiny", "/x")
        # two loads of one name at once: the second is told it exists (the workers refused
        # it as a bad directory, param lora_path)
        first, second = await asyncio.gather(
            admin.load("c", "/x"), admin.load("c", "/x"), return_exceptions=True
        )
        assert first == LoraAdapter("c", "c")
        assert isinstance(second, ApiError) and second.status_code == 400
        assert (second.param, second.code) == ("lora_name", "lora_adapter_exists")
        await admin.unload("c")
        # unloaded: gone from every worker and the router
        await admin.unload("b")
        assert [w.engine.get_lora_adapters() for w in workers] == [[LoraAdapter("a", "a")], []]
        assert sorted(router.get_lora_adapters()) == ["a"]
        with pytest.raises(ApiError, match="no LoRA adapter named 'b'") as missing:
            await admin.unload("b")
        assert missing.value.status_code == 404
        # a state sent before the unload (version 1: a and b) arriving late changes nothing
        remote = router.engines["worker-1"]
        assert isinstance(remote, RemoteEngine)
        remote._set_lora(LoraState(1, [LoraAdapter("a", "a"), LoraAdapter("b", "b")]))
        assert sorted(router.get_lora_adapters()) == ["a"]
    finally:
        await router.stop()
        await client.close()
        for w in workers:
            await w.stop()
        await discovery.close()
        await plane.close()


async def test_a_fleet_of_embedding_workers_takes_no_adapter() -> None:
    """Only workers of task embed: a load was a 503 "no worker is serving", which clients
    retry; it is the request's 400."""
    router = DisaggRouter({}, RouterConfig(policy="round-robin", block_size_tokens=BLOCK))
    admin = LoraAdmin(router, "embedder", lambda: True)
    with pytest.raises(ApiError, match="compute embeddings: they take no LoRA") as refused:
        await admin.load("a", "/x")
    assert (refused.value.status_code, refused.value.param) == (400, "lora_name")
    without = LoraAdmin(router, "embedder", lambda: False)
    with pytest.raises(ApiError, match="no worker is serving") as none:
        await without.load("a", "/x")
    assert none.value.status_code == 503


async def test_an_adapter_with_non_finite_weights_is_refused_at_load(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    """A worker of real weights refuses an adapter with NaN in a weight (it was served, every
    token <|endoftext|>): the load is the request's 400 naming the tensor, and loads nowhere."""
    path = make_adapter(tiny_llama_dir, tmp_path / "nan", seed=4)
    tensors = load_file(path / "adapter_model.safetensors")
    key = "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"
    tensors[key][5, 0] = math.nan
    save_file(tensors, path / "adapter_model.safetensors")
    discovery = MemDiscovery(MemStore(), expire_interval_s=0.05)
    plane = ZmqEventPlane()
    config = NativeEngineConfig(
        model_dir=tiny_llama_dir, dtype="float32", block_size=BLOCK, num_kv_blocks=64
    )
    worker = await _worker(discovery, plane, tiny_llama_dir, 1, [], core=EngineCore(config))
    client = RequestPlaneClient()
    router = DisaggRouter({}, RouterConfig(policy="round-robin", block_size_tokens=BLOCK))
    router.start()
    (value,) = (await discovery.list(worker_prefix("lora"))).values()
    card = msgspec.msgpack.decode(value, type=WorkerCard)
    router.add_engine(card.worker_id, RemoteEngine(card, client, plane))
    admin = LoraAdmin(router, "tiny", lambda: False)
    try:
        with pytest.raises(ApiError, match=rf"/nan: {key} has non-finite values$") as refused:
            await admin.load("nan", str(path))
        assert (refused.value.status_code, refused.value.param, refused.value.code) == (
            400,
            "lora_path",
            "invalid_lora_adapter",
        )
        assert worker.engine.get_lora_adapters() == [] and router.get_lora_adapters() == {}
    finally:
        await router.stop()
        await client.close()
        await worker.stop()
        await discovery.close()
        await plane.close()
