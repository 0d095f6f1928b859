"""A worker's own Prometheus endpoint (its registry, a small HTTP server thread): its load as
the engine sees it, the requests and tokens it served, and its own time to first token (the
frontend's TTFT less the path to and from the worker)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from armature.protocols.engine import EngineLoad, EngineStats, KvTierStats
from armature.runtime.latency_buckets import LATENCY_BUCKETS_S
from armature.runtime.load_metrics import WorkerLoadCollector

__all__ = ["WorkerMetrics", "add_tier_metrics", "sum_tier_stats"]


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


OFFLOAD_PATHS = ("g1->g2", "g1->g3", "g1->g4", "g2->g3", "g2->g4", "g3->g4")
ONBOARD_PATHS = ("g2->g1", "g3->g1", "g4->g1")
TIERS = ("host", "disk", "external")
_NO_TIERS = KvTierStats(
    bytes_per_block=0,
    blocks_offloaded={},
    blocks_onboarded={},
    blocks_refused={},
    write_failures={},
    num_lookup_blocks=0,
    hit_blocks={},
    tier_blocks={},
    tier_capacity_blocks={},
    onboard_latency_buckets_s=[],
    onboard_latency_counts=[0],
    onboard_latency_sum_s=0.0,
)


def sum_tier_stats(stats: list[KvTierStats]) -> KvTierStats | None:
    """The tiers of several engines of one model as one (counts and sizes summed; their
    onboarding histograms share their buckets); None for none."""
    if not stats:
        return None

    def summed(field: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for one in stats:
            for key, value in getattr(one, field).items():
                out[key] = out.get(key, 0) + value
        return out

    first = stats[0]
    return KvTierStats(
        bytes_per_block=first.bytes_per_block,
        blocks_offloaded=summed("blocks_offloaded"),
        blocks_onboarded=summed("blocks_onboarded"),
        blocks_refused=summed("blocks_refused"),
        write_failures=summed("write_failures"),
        num_lookup_blocks=sum(s.num_lookup_blocks for s in stats),
        hit_blocks=summed("hit_blocks"),
        tier_blocks=summed("tier_blocks"),
        tier_capacity_blocks=summed("tier_capacity_blocks"),
        onboard_latency_buckets_s=first.onboard_latency_buckets_s,
        onboard_latency_counts=[
            sum(c) for c in zip(*(s.onboard_latency_counts for s in stats), strict=True)
        ],
        onboard_latency_sum_s=sum(s.onboard_latency_sum_s for s in stats),
    )


def add_tier_metrics(registry: CollectorRegistry, engines: list[Callable[[], EngineStats]]) -> None:
    """The lower tiers of engines in this process (serve's in-process workers, whose process
    serves no metrics of its own), summed, in `registry`'s families."""

    def get_tiers() -> KvTierStats | None:
        return sum_tier_stats([t for t in (get().tiers for get in engines) if t is not None])

    registry.register(_TierCollector(get_tiers))


class _TierCollector(Collector):
    """The lower KV tiers (G2-G4). Every path and tier is exported, at zero where the worker
    has no such tier, so dashboards and alerts see one set of series on every worker."""

    def __init__(self, get_tiers: Callable[[], KvTierStats | None]):
        self.get_tiers = get_tiers

    def collect(self) -> Iterator[Metric]:
        t = self.get_tiers() or _NO_TIERS
        yield from _paths("offloaded", "copied down a tier", t.blocks_offloaded, OFFLOAD_PATHS, t)
        yield from _paths("onboarded", "loaded back into G1", t.blocks_onboarded, ONBOARD_PATHS, t)
        ratio = GaugeMetricFamily(
            "armature_worker_kv_tier_hit_ratio",
            "Prompt blocks looked up below G1 that a tier held (its share of the lookups)",
            labels=["tier"],
        )
        usage = GaugeMetricFamily(
            "armature_worker_kv_tier_blocks", "KV blocks a lower tier holds", labels=["tier"]
        )
        capacity = GaugeMetricFamily(
            "armature_worker_kv_tier_capacity_blocks",
            "A lower tier's capacity in blocks (G4: the blocks this worker indexes)",
            labels=["tier"],
        )
        failures = CounterMetricFamily(
            "armature_worker_kv_tier_write_failures",
            "Writes to a lower tier that failed (the first one turns its writes off)",
            labels=["tier"],
        )
        for tier in TIERS:
            hits = t.hit_blocks.get(tier, 0)
            ratio.add_metric([tier], hits / t.num_lookup_blocks if t.num_lookup_blocks else 0.0)
            usage.add_metric([tier], t.tier_blocks.get(tier, 0))
            capacity.add_metric([tier], t.tier_capacity_blocks.get(tier, 0))
            failures.add_metric([tier], t.write_failures.get(tier, 0))
        yield from (ratio, usage, capacity, failures)
        refused = CounterMetricFamily(
            "armature_worker_kv_refused_blocks",
            "Loads from a lower tier that stopped at a block (it and the rest computed "
            "instead): the block failed its checks, was missing, or the store did not answer "
            "(unavailable)",
            labels=["reason"],
        )
        reasons = ("corrupt", "truncated", "foreign-layout", "wrong-hash", "missing")
        for reason in (*reasons, "unavailable", "error"):
            refused.add_metric([reason], t.blocks_refused.get(reason, 0))
        yield refused
        yield _latency(t)


def _paths(
    verb: str, meaning: str, counts: dict[str, int], paths: tuple[str, ...], t: KvTierStats
) -> Iterator[Metric]:
    blocks = CounterMetricFamily(
        f"armature_worker_kv_{verb}_blocks", f"KV blocks {meaning}, by path", labels=["path"]
    )
    nbytes = CounterMetricFamily(
        f"armature_worker_kv_{verb}_bytes", f"KV bytes {meaning}, by path", labels=["path"]
    )
    for path in paths:
        blocks.add_metric([path], counts.get(path, 0))
        nbytes.add_metric([path], counts.get(path, 0) * t.bytes_per_block)
    yield blocks
    yield nbytes


def _latency(t: KvTierStats) -> HistogramMetricFamily:
    buckets: list[tuple[str, float]] = []
    total = 0
    for bound, n in zip(t.onboard_latency_buckets_s, t.onboard_latency_counts, strict=False):
        total += n
        buckets.append((repr(bound), total))
    buckets.append(("+Inf", sum(t.onboard_latency_counts)))
    return HistogramMetricFamily(
        "armature_worker_kv_onboard_seconds",
        "Time to load a request's KV blocks from lower tiers into G1",
        buckets=buckets,
        sum_value=t.onboard_latency_sum_s,
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
        self.registry.register(_TierCollector(lambda: get_stats().tiers))
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
        self.ttft_s = Histogram(
            "armature_worker_time_to_first_token_seconds",
            "Time from the worker receiving a request to its first token (requests that came "
            "with tokens, decode legs and migrated ones, are not timed)",
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
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
