"""A worker's own Prometheus endpoint (its registry, a small HTTP server thread): its load as
the engine sees it, and the requests and tokens it served."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from armature.protocols.engine import EngineLoad, EngineStats
from armature.runtime.load_metrics import WorkerLoadCollector

__all__ = ["WorkerMetrics"]


class _TransferCollector(Collector):
    def __init__(self, get_stats: Callable[[], EngineStats]):
        self.get_stats = get_stats

    def collect(self) -> Iterator[Metric]:
        stats = self.get_stats()
        pulls = CounterMetricFamily(
            "armature_worker_kv_pulls",
            "KV transfers pulled from prefill workers, by backend",
            labels=["backend"],
        )
        for backend, value in stats.num_kv_pulls_by_backend.items():
            pulls.add_metric([backend], value)
        yield pulls
        yield CounterMetricFamily(
            "armature_worker_kv_pull_failures",
            "KV transfers that failed (the prompt was computed here)",
            value=stats.num_kv_pull_failures,
        )
        yield CounterMetricFamily(
            "armature_worker_kv_blocks_pulled",
            "KV blocks pulled from prefill workers",
            value=stats.num_kv_blocks_pulled,
        )
        yield GaugeMetricFamily(
            "armature_worker_kv_pinned_blocks",
            "KV blocks pinned for decode workers to pull",
            value=stats.num_kv_pinned_blocks,
        )
        yield CounterMetricFamily(
            "armature_worker_kv_expired_pins",
            "Pinned prompts freed because no decode worker released them in time",
            value=stats.num_kv_expired_pins,
        )


class WorkerMetrics:
    def __init__(
        self,
        worker_id: str,
        get_load: Callable[[], EngineLoad],
        get_stats: Callable[[], EngineStats],
    ):
        self.registry = CollectorRegistry()
        self.registry.register(WorkerLoadCollector(lambda: {worker_id: get_load()}))
        self.registry.register(_TransferCollector(get_stats))
        self.requests = Counter(
            "armature_worker_requests",
            "Requests the worker finished, by how they ended",
            ["reason"],
            registry=self.registry,
        )
        self.prompt_tokens = Counter(
            "armature_worker_prompt_tokens", "Prompt tokens received", registry=self.registry
        )
        self.output_tokens = Counter(
            "armature_worker_generation_tokens", "Tokens generated", registry=self.registry
        )
        self._server: object | None = None
        self.url = ""

    def serve(self, host: str, port: int) -> str:
        """Start the /metrics endpoint; returns its url."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        self._server = server
        bound_port = server.server_address[1]
        self.url = f"http://{host}:{bound_port}/metrics"
        return self.url

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()  # type: ignore[attr-defined]
            self._server.server_close()  # type: ignore[attr-defined]
            self._server = None
