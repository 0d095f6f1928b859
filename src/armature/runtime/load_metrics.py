"""Prometheus gauges of engine load, one series per worker, read when scraped: used by the
frontend (every worker it routes to, from their load reports) and by each worker (itself)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from armature.protocols.engine import EngineLoad

__all__ = ["WORKER_LOAD_METRICS", "WorkerLoadCollector"]

# name -> (help, value of an EngineLoad)
WORKER_LOAD_METRICS: dict[str, tuple[str, Callable[[EngineLoad], float]]] = {
    "armature_worker_kv_usage_ratio": (
        "Fraction of the worker's KV blocks in use",
        lambda x: x.num_active_blocks / x.num_total_blocks if x.num_total_blocks else 0.0,
    ),
    "armature_worker_kv_capacity_blocks": ("KV blocks of the worker", lambda x: x.num_total_blocks),
    "armature_worker_requests_running": ("Requests running", lambda x: x.num_running),
    "armature_worker_requests_waiting": ("Requests waiting to start", lambda x: x.num_waiting),
    "armature_worker_prefill_tokens_queued": (
        "Prompt tokens still to prefill",
        lambda x: x.num_prefill_tokens_queued,
    ),
}


class WorkerLoadCollector(Collector):
    def __init__(self, loads: Callable[[], Mapping[str, EngineLoad]]):
        self.loads = loads

    def collect(self) -> Iterator[GaugeMetricFamily]:
        loads = self.loads()
        for name, (help_text, value) in WORKER_LOAD_METRICS.items():
            family = GaugeMetricFamily(name, help_text, labels=["worker"])
            for worker, load in sorted(loads.items()):
                family.add_metric([worker], float(value(load)))
            yield family
