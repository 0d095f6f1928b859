"""A worker's own Prometheus endpoint (its registry, a small HTTP server thread): its load as
the engine sees it, and the requests and tokens it served."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, start_http_server

from armature.protocols.engine import EngineLoad
from armature.runtime.load_metrics import WorkerLoadCollector

__all__ = ["WorkerMetrics"]


class WorkerMetrics:
    def __init__(self, worker_id: str, get_load: Callable[[], EngineLoad]):
        self.registry = CollectorRegistry()
        self.registry.register(WorkerLoadCollector(lambda: {worker_id: get_load()}))
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
