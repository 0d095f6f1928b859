"""Start a vLLM engine and wrap it as a VllmEngine. The only module here that imports vLLM
(inside `build_vllm_engine`), so the package imports cleanly without it.

vLLM starts its engine core in child processes (multiprocessing spawn: the main module must
be import-safe, as `armature` and `python -m armature.cli` are) and takes about a minute on
a small CPU, most of it compiling the model (skip that with `enforce_eager`, at a cost in
speed). Call `build_vllm_engine` from inside the running event loop that will serve it.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import os
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from armature.engines.vllm.engine import VllmEngine, VllmEngineInfo
from armature.engines.vllm.events import KvEventTranslator
from armature.engines.vllm.load import LoadTracker, SchedulerSnapshot
from armature.engines.vllm.sampling import VllmSampling
from armature.engines.vllm.subscriber import KvEventSubscriber

__all__ = [
    "INSTALL_HINT",
    "VllmEngineConfig",
    "VllmNotInstalledError",
    "build_vllm_engine",
    "check_vllm_installed",
]

log = logging.getLogger(__name__)

INSTALL_HINT = (
    "the vllm engine needs vLLM: pip install 'armature[vllm]' (a ~3.5 GB environment; "
    "see README, 'vLLM engine')"
)


class VllmNotInstalledError(ImportError):
    """vLLM is not importable in this environment."""


@dataclass(frozen=True)
class VllmEngineConfig:
    """What `armature worker/serve --engine vllm` asks of vLLM. None: vLLM's default."""

    model_dir: Path
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    block_size: int | None = None  # vLLM's CPU attention needs a multiple of 32 (default 128)
    kv_cache_bytes: int | None = None
    num_kv_blocks: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    seed: int = 0
    enforce_eager: bool = False
    max_logprobs: int = 20  # the OpenAI edge allows at most 20


def check_vllm_installed() -> None:
    """Raise VllmNotInstalledError (with how to install it) unless vLLM can be imported."""
    if importlib.util.find_spec("vllm") is None:
        raise VllmNotInstalledError(INSTALL_HINT)


def _bind_all_cpus() -> None:
    """vLLM's CPU backend binds its OpenMP threads to one core unless told otherwise; give it
    every core this process may use (an explicit setting in the environment wins)."""
    cpus = sorted(os.sched_getaffinity(0))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(str(c) for c in cpus))
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")


class _StatLogger:
    """vLLM's stat-logger interface (duck-typed: StatLoggerBase is not a stable API): hands
    every step's scheduler stats to the engine's load tracker."""

    def __init__(self, engine: list[VllmEngine]):
        self._engine = engine  # filled once the engine exists (vLLM builds loggers first)

    def record(
        self,
        scheduler_stats: Any,
        iteration_stats: Any,
        mm_cache_stats: Any = None,
        engine_idx: int = 0,
    ) -> None:
        if scheduler_stats is None or not self._engine:
            return
        self._engine[0].record_step(
            SchedulerSnapshot(
                num_running=scheduler_stats.num_running_reqs,
                num_waiting=scheduler_stats.num_waiting_reqs
                + scheduler_stats.num_skipped_waiting_reqs,
                kv_cache_usage=scheduler_stats.kv_cache_usage,
            )
        )

    def log_engine_initialized(self) -> None:
        pass  # nothing to log: the worker logs its own ready line

    def log(self) -> None:
        pass  # our load is published by the worker, not printed

    def record_sleep_state(self, is_awake: int, level: int) -> None:
        pass  # sleep mode is never used by this adapter


def build_vllm_engine(config: VllmEngineConfig) -> VllmEngine:
    """Start vLLM (blocks for as long as its engine takes to start) and wrap it. Raises
    VllmNotInstalledError without vLLM, ValueError for settings vLLM refuses and
    RuntimeError when its engine fails to start."""
    check_vllm_installed()
    _bind_all_cpus()
    from vllm import SamplingParams
    from vllm.config import KVEventsConfig
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.exceptions import VLLMClientError
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM

    endpoint = f"ipc://{tempfile.gettempdir()}/armature-vllm-kv-{uuid.uuid4().hex[:12]}"
    events = None
    if config.enable_prefix_caching:
        events = KVEventsConfig(enable_kv_cache_events=True, publisher="zmq", endpoint=endpoint)
    args = AsyncEngineArgs(
        model=str(config.model_dir),
        dtype=config.dtype,
        block_size=config.block_size,
        kv_cache_memory_bytes=config.kv_cache_bytes,
        num_gpu_blocks_override=config.num_kv_blocks,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_model_len=config.max_model_len,
        enable_prefix_caching=config.enable_prefix_caching,
        seed=config.seed,
        enforce_eager=config.enforce_eager,
        max_logprobs=config.max_logprobs,
        kv_events_config=events,
        disable_log_stats=True,  # only our stat logger: no vLLM log lines or metrics
    )
    holder: list[VllmEngine] = []
    subscriber = None
    translator = None
    if events is not None:  # subscribe before vLLM binds: no early event is missed
        translator = KvEventTranslator(block_size=0)
        subscriber = KvEventSubscriber(endpoint, translator)
    try:
        llm = AsyncLLM.from_engine_args(args, stat_loggers=[lambda *a, **k: _StatLogger(holder)])
    except BaseException:
        if subscriber is not None:
            subscriber.stop()
        raise
    vllm_config = llm.vllm_config
    info = VllmEngineInfo(
        block_size=vllm_config.cache_config.block_size,
        num_kv_blocks=vllm_config.cache_config.num_gpu_blocks,
        max_model_len=vllm_config.model_config.max_model_len,
        vocab_size=vllm_config.model_config.get_vocab_size(),
        max_logprobs=config.max_logprobs,
    )
    if translator is not None:
        translator.block_size = info.block_size

    def make_sampling(sampling: VllmSampling) -> Any:
        kwargs = dataclasses.asdict(sampling)
        return SamplingParams(**kwargs, output_kind=RequestOutputKind.DELTA)

    def make_prompt(token_ids: list[int]) -> Any:
        return TokensPrompt(prompt_token_ids=token_ids)

    engine = VllmEngine(
        llm,
        info,
        make_sampling=make_sampling,
        make_prompt=make_prompt,
        subscriber=subscriber,
        load=LoadTracker(num_total_blocks=info.num_kv_blocks),
        client_errors=(VLLMClientError, ValueError),  # vLLM's own server answers these 400
    )
    holder.append(engine)
    log.info(
        "vLLM engine ready: %d KV blocks of %d tokens, context %d",
        info.num_kv_blocks,
        info.block_size,
        info.max_model_len,
    )
    return engine
