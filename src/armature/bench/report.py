"""A run's report: JSON (summary, settings, per-request records), Markdown and a terminal
table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from armature.bench.client import RequestRecord
from armature.bench.stats import BenchSummary

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
        rows.append(
            (
                f"{name} ms p50/p90/p99/mean",
                f"{lat.p50:.1f} / {lat.p90:.1f} / {lat.p99:.1f} / {lat.mean:.1f}",
            )
        )
    if summary.slo_ttft_ms is not None or summary.slo_itl_ms is not None:
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


def write_report(
    directory: Path,
    summary: BenchSummary,
    records: list[RequestRecord],
    settings: dict[str, Any],
) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    json_path = directory / "report.json"
    json_path.write_text(
        json.dumps(
            {
                "settings": settings,
                "summary": msgspec.to_builtins(summary),
                "requests": [_record_json(r) for r in records],
            },
            indent=2,
        )
    )
    md_path = directory / "report.md"
    md_path.write_text(
        "# armature bench\n\n"
        + "\n".join(f"- {k}: {v}" for k, v in settings.items())
        + "\n\n```\n"
        + summary_table(summary)
        + "\n```\n"
    )
    return [json_path, md_path]
