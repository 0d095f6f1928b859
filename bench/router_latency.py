"""Router speed: kv decision latency with 64 workers and 4k-token prompts (hashing included,
tokenization not), and prefix-index event throughput while serving queries.

    python -m bench.router_latency [--quick]

Writes the `router_latency` section of docs/benchmarks.md (bench/out/ with --quick).
"""

from __future__ import annotations

import argparse
import random
import time

from armature.kv.hashing import DEFAULT_HASH_SEED, compute_block_hashes
from armature.protocols.kv_events import KvEvent, KvRemoved, KvStored, StoredBlock
from armature.router.load import ActiveLoad
from armature.router.policies import KvPolicy, RouteRequest
from armature.router.prefix_index import PrefixIndex
from armature.router.routed_index import RoutedPrefixIndex
from armature.workload.measure import quantile
from bench.paths import results_path
from bench.report import Section, get_machine_facts, markdown_table, write_section

NUM_WORKERS = 64
BLOCK_SIZE = 16
PROMPT_TOKENS = 4096
CAPACITY_BLOCKS = 16384


def populated_index(rng: random.Random, prefixes: list[list[int]]) -> PrefixIndex:
    index = PrefixIndex()
    for w in range(NUM_WORKERS):
        worker = f"w{w}"
        index.add_worker(worker, CAPACITY_BLOCKS)
        for event_id, prefix in enumerate(rng.sample(prefixes, 8)):
            blocks = [StoredBlock(s, loc) for s, loc in compute_block_hashes(prefix, BLOCK_SIZE)]
            index.apply(worker, KvStored(event_id, None, blocks))
    return index


def decision_latency(num_decisions: int, seed: int) -> list[list[object]]:
    rng = random.Random(seed)
    prefixes = [[rng.randrange(32000) for _ in range(2048)] for _ in range(64)]
    index = populated_index(rng, prefixes)
    workers = [f"w{w}" for w in range(NUM_WORKERS)]
    rows: list[list[object]] = []
    for label, routed in (
        ("kv (events)", None),
        ("kv (events + routed)", RoutedPrefixIndex(120.0, 1 << 20)),
    ):
        policy = KvPolicy(index, ActiveLoad(), BLOCK_SIZE, DEFAULT_HASH_SEED, routed=routed)
        latencies_us = []
        for i in range(num_decisions):
            prompt = rng.choice(prefixes) + [rng.randrange(32000) for _ in range(2048)]
            assert len(prompt) == PROMPT_TOKENS
            started = time.perf_counter()
            policy.select(RouteRequest(f"r{i}", prompt), workers)
            latencies_us.append((time.perf_counter() - started) * 1e6)
        rows.append(
            [label, num_decisions, quantile(latencies_us, 0.5), quantile(latencies_us, 0.99)]
        )
    return rows


def event_throughput(num_events: int, seed: int) -> tuple[float, int]:
    """Events applied per second, interleaved with one overlap query every 100 events."""
    rng = random.Random(seed)
    index = PrefixIndex()
    for w in range(NUM_WORKERS):
        index.add_worker(f"w{w}", CAPACITY_BLOCKS)
    events: list[tuple[str, KvEvent]] = []
    next_id = [0] * NUM_WORKERS
    held: list[list[int]] = [[] for _ in range(NUM_WORKERS)]
    for _ in range(num_events):
        w = rng.randrange(NUM_WORKERS)
        if len(held[w]) > 256 and rng.random() < 0.5:
            gone = [held[w].pop(0) for _ in range(4)]
            events.append((f"w{w}", KvRemoved(next_id[w], gone)))
        else:
            new = [rng.getrandbits(63) for _ in range(4)]
            held[w].extend(new)
            events.append((f"w{w}", KvStored(next_id[w], None, [StoredBlock(h, h) for h in new])))
        next_id[w] += 1
    query = [h for h, _ in compute_block_hashes(list(range(PROMPT_TOKENS)), BLOCK_SIZE)]
    started = time.perf_counter()
    for i, (worker, event) in enumerate(events):
        assert index.apply(worker, event)
        if i % 100 == 0:
            index.find_overlaps(query)
    elapsed = time.perf_counter() - started
    return num_events / elapsed, index.get_num_entries()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    num_decisions = 200 if args.quick else 2000
    num_events = 20_000 if args.quick else 200_000
    rows = decision_latency(num_decisions, args.seed)
    for row in rows:
        print(row, flush=True)
    events_per_s, entries = event_throughput(num_events, args.seed)
    print(f"index: {events_per_s:,.0f} events/s", flush=True)
    p99 = max(float(r[3]) for r in rows)  # type: ignore[arg-type]
    body = (
        f"{NUM_WORKERS} workers, each indexed with 8 of 64 shared 2,048-token prefixes; each "
        f"decision routes a {PROMPT_TOKENS}-token prompt (a shared prefix + 2,048 fresh "
        "tokens): block hashing, index lookup, cost and choice, no tokenization.\n\n"
        + markdown_table(["policy", "decisions", "p50 us", "p99 us"], rows)
        + f"\n\nPrefix index: {num_events:,} Stored/Removed events (4 blocks each) over "
        f"{NUM_WORKERS} workers, one 256-block overlap query every 100 events: "
        f"**{events_per_s:,.0f} events/s** on one core ({entries:,} entries at the end).\n\n"
        f"- {'PASS' if p99 <= 100 else 'MISS'}: decision p99 {p99:.0f} us (target <= 100 us)\n"
        f"- {'PASS' if events_per_s >= 200_000 else 'MISS'}: {events_per_s:,.0f} events/s "
        "(target >= 200k)\n"
    )
    out = results_path(args.quick)
    write_section(
        out,
        Section("router_latency", "Router: decision latency and index throughput", body, "n/a"),
        get_machine_facts(),
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
