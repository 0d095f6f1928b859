"""PNG plots of a run (matplotlib, headless): latency CDFs, TTFT and output throughput over
time, and for sweeps the throughput-vs-latency (Pareto) curve."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from armature.bench.client import RequestRecord
from armature.bench.stats import BenchSummary
from armature.outputs import replacing

__all__ = ["plot_pareto", "plot_run", "sent_points"]


def _cdf(ax: plt.Axes, values_ms: Sequence[float], label: str) -> None:
    ordered = sorted(values_ms)
    if not ordered:
        return
    ys = [(i + 1) / len(ordered) for i in range(len(ordered))]
    ax.step(ordered, ys, where="post", label=label)


def sent_points(
    records: Sequence[RequestRecord],
) -> tuple[list[tuple[float, float]], list[float]]:
    """(seconds since the first request was sent, TTFT ms) of each request that finished,
    and the send times of those that failed (the first send among all of them: 0)."""
    if not records:
        return [], []
    start = min(r.sent_s for r in records)
    ok = [(r.sent_s - start, r.ttft_s * 1000) for r in records if _ok(r) and r.ttft_s is not None]
    failed = [r.sent_s - start for r in records if r.error is not None]
    return ok, failed


def _ok(record: RequestRecord) -> bool:
    return record.error is None and record.ttft_s is not None


def plot_run(directory: Path, records: Sequence[RequestRecord]) -> list[Path]:
    """latency_cdf.png (the requests that finished; the title counts those that failed) and
    over_time.png (TTFT by send time, failed requests marked at theirs; output tokens/s)."""
    ok = [r for r in records if _ok(r)]
    num_failed = sum(1 for r in records if r.error is not None)
    paths = []
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, (name, values) in zip(
        axes,
        (
            ("TTFT", [r.ttft_s * 1000 for r in ok if r.ttft_s is not None]),
            ("ITL", [x * 1000 for r in ok for x in r.itl_s()]),
            ("E2E", [r.e2e_s * 1000 for r in ok]),
        ),
        strict=True,
    ):
        _cdf(ax, values, name)
        ax.set_xlabel(f"{name} (ms)")
        ax.set_ylabel("fraction of requests" if name != "ITL" else "fraction of tokens")
        failed = f"; {num_failed} failed requests not shown" if num_failed else ""
        ax.set_title(f"{name} CDF ({len(values)} samples{failed})")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path = directory / "latency_cdf.png"
    with replacing(path) as temp:
        fig.savefig(temp, dpi=90)
    plt.close(fig)
    paths.append(path)

    points, failed_s = sent_points(records)
    if points or failed_s:
        start = min(r.sent_s for r in records)
        fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
        top.scatter([x for x, _ in points], [y for _, y in points], s=8, label="TTFT")
        if failed_s:
            top.scatter(
                failed_s,
                [0.0] * len(failed_s),
                s=24,
                marker="x",
                color="tab:red",
                label=f"failed ({len(failed_s)}), at their send times",
            )
            top.legend(loc="upper left")
        top.set_ylabel("TTFT (ms)")
        top.ticklabel_format(axis="y", useOffset=False)
        top.grid(alpha=0.3)
        end = max(r.done_s for r in records) - start
        bin_s = max(0.05, end / 60)  # about 60 bins whatever the run's length
        bins = [0.0] * (int(end / bin_s) + 1)
        for r in ok:
            for t, n in zip(r.chunk_times_s, r.chunk_tokens, strict=False):
                bins[min(len(bins) - 1, int((t - start) / bin_s))] += n
        rates = [b / bin_s for b in bins]
        bottom.step([i * bin_s for i in range(len(rates))], rates, where="post")
        top.set_title(f"TTFT by send time, and output tokens/s ({bin_s:.2g} s bins)")
        bottom.set_xlabel("seconds since the first request")
        bottom.set_ylabel("output tokens/s (requests that finished)")
        bottom.grid(alpha=0.3)
        fig.tight_layout()
        path = directory / "over_time.png"
        with replacing(path) as temp:
            fig.savefig(temp, dpi=90)
        plt.close(fig)
        paths.append(path)
    return paths


def plot_pareto(directory: Path, points: Sequence[tuple[str, BenchSummary]]) -> Path:
    """One point per sweep step: output tokens/s per user against total output tokens/s."""
    fig, ax = plt.subplots(figsize=(7, 5))
    xs = [s.output_tokens_per_s_per_user for _, s in points]
    ys = [s.output_tokens_per_s for _, s in points]
    ax.plot(xs, ys, marker="o")
    for (label, _), x, y in zip(points, xs, ys, strict=True):
        ax.annotate(label, (x, y), textcoords="offset points", xytext=(5, 5))
    ax.set_xlabel("output tokens/s per user (interactivity)")
    ax.set_ylabel("output tokens/s (throughput)")
    ax.set_title("Throughput vs interactivity")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = directory / "pareto.png"
    with replacing(path) as temp:
        fig.savefig(temp, dpi=90)
    plt.close(fig)
    return path
