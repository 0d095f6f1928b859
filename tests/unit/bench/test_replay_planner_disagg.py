"""bench.replay_planner_disagg's static-fleet search: the splits of a total size it tries,
and the walk over sizes, on a replay stubbed by a rule of which fleets hold."""

from __future__ import annotations

import pytest

import bench.replay_planner_disagg as script
from bench.replay_planner_disagg import Fleet, get_splits, smallest_static


def test_splits_start_at_the_prefill_share_and_keep_a_worker_of_each_role() -> None:
    assert get_splits(10, 0.3) == [Fleet(3, 7), Fleet(2, 8), Fleet(4, 6)]
    assert get_splits(4, 0.9) == [Fleet(3, 1), Fleet(2, 2), Fleet(1, 3)]
    assert get_splits(2, 0.5) == [Fleet(1, 1)]


class _Report:
    def __init__(self, attainment: float):
        self.sla_attainment = attainment


@pytest.mark.parametrize(
    ("start", "found"), [(Fleet(2, 6), Fleet(3, 6)), (Fleet(4, 8), Fleet(3, 6))]
)
def test_the_smallest_holding_fleet_is_found_from_above_and_below(
    monkeypatch: pytest.MonkeyPatch, start: Fleet, found: Fleet
) -> None:
    # a fleet holds with at least 3 prefill and 6 decode workers: 9 is the smallest size
    tried: list[Fleet] = []

    def fake_replay(requests: object, config: script.ReplayConfig) -> _Report:
        fleet = Fleet(config.num_prefill_workers, config.num_workers - config.num_prefill_workers)
        tried.append(fleet)
        return _Report(0.96 if fleet.num_prefill >= 3 and fleet.num_decode >= 6 else 0.5)

    monkeypatch.setattr(script, "replay", fake_replay)
    args = script.parse_args(["--startup-s", "5"])
    fleet, report = smallest_static(args, [], start)
    assert fleet == found and report.sla_attainment == 0.96
    assert len(tried) == len(set(tried))  # each fleet replayed once
    assert all(f.size >= 8 for f in tried)  # no size below the first that failed
