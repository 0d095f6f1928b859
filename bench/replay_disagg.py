"""Aggregated vs disaggregated serving in simulation: replay with mocker workers (DESIGN §4
timing, an 8B-class profile; 2 MiB per 16-token KV block moved at 25 GB/s), 8 workers in
every layout. Goodput = requests/s meeting an SLA, for two SLAs: "tpot" (TTFT and each
request's mean inter-token latency) and "stall" (TTFT and each request's p99 inter-token
latency: no long pauses mid-stream).

Workloads: long inputs (ISL uniform 4k-8k, OSL 256, Poisson arrivals, no shared prefixes) at
a sweep of rates; the conversation trace (first --limit requests) at a sweep of time scales.
Layouts: agg (8 workers); disagg P:D (every prompt prefilled on a prefill worker); cond P:D
(conditional: local prefill when fewer than --max-local-prefill-tokens are uncached, or when
the prefill pool is saturated: --max-prefill-queue-tokens in flight on every prefill worker).

    python -m bench.replay_disagg [--quick]
"""

from __future__ import annotations

import argparse
import random

from armature.sim.replay import ReplayConfig, ReplayReport, replay
from armature.workload.measure import Slo
from armature.workload.traces import TraceRequest, read_mooncake_trace
from bench.paths import TRACES_DIR, results_path
from bench.report import Section, get_machine_facts, markdown_table, write_section

LAYOUTS = [("agg", 0, 0), ("disagg 2:6", 2, 0), ("disagg 3:5", 3, 0), ("disagg 4:4", 4, 0)]
NO_LIMIT = 1 << 30


