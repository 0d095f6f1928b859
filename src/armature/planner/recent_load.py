"""The load rule's view of the arriving load: the last few load windows taken together.

One load window (a few seconds) holds too few arrivals to size a pool on, and real arrivals
come in bursts (a trace's requests share timestamps), so a window that catches two bursts
reads twice the rate and one between them reads none. The load rule sizes on the arrivals of
the last `window_s` seconds instead: their count over their span (the rate whose Poisson
bounds `get_rate_bounds` gives) and their mean lengths, weighted by arrivals.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from armature.planner.observation import FrontendMetrics

__all__ = [
    "RATE_BOUND_Z",
    "RecentLoad",
    "RecentWindows",
    "get_attainment",
    "get_rate_bounds",
    "get_rising_rate",
]

# the load rule's confidence in a window's arrival rate: one standard deviation each way
RATE_BOUND_Z = 1.0


@dataclass(frozen=True)
class RecentLoad:
    """`num_requests` arrivals over `window_s` seconds, of these mean lengths (0.0 with no
    arrivals, or while no window measured one)."""

    num_requests: int
    window_s: float
    mean_input_tokens: float
    mean_output_tokens: float
    num_judged_requests: int = 0  # finished and judged against the targets (0: not judged)
    num_met_requests: int = 0  # of those, within both targets

    def get_attainment(self, min_judged: int) -> float | None:
        """`get_attainment` of the window's judged requests."""
        return get_attainment(self.num_judged_requests, self.num_met_requests, min_judged)


class RecentWindows:
    """The frontend's last load windows that together span `window_s` seconds (at least the
    latest one), given `load_interval_s` apart."""

    def __init__(self, window_s: float, load_interval_s: float) -> None:
        assert window_s > 0.0 and load_interval_s > 0.0
        self._windows: deque[FrontendMetrics] = deque(
            maxlen=max(1, math.ceil(window_s / load_interval_s - 1e-9))
        )

    def get_suffix_counts(self) -> list[tuple[int, float]]:
        """(arrivals, seconds) over the latest window, the latest two, ... all kept."""
        counts = []
        num, span = 0, 0.0
        for w in reversed(self._windows):
            num += w.num_requests
            span += w.window_s
            counts.append((num, span))
        return counts

    def add(self, metrics: FrontendMetrics) -> RecentLoad:
        """Adds the latest window; returns the load over those kept."""
        self._windows.append(metrics)
        num_requests = sum(w.num_requests for w in self._windows)
        window_s = sum(w.window_s for w in self._windows)
        num_judged = sum(w.num_judged_requests for w in self._windows)
        num_met = sum(w.num_met_requests for w in self._windows)
        if num_requests == 0:
            return RecentLoad(0, window_s, 0.0, 0.0, num_judged, num_met)
        return RecentLoad(
            num_requests,
            window_s,
            self._get_mean_length("mean_input_tokens"),
            self._get_mean_length("mean_output_tokens"),
            num_judged,
            num_met,
        )

    def _get_mean_length(self, name: str) -> float:
        """The windows' mean length `name` by arrivals, over the windows that measured one
        (0.0: not yet, e.g. arrivals whose prefill or output has not ended); a length measured
        only in windows without arrivals is the latest of those."""
        measured = [w for w in self._windows if getattr(w, name) > 0.0]
        num_measured = sum(w.num_requests for w in measured)
        if not measured:
            return 0.0
        if not num_measured:
            last: float = getattr(measured[-1], name)
            return last
        total: float = sum(w.num_requests * getattr(w, name) for w in measured)
        return total / num_measured


def get_attainment(num_judged: int, num_met: int, min_judged: int) -> float | None:
    """The share of `num_judged` requests that met both targets (`num_met` of them); None
    with fewer than `min_judged` judged (too few to tell)."""
    if num_judged < max(1, min_judged):
        return None
    return num_met / num_judged


def get_rate_bounds(num_arrivals: int, window_s: float) -> tuple[float, float]:
    """A window's arrival rate, low and high: `num_arrivals` Poisson arrivals in `window_s`
    seconds put the rate within (sqrt(k) -+ z / 2)^2 / window_s (sqrt(k) is about normal with
    variance 1/4), z = RATE_BOUND_Z. Scaling up on the low bound and down on the high one
    keeps a short window's noise from moving the fleet both ways."""
    root = math.sqrt(num_arrivals)
    half = RATE_BOUND_Z / 2.0
    low = max(0.0, root - half) ** 2
    return low / window_s, (root + half) ** 2 / window_s


def get_rising_rate(suffix_counts: Sequence[tuple[int, float]]) -> float:
    """The rate the load rule scales up on: the highest low bound (`get_rate_bounds`) over
    the latest window, the latest two, ... all recent ones (`suffix_counts`: arrivals and
    seconds of each). A rise shows first in the latest windows, where a short span's low
    bound is confident only of a large one; a lull in one window moves nothing."""
    return max((get_rate_bounds(num, span_s)[0] for num, span_s in suffix_counts), default=0.0)
