"""The part of the Engine contract an embedding worker answers the same way whatever its
engine: it generates nothing, holds no KV cache to report, transfer or pin, and serves no
LoRA adapter."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import ClassVar

from armature.engines.api import InvalidRequestError, poll_for_update
from armature.protocols.engine import EngineOutput, EngineRequest, EngineStats
from armature.protocols.kv_events import KvDump, KvEvent
from armature.protocols.kv_transfer import KvHandle
from armature.protocols.lora import LoraAdapter, LoraNotFoundError, lora_unsupported

__all__ = ["EmbeddingOnly"]


class EmbeddingOnly:
    """Mixed into an embedding engine, which names itself in refusals: `not_generating` to
    a generation request, `what` to a LoRA load."""

    not_generating: ClassVar[str]
    what: ClassVar[str]

    def validate(self, request: EngineRequest) -> None:
        raise InvalidRequestError(self.not_generating)

    async def generate(self, request: EngineRequest) -> AsyncGenerator[EngineOutput, None]:
        raise InvalidRequestError(self.not_generating)
        yield  # pragma: no cover (this makes it an async generator, as the contract says)

    def stats(self) -> EngineStats:
        return EngineStats()

    def take_kv_events(self) -> list[KvEvent]:
        return []

    async def wait_for_update(self, timeout_s: float) -> bool:
        return await poll_for_update(timeout_s)

    async def dump_kv_blocks(self) -> KvDump:
        return KvDump(seq_hashes=[], last_event_id=-1)  # no event, ever

    async def release_kv(self, handle: KvHandle) -> None:
        return None  # it pins no blocks

    def get_lora_adapters(self) -> list[LoraAdapter]:
        return []

    async def load_lora(self, name: str, path: str) -> LoraAdapter:
        raise lora_unsupported(f"{self.what} (--task embed)")

    async def unload_lora(self, name: str) -> None:
        raise LoraNotFoundError(f"an embedding worker serves no LoRA adapter {name!r}")
