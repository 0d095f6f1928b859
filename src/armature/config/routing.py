"""How the frontend routes: the routing policy and its cost, conditional disaggregation, how
it notices hung workers, and how frontend replicas share their in-flight load."""

from __future__ import annotations

from dataclasses import dataclass

from armature.config.engine import DEFAULT_BLOCK_SIZE_TOKENS
from armature.config.settings import setting
from armature.config.values import (
    int_between,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
)
from armature.config.values import (
    load_bound as parse_bound,
)
from armature.errors import ConfigError

__all__ = [
    "DEFAULT_SHARE_WINDOW",
    "DisaggConfig",
    "HealthConfig",
    "ReplicaConfig",
    "RouterConfig",
    "check_routed_ttl",
]

DEFAULT_SHARE_WINDOW = 512  # the kv router's bounded shares: recent decisions per worker


@dataclass(frozen=True, kw_only=True)
class RouterConfig:
    """How the frontend picks a worker. `block_size_tokens` and `seed` are set by the command
    (the workers' block size; the command's seed)."""

    policy: str = setting(
        "round-robin",
        "how requests are spread over workers (direct: by the x-worker-id header)",
        flag="router",
    )
    overlap_weight: float = setting(
        1.0,
        "kv router: weight of prefill blocks against decode blocks in the cost",
        flag="kv-overlap-weight",
        parse=non_negative_float,
    )
    decode_weight: float = setting(
        0.5,
        "kv router: weight of a worker's active blocks in the cost (1: the DESIGN baseline; "
        "lower favours cache affinity over spreading memory load; 0.5, temperature 0.02 and "
        "share bound 1.05 were chosen on the first halves of two traces: docs/benchmarks.md, "
        "replay_balance)",
        flag="kv-decode-weight",
        parse=non_negative_float,
    )
    temperature: float = setting(
        0.02,
        "kv router: 0 picks the cheapest worker, above 0 samples by softmax over costs "
        "normalized to [0, 1] (0.02: near-ties are shared, costlier workers almost never)",
        flag="router-temperature",
        parse=non_negative_float,
    )
    load_bound: float = setting(
        0.0,
        "kv router: bounded loads: a worker holding this many times the fleet's mean in-flight "
        "requests (with the new one, rounded up) takes none until it drains below; 0: no "
        "bound (above 1 when set)",
        flag="kv-load-bound",
        parse=parse_bound,
    )
    share_bound: float = setting(
        1.05,
        "kv router: bounded shares: a worker routed this many times its fair share of the "
        "router's recent requests (the last --kv-share-window per worker, the new one counted, "
        "rounded up) takes none while another worker is idle, until its share falls; and "
        "among workers the cost holds near-ties, one below its fair share is taken. Lowers "
        "the load skew (chosen on the first halves of two traces, docs/benchmarks.md "
        "replay_balance); 0: no bound (above 1 when set)",
        flag="kv-share-bound",
        parse=parse_bound,
    )
    share_window: int = setting(
        DEFAULT_SHARE_WINDOW,
        "kv router: the recent requests per worker that --kv-share-bound counts over",
        flag="kv-share-window",
        parse=positive_int,
    )
    tier_aware: bool = setting(
        True,
        "kv router: count only the blocks in a worker's device cache, not those it can load "
        "back from host, disk or the shared store (tier-blind, to compare)",
        flag="kv-tier-blind",
        negate=True,
    )
    migration_limit: int = setting(
        3,
        "times a request moves to another worker (with its tokens so far) when its worker "
        "dies mid-stream; 0 fails it instead",
        parse=non_negative_int,
    )
    block_size_tokens: int = DEFAULT_BLOCK_SIZE_TOKENS
    seed: int = 0
    # KV events are pulled from the engines when one has news (a worker's update arrived), at
    # most once every event_sync_interval_s, and at least every event_sync_idle_interval_s
    # (a steady 5 ms poll cost ~3% of a core, which the model's steps pay for on a small CPU
    # machine)
    event_sync_interval_s: float = 0.005
    event_sync_idle_interval_s: float = 0.025
    routed_ttl_s: float = setting(
        120.0,
        "kv router: how long a prompt routed to a worker counts as cached there before the "
        "worker's KV events confirm it (a repeat during its prefill finds it); 0: KV events "
        "only (kv; the fastest decision: the prompt is hashed only as far as a worker holds "
        "it); kv-approx needs it above 0",
        flag="kv-routed-ttl-s",
        parse=non_negative_float,
    )
    failover_wait_s: float = 10.0  # how long a failed-over request waits for a live worker

    def __post_init__(self) -> None:
        check_routed_ttl(self.policy, self.routed_ttl_s)


