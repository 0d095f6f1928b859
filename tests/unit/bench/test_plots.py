"""The bench tool's plots: failed requests are shown (marked at their send times, counted
in the CDFs' titles), not silently left out; a run whose every request failed still gets
its timeline."""

from __future__ import annotations

from pathlib import Path

from armature.bench.client import RequestRecord
from armature.bench.plots import plot_run, sent_points


def record(sent_s: float, ttft_s: float | None, error: str | None = None) -> RequestRecord:
    chunks = [] if ttft_s is None else [sent_s + ttft_s, sent_s + ttft_s + 0.5]
    return RequestRecord(
        sent_s=sent_s,
        chunk_times_s=chunks,
        chunk_tokens=[1] * len(chunks),
        done_s=sent_s + 1.0,
        error=error,
    )


def test_sent_points_split_finished_and_failed_requests() -> None:
    records = [
        record(10.0, 0.25),
        record(10.5, None, "http_503"),
        record(11.0, 0.125, "timeout"),  # it had a first token, then failed
        record(12.0, 0.5),
    ]
    ok, failed = sent_points(records)
    assert ok == [(0.0, 250.0), (2.0, 500.0)]
    assert failed == [0.5, 1.0]
    assert sent_points([]) == ([], [])


def test_a_run_whose_every_request_failed_is_plotted(tmp_path: Path) -> None:
    records = [record(1.0, None, "connection"), record(2.0, None, "connection")]
    paths = plot_run(tmp_path, records)
    assert [p.name for p in paths] == ["latency_cdf.png", "over_time.png"]
    assert all(p.stat().st_size > 1000 for p in paths)
