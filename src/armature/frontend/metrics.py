"""Prometheus metrics of one frontend, in its own registry (no process-wide globals)."""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from armature.config.edge import SloConfig
from armature.protocols.engine import EngineLoad
from armature.router.load import WorkerLoad
from armature.router.service import RouterObserver
from armature.runtime.latency_buckets import LATENCY_BUCKETS_S
from armature.runtime.load_metrics import WorkerLoadCollector
from armature.workload.measure import meets_targets

__all__ = ["CountedHistogram", "FrontendMetrics", "InFlightCollector", "RouterMetrics"]

# a finished request's output tokens: powers of two to 32,768
OUTPUT_TOKEN_BUCKETS = tuple(float(2**i) for i in range(16))


class FrontendMetrics:
    def __init__(
        self,
        model_name: str,
        get_load: Callable[[], EngineLoad],
        worker_loads: Callable[[], Mapping[str, EngineLoad]] = dict,
        registry: CollectorRegistry | None = None,
        slo: SloConfig | None = None,
        clock_s: Callable[[], float] = time.monotonic,
    ):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        r.register(WorkerLoadCollector(worker_loads))
        # how long the counters below have counted: a reader that first meets this frontend
        # tells one that started since its last read (all it counted is new) from one it
        # could not list for a while (its counters went on)
        started_s = clock_s()
        uptime = Gauge(
            "armature_frontend_uptime_seconds", "Seconds since the counters started", registry=r
        )
        uptime.set_function(lambda: clock_s() - started_s)
        self.requests = Counter(
            "armature_requests", "Finished HTTP requests", ["endpoint", "status"], registry=r
        )
        self.in_flight = Gauge("armature_requests_in_flight", "Requests being served", registry=r)
        self.ttft_s = CountedHistogram(
            "armature_time_to_first_token_seconds",
            "Time to first token",
            LATENCY_BUCKETS_S,
            r,
        )
        self.itl_s = CountedHistogram(
            "armature_inter_token_latency_seconds",
            "Time between output tokens",
            LATENCY_BUCKETS_S,
            r,
        )
        self.e2e_s = CountedHistogram(
            "armature_e2e_request_latency_seconds",
            "Request latency, end to end",
            LATENCY_BUCKETS_S,
            r,
        )
        # each finished stream's output tokens: the planner's mean output length over the
        # requests that ended in its window (generation tokens per window also count tokens
        # of requests still decoding)
        self.request_output_tokens = CountedHistogram(
            "armature_request_generation_tokens",
            "Output tokens of each finished request",
            OUTPUT_TOKEN_BUCKETS,
            r,
        )
        self.prompt_tokens = Counter("armature_prompt_tokens", "Prompt tokens", registry=r)
        self.output_tokens = Counter("armature_generation_tokens", "Output tokens", registry=r)
        self.cached_tokens = Counter(
            "armature_prefix_cache_hit_tokens",
            "Prompt tokens served from the prefix cache",
            registry=r,
        )
        kv_usage = Gauge(
            "armature_kv_cache_usage_ratio", "Fraction of KV blocks in use", registry=r
        )
        kv_usage.set_function(lambda: _usage(get_load()))
        hit_rate = Gauge(
            "armature_prefix_cache_hit_ratio",
            "Prompt tokens served from the prefix cache / prompt tokens",
            registry=r,
        )
        hit_rate.set_function(self._hit_ratio)
        self._num_prompt_tokens = 0
        self._num_cached_tokens = 0
        Gauge("armature_model_info", "Served model", ["model"], registry=r).labels(model_name).set(
            1
        )
        self._slo = slo if slo is not None and slo.enabled else None
        if self._slo is not None:
            self._slo_requests = _add_slo_metrics(self._slo, r)

    def judge(self, ttft_s: float | None, mean_itl_s: float | None) -> None:
        """Count a finished request as met or missed against the SLO targets (if any): its
        time to first token (None: it had none) and its mean inter-token latency (None: fewer
        than two tokens)."""
        if self._slo is None:
            return
        met = meets_targets(
            None if ttft_s is None else ttft_s * 1000.0,
            None if mean_itl_s is None else mean_itl_s * 1000.0,
            self._slo.ttft_ms,
            self._slo.itl_ms,
        )
        self._slo_requests.labels("met" if met else "missed").inc()

    def observe_prompt(self, num_prompt_tokens: int, num_cached_tokens: int) -> None:
        self._num_prompt_tokens += num_prompt_tokens
        self._num_cached_tokens += num_cached_tokens
        self.prompt_tokens.inc(num_prompt_tokens)
        self.cached_tokens.inc(num_cached_tokens)

    def _hit_ratio(self) -> float:
        if not self._num_prompt_tokens:
            return 0.0
        return self._num_cached_tokens / self._num_prompt_tokens

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _add_slo_metrics(slo: SloConfig, registry: CollectorRegistry) -> Counter:
    """The SLO targets' gauge, set; returns the counter of requests judged against them."""
    requests = Counter(
        "armature_slo_requests",
        "Finished requests judged against the SLO targets, met or missed",
        ["result"],
        registry=registry,
    )
    targets = Gauge(
        "armature_slo_target_seconds",
        "The targets requests are judged against (--slo-ttft-ms, --slo-itl-ms)",
        ["target"],
        registry=registry,
    )
    for name, target_ms in (("ttft", slo.ttft_ms), ("itl", slo.itl_ms)):
        if target_ms is not None:
            targets.labels(name).set(target_ms / 1000.0)
    return requests


