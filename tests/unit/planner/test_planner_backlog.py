"""The backlog arithmetic of the load rule (planner/backlog.py), worked by hand."""

from __future__ import annotations

import math

import pytest

from armature.planner.backlog import get_drain_s, get_workers_for_backlog


def test_drain_time() -> None:
    # no backlog drains at once; 3 worker-seconds over 2 - 0.5 spare workers: 2 s
    assert get_drain_s(0.0, 2, 1.9) == 0.0
    assert get_drain_s(3.0, 2, 0.5) == pytest.approx(2.0)
    # the load keeps every worker busy (or more): the backlog never drains
    assert get_drain_s(3.0, 2, 2.0) == math.inf
    assert get_drain_s(3.0, 0, 0.0) == math.inf


def test_workers_for_a_backlog_at_the_join() -> None:
    # 10 worker-seconds queued, 6 serve, 10.8 busy: by the join 30 s later the backlog is
    # 10 + 30 x 4.8 = 154; clearing it in 30 s more: 10.8 + 154 / 30 = 15.93 -> 16
    assert get_workers_for_backlog(10.0, 6, 10.8, 30.0, 30.0) == 16
    # 4 serve, 2 busy: 2 worker-seconds are gone long before the join; the load alone: 2
    assert get_workers_for_backlog(2.0, 4, 2.0, 30.0, 30.0) == 2
    # workers that start at once: 10 + 0 over a 5 s horizon, 1.5 busy: 1.5 + 2 = 3.5 -> 4
    assert get_workers_for_backlog(10.0, 2, 1.5, 0.0, 5.0) == 4
