"""What a replay takes and gives: its settings (`ReplayConfig`, with SLAs for goodput) and its
report (`ReplayReport`, with latency percentiles). Plain values, shared by the simulations
and their entry point (`sim.replay`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from armature.config import DEFAULT_BLOCK_SIZE_TOKENS, KvTierConfig, RouterConfig
from armature.config.planner import PlannerConfig
from armature.workload.measure import LatencySummary, Slo

__all__ = [
    "PLANNER_RULES",
    "REPLAY_POLICIES",
    "FleetSample",
    "ReplayConfig",
    "ReplayReport",
    "bytes_s_from_gbs",
    "gbs_from_bytes_s",
]

REPLAY_POLICIES = ("round-robin", "random", "least-loaded", "kv", "kv-approx")
# what sizes a planned replay's fleet: the throughput plan, the load rule, or both
PLANNER_RULES = ("sla", "load", "both")
BYTES_PER_GB = 1e9


def gbs_from_bytes_s(bytes_s: float) -> float:
    """A bandwidth as `replay --transfer-bandwidth-gbs` takes it (decimal GB/s)."""
    return bytes_s / BYTES_PER_GB


def bytes_s_from_gbs(gbs: float) -> float:
    """`replay --transfer-bandwidth-gbs` read back into bytes/s; of `gbs_from_bytes_s(x)`, the
    bandwidth a saved replay line gives (which may differ from x in the last bit)."""
    return gbs * BYTES_PER_GB


@dataclass(frozen=True)
class ReplayConfig:
    num_workers: int = 8
    router: str = "kv"
    block_size: int = DEFAULT_BLOCK_SIZE_TOKENS
    num_kv_blocks: int = 16384
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    speedup_ratio: float = 1.0
    overlap_weight: float = RouterConfig().overlap_weight
    decode_weight: float = RouterConfig().decode_weight
    router_temperature: float = RouterConfig().temperature
    load_bound: float = RouterConfig().load_bound
    share_bound: float = RouterConfig().share_bound
    share_window: int = RouterConfig().share_window
    vocab_size: int = 32000
    routed_ttl_s: float = RouterConfig().routed_ttl_s
    seed: int = 0
    # run every engine step on its own instead of a batch of decodes' steps at once (the
    # reference the fast path is tested against: the same report, more slowly)
    reference_steps: bool = False
    # disaggregation: the first `num_prefill_workers` of `num_workers` are prefill workers
    num_prefill_workers: int = 0
    max_local_prefill_tokens: int = 0
    max_prefill_queue_tokens: int = 1 << 30
    transfer_bandwidth_bytes_s: float = 25e9
    # one KV block's bytes, for KV transfers and lower-tier loads (and --kv-host-bytes ...)
    kv_bytes_per_block: int = 2 * 1024 * 1024  # Llama-3-8B in bfloat16, 16-token blocks
    # lower KV tiers of every worker, modeled (armature.sim.modeled_tiers); the router's
    # index is fed every tier's events, as the router service is, and with `tier_aware` the
    # kv router counts lower-tier hits at their weights (tier-blind: device hits only)
    tiers: KvTierConfig = KvTierConfig()
    tier_aware: bool = RouterConfig().tier_aware
    # goodput: requests meeting an SLA, for each SLA given
    slos: tuple[Slo, ...] = ()
    # the planner's settings: its TTFT and ITL targets give every replay's `sla_attainment`,
    # its load interval the timeline's step; with `planner_rule` (sim.planned_fleet's
    # PLANNER_RULES) it sizes the fleet, whose new workers take `worker_startup_s` to start
    planner: PlannerConfig = PlannerConfig()
    planner_rule: str | None = None
    worker_startup_s: float = 0.0


@dataclass(frozen=True)
class FleetSample:
    """The fleet at `time_s` (from the first arrival) and the last load window's traffic."""

    time_s: float
    serving: dict[str, int]  # by role: in routing
    starting: dict[str, int]  # by role: asked for, not yet up
    arrival_rate_per_s: float
    mean_ttft_ms: float | None
    mean_itl_ms: float | None


@dataclass(frozen=True)
class ReplayReport:
    num_requests: int
    num_rejected: int
    # prompt tokens found cached when first scheduled (in G1, or onboarded from lower tiers)
    # over all prompt tokens of the requests that finished
    prefix_hit_ratio: float
    ttft_ms: LatencySummary
    itl_ms: LatencySummary
    e2e_ms: LatencySummary
    throughput_tokens_s: float
    load_skew: float
    requests_per_worker: dict[str, int]
    goodput_requests_s: dict[str, float]  # by SLA name
    goodput_tokens_s: dict[str, float]
    num_remote_prefills: int
    simulated_time_s: float
    wall_time_s: float
    # batches the workers' engines ran (a decode run's steps each count)
    num_engine_steps: int = 0
    # lower KV tiers, summed over workers (empty without tiers): blocks loaded back into G1
    # by tier, blocks copied down by path ("device->host"), and the onboarded blocks' tokens
    # over all prompt tokens (the part of prefix_hit_ratio the lower tiers gave)
    blocks_onboarded: dict[str, int] = field(default_factory=dict)
    blocks_offloaded: dict[str, int] = field(default_factory=dict)
    onboarded_token_ratio: float = 0.0
    # prefix_hit_ratio's ceiling: the same requests with one infinite prefix cache shared by
    # every worker (workload.traces.prefix_hit_ceiling_tokens), in the same unit
    prefix_hit_ceiling: float = 0.0
    # what the fleet cost and how it held the planner's targets (planned or static)
    worker_seconds: float = 0.0
    worker_seconds_by_role: dict[str, float] = field(default_factory=dict)
    peak_workers: dict[str, int] = field(default_factory=dict)
    # requests whose TTFT and mean ITL are both within the targets, over all that arrived
    # (a rejected request misses)
    sla_attainment: float = 0.0
    planner_decisions: dict[str, int] = field(default_factory=dict)  # by reason
    # by role: seconds a maximum (--max-workers, the total) held it below what the planner
    # asked for, and the most workers it asked for then (roles never held: absent)
    planner_limited_s: dict[str, float] = field(default_factory=dict)
    planner_most_wanted: dict[str, int] = field(default_factory=dict)
    timeline: list[FleetSample] = field(default_factory=list)
