"""bench.configurator_native's verdicts on its runs: each run's figures (predicted several
ways and measured), a table row, the checks against the issue's targets (each figure within
15%; the first-ranked configuration the measured best, or within 5% of it, on tokens/s per
worker averaged over the passes), and the predicted-vs-measured plot."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from armature.configurator.search import Ranked
from bench.prediction_plot import Point, plot_predicted_vs_measured

__all__ = [
    "SLOWER_STEPS",
    "TARGET_ERROR",
    "TARGET_RANK",
    "Checked",
    "Figures",
    "checks",
    "error",
    "plot",
    "row",
]

TARGET_ERROR = 0.15  # |predicted - measured| / measured, TTFT p50 and ITL p50
TARGET_RANK = 0.05  # the first-ranked within this of the measured best's tokens/s per worker
# every step time this many times longer: how far the prediction moves for a machine that
# runs 10% slower than its profile (near the knee, TTFT moves far more than 10%)
SLOWER_STEPS = 1.10


@dataclass(frozen=True)
class Figures:
    ttft_p50_ms: float
    itl_p50_ms: float
    itl_mean_ms: float
    tokens_per_s_per_worker: float


@dataclass(frozen=True)
class Checked:
    case_workers: int
    rank: int  # the configurator's, 1 = its choice
    run: int  # the pass, from 1
    ranked: Ranked
    rate_per_s: float  # offered to the whole deployment
    num_requests: int
    # from the median of the profiles the case made before the run (the search's and one
    # before each run so far, this one's included): the machine's speed over the case
    predicted: Figures
    at_search: Figures  # from the case's profile, which the search ranked on
    same_requests: Figures  # the measured run's own requests replayed, as `predicted`
    a_core_each: Figures  # as `predicted`, each engine taken to have a core to itself
    slower_steps: Figures  # as `predicted`, every step time SLOWER_STEPS times longer
    measured: Figures
    meets_targets: bool  # measured
    just_before: Figures | None = None  # from the one profile made just before the run
    # as `predicted`, prompt steps at the load pass's measured-over-modeled time over its
    # decode steps' (the mocker's rule until 12-05) instead of at their own
    prompt_relative: Figures | None = None

    @property
    def label(self) -> str:
        return f"{self.ranked.deployment.describe()} x{self.ranked.num_groups}"


def error(value: float, reference: float) -> float:
    return (value - reference) / reference if reference else float("inf")


def row(c: Checked) -> list[object]:
    p, m, a, same, alone = c.predicted, c.measured, c.at_search, c.same_requests, c.a_core_each
    slower = c.slower_steps

    def cell(predicted: float, measured: float, digits: int) -> str:
        e = error(predicted, measured)
        return f"{predicted:.{digits}f} / {measured:.{digits}f} ({e:+.1%})"

    return [
        c.case_workers,
        c.rank,
        c.run,
        c.label,
        f"{c.rate_per_s:.2f}",
        c.num_requests,
        cell(p.ttft_p50_ms, m.ttft_p50_ms, 0),
        cell(p.itl_p50_ms, m.itl_p50_ms, 1),
        cell(p.itl_mean_ms, m.itl_mean_ms, 1),
        _errors(c.just_before, m),
        _errors(a, m),
        _errors(c.prompt_relative, m),
        _errors(same, m),
        _errors(alone, m),
        f"{slower.ttft_p50_ms:.0f} ({error(slower.ttft_p50_ms, p.ttft_p50_ms):+.1%})",
        f"{p.tokens_per_s_per_worker:.1f} / {m.tokens_per_s_per_worker:.1f}",
        "yes" if c.meets_targets else "no",
    ]


def _errors(predicted: Figures | None, measured: Figures) -> str:
    """The two checked figures' errors as a cell ("TTFT / ITL"); blank where none."""
    if predicted is None:
        return ""
    return " / ".join(f"{e:+.1%}" for e in _p50_errors(predicted, measured).values())


# the other predictions each run gets, counted after the headline's
ALTERNATIVES: tuple[tuple[str, Callable[[Checked], Figures | None]], ...] = (
    ("from the one profile made just before the run", lambda c: c.just_before),
    (
        "with prompt steps at their ratio to the decode steps' (the rule until 12-05)",
        lambda c: c.prompt_relative,
    ),
)


def _p50_errors(predicted: Figures, measured: Figures) -> dict[str, float]:
    """The two checked figures' errors, TTFT p50 first."""
    return {
        "TTFT p50": error(predicted.ttft_p50_ms, measured.ttft_p50_ms),
        "ITL p50": error(predicted.itl_p50_ms, measured.itl_p50_ms),
    }


def checks(checked: list[Checked]) -> list[str]:
    """A line per figure and run, the count within the target, and per case whether the
    first-ranked configuration is the measured best (tokens/s per worker averaged over the
    passes; one that missed the targets in any pass does not count as meeting them)."""
    lines = []
    num_within = 0
    for c in checked:
        for what, e in _p50_errors(c.predicted, c.measured).items():
            within = abs(e) <= TARGET_ERROR
            num_within += within
            verdict = "PASS" if within else "MISS"
            lines.append(
                f"- {verdict}: {c.label} ({c.case_workers} workers, pass {c.run}) {what} {e:+.1%}"
            )
    lines.append(
        f"- {num_within} of {2 * len(checked)} figures within {TARGET_ERROR:.0%} of the measured"
    )
    for what, get in ALTERNATIVES:
        other = [(p, c.measured) for c in checked if (p := get(c)) is not None]
        if other:
            count = sum(
                abs(e) <= TARGET_ERROR for p, m in other for e in _p50_errors(p, m).values()
            )
            lines.append(
                f"- {count} of {2 * len(other)} figures within {TARGET_ERROR:.0%} of the "
                f"measured {what}"
            )
    for total in sorted({c.case_workers for c in checked}, reverse=True):
        case = [c for c in checked if c.case_workers == total]
        by_rank: dict[int, list[Checked]] = {}
        for c in case:
            by_rank.setdefault(c.rank, []).append(c)

        def mean_tokens_s(runs: list[Checked]) -> float:
            return sum(c.measured.tokens_per_s_per_worker for c in runs) / len(runs)

        good = {k: v for k, v in by_rank.items() if all(c.meets_targets for c in v)}
        first = by_rank[min(by_rank)]
        if not good:
            lines.append(f"- MISS: {total} workers: no configuration met the targets measured")
            continue
        best = max(good.values(), key=mean_tokens_s)
        short = 1.0 - mean_tokens_s(first) / mean_tokens_s(best)
        first_meets = min(by_rank) in good
        ok = first_meets and short <= TARGET_RANK
        lines.append(
            f"- {'PASS' if ok else 'MISS'}: {total} workers: ranked first {first[0].label} "
            f"({'meets' if first_meets else 'misses'} the targets measured) is "
            f"{short:.1%} below the measured best {best[0].label}"
        )
    return lines


def plot(checked: list[Checked], path: Path) -> None:
    points = [
        Point(
            f"{c.case_workers} workers",
            "disaggregated" if c.ranked.deployment.num_prefill_workers else "aggregated",
            {"TTFT p50 ms": c.measured.ttft_p50_ms, "ITL p50 ms": c.measured.itl_p50_ms},
            {"TTFT p50 ms": c.predicted.ttft_p50_ms, "ITL p50 ms": c.predicted.itl_p50_ms},
        )
        for c in checked
    ]
    title = "Configurator (--system local): predicted vs measured, native engine"
    plot_predicted_vs_measured(points, ("TTFT p50 ms", "ITL p50 ms"), TARGET_ERROR, title, path)
