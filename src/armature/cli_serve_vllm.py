"""`--engine vllm` for `armature serve` (one process: frontend and one vLLM engine) and for
`armature worker`: engine flags -> VllmEngineConfig, user mistakes -> CliError (one line,
exit code 2), including a missing vLLM install."""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from armature.cli_args import CliError, check_port_free, disagg_config, router_config
from armature.cli_edge import overload_from

if TYPE_CHECKING:
    from armature.engines.vllm.build import VllmConnectorConfig, VllmEngineConfig
    from armature.engines.vllm.engine import VllmEngine
    from armature.frontend.auth import ApiKeys
    from armature.model.source import ResolvedModel

__all__ = ["BuiltVllm", "build_vllm_from_args", "check_vllm_roles", "serve_vllm"]

log = logging.getLogger("armature")


@dataclass(frozen=True)
class BuiltVllm:
    engine: VllmEngine
    resolved: ResolvedModel
    load_s: float


def vllm_config_from(
    args: argparse.Namespace, model_dir: Path, connector: VllmConnectorConfig | None = None
) -> VllmEngineConfig:
    from armature.engines.vllm.build import VllmEngineConfig

    if args.device == "cuda":
        raise CliError("--device cuda: the vllm engine runs where its vLLM build does; omit it")
    return VllmEngineConfig(
        model_dir=model_dir,
        dtype=args.dtype,
        block_size=args.block_size,
        kv_cache_bytes=None if args.num_kv_blocks is not None else args.kv_cache_bytes,
        num_kv_blocks=args.num_kv_blocks,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        enable_prefix_caching=not args.no_prefix_caching,
        seed=args.seed,
        enforce_eager=args.enforce_eager,
        connector=connector,
    )


def check_vllm_roles(args: argparse.Namespace) -> None:
    """CliError when prefill/decode workers of the vllm engine cannot move KV blocks (vLLM's
    NIXL connector needs NIXL installed)."""
    from armature.engines.vllm.build import (
        VllmNotInstalledError,
        check_nixl_installed,
        check_vllm_installed,
    )

    if args.engine != "vllm":
        return
    roles = {getattr(args, "role", "agg"), *getattr(args, "roles", ())}
    if roles & {"prefill", "decode"}:
        try:
            check_vllm_installed()
            check_nixl_installed()
        except VllmNotInstalledError as exc:
            raise CliError(str(exc)) from None


def build_vllm_from_args(
    args: argparse.Namespace, connector: VllmConnectorConfig | None = None
) -> BuiltVllm:
    """Start a vLLM engine from the engine flags (with vLLM's NIXL connector for a prefill or
    decode worker); call inside the serving event loop."""
    from armature.engines.vllm.build import (
        VllmNotInstalledError,
        build_vllm_engine,
        check_vllm_installed,
    )
    from armature.model.source import ModelSourceError, resolve_model

    try:
        check_vllm_installed()
    except VllmNotInstalledError as exc:
        raise CliError(str(exc)) from None
    check_vllm_roles(args)
    try:
        resolved = resolve_model(
            args.model, cache_dir=Path(args.cache_dir) if args.cache_dir else None, log=log.info
        )
    except ModelSourceError as exc:
        raise CliError(str(exc)) from None
    config = vllm_config_from(args, resolved.path, connector)
    started_s = time.perf_counter()
    try:
        engine = build_vllm_engine(config)
    except ValueError as exc:  # vLLM refused a setting (block size, context length...)
        raise CliError(f"vLLM cannot serve {resolved.path} with these flags: {exc}") from None
    except RuntimeError as exc:
        raise CliError(f"the vLLM engine failed to start (its log is above): {exc}") from None
    return BuiltVllm(engine, resolved, time.perf_counter() - started_s)


def serve_vllm(args: argparse.Namespace, api_keys: ApiKeys | None) -> None:
    """`armature serve --engine vllm` with one worker: frontend and engine in this process."""
    if args.workers != 1:
        raise CliError(
            "--in-process-workers with --engine vllm: run more than one vLLM worker as "
            "processes (drop --in-process-workers)"
        )
    check_port_free(args.host, args.port)
    asyncio.run(_serve(args, api_keys))


async def _serve(args: argparse.Namespace, api_keys: ApiKeys | None) -> None:
    import uvicorn

    from armature.frontend.app import ServedModel, build_app
    from armature.frontend.preprocess import Preprocessor
    from armature.router.disagg import DisaggRouter

    built = build_vllm_from_args(args)
    engine, info = built.engine, built.engine.info
    name = args.served_model_name or built.resolved.served_name
    log.info(
        "loaded %s (vllm engine, %s) in %.1f s; KV cache %d blocks x %d tokens; context %d",
        name,
        built.resolved.path,
        built.load_s,
        info.num_kv_blocks,
        info.block_size,
        info.max_model_len,
    )
    router = DisaggRouter(
        {"worker-0": engine}, router_config(args, info.block_size), disagg_config(args)
    )
    app = build_app(
        router,
        Preprocessor(built.resolved.path),
        ServedModel(name=name, max_model_len=info.max_model_len, created=int(time.time())),
        api_keys=api_keys,
        protect_metrics=args.protect_metrics,
        max_request_bytes=args.max_request_bytes,
        overload=overload_from(args),
    )
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=False,
        timeout_graceful_shutdown=max(1, round(args.shutdown_grace_s)),
    )
    log.info("serving %r on http://%s:%d (OpenAI API under /v1)", name, args.host, args.port)
    try:
        await uvicorn.Server(config).serve()
    finally:
        await engine.stop()  # idempotent: the app's shutdown stops it first
