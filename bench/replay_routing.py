"""Routing quality and replay speed: Mooncake traces through `armature.sim.replay` with 8
mocker workers, for round-robin, least-loaded and kv routing.

    python -m bench.replay_routing [--limit N] [--time-scale X] [--num-kv-blocks K [K ...]]
                                   [--kv-decode-weight W [W ...]] [--speed-run] [--quick]

--kv-decode-weight gives the kv router's decode weight, as `armature replay
--kv-decode-weight` does (1: the DESIGN baseline; default: the router's default, 0.5); with
several, kv runs once per weight. The router temperature is the router's default.
--speed-run also replays the whole conversation trace (original timestamps, kv, default
settings) and checks the replay-speed target (<= 60 s of wall time).

Writes the `replay_routing` section of docs/benchmarks.md (bench/out/ with --quick).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import replace

from armature.sim.replay import ReplayConfig, ReplayReport, replay
from armature.workload.traces import prefix_hit_ceiling, read_mooncake_trace
from bench.paths import TRACES_DIR, results_path
from bench.report import Section, get_machine_facts, markdown_table, write_section

BASELINE_ROUTERS = ("round-robin", "least-loaded")  # the kv router's cost does not apply


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--traces", nargs="+", default=["conversation_trace.jsonl", "synthetic_trace.jsonl"]
    )
    parser.add_argument("--limit", type=int, default=2000)
    parser.add_argument("--time-scale", type=float, default=0.12)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--num-kv-blocks", type=int, nargs="+", default=[32768, 262144])
    parser.add_argument(
        "--kv-decode-weight",
        type=float,
        nargs="+",
        default=[ReplayConfig().decode_weight],
        help="kv router: weight of a worker's active blocks in the cost, one kv run per value "
        "(1: the DESIGN baseline; lower favours cache affinity over spreading memory load; "
        "default: the router's)",
    )
    parser.add_argument("--speed-run", action="store_true")
    parser.add_argument("--quick", action="store_true")
    return parser.parse_args(argv)


def configs(args: argparse.Namespace) -> list[ReplayConfig]:
    """The replays of one trace, in table order: per KV size, each baseline router, then kv at
    each decode weight (the rest as `armature replay`'s defaults)."""
    out = []
    for num_blocks in args.num_kv_blocks:
        base = ReplayConfig(num_workers=args.workers, block_size=16, num_kv_blocks=num_blocks)
        out += [replace(base, router=router) for router in BASELINE_ROUTERS]
        out += [replace(base, router="kv", decode_weight=w) for w in args.kv_decode_weight]
    return out


def main() -> None:
    args = parse_args()
    limit = 200 if args.quick else args.limit
    rows = []
    checks: list[str] = []
    for name in args.traces:
        requests = read_mooncake_trace(TRACES_DIR / name, limit=limit, time_scale=args.time_scale)
        ceiling = prefix_hit_ceiling(requests)
        rr_ttft_p50 = 0.0
        for config in configs(args):
            r = replay(requests, config)
            kv = config.router == "kv"
            rows.append(
                [
                    name,
                    config.num_kv_blocks,
                    config.router,
                    f"{config.decode_weight:g}" if kv else "-",
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
            if config.router == "round-robin":
                rr_ttft_p50 = r.ttft_ms.p50
            if kv and ceiling:
                checks += _quality_checks(name, config, r, ceiling, rr_ttft_p50)
    if args.speed_run:
        checks.append(_speed_check())
    body = (
        f"First {limit} requests of each trace, arrival times x {args.time_scale}, "
        f"{args.workers} mocker workers (default DESIGN timing), block size 16, "
        "KV blocks per worker as listed, router temperature 0, overlap weight 1, kv decode "
        "weight as listed. "
        "Ceiling: the trace's infinite-cache prefix-hit ratio over the same requests.\n\n"
        + markdown_table(
            [
                "trace",
                "KV blocks/worker",
                "router",
                "decode weight",
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
    trace: str, config: ReplayConfig, kv: ReplayReport, ceiling: float, rr_ttft_p50_ms: float
) -> list[str]:
    def mark(ok: bool) -> str:
        return "PASS" if ok else "MISS"

    of_ceiling = kv.prefix_hit_ratio / ceiling
    ratio = rr_ttft_p50_ms / kv.ttft_ms.p50 if kv.ttft_ms.p50 else float("inf")
    where = f"{trace}, {config.num_kv_blocks} blocks, decode weight {config.decode_weight:g}"
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
