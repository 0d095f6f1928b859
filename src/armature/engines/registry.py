"""The engine registry: each `--engine` name maps to a factory that builds an `Engine` and
describes it (`EngineInfo`). Commands look engines up here; nothing else chooses by name.

    KINDS["torch"].build(spec)  -> BuiltEngine(engine, info)   the native PyTorch engine
    KINDS["mocker"].build(spec) -> ...                          its core with a timing model
    KINDS["vllm"].build(spec)   -> ...                          vLLM's AsyncLLM (armature[vllm])

A factory is called inside the event loop that will serve the engine (vLLM starts its client
there). Settings that cannot work are a ConfigError naming the setting.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from armature.config import EngineConfig
from armature.engines.spec import BuiltEngine, EngineSpec
from armature.errors import ConfigError
from armature.model.lora_names import LoraError, check_lora_name
from armature.protocols.embedding import Pooling, WorkerTask
from armature.protocols.worker import WorkerRole

__all__ = ["KINDS", "EngineKind", "get_kind"]


@dataclass(frozen=True)
class EngineKind:
    """One registry entry. `check` refuses (ConfigError) settings or roles this kind cannot
    run before anything starts, e.g. before `serve` spawns its worker processes.
    `binds_transfer_port_late`: the engine cannot listen on port 0 for KV transfers, so its
    caller picks a free port for it (vLLM's connector is told its side-channel port)."""

    name: str
    build: Callable[[EngineSpec], BuiltEngine]
    check: Callable[[EngineConfig, Iterable[str]], None]
    binds_transfer_port_late: bool = False


def _build_native(spec: EngineSpec) -> BuiltEngine:
    from armature.engines.native.factory import build_embedding_engine, build_native_engine

    if spec.engine.task is WorkerTask.EMBED:
        return build_embedding_engine(spec, mocker=False)
    return build_native_engine(spec, mocker=False)


def _build_mocker(spec: EngineSpec) -> BuiltEngine:
    from armature.engines.native.factory import build_embedding_engine, build_native_engine

    if spec.engine.task is WorkerTask.EMBED:  # pseudo-embeddings (sim/mock_embedding.py)
        return build_embedding_engine(spec, mocker=True)
    return build_native_engine(spec, mocker=True)


def _build_vllm(spec: EngineSpec) -> BuiltEngine:
    from armature.engines.vllm.factory import build_vllm

    return build_vllm(spec)


def _no_timing_profile(engine: EngineConfig) -> None:
    if engine.timing_profile is not None:
        raise ConfigError(f"--timing-profile is for --engine mocker, not {engine.engine}")


def _check_flags_apply(engine: EngineConfig) -> None:
    """ConfigError for a flag of another engine or task (it would do nothing, unseen)."""
    if engine.engine != "mocker" and engine.speedup_ratio != 1.0:
        raise ConfigError(f"--speedup-ratio is for --engine mocker, not {engine.engine}")
    if engine.engine != "vllm" and engine.enforce_eager:
        raise ConfigError(f"--enforce-eager is for --engine vllm, not {engine.engine}")
    if engine.task is not WorkerTask.EMBED and engine.pooling is not Pooling.LAST:
        raise ConfigError("--pooling is for --task embed")


def _check_lora_names(engine: EngineConfig) -> None:
    """--lora names that can be model names, each once, none the base model's name."""
    seen: set[str] = set()
    for name, _ in engine.get_lora_modules():
        try:
            check_lora_name(name)
        except LoraError as exc:
            raise ConfigError(f"--lora: {exc}") from None
        if name in seen:
            raise ConfigError(f"--lora: the adapter name {name!r} is given twice")
        if name == engine.served_model_name:
            raise ConfigError(f"--lora: {name!r} is the base model's name (--served-model-name)")
        seen.add(name)
    if engine.task is WorkerTask.EMBED and engine.lora_modules:
        raise ConfigError("--task embed takes no --lora: adapters are served for generation")


def _check_vllm(engine: EngineConfig, roles: Iterable[str]) -> None:
    from armature.engines.vllm.factory import check_vllm

    _no_timing_profile(engine)
    _check_flags_apply(engine)
    if engine.lora_modules:
        raise ConfigError(
            "--lora needs --engine torch (or mocker): the vllm adapter serves no LoRA adapters"
        )
    _embed_aggregated(engine, roles)
    check_vllm(engine, roles)


def _check_native(engine: EngineConfig, roles: Iterable[str]) -> None:
    """Every other setting the native engine takes is checked when it is built."""
    _no_timing_profile(engine)
    _check_flags_apply(engine)
    _check_lora_names(engine)
    _embed_aggregated(engine, roles)


def _embed_aggregated(engine: EngineConfig, roles: Iterable[str]) -> None:
    if engine.task is WorkerTask.EMBED and any(role != WorkerRole.AGG for role in roles):
        raise ConfigError(
            "--task embed takes no --role prefill/decode (nor --prefill-workers/"
            "--decode-workers): an embedding worker holds no KV cache to hand over"
        )


def _check_mocker(engine: EngineConfig, roles: Iterable[str]) -> None:
    """A timing profile is read now, before any worker starts (ProfileError: one line); whether
    it is this model's is checked when the engine is built."""
    from pathlib import Path

    from armature.sim.profile_timing import load_profile_timing

    _embed_aggregated(engine, roles)
    _check_lora_names(engine)
    _check_flags_apply(engine)
    if engine.timing_profile is not None:
        load_profile_timing(Path(engine.timing_profile), engine.speedup_ratio)


KINDS: dict[str, EngineKind] = {
    kind.name: kind
    for kind in (
        EngineKind("torch", _build_native, _check_native),
        EngineKind("mocker", _build_mocker, _check_mocker),
        EngineKind("vllm", _build_vllm, _check_vllm, binds_transfer_port_late=True),
    )
}


def get_kind(name: str) -> EngineKind:
    try:
        return KINDS[name]
    except KeyError:
        raise ConfigError(f"unknown engine {name!r}; known: {', '.join(KINDS)}") from None
