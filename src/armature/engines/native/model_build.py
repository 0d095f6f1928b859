"""The parts of building a native engine that need torch: the device and dtype that `auto`
picks, the core with its model and its lower KV tiers over the KV tensors, and the embedding
runner. `factory` imports this module only for the native engine: the mocker, built by the same
factory, never loads torch."""

from __future__ import annotations

import torch

from armature.config import EngineConfig
from armature.engines.native.config import NativeEngineConfig
from armature.engines.native.core import EngineCore, TierBuilder
from armature.engines.native.device import pick_device, pick_dtype
from armature.engines.native.embedding_runner import EmbeddingRunner
from armature.engines.spec import EngineSpec
from armature.errors import ConfigError
from armature.kv.event_log import KvEventLog
from armature.model.fingerprint import weights_fingerprint
from armature.tiers.factory import build_tier_manager
from armature.tiers.manager import KvTierManager
from armature.transfer.blocks import KvBlockStore

__all__ = ["build_embedding_runner", "build_model_core", "pick_device_dtype"]


def pick_device_dtype(engine: EngineConfig) -> tuple[str, str]:
    """The device and the dtype's name, `auto` resolved for this machine."""
    device = pick_device(engine.device)
    return device, pick_dtype(engine.dtype, device)


def build_model_core(config: NativeEngineConfig, spec: EngineSpec) -> EngineCore:
    """The core with the model loaded and its KV cache allocated (ConfigError when the
    memory runs out)."""
    spec.tiers.check_stored()
    try:
        return EngineCore(config, eviction_observer=spec.eviction_observer, tiers=_tiers(spec))
    except (torch.OutOfMemoryError, RuntimeError) as exc:
        # a GPU's OutOfMemoryError; the CPU allocator's is a RuntimeError of its own words
        if not isinstance(exc, torch.OutOfMemoryError) and "can't allocate memory" not in str(exc):
            raise
        raise ConfigError(
            "out of memory while allocating the model, the KV cache or the host tier; lower "
            "--kv-cache-bytes/--num-kv-blocks or --kv-host-bytes/--kv-host-blocks"
        ) from None


def build_embedding_runner(config: NativeEngineConfig, spec: EngineSpec) -> EmbeddingRunner:
    return EmbeddingRunner(config, spec.engine.pooling)


def _tiers(spec: EngineSpec) -> TierBuilder | None:
    """Builds the engine's lower KV tiers once its KV cache exists (None: no tiers)."""
    tiers = spec.tiers
    if not tiers.is_enabled:
        return None

    def build(event_log: KvEventLog, kv_store: KvBlockStore) -> KvTierManager:
        tensors = kv_store.kv_tensors()
        assert tensors is not None, "the native engine's KV cache holds data"
        # the name clients call it by: the same for a worker serve starts on the converted
        # default model's directory and for serve's own in-process engine (a directory's
        # name differed, and one's stored blocks were the other's misses)
        name = spec.get_served_model_name()
        # and the weights': another checkpoint served under the name computes other KV
        weights = weights_fingerprint(spec.model.path)
        return build_tier_manager(
            tiers, event_log, tensors, kv_store.layout, model_name=name, weights=weights
        )

    return build
