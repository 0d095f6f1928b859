"""Routing quality and replay speed: Mooncake traces through `armature.sim.replay` with 8
mocker workers, for round-robin, least-loaded and kv routing.

    python bench/replay_routing.py [--limit N] [--time-scale X] [--num-kv-blocks K] [--quick]

Writes the `replay_routing` section of docs/benchmarks.md (bench/out/ with --quick).
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

from armature.sim.replay import ReplayConfig, replay
from armature.workload.traces import prefix_hit_ceiling, read_mooncake_trace
from report import Section, get_machine_facts, markdown_table, write_section

TRACES_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces"
ROUTERS = ("round-robin", "least-loaded", "kv")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--traces", nargs="+", default=["conversation_trace.jsonl", "synthetic_trace.jsonl"]
    )
    parser.add_argument("--limit", type=int, default=2000)
    parser.add_argument("--time-scale", type=float, default=0.25)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--num-kv-blocks", type=int, nargs="+", default=[32768, 262144])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    limit = 200 if args.quick else args.limit
    rows = []
    for name in args.traces:
        requests = read_mooncake_trace(TRACES_DIR / name, limit=limit, time_scale=args.time_scale)
        ceiling = prefix_hit_ceiling(requests)
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
    )
    out = Path(__file__).resolve().parent / (
        "out/benchmarks.md" if args.quick else "../docs/benchmarks.md"
    )
    write_section(
        out, Section("replay_routing", "Replay: routing quality", body, "n/a"), get_machine_facts()
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
