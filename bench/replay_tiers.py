"""Lower KV tiers in replay: does a small G1 plus a host tier (G2) keep the hit ratio and TTFT
of a G1 as large as both? The conversation trace through `armature.sim.replay`, 8 mocker
workers, block size 16, the trace's own arrival times, kv routing:

    (a) G1 alone: 16,384 blocks per worker          the case to fix
    (b) the same G1 + 131,072 G2 (host) blocks      the tiers
    (c) G1 alone: 131,072 blocks per worker         the reference

Targets (issue "KV block manager: host, disk and shared remote tiers"): (b)'s hit ratio
>= 90% of (c)'s, and (b)'s TTFT p50 <= 1.2x (c)'s. The hit ratio is the token hit ratio:
prompt tokens found cached when a request is first scheduled (in G1, or onboarded from G2)
over all prompt tokens, the same unit in every row.

    python -m bench.replay_tiers [--limit N] [--time-scale X] [--routers R [R ...]]
                                 [--timings T [T ...]] [--quick]

Each router in --routers (default: kv, then round-robin, whose choices ignore the cache, so
its (b)/(c) ratio measures the tiers alone) runs the three cases, under each step-time model
in --timings:

    design     the DESIGN polynomial: decode priced by the worker's KV utilization, so at
               equal load (a)'s and (b)'s 16,384-block pool pays more per decode step than
               (c)'s 131,072-block one
    attended   the same polynomial with decode priced by the tokens the decode requests
               attend over, against (c)'s pool as the reference (`AttendedTokensTiming`):
               equal work costs the same in every case, as an engine's attention does

Tier-aware vs tier-blind routing: with kv routing, (b) runs twice, tier-aware (lower-tier
hits count at each worker's measured weight, docs/architecture.md "Tier-aware routing") and
tier-blind (`--kv-tier-blind`: only G1 hits count). Both are reported; (b) in the targets is
the tier-aware run.

Writes the `replay_tiers` section of docs/benchmarks.md (bench/out/ with --quick).
"""

from __future__ import annotations

import argparse
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, replace

from armature.config import KvTierConfig
from armature.sim.replay import ReplayConfig, ReplayReport, replay
from armature.sim.timing import AttendedTokensTiming, PolynomialTiming, TimingModel
from armature.workload.traces import prefix_hit_ceiling, read_mooncake_trace
from bench.paths import TRACES_DIR, results_path
from bench.report import Section, get_machine_facts, markdown_table, write_section

HIT_RATIO_TARGET = 0.90  # (b) over (c)
TTFT_P50_TARGET = 1.2  # (b) over (c), at most


TIERED, BLIND, LARGE = "(b) G1 + G2", "(b) G1 + G2, tier-blind", "(c) large G1"


@dataclass(frozen=True)
class Case:
    label: str  # (a), (b), (b) tier-blind or (c)
    config: ReplayConfig


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trace", default="conversation_trace.jsonl")
    parser.add_argument("--limit", type=int, default=None, help="first N requests (all)")
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--g1-blocks", type=int, default=16384)
    parser.add_argument("--g2-blocks", type=int, default=131072)
    parser.add_argument("--large-g1-blocks", type=int, default=131072)
    parser.add_argument("--routers", nargs="+", default=["kv", "round-robin"])
    parser.add_argument(
        "--timings", nargs="+", choices=["design", "attended"], default=["design", "attended"]
    )
    parser.add_argument("--quick", action="store_true", help="first 500 requests, bench/out/")
    return parser.parse_args(argv)


def cases(args: argparse.Namespace, router: str) -> list[Case]:
    """(a), (b), (c) with `router`; with kv routing (b) tier-blind too."""
    base = ReplayConfig(
        num_workers=args.workers, router=router, block_size=16, num_kv_blocks=args.g1_blocks
    )
    tiers = KvTierConfig(kv_host_blocks=args.g2_blocks)
    blind = [Case(BLIND, replace(base, tiers=tiers, tier_aware=False))] if router == "kv" else []
    return [
        Case("(a) G1", base),
        Case(TIERED, replace(base, tiers=tiers)),
        *blind,
        Case(LARGE, replace(base, num_kv_blocks=args.large_g1_blocks)),
    ]


def get_timing(name: str, args: argparse.Namespace) -> TimingModel:
    if name == "attended":
        return AttendedTokensTiming(kv_capacity_tokens=args.large_g1_blocks * 16)
    return PolynomialTiming()


def row(timing: str, case: Case, r: ReplayReport) -> list[object]:
    return [
        timing,
        case.config.router,
        case.label,
        case.config.num_kv_blocks,
        case.config.tiers.kv_host_blocks or 0,
        r.num_requests,
        round(r.prefix_hit_ratio, 4),
        round(r.onboarded_token_ratio, 4),
        r.ttft_ms.p50,
        r.ttft_ms.p99,
        r.itl_ms.p50,
        r.blocks_onboarded.get("g2->g1", 0),
        r.wall_time_s,
    ]


