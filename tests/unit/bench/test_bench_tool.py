"""armature bench against a server with a known schedule: measured TTFT, ITL and throughput
within 10% of the truth; goodput counts exactly the requests that met both SLOs; trace
prompts keep their prefix structure; bad input gives a clear message and a non-zero exit
with partial results kept."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fixed_server import FixedServer
from transformers import AutoTokenizer

from armature.bench.client import RequestRecord
from armature.bench.prompts import TextSynth
from armature.bench.report import pareto_table, summary_table
from armature.bench.stats import summarize
from armature.cli.main import main
from armature.workload.traces import TraceRequest

TTFT_S, ITL_S, TOKENS = 0.2, 0.02, 11


def bench(url: str, tmp_path: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    code = main(["bench", "--url", url, "--report", str(tmp_path), "--warmup", "1", *extra])
    report = tmp_path / "report.json"
    return code, json.loads(report.read_text()) if report.exists() else {}


def test_measures_a_known_schedule_within_ten_percent(tmp_path: Path) -> None:
    with FixedServer(TTFT_S, ITL_S, TOKENS) as url:
        code, report = bench(url, tmp_path, "--concurrency", "4", "--num-requests", "16")
    assert code == 0
    s = report["steps"][0]["summary"]
    assert s["num_ok"] == 16 and s["errors"] == {}
    assert s["ttft_ms"]["p50"] == pytest.approx(TTFT_S * 1000, rel=0.10)
    assert s["itl_ms"]["p50"] == pytest.approx(ITL_S * 1000, rel=0.10)
    e2e_s = TTFT_S + (TOKENS - 1) * ITL_S
    assert s["e2e_ms"]["p50"] == pytest.approx(e2e_s * 1000, rel=0.10)
    assert s["requests_per_s"] == pytest.approx(4 / e2e_s, rel=0.10)
    assert s["output_tokens_per_s"] == pytest.approx(4 * TOKENS / e2e_s, rel=0.10)
    assert s["output_tokens"] == 16 * TOKENS  # the server's usage
    assert s["goodput_requests"] is s["goodput_per_s"] is None  # no --slo-*: nothing judged


def record(ttft_s: float, gaps_s: list[float], error: str | None = None) -> RequestRecord:
    times = [ttft_s]
    for gap in gaps_s:
        times.append(times[-1] + gap)
    return RequestRecord(
        sent_s=0.0,
        chunk_times_s=times if error is None else [],
        chunk_tokens=[1] * len(times),
        done_s=times[-1],
        output_tokens=len(times),
        error=error,
    )


def test_tokens_per_user_are_those_after_the_first_over_their_gaps() -> None:
    """N tokens in N chunks hold N - 1 gaps: 1 / the mean gap, not N over them."""
    records = [record(0.1, [0.01] * 7), record(0.2, [0.02, 0.03]), record(0.1, [])]
    records[1].chunk_tokens = [3, 2, 4]  # 6 tokens after the first chunk, in 0.05 s
    summary = summarize(records, wall_time_s=1.0)
    # 100 and 120 tokens/s; the one-chunk request has no decode rate
    assert summary.output_tokens_per_s_per_user == pytest.approx(110.0)


def test_the_sweep_table_shows_goodput_only_where_slos_judge_it() -> None:
    records = [record(0.1, [0.01, 0.01]), record(0.3, [0.01, 0.01])]
    table = pareto_table(
        [("c=1", summarize(records, 2.0)), ("c=2", summarize(records, 2.0, slo_ttft_ms=200))]
    )
    rows = [line.split(" | ") for line in table.splitlines()[2:]]
    assert [row[7] for row in rows] == ["n/a (no --slo-*)", "0.50"]


def test_goodput_counts_exactly_the_requests_meeting_both_slos() -> None:
    records = [
        record(0.1, [0.01, 0.01]),  # meets both
        record(0.3, [0.01, 0.01]),  # TTFT too slow
        record(0.1, [0.05, 0.05]),  # ITL too slow
        record(0.2, [0.02, 0.02]),  # exactly on both limits: meets
        record(0.1, [0.01], error="http_500"),  # failed
    ]
    summary = summarize(records, wall_time_s=2.0, slo_ttft_ms=200, slo_itl_ms=20)
    assert (summary.goodput_requests, summary.goodput_per_s) == (2, 1.0)
    assert summary.goodput_tokens_per_s == 3.0  # 3 tokens each, over 2 s
    assert summary.num_ok == 4 and summary.errors == {"http_500": 1}
    unjudged = summarize(records, 2.0)  # no SLO: nothing judged, no goodput (not the successes)
    assert (unjudged.goodput_requests, unjudged.goodput_per_s) == (None, None)
    assert unjudged.goodput_tokens_per_s is None


def test_a_run_whose_requests_all_failed_has_no_latencies() -> None:
    """Every request failed: no TTFT, ITL or end-to-end figure (they read 0.0 ms, a perfect
    run to whatever reads report.json); the tables say n/a."""
    records = [record(0.1, [0.01], error="timeout"), record(0.2, [], error="http_500")]
    summary = summarize(records, wall_time_s=1.0, slo_ttft_ms=200)
    assert (summary.ttft_ms, summary.itl_ms, summary.e2e_ms) == (None, None, None)
    assert summary.num_ok == 0 and summary.goodput_requests == 0
    table = summary_table(summary)
    assert [line.split()[-1] for line in table.splitlines() if "ms p50" in line] == ["n/a"] * 3
    row = pareto_table([("c=1", summary)]).splitlines()[2].split(" | ")
    assert row[4:7] == ["n/a", "n/a", "n/a"]


@pytest.fixture(scope="module")
def synth(default_model_dir: Path) -> TextSynth:
    return TextSynth(AutoTokenizer.from_pretrained(str(default_model_dir)))


def test_trace_prompts_keep_prefixes_and_lengths(synth: TextSynth) -> None:
    a = synth.trace_text(TraceRequest(0.0, 1200, 10, (1, 2, 3)))
    b = synth.trace_text(TraceRequest(0.0, 700, 10, (1, 2)))
    c = synth.trace_text(TraceRequest(0.0, 700, 10, (9, 2)))
    tok = synth.tokenizer
    ids_a = tok.encode(a, add_special_tokens=False)
    ids_b = tok.encode(b, add_special_tokens=False)
    ids_c = tok.encode(c, add_special_tokens=False)
    assert len(ids_a) == 1200 and len(ids_b) == 700  # exact: word tokens round-trip
    assert ids_a[:700] == ids_b  # equal hash ids, equal token blocks
    assert ids_c[:512] != ids_b[:512] and ids_c[512:] == ids_b[512:700]  # the same block 2


def test_server_errors_keep_partial_results_and_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with FixedServer(0.01, 0.001, 3, mode="http_500") as url:
        code, report = bench(url, tmp_path, "--num-requests", "3")
    assert code == 1
    assert report["steps"][0]["summary"]["errors"] == {"http_500": 3}
    assert len(report["steps"][0]["requests"]) == 3
    assert "3 requests failed at c=1 (first: http_500" in capsys.readouterr().err


def test_a_server_with_api_keys_is_benched_with_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with FixedServer(0.01, 0.001, 3, api_key="sk-bench") as url:
        assert bench(url, tmp_path, "--num-requests", "2")[0] == 2  # the models check: 401
        assert "answered 401" in capsys.readouterr().err
        code, report = bench(url, tmp_path, "--num-requests", "2", "--api-key", "sk-bench")
        assert code == 0 and report["steps"][0]["summary"]["num_ok"] == 2
        monkeypatch.setenv("ARMATURE_BENCH_API_KEY", "sk-bench")
        code, report = bench(url, tmp_path, "--num-requests", "2")
        assert code == 0 and report["steps"][0]["summary"]["num_ok"] == 2
        assert bench(url, tmp_path, "--num-requests", "1", "--api-key", "sk bench")[0] == 2
        assert "--api-key must be printable ASCII" in capsys.readouterr().err


def test_malformed_sse_is_reported_by_type(tmp_path: Path) -> None:
    with FixedServer(0.01, 0.001, 3, mode="malformed") as url:
        code, report = bench(url, tmp_path, "--num-requests", "2")
    assert code == 1
    assert report["steps"][0]["summary"]["errors"] == {"malformed_sse": 2}


def test_unreachable_url_and_unreadable_trace_are_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "--url", "http://127.0.0.1:9", "--num-requests", "1"]) == 2
    assert "cannot reach http://127.0.0.1:9" in capsys.readouterr().err
    missing = tmp_path / "nope.jsonl"
    assert main(["bench", "--url", "http://127.0.0.1:9", "--trace", str(missing)]) == 2
    err = capsys.readouterr().err
    assert "cannot read trace" in err and err.count("\n") == 1


def test_a_sweep_writes_one_step_each_and_the_pareto_plot(tmp_path: Path) -> None:
    with FixedServer(0.05, 0.005, 5) as url:
        code, report = bench(url, tmp_path, "--sweep-concurrency", "1,4", "--num-requests", "8")
    assert code == 0
    steps = report["steps"]
    assert [s["step"] for s in steps] == ["c=1", "c=4"]
    assert steps[1]["summary"]["requests_per_s"] > 2.5 * steps[0]["summary"]["requests_per_s"]
    for name in ("pareto.png", "c_1/latency_cdf.png", "c_4/over_time.png", "report.md"):
        assert (tmp_path / name).stat().st_size > 1000, name


def test_multi_turn_sessions_resend_the_history(tmp_path: Path) -> None:
    seen: list[str] = []

    async def fake_send(request: Any) -> RequestRecord:
        body = "".join(u + a for u, a in request.history) + request.prompt
        seen.append(body)
        return RequestRecord(sent_s=0.0, done_s=0.0, text=f"<answer {len(seen)}>")

    import asyncio

    from armature.bench.client import BenchRequest
    from armature.bench.runner import LoadShape, run_load

    session = BenchRequest("hi.", 4, followups=("and?", "bye."))
    records, _ = asyncio.run(run_load([session], LoadShape("closed"), fake_send))
    assert len(records) == 3
    assert seen == ["hi.", "hi.<answer 1>and?", "hi.<answer 1>and?<answer 2>bye."]


def test_the_measured_part_starts_after_the_warmup() -> None:
    """`on_start` (where the client's CPU clock starts) comes between the warm-up's requests
    and the measured ones: the CPU figure counted the warm-up's CPU over the measured time."""
    events: list[str] = []

    async def fake_send(request: Any) -> RequestRecord:
        events.append(request.prompt)
        return RequestRecord(sent_s=0.0, done_s=0.0, text="ok")

    import asyncio

    from armature.bench.client import BenchRequest
    from armature.bench.runner import LoadShape, run_load

    requests = [BenchRequest(p, 4) for p in ("warm", "a", "b")]
    records, _ = asyncio.run(
        run_load(
            requests,
            LoadShape("closed"),
            fake_send,
            num_warmup=1,
            on_start=lambda: events.append("start"),
        )
    )
    assert events == ["warm", "start", "a", "b"]
    assert len(records) == 2


def test_multi_turn_against_a_server(tmp_path: Path) -> None:
    with FixedServer(0.01, 0.001, 3) as url:
        code, report = bench(
            url, tmp_path, "--multi-turn", "3", "--num-requests", "2", "--input-len", "16"
        )
    assert code == 0
    assert report["steps"][0]["summary"]["num_ok"] == 6  # 2 sessions x 3 turns
