"""Overload control's view of a worker (pure): how full it is, and whether that is past the
busy thresholds. The router prefers workers that are not busy; the frontend's admission gate
queues requests while every worker is.

    OverloadThresholds(config) -- is_busy(WorkerPressure.of(load, routed prefill tokens))
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from armature.config import OverloadConfig
from armature.protocols.engine import EngineLoad

__all__ = ["BusyWorkers", "OverloadThresholds", "WorkerPressure", "is_busy"]


@dataclass(frozen=True)
class WorkerPressure:
    kv_usage: float  # active / total KV blocks, 0..1
    prefill_tokens: int  # prompt tokens waiting to be prefilled

    @classmethod
    def of(cls, load: EngineLoad, routed_prefill_tokens: int) -> WorkerPressure:
        """From a worker's last report and the prompt tokens the router has in flight on it
        (fresher than the report): the larger of the two counts."""
        return cls(
            kv_usage=load.num_active_blocks / max(1, load.num_total_blocks),
            prefill_tokens=max(load.num_prefill_tokens_queued, routed_prefill_tokens),
        )


def is_busy(config: OverloadConfig, worker: WorkerPressure) -> bool:
    """Whether `worker` is past one of the thresholds `config` sets."""
    if config.busy_kv_usage is not None and worker.kv_usage >= config.busy_kv_usage:
        return True
    limit = config.busy_prefill_tokens
    return limit is not None and worker.prefill_tokens >= limit


class OverloadThresholds:
    """The live busy thresholds, shared by the router and the admission gate; `config` is
    replaced at runtime (POST /admin/overload)."""

    def __init__(self, config: OverloadConfig):
        self.config = config

    def is_busy(self, worker: WorkerPressure) -> bool:
        return is_busy(self.config, worker)

    def get_busy_workers(self, pressures: Mapping[str, WorkerPressure]) -> set[str]:
        if not self.config.enabled:
            return set()
        return {w for w, p in pressures.items() if is_busy(self.config, p)}


class BusyWorkers(Protocol):
    """Which workers are too busy to route to while others have room (the router's seam)."""

    def get_busy_workers(self, pressures: Mapping[str, WorkerPressure]) -> set[str]: ...
