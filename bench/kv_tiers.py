"""Lower KV tiers on the real engine: multi-turn TTFT with host (G2) or disk (G3) against G1
alone, onboarding bandwidth against memcpy and a plain file read, and a prompt one engine
wrote to the shared store (G4) served by another.

    python -m bench.kv_tiers            # full run, writes docs/benchmarks.md
    python -m bench.kv_tiers --quick    # smoke run, writes bench/out/benchmarks.md

EngineCore driven directly, one request at a time, on this machine's CPU. Multi-turn: 16
sessions x 6 turns; each turn adds ~450 new prompt tokens and the 16 tokens the previous turn
generated, so a session grows to ~2.9k tokens; turns go round robin over the sessions, and G1
holds about a quarter of the working set, so a session's earlier turns are evicted before it
comes back. TTFT = add_request to the step that returns the request's first token.
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from statistics import median

import torch

from armature.config import KvTierConfig
from armature.engines.native.core import EngineCore, TierBuilder
from armature.kv.event_log import KvEventLog
from armature.kv.eviction import EvictedBlock
from armature.protocols.engine import EngineRequest
from armature.protocols.kv_events import KvTier
from armature.tiers.factory import build_tier_manager
from armature.tiers.manager import KvTierManager
from armature.transfer.blocks import KvBlockStore
from armature.workload.measure import quantile
from bench.harness import BenchArgs, build_core, greedy, parse_args, publish, warm_up
from bench.report import Section, markdown_table

NUM_SESSIONS, NUM_TURNS, TURN_TOKENS, OUTPUT_TOKENS = 16, 6, 450, 16
TARGET_G2, TARGET_G3, TARGET_BANDWIDTH, TARGET_G4 = 3.0, 2.0, 0.5, 3.0


def tiers_of(config: KvTierConfig) -> TierBuilder:
    def build(log: KvEventLog, store: KvBlockStore) -> KvTierManager:
        tensors = store.kv_tensors()
        assert tensors is not None
        return build_tier_manager(
            config, log, tensors, store.layout, model_name="bench", weights="w"
        )

    return build


def first_token_ms(core: EngineCore, request_id: str, prompt: list[int]) -> tuple[float, list[int]]:
    """TTFT of one request on an idle engine, and its output tokens."""
    assert not core.has_work()
    started_s = time.perf_counter()
    core.add_request(
        EngineRequest(
            request_id=request_id, prompt_token_ids=prompt, sampling=greedy(OUTPUT_TOKENS)
        )
    )
    ttft_ms, tokens = None, []
    while core.has_work():
        for output in core.step():
            if ttft_ms is None:
                ttft_ms = (time.perf_counter() - started_s) * 1000
            tokens.extend(output.new_token_ids)
    assert ttft_ms is not None
    return ttft_ms, tokens


@dataclass(frozen=True)
class Row:
    """One configuration of the multi-turn comparison: G1's size and the lower tiers."""

    name: str
    num_g1_blocks: int
    tiers: KvTierConfig | None

    def build(self, args: BenchArgs) -> EngineCore:
        if self.tiers is None:
            return build_core(
                args, max_num_seqs=1, num_kv_blocks=self.num_g1_blocks, max_num_batched_tokens=1024
            )
        return _tiered_core(args, self.num_g1_blocks, self.tiers)


G1_ONLY, G2_ROW, G3_ROW, CEILING = 0, 1, 2, 3  # the rows `comparison_rows` makes, in order


def comparison_rows(num_g1: int, lower: int, disk_dir: Path) -> list[Row]:
    return [
        Row("G1 only", num_g1, None),
        Row("G1 + G2 host", num_g1, KvTierConfig(kv_host_blocks=lower)),
        Row(
            "G1 + G3 disk (no G2)",
            num_g1,
            KvTierConfig(kv_disk_dir=str(disk_dir), kv_disk_blocks=lower),
        ),
        # the most any tier can give: a G1 that never evicts (later turns hit G1)
        Row("G1 holding everything", lower, None),
    ]


@dataclass(frozen=True)
class MultiTurn:
    """One interleaved run of every row: TTFTs per row, in request order."""

    names: list[str]
    ttfts_ms: list[list[float]]
    num_requests: int
    num_same_output: int  # requests whose greedy tokens were the same in every row

    def quantile(self, row: int, q: float) -> float:
        return quantile(self.ttfts_ms[row], q)

    def speedup(self, row: int, q: float) -> float:
        """How many times lower row's TTFT quantile is than G1 only's."""
        return self.quantile(G1_ONLY, q) / self.quantile(row, q)

    def paired_ratio(self, row: int, base: int) -> float:
        """Median over requests of row's TTFT / base's TTFT for the same request."""
        return median(a / b for a, b in zip(self.ttfts_ms[row], self.ttfts_ms[base], strict=True))


