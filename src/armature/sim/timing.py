"""Step-time models for the mocker (DESIGN §4): how long one engine step would take on the
simulated hardware, given what the scheduler put in it.

The default is an H100-class profile of an 8B model, in milliseconds, with `t` the new prefill
tokens in the step and `u` the KV-cache utilization (0..1):

    prefill_ms(t) = 4.21e-7 t^2 + 0.01518 t + 16.5
    decode_ms(u)  = max(1, -25.74 u^2 + 54.01 u + 5.74)

A step with both prefill and decode work costs the sum. Every time is divided by the speedup
ratio. Profiles measured from a real engine are interpolated tables instead: by KV
utilization here, or by decode requests and context (`sim.profile_timing`, from
`armature profile`).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import msgspec

if TYPE_CHECKING:
    from armature.protocols.engine import StepRecord

__all__ = [
    "AttendedTokensTiming",
    "InterpolatedTiming",
    "PolynomialTiming",
    "StepWork",
    "TimingModel",
]


class StepWork(msgspec.Struct, frozen=True):
    """What one step computes, as the timing model sees it. (A struct: a replay makes one
    per step it prices, ~8x cheaper than a frozen dataclass.)"""

    num_prefill_tokens: int
    num_decode_requests: int
    kv_utilization: float  # active blocks / total blocks, 0..1
    # the context the decode requests attend over, summed (their new tokens included)
    num_decode_kv_tokens: int = 0
    # each prefill chunk's new tokens times the tokens before it, summed (StepRecord's)
    num_prefill_context_pairs: int = 0

    @staticmethod
    def of_record(record: StepRecord) -> StepWork:
        """The work of a step an engine recorded, for a model that prices decode by context
        (a profile's tables): the record carries no utilization of a reference pool (0)."""
        return StepWork(
            record.num_scheduled_prefill_tokens,
            record.num_decode_requests,
            0.0,
            record.num_decode_kv_tokens,
            record.num_prefill_context_pairs,
        )


class TimingModel(Protocol):
    @property
    def speedup_ratio(self) -> float: ...

    @property
    def decode_uses_context(self) -> bool:
        """Whether decode time reads `StepWork.num_decode_kv_tokens` (else a decode step's
        time depends only on its requests and KV utilization)."""
        ...

    def step_ms(self, work: StepWork) -> float: ...


@dataclass(frozen=True)
class PolynomialTiming:
    prefill_coeffs: tuple[float, float, float] = (4.21e-7, 0.01518, 16.5)
    decode_coeffs: tuple[float, float, float] = (-25.74, 54.01, 5.74)
    min_decode_ms: float = 1.0
    speedup_ratio: float = 1.0

    def __post_init__(self) -> None:
        if self.speedup_ratio <= 0:
            raise ValueError("speedup_ratio must be > 0")

    def prefill_ms(self, num_tokens: int) -> float:
        a, b, c = self.prefill_coeffs
        return a * num_tokens**2 + b * num_tokens + c

    def decode_ms(self, kv_utilization: float) -> float:
        a, b, c = self.decode_coeffs
        u = kv_utilization
        return max(self.min_decode_ms, a * u * u + b * u + c)

    @property
    def decode_uses_context(self) -> bool:
        return False

    def step_ms(self, work: StepWork) -> float:
        total = 0.0
        if work.num_prefill_tokens > 0:
            total += self.prefill_ms(work.num_prefill_tokens)
        if work.num_decode_requests > 0:
            total += self.decode_ms(work.kv_utilization)
        return total / self.speedup_ratio


@dataclass(frozen=True)
class AttendedTokensTiming:
    """The polynomial above with decode priced by the tokens the decode requests attend
    over: `u` = those tokens / `kv_capacity_tokens` (a fixed reference pool), instead of the
    worker's own pool's utilization. Workers with pools of different sizes then pay the same
    for the same work, as an engine's attention does; under the plain polynomial a small
    pool's decode costs more at equal load."""

    kv_capacity_tokens: int
    base: PolynomialTiming = PolynomialTiming()

    def __post_init__(self) -> None:
        if self.kv_capacity_tokens <= 0:
            raise ValueError("kv_capacity_tokens must be > 0")

    @property
    def speedup_ratio(self) -> float:
        return self.base.speedup_ratio

    @property
    def decode_uses_context(self) -> bool:
        return True

    def step_ms(self, work: StepWork) -> float:
        total = 0.0
        if work.num_prefill_tokens > 0:
            total += self.base.prefill_ms(work.num_prefill_tokens)
        if work.num_decode_requests > 0:
            u = min(1.0, work.num_decode_kv_tokens / self.kv_capacity_tokens)
            total += self.base.decode_ms(u)
        return total / self.base.speedup_ratio


def _interpolate(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear through (xs, ys), extrapolating linearly past either end."""
    i = bisect.bisect_left(xs, x)
    i = min(max(i, 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


@dataclass(frozen=True)
class InterpolatedTiming:
    """Tables measured from a real engine: prefill ms by prefill tokens, decode ms by KV
    utilization. Each table needs at least two points with strictly increasing x."""

    prefill_tokens: tuple[float, ...]
    prefill_ms_table: tuple[float, ...]
    kv_utilization: tuple[float, ...]
    decode_ms_table: tuple[float, ...]
    speedup_ratio: float = 1.0

    def __post_init__(self) -> None:
        for xs, ys in (
            (self.prefill_tokens, self.prefill_ms_table),
            (self.kv_utilization, self.decode_ms_table),
        ):
            if len(xs) < 2 or len(xs) != len(ys):
                raise ValueError("a timing table needs >= 2 points and equal lengths")
            if any(b <= a for a, b in itertools.pairwise(xs)):
                raise ValueError("timing table x values must increase strictly")
        if self.speedup_ratio <= 0:
            raise ValueError("speedup_ratio must be > 0")

    @property
    def decode_uses_context(self) -> bool:
        return False

    def step_ms(self, work: StepWork) -> float:
        total = 0.0
        if work.num_prefill_tokens > 0:
            total += max(
                0.0,
                _interpolate(self.prefill_tokens, self.prefill_ms_table, work.num_prefill_tokens),
            )
        if work.num_decode_requests > 0:
            total += max(
                0.0, _interpolate(self.kv_utilization, self.decode_ms_table, work.kv_utilization)
            )
        return total / self.speedup_ratio
