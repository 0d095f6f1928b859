"""Engines for frontend tests at the Engine seam: everything but `generate`, idle."""

from __future__ import annotations

from armature.protocols.engine import EngineLoad, EngineRequest


class IdleEngine:
    """An engine with no load and no KV events; subclasses say what `generate` does."""

    is_alive = True

    def start(self) -> None: ...

    async def stop(self) -> None: ...

    def validate(self, request: EngineRequest) -> None: ...

    def get_load(self) -> EngineLoad:
        return EngineLoad(
            num_active_blocks=0,
            num_total_blocks=1,
            num_waiting=0,
            num_running=0,
            num_prefill_tokens_queued=0,
        )

    def take_kv_events(self) -> list:  # type: ignore[type-arg]
        return []
