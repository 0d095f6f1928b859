"""The planner's Prometheus metrics, in its own registry (no process-wide globals), served
on its own /metrics port."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from armature.planner.core import PlannerEffects
from armature.planner.decisions import ScalingDecision
from armature.protocols.worker import WorkerRole

__all__ = ["PlannerMetrics"]


class PlannerMetrics:
    """Owns its registry and, once `serve` ran, the HTTP server thread."""

    def __init__(self, roles: tuple[WorkerRole, ...]) -> None:
        self.registry = r = CollectorRegistry()
        self.workers = Gauge(
            "armature_planner_workers", "Workers of each role in discovery", ["role"], registry=r
        )
        self.target_workers = Gauge(
            "armature_planner_target_workers",
            "Workers of each role the planner wants",
            ["role"],
            registry=r,
        )
        self.predicted_rate = Gauge(
            "armature_planner_predicted_requests_per_second",
            "The next interval's predicted request rate",
            registry=r,
        )
        self.predicted_input = Gauge(
            "armature_planner_predicted_input_tokens",
            "The next interval's predicted mean input length",
            registry=r,
        )
        self.predicted_output = Gauge(
            "armature_planner_predicted_output_tokens",
            "The next interval's predicted mean output length",
            registry=r,
        )
        self.ttft_s = Gauge(
            "armature_planner_estimated_ttft_seconds",
            "Live TTFT estimate of each role (the load rule's)",
            ["role"],
            registry=r,
        )
        self.itl_s = Gauge(
            "armature_planner_estimated_itl_seconds",
            "Live ITL estimate of each role (the load rule's)",
            ["role"],
            registry=r,
        )
        self.decisions = Counter(
            "armature_planner_decisions",
            "Scaling decisions, by role and reason",
            ["role", "reason"],
            registry=r,
        )
        self.connector_failures = Counter(
            "armature_planner_connector_failures",
            "Scaling actions that failed (retried)",
            registry=r,
        )
        self.scrape_failures = Counter(
            "armature_planner_scrape_failures",
            "Ticks skipped because the frontend's metrics could not be read",
            registry=r,
        )
        for role in roles:  # every series exists from the start
            self.workers.labels(role.value)
            self.target_workers.labels(role.value)
        self._server: object | None = None

    def observe(self, effects: PlannerEffects, num_workers: dict[WorkerRole, int]) -> None:
        """A tick's effects; `num_workers`: the workers in discovery now."""
        for role, num in effects.num_workers.items():
            self.target_workers.labels(role.value).set(num)
            self.workers.labels(role.value).set(num_workers.get(role, 0))
        if effects.forecast is not None:
            self.predicted_rate.set(effects.forecast.request_rate_per_s)
            self.predicted_input.set(effects.forecast.mean_input_tokens)
            self.predicted_output.set(effects.forecast.mean_output_tokens)
        for role, live in effects.live.items():
            if live.ttft_s is not None:
                self.ttft_s.labels(role.value).set(live.ttft_s)
            if live.itl_s is not None:
                self.itl_s.labels(role.value).set(live.itl_s)

    def count_decision(self, decision: ScalingDecision) -> None:
        self.decisions.labels(decision.role.value, decision.reason.value).inc()

    def serve(self, host: str, port: int) -> str:
        """Start the /metrics endpoint; returns its url."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        self._server = server
        return f"http://{host}:{server.server_address[1]}/metrics"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()  # type: ignore[attr-defined]
            self._server.server_close()  # type: ignore[attr-defined]
            self._server = None
