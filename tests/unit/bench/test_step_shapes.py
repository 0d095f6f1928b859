"""bench.step_shapes: the token counts it picks, and the prompt step it times."""

from __future__ import annotations

from pathlib import Path

import pytest

from armature.engines.native.config import NativeEngineConfig
from bench.step_shapes import SWEPT_TOKENS, PromptSteps, first_over_repeat, pick_lengths


def test_lengths_are_new_distinct_and_within_the_step_budget() -> None:
    rounds = pick_lengths(24, 3, seed=0)
    assert [len(r) for r in rounds] == [24, 24, 24]
    every = [n for r in rounds for n in r]
    assert len(set(every)) == 72
    assert all(17 <= n <= 255 and n not in SWEPT_TOKENS for n in every)
    assert rounds == pick_lengths(24, 3, seed=0)
    assert rounds != pick_lengths(24, 3, seed=1)
    with pytest.raises(ValueError, match="only 236 to pick from"):
        pick_lengths(100, 3, seed=0)


def test_a_prompt_step_is_timed_once_per_prompt(tiny_llama_dir: Path) -> None:
    config = NativeEngineConfig(
        model_dir=tiny_llama_dir, dtype="float32", device="cpu", max_num_batched_tokens=256
    )
    steps = PromptSteps(config, seed=0)
    timed = first_over_repeat(steps, [37, 101])
    assert [n for n, _, _ in timed] == [37, 101]
    assert all(first > 0 and again > 0 for _, first, again in timed)
    assert steps.num_requests == 4  # a fresh prompt for each step
    assert not steps.core.has_work()
