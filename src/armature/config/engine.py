"""What a worker runs: its engine and model, its own KV cache, and KV transfer between
prefill and decode workers."""

from __future__ import annotations

from dataclasses import dataclass

from armature.config.settings import setting
from armature.config.values import (
    int64,
    kv_blocks,
    lora_module,
    one_of,
    parse_bytes,
    positive_float,
    positive_int,
    transfer_backends,
)
from armature.protocols.embedding import Pooling, WorkerTask

__all__ = [
    "DEFAULT_BLOCK_SIZE_TOKENS",
    "DEFAULT_KV_PIN_TTL_S",
    "EngineConfig",
    "KvCacheConfig",
    "TransferConfig",
]

DEFAULT_BLOCK_SIZE_TOKENS = 16
DEFAULT_KV_PIN_TTL_S = 30.0


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """What model a worker runs, on which engine, with what batch limits."""

    model: str | None = setting(
        None,
        "local HF directory, ORG/NAME in the local HF cache, or omitted for the embedded "
        "SmolLM2-135M-Instruct",
    )
    engine: str = setting(
        "torch",
        "torch: the native PyTorch engine; mocker: the same scheduler and KV cache with a "
        "timing model instead of a model (no weights loaded); vllm: vLLM's engine (needs pip "
        "install 'armature[vllm]')",
    )
    served_model_name: str | None = setting(
        None, "name clients pass as `model` (default: derived from --model)"
    )
    speedup_ratio: float = setting(
        1.0,
        "mocker only: divide every simulated time (steps, KV transfers, lower-tier loads) by this",
        parse=positive_float,
    )
    timing_profile: str | None = setting(
        None,
        "mocker only: step times from this profile of a real engine (`armature profile "
        "--output`) instead of the default H100-class model",
    )
    dtype: str = setting(
        "auto",
        "weights and KV dtype; auto = bfloat16 where supported",
        choices=("auto", "float32", "bfloat16", "float16"),
    )
    device: str = setting(
        "auto", "auto = cuda where present, else cpu", choices=("auto", "cpu", "cuda")
    )
    block_size_tokens: int | None = setting(
        None,
        f"tokens per KV block (default: {DEFAULT_BLOCK_SIZE_TOKENS}; vllm: its platform's, 128 "
        "on CPU, where it must be a multiple of 32)",
        flag="block-size",
        parse=positive_int,
    )
    enforce_eager: bool = setting(
        False,
        "vllm only: skip torch.compile (vLLM then starts in ~45 s instead of ~2 min on 2 CPU "
        "cores, and runs slower)",
    )
    max_num_seqs: int = setting(64, "requests running at once", parse=positive_int)
    max_num_batched_tokens: int = setting(
        1024, "tokens per engine step (prefill chunk budget)", parse=positive_int
    )
    max_model_len_tokens: int | None = setting(
        None, "context length (default: the model's)", flag="max-model-len", parse=positive_int
    )
    seed: int = setting(0, "seed for requests that bring none", parse=int64)
    task: WorkerTask = setting(
        WorkerTask.GENERATE,
        "generate: text (chat and completions); embed: vectors of the prompts "
        "(/v1/embeddings; the mocker's are pseudo-embeddings)",
        parse=one_of(WorkerTask),
        choices=tuple(WorkerTask),
    )
    pooling: Pooling = setting(
        Pooling.LAST,
        "with --task embed: how the last hidden states become one vector (L2-normalised): "
        "mean over the tokens, the last token's, or the first (cls) token's",
        parse=one_of(Pooling),
        choices=tuple(Pooling),
    )
    cache_dir: str | None = setting(
        None, "where the default model is converted (default: the XDG cache)"
    )
    lora_modules: tuple[str, ...] = setting(
        (),
        "serve the LoRA adapter in directory DIR (PEFT layout) as model NAME, over the base "
        "model (repeatable; --engine torch, or mocker by name only). More load at runtime "
        "through POST /v1/load_lora_adapter",
        flag="lora",
        parse=lora_module,
        repeat=True,
    )

    def get_lora_modules(self) -> list[tuple[str, str]]:
        """(name, directory) of each --lora adapter, in order."""
        return [
            (name.strip(), path.strip())
            for name, _, path in (m.partition("=") for m in self.lora_modules)
        ]

    def get_block_size_tokens(self) -> int:
        """The block size a native or mocker engine uses."""
        return self.block_size_tokens or DEFAULT_BLOCK_SIZE_TOKENS


@dataclass(frozen=True, kw_only=True)
class KvCacheConfig:
    """The engine's own KV cache (G1)."""

    kv_cache_bytes: int = setting(
        1 << 30, "KV cache capacity in bytes (e.g. 2GiB)", parse=parse_bytes
    )
    num_kv_blocks: int | None = setting(
        None, "KV cache capacity in blocks (overrides --kv-cache-bytes)", parse=kv_blocks
    )
    enable_prefix_caching: bool = setting(
        True, "disable prefix caching", flag="no-prefix-caching", negate=True
    )


@dataclass(frozen=True, kw_only=True)
class TransferConfig:
    """KV transfer between prefill and decode workers."""

    kv_transfer_backends: tuple[str, ...] = setting(
        ("shm", "tcp"),
        "KV transfer backends to offer and use, best first: shm (same host, CPU KV cache), "
        "nixl (pip install 'armature[nixl]'; UCX, any host) and tcp (any host; always on: it "
        "also carries the control messages)",
        parse=transfer_backends,
    )
    kv_pin_ttl_s: float = setting(
        DEFAULT_KV_PIN_TTL_S,
        "a prefill worker frees a prompt's pinned KV blocks after this long if no decode "
        "worker released them",
        parse=positive_float,
    )
