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

from armature.engines.vllm.embedding import VllmEmbeddingEngine
from armature.engines.vllm.engine import VllmEngine, VllmEngineInfo, VllmTransfer
from armature.engines.vllm.events import KvEventTranslator
from armature.engines.vllm.load import LoadTracker, SchedulerSnapshot
from armature.engines.vllm.sampling import VllmSampling
from armature.engines.vllm.steps import read_iteration
from armature.engines.vllm.subscriber import KvEventSubscriber
from armature.errors import ArmatureError
from armature.model.arch import read_matryoshka_dimensions
from armature.protocols.embedding import EmbeddingShape, Pooling
from armature.protocols.kv_transfer import KvLayout

__all__ = [
    "INSTALL_HINT",
    "NIXL_INSTALL_HINT",
    "VllmConnectorConfig",
    "VllmEngineConfig",
    "VllmNotInstalledError",
    "build_vllm_embedding_engine",
    "build_vllm_engine",
    "check_nixl_installed",
    "check_vllm_installed",
]

log = logging.getLogger(__name__)

INSTALL_HINT = (
    "the vllm engine needs vLLM: pip install 'armature[vllm]' (a ~3.5 GB environment; "
    "see README, 'vLLM engine')"
)

NIXL_INSTALL_HINT = (
    "prefill/decode roles with the vllm engine move KV blocks with vLLM's NIXL connector, "
    "which needs NIXL: pip install nixl-cu12==1.5.1 && pip install --no-deps nixl==1.5.1"
)


class VllmNotInstalledError(ArmatureError, ImportError):
    """vLLM (or NIXL, for its connector) is not importable in this environment."""


@dataclass(frozen=True)
class VllmConnectorConfig:
    """vLLM's NIXL connector, for a prefill or decode worker. vLLM reads its side-channel
    address from the environment: one engine per process, as `armature worker` runs it."""

    worker_id: str
    side_channel_host: str
    side_channel_port: int
    lease_s: int = 30  # vLLM frees prefilled blocks no decode engine read after this long


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
    connector: VllmConnectorConfig | None = None  # disaggregated roles


def check_vllm_installed() -> None:
    """Raise VllmNotInstalledError (with how to install it) unless vLLM can be imported."""
    if importlib.util.find_spec("vllm") is None:
        raise VllmNotInstalledError(INSTALL_HINT)


def check_nixl_installed() -> None:
    """Raise VllmNotInstalledError unless vLLM's NIXL connector can load NIXL."""
    if importlib.util.find_spec("nixl") is None:
        raise VllmNotInstalledError(NIXL_INSTALL_HINT)


def _transfer_config(connector: VllmConnectorConfig) -> Any:
    """vLLM's KVTransferConfig for its NIXL connector, both directions (a worker's role only
    decides which legs the frontend sends it); KV buffers where the engine's KV lives."""
    from vllm.config import KVTransferConfig
    from vllm.platforms import current_platform

    os.environ["VLLM_NIXL_SIDE_CHANNEL_HOST"] = connector.side_channel_host
    os.environ["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(connector.side_channel_port)
    return KVTransferConfig(
        kv_connector="NixlConnector",
        kv_role="kv_both",
        kv_buffer_device="cpu" if current_platform.is_cpu() else "cuda",
        kv_connector_extra_config={"kv_lease_duration": connector.lease_s},
    )


def _bind_all_cpus() -> None:
    """vLLM's CPU backend binds its OpenMP threads to one core unless told otherwise; give it
    every core this process may use (an explicit setting in the environment wins)."""
    cpus = sorted(os.sched_getaffinity(0))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(str(c) for c in cpus))
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")


class _StatLogger:
    """vLLM's stat-logger interface (duck-typed: StatLoggerBase is not a stable API): hands
    every step's scheduler and iteration stats to the engine (its load and step records)."""

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
        transfers = getattr(scheduler_stats, "kv_connector_stats", None)
        if transfers:  # vLLM's NIXL connector: lists of per-transfer values since the last step
            self._engine[0].record_transfers(
                num_bytes=sum(transfers.get("bytes_transferred", ())),
                num_failures=len(transfers.get("num_failed_transfers", ()))
                + len(transfers.get("num_failed_handshakes", ())),
            )
        self._engine[0].record_step(
            SchedulerSnapshot(
                num_running=scheduler_stats.num_running_reqs,
                num_waiting=scheduler_stats.num_waiting_reqs
                + scheduler_stats.num_skipped_waiting_reqs,
                kv_cache_usage=scheduler_stats.kv_cache_usage,
            ),
            read_iteration(scheduler_stats, iteration_stats),
        )

    def log_engine_initialized(self) -> None:
        pass  # nothing to log: the worker logs its own ready line

    def log(self) -> None:
        pass  # our load is published by the worker, not printed

    def record_sleep_state(self, is_awake: int, level: int) -> None:
        pass  # sleep mode is never used by this adapter


