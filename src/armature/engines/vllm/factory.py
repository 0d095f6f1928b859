"""The registry's factory for `--engine vllm`: our settings mapped onto vLLM's, its NIXL
connector for prefill and decode workers, and a missing install as a one-line ConfigError."""

from __future__ import annotations

import time
from collections.abc import Iterable

from armature.config import EngineConfig, KvCacheConfig
from armature.engines.spec import BuiltEngine, EngineInfo, EngineSpec
from armature.engines.vllm.build import (
    VllmConnectorConfig,
    VllmEngineConfig,
    VllmNotInstalledError,
    build_vllm_embedding_engine,
    build_vllm_engine,
    check_nixl_installed,
    check_vllm_installed,
)
from armature.engines.vllm.disagg import NIXL_BACKEND
from armature.errors import ConfigError
from armature.model.source import ResolvedModel
from armature.protocols.embedding import WorkerTask
from armature.protocols.worker import WorkerRole

__all__ = ["build_vllm", "check_vllm", "vllm_config"]


def check_vllm(engine: EngineConfig, roles: Iterable[str]) -> None:
    """ConfigError unless vLLM (and NIXL, for prefill or decode workers) is installed and the
    settings are ones the vllm engine takes."""
    if engine.device == "cuda":
        raise ConfigError("--device cuda: the vllm engine runs where its vLLM build does; omit it")
    try:
        check_vllm_installed()
        if set(roles) & {WorkerRole.PREFILL, WorkerRole.DECODE}:
            check_nixl_installed()
    except VllmNotInstalledError as exc:
        raise ConfigError(str(exc)) from None


def vllm_config(
    engine: EngineConfig,
    kv: KvCacheConfig,
    model: ResolvedModel,
    connector: VllmConnectorConfig | None = None,
) -> VllmEngineConfig:
    """Our engine settings as vLLM's (None where vLLM's own default applies)."""
    return VllmEngineConfig(
        model_dir=model.path,
        dtype=engine.dtype,
        block_size=engine.block_size_tokens,
        kv_cache_bytes=None if kv.num_kv_blocks is not None else kv.kv_cache_bytes,
        num_kv_blocks=kv.num_kv_blocks,
        max_num_seqs=engine.max_num_seqs,
        max_num_batched_tokens=engine.max_num_batched_tokens,
        max_model_len=engine.max_model_len_tokens,
        enable_prefix_caching=kv.enable_prefix_caching,
        seed=engine.seed,
        enforce_eager=engine.enforce_eager,
        connector=connector,
    )


def build_vllm(spec: EngineSpec) -> BuiltEngine:
    """Start a vLLM engine (inside the serving event loop), with vLLM's NIXL connector
    listening on the transfer host and port for a prefill or decode worker; with --task
    embed, vLLM's pooling runner."""
    check_vllm(spec.engine, [spec.role])
    if spec.engine.task is WorkerTask.EMBED:
        return _build_vllm_embedding(spec)
    connector = None
    if spec.role is not WorkerRole.AGG:
        if spec.transfer_port == 0:
            raise ConfigError("the vllm engine needs its KV transfer port chosen for it")
        connector = VllmConnectorConfig(
            worker_id=spec.worker_id,
            side_channel_host=spec.transfer_host,
            side_channel_port=spec.transfer_port,
            lease_s=max(1, round(spec.transfer.kv_pin_ttl_s)),
        )
    config = vllm_config(spec.engine, spec.kv, spec.model, connector)
    started_s = time.perf_counter()
    try:
        engine = build_vllm_engine(config)
    except ValueError as exc:  # vLLM refused a setting (block size, context length...)
        raise ConfigError(f"vLLM cannot serve {spec.model.path} with these flags: {exc}") from None
    except RuntimeError as exc:
        raise ConfigError(f"the vLLM engine failed to start (its log is above): {exc}") from None
    info = engine.info
    endpoints = {}
    if connector is not None:  # the worker's ready line names the NIXL side channel
        endpoints[NIXL_BACKEND] = f"{connector.side_channel_host}:{connector.side_channel_port}"
    return BuiltEngine(
        engine,
        EngineInfo(
            block_size_tokens=info.block_size,
            num_kv_blocks=info.num_kv_blocks,
            max_model_len_tokens=info.max_model_len,
            vocab_size=info.vocab_size,
            dtype=spec.engine.dtype,
            device="vllm",
            load_s=time.perf_counter() - started_s,
            kv_endpoints=endpoints,
            structured_output=True,  # vLLM's own structured outputs (sampling.py)
        ),
    )


def _build_vllm_embedding(spec: EngineSpec) -> BuiltEngine:
    config = vllm_config(spec.engine, spec.kv, spec.model)
    started_s = time.perf_counter()
    try:
        engine = build_vllm_embedding_engine(config, spec.engine.pooling)
    except ValueError as exc:
        raise ConfigError(f"vLLM cannot embed with {spec.model.path}: {exc}") from None
    except RuntimeError as exc:
        raise ConfigError(f"the vLLM engine failed to start (its log is above): {exc}") from None
    info = EngineInfo(
        block_size_tokens=spec.engine.get_block_size_tokens(),
        num_kv_blocks=0,
        max_model_len_tokens=engine.max_model_len,
        vocab_size=engine.vocab_size,
        dtype=spec.engine.dtype,
        device="vllm",
        load_s=time.perf_counter() - started_s,
        embedding=engine.embedding_shape,
    )
    return BuiltEngine(engine, info, embedder=engine)
