"""What the engine registry's factories take and give: an `EngineSpec` (a worker's engine
settings, its model and its part in the fleet) in, a `BuiltEngine` (the `Engine` and its
`EngineInfo`) out."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from armature.config import EngineConfig, KvCacheConfig, KvTierConfig, TransferConfig
from armature.engines.api import EmbeddingEngine, Engine
from armature.errors import ConfigError
from armature.kv.eviction import EvictionObserver
from armature.model.source import ModelSourceError, ResolvedModel, resolve_model
from armature.protocols.embedding import EmbeddingShape
from armature.protocols.worker import WorkerRole

__all__ = ["BuiltEngine", "EngineInfo", "EngineSpec", "resolve_engine_model"]

log = logging.getLogger("armature")


@dataclass(frozen=True, kw_only=True)
class EngineSpec:
    """What to build: a worker's engine settings, its model and its part in the fleet."""

    engine: EngineConfig
    kv: KvCacheConfig
    transfer: TransferConfig
    model: ResolvedModel
    worker_id: str
    role: WorkerRole = WorkerRole.AGG
    # KV transfers: a prefill or decode worker serves and pulls KV blocks
    serve_kv_transfers: bool = False
    transfer_host: str = "127.0.0.1"
    transfer_port: int = 0  # 0: any free port (not for kinds that bind it late)
    plane_secret: str | None = None
    shared_kv_cache: bool = False  # the KV cache in shared memory (same-host transfers)
    # told of each cached block before its memory is reused (a lower KV tier keeps a copy)
    eviction_observer: EvictionObserver | None = None
    tiers: KvTierConfig = KvTierConfig()  # lower KV tiers (G2 host, G3 disk, G4 shared)

    def get_served_model_name(self) -> str:
        """The name clients pass as `model`: --served-model-name, else the model's own."""
        return self.engine.served_model_name or self.model.served_name


@dataclass(frozen=True, kw_only=True)
class EngineInfo:
    """The built engine's shape, for the worker card and the start-up log."""

    block_size_tokens: int
    num_kv_blocks: int
    max_model_len_tokens: int
    vocab_size: int
    dtype: str
    device: str
    load_s: float
    kv_endpoints: dict[str, str] = field(default_factory=dict)  # transfer backend -> address
    embedding: EmbeddingShape | None = None  # an embedding engine's vectors (--task embed)
    # whether it enforces a request's guide (structured output, forced tool calls)
    structured_output: bool = False


@dataclass(frozen=True)
class BuiltEngine:
    """`embedder`: the same engine seen as an embedding engine, when it is one (--task embed)."""

    engine: Engine
    info: EngineInfo
    embedder: EmbeddingEngine | None = None


def resolve_engine_model(engine: EngineConfig) -> ResolvedModel:
    """The local model directory `--model` names (the default model converted once into the
    cache); ConfigError when it cannot be served."""
    try:
        cache_dir = Path(engine.cache_dir) if engine.cache_dir else None
        return resolve_model(engine.model, cache_dir=cache_dir, log=log.info)
    except ModelSourceError as exc:
        raise ConfigError(str(exc)) from None
