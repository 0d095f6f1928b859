"""Predicted against measured, one panel per figure (PNG, matplotlib, headless): each point a
configuration, the diagonal where a prediction is exact and a band of +-`band` around it.

    marker   o aggregated, s disaggregated (the caller's `kind` per point)
    color    one per group (for example the number of workers of a case)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

__all__ = ["Point", "plot_predicted_vs_measured"]

MARKERS = {"aggregated": "o", "disaggregated": "s"}


@dataclass(frozen=True)
class Point:
    group: str  # colored alike
    kind: str  # a MARKERS key
    measured: dict[str, float]  # by panel title
    predicted: dict[str, float]


def plot_predicted_vs_measured(
    points: Sequence[Point], panels: Sequence[str], band: float, title: str, path: Path
) -> None:
    """One panel per name in `panels`: predicted (y) against measured (x), both from zero."""
    groups = sorted({p.group for p in points})
    cmap = plt.get_cmap("tab10")
    colors = {group: cmap(i % 10) for i, group in enumerate(groups)}
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 5.0), squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        top = 1.1 * max(max(p.measured[panel], p.predicted[panel]) for p in points)
        line = [0.0, top]
        ax.fill_between(
            line,
            [(1 - band) * v for v in line],
            [(1 + band) * v for v in line],
            color="0.9",
            label=f"within {band:.0%}",
        )
        ax.plot(line, line, color="0.4", linewidth=1, label="exact")
        for p in points:
            ax.scatter(
                p.measured[panel],
                p.predicted[panel],
                marker=MARKERS[p.kind],
                color=colors[p.group],
                edgecolor="black",
                s=45,
                zorder=3,
            )
        ax.set_xlim(0, top)
        ax.set_ylim(0, top)
        ax.set_aspect("equal")
        ax.set_xlabel(f"{panel}, measured")
        ax.set_ylabel(f"{panel}, predicted")
        ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    for group in groups:
        handles.append(plt.Line2D([], [], linestyle="", marker="o", color=colors[group]))
        labels.append(group)
    for kind, marker in MARKERS.items():
        handles.append(plt.Line2D([], [], linestyle="", marker=marker, color="0.5"))
        labels.append(kind)
    fig.legend(handles, labels, loc="center right", frameon=False)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0, 0.83, 0.95))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
