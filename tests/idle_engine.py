"""Engines for router tests: one that holds no request (what a router test puts beside the
workers it watches), and one that takes a request and never answers it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from armature.protocols.engine import EngineLoad, EngineOutput, EngineRequest


def idle_load(num_total_blocks: int = 64) -> EngineLoad:
    """The load report of a worker with nothing queued or running."""
    return EngineLoad(
        num_active_blocks=0,
        num_total_blocks=num_total_blocks,
        num_waiting=0,
        num_running=0,
        num_prefill_tokens_queued=0,
    )


class IdleEngine:
    """Never asked for anything but its load; counts its starts."""

    is_alive = True

    def __init__(self) -> None:
        self.num_starts = 0

    def start(self) -> None:
        self.num_starts += 1

    async def stop(self) -> None: ...

    def get_load(self) -> EngineLoad:
        return idle_load()


class HeldEngine:
    """`engine`, but asked for a request it never answers (as a worker still prefilling, or
    a decode worker still pulling its KV): `asked` is set once it has the request."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.asked = asyncio.Event()

    def __getattr__(self, name: str) -> object:
        return getattr(self.engine, name)

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        self.asked.set()
        await asyncio.Event().wait()
        yield  # type: ignore[misc]  # never reached
