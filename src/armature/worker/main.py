"""`armature worker`, assembled: one engine from the registry, served over the request plane
and registered in discovery until SIGINT/SIGTERM (then it deregisters before it stops)."""

from __future__ import annotations

import asyncio
import logging
import secrets
from pathlib import Path

import msgspec

from armature.config import RuntimeConfig, WorkerConfig
from armature.engines.registry import get_kind
from armature.engines.spec import BuiltEngine, EngineInfo, EngineSpec, resolve_engine_model
from armature.errors import ConfigError
from armature.frontend.serve_dir import remove_if_orphaned
from armature.model.source import ResolvedModel
from armature.protocols.worker import WorkerCard, WorkerRole, worker_prefix
from armature.runtime.discovery import Discovery
from armature.runtime.factory import (
    RequestPlaneServerFactory,
    check_namespace,
    make_event_plane,
    make_request_client,
    open_discovery,
)
from armature.runtime.heap import settle_heap
from armature.runtime.ports import free_port
from armature.runtime.stop_signals import stop_on_signals
from armature.worker.instance_id import check_instance_id_free
from armature.worker.service import WorkerService

__all__ = ["run_worker"]

log = logging.getLogger("armature")


def _instance_id(config: WorkerConfig) -> int:
    instance_id = config.process.instance_id
    if instance_id is None:
        return secrets.randbits(63)
    if not 0 <= instance_id < 2**64:
        raise ConfigError(f"--instance-id must be in [0, 2**64), got {instance_id}")
    return instance_id


async def _check_peers(
    discovery: Discovery,
    namespace: str,
    name: str,
    model: ResolvedModel,
    info: EngineInfo,
) -> None:
    """ConfigError when workers of the same model already serve it differently (a frontend
    would refuse this one, saying so only in its own log)."""
    block_size = info.block_size_tokens
    for value in (await discovery.list(worker_prefix(namespace))).values():
        other = msgspec.msgpack.decode(value, type=WorkerCard)
        if other.model_name != name:
            continue
        if other.block_size != block_size:
            raise ConfigError(
                f"model {name!r} is already served with block size {other.block_size} in "
                f"namespace {namespace!r}; this worker uses {block_size}"
            )
        if other.max_model_len != info.max_model_len_tokens:
            raise ConfigError(
                f"model {name!r} is already served with a context of {other.max_model_len:,} "
                f"tokens in namespace {namespace!r}; this worker's is "
                f"{info.max_model_len_tokens:,} (--max-model-len)"
            )
        if other.model_path != str(model.path):
            raise ConfigError(
                f"model {name!r} is already served from {other.model_path} in namespace "
                f"{namespace!r}; this worker loads {model.path}"
            )


async def _check_instance_id(
    discovery: Discovery, runtime: RuntimeConfig, instance_id: int
) -> None:
    client = await make_request_client(runtime)
    try:
        await check_instance_id_free(discovery, client, runtime.namespace, instance_id)
    finally:
        await client.close()


def run_worker(config: WorkerConfig) -> int:
    """Serve until a stop signal (exit code 0) or the engine's death (1: whatever runs the
    worker, the planner's local connector or Kubernetes, starts another)."""
    return asyncio.run(_run(config))


