"""Plain stand-ins for the vLLM output objects the adapter reads (see engines/vllm/outputs.py)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class FakeLogprob:
    logprob: float
    rank: int | None


@dataclass
class FakeCompletion:
    token_ids: list[int]
    finish_reason: str | None = None
    logprobs: list[dict[int, FakeLogprob]] | None = None


@dataclass
class FakeOutput:
    outputs: list[FakeCompletion] = field(default_factory=list)
    num_cached_tokens: int | None = 0
