"""The native engine's frozen configuration, built once at startup and passed down."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from armature.config import (
    DEFAULT_BLOCK_SIZE_TOKENS,
    DEFAULT_KV_PIN_TTL_S,
    EngineConfig,
    KvCacheConfig,
)
from armature.config.values import MAX_KV_BLOCKS
from armature.errors import ConfigError
from armature.model.arch import ModelArch

__all__ = ["DTYPE_BYTES", "NativeEngineConfig"]

# the defaults of tests and tools that build a native engine directly: the config tree's
_ENGINE, _KV = EngineConfig(), KvCacheConfig()
# the dtypes the engine computes in, by name, and the bytes of one element (`model.dtypes`
# gives their torch dtypes; this module stays free of torch, for the mocker)
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class NativeEngineConfig:
    """The native engine's settings, resolved: a model directory, a dtype's name, a device."""

    model_dir: Path
    dtype: str = "bfloat16"  # a key of DTYPE_BYTES
    device: str = "cpu"
    block_size: int = DEFAULT_BLOCK_SIZE_TOKENS
    num_kv_blocks: int | None = None  # wins over kv_cache_bytes when set
    kv_cache_bytes: int = _KV.kv_cache_bytes
    max_num_seqs: int = _ENGINE.max_num_seqs
    max_num_batched_tokens: int = _ENGINE.max_num_batched_tokens
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    enable_prefix_caching: bool = _KV.enable_prefix_caching
    seed: int = _ENGINE.seed  # seeds requests that bring no seed of their own
    shared_kv_cache: bool = False  # KV cache in shared memory (CPU; same-host KV transfer)
    kv_pin_ttl_s: float = (
        DEFAULT_KV_PIN_TTL_S  # a prefill's pinned blocks are freed after this if unreleased
    )

    def __post_init__(self) -> None:
        if self.block_size <= 0 or self.max_num_seqs <= 0 or self.max_num_batched_tokens <= 0:
            raise ConfigError("block_size, max_num_seqs and max_num_batched_tokens must be > 0")
        if self.num_kv_blocks is not None and not 0 < self.num_kv_blocks <= MAX_KV_BLOCKS:
            raise ConfigError(f"num_kv_blocks must be in 1..{MAX_KV_BLOCKS:,}")
        if self.kv_cache_bytes <= 0:
            raise ConfigError("kv_cache_bytes must be > 0")
        if self.dtype not in DTYPE_BYTES:
            choices = ", ".join(DTYPE_BYTES)
            raise ConfigError(f"unknown dtype {self.dtype!r}; choose one of {choices}")

    def get_num_kv_blocks(self, arch: ModelArch) -> int:
        """`num_kv_blocks`, else as many blocks of `arch`'s KV as `kv_cache_bytes` holds."""
        if self.num_kv_blocks is not None:
            return self.num_kv_blocks
        per_block = arch.kv_bytes_per_token(DTYPE_BYTES[self.dtype]) * self.block_size
        num_blocks = self.kv_cache_bytes // per_block
        if num_blocks < 1:
            raise ConfigError(
                f"--kv-cache-bytes {self.kv_cache_bytes:,} holds no KV block of this model "
                f"({per_block:,} bytes each)"
            )
        if num_blocks > MAX_KV_BLOCKS:
            raise ConfigError(
                f"--kv-cache-bytes {self.kv_cache_bytes:,} makes {num_blocks:,} KV blocks of "
                f"{per_block:,} bytes, more than the {MAX_KV_BLOCKS:,} a KV cache holds"
            )
        return num_blocks
