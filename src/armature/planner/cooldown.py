"""Hysteresis for one role: cool-downs after a change, and a stabilization window for the
throughput plan's scale-downs (as Kubernetes' HPA: scale down only to the highest plan of
the last `scale_down_cooldown_s`, so that one quiet interval between busy ones removes
nothing).

    a change up   is allowed scale_up_cooldown_s   after the role's last change
    a change down is allowed scale_down_cooldown_s after the role's last change
"""

from __future__ import annotations

import collections
import math

__all__ = ["RoleCooldown"]


class RoleCooldown:
    """One role's last change and recent throughput plans. Times are the caller's clock."""

    def __init__(self, scale_up_cooldown_s: float, scale_down_cooldown_s: float) -> None:
        self._up_s = scale_up_cooldown_s
        self._down_s = scale_down_cooldown_s
        self._last_change_s = -math.inf
        self._plans: collections.deque[tuple[float, int]] = collections.deque()

    def allows(self, from_workers: int, to_workers: int, now_s: float) -> bool:
        """Whether a change from `from_workers` to `to_workers` may happen at `now_s`."""
        waited_s = now_s - self._last_change_s
        if to_workers > from_workers:
            return waited_s >= self._up_s
        if to_workers < from_workers:
            return waited_s >= self._down_s
        return True

    def record_change(self, now_s: float) -> None:
        self._last_change_s = now_s

    def add_plan(self, num_workers: int, now_s: float) -> None:
        """Remembers a throughput plan; plans older than the down cool-down are dropped."""
        self._plans.append((now_s, num_workers))
        while self._plans and self._plans[0][0] < now_s - self._down_s:
            self._plans.popleft()

    def get_stable_plan(self) -> int:
        """The highest plan remembered: what a scale-down may go down to (0: none yet)."""
        return max((num for _, num in self._plans), default=0)
