"""An engine that holds no request: what a router test puts beside the workers it watches."""

from __future__ import annotations

from armature.protocols.engine import EngineLoad


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
