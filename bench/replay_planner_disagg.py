"""The planner in closed loop on a disaggregated fleet: prefill and decode pools sized apart,
on the same workloads as `bench.replay_planner` (windows of the Mooncake conversation trace,
a step to x4 and a diurnal day; mocker workers, kv routing, --startup-s to join).

For each workload and window:

    planned         --planner both, disaggregated, from the planner's own plan for the
                    window's first interval
    threshold       the same without the queueing model
    static peak     the smallest static (prefill, decode) fleet holding SLA attainment
                    >= 95% with the window's requests at the peak rate (x4) throughout:
                    fleets by total size, each total's splits around the planner's own
                    prefill share at that rate, then replayed on the workload itself
    static average  a static fleet of the planned run's mean size per role

Targets (issue "Planner"), as in `bench.replay_planner`: planned attainment >= 95%, planned
worker-seconds <= 70% of static peak's, planned attainment above static average's.

`--kv-shares` replays the planned fleet once per `--planner-kv-share` value (the share of a
decode worker's KV cache the plan fills at the mean context). Tuning stays off the scored
data: the share is chosen on windows 0 and 1 (`--windows 0 1`, written to bench/out/), the
report runs windows 2 and 3 at the chosen share.

    python -m bench.replay_planner_disagg [--windows 2 3] [--kv-shares 0.5] [--jobs N]
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace

from armature.config import PlannerConfig
from armature.protocols.worker import WorkerRole
from armature.sim.replay import ReplayConfig, ReplayReport, replay
from armature.workload.rate_shapes import StepShape, reshape_arrivals
from armature.workload.traces import TraceRequest, read_mooncake_trace
from bench.paths import TRACES_DIR, results_path
from bench.replay_planner import (
    COST_TARGET,
    FACTOR,
    PLANNER,
    SLA_TARGET,
    TUNING_WINDOWS,
    add_workload_args,
    mark,
    plan_first_interval,
    shape_for,
    window,
)
from bench.report import Section, get_machine_facts, markdown_table, write_section

DEFAULT_KV_SHARE = 0.5  # chosen on windows 0 and 1 (docs/benchmarks.md, the reading)
MAX_SPLITS = 3  # prefill counts tried per total size: the planner's share, one each side


@dataclass(frozen=True)
class Fleet:
    num_prefill: int
    num_decode: int

    @property
    def size(self) -> int:
        return self.num_prefill + self.num_decode

    def __str__(self) -> str:
        return f"{self.num_prefill}P+{self.num_decode}D"


@dataclass(frozen=True)
class Run:
    label: str
    report: ReplayReport


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    add_workload_args(parser)
    parser.add_argument("--kv-shares", type=float, nargs="+", default=[DEFAULT_KV_SHARE])
    parser.add_argument("--jobs", type=int, default=2, help="cases replayed side by side")
    return parser.parse_args(argv)


def planner_config(kv_share: float) -> PlannerConfig:
    # the SLO feedback was tuned on the aggregated fleet only: off here, as this bench was run
    return replace(PLANNER, mode="disagg", decode_kv_share=kv_share, trim_step=0.0)


def fleet_config(args: argparse.Namespace, fleet: Fleet, kv_share: float) -> ReplayConfig:
    return ReplayConfig(
        num_workers=fleet.size,
        num_prefill_workers=fleet.num_prefill,
        router="kv",
        block_size=16,
        num_kv_blocks=16384,
        planner=planner_config(kv_share),
        worker_startup_s=args.startup_s,
    )


def planned_fleet(requests: list[TraceRequest], config: ReplayConfig) -> Fleet:
    """The planner's own plan for the first interval of `requests`, as a fleet."""
    sizes = plan_first_interval(requests, config)
    return Fleet(sizes[WorkerRole.PREFILL], sizes[WorkerRole.DECODE])


def get_splits(size: int, prefill_share: float) -> list[Fleet]:
    """Up to MAX_SPLITS fleets of `size` workers, at least one of each role, their prefill
    counts nearest `prefill_share` of the size first."""
    centre = min(max(1, round(size * prefill_share)), size - 1)
    counts = sorted(range(1, size), key=lambda p: (abs(p - centre), p))[:MAX_SPLITS]
    return [Fleet(p, size - p) for p in counts]


