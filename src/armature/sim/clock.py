"""The mocker's clocks: wall time for serving real traffic, virtual time for offline replay.

Everything simulated that takes time (a model step, a load from a lower KV tier) reads and
advances one of these instead of `time`, so the same code runs in real time or as fast as the
host can compute it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

__all__ = ["Clock", "VirtualClock", "WallClock"]


class Clock(Protocol):
    def get_time_s(self) -> float:
        """Now, in seconds (only differences between readings mean anything)."""
        ...

    def advance(self, seconds: float) -> None:
        """Let `seconds` pass: a wall clock sleeps, a virtual one moves forward at once."""
        ...


class WallClock:
    """Real time: a step takes as long as the timing model says (serving real traffic)."""

    def get_time_s(self) -> float:
        return time.monotonic()

    def advance(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


@dataclass
class VirtualClock:
    """Simulated time for offline replay: advancing costs nothing."""

    now_s: float = 0.0

    def get_time_s(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> None:
        self.now_s += seconds
