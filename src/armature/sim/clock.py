"""The mocker's clocks: wall time for serving real traffic, virtual time for offline replay.

Everything simulated that takes time (a model step, a load from a lower KV tier) reads and
advances one of these instead of `time`, so the same code runs in real time or as fast as the
host can compute it.
"""

from __future__ import annotations

import functools
import itertools
import operator
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, overload

from armature.engines.native.step_stats import uniform_step_durations

__all__ = ["Clock", "EventClock", "UniformSteps", "VirtualClock", "WallClock"]


class Clock(Protocol):
    def get_time_s(self) -> float:
        """Now, in seconds (only differences between readings mean anything)."""
        ...

    def advance(self, seconds: float) -> None:
        """Let `seconds` pass: a wall clock sleeps, a virtual one moves forward at once."""
        ...

    def advance_steps(self, seconds: float, num_steps: int) -> Sequence[float]:
        """`advance(seconds)` `num_steps` times; returns how long each took on this clock."""
        ...


class WallClock:
    """Real time: a step takes as long as the timing model says (serving real traffic)."""

    def get_time_s(self) -> float:
        return time.monotonic()

    def advance(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)

    def advance_steps(self, seconds: float, num_steps: int) -> list[float]:
        took = []
        for _ in range(num_steps):
            started = self.get_time_s()
            self.advance(seconds)
            took.append(self.get_time_s() - started)
        return took


@dataclass
class VirtualClock:
    """Simulated time for offline replay: advancing costs nothing."""

    now_s: float = 0.0

    def get_time_s(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> None:
        self.now_s += seconds

    def advance_steps(self, seconds: float, num_steps: int) -> UniformSteps:
        # the same additions as `advance` one by one, at C speed
        start_s = self.now_s
        self.now_s = functools.reduce(operator.add, itertools.repeat(seconds, num_steps), start_s)
        return UniformSteps(start_s, seconds, num_steps)


class UniformSteps(Sequence[float]):
    """How long each of `num_steps` steps of `seconds` took on a virtual clock that added them
    one by one from `start_s` (differences of rounded sums, so not all exactly `seconds`),
    worked out when read: a replay runs millions of steps whose times nobody reads."""

    __slots__ = ("num_steps", "seconds", "start_s")

    def __init__(self, start_s: float, seconds: float, num_steps: int):
        self.start_s = start_s
        self.seconds = seconds
        self.num_steps = num_steps

    def _durations(self) -> list[float]:
        return uniform_step_durations(self.start_s, self.seconds, self.num_steps)

    def __len__(self) -> int:
        return self.num_steps

    def __iter__(self) -> Iterator[float]:
        return iter(self._durations())

    @overload
    def __getitem__(self, index: int) -> float: ...
    @overload
    def __getitem__(self, index: slice) -> list[float]: ...
    def __getitem__(self, index: int | slice) -> float | list[float]:
        return self._durations()[index]

    def __repr__(self) -> str:
        return f"UniformSteps({self.start_s!r}, {self.seconds!r}, {self.num_steps})"


class EventClock:
    """A discrete-event simulation's time (`get_now_s`), as the modeled KV tiers read it. It
    moves from event to event, never by `advance`: a worker waiting for loads is idle and the
    simulation wakes it when the next one is done (`sim.simulation`)."""

    def __init__(self, get_now_s: Callable[[], float]):
        self._get_now_s = get_now_s

    def get_time_s(self) -> float:
        return self._get_now_s()

    def advance(self, seconds: float) -> None:
        """Nothing: a wait for loads returns at once."""

    def advance_steps(self, seconds: float, num_steps: int) -> list[float]:
        return [0.0] * num_steps
