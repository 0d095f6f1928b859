"""The planner's Prometheus metrics, in its own registry (no process-wide globals), served
on its own /metrics port."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from armature.planner.core import PlannerEffects
from armature.planner.decisions import DecisionReason, LimitHold, ScalingDecision
from armature.protocols.worker import WorkerRole

__all__ = ["PlannerMetrics"]

_Metric = TypeVar("_Metric", Gauge, Counter)


def _metric(
    kind: type[_Metric], registry: CollectorRegistry, name: str, doc: str, *labels: str
) -> _Metric:
    """A `kind` (Gauge, Counter) named armature_planner_`name` in `registry`."""
    return kind(name, doc, labels, namespace="armature", subsystem="planner", registry=registry)


class PlannerMetrics:
    """Owns its registry and, once `serve` ran, the HTTP server thread."""

    def __init__(self, roles: tuple[WorkerRole, ...]) -> None:
        self.registry = r = CollectorRegistry()
        self.workers = _metric(Gauge, r, "workers", "Workers of each role in discovery", "role")
        self.target_workers = _metric(
            Gauge, r, "target_workers", "Workers of each role the planner wants", "role"
        )
        self.wanted_workers = _metric(
            Gauge,
            r,
            "wanted_workers",
            "Workers of each role the planner's rules ask for before its limits (above "
            "target_workers while a maximum holds the role: its targets may be missed)",
            "role",
        )
        self.predicted_rate = _metric(
            Gauge,
            r,
            "predicted_requests_per_second",
            "The next interval's predicted request rate",
        )
        self.predicted_input = _metric(
            Gauge, r, "predicted_input_tokens", "The next interval's predicted mean input length"
        )
        self.predicted_output = _metric(
            Gauge, r, "predicted_output_tokens", "The next interval's predicted mean output length"
        )
        self.ttft_s = _metric(
            Gauge,
            r,
            "estimated_ttft_seconds",
            "Live TTFT estimate of each role (the load rule's)",
            "role",
        )
        self.itl_s = _metric(
            Gauge,
            r,
            "estimated_itl_seconds",
            "Live ITL estimate of each role (the load rule's)",
            "role",
        )
        self.attainment = _metric(
            Gauge,
            r,
            "measured_attainment",
            "Requests within both targets over the load rule's window, as the frontend judged "
            "them (--slo-ttft-ms, --slo-itl-ms)",
        )
        self.trim_scale = _metric(
            Gauge,
            r,
            "trim_scale",
            "The share of the predicted load the pools are sized for (--planner-trim-step; "
            "1 while the SLO feedback is off or has found no room)",
        )
        self.decisions = _metric(
            Counter, r, "decisions", "Scaling decisions, by role and reason", "role", "reason"
        )
        self.connector_failures = _metric(
            Counter, r, "connector_failures", "Scaling actions that failed (retried)"
        )
        self.fit_failures = _metric(
            Counter,
            r,
            "forecast_fit_failures",
            "Forecaster fits that raised a numerical error (the last value was predicted)",
        )
        self._num_fit_failures = 0
        self.scrape_failures = _metric(
            Counter,
            r,
            "scrape_failures",
            "Ticks skipped because the frontend's metrics could not be read",
        )
        self.frontends = _metric(
            Gauge, r, "frontends", "Frontend replicas whose metrics the last tick read"
        )
        self.observed_requests = _metric(
            Counter,
            r,
            "observed_requests",
            "Requests the frontends received, as the planner's load windows counted them "
            "(summed over the frontend replicas)",
        )
        self._start_series(roles)
        self._server: object | None = None

    def _start_series(self, roles: tuple[WorkerRole, ...]) -> None:
        """Every series exists from the start; an estimate not made yet is NaN (not 0: no
        measurement is not a low latency)."""
        for gauge in (
            self.predicted_rate,
            self.predicted_input,
            self.predicted_output,
            self.attainment,
        ):
            gauge.set(math.nan)
        self.trim_scale.set(1.0)
        for role in roles:
            self.workers.labels(role.value)
            self.target_workers.labels(role.value)
            self.wanted_workers.labels(role.value)
            self.ttft_s.labels(role.value).set(math.nan)
            self.itl_s.labels(role.value).set(math.nan)
            for reason in DecisionReason:
                self.decisions.labels(role.value, reason.value)

    def set_workers(
        self,
        targets: dict[WorkerRole, int],
        current: dict[WorkerRole, int],
        held: Mapping[WorkerRole, LimitHold] | None = None,
    ) -> None:
        """Each role's target, what its rules asked for (the target, or more where `held`:
        the roles a maximum holds below a rule's want, `LimitWatch.get_held`) and its
        workers in discovery now."""
        held = held or {}
        for role, num in targets.items():
            self.target_workers.labels(role.value).set(num)
            hold = held.get(role)
            self.wanted_workers.labels(role.value).set(num if hold is None else hold.wanted_workers)
            self.workers.labels(role.value).set(current.get(role, 0))

    def observe(
        self,
        effects: PlannerEffects,
        num_workers: dict[WorkerRole, int],
        held: Mapping[WorkerRole, LimitHold] | None = None,
    ) -> None:
        """A tick's effects; `num_workers`: the workers in discovery now; `held`: as
        `set_workers`."""
        self.set_workers(effects.num_workers, num_workers, held)
        if effects.forecast is not None:
            self.predicted_rate.set(effects.forecast.request_rate_per_s)
            self.predicted_input.set(effects.forecast.mean_input_tokens)
            self.predicted_output.set(effects.forecast.mean_output_tokens)
        if effects.attainment is not None:
            self.attainment.set(effects.attainment)
        self.trim_scale.set(effects.trim_scale)
        if effects.num_fit_failures > self._num_fit_failures:
            self.fit_failures.inc(effects.num_fit_failures - self._num_fit_failures)
            self._num_fit_failures = effects.num_fit_failures
        for role, live in effects.live.items():
            self.ttft_s.labels(role.value).set(math.nan if live.ttft_s is None else live.ttft_s)
            self.itl_s.labels(role.value).set(math.nan if live.itl_s is None else live.itl_s)

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
