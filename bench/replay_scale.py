"""Replay at fleet scale: one trace through 8, 64 and 256 mocker workers, its timestamps
compressed by workers / 8 so that each worker sees the load it sees at 8, and what the replay
costs per routed request and per engine step, with its peak memory.

    python -m bench.replay_scale [--workers N ...] [--trace NAME] [--num-kv-blocks K]
                                 [--kv-routed-ttl-s S]
                                 [--limit N] [--quick]

Each fleet size runs in a process of its own (its peak resident memory is its own). Issue 16:
replay time grows no faster than routed requests plus engine steps, and memory stays bounded.

Writes the `replay_scale` section of docs/benchmarks.md (bench/out/ with --quick).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import subprocess
import sys
import time
from collections.abc import Sequence

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
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
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
    cpu_s = time.process_time()
    report = replay(requests, config)
    cpu_s = time.process_time() - cpu_s
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {
        "workers": num_workers,
        "time_scale": time_scale,
        "requests": report.num_requests,
        "steps": report.num_engine_steps,
        "prefix_hit": report.prefix_hit_ratio,
        "skew": report.load_skew,
        "ttft_p50_ms": report.ttft_ms.p50,
        "cpu_s": cpu_s,
        "wall_s": report.wall_time_s,
        "peak_rss_mb": peak_kib / 1024,
    }


def main() -> None:
    args = parse_args()
    if args.quick and args.limit is None:
        args.limit = 400
    if args.one is not None:
        print(json.dumps(run_one(args, args.one)))
        return
    rows, results = [], []
    for num_workers in args.workers:
        command = [sys.executable, "-m", "bench.replay_scale", "--one", str(num_workers)]
        command += ["--trace", args.trace, "--num-kv-blocks", str(args.num_kv_blocks)]
        command += ["--kv-routed-ttl-s", str(args.kv_routed_ttl_s)]
        if args.limit is not None:
            command += ["--limit", str(args.limit)]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        result = json.loads(done.stdout.strip().splitlines()[-1])
        results.append(result)
        units = result["requests"] + result["steps"]
        rows.append(
            [
                result["workers"],
                f"x {result['time_scale']:g}",
                result["requests"],
                result["steps"],
                round(result["prefix_hit"], 4),
                round(result["skew"], 3),
                round(result["ttft_p50_ms"], 1),
                round(result["cpu_s"], 1),
                round(result["cpu_s"] / units * 1e6, 1),
                round(result["peak_rss_mb"]),
            ]
        )
        print(rows[-1], flush=True)
    scope = f"the first {args.limit} requests of" if args.limit else "all of"
    body = (
        f"{scope.capitalize()} {args.trace}, kv router (routed predictions kept "
        f"{args.kv_routed_ttl_s:g} s; 0: KV events only), block size 16, {args.num_kv_blocks} KV "
        f"blocks per worker, arrival times x {BASE_WORKERS} / workers (each worker sees the "
        f"load it sees among {BASE_WORKERS}). `steps`: the batches all engines ran; `CPU us "
        "per unit`: the replay's CPU time over routed requests + engine steps; peak RSS: the "
        "replay process's maximum resident memory (the trace and interpreter included). Each "
        "row is a process of its own.\n\n"
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
                "CPU us per unit",
                "peak RSS MB",
            ],
            rows,
        )
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
