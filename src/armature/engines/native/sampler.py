"""Token sampling: greedy, temperature, min-p, top-k, top-p, per-request seeds, min_tokens,
logprobs, penalties and logit bias (penalties.py). As vLLM: min-p on the tempered
probabilities, then top-k and top-p.

Logprobs are the model's raw log-softmax (before penalties, temperature and truncation), as
OpenAI reports them and as vLLM does by default. Penalties are applied only to the rows of
requests that use them; a batch without any skips them. Greedy rows are decided in one
batched argmax; random rows each draw from their own generator, so a seeded request gives the
same tokens whatever it is batched with.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from armature.engines.native.penalties import PenaltyRow, apply_penalties
from armature.protocols.engine import SamplingParams, TokenLogprob

__all__ = ["SampleInput", "sample", "seeded_for"]


# Below this temperature, sampling is greedy: logits / temperature would overflow to inf and
# softmax would give NaNs (vLLM uses the same threshold).
MIN_SAMPLING_TEMPERATURE = 1e-5


@dataclass(frozen=True)
class SampleInput:
    params: SamplingParams
    generator: torch.Generator | None
    num_output_tokens: int
    blocked_token_ids: tuple[int, ...]  # EOS and stop ids while min_tokens is not yet reached
    token_ids: Sequence[int] = ()  # prompt + output so far (read by penalties only)
    num_prompt_tokens: int = 0


def seeded_for(generator: torch.Generator | None, seed: int, position: int) -> torch.Generator:
    """A request's own generator (`generator`, or a new one), seeded for its output token at
    `position`: each draw depends on the seed and the position alone, so the same seed draws
    the same tokens in any batch, and a request resumed after `position` tokens elsewhere
    (migrated, or decoded after a remote prefill) draws what it would have drawn on one
    worker (one generator's running state started over at the seed on each worker)."""
    if generator is None:
        generator = torch.Generator()
    generator.manual_seed((seed + position * _POSITION_STRIDE) % 2**64)
    return generator


_POSITION_STRIDE = 0x9E3779B97F4A7C15  # 2**64 over the golden ratio: positions far apart


def _truncate(logits: torch.Tensor, top_k: int, top_p: float, min_p: float = 0.0) -> torch.Tensor:
    """Mask logits [vocab] below min-p, outside top-k and outside the top-p nucleus to -inf."""
    if min_p > 0.0:  # p < min_p * p_max, in logits: below the best's + log(min_p)
        logits = logits.masked_fill(logits < logits.max() + math.log(min_p), float("-inf"))
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        cumulative = torch.cumsum(probs, dim=-1)
        remove = (cumulative - probs) >= top_p  # keep the token that crosses top_p
        # and always the most likely: a top_p below float32's smallest (~1e-45) compares as 0
        remove[0] = False
        sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
        logits = torch.empty_like(logits).scatter_(0, order, sorted_logits)
    return logits


def _logprobs(logprobs: torch.Tensor, token_id: int, num_top: int) -> TokenLogprob:
    top: list[tuple[int, float]] = []
    if num_top > 0:
        values, ids = torch.topk(logprobs, num_top)
        top = list(zip(ids.tolist(), values.tolist(), strict=True))
    return TokenLogprob(token_id, float(logprobs[token_id]), top)


def prompt_logprobs(logits: torch.Tensor, token_ids: list[int], num_top: int) -> list[TokenLogprob]:
    """Each row's logprob of the token that follows it (`token_ids`, one per row), with the
    `num_top` most likely tokens there: logits [rows, vocab] as the model gave them, no
    penalty, bias or mask."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    targets = torch.tensor(token_ids, dtype=torch.long, device=logprobs.device)
    chosen = logprobs.gather(1, targets[:, None])[:, 0].tolist()
    if num_top <= 0:
        return [TokenLogprob(t, lp, []) for t, lp in zip(token_ids, chosen, strict=True)]
    values, ids = torch.topk(logprobs, min(num_top, logprobs.shape[-1]), dim=-1)
    return [
        TokenLogprob(t, lp, list(zip(top_ids, top_values, strict=True)))
        for t, lp, top_ids, top_values in zip(
            token_ids, chosen, ids.tolist(), values.tolist(), strict=True
        )
    ]


def _penalized(logits: torch.Tensor, inputs: list[SampleInput]) -> torch.Tensor:
    """`logits` with the penalties of the rows that use any: `logits` itself when none does,
    penalized in place when no row wants (raw) logprobs, else a penalized copy."""
    rows = [
        PenaltyRow(row, item.params, item.token_ids, item.num_prompt_tokens)
        for row, item in enumerate(inputs)
        if item.params.uses_penalties
    ]
    if not rows:
        return logits
    keep_raw = any(item.params.logprobs is not None for item in inputs)
    out = logits.clone() if keep_raw else logits.contiguous()
    apply_penalties(out, rows)
    return out


def sample(
    logits: torch.Tensor, inputs: list[SampleInput]
) -> tuple[list[int], list[TokenLogprob | None]]:
    """logits: float32 [rows, vocab], one row per input -> (token ids, logprobs or None)."""
    assert logits.shape[0] == len(inputs)
    for row, item in enumerate(inputs):
        if item.blocked_token_ids:
            logits[row, list(item.blocked_token_ids)] = float("-inf")
    raw_logits, logits = logits, _penalized(logits, inputs)
    greedy_ids = torch.argmax(logits, dim=-1).tolist()
    tokens: list[int] = []
    for row, item in enumerate(inputs):
        p = item.params
        greedy = int(greedy_ids[row])
        # truncation keeps the most likely token, so a row whose best is not finite (every
        # token blocked) has nothing to draw from
        greedy_only = p.temperature < MIN_SAMPLING_TEMPERATURE or p.top_k == 1
        if greedy_only or not math.isfinite(float(logits[row, greedy])):
            tokens.append(greedy)
            continue
        scaled = _truncate(logits[row] / p.temperature, p.top_k, p.top_p, p.min_p)
        probs = torch.softmax(scaled, dim=-1)
        tokens.append(int(torch.multinomial(probs, 1, generator=item.generator).item()))
    out_logprobs: list[TokenLogprob | None] = [None] * len(inputs)
    rows_wanting = [row for row, item in enumerate(inputs) if item.params.logprobs is not None]
    if rows_wanting:
        logprobs = torch.log_softmax(raw_logits[rows_wanting], dim=-1)
        for i, row in enumerate(rows_wanting):
            num_top = inputs[row].params.logprobs or 0
            out_logprobs[row] = _logprobs(logprobs[i], tokens[row], num_top)
    return tokens, out_logprobs
