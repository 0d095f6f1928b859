"""The planner: the latency targets it holds, how it predicts load, and the limits and
cool-downs of its scaling decisions (docs/architecture.md, "Planner"); and the planner
service's own settings (`PlannerServiceConfig`: what it watches, how it acts)."""

from __future__ import annotations

from dataclasses import dataclass

from armature.config.settings import setting
from armature.config.values import (
    http_url,
    int_at_least,
    int_between,
    listen_host,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
)
from armature.errors import ConfigError
from armature.protocols.worker import WorkerRole

__all__ = [
    "CONNECTORS",
    "PLANNER_MODES",
    "PREDICTORS",
    "PlannerConfig",
    "PlannerServiceConfig",
    "RoleLimits",
]

PREDICTORS = ("constant", "moving-average", "holt-winters")
PLANNER_MODES = ("disagg", "agg")
CONNECTORS = ("local", "virtual", "kubernetes")


def _share(text: str) -> float:
    """A number above 0 and at most 1."""
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"expected a number in (0, 1], got {text!r}") from None
    if not 0.0 < value <= 1.0:
        raise ConfigError(f"expected a number in (0, 1], got {text!r}")
    return value


def _fraction_open(text: str) -> float:
    """A number strictly between 0 and 1."""
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"expected a number in (0, 1), got {text!r}") from None
    if not 0.0 < value < 1.0:
        raise ConfigError(f"expected a number in (0, 1), got {text!r}")
    return value


def _fraction_closed_open(text: str) -> float:
    """A number at least 0 and below 1."""
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"expected a number in [0, 1), got {text!r}") from None
    if not 0.0 <= value < 1.0:
        raise ConfigError(f"expected a number in [0, 1), got {text!r}")
    return value


@dataclass(frozen=True)
class RoleLimits:
    """The fewest and most workers of one role."""

    min_workers: int
    max_workers: int