class CountedHistogram(Collector):
    """A histogram (buckets, count, sum) that takes several equal observations at once:
    `observe(value, count)` costs one bucket search however many tokens share an interval.
    prometheus_client's Histogram takes one at a time, behind a lock per observation; this
    one is fed and read on one event loop. It exposes the same series but `_created`."""

    def __init__(
        self,
        name: str,
        documentation: str,
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ):
        if list(buckets) != sorted(set(buckets)) or not buckets:
            raise ValueError("buckets must be distinct and increasing")
        self._name = name
        self._documentation = documentation
        self._upper = (*buckets, math.inf) if buckets[-1] != math.inf else tuple(buckets)
        self._counts = [0] * len(self._upper)
        self._sum = 0.0
        registry.register(self)

    def observe(self, value: float, count: int = 1) -> None:
        """`count` observations of `value`."""
        self._counts[bisect.bisect_left(self._upper, value)] += count
        self._sum += value * count

    def describe(self) -> Iterator[HistogramMetricFamily]:
        """Its name and type, read at registration: a second metric of that name is refused."""
        yield HistogramMetricFamily(self._name, self._documentation)

    def collect(self) -> Iterator[HistogramMetricFamily]:
        cumulative, total = [], 0
        for upper, count in zip(self._upper, self._counts, strict=True):
            total += count
            cumulative.append((floatToGoString(upper), total))
        yield HistogramMetricFamily(
            self._name, self._documentation, buckets=cumulative, sum_value=self._sum
        )


def _usage(load: EngineLoad) -> float:
    return load.num_active_blocks / load.num_total_blocks if load.num_total_blocks else 0.0


class RouterMetrics(RouterObserver):
    """Routing decisions per worker, overlap blocks and decision latency."""

    def __init__(self, registry: CollectorRegistry):
        self.decisions = Counter(
            "armature_router_decisions",
            "Requests routed, by worker",
            ["worker"],
            registry=registry,
        )
        self.overlap_blocks = Histogram(
            "armature_router_overlap_blocks",
            "Cached prefix blocks on the chosen worker",
            buckets=(0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
            registry=registry,
        )
        self.prefills = Counter(
            "armature_router_prefills",
            "Prompts by where they were prefilled: remote (a prefill worker) or local",
            ["where"],
            registry=registry,
        )
        self.migrations = Counter(
            "armature_router_migrations",
            "Requests moved to another worker after theirs died mid-stream",
            registry=registry,
        )
        self.decision_s = Histogram(
            "armature_router_decision_seconds",
            "Time to choose a worker",
            buckets=(1e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 1e-3, 1e-2),
            registry=registry,
        )

    def prefill(self, where: str) -> None:
        self.prefills.labels(where).inc()

    def migration(self) -> None:
        self.migrations.inc()

    def decision(self, worker: str, overlap_blocks: int, latency_s: float) -> None:
        self.decisions.labels(worker).inc()
        self.overlap_blocks.observe(overlap_blocks)
        self.decision_s.observe(latency_s)


_IN_FLIGHT_METRICS: dict[str, tuple[str, Callable[[WorkerLoad], int]]] = {
    "armature_router_requests_in_flight": (
        "Requests routed to the worker and not finished, as routing counts them, by the "
        "frontend that routed them: this one, or the other replicas (their shared load)",
        lambda x: x.num_requests,
    ),
    "armature_router_blocks_in_flight": (
        "KV blocks of the requests in flight on the worker, by the frontend that routed them",
        lambda x: x.active_blocks,
    ),
    "armature_router_prefill_tokens_in_flight": (
        "Prompt tokens of the requests routed to the worker and not past their first token",
        lambda x: x.active_prefill_tokens,
    ),
}


class InFlightCollector(Collector):
    """The router's in-flight load per worker, `by` this frontend or by its peer replicas,
    read when scraped."""

    def __init__(
        self,
        own: Callable[[], Mapping[str, WorkerLoad]],
        peers: Callable[[], Mapping[str, WorkerLoad]],
    ):
        self.own = own
        self.peers = peers

    def collect(self) -> Iterator[GaugeMetricFamily]:
        sources = (("this", self.own()), ("peers", self.peers()))
        for name, (help_text, value) in _IN_FLIGHT_METRICS.items():
            family = GaugeMetricFamily(name, help_text, labels=["worker", "by"])
            for by, loads in sources:
                for worker, load in sorted(loads.items()):
                    family.add_metric([worker, by], float(value(load)))
            yield family
