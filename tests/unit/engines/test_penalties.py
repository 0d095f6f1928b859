"""Penalty math on exact tensors: bias, repetition, frequency, presence, their order, and how
the sampler applies them (only to rows that use them; logprobs stay raw)."""

from __future__ import annotations

import math

import torch

from armature.engines.native.penalties import PenaltyRow, apply_penalties
from armature.engines.native.sampler import SampleInput, sample
from armature.protocols.engine import SamplingParams

LOGITS = [2.0, -1.0, 0.5, 0.0, 3.0]


def row(prompt: list[int], output: list[int], index: int = 0, **kw: object) -> PenaltyRow:
    params = SamplingParams(max_tokens=1, **kw)  # type: ignore[arg-type]
    return PenaltyRow(index, params, prompt + output, len(prompt))


def apply(logits: torch.Tensor, rows: list[PenaltyRow]) -> torch.Tensor:
    """A penalized copy of `logits`."""
    out = logits.clone()
    apply_penalties(out, rows)
    return out


def test_presence_once_and_frequency_per_occurrence_over_the_output_only() -> None:
    logits = torch.tensor([LOGITS])
    # token 1 is in the prompt only: untouched; token 4 twice, token 2 once in the output
    out = apply(logits, [row([1], [4, 4, 2], presence_penalty=0.5, frequency_penalty=0.25)])
    assert out.tolist() == [[2.0, -1.0, -0.25, 0.0, 2.0]]


def test_negative_presence_and_frequency_raise_seen_tokens() -> None:
    out = apply(
        torch.tensor([LOGITS]), [row([], [1, 1], presence_penalty=-1.0, frequency_penalty=-0.5)]
    )
    assert out.tolist() == [[2.0, 1.0, 0.5, 0.0, 3.0]]


def test_repetition_divides_positive_and_multiplies_negative_over_prompt_and_output() -> None:
    out = apply(torch.tensor([LOGITS]), [row([1, 3], [0], repetition_penalty=2.0)])
    assert out.tolist() == [[1.0, -2.0, 0.5, 0.0, 3.0]]


def test_repetition_below_one_favours_seen_tokens() -> None:
    out = apply(torch.tensor([LOGITS]), [row([4], [1], repetition_penalty=0.5)])
    assert out.tolist() == [[2.0, -0.5, 0.5, 0.0, 6.0]]


def test_a_vanishing_repetition_penalty_stays_finite() -> None:
    """1e-320 is 0 in float32: seen positive logits go to the dtype's largest value (not
    inf, whose softmax is NaN), a seen -inf (a masked token) stays -inf (not -inf x 0)."""
    logits = torch.tensor([[5.0, -1.0, 0.5, -math.inf, 3.0]])
    out = apply(logits, [row([0, 4, 3], [1], repetition_penalty=1e-320)])
    largest, tiny = torch.finfo(torch.float32).max, torch.finfo(torch.float32).tiny
    three_over_tiny = (torch.tensor(3.0) / tiny).item()  # 2.6e38: in range
    assert out.tolist() == [[largest, -tiny, 0.5, -math.inf, three_over_tiny]]
    assert not torch.softmax(out, dim=-1).isnan().any()


def test_logit_bias_adds_per_token() -> None:
    out = apply(torch.tensor([LOGITS]), [row([0], [], logit_bias=((0, -100.0), (2, 1.5)))])
    assert out.tolist() == [[-98.0, -1.0, 2.0, 0.0, 3.0]]


def test_bias_comes_before_repetition() -> None:
    # bias first: -1 + 2 = 1 > 0, then divided by 2 -> 0.5 (the other order would give 0.0)
    out = apply(
        torch.tensor([LOGITS]),
        [row([1], [], logit_bias=((1, 2.0),), repetition_penalty=2.0)],
    )
    assert out.tolist() == [[2.0, 0.5, 0.5, 0.0, 3.0]]


def test_rows_keep_their_own_penalties_and_tokens() -> None:
    logits = torch.tensor([LOGITS, LOGITS, LOGITS, LOGITS])
    out = apply(
        logits,
        [
            row([], [4], 0, presence_penalty=1.0),
            row([0], [2, 2], 1, frequency_penalty=1.0),
            row([4], [], 3, repetition_penalty=3.0),
        ],
    )
    assert out.tolist() == [
        [2.0, -1.0, 0.5, 0.0, 2.0],
        [2.0, -1.0, -1.5, 0.0, 3.0],
        LOGITS,  # a row not listed is untouched
        [2.0, -1.0, 0.5, 0.0, 1.0],
    ]


def test_blocked_tokens_stay_blocked() -> None:
    logits = torch.tensor([[float("-inf"), 1.0, 0.0]])
    out = apply(
        logits,
        [row([0], [0], repetition_penalty=2.0, frequency_penalty=-2.0, logit_bias=((0, 100.0),))],
    )
    assert out[0, 0].item() == float("-inf")
    assert out[0, 1:].tolist() == [1.0, 0.0]


def item(prompt: list[int], output: list[int], **kw: object) -> SampleInput:
    params = SamplingParams(max_tokens=1, temperature=0.0, **kw)  # type: ignore[arg-type]
    return SampleInput(params, None, len(output), (), prompt + output, len(prompt))


def test_sampler_penalizes_only_the_rows_that_ask() -> None:
    logits = torch.tensor([LOGITS, LOGITS])
    tokens, _ = sample(logits, [item([], [4], presence_penalty=2.0), item([], [4])])
    assert tokens == [0, 4]


def test_an_empty_output_has_nothing_to_count() -> None:
    out = apply(torch.tensor([LOGITS]), [row([4, 4], [], presence_penalty=1.0)])
    assert out.tolist() == [LOGITS]


def test_sampler_reports_raw_logprobs_of_the_penalized_choice() -> None:
    logits = torch.tensor([LOGITS])
    tokens, logprobs = sample(logits.clone(), [item([], [], logit_bias=((1, 100.0),), logprobs=1)])
    assert tokens == [1]
    raw = torch.log_softmax(logits[0], dim=-1)
    [lp] = logprobs
    assert lp is not None and lp.token_id == 1
    assert math.isclose(lp.logprob, float(raw[1]), rel_tol=1e-6)
    assert lp.top == [(4, float(raw[4]))]


def test_sampler_without_penalties_leaves_logits_alone() -> None:
    logits = torch.tensor([LOGITS])
    tokens, _ = sample(logits, [item([4], [4])])
    assert tokens == [4]
    assert logits.tolist() == [LOGITS]