def check_routed_ttl(policy: str, routed_ttl_s: float) -> None:
    """ConfigError where `policy` cannot run with `routed_ttl_s` (kv-approx has nothing but
    its routed predictions); `armature replay`, which builds no RouterConfig, calls it too."""
    if policy == "kv-approx" and routed_ttl_s <= 0:
        raise ConfigError(
            "--router kv-approx routes on its own decisions alone: --kv-routed-ttl-s must be "
            "above 0"
        )


@dataclass(frozen=True, kw_only=True)
class DisaggConfig:
    """Conditional disaggregation in the frontend's router."""

    max_local_prefill_tokens: int = setting(
        256,
        "with prefill workers: a prompt whose uncached part is shorter than this is prefilled "
        "on the decode worker itself",
        parse=non_negative_int,
    )
    max_prefill_queue_tokens: int = setting(
        65536,
        "the prefill pool counts as saturated (prompts prefill locally) when every prefill "
        "worker has this many prompt tokens in flight",
        parse=positive_int,
    )
    enforce_disagg: bool = setting(
        False,
        "always prefill on a prefill worker; refuse requests (503) when none is alive",
    )

    def __post_init__(self) -> None:
        if self.max_local_prefill_tokens < 0:
            raise ConfigError("max_local_prefill_tokens must be >= 0")
        # a limit of 0 would call an idle prefill pool saturated
        if self.max_prefill_queue_tokens < 1:
            raise ConfigError("max_prefill_queue_tokens must be >= 1")


@dataclass(frozen=True, kw_only=True)
class HealthConfig:
    """How a frontend notices hung workers."""

    worker_liveness_timeout_s: float = setting(
        10.0,
        "a worker that sends no update (heartbeats come every second) this long is not routed to",
        parse=positive_float,
    )
    worker_stall_timeout_s: float = setting(
        60.0,
        "a stream with no output this long fails over to another worker (a hung worker); "
        "keep it above your longest prefill",
        parse=positive_float,
    )


@dataclass(frozen=True, kw_only=True)
class ReplicaConfig:
    """Frontend replicas: how each shares the load it routes with the others.

    Over the event plane, within a namespace, so that each one's routing cost sees every
    replica's requests."""

    replica_host: str = setting(
        "127.0.0.1",
        "the address this frontend publishes its in-flight load on for the other frontend "
        "replicas (the zmq event plane binds it), and serves its /metrics and /admin/overload "
        "on for the planner and the other replicas (--replica-port): with replicas on many "
        "hosts, this host's address",
    )
    replica_port: int = setting(
        0,
        "the port on --replica-host where this frontend alone serves /metrics, /health and "
        "/admin/overload, not generation (0: any free port), named in its card in discovery: "
        "the planner reads each frontend replica's /metrics there, where replicas share --port",
        parse=int_between(0, 65535),
    )
    share_load_interval_s: float = setting(
        0.01,
        "frontend replicas: publish this frontend's in-flight load at most this often while "
        "it changes",
        parse=positive_float,
    )
    share_load_ttl_s: float = setting(
        3.0,
        "frontend replicas: a replica's load counts this long after its last report (each "
        "reports at least every third of it), so the load of one that died expires",
        parse=positive_float,
    )

    @property
    def heartbeat_s(self) -> float:
        """This frontend reports its load at least this often."""
        return self.share_load_ttl_s / 3
