"""A PNG of a replay's fleet over time (matplotlib, headless): workers per role in routing
(and starting) beside the arrival rate, then the windows' mean TTFT and ITL against their
targets."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from armature.outputs import replacing
from armature.sim.replay_config import FleetSample

__all__ = ["plot_fleet"]

FEW_SAMPLES = 20  # a timeline this short is drawn with markers: its points show alone


def plot_fleet(
    timeline: Sequence[FleetSample],
    path: Path,
    *,
    ttft_target_ms: float,
    itl_target_ms: float,
    title: str,
) -> Path:
    """Write the plot of `timeline` to `path` (parent directories created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    times = [s.time_s for s in timeline]
    fig, (workers, ttft, itl) = plt.subplots(3, 1, figsize=(11, 9), sharex=True)
    roles = sorted({role for s in timeline for role in s.serving})
    for role in roles:
        marker = "o" if len(times) <= FEW_SAMPLES else None
        serving = [s.serving.get(role, 0) for s in timeline]
        workers.step(times, serving, where="post", label=role, marker=marker)
        starting = [s.serving.get(role, 0) + s.starting.get(role, 0) for s in timeline]
        workers.step(times, starting, where="post", linestyle=":", label=f"{role} + starting")
    workers.set_ylabel("workers")
    workers.legend(loc="upper left", fontsize=8)
    rate = workers.twinx()
    rate.plot(
        times,
        [s.arrival_rate_per_s for s in timeline],
        color="grey",
        alpha=0.5,
        marker="o" if len(times) <= FEW_SAMPLES else None,
    )
    rate.set_ylabel("arrivals / s (grey)")
    for ax, values, target, label in (
        (ttft, [s.mean_ttft_ms for s in timeline], ttft_target_ms, "mean TTFT (ms)"),
        (itl, [s.mean_itl_ms for s in timeline], itl_target_ms, "mean ITL (ms)"),
    ):
        ax.plot(
            times,
            [float("nan") if v is None else v for v in values],
            label="window mean",
            marker="o" if len(times) <= FEW_SAMPLES else None,  # a lone point is no line
        )
        ax.axhline(target, color="red", linestyle="--", label="target")
        ax.set_ylabel(label)
        ax.legend(loc="upper left", fontsize=8)
        ax.grid(alpha=0.3)
    ttfts = [s.mean_ttft_ms for s in timeline if s.mean_ttft_ms is not None]
    if ttfts and max(ttfts) > 10 * ttft_target_ms:  # a queue that ran away: log scale
        ttft.set_yscale("log")
    else:
        ttft.set_ylim(bottom=0)
    itl.set_ylim(bottom=0)
    itl.set_xlabel("seconds from the first arrival")
    workers.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    try:
        with replacing(path) as temp:
            fig.savefig(temp, dpi=100, bbox_inches="tight")
    finally:
        plt.close(fig)
    return path
