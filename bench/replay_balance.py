"""The kv router's load skew against its prefix-hit ratio, tuned on the first half of each
trace and reported on the second half (issue 16: skew <= 1.10 on both traces with the hit
ratio within 3% of the default cost's).

    python -m bench.replay_balance [--temperatures T ...] [--decode-weights W ...] [--quick]

Every candidate cost (router temperature x decode weight, overlap weight 1) replays the first
half of each trace (its first requests by arrival, original timestamps, 8 workers, block size
16, 131,072 KV blocks per worker). A candidate is feasible when, on both first halves, its
skew is <= 1.10 and its hit ratio >= 97% of the default cost's; the chosen one is the
feasible candidate with the lowest worst skew (ties: the higher worst hit share), and the
default cost if none is. Then the default and the chosen cost replay the second halves
(their requests alone, from a cold cache), where the targets are checked: the second halves
choose nothing.

Writes the `replay_balance` section of docs/benchmarks.md (bench/out/ with --quick).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import dataclass

from armature.sim.replay import ReplayConfig, ReplayReport, replay
from armature.workload.traces import TraceRequest, read_mooncake_trace
from bench.paths import TRACES_DIR, results_path
from bench.report import Section, get_machine_facts, markdown_table, write_section

TRACES = ("conversation_trace.jsonl", "synthetic_trace.jsonl")
TARGET_SKEW = 1.10
MIN_HIT_SHARE = 0.97  # of the default cost's hit ratio


@dataclass(frozen=True)
class Candidate:
    temperature: float
    decode_weight: float

    @property
    def label(self) -> str:
        return f"temperature {self.temperature:g}, decode weight {self.decode_weight:g}"


@dataclass(frozen=True)
class Outcome:
    hit: float
    skew: float
    ttft_p50_ms: float
    cpu_s: float


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.01, 0.02])
    parser.add_argument("--decode-weights", type=float, nargs="+", default=[0.5, 1.0, 2.0])
    parser.add_argument("--limit", type=int, default=None, help="the first N requests only")
    parser.add_argument("--quick", action="store_true")
    return parser.parse_args(argv)


def halves(requests: list[TraceRequest]) -> tuple[list[TraceRequest], list[TraceRequest]]:
    middle = len(requests) // 2
    return requests[:middle], requests[middle:]


def run(requests: list[TraceRequest], candidate: Candidate) -> Outcome:
    config = ReplayConfig(
        num_workers=8,
        router="kv",
        block_size=16,
        num_kv_blocks=131072,
        router_temperature=candidate.temperature,
        decode_weight=candidate.decode_weight,
    )
    cpu_s = time.process_time()
    report: ReplayReport = replay(requests, config)
    return Outcome(
        report.prefix_hit_ratio,
        report.load_skew,
        report.ttft_ms.p50,
        time.process_time() - cpu_s,
    )


def choose(
    candidates: Sequence[Candidate],
    tuned: dict[tuple[str, Candidate], Outcome],
    default: Candidate,
) -> Candidate:
    """The feasible candidate with the lowest worst skew over the traces (ties: the higher
    worst hit share of the default's), else `default`."""
    best: tuple[float, float] | None = None
    chosen = default
    for candidate in candidates:
        skews, shares = [], []
        for trace in TRACES:
            outcome, base = tuned[(trace, candidate)], tuned[(trace, default)]
            skews.append(outcome.skew)
            shares.append(outcome.hit / base.hit if base.hit else 1.0)
        if max(skews) > TARGET_SKEW or min(shares) < MIN_HIT_SHARE:
            continue
        key = (max(skews), -min(shares))
        if best is None or key < best:
            best, chosen = key, candidate
    return chosen


def main() -> None:
    args = parse_args()
    limit = 600 if args.quick else args.limit
    default = Candidate(ReplayConfig().router_temperature, ReplayConfig().decode_weight)
    grid = [Candidate(t, w) for t in args.temperatures for w in args.decode_weights]
    candidates = [default, *(c for c in grid if c != default)]  # the default's hit first
    split = {name: halves(read_mooncake_trace(TRACES_DIR / name, limit=limit)) for name in TRACES}
    tuned: dict[tuple[str, Candidate], Outcome] = {}
    tune_rows = []
    for candidate in candidates:
        for name in TRACES:
            outcome = run(split[name][0], candidate)
            tuned[(name, candidate)] = outcome
            tune_rows.append(_row(name, candidate, outcome, tuned[(name, default)]))
            print(tune_rows[-1], flush=True)
    chosen = choose(candidates, tuned, default)
    report_rows, checks = [], []
    for name in TRACES:
        base = run(split[name][1], default)
        report_rows.append(_row(name, default, base, base))
        outcome = base if chosen == default else run(split[name][1], chosen)
        if chosen != default:
            report_rows.append(_row(name, chosen, outcome, base))
        share = outcome.hit / base.hit if base.hit else 1.0
        checks.append(
            f"{'PASS' if outcome.skew <= TARGET_SKEW else 'MISS'}: {name}, second half, "
            f"chosen cost: load skew {outcome.skew:.3f} (target <= {TARGET_SKEW})"
        )
        checks.append(
            f"{'PASS' if share >= MIN_HIT_SHARE else 'MISS'}: {name}, second half, chosen "
            f"cost: prefix hit {outcome.hit:.4f}, {share:.1%} of the default cost's "
            f"{base.hit:.4f} (target >= {MIN_HIT_SHARE:.0%})"
        )
        print(report_rows[-1], flush=True)
    columns = [
        "trace",
        "cost",
        "prefix hit",
        "of default's hit",
        "load skew",
        "TTFT p50 ms",
        "CPU s",
    ]
    scope = f"the first {limit} requests of each trace" if limit else "each whole trace"
    body = (
        f"Halves of {scope} by arrival, original timestamps, 8 mocker workers, kv router, "
        "block size 16, 131,072 KV blocks per worker, overlap weight 1. Tuning: every "
        "candidate on the first halves; feasible where skew <= 1.10 and the hit ratio >= 97% "
        "of the default cost's on both; chosen: the lowest worst skew (the default cost if "
        f"none is feasible). Default cost: {default.label}.\n\n"
        "**Tuning (first halves)**\n\n"
        + markdown_table(columns, tune_rows)
        + f"\n\nChosen on the first halves: **{chosen.label}**"
        + (" (the default)" if chosen == default else "")
        + ".\n\n**Report (second halves, replayed alone)**\n\n"
        + markdown_table(columns, report_rows)
        + "\n\n"
        + "\n".join(f"- {c}" for c in checks)
        + "\n"
    )
    out = results_path(args.quick)
    write_section(
        out,
        Section("replay_balance", "Replay: load skew, tuned on one half", body, "n/a"),
        get_machine_facts(),
    )
    print(f"wrote {out}")


def _row(name: str, candidate: Candidate, outcome: Outcome, base: Outcome) -> list[object]:
    share = outcome.hit / base.hit if base.hit else 1.0
    return [
        name,
        candidate.label,
        round(outcome.hit, 4),
        f"{share:.1%}",
        round(outcome.skew, 3),
        round(outcome.ttft_p50_ms, 1),
        round(outcome.cpu_s, 1),
    ]


if __name__ == "__main__":
    main()
