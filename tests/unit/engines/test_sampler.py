"""Sampler: greedy, temperature, min-p, top-k, top-p, seeds, blocked tokens, logprobs."""

from __future__ import annotations

import math

import pytest
import torch

from armature.engines.native.sampler import SampleInput, sample
from armature.protocols.engine import SamplingParams


def item(seed: int | None = None, blocked: tuple[int, ...] = (), **kw: object) -> SampleInput:
    params = SamplingParams(max_tokens=1, seed=seed, **kw)  # type: ignore[arg-type]
    generator = None
    if params.temperature > 0:
        generator = torch.Generator()
        generator.manual_seed(seed if seed is not None else 0)
    return SampleInput(params, generator, 0, blocked)


def test_greedy_takes_argmax_per_row() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0], [5.0, 0.0, 1.0]])
    tokens, logprobs = sample(logits, [item(temperature=0.0), item(temperature=0.0)])
    assert tokens == [1, 0]
    assert logprobs == [None, None]


def test_blocked_tokens_are_never_chosen() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0]])
    tokens, _ = sample(logits, [item(temperature=0.0, blocked=(1,))])
    assert tokens == [2]


def test_top_k_one_is_greedy_even_with_temperature() -> None:
    logits = torch.tensor([[0.0, 3.0, 2.9]])
    for seed in range(20):
        tokens, _ = sample(logits.clone(), [item(seed=seed, temperature=1.0, top_k=1)])
        assert tokens == [1]


def test_top_k_limits_candidates() -> None:
    logits = torch.tensor([[0.0, 1.0, 1.0, 1.0, -1.0]])
    seen = set()
    for seed in range(200):
        tokens, _ = sample(logits.clone(), [item(seed=seed, temperature=5.0, top_k=3)])
        seen.add(tokens[0])
    assert seen == {1, 2, 3}


def test_min_p_drops_tokens_below_its_share_of_the_best() -> None:
    """min_p 0.4 over [0.5, 0.3, 0.15, 0.05]: 0.15 and 0.05 are below 0.4 x 0.5, so the
    draws see only the first two; at temperature 2 the tempered shares ~[0.38, 0.29,
    0.21, 0.12] keep three (0.21 >= 0.4 x 0.38; vLLM's order: min-p after temperature)."""
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    for temperature, kept in ((1.0, {0, 1}), (2.0, {0, 1, 2})):
        seen = set()
        for seed in range(300):
            draw = item(seed=seed, temperature=temperature, min_p=0.4)
            seen.add(sample(logits.clone(), [draw])[0][0])
        assert seen == kept, temperature
    seen = {sample(logits.clone(), [item(seed=s, temperature=1.0)])[0][0] for s in range(300)}
    assert seen == {0, 1, 2, 3}  # off by default


def test_top_p_keeps_the_smallest_nucleus() -> None:
    # probabilities ~ [0.64, 0.24, 0.09, 0.03]: top_p 0.7 keeps the first two
    logits = torch.log(torch.tensor([[0.64, 0.24, 0.09, 0.03]]))
    seen = set()
    for seed in range(300):
        tokens, _ = sample(logits.clone(), [item(seed=seed, temperature=1.0, top_p=0.7)])
        seen.add(tokens[0])
    assert seen == {0, 1}


@pytest.mark.parametrize("top_p", [1e-46, 1e-300, 5e-324])
def test_top_p_below_float32s_smallest_keeps_the_most_likely(top_p: float) -> None:
    # in float32 such a top_p is 0, where every token's mass before it is >= it: the most
    # likely token stays (before, every token was masked and the draw raised on NaNs)
    logits = torch.log(torch.tensor([[0.24, 0.64, 0.09, 0.03]]))
    for seed in range(20):
        tokens, _ = sample(logits.clone(), [item(seed=seed, temperature=1.0, top_p=top_p)])
        assert tokens == [1]


def test_a_row_with_every_token_blocked_draws_nothing_and_takes_the_argmax() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0], [0.0, 3.0, 1.0]])
    tokens, _ = sample(
        logits,
        [item(seed=1, temperature=1.0, blocked=(0, 1, 2)), item(seed=1, temperature=1.0, top_k=1)],
    )
    assert tokens == [0, 1]  # the first row: argmax over all -inf, index 0; no NaN draw


def test_same_seed_same_tokens_regardless_of_batch_neighbours() -> None:
    logits = torch.randn(1, 1000, generator=torch.Generator().manual_seed(1))
    alone = [sample(logits.clone(), [item(seed=42, temperature=1.0)])[0][0] for _ in range(3)]
    batched_logits = torch.cat([torch.randn(2, 1000), logits])
    batched = sample(
        batched_logits,
        [item(seed=1, temperature=1.0), item(temperature=0.0), item(seed=42, temperature=1.0)],
    )[0][2]
    assert alone == [alone[0]] * 3
    assert batched == alone[0]


def test_different_seeds_differ() -> None:
    logits = torch.zeros(1, 1000)
    draws = {sample(logits.clone(), [item(seed=s, temperature=1.0)])[0][0] for s in range(10)}
    assert len(draws) > 5


def test_logprobs_are_raw_log_softmax_with_top_alternatives() -> None:
    logits = torch.tensor([[1.0, 2.0, 3.0, 0.0]])
    tokens, logprobs = sample(logits, [item(temperature=0.0, logprobs=2)])
    assert tokens == [2]
    lp = logprobs[0]
    assert lp is not None
    expected = torch.log_softmax(torch.tensor([1.0, 2.0, 3.0, 0.0]), dim=-1)
    assert lp.token_id == 2
    assert math.isclose(lp.logprob, float(expected[2]), rel_tol=1e-6)
    assert [t for t, _ in lp.top] == [2, 1]
    assert math.isclose(lp.top[1][1], float(expected[1]), rel_tol=1e-6)


def test_logprobs_zero_gives_only_the_sampled_token() -> None:
    _, logprobs = sample(torch.tensor([[1.0, 2.0]]), [item(temperature=0.0, logprobs=0)])
    assert logprobs[0] is not None and logprobs[0].top == []
