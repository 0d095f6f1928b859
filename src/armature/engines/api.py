"""The Engine contract (DESIGN §3) that the native engine, the mocker and adapters implement.

One engine serves one worker. Frontends and routers see engines only through this contract
(and `KvHandle` from protocols/): a local engine and a remote worker look the same.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Protocol

from armature.errors import ArmatureError, InvalidRequestError
from armature.protocols.embedding import EmbeddingShape, EmbedRequest, EmbedResult
from armature.protocols.engine import (
    EngineLoad,
    EngineOutput,
    EngineRequest,
    EngineStats,
    StepRecord,
)
from armature.protocols.kv_events import KvDump, KvEvent
from armature.protocols.kv_transfer import KvHandle
from armature.protocols.lora import LoraAdapter

__all__ = [
    "UPDATE_POLL_S",
    "EmbeddingEngine",
    "Engine",
    "EngineDeadError",
    "InvalidRequestError",
    "poll_for_update",
    "wait_and_clear",
    "wait_for_event",
]

# how often an engine that cannot tell when it has news is looked at (`poll_for_update`)
UPDATE_POLL_S = 0.01


class EngineDeadError(ArmatureError, RuntimeError):
    """The engine has stopped; no request can be served."""


class Engine(Protocol):
    def start(self) -> None:
        """Begin serving; called from inside the running event loop."""
        ...

    async def stop(self) -> None: ...

    @property
    def is_alive(self) -> bool:
        """False once the engine has stopped or died."""
        ...

    def validate(self, request: EngineRequest) -> None:
        """Raise InvalidRequestError if `request` can never be served (no side effects)."""
        ...

    def generate(self, request: EngineRequest) -> AsyncGenerator[EngineOutput, None]:
        """Stream outputs until one has a finish_reason; closing the generator early cancels."""
        ...

    def get_load(self) -> EngineLoad: ...

    def stats(self) -> EngineStats:
        """Counters for metrics (KV transfers so far); cheap, callable from any thread."""
        ...

    def take_kv_events(self) -> list[KvEvent]:
        """Drain KV events (Stored/Removed/Cleared), oldest first."""
        ...

    def take_step_records(self) -> list[StepRecord]:
        """Drain the records of the steps run since the last call, oldest first (bounded: with
        no consumer the oldest are dropped); cheap, called from the event loop."""
        ...

    async def wait_for_update(self, timeout_s: float) -> bool:
        """Return True once the engine may have new KV events, step records or load, False
        after `timeout_s` without. One waiter per engine (a worker's publisher, or a router's
        KV-event sync): an engine that says when it has news lets an idle worker sleep and a
        busy one wake once a step."""
        ...

    async def dump_kv_blocks(self) -> KvDump:
        """Every cached block as of the newest event (a consumer that saw a gap asks)."""
        ...

    async def release_kv(self, handle: KvHandle) -> None:
        """Free the blocks this (prefill) engine pinned under `handle` now, because no decode
        leg will pull them (its caller left). Idempotent; the pin's TTL frees them anyway."""
        ...

    def get_lora_adapters(self) -> list[LoraAdapter]:
        """The LoRA adapters requests may name (`EngineRequest.lora_name`), by name."""
        ...

    async def load_lora(self, name: str, path: str) -> LoraAdapter:
        """Serve the adapter in directory `path` (PEFT layout) as `name`. InvalidRequestError
        naming the problem if it cannot be (a bad directory, a name taken, an engine that
        serves no adapters)."""
        ...

    async def unload_lora(self, name: str) -> None:
        """Stop serving adapter `name` (requests running with it finish).
        LoraNotFoundError (an InvalidRequestError) if it is not served."""
        ...


class EmbeddingEngine(Engine, Protocol):
    """An engine of a worker started with `--task embed`: it embeds prompts, and refuses
    `generate` (InvalidRequestError). It holds no KV cache, so it has no KV events."""

    @property
    def embedding_shape(self) -> EmbeddingShape:
        """The vectors `embed` returns."""
        ...

    def validate_embed(self, request: EmbedRequest) -> None:
        """Raise InvalidRequestError if `request` can never be served (no side effects)."""
        ...

    async def embed(self, request: EmbedRequest) -> EmbedResult:
        """One vector per prompt; cancelling the call drops what is not computed yet."""
        ...


async def poll_for_update(timeout_s: float) -> bool:
    """`Engine.wait_for_update` of an engine that cannot tell when it has news: maybe, after
    `UPDATE_POLL_S` (or `timeout_s` if sooner)."""
    await asyncio.sleep(max(0.0, min(timeout_s, UPDATE_POLL_S)))
    return True


async def wait_for_event(event: asyncio.Event, timeout_s: float) -> bool:
    """True once `event` is set (at once if it is), False after `timeout_s`. Not
    `asyncio.wait_for`: on 3.11 it can swallow a cancel that comes as the event is set, and
    whoever cancels the waiter would wait for it forever."""
    if event.is_set():
        return True
    try:
        async with asyncio.timeout(max(0.0, timeout_s)):
            await event.wait()
    except TimeoutError:
        return False
    return True


async def wait_and_clear(news: asyncio.Event, timeout_s: float) -> bool:
    """`Engine.wait_for_update` on an event its engine sets when it has news: True (and the
    event cleared, for the next wait) once it is set, False after `timeout_s`."""
    if not await wait_for_event(news, timeout_s):
        return False
    news.clear()
    return True
