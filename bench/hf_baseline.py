"""The transformers baselines: `generate` one prompt at a time, and static left-padded batches.

Both are greedy and fixed-length (min_new_tokens = max_new_tokens), like the engine runs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from bench.harness import RunResult

__all__ = ["load_hf_model", "run_sequential", "run_static_batches"]


def load_hf_model(model_dir: Path, dtype: torch.dtype) -> Any:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype)
    model.eval()
    return model


def _pad_token_id(model: Any) -> int:
    config = model.generation_config
    token = config.pad_token_id if config.pad_token_id is not None else config.eos_token_id
    return int(token[0] if isinstance(token, list) else token)


@torch.inference_mode()
def _generate(model: Any, batch: Sequence[list[int]], max_tokens: int) -> int:
    """One left-padded `generate` call; returns the number of new tokens."""
    pad = _pad_token_id(model)
    width = max(len(p) for p in batch)
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch], dtype=torch.long)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], dtype=torch.long)
    out = model.generate(
        input_ids=input_ids,
        attention_mask=mask,
        max_new_tokens=max_tokens,
        min_new_tokens=max_tokens,
        do_sample=False,
        pad_token_id=pad,
    )
    num_new = out.shape[1] - width
    assert num_new == max_tokens, (num_new, max_tokens)
    return num_new * len(batch)


def run_sequential(model: Any, prompts: Sequence[list[int]], max_tokens: int) -> RunResult:
    """`generate` with batch 1, one prompt after another (no padding, no mask zeros)."""
    _generate(model, [prompts[0][:16]], 4)  # warm-up, untimed
    started_s = time.perf_counter()
    num_tokens = sum(_generate(model, [p], max_tokens) for p in prompts)
    return RunResult(len(prompts), num_tokens, time.perf_counter() - started_s)


def run_static_batches(
    model: Any, prompts: Sequence[list[int]], batch_size: int, max_tokens: int
) -> RunResult:
    """Prompts in consecutive groups of `batch_size`, each group one left-padded `generate`
    call that runs until every row has max_tokens new tokens (no refill: static batching)."""
    _generate(model, [p[:16] for p in prompts[:batch_size]], 4)  # warm-up, untimed
    started_s = time.perf_counter()
    num_tokens = 0
    for start in range(0, len(prompts), batch_size):
        num_tokens += _generate(model, prompts[start : start + batch_size], max_tokens)
    return RunResult(len(prompts), num_tokens, time.perf_counter() - started_s)