def _engine_args(config: VllmEngineConfig, events_endpoint: str) -> tuple[Any, Any]:
    """vLLM's AsyncEngineArgs for `config`, and its KV events config (None without prefix
    caching: no blocks are cached, so none are announced)."""
    from vllm.config import KVEventsConfig
    from vllm.engine.arg_utils import AsyncEngineArgs

    events = None
    if config.enable_prefix_caching:
        events = KVEventsConfig(
            enable_kv_cache_events=True, publisher="zmq", endpoint=events_endpoint
        )
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
        kv_transfer_config=None if config.connector is None else _transfer_config(config.connector),
        disable_log_stats=True,  # only our stat logger: no vLLM log lines or metrics
    )
    return args, events


def _kv_layout(vllm_config: Any, block_size: int) -> KvLayout:
    """The running engine's KV block layout, for the handles its prefill legs return."""
    model, parallel = vllm_config.model_config, vllm_config.parallel_config
    return KvLayout(
        num_layers=model.get_num_layers(parallel),
        block_size=block_size,
        num_kv_heads=model.get_num_kv_heads(parallel),
        head_dim=model.get_head_size(),
        dtype=str(model.dtype).removeprefix("torch."),
    )


def build_vllm_engine(config: VllmEngineConfig) -> VllmEngine:
    """Start vLLM (blocks for as long as its engine takes to start) and wrap it. Raises
    VllmNotInstalledError without vLLM, ValueError for settings vLLM refuses and
    RuntimeError when its engine fails to start."""
    check_vllm_installed()
    if config.connector is not None:
        check_nixl_installed()
    _bind_all_cpus()
    from vllm import SamplingParams
    from vllm.exceptions import VLLMClientError
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams
    from vllm.v1.engine.async_llm import AsyncLLM

    endpoint = f"ipc://{tempfile.gettempdir()}/armature-vllm-kv-{uuid.uuid4().hex[:12]}"
    args, events = _engine_args(config, endpoint)
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
    transfer = None
    if config.connector is not None:
        transfer = VllmTransfer(
            worker_id=config.connector.worker_id,
            layout=_kv_layout(vllm_config, info.block_size),
            lease_s=config.connector.lease_s,
        )

    def make_sampling(sampling: VllmSampling) -> Any:
        kwargs = dataclasses.asdict(sampling)
        structured = kwargs.pop("structured_outputs")
        if structured is not None:
            kwargs["structured_outputs"] = StructuredOutputsParams(**structured)
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
        transfer=transfer,
    )
    holder.append(engine)
    log.info(
        "vLLM engine ready: %d KV blocks of %d tokens, context %d",
        info.num_kv_blocks,
        info.block_size,
        info.max_model_len,
    )
    return engine


VLLM_POOLING_TYPES = {Pooling.MEAN: "MEAN", Pooling.LAST: "LAST", Pooling.CLS: "CLS"}


def _whole_prompt_batch(config: VllmEngineConfig) -> int | None:
    """The pooling runner prefills each prompt whole (no chunked prefill), so a batch must
    hold the longest prompt: at least the context (None: vLLM picks, from its context)."""
    if config.max_model_len is None:
        return None
    return max(config.max_num_batched_tokens or 0, config.max_model_len)


def build_vllm_embedding_engine(config: VllmEngineConfig, pooling: Pooling) -> VllmEmbeddingEngine:
    """Start vLLM's pooling runner over `config`'s model (its last hidden states pooled by
    `pooling`) and wrap it (`--task embed`). Raises as `build_vllm_engine`."""
    check_vllm_installed()
    _bind_all_cpus()
    from vllm.config import PoolerConfig
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.inputs import TokensPrompt
    from vllm.pooling_params import PoolingParams
    from vllm.v1.engine.async_llm import AsyncLLM

    args = AsyncEngineArgs(
        model=str(config.model_dir),
        runner="pooling",
        pooler_config=PoolerConfig(pooling_type=VLLM_POOLING_TYPES[pooling]),
        dtype=config.dtype,
        kv_cache_memory_bytes=config.kv_cache_bytes,
        num_gpu_blocks_override=config.num_kv_blocks,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=_whole_prompt_batch(config),
        max_model_len=config.max_model_len,
        enable_prefix_caching=False,  # a pooled prompt's KV is never reused
        seed=config.seed,
        enforce_eager=config.enforce_eager,
        disable_log_stats=True,
    )
    llm = AsyncLLM.from_engine_args(args)
    model_config = llm.vllm_config.model_config
    shape = EmbeddingShape(
        num_dimensions=model_config.get_hidden_size(),
        pooling=pooling,
        matryoshka_dimensions=read_matryoshka_dimensions(config.model_dir),
    )
    log.info(
        "vLLM pooling engine ready: %s pooling, context %d", pooling, model_config.max_model_len
    )
    return VllmEmbeddingEngine(
        llm,
        shape,
        vocab_size=model_config.get_vocab_size(),
        max_model_len=model_config.max_model_len,
        make_prompt=lambda token_ids: TokensPrompt(prompt_token_ids=token_ids),
        make_pooling=lambda: PoolingParams(task="embed"),
    )
