"""An EngineLoad for a vLLM engine. Pure: vLLM's scheduler stats come in as plain numbers.

vLLM reports, once per engine step, its running and waiting requests and the fraction of KV
blocks in use. It does not report prompt tokens waiting for prefill, so the tracker counts
them itself: a request's prompt tokens are queued from submission until its first output
(which marks its prefill done) or its end, on every path (finish, abort, error).

vLLM sends stats only with a step's outputs, so after the last request is aborted no step
reports the engine idle: its last stats would show it busy forever. The tracker therefore
bounds vLLM's counts by the requests it knows are in flight (none in flight: idle).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from armature.protocols.engine import EngineLoad

__all__ = ["LoadTracker", "SchedulerSnapshot"]


@dataclass(frozen=True)
class SchedulerSnapshot:
    """The part of vLLM's SchedulerStats an EngineLoad needs."""

    num_running: int
    num_waiting: int  # including requests vLLM deferred
    kv_cache_usage: float  # fraction of KV blocks in use, 0..1


@dataclass
class LoadTracker:
    """The latest load of one vLLM engine. Mutated from the event loop only."""

    num_total_blocks: int
    _snapshot: SchedulerSnapshot = field(default_factory=lambda: SchedulerSnapshot(0, 0, 0.0))
    _num_steps: int = 0
    _queued_prefill_tokens: dict[str, int] = field(default_factory=dict)
    _in_flight: set[str] = field(default_factory=set)
    _load: EngineLoad | None = None

    def record_step(self, snapshot: SchedulerSnapshot) -> None:
        """vLLM ran one step and reported its scheduler's state."""
        self._snapshot = snapshot
        self._num_steps += 1
        self._load = None

    def add_request(self, request_id: str, num_prompt_tokens: int) -> None:
        self._queued_prefill_tokens[request_id] = num_prompt_tokens
        self._in_flight.add(request_id)
        self._load = None

    def finish_request(self, request_id: str) -> None:
        """The request ended (any way: finished, aborted, failed); idempotent."""
        self.prefill_done(request_id)
        if request_id in self._in_flight:
            self._in_flight.discard(request_id)
            self._load = None

    def prefill_done(self, request_id: str) -> None:
        """The request's first output arrived, or it ended (any way); idempotent."""
        if self._queued_prefill_tokens.pop(request_id, None) is not None:
            self._load = None

    def get_snapshot(self) -> SchedulerSnapshot:
        """vLLM's own counts as of its last step, unbounded (for tests and debugging)."""
        return self._snapshot

    def get_load(self) -> EngineLoad:
        if self._load is None:
            snap = self._snapshot
            num_in_flight = len(self._in_flight)
            usage = min(1.0, max(0.0, snap.kv_cache_usage)) if num_in_flight else 0.0
            num_running = min(snap.num_running, num_in_flight)
            self._load = EngineLoad(
                num_active_blocks=round(usage * self.num_total_blocks),
                num_total_blocks=self.num_total_blocks,
                num_waiting=min(snap.num_waiting, num_in_flight - num_running),
                num_running=num_running,
                num_prefill_tokens_queued=sum(self._queued_prefill_tokens.values()),
                num_steps=self._num_steps,
            )
        return self._load
