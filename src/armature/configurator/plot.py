"""The Pareto plot (PNG, matplotlib, headless): tokens/s per GPU against tokens/s per user.

    each mode, by color   every estimated operating point (faint dots), and its Pareto front
                          (a line)
    the ranking           the first configurations, black-edged: the chosen one (#1) a gold
                          star, the other simulated finalists squares in their mode's color,
                          the rest (estimate only) crosses
    labels                one per position (ranks that coincide share one, "#4-6"), placed at
                          the first of a few offsets where it overlaps no other label and no
                          marker, with a line to its point

Every kind of mark has its entry in the legend, which sits beside the axes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.backend_bases import RendererBase
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.text import Annotation, Text
from matplotlib.transforms import Bbox

from armature.configurator.estimate import Prediction
from armature.configurator.search import Ranked, SearchResult
from armature.configurator.space import AGG, DISAGG, Deployment
from armature.outputs import replacing

__all__ = ["get_pareto_front", "label_ranks", "make_pareto_figure", "plot_pareto"]

MODE_STYLE = {AGG: ("aggregated", "tab:blue"), DISAGG: ("disaggregated", "tab:orange")}
CHOSEN = "chosen (#1)"
FINALIST = "simulated finalist"
ESTIMATED = "ranked, estimate only"
# where a label may go, in points from its marker, tried in turn
# (to the left: the label's right end there)
LABEL_OFFSETS_PT = ((10, 10), (10, -16), (-10, 10), (-10, -16), (12, 24), (-12, 24), (12, -30))
MARKER_HALF_SIZE_PX = 7.0
LABEL_PAD_PX = 2.0


def get_pareto_front(points: Sequence[Prediction]) -> list[Prediction]:
    """The points no other point beats on both tokens/s per user and per GPU, by user."""
    ordered = sorted(points, key=lambda p: (-p.tokens_per_s_per_user, -p.tokens_per_s_per_gpu))
    front: list[Prediction] = []
    for p in ordered:
        if not front or p.tokens_per_s_per_gpu > front[-1].tokens_per_s_per_gpu:
            front.append(p)
    return front


@dataclass(frozen=True)
class Mark:
    """Ranked configurations at one position: their ranks, and the first one's kind."""

    ranks: tuple[int, ...]
    per_user: float
    per_gpu: float
    kind: str  # CHOSEN, FINALIST or ESTIMATED
    mode: str
    layout: str  # the first one's: "agg tp1 x8"

    @property
    def label(self) -> str:
        """The ranks; the chosen one's layout too."""
        ranks = label_ranks(self.ranks)
        return f"{ranks} {self.layout}" if self.kind == CHOSEN else ranks


def label_ranks(ranks: Sequence[int]) -> str:
    """'#4-6' for a run of ranks, '#2,#5' otherwise, '#1' for one."""
    if len(ranks) > 1 and list(ranks) == list(range(ranks[0], ranks[-1] + 1)):
        return f"#{ranks[0]}-{ranks[-1]}"
    return ",".join(f"#{r}" for r in ranks)


def _marks(ranked: Sequence[Ranked]) -> list[Mark]:
    """The ranking's configurations grouped by position (to 3 significant digits), in
    rank order."""
    groups: dict[tuple[str, str], list[tuple[int, Ranked]]] = {}
    for rank, r in enumerate(ranked, start=1):
        p = r.prediction
        key = (f"{p.tokens_per_s_per_user:.3g}", f"{p.tokens_per_s_per_gpu:.3g}")
        groups.setdefault(key, []).append((rank, r))
    marks = []
    for members in groups.values():
        first_rank, first = members[0]
        kind = CHOSEN if first_rank == 1 else (FINALIST if first.simulated else ESTIMATED)
        p = first.prediction
        ranks = tuple(rank for rank, _ in members)
        per_user, per_gpu = p.tokens_per_s_per_user, p.tokens_per_s_per_gpu
        layout = f"{first.deployment.describe().split(',')[0]} x{first.num_groups}"
        marks.append(Mark(ranks, per_user, per_gpu, kind, first.deployment.mode, layout))
    return marks


def _plot_modes(ax: Axes, points: Sequence[tuple[Deployment, Prediction]]) -> None:
    for mode, (name, color) in MODE_STYLE.items():
        predictions = [p for c, p in points if c.mode == mode]
        if not predictions:
            continue
        ax.scatter(
            [p.tokens_per_s_per_user for p in predictions],
            [p.tokens_per_s_per_gpu for p in predictions],
            s=5,
            alpha=0.25,
            color=color,
            linewidths=0,
            label=f"{name}: every operating point (estimate)",
        )
        front = get_pareto_front(predictions)
        ax.plot(
            [p.tokens_per_s_per_user for p in front],
            [p.tokens_per_s_per_gpu for p in front],
            color=color,
            marker="o",
            markersize=3,
            label=f"{name}: Pareto front (estimate)",
        )


# each kind of mark: its marker, size, and fill (None: its mode's color)
MARK_STYLE: dict[str, tuple[str, float, str | None]] = {
    CHOSEN: ("*", 260.0, "gold"),
    FINALIST: ("s", 70.0, None),
    ESTIMATED: ("X", 70.0, None),
}


