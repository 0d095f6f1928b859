"""What the planner needs to know about one worker's speed (`PerformanceModel`), and a model
read from plain tables (`TablePerformanceModel`). A profile measured by `armature profile`
will implement the same Protocol; the planner core depends on nothing else about it."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from armature.errors import ConfigError

__all__ = ["PerformanceModel", "TablePerformanceModel", "interpolate"]


class PerformanceModel(Protocol):
    """One worker's speed, as profiled. Times are uncorrected: the planner multiplies them by
    its correction factors (observed / predicted step time)."""

    def get_prefill_s(self, num_tokens: float) -> float:
        """Seconds to prefill `num_tokens` new prompt tokens of one request (batch 1)."""
        ...

    def get_decode_step_s(self, num_requests: int, context_tokens: float) -> float:
        """Seconds of one decode step for `num_requests` requests that each attend over
        `context_tokens` tokens (the step's ITL)."""
        ...

    def get_max_decode_requests(self, context_tokens: float) -> int:
        """The most requests of `context_tokens` tokens one worker decodes at once (its KV
        cache and batch limits); at least 1."""
        ...


def interpolate(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """y at x on the piecewise-linear curve through (xs, ys), xs increasing. Outside the table
    the end segment is extended (a profile's last points give its trend: clamping would call
    twice the largest prompt as fast as the largest). A one-point table is constant."""
    if len(xs) == 1:
        return ys[0]
    i = min(max(bisect.bisect_right(xs, x), 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def _check_axis(name: str, values: Sequence[float]) -> None:
    if not values or any(b <= a for a, b in itertools.pairwise(values)):
        raise ConfigError(f"{name}: expected increasing values, got {list(values)}")


@dataclass(frozen=True)
class TablePerformanceModel:
    """A `PerformanceModel` from tables, interpolated linearly (bilinearly for decode).

    `prefill_s[i]` is the prefill time of `prefill_tokens[i]` tokens; `decode_step_s[i][j]`
    the step time of `decode_requests[i]` requests at `decode_context_tokens[j]` tokens each.
    A worker holds at most `max_num_seqs` requests and `max_kv_tokens` tokens of KV."""

    prefill_tokens: tuple[float, ...]
    prefill_s: tuple[float, ...]
    decode_requests: tuple[int, ...]
    decode_context_tokens: tuple[float, ...]
    decode_step_s: tuple[tuple[float, ...], ...]
    max_num_seqs: int
    max_kv_tokens: int

    def __post_init__(self) -> None:
        _check_axis("prefill_tokens", self.prefill_tokens)
        _check_axis("decode_requests", self.decode_requests)
        _check_axis("decode_context_tokens", self.decode_context_tokens)
        if len(self.prefill_s) != len(self.prefill_tokens):
            raise ConfigError("prefill_s: one time per prefill_tokens entry")
        if len(self.decode_step_s) != len(self.decode_requests) or any(
            len(row) != len(self.decode_context_tokens) for row in self.decode_step_s
        ):
            raise ConfigError("decode_step_s: one row per batch size, one time per context")
        if self.max_num_seqs < 1 or self.max_kv_tokens < 1:
            raise ConfigError("max_num_seqs and max_kv_tokens must be >= 1")

    def get_prefill_s(self, num_tokens: float) -> float:
        return max(0.0, interpolate(self.prefill_tokens, self.prefill_s, num_tokens))

    def get_decode_step_s(self, num_requests: int, context_tokens: float) -> float:
        by_context = [
            interpolate(self.decode_context_tokens, row, context_tokens)
            for row in self.decode_step_s
        ]
        return max(0.0, interpolate(self.decode_requests, by_context, num_requests))

    def get_max_decode_requests(self, context_tokens: float) -> int:
        by_kv = int(self.max_kv_tokens // max(context_tokens, 1.0))
        return max(1, min(self.max_num_seqs, by_kv))
