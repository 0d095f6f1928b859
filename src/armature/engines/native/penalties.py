"""Logit penalties for a batch, vectorized: logit bias, repetition, frequency and presence.

Applied in vLLM's order (bias, then repetition over prompt + output, then frequency and
presence over the output), to the rows of the requests that use any of them:

    logits[t] += bias[t]
    logits[t] = logits[t] / r  if logits[t] > 0 else logits[t] * r     t in prompt or output
    logits[t] -= frequency * count[t] + presence * (count[t] > 0)      count: in the output

Sparse: each penalty touches only the (row, token) entries it changes, found through flat
indices `row * vocab + token` over the whole batch, so its cost grows with the tokens seen,
not with rows x vocab. Pure: no state outlives the call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from armature.protocols.engine import SamplingParams

__all__ = ["PenaltyRow", "apply_penalties"]


class PenaltyRow(NamedTuple):
    row: int  # in the batch's logits
    params: SamplingParams
    token_ids: Sequence[int]  # prompt + output so far
    num_prompt_tokens: int


def _flat_ids(
    rows: Sequence[PenaltyRow], vocab_size: int, output_only: bool, device: torch.device
) -> torch.Tensor:
    """row * vocab + token for every token of each row (its output only, or all of it)."""
    parts = [
        torch.as_tensor(r.token_ids[r.num_prompt_tokens if output_only else 0 :], dtype=torch.long)
        + r.row * vocab_size
        for r in rows
    ]
    return torch.cat(parts).to(device)


def _per_row(
    values: dict[int, float], num_rows: int, default: float, like: torch.Tensor
) -> torch.Tensor:
    out = torch.full((num_rows,), default, dtype=like.dtype)
    for row, value in values.items():
        out[row] = value
    return out.to(like.device)


def apply_penalties(logits: torch.Tensor, rows: Sequence[PenaltyRow]) -> None:
    """Penalize rows `rows[i].row` of `logits` [batch, vocab] (contiguous) in place."""
    assert logits.is_contiguous()
    num_rows, vocab_size = logits.shape
    flat = logits.view(-1)
    bias = [(r.row * vocab_size + t, b) for r in rows for t, b in r.params.logit_bias]
    if bias:
        bias_index, bias_values = zip(*bias, strict=True)
        flat.index_add_(
            0,
            torch.tensor(bias_index, device=flat.device),
            torch.tensor(bias_values, dtype=flat.dtype, device=flat.device),
        )
    repeating = [r for r in rows if r.params.repetition_penalty != 1.0]
    if repeating:
        seen = torch.unique(_flat_ids(repeating, vocab_size, False, flat.device))
        by_row = {r.row: r.params.repetition_penalty for r in repeating}
        # a penalty below the dtype's smallest normal number (1e-320: 0 in float32) is that
        # number, and a logit it lifts past the dtype's range its largest value: never an inf
        # (softmax's NaN) or a masked token's -inf times 0
        finfo = torch.finfo(flat.dtype)
        penalty = _per_row(by_row, num_rows, 1.0, flat)[seen // vocab_size].clamp(min=finfo.tiny)
        values = flat[seen]
        raised = (values / penalty).clamp(max=finfo.max)
        flat[seen] = torch.where(values > 0, raised, values * penalty)
    counting = [r for r in rows if r.params.frequency_penalty or r.params.presence_penalty]
    if counting:
        output, counts = torch.unique(
            _flat_ids(counting, vocab_size, True, flat.device), return_counts=True
        )
        if output.numel():
            row_of = output // vocab_size
            frequency = _per_row(
                {r.row: r.params.frequency_penalty for r in counting}, num_rows, 0.0, flat
            )
            presence = _per_row(
                {r.row: r.params.presence_penalty for r in counting}, num_rows, 0.0, flat
            )
            flat.index_add_(0, output, -(frequency[row_of] * counts + presence[row_of]))