def multi_turn(args: BenchArgs, rows: list[Row], seed: int) -> MultiTurn:
    """Every turn of every session on each row's engine, one request at a time. The rows take
    turns request by request (the first one rotating), so a machine whose speed drifts over the
    minutes of a run slows every row alike. A session continues with the first row's output;
    each row's output is compared with it. A tiered engine's background writes are flushed
    after its request, untimed, so they do not land in the next row's TTFT."""
    cores = [row.build(args) for row in rows]
    for core in cores:
        warm_up(core)
    rng = random.Random(seed)
    vocab = cores[0].arch.vocab_size
    sessions: list[list[int]] = [[] for _ in range(NUM_SESSIONS if not args.quick else 4)]
    ttfts: list[list[float]] = [[] for _ in rows]
    num_requests = num_same = 0
    for turn in range(NUM_TURNS if not args.quick else 2):
        for s, history in enumerate(sessions):
            history.extend(rng.randrange(3, vocab) for _ in range(TURN_TOKENS))
            outputs: dict[int, list[int]] = {}
            for k in range(len(rows)):
                i = (num_requests + k) % len(rows)
                ttft_ms, outputs[i] = first_token_ms(cores[i], f"s{s}-t{turn}", history)
                ttfts[i].append(ttft_ms)
                if cores[i].tiers is not None:
                    cores[i].tiers.flush()
            num_requests += 1
            num_same += all(out == outputs[0] for out in outputs.values())
            history.extend(outputs[0])
    for core in cores:
        core.close()
    run = MultiTurn([row.name for row in rows], ttfts, num_requests, num_same)
    for i, name in enumerate(run.names):
        print(f"{name}: p50 {run.quantile(i, 0.5):.0f} ms, p90 {run.quantile(i, 0.9):.0f} ms")
    return run


def _tiered_core(args: BenchArgs, num_g1_blocks: int, tiers: KvTierConfig) -> EngineCore:
    from armature.engines.native.config import NativeEngineConfig

    config = NativeEngineConfig(
        model_dir=args.model_dir,
        dtype=args.dtype_name,
        device="cpu",
        max_num_seqs=1,
        num_kv_blocks=num_g1_blocks,
        max_num_batched_tokens=1024,
    )
    return EngineCore(config, tiers=tiers_of(tiers))


def _timed(fn: Callable[[], object]) -> float:
    started_s = time.perf_counter()
    fn()
    return time.perf_counter() - started_s


def bandwidth(
    args: BenchArgs, tier: KvTier, num_blocks: int, workdir: Path, attempts: int = 3
) -> tuple[float, float, int]:
    """(onboarding GB/s from `tier` into G1, the reference GB/s: memcpy of the same bytes for
    host, a plain read of one file of the same size for disk; the bytes). Each the best of
    `attempts`, the two taken in turn so that both see the machine of the same moments. Page
    cache dropped before each disk read (posix_fadvise DONTNEED on every file)."""
    core = _tiered_core(
        args,
        num_blocks * 2,
        KvTierConfig(kv_host_blocks=num_blocks)
        if tier is KvTier.HOST
        else KvTierConfig(kv_disk_dir=str(workdir / "disk"), kv_disk_blocks=num_blocks),
    )
    tiers = core.tiers
    assert tiers is not None
    k, v = core.kv_store.kv_tensors() or (None, None)
    assert k is not None and v is not None
    k.normal_()
    v.normal_()
    evicted = [EvictedBlock(i, 10_000 + i, 20_000 + i, None) for i in range(num_blocks)]
    tiers.on_evict(evicted)
    tiers.flush()
    nbytes = num_blocks * tiers.bytes_per_block
    g1_ids = list(range(num_blocks, 2 * num_blocks))

    def load() -> None:
        hits = tiers.find([e.seq_hash for e in evicted])
        assert len(hits) == num_blocks
        tiers.reserve(hits)
        tiers.submit(hits, g1_ids)
        while not tiers.take_finished():
            tiers.wait_for_loads(0.001)

    if tier is KvTier.HOST:
        src, dst = torch.empty(nbytes, dtype=torch.uint8), torch.empty(nbytes, dtype=torch.uint8)
        src.fill_(1)
        dst.fill_(0)

        def reference() -> object:
            return dst.copy_(src)
    else:
        plain = workdir / "plain.bin"
        plain.write_bytes(os.urandom(nbytes))

        def reference() -> object:
            return plain.read_bytes()

    load_s, ref_s = [], []
    for _ in range(attempts):
        k[:, num_blocks:].zero_()
        v[:, num_blocks:].zero_()
        if tier is KvTier.DISK:
            for path in (workdir / "disk").rglob("*.kvb"):
                _drop_cache(path)
        load_s.append(_timed(load))
        assert torch.equal(k[:, num_blocks:], k[:, :num_blocks])  # the bytes really came back
        assert torch.equal(v[:, num_blocks:], v[:, :num_blocks])
        if tier is KvTier.DISK:
            _drop_cache(plain)
        ref_s.append(_timed(reference))
    core.close()
    return nbytes / min(load_s) / 1e9, nbytes / min(ref_s) / 1e9, nbytes


