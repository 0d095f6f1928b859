"""Reshape a workload's arrival rate over time, keeping its requests and their order: a step
load (the rate times `factor` for a while) or a diurnal one (a smooth day between a trough and
a peak). Pure: arrival times in, arrival times out.

A shape is a rate multiplier m(s) >= 1 over the new time s (seconds from the first arrival).
The request that arrived t seconds after the first now arrives at the s with

    M(s) = integral of m from 0 to s = t

so where m = 4, four times as many of the original seconds pass per new second: the rate is
four times the original there, and the same where m = 1.

    step(F, at, for):    m = F on [at, at + for), else 1
    diurnal(F, period):  m(s) = 1 + (F - 1) (1 - cos(2 pi s / period)) / 2
                         (the trough, 1, at s = 0; the peak, F, at period / 2)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from armature.workload.traces import TraceRequest

__all__ = ["DiurnalShape", "RateShape", "StepShape", "reshape_arrivals"]

_BISECTION_STEPS = 64


class RateShape(Protocol):
    def get_multiplier(self, s: float) -> float:
        """m(s), the rate multiplier at new time `s` seconds."""
        ...

    def get_cumulative(self, s: float) -> float:
        """M(s), the original seconds that have passed by new time `s` (increasing)."""
        ...


@dataclass(frozen=True)
class StepShape:
    factor: float
    start_s: float
    duration_s: float

    def __post_init__(self) -> None:
        if self.factor < 1.0 or self.start_s < 0.0 or self.duration_s <= 0.0:
            raise ValueError("a step needs factor >= 1, start >= 0 and duration > 0")

    def get_multiplier(self, s: float) -> float:
        return self.factor if self.start_s <= s < self.start_s + self.duration_s else 1.0

    def get_cumulative(self, s: float) -> float:
        inside = min(max(s - self.start_s, 0.0), self.duration_s)
        return s + (self.factor - 1.0) * inside


@dataclass(frozen=True)
class DiurnalShape:
    factor: float  # peak over trough
    period_s: float

    def __post_init__(self) -> None:
        if self.factor < 1.0 or self.period_s <= 0.0:
            raise ValueError("a diurnal shape needs factor >= 1 and period > 0")

    def get_multiplier(self, s: float) -> float:
        return 1.0 + (self.factor - 1.0) * (1.0 - math.cos(2.0 * math.pi * s / self.period_s)) / 2

    def get_cumulative(self, s: float) -> float:
        omega = 2.0 * math.pi / self.period_s
        return s + (self.factor - 1.0) / 2.0 * (s - math.sin(omega * s) / omega)


def _invert(shape: RateShape, t: float) -> float:
    """The s with M(s) = t, by bisection (M(s) >= s since m >= 1: s lies in [0, t])."""
    low, high = 0.0, t
    for _ in range(_BISECTION_STEPS):
        middle = (low + high) / 2.0
        if shape.get_cumulative(middle) < t:
            low = middle
        else:
            high = middle
    return (low + high) / 2.0


def reshape_arrivals(requests: Sequence[TraceRequest], shape: RateShape) -> list[TraceRequest]:
    """`requests` (sorted by arrival) with arrivals moved so the rate follows `shape`; the
    first arrival stays where it was."""
    if not requests:
        return []
    start_ms = requests[0].arrival_ms
    return [
        replace(r, arrival_ms=start_ms + 1000.0 * _invert(shape, (r.arrival_ms - start_ms) / 1000))
        for r in requests
    ]
