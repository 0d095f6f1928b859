"""What the engine registry's factories take and give: an `EngineSpec` (a worker's engine
settings, its model and its part in the fleet) in, a `BuiltEngine` (the `Engine` and its
`EngineInfo`) out."""

from __future__ import annotations

from dataclasses import dataclass, field

from armature.config import EngineConfig, KvCacheConfig, TransferConfig
from armature.engines.api import Engine
from armature.model.source import ResolvedModel
from armature.protocols.worker import WorkerRole

__all__ = ["BuiltEngine", "EngineInfo", "EngineSpec"]


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


@dataclass(frozen=True)
class BuiltEngine:
    engine: Engine
    info: EngineInfo
