"""What a frontend would measure of a simulated fleet, in windows: the planner's
`FrontendMetrics` without a frontend. The simulation reports each arrival, first token and
finish (`FleetMonitor`); `FrontendWindows` counts them per named window as a frontend's
counters would, until it is taken, and turns the counts into metrics by the live planner's
formulas (`planner.window_counts`).

    arrival        the request count                         (the window's rate)
    first token    TTFT, prompt and cached tokens            (input length, prefix-hit rate)
    finish         output tokens, the token gaps' sum and     (output length, ITL), and with
                   count                                     the planner's targets whether it
                                                             met both (its attainment)

A frontend counts a request's token gaps as they stream; here they are counted when the
request finishes (the simulation does not report each token), so a window's ITL is its
finished requests', where a live one's is of the tokens streamed in it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from armature.planner.observation import FrontendMetrics
from armature.planner.window_counts import WindowCounts, get_metrics
from armature.workload.measure import meets_targets

__all__ = ["FinishedRequest", "FleetMonitor", "FrontendWindows", "WindowSums"]


@dataclass(frozen=True)
class FinishedRequest:
    """A finished request as a frontend measures it."""

    ttft_ms: float | None  # None: it never got a first token
    num_output_tokens: int
    # its token gaps, summed, and how many: one per later token (tokens that arrive together
    # share their interval, as a frontend counts them)
    itl_sum_ms: float
    num_token_gaps: int

    def get_mean_itl_ms(self) -> float | None:
        """Its mean ITL, as the replay's SLOs judge it (`Slo.met_by`)."""
        return self.itl_sum_ms / self.num_token_gaps if self.num_token_gaps else None


class FleetMonitor(Protocol):
    def on_arrival(self) -> None: ...

    def on_first_token(
        self, ttft_ms: float, num_cached_tokens: int, num_prompt_tokens: int
    ) -> None: ...

    def on_finish(self, request: FinishedRequest) -> None: ...


@dataclass
class WindowSums:
    num_arrivals: int = 0
    num_first_tokens: int = 0
    ttft_ms_sum: float = 0.0
    cached_tokens: int = 0
    prompt_tokens: int = 0
    num_finished: int = 0
    output_tokens: int = 0
    num_token_gaps: int = 0
    itl_ms_sum: float = 0.0
    num_met: int = 0  # finished requests judged against the targets: met, missed
    num_missed: int = 0

    def to_counts(self, window_s: float) -> WindowCounts:
        return WindowCounts(
            window_s=window_s,
            num_requests=self.num_arrivals,
            num_first_tokens=self.num_first_tokens,
            prompt_tokens=self.prompt_tokens,
            cached_tokens=self.cached_tokens,
            ttft_sum_s=self.ttft_ms_sum / 1000.0,
            num_finished=self.num_finished,
            output_tokens=self.output_tokens,
            num_token_gaps=self.num_token_gaps,
            itl_sum_s=self.itl_ms_sum / 1000.0,
            num_met_requests=self.num_met,
            num_missed_requests=self.num_missed,
        )


class FrontendWindows:
    """One `WindowSums` per window name; each event adds to all of them. With `targets`
    (TTFT ms, mean ITL ms), each finished request is judged against them: met when its first
    token came within the TTFT target and its mean ITL (if it had two tokens) within the ITL
    one (`meets_targets`, as the replay's `sla_attainment` counts)."""

    def __init__(self, names: Iterable[str], targets: tuple[float, float] | None = None) -> None:
        self._sums = {name: WindowSums() for name in names}
        self._previous: dict[str, FrontendMetrics] = {}
        self._targets = targets

    def on_arrival(self) -> None:
        for sums in self._sums.values():
            sums.num_arrivals += 1

    def on_first_token(
        self, ttft_ms: float, num_cached_tokens: int, num_prompt_tokens: int
    ) -> None:
        for sums in self._sums.values():
            sums.num_first_tokens += 1
            sums.ttft_ms_sum += ttft_ms
            sums.cached_tokens += num_cached_tokens
            sums.prompt_tokens += num_prompt_tokens

    def on_finish(self, request: FinishedRequest) -> None:
        met = None
        if self._targets is not None:
            met = meets_targets(request.ttft_ms, request.get_mean_itl_ms(), *self._targets)
        for sums in self._sums.values():
            sums.num_finished += 1
            sums.output_tokens += request.num_output_tokens
            sums.num_token_gaps += request.num_token_gaps
            sums.itl_ms_sum += request.itl_sum_ms
            if met is not None:
                sums.num_met += met
                sums.num_missed += not met

    def take(self, name: str, window_s: float) -> FrontendMetrics:
        """Window `name`'s metrics over its last `window_s` seconds; it starts again empty."""
        sums = self._sums[name]
        self._sums[name] = WindowSums()
        metrics = get_metrics(sums.to_counts(window_s), self._previous.get(name))
        self._previous[name] = metrics
        return metrics
