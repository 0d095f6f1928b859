"""`armature serve` in one process: the frontend and its worker engines (any registered
engine kind) in this process, on this event loop."""

from __future__ import annotations

import dataclasses
import logging
import socket
import time

from armature.config import ServeConfig
from armature.engines.api import EmbeddingEngine, Engine
from armature.engines.registry import get_kind
from armature.engines.spec import BuiltEngine, EngineSpec, resolve_engine_model
from armature.errors import ConfigError
from armature.frontend.app import ServedModel, build_app
from armature.frontend.auth import ApiKeys, load_api_keys
from armature.frontend.chat_setup import load_chat_setup
from armature.frontend.compose import compose_frontend
from armature.frontend.main import make_server, run_serving
from armature.model.source import ResolvedModel
from armature.protocols.worker import WorkerRole
from armature.runtime.heap import settle_heap
from armature.runtime.ports import reserve_listen_socket
from armature.worker.metrics import add_tier_metrics

__all__ = ["serve_in_process"]

log = logging.getLogger("armature")


def serve_in_process(config: ServeConfig) -> None:
    """Serve with every worker engine in this process until SIGINT/SIGTERM."""
    roles = config.get_worker_roles()
    kind = get_kind(config.engine.engine)
    kind.check(config.engine, roles)
    if config.engine.engine == "vllm" and len(roles) != 1:
        raise ConfigError(
            "--in-process-workers with --engine vllm: run more than one vLLM worker as "
            "processes (drop --in-process-workers)"
        )
    api_keys = load_api_keys(config.security)  # a bad key file fails before any model loads
    with reserve_listen_socket(config.http.host, config.http.port) as listen_socket:
        run_serving(_serve(config, roles, api_keys, listen_socket))


def _build_engines(
    config: ServeConfig, roles: list[WorkerRole]
) -> tuple[ResolvedModel, list[BuiltEngine]]:
    model = resolve_engine_model(config.engine)
    kind = get_kind(config.engine.engine)
    disaggregated = WorkerRole.PREFILL in roles
    built = []
    for i, role in enumerate(roles):
        spec = EngineSpec(
            engine=config.engine,
            kv=config.kv,
            tiers=config.tiers.for_worker(i, len(roles)),
            transfer=config.transfer,
            model=model,
            worker_id=f"worker-{i}",
            role=role,
            serve_kv_transfers=disaggregated,
            shared_kv_cache=disaggregated,
        )
        built.append(kind.build(spec))
    return model, built


async def _serve(
    config: ServeConfig,
    roles: list[WorkerRole],
    api_keys: ApiKeys | None,
    listen_socket: socket.socket,
) -> None:
    model, built = _build_engines(config, roles)
    info = built[0].info
    name = config.engine.served_model_name or model.served_name
    log.info(
        "loaded %s (%d x %s engine, task %s, %s router; %s, %s on %s) in %.1f s; KV cache %d "
        "blocks x %d tokens per worker; context %d",
        name,
        len(roles),
        config.engine.engine,
        config.engine.task,
        config.router.policy,
        model.path,
        info.dtype,
        info.device,
        sum(b.info.load_s for b in built),
        info.num_kv_blocks,
        info.block_size_tokens,
        info.max_model_len_tokens,
    )
    engines: dict[str, Engine] = {}
    prefill_engines: dict[str, Engine] = {}
    embed_engines: dict[str, EmbeddingEngine] = {}
    for i, (one, role) in enumerate(zip(built, roles, strict=True)):
        if one.embedder is not None:
            embed_engines[f"worker-{i}"] = one.embedder
            continue
        (prefill_engines if role is WorkerRole.PREFILL else engines)[f"worker-{i}"] = one.engine
    router_config = dataclasses.replace(
        config.router, block_size_tokens=info.block_size_tokens, seed=config.engine.seed
    )
    served = ServedModel(name, info.max_model_len_tokens, int(time.time()))
    chat = load_chat_setup(model.path, config.chat)
    parts = compose_frontend(
        engines=engines,
        prefill_engines=prefill_engines,
        router_config=router_config,
        preprocessor=chat.preprocessor,
        model=served,
        disagg=config.disagg,
        overload=config.overload,
        parsers=chat.parsers,
        embed_engines=embed_engines,
        responses=config.responses,
        slo=config.slo,
    )
    if config.tiers.is_enabled:  # no worker process serves their metrics: this one does
        add_tier_metrics(
            parts.metrics.registry,
            [one.engine.stats for one in built if one.embedder is None],
        )
    app = build_app(
        parts,
        api_keys=api_keys,
        protect_metrics=config.security.protect_metrics,
        max_request_bytes=config.http.max_request_bytes,
    )
    http = config.http
    log.info("serving %r on http://%s:%d (OpenAI API under /v1)", name, http.host, http.port)
    settle_heap()
    try:
        await make_server(app, http).serve(sockets=[listen_socket])
    finally:
        await parts.router.stop()  # idempotent: the app's shutdown stops the engines first
