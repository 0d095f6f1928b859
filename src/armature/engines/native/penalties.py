"""Logit penalties for a batch, vectorized: logit bias, repetition, frequency and presence.

Applied in vLLM's order (bias, then repetition over prompt + output, then frequency and
presence over the output), to the rows of the requests that use any of them:

    logits[t] += bias[t]
    logits[t] = logits[t] / r  if logits[t] > 0 else logits[t] * r     t in prompt or output
    logits[t] -= frequency * count[t] + presence * (count[t] > 0)      count: in the output

Pure: tensors in, tensors out. Each step rebuilds the counts from the token ids (one scatter
per batch), so no state outlives the step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from armature.protocols.engine import SamplingParams

__all__ = ["PenaltyRow", "apply_penalties"]


class PenaltyRow(NamedTuple):
    params: SamplingParams
    token_ids: Sequence[int]  # prompt + output so far
    num_prompt_tokens: int


def _token_counts(
    rows: Sequence[Sequence[int]], vocab_size: int, device: torch.device
) -> torch.Tensor:
    """int32 [len(rows), vocab]: how often each token id occurs in each row."""
    width = max((len(r) for r in rows), default=0)
    # pad with an extra column (vocab_size) that is dropped after counting
    ids = torch.full((len(rows), max(1, width)), vocab_size, dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            ids[i, : len(r)] = torch.as_tensor(r, dtype=torch.long)
    counts = torch.zeros((len(rows), vocab_size + 1), dtype=torch.int32)
    counts.scatter_add_(1, ids, torch.ones_like(ids, dtype=torch.int32))
    return counts[:, :vocab_size].to(device)


def _column(values: list[float], like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(values, dtype=like.dtype, device=like.device).unsqueeze(1)


def apply_penalties(logits: torch.Tensor, rows: Sequence[PenaltyRow]) -> torch.Tensor:
    """logits [len(rows), vocab] -> new penalized logits (the input is not changed)."""
    assert logits.shape[0] == len(rows)
    out = logits.clone()
    vocab_size = logits.shape[1]
    bias = [(i, t, b) for i, r in enumerate(rows) for t, b in r.params.logit_bias]
    if bias:
        row_ids, token_ids, values = zip(*bias, strict=True)
        index = (torch.tensor(row_ids), torch.tensor(token_ids))
        out.index_put_(
            tuple(x.to(out.device) for x in index),
            torch.tensor(values, dtype=out.dtype, device=out.device),
            accumulate=True,
        )
    repetition = [r.params.repetition_penalty for r in rows]
    frequency = [r.params.frequency_penalty for r in rows]
    presence = [r.params.presence_penalty for r in rows]
    uses_repetition = any(p != 1.0 for p in repetition)
    if not (uses_repetition or any(frequency) or any(presence)):
        return out
    outputs = [r.token_ids[r.num_prompt_tokens :] for r in rows]
    output_counts = _token_counts(outputs, vocab_size, out.device)
    if uses_repetition:
        prompts = [r.token_ids[: r.num_prompt_tokens] for r in rows]
        seen = (_token_counts(prompts, vocab_size, out.device) > 0) | (output_counts > 0)
        penalty = torch.where(seen, _column(repetition, out), 1.0)
        out = torch.where(out > 0, out / penalty, out * penalty)
    out -= _column(frequency, out) * output_counts + _column(presence, out) * (output_counts > 0)
    return out
