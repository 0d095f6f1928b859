"""What a frontend would measure of a simulated fleet, in windows: the planner's
`FrontendMetrics` without a frontend. The simulation reports each arrival, first token and
finish (`FleetMonitor`); `FrontendWindows` sums them per named window until it is taken.

    arrival        request count, input and output lengths  (the window's load)
    first token    TTFT, prompt and cached tokens           (latency, prefix-hit rate)
    finish         the request's mean ITL                   (decode latency), and with
                   the planner's targets whether it met both (its attainment)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from armature.planner.observation import FrontendMetrics
from armature.workload.measure import meets_targets

__all__ = ["FleetMonitor", "FrontendWindows", "WindowSums"]


class FleetMonitor(Protocol):
    def on_arrival(self, num_input_tokens: int, num_output_tokens: int) -> None: ...

    def on_first_token(
        self, ttft_ms: float, num_cached_tokens: int, num_prompt_tokens: int
    ) -> None: ...

    def on_finish(self, ttft_ms: float | None, mean_itl_ms: float | None) -> None: ...


@dataclass
class WindowSums:
    num_arrivals: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    num_first_tokens: int = 0
    ttft_ms_sum: float = 0.0
    cached_tokens: int = 0
    prompt_tokens: int = 0
    num_itl: int = 0  # finished requests with at least two tokens
    itl_ms_sum: float = 0.0
    num_judged: int = 0  # finished requests judged against the targets
    num_met: int = 0

    def to_metrics(self, window_s: float) -> FrontendMetrics:
        arrivals = max(self.num_arrivals, 1)
        return FrontendMetrics(
            window_s=window_s,
            num_requests=self.num_arrivals,
            mean_input_tokens=self.input_tokens / arrivals,
            mean_output_tokens=self.output_tokens / arrivals,
            prefix_hit_rate=(
                self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
            ),
            mean_ttft_ms=(
                self.ttft_ms_sum / self.num_first_tokens if self.num_first_tokens else None
            ),
            mean_itl_ms=self.itl_ms_sum / self.num_itl if self.num_itl else None,
            num_judged_requests=self.num_judged,
            num_met_requests=self.num_met,
        )


class FrontendWindows:
    """One `WindowSums` per window name; each event adds to all of them. With `targets`
    (TTFT ms, mean ITL ms), each finished request is judged against them: met when its first
    token came within the TTFT target and its mean ITL (if it had two tokens) within the ITL
    one (`meets_targets`, as the replay's `sla_attainment` counts)."""

    def __init__(self, names: Iterable[str], targets: tuple[float, float] | None = None) -> None:
        self._sums = {name: WindowSums() for name in names}
        self._targets = targets

    def on_arrival(self, num_input_tokens: int, num_output_tokens: int) -> None:
        for sums in self._sums.values():
            sums.num_arrivals += 1
            sums.input_tokens += num_input_tokens
            sums.output_tokens += num_output_tokens

    def on_first_token(
        self, ttft_ms: float, num_cached_tokens: int, num_prompt_tokens: int
    ) -> None:
        for sums in self._sums.values():
            sums.num_first_tokens += 1
            sums.ttft_ms_sum += ttft_ms
            sums.cached_tokens += num_cached_tokens
            sums.prompt_tokens += num_prompt_tokens

    def on_finish(self, ttft_ms: float | None, mean_itl_ms: float | None) -> None:
        if self._targets is not None:
            met = meets_targets(ttft_ms, mean_itl_ms, *self._targets)
            for sums in self._sums.values():
                sums.num_judged += 1
                sums.num_met += met
        if mean_itl_ms is None:
            return
        for sums in self._sums.values():
            sums.num_itl += 1
            sums.itl_ms_sum += mean_itl_ms

    def take(self, name: str, window_s: float) -> FrontendMetrics:
        """Window `name`'s metrics over its last `window_s` seconds; it starts again empty."""
        sums = self._sums[name]
        self._sums[name] = WindowSums()
        return sums.to_metrics(window_s)
