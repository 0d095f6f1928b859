"""The Pareto plot: a legend entry for every kind of mark, one label per position of the
ranking (ranks that coincide share it), labels that overlap neither each other nor the axes'
edge, and the PNG written."""

from __future__ import annotations

import itertools
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.text import Annotation, Text

from armature.configurator.estimate import Prediction
from armature.configurator.plot import label_ranks, make_pareto_figure, plot_pareto
from armature.configurator.search import Ranked, SearchResult
from armature.configurator.space import AGG, DISAGG, Deployment

AGG_1 = Deployment(AGG, 1, 256, 8192)
AGG_2 = Deployment(AGG, 2, 512, 8192)
DISAGG_1 = Deployment(DISAGG, 2, 512, 2048, prefill_tp=1, num_prefill_workers=2)


def _point(per_user: float, per_gpu: float) -> Prediction:
    return Prediction(50.0, 1000.0 / per_user, 1.0, per_gpu, 8)


def _result() -> SearchResult:
    """Ranks 1-3 simulated (agg, disagg, agg); 4-6 estimates at one position, 7 near 1."""
    points = [(AGG_1, _point(u, 7000.0 - 30.0 * u)) for u in range(30, 230, 10)]
    points += [(DISAGG_1, _point(u, 5200.0 - 22.0 * u)) for u in range(80, 230, 10)]
    ranked = [
        Ranked(AGG_1, 8, _point(34.2, 6828.0), 0.7, simulated=True),
        Ranked(DISAGG_1, 2, _point(95.2, 5107.0), 0.6, simulated=True),
        Ranked(AGG_2, 4, _point(53.7, 5768.0), 0.9, simulated=True),
        *(Ranked(AGG_1, 8, _point(35.8, 6883.0), 0.7) for _ in range(3)),
        Ranked(AGG_1, 8, _point(36.5, 6860.0), 0.7),
    ]
    return SearchResult(ranked, points, num_deployments=7, num_fitting=7)


def _labels(fig: plt.Figure) -> list[Annotation]:
    return [t for t in fig.axes[0].texts if isinstance(t, Annotation)]


def test_the_legend_names_every_kind_of_mark() -> None:
    fig = make_pareto_figure(_result(), "title")
    try:
        legend = fig.axes[0].get_legend()
        assert [t.get_text() for t in legend.get_texts()] == [
            "aggregated: every operating point (estimate)",
            "aggregated: Pareto front (estimate)",
            "disaggregated: every operating point (estimate)",
            "disaggregated: Pareto front (estimate)",
            "chosen (#1)",
            "simulated finalist (fill: its mode)",
            "ranked, estimate only (fill: its mode)",
        ]
    finally:
        plt.close(fig)


def test_one_label_per_position_none_overlapping_and_all_inside_the_axes() -> None:
    fig = make_pareto_figure(_result(), "title")
    try:
        labels = _labels(fig)
        assert [label.get_text() for label in labels] == ["#1 agg tp1 x8", "#2", "#3", "#4-6", "#7"]
        fig.canvas.draw()  # measure the labels as drawn
        renderer = fig.canvas.get_renderer()
        boxes = [Text.get_window_extent(label, renderer) for label in labels]  # text, no line
        for a, b in itertools.combinations(boxes, 2):
            assert not a.overlaps(b)
        axes_box = fig.axes[0].get_window_extent(renderer)
        for box in boxes:
            assert axes_box.x0 <= box.x0 and box.x1 <= axes_box.x1
            assert axes_box.y0 <= box.y0 and box.y1 <= axes_box.y1
    finally:
        plt.close(fig)


def test_only_the_first_configurations_of_the_ranking_are_marked() -> None:
    fig = make_pareto_figure(_result(), "title", num_marked=2)
    try:
        assert [label.get_text() for label in _labels(fig)] == ["#1 agg tp1 x8", "#2"]
        legend = fig.axes[0].get_legend()
        assert "ranked, estimate only (fill: its mode)" not in [
            t.get_text() for t in legend.get_texts()
        ]
    finally:
        plt.close(fig)


def test_rank_labels() -> None:
    assert label_ranks([1]) == "#1"
    assert label_ranks([4, 5, 6]) == "#4-6"
    assert label_ranks([2, 5]) == "#2,#5"


def test_plot_pareto_writes_a_png(tmp_path: Path) -> None:
    path = plot_pareto(_result(), tmp_path / "sub" / "pareto.png", "title")
    assert path == tmp_path / "sub" / "pareto.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plt.get_fignums() == []  # the figure was closed