def smallest_static(
    args: argparse.Namespace, requests: list[TraceRequest], start: Fleet
) -> tuple[Fleet, ReplayReport]:
    """The smallest static fleet holding SLA_TARGET on `requests`, walking total sizes from
    `start`'s (down while one of a size's splits holds, else up until one does); each size's
    splits around `start`'s prefill share, the first that holds kept."""
    share = start.num_prefill / start.size
    results: dict[Fleet, ReplayReport] = {}

    def holding(size: int) -> Fleet | None:
        for fleet in get_splits(size, share):
            if fleet not in results:
                config = fleet_config(args, fleet, DEFAULT_KV_SHARE)
                results[fleet] = replay(requests, config)
                print(f"  static {fleet}: {results[fleet].sla_attainment:.3f}", flush=True)
            if results[fleet].sla_attainment >= SLA_TARGET:
                return fleet
        return None

    size = max(2, start.size)
    found = holding(size)
    if found is not None:
        while size > 2 and (lower := holding(size - 1)) is not None:
            size, found = size - 1, lower
    else:
        while found is None and size < 2 * PLANNER.max_workers:
            size += 1
            found = holding(size)
    if found is None:
        raise SystemExit(f"no static fleet up to {size} workers holds {SLA_TARGET:.0%}")
    return found, results[found]


def peak_static(args: argparse.Namespace, requests: list[TraceRequest]) -> Fleet:
    """The fleet sized for the peak: the smallest static one holding SLA_TARGET with
    `requests` arriving at x FACTOR throughout, searched from the planner's own plan for it
    (static fleets have no planner: the KV share does not enter)."""
    peak_requests = reshape_arrivals(requests, StepShape(FACTOR, 0.0, math.inf))
    base = fleet_config(args, Fleet(1, 1), DEFAULT_KV_SHARE)
    fleet, _ = smallest_static(args, peak_requests, planned_fleet(peak_requests, base))
    return fleet


def run_case(
    args: argparse.Namespace,
    requests: list[TraceRequest],
    workload: str,
    kv_share: float,
    peak_fleet: Fleet,
) -> list[Run]:
    shape, _ = shape_for(workload, requests)
    shaped = reshape_arrivals(requests, shape)
    first = planned_fleet(shaped, fleet_config(args, Fleet(1, 1), kv_share))
    config = fleet_config(args, first, kv_share)
    planned = replay(shaped, replace(config, planner_rule="both"))
    blind = replace(planner_config(kv_share), queue_aware=False)
    threshold = replay(shaped, replace(config, planner_rule="both", planner=blind))
    span_s = planned.simulated_time_s
    by_role = planned.worker_seconds_by_role
    average = Fleet(
        max(1, round(by_role.get("prefill", 0.0) / span_s)),
        max(1, round(by_role.get("decode", 0.0) / span_s)),
    )
    peak = replay(shaped, fleet_config(args, peak_fleet, kv_share))
    static_average = replay(shaped, fleet_config(args, average, kv_share))
    return [
        Run("planned (queue-aware)", planned),
        Run("threshold only", threshold),
        Run(f"static peak ({peak_fleet})", peak),
        Run(f"static average ({average})", static_average),
    ]


def row(workload: str, index: int, kv_share: float, run: Run) -> list[object]:
    r = run.report
    return [
        workload,
        index,
        f"{kv_share:g}",
        run.label,
        round(r.sla_attainment, 3),
        round(r.worker_seconds),
        f"{r.peak_workers.get('prefill', 0)}P+{r.peak_workers.get('decode', 0)}D",
        r.ttft_ms.p50,
        r.ttft_ms.p99,
        r.itl_ms.p50,
        r.itl_ms.p99,
        round(r.simulated_time_s),
        round(r.wall_time_s, 1),
    ]


