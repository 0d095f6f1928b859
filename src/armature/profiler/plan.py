"""Which points a profile measures, and whether the engine can run them: pure.

A decode point of b requests over c context tokens runs b prompts of c tokens once (to cache
them), then again with `1 + DECODE_SKIP_TOKENS + n` output tokens: the first token comes from
the cached prompt (a prefill of the last partial block only), the next DECODE_SKIP_TOKENS
inter-token latencies are left out (requests admitted a step apart settle), and the n after
them are timed. The step giving token k (k >= 2) attends over c + k - 1 tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from armature.config import ProfileSweepConfig
from armature.errors import ConfigError

__all__ = [
    "DECODE_SKIP_TOKENS",
    "EngineLimits",
    "check_sweep",
    "check_sweep_flags",
    "decode_context_tokens",
    "decode_max_tokens",
    "prefill_context_points",
]

DECODE_SKIP_TOKENS = 2


@dataclass(frozen=True)
class EngineLimits:
    """What the built engine can hold (from its `EngineInfo` and batch settings)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len_tokens: int
    block_size_tokens: int
    num_kv_blocks: int
    kv_cache_flag: str = "--kv-cache-bytes"  # the flag that sized the cache

    @property
    def num_kv_tokens(self) -> int:
        return self.num_kv_blocks * self.block_size_tokens


def decode_max_tokens(sweep: ProfileSweepConfig) -> int:
    """Output tokens of a timed decode request."""
    return 1 + DECODE_SKIP_TOKENS + sweep.decode_output_tokens


def decode_context_tokens(prompt_tokens: int, sweep: ProfileSweepConfig) -> int:
    """The mean context of the timed decode steps: tokens k = 2 + skip .. 1 + skip + n, each
    over prompt + k - 1 tokens (rounded down)."""
    return prompt_tokens + DECODE_SKIP_TOKENS + (sweep.decode_output_tokens + 1) // 2


def prefill_context_points(
    sweep: ProfileSweepConfig, limits: EngineLimits
) -> list[tuple[int, int]]:
    """(input tokens, cached tokens) of each prefill timed after a cached prefix: every input
    length within the step budget after each cached length, rounded down to whole blocks
    (those of less than a block are left out)."""
    bs = limits.block_size_tokens
    contexts = sorted({c // bs * bs for c in sweep.prefill_context_tokens if c >= bs})
    lengths = [t for t in sweep.prefill_input_tokens if t <= limits.max_num_batched_tokens]
    return [(t, c) for c in contexts for t in lengths]


def _blocks(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def check_sweep_flags(sweep: ProfileSweepConfig, max_num_seqs: int, budget_tokens: int) -> None:
    """The part of `check_sweep` the flags settle alone (the batch limits), so that a mistake
    in them is told before the engine and its model are built. ConfigError as there."""
    _check_budget(sweep, budget_tokens)
    _check_decode_requests(sweep, max_num_seqs)


def _check_budget(sweep: ProfileSweepConfig, budget_tokens: int) -> None:
    if sum(1 for t in sweep.prefill_input_tokens if t <= budget_tokens) < 2:
        raise ConfigError(
            f"--prefill-input-tokens needs at least two lengths within --max-num-batched-tokens "
            f"({budget_tokens})"
        )


def _check_decode_requests(sweep: ProfileSweepConfig, max_num_seqs: int) -> None:
    most = max(sweep.decode_requests)
    if most > max_num_seqs:
        raise ConfigError(f"--decode-requests {most} is above --max-num-seqs {max_num_seqs}")


def check_sweep(sweep: ProfileSweepConfig, limits: EngineLimits) -> None:
    """ConfigError naming the first point the engine cannot run, or a sweep that gives the
    timing model too little (fewer than two input lengths within the step budget)."""
    _check_budget(sweep, limits.max_num_batched_tokens)
    longest = max(sweep.prefill_input_tokens)
    if longest + 1 > limits.max_model_len_tokens:
        raise ConfigError(
            f"--prefill-input-tokens {longest} does not fit the context of "
            f"{limits.max_model_len_tokens} tokens"
        )
    batch = max(1, sweep.prefill_batch_requests)
    if batch * _blocks(longest + 1, limits.block_size_tokens) > limits.num_kv_blocks:
        raise ConfigError(
            f"{batch} prompts of {longest} tokens do not fit the KV cache "
            f"({limits.num_kv_tokens} tokens): lower --prefill-batch-requests or raise "
            f"{limits.kv_cache_flag}"
        )
    bs = limits.block_size_tokens
    for context in sweep.prefill_context_tokens:
        if 0 < context < bs:
            raise ConfigError(
                f"--prefill-context-tokens {context} is less than one block ({bs} tokens): a "
                "cached prefix is whole blocks (0: none)"
            )
    for length, context in prefill_context_points(sweep, limits):
        if context + length + 1 > limits.max_model_len_tokens:
            raise ConfigError(
                f"--prefill-context-tokens {context} (in whole blocks) plus "
                f"--prefill-input-tokens {length} does not fit the context of "
                f"{limits.max_model_len_tokens} tokens"
            )
        if _blocks(context + length + 1, limits.block_size_tokens) > limits.num_kv_blocks:
            raise ConfigError(
                f"a prompt of {context} cached and {length} new tokens does not fit the KV "
                f"cache ({limits.num_kv_tokens} tokens): lower --prefill-context-tokens or "
                f"raise {limits.kv_cache_flag}"
            )
    _check_decode_requests(sweep, limits.max_num_seqs)
    most = max(sweep.decode_requests)
    context = max(sweep.decode_context_tokens)
    length = context + decode_max_tokens(sweep)
    if length > limits.max_model_len_tokens:
        raise ConfigError(
            f"--decode-context-tokens {context} plus {decode_max_tokens(sweep)} output tokens "
            f"does not fit the context of {limits.max_model_len_tokens} tokens"
        )
    if most * _blocks(length, limits.block_size_tokens) > limits.num_kv_blocks:
        raise ConfigError(
            f"{most} requests of {length} tokens do not fit the KV cache "
            f"({limits.num_kv_tokens} tokens): lower --decode-requests or "
            f"--decode-context-tokens, or raise {limits.kv_cache_flag}"
        )
