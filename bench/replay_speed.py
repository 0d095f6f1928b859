"""Replay speed: process CPU seconds of `armature.sim.replay` on the Mooncake traces, with the
decode fast path, with the round-robin router, and (with --reference) step by step, and
whether the fast and step-by-step reports agree.

    python -m bench.replay_speed [--limit N] [--reference] [--num-kv-blocks K] [--repeats R]
                                 [--quick]

8 workers, kv router, block size 16, K KV blocks per worker (default 131,072), the traces'
own arrival times. CPU time (user + system of this process) is the figure to compare on a
shared machine; wall time is shown beside it. Targets (issue 16): the whole conversation
trace <= 10 s, the synthetic trace <= 3 s, and round-robin routing no slower than kv (each
round's round-robin replay against the kv one of the same round).

Writes the `replay_speed` section of docs/benchmarks.md (bench/out/ with --quick).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Sequence

from armature.sim.replay import ReplayConfig, ReplayReport, replay
from armature.workload.traces import TraceRequest, read_mooncake_trace
from bench.paths import TRACES_DIR, results_path
from bench.report import Section, get_machine_facts, markdown_table, write_section

TARGET_CPU_S = {"conversation_trace.jsonl": 10.0, "synthetic_trace.jsonl": 3.0}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--traces", nargs="+", default=["conversation_trace.jsonl", "synthetic_trace.jsonl"]
    )
    parser.add_argument("--limit", type=int, default=None, help="the first N requests only")
    parser.add_argument("--num-kv-blocks", type=int, default=131072)
    parser.add_argument(
        "--reference", action="store_true", help="also replay step by step and compare"
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="rounds of every trace, in turn (>= 1)"
    )
    parser.add_argument("--quick", action="store_true")
    return parser.parse_args(argv)


def timed(requests: list[TraceRequest], config: ReplayConfig) -> tuple[ReplayReport, float, float]:
    """The report, CPU seconds and wall seconds of one replay."""
    cpu_s, wall_s = time.process_time(), time.perf_counter()
    report = replay(requests, config)
    return report, time.process_time() - cpu_s, time.perf_counter() - wall_s


def main() -> None:
    args = parse_args()
    if args.repeats < 1:
        raise SystemExit("--repeats must be at least 1")
    limit = 300 if args.quick else args.limit
    config = ReplayConfig(
        num_workers=8, router="kv", block_size=16, num_kv_blocks=args.num_kv_blocks
    )
    traces = {name: read_mooncake_trace(TRACES_DIR / name, limit=limit) for name in args.traces}
    # timed every round: the kv router's fast path, and round-robin against it
    timed_ways = [
        ("fast", config),
        ("round-robin", dataclasses.replace(config, router="round-robin")),
    ]
    ways = list(timed_ways)
    if args.reference:
        ways.append(("reference", dataclasses.replace(config, reference_steps=True)))
    # (trace, way) -> each round's report, CPU s and wall s; the traces in turn, round by round
    # (the reference once: it is the fast path's check, not timed against a target)
    runs: dict[tuple[str, str], list[tuple[ReplayReport, float, float]]] = {}
    for round_index in range(args.repeats):
        for name, requests in traces.items():
            for way, cfg in ways if round_index == 0 else timed_ways:
                runs.setdefault((name, way), []).append(timed(requests, cfg))
                report, cpu_s, wall_s = runs[(name, way)][-1]
                print(name, way, round_index + 1, round(cpu_s, 2), round(wall_s, 2), flush=True)
    rows, checks = [], []
    for (name, way), done in runs.items():
        report = done[0][0]
        cpu = [c for _, c, _ in done]
        wall = [w for _, _, w in done]
        rows.append(
            [
                name,
                way,
                report.num_requests,
                round(report.prefix_hit_ratio, 4),
                round(report.prefix_hit_ceiling, 4),
                f"{report.load_skew:.3f}",
                round(report.ttft_ms.p50, 2),
                round(report.itl_ms.p50, 3),
                round(statistics.median(cpu), 1),
                f"{min(cpu):.1f}-{max(cpu):.1f}",
                round(statistics.median(wall), 1),
            ]
        )
        if any(_without_wall(r) != _without_wall(report) for r, _, _ in done[1:]):
            checks.append(f"MISS: {name}: a round's report differs from the first's")
        if way == "fast" and limit is None:
            target = TARGET_CPU_S[name]
            cpu_s = statistics.median(cpu)
            mark = "PASS" if cpu_s <= target else "MISS"
            checks.append(
                f"{mark}: {name} replays in {cpu_s:.1f} CPU s, the median of {len(cpu)} "
                f"(runs {min(cpu):.1f}-{max(cpu):.1f}; target <= {target} s)"
            )
        if way == "round-robin":
            ratios = [
                rr_cpu / kv_cpu
                for (_, rr_cpu, _), (_, kv_cpu, _) in zip(done, runs[(name, "fast")], strict=True)
            ]
            ratio = statistics.median(ratios)
            checks.append(
                f"{'PASS' if ratio <= 1.0 else 'MISS'}: {name}: round-robin replays in "
                f"{ratio:.2f}x the kv router's CPU s of the same round, the median of "
                f"{len(ratios)} ({min(ratios):.2f}-{max(ratios):.2f}; target <= 1: no slower)"
            )
        if way == "reference":
            same = _without_wall(runs[(name, "fast")][0][0]) == _without_wall(report)
            checks.append(
                f"{'PASS' if same else 'MISS'}: {name}: the fast path's report is "
                f"{'identical to' if same else 'NOT the same as'} the step-by-step one"
            )
    body = (
        f"{'The first ' + str(limit) if limit else 'All'} requests of each trace, its own "
        f"arrival times, 8 mocker workers (default DESIGN timing), kv router, block size 16, "
        f"{args.num_kv_blocks} KV blocks per worker; `fast` is the default replay, `reference` "
        "runs every engine step on its own (`--reference-steps`), `round-robin` the fast path "
        "routed round-robin. CPU s: this process's user "
        "+ system time, the median over the rounds (the traces in turn, round by round: a shared "
        "machine's speed moves between minutes), with its range. `ceiling`: the report's "
        "`prefix_hit_ceiling` (one infinite cache shared by every worker, in the hit ratio's "
        f"unit). Rounds: {args.repeats}.\n\n"
        + markdown_table(
            [
                "trace",
                "path",
                "requests",
                "prefix hit",
                "ceiling",
                "load skew",
                "TTFT p50 ms",
                "ITL p50 ms",
                "CPU s",
                "CPU s range",
                "wall s",
            ],
            rows,
        )
        + "\n\n"
        + "\n".join(f"- {c}" for c in checks)
        + "\n"
    )
    out = results_path(args.quick)
    write_section(
        out, Section("replay_speed", "Replay: simulation speed", body, "n/a"), get_machine_facts()
    )
    print(f"wrote {out}")


def _without_wall(report: ReplayReport) -> dict[str, object]:
    data = dataclasses.asdict(report)
    data.pop("wall_time_s")
    return data


if __name__ == "__main__":
    main()
