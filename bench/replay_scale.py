"""Replay at fleet scale: one trace through 8, 64 and 256 mocker workers, its timestamps
compressed by workers / 8 so that each worker sees the load it sees at 8, and what the replay
costs per routed request and per engine step, with its peak memory.

    python -m bench.replay_scale [--workers N ...] [--trace NAME] [--num-kv-blocks K]
                                 [--kv-routed-ttl-s S] [--repeats R]
                                 [--limit N] [--quick]

Each fleet size runs in a process of its own (its peak resident memory is its own), the sizes
in turn, R rounds of them: a shared machine's speed moves between minutes, so each size's
unit is compared with the first size's of the same round, and the medians and ranges over
the rounds are what the table shows. Issue 16: replay time grows no faster than routed
requests plus engine steps (the largest fleet's unit at most the first's), and memory stays
bounded. Before each round a process of its own times the machine's first touch of fresh
memory (kernel time a page), which the largest fleet's replay pays for gigabytes of state.

Writes the `replay_scale` section of docs/benchmarks.md (bench/out/ with --quick).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

from armature.router.policies import KvPolicy, RouteDecision, RouteRequest
from armature.sim.replay import ReplayConfig, replay
from armature.workload.traces import read_mooncake_trace
from bench.paths import TRACES_DIR, results_path
from bench.report import Section, get_machine_facts, markdown_table, write_section

BASE_WORKERS = 8


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workers", type=int, nargs="+", default=[8, 64, 256])
    parser.add_argument("--trace", default="conversation_trace.jsonl")
    parser.add_argument("--num-kv-blocks", type=int, default=32768)
    parser.add_argument("--limit", type=int, default=None, help="the first N requests only")
    parser.add_argument(
        "--kv-routed-ttl-s",
        type=float,
        default=ReplayConfig().routed_ttl_s,
        help="the kv router's routed predictions' lifetime (0: KV events only)",
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="rounds of all fleet sizes, in turn (>= 1)"
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--touch", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def run_one(args: argparse.Namespace, num_workers: int) -> dict[str, float]:
    """One replay in this process: its counts, CPU seconds and peak resident memory."""
    time_scale = BASE_WORKERS / num_workers
    requests = read_mooncake_trace(TRACES_DIR / args.trace, limit=args.limit)
    requests = [dataclasses.replace(r, arrival_ms=r.arrival_ms * time_scale) for r in requests]
    config = ReplayConfig(
        num_workers=num_workers,
        router="kv",
        block_size=16,
        num_kv_blocks=args.num_kv_blocks,
        routed_ttl_s=args.kv_routed_ttl_s,
    )
    routing_s = time_routing()
    before = resource.getrusage(resource.RUSAGE_SELF)
    report = replay(requests, config)
    after = resource.getrusage(resource.RUSAGE_SELF)
    user_s = after.ru_utime - before.ru_utime
    sys_s = after.ru_stime - before.ru_stime
    peak_kib = after.ru_maxrss  # KiB on Linux
    return {
        "workers": num_workers,
        "time_scale": time_scale,
        "requests": report.num_requests,
        "steps": report.num_engine_steps,
        "prefix_hit": report.prefix_hit_ratio,
        "skew": report.load_skew,
        "ttft_p50_ms": report.ttft_ms.p50,
        "cpu_s": user_s + sys_s,
        "sys_s": sys_s,
        "routing_s": routing_s(),
        "wall_s": report.wall_time_s,
        "peak_rss_mb": peak_kib / 1024,
    }


def time_routing() -> Callable[[], float]:
    """Time the kv policy's decisions in this process (the bench's own instrumentation: the
    class's `select` wrapped, a CPU clock read before and after each; the replay's child
    process only); returns a reader of the CPU seconds they took."""
    select = KvPolicy.select
    spent_ns = [0]

    def timed(policy: KvPolicy, request: RouteRequest, workers: Sequence[str]) -> RouteDecision:
        started_ns = time.process_time_ns()
        try:
            return select(policy, request, workers)
        finally:
            spent_ns[0] += time.process_time_ns() - started_ns

    KvPolicy.select = timed
    return lambda: spent_ns[0] / 1e9


COUNTS = ("requests", "steps", "prefix_hit", "skew", "ttft_p50_ms")  # the same every round
TOUCH_BYTES = 256 << 20


def touch_fresh_memory() -> float:
    """Kernel microseconds a page of fresh memory costs at its first write, in this process:
    `TOUCH_BYTES` mapped, one byte written to each page. On a VM whose host backs memory
    only when the guest first touches it, this moves from minute to minute, and the largest
    fleet's replay, which touches gigabytes, moves with it."""
    import mmap

    page = mmap.PAGESIZE
    before = resource.getrusage(resource.RUSAGE_SELF).ru_stime
    area = mmap.mmap(-1, TOUCH_BYTES)
    for offset in range(0, TOUCH_BYTES, page):
        area[offset] = 1
    spent_s = resource.getrusage(resource.RUSAGE_SELF).ru_stime - before
    area.close()
    return spent_s / (TOUCH_BYTES // page) * 1e6


def probe_first_touch() -> float:
    """`touch_fresh_memory` in a process of its own."""
    command = [sys.executable, "-m", "bench.replay_scale", "--touch"]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return float(done.stdout.strip().splitlines()[-1])


def run_child(args: argparse.Namespace, num_workers: int) -> dict[str, float]:
    """`run_one` in a process of its own."""
    command = [sys.executable, "-m", "bench.replay_scale", "--one", str(num_workers)]
    command += ["--trace", args.trace, "--num-kv-blocks", str(args.num_kv_blocks)]
    command += ["--kv-routed-ttl-s", str(args.kv_routed_ttl_s)]
    if args.limit is not None:
        command += ["--limit", str(args.limit)]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def unit_us(result: dict[str, float], key: str = "cpu_s") -> float:
    """CPU microseconds (`key`: all, or `sys_s` the kernel's) per routed request or engine
    step."""
    return result[key] / (result["requests"] + result["steps"]) * 1e6


def routing_us(result: dict[str, float]) -> float:
    """CPU microseconds of a routed request's decision (the kv policy's `select`)."""
    return result["routing_s"] / result["requests"] * 1e6


def step_us(result: dict[str, float]) -> float:
    """CPU microseconds of everything but the decisions, per engine step."""
    return (result["cpu_s"] - result["routing_s"]) / result["steps"] * 1e6


def user_unit_us(result: dict[str, float]) -> float:
    """User-space CPU microseconds per routed request or engine step."""
    return unit_us(result) - unit_us(result, "sys_s")


def same_round_ratios(
    runs: dict[int, list[dict[str, float]]],
    base: int,
    unit: Callable[[dict[str, float]], float],
) -> dict[int, list[float]]:
    """Each fleet size's `unit` over the `base` size's of the same round, round by round
    (every size but the base)."""
    return {
        w: [unit(r) / unit(b) for r, b in zip(results, runs[base], strict=True)]
        for w, results in runs.items()
        if w != base
    }


def table_row(results: list[dict[str, float]]) -> list[object]:
    """One fleet size's row: its counts, and the medians and ranges of its rounds."""
    first = results[0]
    cpu = [r["cpu_s"] for r in results]
    units = [unit_us(r) for r in results]
    sys_units = [unit_us(r, "sys_s") for r in results]
    decisions = [routing_us(r) for r in results]
    steps = [step_us(r) for r in results]
    return [
        first["workers"],
        f"x {first['time_scale']:g}",
        first["requests"],
        first["steps"],
        round(first["prefix_hit"], 4),
        round(first["skew"], 3),
        round(first["ttft_p50_ms"], 1),
        round(statistics.median(cpu), 1),
        f"{min(cpu):.1f}-{max(cpu):.1f}",
        round(statistics.median(units), 1),
        f"{min(units):.1f}-{max(units):.1f}",
        round(statistics.median(sys_units), 2),
        round(statistics.median(decisions)),
        round(statistics.median(steps), 2),
        round(max(r["peak_rss_mb"] for r in results)),
    ]


def main() -> None:
    args = parse_args()
    if args.quick and args.limit is None:
        args.limit = 400
    if args.one is not None:
        print(json.dumps(run_one(args, args.one)))
        return
    if args.touch:
        print(touch_fresh_memory())
        return
    if args.repeats < 1:
        raise SystemExit("--repeats must be at least 1")
    runs: dict[int, list[dict[str, float]]] = {w: [] for w in args.workers}
    touches: list[float] = []  # the machine's first touch, before each round
    for round_index in range(args.repeats):
        touches.append(probe_first_touch())
        for num_workers in args.workers:
            result = run_child(args, num_workers)
            first = runs[num_workers][0] if runs[num_workers] else result
            if any(result[k] != first[k] for k in COUNTS):
                raise SystemExit(f"{num_workers} workers: round {round_index + 1}'s counts differ")
            runs[num_workers].append(result)
            print(num_workers, round_index + 1, result, flush=True)
    rows = [table_row(runs[w]) for w in args.workers]
    base = args.workers[0]
    ratios = same_round_ratios(runs, base, unit_us)
    user_ratios = same_round_ratios(runs, base, user_unit_us)
    decision_ratios = same_round_ratios(runs, base, routing_us)
    step_ratios = same_round_ratios(runs, base, step_us)
    checks = [
        f"{w} workers: the unit is {statistics.median(v):.2f}x the {base}-worker unit of the "
        f"same round (median of {len(v)}; {min(v):.2f}-{max(v):.2f})"
        for w, v in ratios.items()
    ]
    checks += [
        f"{w} workers, user-space time alone: {statistics.median(v):.2f}x the {base}-worker "
        f"unit ({min(v):.2f}-{max(v):.2f})"
        for w, v in user_ratios.items()
    ]
    checks += [
        f"{w} workers: a routed request's decision {statistics.median(v):.2f}x the {base}-worker "
        f"one's ({min(v):.2f}-{max(v):.2f}); the rest per engine step "
        f"{statistics.median(step_ratios[w]):.2f}x ({min(step_ratios[w]):.2f}-"
        f"{max(step_ratios[w]):.2f})"
        for w, v in decision_ratios.items()
    ]
    if ratios:
        largest = args.workers[-1]
        ratio = statistics.median(ratios[largest])
        mark = "PASS" if ratio <= 1.0 else "MISS"
        checks.append(
            f"{mark}: {largest} workers cost {ratio:.2f}x the {base}-worker unit (target <= 1: "
            "time grows no faster than routed requests + engine steps)"
        )
    scope = f"the first {args.limit} requests of" if args.limit else "all of"
    body = (
        f"{scope.capitalize()} {args.trace}, kv router (routed predictions kept "
        f"{args.kv_routed_ttl_s:g} s; 0: KV events only), block size 16, {args.num_kv_blocks} KV "
        f"blocks per worker, arrival times x {BASE_WORKERS} / workers (each worker sees the "
        f"load it sees among {BASE_WORKERS}). `steps`: the batches all engines ran; `CPU us "
        "per unit`: the replay's CPU time (user + kernel) over routed requests + engine steps, "
        "`of it kernel us` the kernel's part (page faults: first touches of the fleet's "
        "memory); `decision us`: the CPU time of a routed request's decision (the kv "
        "policy's `select`, timed in the replay's process), `rest us per step` the rest of "
        "the CPU time over engine steps; peak RSS: the "
        "replay process's maximum resident memory (the trace and interpreter included). Each "
        f"row is a process of its own, {args.repeats} round(s) of the sizes in turn: CPU s and us "
        "per unit are the median over the rounds, with their range. The machine's first touch "
        f"of fresh memory before each round (a process of its own writing a byte to each page "
        f"of {TOUCH_BYTES >> 20} MiB it maps): {statistics.median(touches):.2f} us of kernel "
        f"time a page, the median ({min(touches):.2f}-{max(touches):.2f}).\n\n"
        + markdown_table(
            [
                "workers",
                "arrival times",
                "requests",
                "steps",
                "prefix hit",
                "load skew",
                "TTFT p50 ms",
                "CPU s",
                "CPU s range",
                "CPU us per unit",
                "us per unit range",
                "of it kernel us",
                "decision us",
                "rest us per step",
                "peak RSS MB",
            ],
            rows,
        )
        + "\n\n"
        + "\n".join(f"- {c}" for c in checks)
        + "\n"
    )
    out = results_path(args.quick)
    write_section(
        out,
        Section("replay_scale", "Replay: fleets of hundreds of workers", body, "n/a"),
        get_machine_facts(),
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
