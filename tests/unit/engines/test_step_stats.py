"""StepStats: the step records an engine keeps until taken, a decode run's steps as one entry,
bounded to the newest MAX_STEP_RECORDS steps."""

from __future__ import annotations

from typing import Any, cast

from armature.engines.native.scheduler import ScheduledChunk, SchedulerOutput
from armature.engines.native.step_stats import MAX_STEP_RECORDS, StepStats
from armature.protocols.engine import StepRecord


def _mixed_step() -> SchedulerOutput:
    """A prefill chunk of 32 tokens and one decode at position 40."""
    request = cast(Any, None)
    return SchedulerOutput(
        chunks=[ScheduledChunk(request, 0, 32), ScheduledChunk(request, 40, 1)], preempted=[]
    )


def _decodes(stats: StepStats, first_kv: int, wall_s: list[float]) -> None:
    stats.record_decodes(
        num_decode_requests=3,
        first_decode_kv_tokens=first_kv,
        num_kv_tokens_used=640,
        num_queued_prefill_requests=2,
        num_queued_prefill_tokens=500,
        wall_s=wall_s,
    )


def _decode_record(kv_tokens: int, wall_s: float) -> StepRecord:
    return StepRecord(
        num_scheduled_prefill_requests=0,
        num_scheduled_prefill_tokens=0,
        num_queued_prefill_requests=2,
        num_queued_prefill_tokens=500,
        num_decode_requests=3,
        num_decode_kv_tokens=kv_tokens,
        num_kv_tokens_used=640,
        step_wall_s=wall_s,
    )


def test_a_prefill_chunk_after_earlier_tokens_records_its_context_pairs() -> None:
    request = cast(Any, None)
    stats = StepStats(block_size=16)
    # a fresh prompt's chunk, one 48 tokens into its prompt, and a decode
    chunks = [
        ScheduledChunk(request, 0, 16),
        ScheduledChunk(request, 48, 32),
        ScheduledChunk(request, 70, 1),
    ]
    stats.record(
        SchedulerOutput(chunks=chunks, preempted=[]),
        num_kv_tokens_used=160,
        num_queued_prefill_requests=0,
        num_queued_prefill_tokens=0,
        wall_s=0.25,
    )
    (record,) = stats.take_records()
    assert (record.num_scheduled_prefill_tokens, record.num_prefill_context_pairs) == (48, 48 * 32)
    assert record.num_decode_kv_tokens == 71


def test_a_decode_run_gives_one_record_per_step_in_order() -> None:
    stats = StepStats(block_size=16)
    stats.record(
        _mixed_step(),
        num_kv_tokens_used=320,
        num_queued_prefill_requests=1,
        num_queued_prefill_tokens=64,
        wall_s=0.5,
    )
    _decodes(stats, 100, [0.1, 0.2, 0.3])
    _decodes(stats, 200, [])  # an empty run records nothing
    assert stats.take_records() == [
        StepRecord(
            num_scheduled_prefill_requests=1,
            num_scheduled_prefill_tokens=32,
            num_queued_prefill_requests=1,
            num_queued_prefill_tokens=64,
            num_decode_requests=1,
            num_decode_kv_tokens=41,
            num_kv_tokens_used=320,
            step_wall_s=0.5,
        ),
        _decode_record(100, 0.1),
        _decode_record(103, 0.2),
        _decode_record(106, 0.3),
    ]
    assert stats.take_records() == []


def test_only_the_newest_steps_are_kept() -> None:
    stats = StepStats(block_size=16)
    _decodes(stats, 0, [1.0] * 1000)  # steps 0..999
    _decodes(stats, 3000, [2.0] * 20)  # steps 1000..1019
    _decodes(stats, 6000, [3.0] * 30)  # steps 1020..1049: the first 26 steps fall out
    records = stats.take_records()
    assert len(records) == MAX_STEP_RECORDS == 1024
    assert records[0] == _decode_record(26 * 3, 1.0)
    assert records[973] == _decode_record(999 * 3, 1.0)
    assert records[974] == _decode_record(3000, 2.0)
    assert records[-1] == _decode_record(6000 + 29 * 3, 3.0)
    # a whole run older than the newest MAX_STEP_RECORDS steps is dropped when recorded
    for _ in range(3):
        _decodes(stats, 0, [1.0] * 600)
    assert stats._num_steps == 1200  # the first run went; the second is cut when taken
    assert list(stats._sizes) == [600, 600]
    assert len(stats._entries) == 2
    assert len(stats.take_records()) == MAX_STEP_RECORDS
