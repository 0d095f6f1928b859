"""The Pareto plot (PNG, matplotlib, headless): tokens/s per GPU against tokens/s per user of
every estimated operating point, the front of each mode, and the ranked configurations."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from armature.configurator.estimate import Prediction
from armature.configurator.search import SearchResult
from armature.configurator.space import AGG, DISAGG, Deployment

__all__ = ["get_pareto_front", "plot_pareto"]


def get_pareto_front(points: Sequence[Prediction]) -> list[Prediction]:
    """The points no other point beats on both tokens/s per user and per GPU, by user."""
    ordered = sorted(points, key=lambda p: (-p.tokens_per_s_per_user, -p.tokens_per_s_per_gpu))
    front: list[Prediction] = []
    for p in ordered:
        if not front or p.tokens_per_s_per_gpu > front[-1].tokens_per_s_per_gpu:
            front.append(p)
    return front


def _by_mode(points: Sequence[tuple[Deployment, Prediction]], mode: str) -> list[Prediction]:
    return [p for c, p in points if c.mode == mode]


def plot_pareto(result: SearchResult, path: Path, title: str, num_marked: int = 10) -> Path:
    """Write the plot to `path` (parent directories created), the first `num_marked`
    configurations of the ranking marked by rank; returns it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(8, 5.5))
    for mode, color in ((AGG, "tab:blue"), (DISAGG, "tab:orange")):
        points = _by_mode(result.points, mode)
        if not points:
            continue
        ax.scatter(
            [p.tokens_per_s_per_user for p in points],
            [p.tokens_per_s_per_gpu for p in points],
            s=4,
            alpha=0.15,
            color=color,
        )
        front = get_pareto_front(points)
        ax.plot(
            [p.tokens_per_s_per_user for p in front],
            [p.tokens_per_s_per_gpu for p in front],
            color=color,
            marker="o",
            markersize=3,
            label=f"{mode} front (estimate)",
        )
    for rank, r in enumerate(result.ranked[:num_marked], start=1):
        p = r.prediction
        marker = "*" if rank == 1 else ("s" if r.simulated else "x")
        ax.scatter(
            [p.tokens_per_s_per_user], [p.tokens_per_s_per_gpu], marker=marker, s=90, color="k"
        )
        ax.annotate(str(rank), (p.tokens_per_s_per_user, p.tokens_per_s_per_gpu), fontsize=8)
    ax.set_xlabel("tokens/s per user (1000 / ITL)")
    ax.set_ylabel("tokens/s per GPU")
    ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
