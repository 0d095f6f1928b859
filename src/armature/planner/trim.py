"""SLO feedback on the performance model: the share of the predicted load the planner sizes
for (`AttainmentTrim`). Pure.

The model sizes each pool for the targets from one worker's profile. A fleet serves better
than that (a router that spreads prefills, prefix hits that cluster): a fleet sized by the
model can hold the targets with room to spare for hours, and the room costs workers. The
trim measures what the model cannot: the share of requests that met both targets over each
interval (as the frontend judged them).

    attainment >= the high mark          the fleet has room: size for `1 - step` of what was
                                         sized for before (down to `min_scale`)
    target <= attainment < high mark     hold
    attainment < target                  back to the whole load at once

The trim was learned at the load it ran under: at a rate above the highest one it held the
high mark at (by `RISE_MARGIN`), the planner sizes for the whole load again, so a step up in
traffic meets the model's full answer and not a discount learned in a quiet hour.
"""

from __future__ import annotations

__all__ = ["RISE_MARGIN", "AttainmentTrim", "get_high_mark"]

# a load this much above the highest rate the trim was confirmed at is new ground (the load
# rule's rising rate reads a burst's short windows: 10% flipped the trim off within a plateau)
RISE_MARGIN = 0.25


def get_high_mark(slo_attainment: float) -> float:
    """The attainment that shows room: half way from the target to every request (0.975
    for 0.95)."""
    return slo_attainment + (1.0 - slo_attainment) / 2.0


class AttainmentTrim:
    """The scale on the predicted request rate the pools are sized for; 1.0 until intervals
    at the high mark lower it. `step` 0: off (always 1.0)."""

    def __init__(self, step: float, min_scale: float, slo_attainment: float) -> None:
        assert 0.0 <= step < 1.0 and 0.0 < min_scale <= 1.0
        self._step = step
        self._min_scale = min_scale
        self._target = slo_attainment
        self._high = get_high_mark(slo_attainment)
        self._scale = 1.0
        self._held_rate_per_s = 0.0  # the highest rate the current scale held the high mark at

    @property
    def scale(self) -> float:
        """The scale as learned (what `get_scale` gives at a rate it has held)."""
        return self._scale

    def observe(self, attainment: float | None, rate_per_s: float) -> None:
        """One interval's measured attainment (None: too few judged to tell) at its arrival
        rate."""
        if self._step == 0.0 or attainment is None:
            return
        if attainment < self._target:
            self._scale = 1.0
            self._held_rate_per_s = 0.0
        elif attainment >= self._high:
            self._scale = max(self._min_scale, self._scale * (1.0 - self._step))
            self._held_rate_per_s = max(self._held_rate_per_s, rate_per_s)

    def has_room(self, attainment: float | None) -> bool:
        """With the trim on, whether `attainment` (None: not measured) meets the high mark:
        the fleet keeps the targets with room, which the load rule counts as calm too."""
        return self._step > 0.0 and attainment is not None and attainment >= self._high

    def get_scale(self, rate_per_s: float) -> float:
        """The scale to size a load of `rate_per_s` with: the learned one up to
        `RISE_MARGIN` above the highest rate it held at, else 1.0."""
        if rate_per_s > self._held_rate_per_s * (1.0 + RISE_MARGIN):
            return 1.0
        return self._scale