def checks(what: str, reports: dict[str, ReplayReport]) -> list[str]:
    tiered, large = reports[TIERED], reports[LARGE]
    hit = tiered.prefix_hit_ratio / large.prefix_hit_ratio if large.prefix_hit_ratio else 0.0
    ttft = tiered.ttft_ms.p50 / large.ttft_ms.p50 if large.ttft_ms.p50 else float("inf")

    def mark(ok: bool) -> str:
        return "PASS" if ok else "MISS"

    return [
        f"{mark(hit >= HIT_RATIO_TARGET)}: {what}: (b)'s hit ratio is {hit:.1%} of (c)'s "
        f"({tiered.prefix_hit_ratio:.4f} / {large.prefix_hit_ratio:.4f}; target >= "
        f"{HIT_RATIO_TARGET:.0%})",
        f"{mark(ttft <= TTFT_P50_TARGET)}: {what}: (b)'s TTFT p50 is {ttft:.2f}x (c)'s "
        f"({tiered.ttft_ms.p50:,.0f} / {large.ttft_ms.p50:,.0f} ms; target <= "
        f"{TTFT_P50_TARGET}x)",
        *([f"{what}: " + _aware_vs_blind(tiered, reports[BLIND])] if BLIND in reports else []),
    ]


def _aware_vs_blind(aware: ReplayReport, blind: ReplayReport) -> str:
    return (
        f"tier-aware vs tier-blind kv routing in (b): hit ratio {aware.prefix_hit_ratio:.4f} "
        f"vs {blind.prefix_hit_ratio:.4f}, TTFT p50 {aware.ttft_ms.p50:,.0f} vs "
        f"{blind.ttft_ms.p50:,.0f} ms, p99 {aware.ttft_ms.p99:,.0f} vs {blind.ttft_ms.p99:,.0f} ms"
    )


def _shell(command: str) -> str:
    return subprocess.run(command, shell=True, capture_output=True, text=True).stdout.strip()


def main() -> None:
    args = parse_args()
    limit = 500 if args.quick else args.limit
    requests = read_mooncake_trace(TRACES_DIR / args.trace, limit=limit, time_scale=args.time_scale)
    ceiling = prefix_hit_ceiling(requests)
    rows: list[list[object]] = []
    marks: list[str] = []
    for timing in args.timings:
        for router in args.routers:
            reports: dict[str, ReplayReport] = {}
            for case in cases(args, router):
                reports[case.label] = replay(requests, case.config, get_timing(timing, args))
                rows.append(row(timing, case, reports[case.label]))
                print(rows[-1], flush=True)
            marks += checks(f"{timing} timing, {router}", reports)
    what = f"first {limit:,} requests" if limit else f"all {len(requests):,} requests"
    body = (
        f"{args.trace}, {what}, arrival times x {args.time_scale:g}, {args.workers} mocker "
        "workers, step times as listed (design: the DESIGN polynomial, decode by the worker's "
        "KV utilization; attended: decode by the decode requests' attended tokens against a "
        f"{args.large_g1_blocks:,}-block pool), block size 16, routers as listed (kv: temperature "
        "0, overlap weight 1, decode weight 1), 2 MiB per KV block (an 8B model in bfloat16); "
        "G2 loads at the default --kv-host-bandwidth-gbps (25 GB/s), one load at a time per "
        "worker, offload on eviction. Hit ratio: prompt tokens cached when first scheduled "
        "(G1 hits and blocks onboarded from G2) over prompt tokens; onboarded: the part of it "
        f"that came from G2. The trace's infinite-cache ceiling over these requests: "
        f"{ceiling:.3f}.\n\n"
        + markdown_table(
            [
                "timing",
                "router",
                "case",
                "G1 blocks/worker",
                "G2 blocks/worker",
                "requests",
                "hit ratio",
                "onboarded",
                "TTFT p50 ms",
                "TTFT p99 ms",
                "ITL p50 ms",
                "blocks onboarded",
                "wall s",
            ],
            rows,
        )
        + "\n\n"
        + "\n".join(f"- {c}" for c in marks)
        + "\n\nMachine (`nproc`; `lscpu | head -15`):\n\n```\n"
        + _shell("nproc")
        + "\n"
        + _shell("lscpu | head -15")
        + "\n```\n"
    )
    out = results_path(args.quick)
    section = Section("replay_tiers", "Replay: lower KV tiers (G1 + G2 vs a large G1)", body, "n/a")
    write_section(out, section, get_machine_facts())
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
