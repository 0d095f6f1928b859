"""Routing quality and replay speed: Mooncake traces through `armature.sim.replay` with 8
mocker workers, for round-robin, least-loaded and kv routing.

    python -m bench.replay_routing [--limit N] [--time-scale X] [--num-kv-blocks K]
                                   [--speed-run] [--quick]

--speed-run also replays the whole conversation trace (original timestamps, kv, default
settings) and checks the replay-speed target (<= 60 s of wall time).

Writes the `replay_routing` section of docs/benchmarks.md (bench/out/ with --quick).
"""

from __future__ import annotations

import argparse
import itertools

from armature.sim.replay import ReplayConfig, ReplayReport, replay
from armature.workload.traces import prefix_hit_ceiling, read_mooncake_trace
from bench.paths import TRACES_DIR, results_path
from bench.report import Section, get_machine_facts, markdown_table, write_section

ROUTERS = ("round-robin", "least-loaded", "kv")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--traces", nargs="+", default=["conversation_trace.jsonl", "synthetic_trace.jsonl"]
    )
    parser.add_argument("--limit", type=int, default=2000)
    parser.add_argument("--time-scale", type=float, default=0.12)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--num-kv-blocks", type=int, nargs="+", default=[32768, 262144])
    parser.add_argument("--speed-run", action="store_true")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    limit = 200 if args.quick else args.limit
    rows = []
    checks: list[str] = []
    for name in args.traces:
        requests = read_mooncake_trace(TRACES_DIR / name, limit=limit, time_scale=args.time_scale)
        ceiling = prefix_hit_ceiling(requests)
        rr_ttft_p50 = 0.0
        for num_blocks, router in itertools.product(args.num_kv_blocks, ROUTERS):
            config = ReplayConfig(
                num_workers=args.workers,
                router=router,
                block_size=16,
                num_kv_blocks=num_blocks,
            )
            r = replay(requests, config)
            rows.append(
                [
                    name,
                    num_blocks,
                    router,
                    r.num_requests,
                    round(r.prefix_hit_ratio, 3),
                    round(ceiling, 3),
                    f"{r.prefix_hit_ratio / ceiling:.0%}" if ceiling else "-",
                    r.ttft_ms.p50,
                    r.itl_ms.p50,
                    round(r.load_skew, 2),
                    r.wall_time_s,
                ]
            )
            print(rows[-1], flush=True)
            if router == "round-robin":
                rr_ttft_p50 = r.ttft_ms.p50
            if router == "kv" and ceiling:
                checks += _quality_checks(name, num_blocks, r, ceiling, rr_ttft_p50)
    if args.speed_run:
        checks.append(_speed_check())
    body = (
        f"First {limit} requests of each trace, arrival times x {args.time_scale}, "
        f"{args.workers} mocker workers (default DESIGN timing), block size 16, "
        "KV blocks per worker as listed, router temperature 0, overlap weight 1. "
        "Ceiling: the trace's infinite-cache prefix-hit ratio over the same requests.\n\n"
        + markdown_table(
            [
                "trace",
                "KV blocks/worker",
                "router",
                "requests",
                "prefix hit",
                "ceiling",
                "of ceiling",
                "TTFT p50 ms",
                "ITL p50 ms",
                "load skew",
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
        out, Section("replay_routing", "Replay: routing quality", body, "n/a"), get_machine_facts()
    )
    print(f"wrote {out}")


def _quality_checks(
    trace: str, num_blocks: int, kv: ReplayReport, ceiling: float, rr_ttft_p50_ms: float
) -> list[str]:
    def mark(ok: bool) -> str:
        return "PASS" if ok else "MISS"

    of_ceiling = kv.prefix_hit_ratio / ceiling
    ratio = rr_ttft_p50_ms / kv.ttft_ms.p50 if kv.ttft_ms.p50 else float("inf")
    where = f"{trace}, {num_blocks} blocks"
    return [
        f"{mark(of_ceiling >= 0.85)}: {where}: kv reaches {of_ceiling:.0%} of the ceiling "
        "(target >= 85%)",
        f"{mark(kv.load_skew <= 1.1)}: {where}: load skew {kv.load_skew:.2f} (target <= 1.1)",
        f"{mark(ratio >= 2 and rr_ttft_p50_ms >= 500)}: {where}: TTFT p50 {ratio:.1f}x lower "
        f"than round-robin's {rr_ttft_p50_ms:.0f} ms (target >= 2x, round-robin >= 500 ms)",
    ]


def _speed_check() -> str:
    requests = read_mooncake_trace(TRACES_DIR / "conversation_trace.jsonl")
    r = replay(requests, ReplayConfig(num_workers=8, router="kv", block_size=16))
    print(f"speed run: {r.num_requests} requests in {r.wall_time_s:.1f} s", flush=True)
    return (
        f"{'PASS' if r.wall_time_s <= 60 else 'MISS'}: the whole conversation trace "
        f"({r.num_requests:,} requests, original timestamps, 8 workers, kv) replays in "
        f"{r.wall_time_s:.0f} s of wall time (target <= 60 s)"
    )


if __name__ == "__main__":
    main()
