"""The profiler's shell: build one engine from the registry (`--engine`), check the sweep
against it, run the sweep, and write the profile and its plots.

    config -> EngineSpec -> KINDS[engine].build -> start -> Sweep.run -> TimingProfile
           -> checked (the mocker's timing model must build from it)
           -> the load pass, with --load-requests (`load_pass`) -> written, plotted
"""

from __future__ import annotations

import datetime
import logging
import platform
from pathlib import Path

import msgspec

from armature.config import EngineConfig, KvCacheConfig, ProfileConfig, TransferConfig
from armature.config.settings import flag_name, get_setting_value, iter_settings
from armature.engines.registry import get_kind
from armature.engines.spec import EngineInfo, EngineSpec, resolve_engine_model
from armature.errors import ConfigError
from armature.profiler.load_pass import plan_load, run_load_pass
from armature.profiler.plan import EngineLimits, check_sweep, prefill_context_points
from armature.profiler.sweep import Sweep
from armature.protocols.embedding import WorkerTask
from armature.protocols.timing_profile import (
    PROFILE_VERSION,
    DecodePoint,
    PrefillPoint,
    ProfileSource,
    TimingProfile,
)
from armature.sim.profile_timing import timing_from_profile

__all__ = ["describe_machine", "engine_flags", "profile_engine"]

log = logging.getLogger(__name__)


def describe_machine(device: str) -> str:
    """The CPU model, and the GPU's name when the engine runs on one."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass  # not Linux: platform's answer stands
    if device.startswith("cuda"):
        import torch

        return f"{torch.cuda.get_device_name(0)}; {cpu}"
    return cpu


def engine_flags(engine: EngineConfig, kv: KvCacheConfig) -> dict[str, str]:
    """The engine's settings that differ from their defaults, by flag."""
    flags: dict[str, str] = {}
    for section in (engine, kv):
        defaults = type(section)()
        for path, f, setting in iter_settings(type(section)):
            value = get_setting_value(section, path)
            if value != get_setting_value(defaults, path):
                flags[flag_name(f.name, setting)] = str(value)
    return flags


def _limits(config: ProfileConfig, info: EngineInfo) -> EngineLimits:
    return EngineLimits(
        max_num_seqs=config.engine.max_num_seqs,
        max_num_batched_tokens=config.engine.max_num_batched_tokens,
        max_model_len_tokens=info.max_model_len_tokens,
        block_size_tokens=info.block_size_tokens,
        num_kv_blocks=info.num_kv_blocks,
        kv_cache_flag="--kv-cache-bytes" if config.kv.num_kv_blocks is None else "--num-kv-blocks",
    )


async def profile_engine(config: ProfileConfig) -> TimingProfile:
    """Build the engine `config` names, sweep it, and return its profile (nothing written).
    ConfigError for settings or a sweep the engine cannot run."""
    if config.sweep.load_requests > 0 and config.engine.engine == "vllm":
        raise ConfigError(
            "--load-requests: vLLM does not report its steps' context lengths or wall times, "
            "which the load pass sets against the tables; profile it without one"
        )
    kind = get_kind(config.engine.engine)
    kind.check(config.engine, ["agg"])
    if config.engine.task is not WorkerTask.GENERATE:
        raise ConfigError("--task embed: the profiler sweeps text generation only")
    model = resolve_engine_model(config.engine)
    spec = EngineSpec(
        engine=config.engine,
        kv=config.kv,
        transfer=TransferConfig(),
        model=model,
        worker_id="profile",
    )
    built = kind.build(spec)
    limits = _limits(config, built.info)
    check_sweep(config.sweep, limits)
    engine = built.engine
    engine.start()
    try:
        after_prefix = prefill_context_points(config.sweep, limits)
        sweep = Sweep(engine, built.info.vocab_size, config.sweep, after_prefix)
        prefill, decode = await sweep.run()
        profile = _profile(config, spec, built.info, prefill, decode)
        try:
            timing = timing_from_profile(profile)
        except ValueError as exc:
            raise ConfigError(f"the sweep cannot drive the mocker: {exc}") from None
        if config.sweep.load_requests > 0:
            try:
                plan = plan_load(timing, config.sweep, limits, config.sweep.load_requests)
            except ValueError as exc:
                raise ConfigError(f"--load-requests: {exc}") from None
            log.info(
                "load pass: %d requests at %.2f requests/s",
                len(plan.requests),
                plan.request_rate_per_s,
            )
            load = await run_load_pass(
                engine, built.info.vocab_size, plan, timing, config.sweep.prompt_seed
            )
            log.info(
                "load pass: %d steps, %.1f s measured against %.1f s modeled: factor %.3f",
                load.num_steps,
                load.measured_s,
                load.modeled_s,
                load.factor,
            )
            profile = msgspec.structs.replace(profile, load=load)
    finally:
        await engine.stop()
    return profile


def _profile(
    config: ProfileConfig,
    spec: EngineSpec,
    info: EngineInfo,
    prefill: list[PrefillPoint],
    decode: list[DecodePoint],
) -> TimingProfile:
    return TimingProfile(
        version=PROFILE_VERSION,
        source=ProfileSource(
            machine=describe_machine(info.device),
            engine=config.engine.engine,
            model=spec.get_served_model_name(),
            dtype=info.dtype,
            device=info.device,
            flags=engine_flags(config.engine, config.kv),
            created_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        ),
        max_num_batched_tokens=config.engine.max_num_batched_tokens,
        max_num_seqs=config.engine.max_num_seqs,
        block_size_tokens=info.block_size_tokens,
        num_kv_blocks=info.num_kv_blocks,
        prefill=prefill,
        decode=decode,
    )
