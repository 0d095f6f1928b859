"""The workload the configurator simulates, and how a prediction is judged against targets."""

from __future__ import annotations

import itertools

import pytest

from armature.configurator.simulate import get_num_sim_requests, make_requests
from armature.configurator.space import Targets, Workload
from armature.workload.traces import TRACE_BLOCK_TOKENS, TraceRequest


def test_synthetic_requests_keep_the_spread_and_share_no_prefix() -> None:
    requests = make_requests(Workload(1000.0, 100.0, 0.2), 10.0, 500, seed=3)
    assert len(requests) == 500
    assert all(800 <= r.input_length <= 1200 and 80 <= r.output_length <= 120 for r in requests)
    ids = [h for r in requests for h in r.hash_ids]
    assert len(ids) == len(set(ids))  # no two prompts share a block
    assert all(len(r.hash_ids) == -(-r.input_length // TRACE_BLOCK_TOKENS) for r in requests)
    span_s = requests[-1].arrival_ms / 1000.0
    assert 499 / span_s == pytest.approx(10.0, rel=0.15)  # Poisson at 10/s
    assert make_requests(Workload(1000.0, 100.0, 0.2), 10.0, 500, seed=3) == requests


def test_a_trace_keeps_its_requests_and_is_rescaled_to_the_rate() -> None:
    trace = tuple(TraceRequest(1000.0 + 500.0 * i, 600 + i, 50, (i, i + 1)) for i in range(5))
    workload = Workload.of_trace(trace)
    assert (workload.isl_tokens, workload.osl_tokens) == (602.0, 50.0)
    assert workload.get_max_request_tokens() == 654
    requests = make_requests(workload, 4.0, 5, seed=0)  # 4/s: 4 gaps in 1 s
    assert [r.arrival_ms for r in requests] == [0.0, 250.0, 500.0, 750.0, 1000.0]
    assert [(r.input_length, r.hash_ids) for r in requests] == [
        (r.input_length, r.hash_ids) for r in trace
    ]
    assert make_requests(workload, 4.0, 3, seed=0)[-1].hash_ids == (2, 3)  # the first 3


def test_a_short_trace_is_repeated_with_prefixes_of_its_own() -> None:
    """A replay needs more requests than the trace has: the trace again, one mean gap after
    its end, its hash ids moved past the trace's (sharing within a repetition only)."""
    trace = tuple(TraceRequest(1000.0 + 500.0 * i, 600 + i, 50, (i, i + 1)) for i in range(5))
    requests = make_requests(Workload.of_trace(trace), 4.0, 12, seed=0)
    assert len(requests) == 12
    assert [r.arrival_ms for r in requests] == [250.0 * i for i in range(12)]  # evenly, at 4/s
    assert [r.input_length for r in requests] == [600, 601, 602, 603, 604] * 2 + [600, 601]
    assert [r.hash_ids for r in requests] == (
        [(i, i + 1) for i in range(5)]
        + [(i + 6, i + 7) for i in range(5)]  # the ids go to 5: the next copy starts at 6
        + [(12, 13), (13, 14)]
    )


def test_the_longest_request_of_a_spread() -> None:
    assert Workload(1000.0, 100.0, 0.5).get_max_request_tokens() == 1500 + 150


def test_simulated_requests_span_enough_end_to_end_latencies() -> None:
    assert get_num_sim_requests(10.0, 2000.0, 200) == 200  # 5 x 2 s at 10/s = 100
    assert get_num_sim_requests(100.0, 2000.0, 200) == 1000
    assert get_num_sim_requests(1000.0, 2000.0, 200) == 1000  # at most


def test_targets_miss_by_the_worst_ratio() -> None:
    targets = Targets(ttft_ms=500.0, itl_ms=50.0)
    assert targets.get_miss(250.0, 25.0, 100) == 0.5
    assert targets.get_miss(250.0, 75.0, 100) == 1.5
    e2e = Targets(ttft_ms=500.0, e2e_ms=2000.0)  # replaces the ITL target
    assert e2e.get_miss(500.0, 1000.0, 100) == pytest.approx((500.0 + 99 * 1000.0) / 2000.0)
    assert e2e.get_miss(100.0, 10.0, 101) == pytest.approx(1100.0 / 2000.0)


def test_one_of_n_groups_sees_smoother_arrivals_at_the_same_rate() -> None:
    """A Poisson stream spread over 4 groups in turn: each sees Erlang-4 gaps, whose
    coefficient of variation is 1/2 (Poisson's is 1)."""
    workload = Workload(100.0, 10.0)
    for groups, cv in ((1, 1.0), (4, 0.5)):
        requests = make_requests(workload, 10.0, 4000, seed=1, num_groups=groups)
        gaps = [b.arrival_ms - a.arrival_ms for a, b in itertools.pairwise(requests)]
        mean = sum(gaps) / len(gaps)
        std = (sum((g - mean) ** 2 for g in gaps) / len(gaps)) ** 0.5
        assert mean == pytest.approx(100.0, rel=0.05)  # 10/s
        assert std / mean == pytest.approx(cv, rel=0.08)
