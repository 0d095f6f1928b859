"""Overload, reported: a frontend and 2 mocker workers (a slow simulated GPU, so the workers
and not this CPU are the bottleneck). Steps:

1. unloaded: one request at a time -> TTFT p99 (the reference);
2. capacity: a closed loop at concurrency 32 -> completed requests/s (the sustainable rate);
3. 3x that rate, open loop (Poisson) for --duration-s, twice: with overload control on
   (--busy-prefill-tokens, --busy-kv-usage, a short queue) and with it off.

Targets: with control on, the accepted requests keep TTFT p99 within 2x of unloaded and the
rest get a 503 fast (p99 < 50 ms).

    python -m bench.overload [--duration-s 30] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from armature.workload.measure import quantile
from bench.chaos import Fleet
from bench.paths import results_path
from bench.report import Section, get_machine_facts, markdown_table, write_section

SPEEDUP = "0.25"  # the mocker's step times x4: a few requests/s per worker
MOCKER = ["--engine", "mocker", "--speedup-ratio", SPEEDUP, "--num-kv-blocks", "2048"]
PROMPT_WORDS, MAX_TOKENS = 170, 48  # about 500 prompt tokens
WORDS = ["apple", "river", "stone", "cloud", "green", "quick", "table", "light", "music", "paper"]
CONTROL = [
    *("--busy-prefill-tokens", "256"),
    *("--busy-kv-usage", "0.1"),
    *("--max-queued-requests", "0"),
]


@dataclass(frozen=True)
class Outcome:
    status: int
    ttft_s: float | None  # 200 only
    latency_s: float  # until the last byte (or the error answer)


async def send(client: httpx.AsyncClient, url: str, model: str, rng: random.Random) -> Outcome:
    words = " ".join(f"{rng.choice(WORDS)}{rng.randrange(100)}" for _ in range(PROMPT_WORDS))
    body = {"model": model, "prompt": words, "max_tokens": MAX_TOKENS, "stream": True}
    started = time.perf_counter()
    first = None
    async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        if response.status_code != 200:
            await response.aread()
            return Outcome(response.status_code, None, time.perf_counter() - started)
        async for line in response.aiter_lines():
            if first is None and line.startswith("data: "):
                first = time.perf_counter() - started
    return Outcome(200, first, time.perf_counter() - started)


async def sequential(url: str, model: str, count: int) -> list[Outcome]:
    rng = random.Random(1)
    async with httpx.AsyncClient(timeout=120) as client:
        return [await send(client, url, model, rng) for _ in range(count)]


async def closed_loop(url: str, model: str, concurrency: int, duration_s: float) -> float:
    """Completed requests per second with `concurrency` clients always busy."""
    rng, done = random.Random(2), 0
    deadline = time.monotonic() + duration_s

    async def client_loop(client: httpx.AsyncClient) -> None:
        nonlocal done
        while time.monotonic() < deadline:
            if (await send(client, url, model, rng)).status == 200:
                done += 1

    started = time.monotonic()
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        await asyncio.gather(*(client_loop(client) for _ in range(concurrency)))
    return done / (time.monotonic() - started)


async def open_loop(url: str, model: str, rate: float, duration_s: float) -> list[Outcome]:
    rng = random.Random(3)
    tasks = []
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        deadline = time.monotonic() + duration_s
        while time.monotonic() < deadline:
            tasks.append(asyncio.create_task(send(client, url, model, rng)))
            await asyncio.sleep(rng.expovariate(rate))
        return list(await asyncio.gather(*tasks))


def start(root: Path, control: bool) -> tuple[Fleet, str, str]:
    root.mkdir()
    fleet = Fleet(root)
    for i in range(2):
        fleet.worker(f"w{i}", MOCKER)
    url = fleet.frontend(CONTROL if control else [], num_workers=2)
    model = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
    return fleet, url, model


def summarize(name: str, rate: float, outcomes: list[Outcome]) -> list[object]:
    accepted = [o for o in outcomes if o.status == 200]
    refused = [o for o in outcomes if o.status == 503]
    other = len(outcomes) - len(accepted) - len(refused)
    ttfts = [o.ttft_s for o in accepted if o.ttft_s is not None]
    return [
        name,
        f"{rate:.1f}",
        len(outcomes),
        len(accepted),
        len(refused),
        other,
        f"{quantile(ttfts, 0.5) * 1000:.0f}" if ttfts else "-",
        f"{quantile(ttfts, 0.99) * 1000:.0f}" if ttfts else "-",
        f"{quantile([o.latency_s for o in refused], 0.99) * 1000:.1f}" if refused else "-",
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--duration-s", type=float, default=30.0)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    duration_s = 8.0 if args.quick else args.duration_s
    rows: list[list[object]] = []
    with tempfile.TemporaryDirectory() as tmp:
        fleet, url, model = start(Path(tmp) / "off", control=False)
        try:
            asyncio.run(sequential(url, model, 5))  # warm-up
            unloaded = asyncio.run(sequential(url, model, 20 if args.quick else 60))
            capacity_rps = asyncio.run(closed_loop(url, model, 32, duration_s))
            rows.append(summarize("unloaded (one at a time)", 0.0, unloaded))
            flood = asyncio.run(open_loop(url, model, 3 * capacity_rps, duration_s))
            rows.append(summarize("off, 3x", 3 * capacity_rps, flood))
        finally:
            fleet.stop()
        fleet, url, model = start(Path(tmp) / "on", control=True)
        try:
            asyncio.run(sequential(url, model, 5))
            overload = asyncio.run(open_loop(url, model, 3 * capacity_rps, duration_s))
            rows.insert(1, summarize("on, 3x", 3 * capacity_rps, overload))
        finally:
            fleet.stop()
    unloaded_p99 = quantile([o.ttft_s for o in unloaded if o.ttft_s is not None], 0.99)
    accepted = [o.ttft_s for o in overload if o.status == 200 and o.ttft_s is not None]
    refused = [o.latency_s for o in overload if o.status == 503]
    ttft_ratio = quantile(accepted, 0.99) / unloaded_p99 if accepted else float("nan")
    refuse_p99_ms = quantile(refused, 0.99) * 1000 if refused else float("nan")
    for row in rows:
        print(row, flush=True)
    body = (
        f"A frontend (kv router) and 2 mocker worker processes (speedup {SPEEDUP}: step times "
        f"x4, so the workers saturate before this CPU does); prompts of {PROMPT_WORDS} random "
        f"words (~500 tokens), {MAX_TOKENS} output tokens, streamed. Sustainable "
        f"rate: {capacity_rps:.2f} completed requests/s from a closed loop at concurrency 32. "
        f"Overload control on: `{' '.join(CONTROL)}`. Each open-loop run lasts "
        f"{duration_s:.0f} s.\n\n"
        + markdown_table(
            [
                "run",
                "rate rps",
                "sent",
                "200",
                "503",
                "other",
                "TTFT p50 ms",
                "TTFT p99 ms",
                "503 p99 ms",
            ],
            rows,
        )
        + f"\n\nAccepted TTFT p99 at 3x with control on: {ttft_ratio:.2f}x the unloaded p99 "
        f"(target <= 2x: {'pass' if ttft_ratio <= 2 else 'MISS'}); 503 p99 "
        f"{refuse_p99_ms:.1f} ms (target < 50 ms: {'pass' if refuse_p99_ms < 50 else 'MISS'}).\n"
    )
    out = results_path(args.quick)
    write_section(
        out,
        Section("overload", "Overload at 3x the sustainable rate", body, "n/a"),
        get_machine_facts(),
    )
    print(body)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