def _drop_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def sharing(args: BenchArgs, workdir: Path, repeats: int) -> list[tuple[float, float]]:
    """(cold TTFT ms, TTFT ms of a prompt another engine wrote to G4) per repetition."""
    shared = f"file://{workdir}/shared"
    writer_tiers = KvTierConfig(
        kv_remote=shared, kv_remote_offload="all", kv_offload="write-through"
    )
    rng = random.Random(args.seed + 1)
    rows = []
    for i in range(repeats):
        writer = _tiered_core(args, 512, writer_tiers)
        vocab = writer.arch.vocab_size
        warm, cold, shared_prompt = (
            [rng.randrange(3, vocab) for _ in range(2900)] for _ in range(3)
        )
        first_token_ms(writer, f"w{i}", shared_prompt)
        writer.close()  # its writes landed
        reader = _tiered_core(args, 512, KvTierConfig(kv_remote=shared))
        first_token_ms(reader, f"warm{i}", warm[:64])
        cold_ms, _ = first_token_ms(reader, f"cold{i}", cold)
        shared_ms, _ = first_token_ms(reader, f"shared{i}", shared_prompt)
        reader.close()
        print(f"sharing {i}: cold {cold_ms:.0f} ms, from G4 {shared_ms:.0f} ms", flush=True)
        rows.append((cold_ms, shared_ms))
    return rows


def spread(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="bandwidth and G4 runs, default 3 (1 with --quick)",
    )
    parser.add_argument(
        "--turn-runs",
        type=int,
        default=None,
        help="multi-turn runs, seeds --seed, --seed+1, ... (default 2, 1 with --quick)",
    )
    args, ns = parse_args(parser.description or "", parser)
    repeats = ns.repeats or (1 if args.quick else 3)
    turn_runs = ns.turn_runs or (1 if args.quick else 2)
    num_g1 = 120 if args.quick else 700  # about a quarter of the sessions' ~2,800 blocks
    lower = 4096
    with tempfile.TemporaryDirectory(prefix="armature-bench-tiers-") as tmp:
        work = Path(tmp)
        runs = []
        for r in range(turn_runs):
            rows = comparison_rows(num_g1, lower, work / f"g3-{r}")
            runs.append(multi_turn(args, rows, args.seed + r))
        num_blocks = 64 if args.quick else 512
        host = [bandwidth(args, KvTier.HOST, num_blocks, work / f"h{i}") for i in range(repeats)]
        disk = [bandwidth(args, KvTier.DISK, num_blocks, work / f"d{i}") for i in range(repeats)]
        shared = sharing(args, work / "g4", repeats)
    body = _report(num_g1, lower, runs, host, disk, shared, num_blocks)
    print()
    print(body)
    publish(
        args, Section("kv_tiers", "KV tiers: onboarding on the real engine", body, args.dtype_name)
    )


def _per_run(runs: list[MultiTurn], cell: Callable[[MultiTurn], str]) -> str:
    return " / ".join(cell(run) for run in runs)


def _turn_row(runs: list[MultiTurn], i: int) -> list[object]:
    ratio = _per_run(runs, lambda run: f"{run.paired_ratio(i, CEILING):.2f}")
    return [
        runs[0].names[i],
        _per_run(runs, lambda run: f"{run.quantile(i, 0.5):,.0f}"),
        _per_run(runs, lambda run: f"{run.quantile(i, 0.9):,.0f}"),
        "" if i == G1_ONLY else _per_run(runs, lambda run: f"{run.speedup(i, 0.5):.2f}x"),
        "" if i == G1_ONLY else _per_run(runs, lambda run: f"{run.speedup(i, 0.9):.2f}x"),
        ratio,
    ]


def _turn_table(runs: list[MultiTurn]) -> str:
    return markdown_table(
        [
            "tiers",
            "TTFT p50 ms",
            "TTFT p90 ms",
            "p50 vs G1 only",
            "p90 vs G1 only",
            "TTFT / ceiling's (median per request)",
        ],
        [_turn_row(runs, i) for i in range(len(runs[0].names))],
    )


