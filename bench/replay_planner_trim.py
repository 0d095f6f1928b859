"""Choosing the planner's SLO feedback (`--planner-trim-step`) on the tuning windows of
`bench.replay_planner`: its planned fleet (aggregated, queue-aware, the same workloads and
settings) once per trim step, against the fleet sized for the peak.

The rule, fixed before looking: among the steps whose planned attainment is within
MAX_ATTAINMENT_LOSS of the untrimmed planner's (step 0) on every tuning case, the lowest mean
cost (worker-seconds over static peak's); ties to the higher mean attainment.

    python -m bench.replay_planner_trim [--windows 0 1] [--trim-steps 0 0.1 0.2 0.3 0.5]
                                        [--trim-min 0.5] [--jobs N]

Windows 0 and 1 only (the trace's first half): the report's windows are never tuned on.
Writes bench/out/ (a tuning run's numbers stay out of docs/benchmarks.md; the
`replay_planner` section's reading quotes them).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

from armature.sim.replay import replay
from armature.workload.rate_shapes import StepShape, reshape_arrivals
from armature.workload.traces import TraceRequest, read_mooncake_trace
from bench.paths import TRACES_DIR, results_path
from bench.replay_planner import (
    PLANNER,
    TUNING_WINDOWS,
    add_workload_args,
    base_config,
    initial_fleet,
    shape_for,
    smallest_static,
    window,
)
from bench.report import Section, get_machine_facts, markdown_table, write_section

# the most planned attainment a step may lose against the untrimmed planner, on any case
MAX_ATTAINMENT_LOSS = 0.01


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    add_workload_args(parser)
    parser.set_defaults(windows=list(TUNING_WINDOWS))
    parser.add_argument("--trim-steps", type=float, nargs="+", default=[0.0, 0.1, 0.2, 0.3, 0.5])
    parser.add_argument("--trim-min", type=float, default=PLANNER.trim_min_scale)
    parser.add_argument("--jobs", type=int, default=2, help="cases replayed side by side")
    args = parser.parse_args(argv)
    if any(i not in TUNING_WINDOWS for i in args.windows):
        parser.error(f"tune on windows {', '.join(map(str, TUNING_WINDOWS))} only")
    if 0.0 not in args.trim_steps:
        args.trim_steps = [0.0, *args.trim_steps]  # the untrimmed planner: the reference
    return args


def peak_size(args: argparse.Namespace, requests: list[TraceRequest]) -> int:
    """The smallest static fleet holding the target with `requests` at x4 throughout."""
    steady = reshape_arrivals(requests, StepShape(4.0, 0.0, math.inf))
    config = base_config(args)
    size, _ = smallest_static(steady, config, initial_fleet(steady, config), {})
    return size


def run_case(
    args: argparse.Namespace,
    requests: list[TraceRequest],
    workload: str,
    trim_step: float,
    peak: int,
) -> tuple[float, float]:
    """The planned fleet's attainment and its worker-seconds over static peak's."""
    shape, _ = shape_for(workload, requests)
    shaped = reshape_arrivals(requests, shape)
    config = base_config(args)
    config = replace(config, num_workers=initial_fleet(shaped, config))
    planner = replace(PLANNER, trim_step=trim_step, trim_min_scale=args.trim_min)
    planned = replay(shaped, replace(config, planner_rule="both", planner=planner))
    static = replay(shaped, replace(config, num_workers=peak))
    return planned.sla_attainment, planned.worker_seconds / static.worker_seconds


def choose(results: dict[tuple[str, int, float], tuple[float, float]]) -> float | None:
    """The rule of the docstring over (workload, window, step) -> (attainment, cost)."""
    cases = sorted({(w, i) for w, i, _ in results})
    steps = sorted({s for _, _, s in results})
    feasible = [
        s
        for s in steps
        if all(results[(*c, s)][0] >= results[(*c, 0.0)][0] - MAX_ATTAINMENT_LOSS for c in cases)
    ]
    if not feasible:
        return None
    return min(
        feasible,
        key=lambda s: (
            statistics.fmean(results[(*c, s)][1] for c in cases),
            -statistics.fmean(results[(*c, s)][0] for c in cases),
        ),
    )


def main() -> None:
    args = parse_args()
    requests = read_mooncake_trace(
        TRACES_DIR / args.trace,
        limit=(max(args.windows) + 1) * args.requests,
        time_scale=args.time_scale,
    )
    started_s = time.perf_counter()
    results: dict[tuple[str, int, float], tuple[float, float]] = {}
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        peaks = dict(
            zip(
                args.windows,
                pool.map(
                    peak_size,
                    [args] * len(args.windows),
                    [window(requests, i, args.requests) for i in args.windows],
                ),
                strict=True,
            )
        )
        print(f"static fleets for the peak: {peaks}", flush=True)
        cases = [
            (workload, index, step)
            for step in args.trim_steps
            for workload in args.workloads
            for index in args.windows
        ]
        futures = [
            pool.submit(run_case, args, window(requests, i, args.requests), w, s, peaks[i])
            for w, i, s in cases
        ]
        for case, future in zip(cases, futures, strict=True):
            results[case] = future.result()
            print(case, results[case], flush=True)
    columns = sorted({(w, i) for w, i, _ in results})
    rows = [
        [
            f"{step:g}",
            *(f"{results[(*c, step)][0]:.3f} / {results[(*c, step)][1]:.0%}" for c in columns),
            f"{statistics.fmean(results[(*c, step)][1] for c in columns):.2%}",
        ]
        for step in args.trim_steps
    ]
    chosen = choose(results)
    body = (
        f"{args.trace}, windows {', '.join(map(str, args.windows))} (tuning) of "
        f"{args.requests:,} requests, the workloads and planner of `bench.replay_planner` "
        f"(static peak: {', '.join(f'w{i} {n}' for i, n in peaks.items())} workers), the SLO "
        f"feedback at each step down to {args.trim_min:g} of the predicted load. Cells: "
        "planned attainment / worker-seconds over static peak's.\n\n"
        + markdown_table(["trim step", *(f"{w} w{i}" for w, i in columns), "mean cost"], rows)
        + f"\n\nChosen (the lowest mean cost within {MAX_ATTAINMENT_LOSS:.0%} of step 0's "
        "attainment on every case, ties to the higher mean attainment): "
        + ("none" if chosen is None else f"**{chosen:g}**")
        + f". Total wall time {time.perf_counter() - started_s:,.0f} s.\n"
    )
    out = results_path(True)
    section = Section(
        "replay_planner_trim", "Replay: tuning the planner's SLO feedback", body, "n/a"
    )
    write_section(out, section, get_machine_facts())
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
