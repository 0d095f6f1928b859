"""Load shapes: closed loop (a fixed number of users, each sending as soon as its last request
ended), open loop (Poisson arrivals at a rate), and a trace schedule (each request at its own
offset). A request with follow-up turns is a session: its turns go one after another. Every
run is bounded by its request list and, optionally, a duration; warm-up requests go first,
one at a time, and are left out of the results."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from armature.bench.client import BenchRequest, RequestRecord

__all__ = ["LoadShape", "expand_session", "poisson_offsets", "run_load"]

Send = Callable[[BenchRequest], Awaitable[RequestRecord]]


@dataclass(frozen=True)
class LoadShape:
    kind: Literal["closed", "poisson", "trace"]
    concurrency: int = 1
    rate_rps: float = 0.0
    max_in_flight: int = 4096  # open loop: a safety bound on outstanding requests


async def expand_session(
    request: BenchRequest, send: Send, done: Callable[[RequestRecord], None]
) -> None:
    """Send a request and then its follow-up turns one after another, each resending the
    conversation so far (user turns and the server's actual answers)."""
    history: tuple[tuple[str, str], ...] = request.history
    turn = request
    for followup in (None, *request.followups):
        if followup is not None:
            turn = BenchRequest(followup, request.max_tokens, history=history)
        record = await send(turn)
        done(record)
        if record.error is not None:
            return  # the rest of the conversation depends on this answer
        history = (*history, (turn.prompt, record.text))


def poisson_offsets(count: int, rate_rps: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    offsets, now = [], 0.0
    for _ in range(count):
        offsets.append(now)
        now += rng.expovariate(rate_rps)
    return offsets


async def run_load(
    requests: Sequence[BenchRequest],
    shape: LoadShape,
    send: Send,
    *,
    num_warmup: int = 0,
    duration_s: float | None = None,
    on_record: Callable[[RequestRecord], None] | None = None,
    on_start: Callable[[], None] | None = None,
    seed: int = 0,
) -> tuple[list[RequestRecord], float]:
    """(records of the measured requests, measured wall time in seconds). `on_start` is
    called when the warm-up is over and the measured requests begin."""
    warmup, measured = list(requests[:num_warmup]), list(requests[num_warmup:])
    for request in warmup:  # one at a time: warms caches and connections, measures nothing
        await expand_session(request, send, lambda record: None)
    records: list[RequestRecord] = []

    def done(record: RequestRecord) -> None:
        records.append(record)
        if on_record is not None:
            on_record(record)

    if on_start is not None:
        on_start()
    started = time.perf_counter()
    deadline = started + duration_s if duration_s else None
    if shape.kind == "closed":
        queue = iter(measured)

        async def user() -> None:
            for request in queue:
                if deadline is not None and time.perf_counter() >= deadline:
                    return
                await expand_session(request, send, done)

        await asyncio.gather(*(user() for _ in range(max(1, shape.concurrency))))
    else:
        if shape.kind == "poisson":
            offsets = poisson_offsets(len(measured), shape.rate_rps, seed)
        else:
            base = measured[0].arrival_s if measured else 0.0
            offsets = [r.arrival_s - base for r in measured]
        limit = asyncio.Semaphore(shape.max_in_flight)
        tasks = []

        async def fire(request: BenchRequest) -> None:
            async with limit:
                await expand_session(request, send, done)

        for request, offset in zip(measured, offsets, strict=True):
            at = started + offset
            if deadline is not None and at >= deadline:
                break
            delay = at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(fire(request)))
        await asyncio.gather(*tasks)
    return records, time.perf_counter() - started
