"""Block hashing speed: the native extension against the pure-Python fallback, whole prompts
(a list of Python ints, block size 16, as the engine and the router call it).

    python -m bench.block_hashing [--quick]

Each round times `calls` back-to-back calls and keeps the mean per call; the table gives the
median round and the spread (fastest and slowest round). Writes the `block_hashing` section of
docs/benchmarks.md (bench/out/ with --quick).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from armature.kv.hashing import (
    HashBackend,
    compute_block_hashes,
    compute_seq_hashes,
    has_native_hashing,
)
from bench.report import Section, get_machine_facts, markdown_table, write_section

BLOCK_SIZE = 16
PROMPT_TOKENS = (1024, 4096, 16384)


def time_rounds(fn: Callable[[], object], num_rounds: int, calls: int) -> list[float]:
    """Microseconds per call, one value per round (after one warm-up round)."""
    out: list[float] = []
    for round_index in range(num_rounds + 1):
        started = time.perf_counter()
        for _ in range(calls):
            fn()
        if round_index:
            out.append((time.perf_counter() - started) / calls * 1e6)
    return out


def measure(num_rounds: int, seed: int) -> list[list[object]]:
    rng = random.Random(seed)
    backends = [HashBackend.PYTHON] + ([HashBackend.NATIVE] if has_native_hashing() else [])
    calls_by_name = {"block_hashes": compute_block_hashes, "seq_hashes": compute_seq_hashes}
    rows: list[list[object]] = []
    for num_tokens in PROMPT_TOKENS:
        tokens = [rng.randrange(150_000) for _ in range(num_tokens)]
        calls = max(5, 1_000_000 // num_tokens)
        for name, hash_fn in calls_by_name.items():
            python_median = 0.0
            for backend in backends:
                call = partial(hash_fn, tokens, BLOCK_SIZE, backend=backend)
                us = time_rounds(call, num_rounds, calls)
                median = statistics.median(us)
                if backend is HashBackend.PYTHON:
                    python_median, speedup = median, ""
                else:
                    speedup = f"{python_median / median:.1f}x"
                rows.append([num_tokens, name, backend.value, median, min(us), max(us), speedup])
                print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    num_rounds = args.rounds or (3 if args.quick else 15)
    rows = measure(num_rounds, args.seed)
    body = (
        f"Whole prompts of random token ids (Python ints) in blocks of {BLOCK_SIZE}; "
        "`block_hashes` is `compute_block_hashes` (seq and local hash per block, the engine's "
        "call), `seq_hashes` is `compute_seq_hashes` (the router's). "
        f"{num_rounds} rounds per row after a warm-up round; us per call.\n\n"
        + markdown_table(
            ["tokens", "call", "backend", "median us", "fastest us", "slowest us", "speedup"],
            rows,
        )
        + "\n"
    )
    out = Path(__file__).resolve().parent / (
        "out/benchmarks.md" if args.quick else "../docs/benchmarks.md"
    )
    write_section(
        out,
        Section("block_hashing", "Block hashing: native extension vs pure Python", body, "n/a"),
        get_machine_facts(),
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
