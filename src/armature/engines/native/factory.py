"""The registry's factory for the native engine and the mocker (the same core with a timing
model in place of the model): an `EngineSpec` in, an `AsyncEngine` and its `EngineInfo` out.

What needs torch (the model, its device and dtype, tiers over its KV tensors) is in
`model_build`, imported only for the native engine: a mocker worker never loads torch."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from armature.engines.native.async_engine import AsyncEngine
from armature.engines.native.config import NativeEngineConfig
from armature.engines.native.core import EngineCore, resolve_max_model_len
from armature.engines.native.embed_queue import EmbedQueue
from armature.engines.native.embedding_engine import EmbeddingModelRunner, NativeEmbeddingEngine
from armature.engines.native.lora_set import ServedLora
from armature.engines.native.transfer import start_transfer_agent
from armature.engines.spec import BuiltEngine, EngineInfo, EngineSpec
from armature.errors import ConfigError
from armature.model.arch import read_arch, read_matryoshka_dimensions
from armature.model.lora_names import LoraError
from armature.protocols.embedding import EmbeddingShape
from armature.transfer.agent import KvTransferAgent
from armature.transfer.wire import TransferError

if TYPE_CHECKING:
    from armature.sim.timing import TimingModel

__all__ = ["build_embedding_engine", "build_native_engine", "mocker_timing", "native_config"]

log = logging.getLogger(__name__)


# what `auto` means to the mocker: it computes nothing, and models a bfloat16 engine
MOCKER_DEVICE, MOCKER_DTYPE = "cpu", "bfloat16"


def native_config(spec: EngineSpec, *, mocker: bool) -> NativeEngineConfig:
    """The native engine's resolved settings (device and dtype picked for `auto`: by this
    machine for the native engine, `MOCKER_DEVICE` and `MOCKER_DTYPE` for the mocker)."""
    engine, kv = spec.engine, spec.kv
    if mocker:
        device = MOCKER_DEVICE if engine.device == "auto" else engine.device
        dtype = MOCKER_DTYPE if engine.dtype == "auto" else engine.dtype
    else:
        from armature.engines.native.model_build import pick_device_dtype

        device, dtype = pick_device_dtype(engine)
    return NativeEngineConfig(
        model_dir=spec.model.path,
        dtype=dtype,
        device=device,
        block_size=engine.get_block_size_tokens(),
        num_kv_blocks=kv.num_kv_blocks,
        kv_cache_bytes=kv.kv_cache_bytes,
        max_num_seqs=engine.max_num_seqs,
        max_num_batched_tokens=engine.max_num_batched_tokens,
        max_model_len=engine.max_model_len_tokens,
        enable_prefix_caching=kv.enable_prefix_caching,
        seed=engine.seed,
        shared_kv_cache=spec.shared_kv_cache and device == "cpu" and not mocker,
        kv_pin_ttl_s=spec.transfer.kv_pin_ttl_s,
    )


def mocker_timing(spec: EngineSpec) -> TimingModel:
    """The mocker's step times: from `--timing-profile` (a profile of this model), else the
    default H100-class model. ProfileError (a ConfigError) for a profile it cannot use."""
    from armature.sim.profile_timing import load_profile_timing
    from armature.sim.timing import PolynomialTiming

    engine = spec.engine
    if engine.timing_profile is None:
        return PolynomialTiming(speedup_ratio=engine.speedup_ratio)
    return load_profile_timing(
        Path(engine.timing_profile), engine.speedup_ratio, model=spec.get_served_model_name()
    )


def _build_core(config: NativeEngineConfig, spec: EngineSpec, *, mocker: bool) -> EngineCore:
    from armature.sim.mocker import build_mocker_core

    try:
        if mocker:
            timing = mocker_timing(spec)
            return build_mocker_core(
                config, timing=timing, eviction_observer=spec.eviction_observer, tiers=spec.tiers
            )
        from armature.engines.native.model_build import build_model_core

        return build_model_core(config, spec)
    except ConfigError:
        raise  # already says what is wrong (a KV tier setting, the context length, memory)
    except (ValueError, KeyError, FileNotFoundError) as exc:
        raise ConfigError(f"cannot load {spec.model.path}: {exc}") from None


def _read_loras(core: EngineCore, spec: EngineSpec) -> list[ServedLora]:
    """The --lora adapters, read and checked against the model; ConfigError (naming the
    adapter and the problem) for one that cannot be served."""
    served = []
    for name, path in spec.engine.get_lora_modules():
        if name == spec.get_served_model_name():
            raise ConfigError(f"--lora: {name!r} is the base model's name")
        try:
            served.append(core.runner.read_lora(name, Path(path)))
        except LoraError as exc:
            raise ConfigError(f"--lora {name}: {exc}") from None
    return served


def _start_transfers(core: EngineCore, spec: EngineSpec) -> KvTransferAgent:
    try:
        return start_transfer_agent(
            core,
            worker_id=spec.worker_id,
            backends=spec.transfer.kv_transfer_backends,
            host=spec.transfer_host,
            port=spec.transfer_port,
            secret=spec.plane_secret,
        )
    except TransferError as exc:
        raise ConfigError(str(exc)) from None
    except OSError as exc:
        raise ConfigError(
            f"cannot listen for KV transfers on {spec.transfer_host}:{spec.transfer_port}: "
            f"{exc.strerror}"
        ) from None


def build_native_engine(spec: EngineSpec, *, mocker: bool) -> BuiltEngine:
    """One engine of `spec`: the model loaded (or the mocker's timing model), its KV cache
    allocated, and with `spec.serve_kv_transfers` its KV transfer agent listening."""
    config = native_config(spec, mocker=mocker)
    started_s = time.perf_counter()
    core = _build_core(config, spec, mocker=mocker)
    for served in _read_loras(core, spec):
        core.loras.add(served)
    transfer = _start_transfers(core, spec) if spec.serve_kv_transfers else None
    info = EngineInfo(
        block_size_tokens=config.block_size,
        num_kv_blocks=core.pool.num_blocks,
        max_model_len_tokens=core.max_model_len,
        vocab_size=core.arch.vocab_size,
        dtype=config.dtype,
        device=config.device,
        load_s=time.perf_counter() - started_s,
        kv_endpoints=dict(core.kv_endpoints),
        structured_output=core.grammar is not None,
    )
    return BuiltEngine(AsyncEngine(core, transfer), info)


def build_embedding_engine(spec: EngineSpec, *, mocker: bool) -> BuiltEngine:
    """An embedding engine of `spec` (`--task embed`): the model loaded without a KV cache,
    or with `mocker` pseudo-embeddings of the model's shape at the timing model's speed
    (`sim.mock_embedding`); batches take up to --max-num-batched-tokens tokens and
    --max-num-seqs prompts."""
    config = native_config(spec, mocker=mocker)
    started_s = time.perf_counter()
    try:
        runner = _embedding_runner(config, spec, mocker=mocker)
    except ConfigError:
        raise  # the context length
    except (ValueError, KeyError, FileNotFoundError) as exc:
        raise ConfigError(f"cannot load {spec.model.path}: {exc}") from None
    engine = NativeEmbeddingEngine(
        runner, EmbedQueue(config.max_num_batched_tokens, config.max_num_seqs)
    )
    info = EngineInfo(
        block_size_tokens=config.block_size,
        num_kv_blocks=0,
        max_model_len_tokens=runner.max_model_len,
        vocab_size=runner.arch.vocab_size,
        dtype="float32" if mocker else config.dtype,
        device=config.device,
        load_s=time.perf_counter() - started_s,
        embedding=runner.shape,
    )
    return BuiltEngine(engine, info, embedder=engine)


def _embedding_runner(
    config: NativeEngineConfig, spec: EngineSpec, *, mocker: bool
) -> EmbeddingModelRunner:
    if not mocker:
        from armature.engines.native.model_build import build_embedding_runner

        return build_embedding_runner(config, spec)
    from armature.sim.clock import WallClock
    from armature.sim.mock_embedding import MockEmbeddingRunner

    arch = read_arch(config.model_dir)
    shape = EmbeddingShape(
        num_dimensions=arch.hidden_size,
        pooling=spec.engine.pooling,
        matryoshka_dimensions=read_matryoshka_dimensions(config.model_dir),
    )
    max_model_len = resolve_max_model_len(config, arch)
    return MockEmbeddingRunner(arch, max_model_len, shape, mocker_timing(spec), WallClock())