def checks(workload: str, index: int, kv_share: float, runs: list[Run]) -> list[str]:
    planned, threshold, peak, average = (run.report for run in runs)
    cost = planned.worker_seconds / peak.worker_seconds
    case = f"{workload} w{index} share {kv_share:g}"
    return [
        f"{mark(planned.sla_attainment >= SLA_TARGET)}: {case}: planned attainment "
        f"{planned.sla_attainment:.3f} (target >= {SLA_TARGET})",
        f"{mark(cost <= COST_TARGET)}: {case}: planned worker-seconds are {cost:.0%} of "
        f"static peak's ({planned.worker_seconds:,.0f} / {peak.worker_seconds:,.0f}; target "
        f"<= {COST_TARGET:.0%})",
        f"{mark(planned.sla_attainment > average.sla_attainment)}: {case}: planned attainment "
        f"{planned.sla_attainment:.3f} vs static average's {average.sla_attainment:.3f} "
        f"({runs[3].label})",
        f"{case}: queue-aware vs threshold-only: attainment {planned.sla_attainment:.3f} vs "
        f"{threshold.sla_attainment:.3f}, worker-seconds {planned.worker_seconds:,.0f} vs "
        f"{threshold.worker_seconds:,.0f}",
    ]


def main() -> None:
    args = parse_args()
    requests = read_mooncake_trace(
        TRACES_DIR / args.trace,
        limit=(max(args.windows) + 1) * args.requests,
        time_scale=args.time_scale,
    )
    started_s = time.perf_counter()
    cases = [
        (workload, index, share)
        for workload in args.workloads
        for index in args.windows
        for share in args.kv_shares
    ]
    rows: list[list[object]] = []
    marks: list[str] = []
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        by_window = {
            index: pool.submit(peak_static, args, window(requests, index, args.requests))
            for index in args.windows
        }
        peaks = {index: future.result() for index, future in by_window.items()}
        print(f"static fleets for the peak: {peaks}", flush=True)
        futures = [
            pool.submit(
                run_case,
                args,
                window(requests, index, args.requests),
                workload,
                share,
                peaks[index],
            )
            for workload, index, share in cases
        ]
        for (workload, index, share), future in zip(cases, futures, strict=True):
            runs = future.result()
            rows += [row(workload, index, share, run) for run in runs]
            marks += checks(workload, index, share, runs)
            print("\n".join(str(r) for r in rows[-len(runs) :]), flush=True)
    p = PLANNER
    body = (
        f"{args.trace}, windows {', '.join(map(str, args.windows))} of {args.requests:,} "
        f"requests each, arrivals x {args.time_scale:g}, reshaped as in `bench.replay_planner` "
        f"(step: x{FACTOR:g} for the middle third; diurnal: one cosine day to x{FACTOR:g}). "
        "Disaggregated mocker fleets (default DESIGN timing, kv routing, every prompt "
        "prefilled on a prefill worker, block size 16, 16,384 blocks each); a new worker joins "
        f"{args.startup_s:g} s after it is asked for. Planner: targets TTFT {p.ttft_ms:g} ms "
        f"and mean ITL {p.itl_ms:g} ms per request, prefill and decode pools each 1-"
        f"{p.max_workers}, the other settings as in `bench.replay_planner` but the SLO "
        "feedback (off); share: "
        "`--planner-kv-share`, the share of a decode worker's KV cache the plan fills at the "
        "mean context (chosen on windows 0 and 1, not reported here). Static peak: the "
        f"smallest static fleet holding {SLA_TARGET:.0%} with the window's requests at x"
        f"{FACTOR:g} throughout (each total size's splits around the planner's own prefill "
        "share), replayed on the workload.\n\n"
        + markdown_table(
            [
                "workload",
                "window",
                "share",
                "fleet",
                "attainment",
                "worker-s",
                "peak workers",
                "TTFT p50 ms",
                "TTFT p99 ms",
                "ITL p50 ms",
                "ITL p99 ms",
                "span s",
                "wall s",
            ],
            rows,
        )
        + "\n\n"
        + "\n".join(f"- {m}" for m in marks)
        + f"\n\nTotal wall time {time.perf_counter() - started_s:,.0f} s.\n"
    )
    out = results_path(any(i in TUNING_WINDOWS for i in args.windows))
    section = Section(
        "replay_planner_disagg", "Replay: the planner on a disaggregated fleet", body, "n/a"
    )
    write_section(out, section, get_machine_facts())
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
