"""Correction factors: how much slower (above 1) or faster the fleet runs than its profile,
from the workers' step records. The planner multiplies the profile's times by them.

For one window, over the steps of one kind (their wall time measured, step_wall_s > 0):

    prefill factor = sum wall(prefill-only steps) / sum prefill_step_s(their new tokens,
                     their context pairs)
    decode factor  = sum wall(decode-only steps)  / sum decode_step_s(B, kv tokens / B)

Mixed steps (prefill chunks beside decodes) are left out: which part was slow is not known.
Each window's ratio moves the factor by `weight` (an exponential average: one odd window
does not swing the plan), and the factor stays in [MIN_FACTOR, MAX_FACTOR] (a profile more
than 5x off is a wrong profile, not something to correct silently).
"""

from __future__ import annotations

from collections.abc import Iterable

from armature.planner.observation import WorkerSteps
from armature.planner.performance import PerformanceModel
from armature.protocols.engine import StepRecord

__all__ = ["MAX_FACTOR", "MIN_FACTOR", "CorrectionTracker", "get_step_ratios"]

MIN_FACTOR = 0.2
MAX_FACTOR = 5.0


def get_step_ratios(
    records: Iterable[StepRecord], model: PerformanceModel
) -> tuple[float | None, float | None]:
    """(prefill, decode) observed / predicted step time over `records`; None for a kind with
    no measured step."""
    prefill_observed = prefill_predicted = decode_observed = decode_predicted = 0.0
    for record in records:
        if record.step_wall_s <= 0.0:
            continue
        has_prefill = record.num_scheduled_prefill_tokens > 0
        has_decode = record.num_decode_requests > 0
        if has_prefill and not has_decode:
            prefill_observed += record.step_wall_s
            prefill_predicted += model.get_prefill_step_s(
                record.num_scheduled_prefill_tokens, record.num_prefill_context_pairs
            )
        elif has_decode and not has_prefill:
            context_tokens = record.num_decode_kv_tokens / record.num_decode_requests
            decode_observed += record.step_wall_s
            decode_predicted += model.get_decode_step_s(record.num_decode_requests, context_tokens)
    prefill = prefill_observed / prefill_predicted if prefill_predicted > 0.0 else None
    decode = decode_observed / decode_predicted if decode_predicted > 0.0 else None
    return prefill, decode


class CorrectionTracker:
    """The fleet's prefill and decode factors, 1.0 until steps are observed."""

    def __init__(self, weight: float = 0.5) -> None:
        assert 0.0 < weight <= 1.0
        self._weight = weight
        self.prefill_factor = 1.0
        self.decode_factor = 1.0

    def observe(self, workers: Iterable[WorkerSteps], model: PerformanceModel) -> None:
        """Moves each factor toward this window's ratio (a kind with no steps keeps its)."""
        records = [r for w in workers for r in w.step_records]
        prefill, decode = get_step_ratios(records, model)
        if prefill is not None:
            self.prefill_factor = self._blend(self.prefill_factor, prefill)
        if decode is not None:
            self.decode_factor = self._blend(self.decode_factor, decode)

    def _blend(self, old: float, ratio: float) -> float:
        blended = (1.0 - self._weight) * old + self._weight * ratio
        return min(MAX_FACTOR, max(MIN_FACTOR, blended))