def _report(
    num_g1: int,
    lower: int,
    runs: list[MultiTurn],
    host: list[tuple[float, float, int]],
    disk: list[tuple[float, float, int]],
    shared: list[tuple[float, float]],
    num_blocks: int,
) -> str:
    host_ratio = [load / ref for load, ref, _ in host]
    disk_ratio = [load / ref for load, ref, _ in disk]
    bw = markdown_table(
        ["path", "onboard GB/s", "reference GB/s", "ratio (runs)"],
        [
            ["G2 -> G1 vs memcpy", *_ranges(host), spread(host_ratio)],
            ["G3 -> G1 vs file read", *_ranges(disk), spread(disk_ratio)],
        ],
    )
    g4_speedups = [cold / warm for cold, warm in shared]
    g4 = markdown_table(
        ["run", "cold TTFT ms", "TTFT from G4 ms", "speedup"],
        [[i, c, w, f"{c / w:.1f}x"] for i, (c, w) in enumerate(shared)],
    )

    def verdict(ok: bool) -> str:
        return "PASS" if ok else "MISS"

    def lowest(row: int) -> float:
        return min(run.speedup(row, q) for run in runs for q in (0.5, 0.9))

    def speedups(row: int) -> str:
        p50 = _per_run(runs, lambda run: f"{run.speedup(row, 0.5):.2f}x")
        p90 = _per_run(runs, lambda run: f"{run.speedup(row, 0.9):.2f}x")
        return f"p50 {p50}, p90 {p90}"

    same = _per_run(runs, lambda run: f"{run.num_same_output} of {run.num_requests}")
    return (
        f"Multi-turn chat, {NUM_SESSIONS} sessions x {NUM_TURNS} turns (~{TURN_TOKENS} new "
        f"tokens a turn plus the {OUTPUT_TOKENS} generated; ~2.9k tokens at the end), one "
        f"request at a time, round robin over sessions; G1 {num_g1} blocks (about a quarter "
        f"of the working set), G2 / G3 {lower} blocks. The four engines run side by side and "
        f"take turns request by request (the first one rotating), so the machine's speed "
        f"drift over a run reaches every row alike; G3's background writes are flushed, "
        f"untimed, after each of its requests. TTFT over all {runs[0].num_requests} requests "
        f"(turn 1 is cold in every row). {len(runs)} run(s) (prompt seeds `--seed`, `--seed` + 1, "
        f"...); a cell lists run 1 / run 2 / ....\n\n{_turn_table(runs)}\n\n"
        f"- {verdict(lowest(G2_ROW) >= TARGET_G2)}: G2 lowers TTFT {speedups(G2_ROW)} "
        f"(target >= {TARGET_G2:.0f}x in every run)\n"
        f"- {verdict(lowest(G3_ROW) >= TARGET_G3)}: G3 alone lowers TTFT {speedups(G3_ROW)} "
        f"(target >= {TARGET_G3:.0f}x in every run)\n"
        f"- The ceiling: a G1 of {lower} blocks, which never evicts, lowers TTFT "
        f"{speedups(CEILING)}. No tier can beat it: a later turn then still computes its "
        f"~{TURN_TOKENS + OUTPUT_TOKENS} new tokens over its context.\n"
        f"- Greedy output the same in all four rows: {same} requests.\n\n"
        f"Onboarding bandwidth: {num_blocks} blocks ({host[0][2] / 1e6:.0f} MB) "
        f"loaded by the tier manager's loader into G1, against memcpy of the same bytes and a "
        f"plain read of one file of the same size; in each run the best of 3 of each, the load "
        f"and its reference taken in turn; the page cache is dropped (posix_fadvise) before "
        f"each disk read. {len(host)} run(s); ranges are "
        f"min-max.\n\n{bw}\n\n"
        f"- {verdict(min(host_ratio) >= TARGET_BANDWIDTH)}: G2 -> G1 at "
        f"{spread(host_ratio)} of memcpy (target >= {TARGET_BANDWIDTH:.0%})\n"
        f"- {verdict(min(disk_ratio) >= TARGET_BANDWIDTH)}: G3 -> G1 at "
        f"{spread(disk_ratio)} of a sequential file read (target >= {TARGET_BANDWIDTH:.0%})\n\n"
        f"Sharing through G4 (a file:// store): engine A serves a 2,900-token prompt with "
        f"write-through to the store; a fresh engine B then serves a cold prompt of the same "
        f"length and A's prompt.\n\n{g4}\n\n"
        f"- {verdict(min(g4_speedups) >= TARGET_G4)}: B's TTFT for A's prompt is "
        f"{spread(g4_speedups)}x lower than cold (target >= {TARGET_G4:.0f}x)\n"
    )


def _ranges(runs: list[tuple[float, float, int]]) -> list[str]:
    return [spread([r[0] for r in runs]), spread([r[1] for r in runs])]


if __name__ == "__main__":
    main()