@dataclass(frozen=True, kw_only=True)
class PlannerConfig:
    """What the planner aims for and how far it may go. `__post_init__` rejects limits that
    cannot all hold (a ConfigError, one line, naming the flags)."""

    ttft_ms: float = setting(
        500.0, "target time to first token of each request, ms", parse=positive_float
    )
    itl_ms: float = setting(
        50.0, "target mean inter-token latency of each request, ms", parse=positive_float
    )
    slo_attainment: float = setting(
        0.95,
        "the fraction of requests that should meet both --ttft-ms and --itl-ms",
        parse=_fraction_open,
    )
    mode: str = setting(
        "disagg",
        "disagg: scale prefill and decode workers; agg: scale one pool of workers that do both",
        flag="planner-mode",
        choices=PLANNER_MODES,
    )
    interval_s: float = setting(
        60.0,
        "how often the throughput plan runs: predict the next interval's load, size each pool",
        flag="planner-interval-s",
        parse=positive_float,
    )
    load_interval_s: float = setting(
        5.0,
        "how often the load rule runs: +-1 worker from live latency estimates and the queue",
        parse=positive_float,
    )
    load_rate_window_s: float = setting(
        30.0,
        "the load rule sizes on the arrivals of this many recent seconds (its last load "
        "windows together), not on one short window's burst or lull",
        parse=positive_float,
    )
    decode_kv_share: float = setting(
        1.0,
        "the share of a worker's KV cache the plan fills with decoding requests of the mean "
        "context; the rest is headroom for longer contexts and bursts (a full cache preempts, "
        "and a preempted request computes its prompt again where it decodes)",
        flag="planner-kv-share",
        parse=_share,
    )
    predictor: str = setting(
        "holt-winters",
        "how the next interval's request rate and lengths are predicted: the last value, a "
        "moving average, or exponential smoothing (statsmodels' Holt-Winters)",
        choices=PREDICTORS,
    )
    predictor_window_intervals: int = setting(
        6,
        "moving-average: the intervals averaged",
        parse=positive_int,
    )
    predictor_history_intervals: int = setting(
        96,
        "holt-winters: the most recent intervals it is fitted on",
        parse=positive_int,
    )
    season_intervals: int | None = setting(
        None,
        "holt-winters: the length of a season (e.g. a day) in intervals, at least 2; none by "
        "default",
        parse=int_at_least(2),
    )
    queue_aware: bool = setting(
        True,
        "size pools with a threshold rule only, not also with a queueing model (Erlang C) that "
        "scales up before a queue builds (to compare)",
        flag="planner-queue-blind",
        negate=True,
    )
    min_workers: int = setting(1, "the fewest workers of each role", parse=positive_int)
    max_workers: int = setting(8, "the most workers of each role", parse=positive_int)
    min_prefill_workers: int | None = setting(
        None,
        "the fewest prefill workers (default: --min-workers; 0: decode workers prefill alone "
        "when the pool is empty)",
        parse=non_negative_int,
    )
    max_prefill_workers: int | None = setting(
        None, "the most prefill workers (default: --max-workers)", parse=positive_int
    )
    min_decode_workers: int | None = setting(
        None, "the fewest decode workers (default: --min-workers)", parse=positive_int
    )
    max_decode_workers: int | None = setting(
        None, "the most decode workers (default: --max-workers)", parse=positive_int
    )
    max_total_workers: int | None = setting(
        None, "the most workers of all roles together", parse=positive_int
    )
    gpus_per_worker: int = setting(1, "GPUs one worker takes", parse=positive_int)
    gpu_budget: int | None = setting(
        None, "the most GPUs all workers together may take", parse=positive_int
    )
    scale_up_cooldown_s: float = setting(
        10.0,
        "after a role scales, it scales up again only after this long (new workers need time "
        "to start and take load)",
        parse=positive_float,
    )
    scale_down_cooldown_s: float = setting(
        60.0,
        "after a role scales, it scales down only after this long (against flapping)",
        parse=positive_float,
    )
    worker_startup_s: float = setting(
        30.0,
        "how long a worker asked for takes to serve: the load rule adds one for a live latency "
        "only where the queue would outlast that and no worker is already starting (a replay's "
        "new workers join routing this long after they are asked for)",
        parse=non_negative_float,
    )
    scale_down_ratio: float = setting(
        0.5,
        "the load rule removes a worker only while live TTFT and ITL estimates are below this "
        "fraction of their targets",
        parse=_fraction_open,
    )

    trim_step: float = setting(
        0.0,
        "SLO feedback: after an interval whose measured attainment reached half way from "
        "--slo-attainment to 1 (0.975 at 0.95), size the pools for this much less of the "
        "predicted load (compounding); an interval under the target, or a load 25% above the "
        "highest one the trim held at, sizes for all of it again (0: off)",
        flag="planner-trim-step",
        parse=_fraction_closed_open,
    )
    trim_min_scale: float = setting(
        0.5,
        "SLO feedback: the least share of the predicted load the pools are sized for",
        flag="planner-trim-min",
        parse=_share,
    )

    def __post_init__(self) -> None:
        for role in self.get_roles():
            limits = self.get_role_limits(role)
            if limits.min_workers > limits.max_workers:
                low, high = self._limit_flags(role)
                raise ConfigError(
                    f"{role.value} workers: the minimum ({limits.min_workers}) is above the "
                    f"maximum ({limits.max_workers}); check {low}/{high}"
                )
        num_min_workers = sum(self.get_role_limits(r).min_workers for r in self.get_roles())
        if self.max_total_workers is not None and self.max_total_workers < num_min_workers:
            raise ConfigError(
                f"--max-total-workers {self.max_total_workers} is below the sum of the roles' "
                f"minimum workers ({num_min_workers})"
            )
        num_min_gpus = num_min_workers * self.gpus_per_worker
        if self.gpu_budget is not None and self.gpu_budget < num_min_gpus:
            raise ConfigError(
                f"--gpu-budget {self.gpu_budget} is below what the roles' minimum workers take "
                f"({num_min_workers} x {self.gpus_per_worker} GPUs = {num_min_gpus})"
            )
        if self.scale_down_cooldown_s < self.scale_up_cooldown_s:
            raise ConfigError("--scale-down-cooldown-s must be >= --scale-up-cooldown-s")
        if self.mode not in PLANNER_MODES:
            raise ConfigError(f"--planner-mode must be one of {', '.join(PLANNER_MODES)}")
        if self.predictor not in PREDICTORS:
            raise ConfigError(f"--predictor must be one of {', '.join(PREDICTORS)}")

    def get_roles(self) -> tuple[WorkerRole, ...]:
        """The roles the planner scales: prefill and decode, or the aggregated pool."""
        if self.mode == "agg":
            return (WorkerRole.AGG,)
        return (WorkerRole.PREFILL, WorkerRole.DECODE)

    def get_role_limits(self, role: WorkerRole) -> RoleLimits:
        """A role's limits: its own flags where given, else --min-workers/--max-workers."""
        low, high = self.min_workers, self.max_workers
        if role is WorkerRole.PREFILL:
            low = low if self.min_prefill_workers is None else self.min_prefill_workers
            high = high if self.max_prefill_workers is None else self.max_prefill_workers
        elif role is WorkerRole.DECODE:
            low = low if self.min_decode_workers is None else self.min_decode_workers
            high = high if self.max_decode_workers is None else self.max_decode_workers
        return RoleLimits(low, high)

    def _limit_flags(self, role: WorkerRole) -> tuple[str, str]:
        """The flags `role`'s minimum and maximum come from (its own where given)."""
        own = {
            WorkerRole.PREFILL: (self.min_prefill_workers, self.max_prefill_workers),
            WorkerRole.DECODE: (self.min_decode_workers, self.max_decode_workers),
        }.get(role, (None, None))
        name = f"{role.value}-" if role in (WorkerRole.PREFILL, WorkerRole.DECODE) else ""
        low = f"--min-{name}workers" if own[0] is not None else "--min-workers"
        high = f"--max-{name}workers" if own[1] is not None else "--max-workers"
        return low, high

    def get_max_total_workers(self) -> int | None:
        """The tighter of --max-total-workers and --gpu-budget / --gpus-per-worker."""
        bounds = [b for b in (self.max_total_workers,) if b is not None]
        if self.gpu_budget is not None:
            bounds.append(self.gpu_budget // self.gpus_per_worker)
        return min(bounds) if bounds else None


@dataclass(frozen=True, kw_only=True)
class PlannerServiceConfig:
    """`armature planner`'s shell: the frontend it reads, the performance model, and the
    connector that carries decisions out."""

    frontend_url: str | None = setting(
        None,
        "the one frontend whose /metrics the planner reads (none: every frontend replica of "
        "--namespace, each at the address its card in discovery names, summed)",
        parse=http_url,
    )
    frontend_api_key: str | None = setting(
        None,
        "the API key the planner sends the frontend (one of its --api-key), for a frontend "
        "that protects /metrics (--protect-metrics)",
        secret=True,
    )
    frontend_wait_s: float = setting(
        30.0,
        "how long to wait at start for the frontends' /metrics to answer (the local connector "
        "starts the first workers before: a frontend waits for one)",
        parse=non_negative_float,
    )
    performance_model: str | None = setting(
        None,
        "timing profile of one worker (`armature profile --output`), measured on the model "
        "the frontend serves: its step times, and its KV blocks, block size, --max-num-seqs and "
        "--max-num-batched-tokens as profiled (run the workers with the same); required",
    )
    prefill_performance_model: str | None = setting(
        None,
        "timing profile of one prefill worker where the prefill workers differ from the "
        "others (--planner-mode disagg): the prefill pool is sized by its step times and "
        "their workers checked against it (default: --performance-model for both roles)",
    )
    connector: str = setting(
        "local",
        "local: start and stop `armature worker` processes on this host; virtual: publish "
        "targets in discovery for an external orchestrator and wait for its acks; kubernetes: "
        "set the replicas of one Deployment per role (pip install 'armature[kubernetes]')",
        choices=CONNECTORS,
    )
    worker_args: tuple[str, ...] = setting(
        (),
        "local: the flags of each worker it starts, as one quoted string (repeatable), e.g. "
        '--worker-args="--engine mocker --model ./m"; the planner adds --role and the runtime',
        repeat=True,
    )
    prefill_worker_args: tuple[str, ...] = setting(
        (),
        "local, --planner-mode disagg: the flags of each prefill worker it starts where they "
        "differ from the others' (repeatable, as --worker-args; default: --worker-args)",
        repeat=True,
    )
    worker_log_dir: str | None = setting(
        None, "local: write each worker's output to <dir>/<worker>.log (default: discard)"
    )
    drain_timeout_s: float = setting(
        60.0,
        "local: how long a removed worker may take to drain and exit before it is killed",
        parse=positive_float,
    )
    ack_timeout_s: float = setting(
        60.0,
        "virtual: how long to wait for the orchestrator's ack before retrying",
        parse=positive_float,
    )
    k8s_namespace: str | None = setting(
        None,
        "kubernetes: the namespace of the worker Deployments (default: the planner's own Pod's "
        "namespace in a cluster, else the kubeconfig context's)",
    )
    k8s_prefill_deployment: str = setting(
        "armature-prefill", "kubernetes: the Deployment of the prefill workers"
    )
    k8s_decode_deployment: str = setting(
        "armature-decode", "kubernetes: the Deployment of the decode workers"
    )
    k8s_agg_deployment: str = setting(
        "armature-agg", "kubernetes: the Deployment of the aggregated workers (--planner-mode agg)"
    )
    dry_run: bool = setting(False, "log the decisions without acting on them")
    host: str = setting(
        "127.0.0.1", "address of the planner's /metrics endpoint", parse=listen_host
    )
    metrics_port: int = setting(
        0,
        "the planner's Prometheus /metrics port (0: any free port; -1: none)",
        parse=int_between(-1, 65535),
    )
    log_level: str = setting("info", "log verbosity", choices=("debug", "info", "warning", "error"))

    def get_k8s_deployments(self, roles: tuple[WorkerRole, ...]) -> dict[WorkerRole, str]:
        """The Deployment of each of `roles` (kubernetes connector)."""
        names = {
            WorkerRole.PREFILL: self.k8s_prefill_deployment,
            WorkerRole.DECODE: self.k8s_decode_deployment,
            WorkerRole.AGG: self.k8s_agg_deployment,
        }
        return {role: names[role] for role in roles}