def _plot_marks(ax: Axes, marks: Sequence[Mark]) -> list[Line2D]:
    """The marks, and a legend entry for each kind present (gray fill where the mark's is
    its mode's color)."""
    for mark in marks:
        marker, size, fill = MARK_STYLE[mark.kind]
        color = fill or MODE_STYLE[mark.mode][1]
        ax.scatter(
            [mark.per_user], [mark.per_gpu], marker=marker, s=size, facecolor=color,
            edgecolor="k", linewidths=1, zorder=3,
        )  # fmt: skip
    kinds = [kind for kind in MARK_STYLE if any(m.kind == kind for m in marks)]
    entries = []
    for kind in kinds:
        marker, size, fill = MARK_STYLE[kind]
        label = kind if fill else f"{kind} (fill: its mode)"
        entries.append(
            Line2D([], [], linestyle="", marker=marker, markersize=size**0.5,
                   markerfacecolor=fill or "0.75", markeredgecolor="k", label=label)
        )  # fmt: skip
    return entries


def _shared_area(box: Bbox, other: Bbox) -> float:
    width = min(box.x1, other.x1) - max(box.x0, other.x0)
    height = min(box.y1, other.y1) - max(box.y0, other.y0)
    return width * height if width > 0 and height > 0 else 0.0


def _overlap(box: Bbox, others: Sequence[Bbox], within: Bbox) -> float:
    """The area, in square pixels, `box` shares with `others` or lies outside `within`."""
    outside = box.width * box.height - _shared_area(box, within)
    return outside + sum(_shared_area(box, other) for other in others)


def _text_box(label: Annotation, renderer: RendererBase) -> Bbox:
    """A label's text with its padding, in pixels: its line to the point left out (that line
    starts at the point's own marker)."""
    label.update_positions(renderer)  # the text's offset from its point, in pixels
    return Text.get_window_extent(label, renderer).padded(LABEL_PAD_PX)


def _place_labels(ax: Axes, marks: Sequence[Mark], renderer: RendererBase) -> list[Annotation]:
    """One label per mark, each at the first offset whose text overlaps no label placed so
    far, no marker and not the axes' edge (else the offset of least overlap)."""
    to_px = ax.transData.transform
    within = ax.get_window_extent(renderer)
    taken = []
    for mark in marks:
        x, y = to_px((mark.per_user, mark.per_gpu))
        h = MARKER_HALF_SIZE_PX
        taken.append(Bbox.from_extents(x - h, y - h, x + h, y + h))
    labels = []
    for mark in marks:
        best: tuple[float, Annotation] | None = None
        for offset in LABEL_OFFSETS_PT:
            label = ax.annotate(
                mark.label,
                (mark.per_user, mark.per_gpu),
                xytext=offset,
                textcoords="offset points",
                horizontalalignment="left" if offset[0] >= 0 else "right",
                fontsize=8,
                arrowprops={"arrowstyle": "-", "color": "0.4", "linewidth": 0.6},
                bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "alpha": 0.8, "lw": 0},
                zorder=4,
            )
            label.set_in_layout(False)
            overlap = _overlap(_text_box(label, renderer), taken, within)
            if best is None or overlap < best[0]:
                if best is not None:
                    best[1].remove()
                best = (overlap, label)
            else:
                label.remove()
            if overlap == 0.0:
                break
        assert best is not None
        taken.append(_text_box(best[1], renderer))
        labels.append(best[1])
    return labels


def make_pareto_figure(result: SearchResult, title: str, num_marked: int = 10) -> Figure:
    """The plot as a figure (the caller closes it): every estimate by mode, each mode's
    front, and the first `num_marked` configurations of the ranking, labelled by rank."""
    fig, ax = plt.subplots(figsize=(10, 5.8), layout="constrained")
    _plot_modes(ax, result.points)
    marks = _marks(result.ranked[:num_marked])
    entries = _plot_marks(ax, marks)
    ax.set_xlabel("tokens/s per user (1000 / ITL)")
    ax.set_ylabel("tokens/s per GPU")
    ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.set_ylim(bottom=0.0, top=ax.get_ylim()[1] * 1.06)  # room for the top labels
    handles = ax.get_legend_handles_labels()[0] + entries
    legend = ax.legend(
        handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8,
        borderaxespad=0.0,
    )  # fmt: skip
    for handle in legend.legend_handles:  # the faint dots, legible in the legend
        if handle is not None:
            handle.set_alpha(1.0)
    canvas = fig.canvas
    assert isinstance(canvas, FigureCanvasAgg)  # matplotlib.use("Agg") above
    canvas.draw()  # the layout is final: labels are placed in its pixels
    _place_labels(ax, marks, canvas.get_renderer())
    return fig


def plot_pareto(result: SearchResult, path: Path, title: str, num_marked: int = 10) -> Path:
    """Write the plot to `path` (parent directories created); returns it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig = make_pareto_figure(result, title, num_marked)
    try:
        with replacing(path) as temp:
            fig.savefig(temp, dpi=110)
    finally:
        plt.close(fig)
    return path