def long_inputs(num: int, rate_rps: float, seed: int = 0) -> list[TraceRequest]:
    rng = random.Random(seed)
    now_ms, next_id, out = 0.0, 0, []
    for _ in range(num):
        now_ms += rng.expovariate(rate_rps) * 1000.0
        isl = rng.randint(4096, 8192)
        blocks = -(-isl // 512)
        out.append(TraceRequest(now_ms, isl, 256, tuple(range(next_id, next_id + blocks))))
        next_id += blocks
    return out


def run(
    requests: list[TraceRequest], layouts: list[tuple[str, int, int]], args: argparse.Namespace
) -> dict[str, ReplayReport]:
    out = {}
    for name, prefill, max_local in layouts:
        conditional = name.startswith("cond")
        config = ReplayConfig(
            num_workers=8,
            num_prefill_workers=prefill,
            max_local_prefill_tokens=max_local,
            max_prefill_queue_tokens=args.max_prefill_queue_tokens if conditional else NO_LIMIT,
            router="kv",
            num_kv_blocks=args.num_kv_blocks,
            slos=(
                Slo("tpot", args.slo_ttft_ms, args.slo_itl_ms),
                Slo("stall", args.slo_ttft_ms, args.slo_stall_ms, 0.99),
            ),
        )
        out[name] = replay(requests, config)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rates", type=float, nargs="+", default=[2, 4, 6, 8, 10])
    parser.add_argument("--num-requests", type=int, default=400)
    parser.add_argument("--time-scales", type=float, nargs="+", default=[0.5, 0.25, 0.15])
    parser.add_argument("--limit", type=int, default=3000)
    parser.add_argument("--num-kv-blocks", type=int, default=32768)
    parser.add_argument("--slo-ttft-ms", type=float, default=2000.0)
    parser.add_argument("--slo-itl-ms", type=float, default=30.0)
    parser.add_argument("--slo-stall-ms", type=float, default=50.0)
    parser.add_argument("--max-local-prefill-tokens", type=int, default=1024)
    parser.add_argument("--max-prefill-queue-tokens", type=int, default=16384)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.rates, args.num_requests, args.time_scales, args.limit = [4, 8], 100, [0.25], 300
    layouts = [*LAYOUTS, ("cond 2:6", 2, args.max_local_prefill_tokens)]
    rows: list[list[object]] = []
    best = {"tpot": (0.0, ""), "stall": (0.0, "")}
    worst_cond = {"tpot": (2.0, ""), "stall": (2.0, "")}
    workloads: list[tuple[str, list[TraceRequest]]] = [
        (f"long-input {rate:g} rps", long_inputs(args.num_requests, rate)) for rate in args.rates
    ]
    for scale in args.time_scales:
        trace = read_mooncake_trace(
            TRACES_DIR / "conversation_trace.jsonl", limit=args.limit, time_scale=scale
        )
        workloads.append((f"conversation x{scale:g}", trace))
    for label, requests in workloads:
        reports = run(requests, layouts, args)
        for sla in ("tpot", "stall"):
            agg = reports["agg"].goodput_requests_s[sla]
            disagg = max(
                r.goodput_requests_s[sla] for n, r in reports.items() if n.startswith("disagg")
            )
            ratio = disagg / agg if agg else float("inf")
            if ratio > best[sla][0]:
                best[sla] = (ratio, label)
            better = max(agg, reports["disagg 2:6"].goodput_requests_s[sla])
            cond = reports["cond 2:6"].goodput_requests_s[sla] / better if better else 1.0
            if cond < worst_cond[sla][0]:
                worst_cond[sla] = (cond, label)
        for name, r in reports.items():
            rows.append(
                [
                    label,
                    name,
                    r.num_remote_prefills,
                    f"{r.goodput_requests_s['tpot']:.2f}",
                    f"{r.goodput_requests_s['stall']:.2f}",
                    f"{r.ttft_ms.p50:.0f}",
                    f"{r.ttft_ms.p99:.0f}",
                    f"{r.itl_ms.p50:.1f}",
                    f"{r.itl_ms.p99:.1f}",
                    f"{r.throughput_tokens_s:,.0f}",
                ]
            )
            print(rows[-1], flush=True)
    checks = []
    for sla in ("tpot", "stall"):
        ratio, where = best[sla]
        checks.append(
            f"- {'PASS' if ratio >= 1.3 else 'MISS'} ({sla} SLA): the best disaggregated layout "
            f"reaches {ratio:.2f}x aggregated goodput, at {where} (target >= 1.3x)"
        )
        gap, where = worst_cond[sla]
        checks.append(
            f"- {'PASS' if gap >= 0.95 else 'MISS'} ({sla} SLA): conditional 2:6 is at worst "
            f"{gap:.0%} of the better of agg and disagg 2:6, at {where} (target >= 95%)"
        )
    body = (
        f"8 mocker workers in every layout; kv routing (prefill pool and decode pool); "
        f"{args.num_kv_blocks:,} KV blocks per worker. SLAs: tpot = TTFT <= "
        f"{args.slo_ttft_ms:g} ms and mean ITL <= {args.slo_itl_ms:g} ms per request; stall = "
        f"TTFT <= {args.slo_ttft_ms:g} ms and p99 ITL <= {args.slo_stall_ms:g} ms per request. "
        f"Long input: {args.num_requests} requests per rate. Conversation: the first "
        f"{args.limit} requests, timestamps scaled. cond 2:6 prefills locally when fewer than "
        f"{args.max_local_prefill_tokens} prompt tokens are uncached on the decode pool, or "
        f"when every prefill worker has {args.max_prefill_queue_tokens:,} prompt tokens in "
        "flight.\n\n"
        + markdown_table(
            [
                "workload",
                "layout",
                "remote prefills",
                "goodput tpot req/s",
                "goodput stall req/s",
                "TTFT p50 ms",
                "TTFT p99 ms",
                "ITL p50 ms",
                "ITL p99 ms",
                "tokens/s",
            ],
            rows,
        )
        + "\n\n"
        + "\n".join(checks)
        + "\n"
    )
    out = results_path(args.quick)
    write_section(
        out,
        Section("replay_disagg", "Replay: aggregated vs disaggregated goodput", body, "n/a"),
        get_machine_facts(),
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