async def _run(config: WorkerConfig) -> int:
    process, runtime = config.process, config.runtime
    check_namespace(runtime.namespace)
    instance_id = _instance_id(config)
    spec, built = _build_engine(config, instance_id)  # a signal while it loads ends it there
    stop = _stop_on_signals()
    model, info, name = spec.model, built.info, spec.get_served_model_name()
    discovery = await open_discovery(runtime)
    await _check_peers(discovery, runtime.namespace, name, model, info)
    if process.instance_id is not None:  # a random one is not another's
        await _check_instance_id(discovery, runtime, instance_id)
    event_plane = await make_event_plane(runtime, process.host)
    servers = RequestPlaneServerFactory(runtime, process.host, process.port, instance_id)
    await servers.open()
    service = WorkerService(
        built.engine,
        discovery,
        namespace=runtime.namespace,
        model_name=name,
        model_path=str(model.path),
        block_size=info.block_size_tokens,
        max_model_len=info.max_model_len_tokens,
        vocab_size=info.vocab_size,
        make_server=servers,
        instance_id=instance_id,
        lease_ttl_s=runtime.lease_ttl_s,
        event_plane=event_plane,
        metrics_host=process.host,
        metrics_port=None if process.metrics_port < 0 else process.metrics_port,
        role=process.role,
        embedder=built.embedder,
        engine_name=config.engine.engine,
        structured_output=info.structured_output,
    )
    try:
        card = await service.start()
    except (OSError, ConfigError) as exc:  # a port taken: what started stops first
        await service.stop()
        await event_plane.close()
        await servers.close()
        await discovery.close()
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(
            f"cannot listen on {process.host}:{process.port}: {exc.strerror}"
        ) from None
    _log_ready(config, card, info.kv_endpoints)
    settle_heap()
    died = await _wait_for_stop(service.engine_died, stop)
    if died:
        log.error("worker %s leaves: its engine died", card.worker_id)
    else:
        log.info("worker %s stopping", card.worker_id)
    await service.stop(0.0 if died else process.shutdown_grace_s)
    await event_plane.close()
    await servers.close()
    await discovery.close()
    if runtime.discovery == "file" and runtime.discovery_dir:  # a serve's, if the serve is gone
        remove_if_orphaned(Path(runtime.discovery_dir))
    return 1 if died else 0


def _build_engine(config: WorkerConfig, instance_id: int) -> tuple[EngineSpec, BuiltEngine]:
    """The engine of `config`'s kind (vLLM starts inside the running event loop)."""
    process = config.process
    kind = get_kind(config.engine.engine)
    kind.check(config.engine, [process.role])
    model = resolve_engine_model(config.engine)
    transfer_port = process.kv_transfer_port
    if transfer_port == 0 and kind.binds_transfer_port_late and process.role is not WorkerRole.AGG:
        transfer_port = free_port(process.host)
    spec = EngineSpec(
        engine=config.engine,
        kv=config.kv,
        tiers=config.tiers,
        transfer=config.transfer,
        model=model,
        worker_id=f"worker-{instance_id:x}",
        role=process.role,
        serve_kv_transfers=True,
        transfer_host=process.host,
        transfer_port=transfer_port,
        plane_secret=config.runtime.plane_secret,
        shared_kv_cache=process.role is WorkerRole.PREFILL,
    )
    return spec, kind.build(spec)


def _log_ready(config: WorkerConfig, card: WorkerCard, kv_endpoints: dict[str, str]) -> None:
    transfers = ", ".join(f"{k} {v}" for k, v in kv_endpoints.items()) or "off"
    log.info(
        "worker %s ready: %s (%s engine, task %s, %s role, %d KV blocks of %d) on %s in "
        "namespace %r; KV transfer %s; metrics %s",
        card.worker_id,
        card.model_name,
        config.engine.engine,
        card.task,
        config.process.role,
        card.num_kv_blocks,
        card.block_size,
        card.request_url,
        config.runtime.namespace,
        transfers,
        card.metrics_url or "off",
    )


def _stop_on_signals() -> asyncio.Event:
    """An event SIGINT and SIGTERM set from now on: a stop that comes while the worker
    registers is kept until it has, then it stops cleanly (it died on the spot, its
    registration left behind until its lease expired)."""
    return stop_on_signals()


async def _wait_for_stop(engine_died: asyncio.Event, stop: asyncio.Event) -> bool:
    """Until SIGINT or SIGTERM (`stop`: False) or the engine's death (True)."""
    waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(engine_died.wait())]
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for wait in waits:
        wait.cancel()
    return engine_died.is_set() and not stop.is_set()
