"""The search's answer as text: the ranked table, and the best aggregated and the best
disaggregated configuration side by side."""

from __future__ import annotations

from collections.abc import Callable

from armature.configurator.search import Ranked, SearchResult, get_ttft_growth
from armature.configurator.space import AGG, DISAGG

__all__ = ["format_side_by_side", "format_table"]

_HEADER = (
    f"{'#':>2}  {'configuration':<50} {'GPUs':>5} {'TTFT ms':>8} {'ITL ms':>7} "
    f"{'tok/s/GPU':>10} {'tok/s/user':>10}  {'by':<3} {'meets':<5}"
)


def _row(rank: int, r: Ranked, result: SearchResult) -> str:
    p = r.prediction
    config = f"{r.deployment.describe()} x{r.num_groups}"
    _, per_gpu = result.get_served(r)
    return (
        f"{rank:>2}  {config:<50} {r.num_gpus:>5} {p.ttft_ms:>8.1f} {p.itl_ms:>7.2f} "
        f"{per_gpu:>10.1f} {p.tokens_per_s_per_user:>10.1f}  "
        f"{'sim' if r.simulated else 'est':<3} {'yes' if r.meets_targets else 'no':<5}"
    )


def format_table(result: SearchResult, top: int) -> str:
    """The first `top` configurations, best first ("x N": N groups deployed; "by": sim for
    the simulator's prediction, est for the fast estimate's; tokens/s per GPU as served:
    with a request rate, its share per group)."""
    lines = [_HEADER, "-" * len(_HEADER)]
    shown = result.ranked[:top]
    lines += [_row(i + 1, r, result) for i, r in enumerate(shown)]
    if len({r.simulated for r in shown}) == 2:  # why a sim row ranks above a better-looking est
        lines.append(
            "sim rows (the simulator's prediction) rank above est rows (the fast estimate, "
            "not simulated: raise --finalists or --sim-budget-s to simulate more)"
        )
    return "\n".join(lines)


def _slower(r: Ranked) -> str:
    """The prediction with every step the search's margin slower (a simulated finalist's)."""
    if r.slower is None:
        return "-"
    growth = get_ttft_growth(r.prediction, r.slower)
    return f"{r.slower.ttft_ms:.1f} / {r.slower.itl_ms:.2f} (TTFT {growth:+.0%})"


def format_side_by_side(result: SearchResult) -> str:
    """The best aggregated and the best disaggregated configuration, column by column."""
    best = {mode: result.get_best(mode) for mode in (AGG, DISAGG)}
    rows: list[tuple[str, str, str]] = [("", "aggregated", "disaggregated")]

    def add(label: str, get: Callable[[Ranked], str]) -> None:
        agg, disagg = (best[m] for m in (AGG, DISAGG))
        rows.append((label, get(agg) if agg else "-", get(disagg) if disagg else "-"))

    add("configuration", lambda r: r.deployment.describe())
    add("groups x GPUs", lambda r: f"{r.num_groups} x {r.deployment.num_gpus}")
    add("TTFT ms (median)", lambda r: f"{r.prediction.ttft_ms:.1f}")
    add("ITL ms (mean)", lambda r: f"{r.prediction.itl_ms:.2f}")
    add("tokens/s per GPU", lambda r: f"{result.get_served(r)[1]:.1f}")
    add("tokens/s per user", lambda r: f"{r.prediction.tokens_per_s_per_user:.1f}")
    add("requests/s per group", lambda r: f"{result.get_served(r)[0]:.2f}")
    add("meets the targets", lambda r: "yes" if r.meets_targets else "no")
    add("TTFT / ITL ms, --step-margin slower", _slower)
    add("predicted by", lambda r: "simulator" if r.simulated else "estimate")
    width = max(len(a) for a, _, _ in rows)
    column = max(len(b) for _, b, _ in rows) + 2
    return "\n".join(f"{a:<{width}}  {b:<{column}}{c}" for a, b, c in rows)
