"""bench.served_steps' arithmetic: a step's kind, and each worker's wall time against the
profile's model by kind (hand-worked on a two-point profile)."""

from __future__ import annotations

import argparse

import pytest

from armature.planner.observation import WorkerSteps
from armature.protocols.engine import StepRecord
from armature.protocols.worker import WorkerRole
from armature.sim.profile_timing import ProfileTiming
from bench.served_steps import Case, KindRatio, get_ratios, get_step_kind, parse_case

# prefill t tokens: 10 + t ms; decode b requests: 20 + 10 b ms at any context; a mixed step
# costs both less the 10 ms overhead
TIMING = ProfileTiming(
    prefill_tokens=(0.0, 100.0),
    prefill_ms_table=(10.0, 110.0),
    decode_requests=(1.0, 2.0),
    decode_context_tokens=(100.0,),
    decode_ms_grid=((30.0,), (40.0,)),
)


def _step(prefill: int, decodes: int, wall_ms: float) -> StepRecord:
    return StepRecord(
        num_scheduled_prefill_requests=1 if prefill else 0,
        num_scheduled_prefill_tokens=prefill,
        num_decode_requests=decodes,
        num_decode_kv_tokens=100 * decodes,
        step_wall_s=wall_ms / 1000.0,
    )


def test_kinds() -> None:
    assert get_step_kind(_step(50, 0, 1.0)) == "prefill"
    assert get_step_kind(_step(0, 2, 1.0)) == "decode"
    assert get_step_kind(_step(50, 2, 1.0)) == "mixed"


def test_ratios_by_worker_and_kind() -> None:
    steps = [
        WorkerSteps(
            worker_id="w0",
            role=WorkerRole.AGG,
            step_records=[
                _step(50, 0, 66.0),  # model 60 ms: 1.1
                _step(0, 1, 30.0),  # model 30: 1.0
                _step(0, 2, 48.0),  # model 40: 1.2
                _step(0, 2, 44.0),  # model 40: 1.1
                _step(50, 2, 90.0),  # model 60 + 40 - 10 = 90: 1.0
            ],
        ),
        WorkerSteps(worker_id="w1", role=WorkerRole.AGG, step_records=[]),
    ]
    assert get_ratios(steps, TIMING) == [
        KindRatio(
            "w0", WorkerRole.AGG, "prefill", 1, pytest.approx(1.1), pytest.approx(0.066), 0.06
        ),
        KindRatio(
            "w0", WorkerRole.AGG, "decode", 3, pytest.approx(1.1), pytest.approx(0.122), 0.11
        ),
        KindRatio("w0", WorkerRole.AGG, "mixed", 1, pytest.approx(1.0), 0.09, 0.09),
    ]


def test_a_case_is_workers_seqs_and_rate() -> None:
    assert parse_case("1:8:1.22") == Case(1, 8, 1.22)
    assert parse_case("2:2:0.96").label == "2 w, seqs 2, 0.96 req/s"
    assert parse_case("2:2:0.96").get_fleet_args() == ["--workers", "2"]
    disagg = parse_case("1P2D:4:1.5")
    assert disagg == Case(2, 4, 1.5, prefill_workers=1)
    assert disagg.label == "1P:2D, seqs 4, 1.5 req/s"
    assert disagg.name == "p1d2_seqs4_rate1.5"
    assert disagg.get_fleet_args() == [
        "--prefill-workers",
        "1",
        "--decode-workers",
        "2",
        "--max-local-prefill-tokens",
        "0",
    ]
    for bad in ("1:8", "a:8:1", "0:8:1", "1:8:0", "1:8:nan", "1P:8:1", "0P1D:8:1", "1P0D:8:1"):
        with pytest.raises(argparse.ArgumentTypeError, match=r"1|WORKERS"):
            parse_case(bad)
