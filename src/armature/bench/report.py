"""A run's report: JSON (summary, settings, per-request records), Markdown and a terminal
table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from armature.bench.client import RequestRecord
from armature.bench.stats import BenchSummary
from armature.outputs import write_atomically
from armature.workload.measure import LatencySummary

__all__ = ["summary_table", "write_report"]


def summary_table(summary: BenchSummary) -> str:
    rows = [
        ("requests ok / sent", f"{summary.num_ok} / {summary.num_requests}"),
        ("errors", ", ".join(f"{k}: {v}" for k, v in summary.errors.items()) or "none"),
        ("wall time s", f"{summary.wall_time_s:.2f}"),
        ("requests/s", f"{summary.requests_per_s:.2f}"),
        ("output tokens/s", f"{summary.output_tokens_per_s:.1f}"),
        ("output tokens/s per user", f"{summary.output_tokens_per_s_per_user:.1f}"),
    ]
    for name, lat in (("TTFT", summary.ttft_ms), ("ITL", summary.itl_ms), ("E2E", summary.e2e_ms)):
        shown = "n/a"  # no request gave one (all failed)
        if lat is not None:
            shown = f"{lat.p50:.1f} / {lat.p90:.1f} / {lat.p99:.1f} / {lat.mean:.1f}"
        rows.append((f"{name} ms p50/p90/p99/mean", shown))
    rows.append(("bench client CPU", f"{summary.client_cpu_percent:.0f}% of one core"))
    if summary.goodput_per_s is not None:
        rows.append(
            (
                "goodput (met both SLOs)",
                f"{summary.goodput_requests} requests, {summary.goodput_per_s:.2f}/s",
            )
        )
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


def _record_json(record: RequestRecord) -> dict[str, Any]:
    return {
        "ttft_ms": None if record.ttft_s is None else record.ttft_s * 1000,
        "e2e_ms": record.e2e_s * 1000,
        "prompt_tokens": record.prompt_tokens,
        "output_tokens": record.output_tokens,
        "error": record.error,
        "error_detail": record.error_detail or None,
        "sent_s": record.sent_s,
    }


def pareto_table(points: list[tuple[str, BenchSummary]]) -> str:
    header = (
        "| step | requests/s | output tok/s | tok/s per user | TTFT p50 ms | TTFT p99 ms "
        "| ITL p50 ms | goodput/s | errors |"
    )
    lines = [header, "|" + "---|" * 9]
    for label, s in points:
        goodput = "n/a (no --slo-*)" if s.goodput_per_s is None else f"{s.goodput_per_s:.2f}"
        lines.append(
            f"| {label} | {s.requests_per_s:.2f} | {s.output_tokens_per_s:.1f} | "
            f"{s.output_tokens_per_s_per_user:.1f} | {_ms(s.ttft_ms, 'p50')} | "
            f"{_ms(s.ttft_ms, 'p99')} | {_ms(s.itl_ms, 'p50')} | {goodput} | "
            f"{s.num_requests - s.num_ok} |"
        )
    return "\n".join(lines)


def _ms(lat: LatencySummary | None, field: str) -> str:
    """One percentile of `lat` for a table ("n/a" where no request gave one)."""
    return "n/a" if lat is None else f"{getattr(lat, field):.1f}"


def write_report(
    directory: Path,
    results: list[tuple[str, Any, BenchSummary, list[RequestRecord]]],
    settings: dict[str, Any],
) -> list[Path]:
    """report.json and report.md for the whole run, and PNG plots: latency CDFs and
    throughput over time per step (in step subdirectories for a sweep), and pareto.png."""
    from armature.bench.plots import plot_pareto, plot_run

    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    steps = []
    for label, shape, summary, records in results:
        step_dir = directory if len(results) == 1 else directory / label.replace("=", "_")
        step_dir.mkdir(parents=True, exist_ok=True)
        paths += plot_run(step_dir, records)
        steps.append(
            {
                "step": label,
                "shape": {
                    "kind": shape.kind,
                    "concurrency": shape.concurrency,
                    "rate_rps": shape.rate_rps,
                },
                "summary": msgspec.to_builtins(summary),
                "requests": [_record_json(r) for r in records],
            }
        )
    if len(results) > 1:
        paths.append(plot_pareto(directory, [(label, s) for label, _, s, _ in results]))
    json_path = directory / "report.json"
    write_atomically(json_path, json.dumps({"settings": settings, "steps": steps}, indent=2))
    md = ["# armature bench", "", *(f"- {k}: {v}" for k, v in settings.items()), ""]
    for label, _, summary, _ in results:
        md += [f"## {label}", "", "```", summary_table(summary), "```", ""]
    if len(results) > 1:
        md += ["## Sweep", "", pareto_table([(label, s) for label, _, s, _ in results]), ""]
    md_path = directory / "report.md"
    write_atomically(md_path, "\n".join(md))
    return [json_path, md_path, *paths]
