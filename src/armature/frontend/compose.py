"""The frontend's parts, composed once: every collaborator goes in through a constructor.

registry ─▶ RouterMetrics (observer) ─┐
OverloadThresholds ───────────────────┼─▶ DisaggRouter ─▶ FrontendMetrics (its loads)
                                      │        └───────▶ AdmissionGate (its pressures)
                                      └──────▶ JobBuilder, OpenAIService ─▶ build_app
EmbedRouter (workers of task embed) ─────────────────────▶ EmbeddingService ─┘
                                                 ResponsesService ◀─┘ (/v1/responses)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Gauge

from armature.config import (
    DisaggConfig,
    OverloadConfig,
    ResponsesConfig,
    RouterConfig,
    SloConfig,
)
from armature.engines.api import EmbeddingEngine, Engine
from armature.frontend.admission import AdmissionGate
from armature.frontend.embeddings import EmbeddingService
from armature.frontend.jobs import JobBuilder, ServedModel
from armature.frontend.metrics import FrontendMetrics, InFlightCollector, RouterMetrics
from armature.frontend.parsing import OutputParsers
from armature.frontend.preprocess import Preprocessor
from armature.frontend.responses_service import ResponsesService
from armature.frontend.service import OpenAIService
from armature.router.disagg import DisaggRouter
from armature.router.embedding import EmbedRouter
from armature.router.pressure import OverloadThresholds

__all__ = ["FrontendParts", "compose_frontend", "serves_generation"]


@dataclass(frozen=True)
class FrontendParts:
    router: DisaggRouter
    thresholds: OverloadThresholds
    gate: AdmissionGate
    metrics: FrontendMetrics
    jobs: JobBuilder
    service: OpenAIService
    model: ServedModel
    embedder: EmbedRouter
    embeddings: EmbeddingService
    responses: ResponsesService


def serves_generation(router: DisaggRouter) -> bool:
    """Whether any worker of task generate is routed to (alive or not)."""
    return bool(router.engines or router.prefill.engines)


def compose_frontend(
    *,
    engines: Mapping[str, Engine],
    router_config: RouterConfig,
    preprocessor: Preprocessor,
    model: ServedModel,
    disagg: DisaggConfig | None = None,
    overload: OverloadConfig | None = None,
    prefill_engines: Mapping[str, Engine] | None = None,
    parsers: OutputParsers | None = None,
    embed_engines: Mapping[str, EmbeddingEngine] | None = None,
    responses: ResponsesConfig | None = None,
    slo: SloConfig | None = None,
) -> FrontendParts:
    """A router over `engines` (more join later through `router.add_engine`), its metrics,
    the overload gate and the OpenAI service, wired to each other; an embedding router over
    `embed_engines` (workers of task embed; more join through `embedder.add_engine`)."""
    registry = CollectorRegistry()
    thresholds = OverloadThresholds(overload or OverloadConfig())
    router = DisaggRouter(
        engines,
        router_config,
        disagg,
        observer=RouterMetrics(registry),
        prefill_engines=prefill_engines,
        busy=thresholds,
    )
    metrics = FrontendMetrics(
        model.name, router.get_load, router.get_worker_loads, registry, slo=slo
    )
    registry.register(InFlightCollector(router.get_own_loads, router.get_peer_loads))
    gate = AdmissionGate(thresholds, lambda: router.get_pressures().values())
    Gauge(
        "armature_requests_queued",
        "Requests waiting for a free worker (overload control)",
        registry=registry,
    ).set_function(lambda: gate.num_queued)
    Gauge(
        "armature_router_index_blocks",
        "(worker, block) entries in the router's prefix index",
        registry=registry,
    ).set_function(lambda: router.get_index_blocks()[0])
    Gauge(
        "armature_router_index_capacity_blocks",
        "The prefix index's bound: the routed workers' KV capacity in blocks",
        registry=registry,
    ).set_function(lambda: router.get_index_blocks()[1])
    jobs = JobBuilder(router, preprocessor, model, parsers)
    service = OpenAIService(router, preprocessor, metrics)
    embedder = EmbedRouter(embed_engines)
    embeddings = EmbeddingService(
        embedder,
        preprocessor,
        model,
        has_generate=lambda: serves_generation(router),
    )
    responses_service = ResponsesService(jobs, service, responses or ResponsesConfig())
    return FrontendParts(
        router,
        thresholds,
        gate,
        metrics,
        jobs,
        service,
        model,
        embedder,
        embeddings,
        responses_service,
    )
