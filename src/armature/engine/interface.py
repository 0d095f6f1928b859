"""The Engine contract (DESIGN §3) that the native engine, the mocker and adapters implement."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from armature.protocols.engine import EngineLoad, EngineOutput, EngineRequest
from armature.protocols.kv_events import KvDump, KvEvent

__all__ = ["Engine", "EngineDeadError", "InvalidRequestError"]


class InvalidRequestError(ValueError):
    """The request cannot be served by this engine (too long, bad token ids...)."""


class EngineDeadError(RuntimeError):
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

    def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        """Stream outputs until one has a finish_reason; closing the iterator early cancels."""
        ...

    def get_load(self) -> EngineLoad: ...

    def take_kv_events(self) -> list[KvEvent]:
        """Drain KV events (Stored/Removed/Cleared), oldest first."""
        ...

    async def dump_kv_blocks(self) -> KvDump:
        """Every cached block as of the newest event (a consumer that saw a gap asks)."""
        ...
