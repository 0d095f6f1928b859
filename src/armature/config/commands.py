"""One configuration per command, made of the sections it takes (`to_argv` of a
`WorkerConfig` is how `serve` starts its workers)."""

from __future__ import annotations

from dataclasses import dataclass

from armature.config.chat import ChatConfig
from armature.config.edge import HttpConfig, OverloadConfig, SecurityConfig, SloConfig
from armature.config.engine import EngineConfig, KvCacheConfig, TransferConfig
from armature.config.kv_tiers import KvTierConfig
from armature.config.planner import PlannerConfig, PlannerServiceConfig
from armature.config.profiling import ProfileSweepConfig
from armature.config.responses import ResponsesConfig
from armature.config.routing import DisaggConfig, HealthConfig, ReplicaConfig, RouterConfig
from armature.config.runtime import RuntimeConfig, WorkerProcessConfig
from armature.config.settings import setting
from armature.config.values import (
    int64,
    int_between,
    non_negative_int,
    positive_float,
    positive_int,
)
from armature.errors import ConfigError
from armature.protocols.worker import WorkerRole

__all__ = ["FrontendConfig", "PlannerCommandConfig", "ProfileConfig", "ServeConfig", "WorkerConfig"]


@dataclass(frozen=True, kw_only=True)
class WorkerConfig:
    """`armature worker`: everything one worker process needs; `to_argv` rebuilds its
    command line (how `serve` starts its workers)."""

    engine: EngineConfig = EngineConfig()
    kv: KvCacheConfig = KvCacheConfig()
    tiers: KvTierConfig = KvTierConfig()
    transfer: TransferConfig = TransferConfig()
    runtime: RuntimeConfig = RuntimeConfig()
    process: WorkerProcessConfig = WorkerProcessConfig()


@dataclass(frozen=True, kw_only=True)
class FrontendConfig:
    """`armature frontend`."""

    runtime: RuntimeConfig = RuntimeConfig()
    router: RouterConfig = RouterConfig(policy="kv")
    disagg: DisaggConfig = DisaggConfig()
    health: HealthConfig = HealthConfig()
    replicas: ReplicaConfig = ReplicaConfig()
    http: HttpConfig = HttpConfig()
    security: SecurityConfig = SecurityConfig()
    overload: OverloadConfig = OverloadConfig()
    chat: ChatConfig = ChatConfig()
    responses: ResponsesConfig = ResponsesConfig()
    slo: SloConfig = SloConfig()
    served_model_name: str = setting(
        "",
        "the model this frontend serves: its workers' --served-model-name (empty: the one "
        "model the namespace's workers serve; where they serve several, name one)",
    )
    wait_for_workers_s: float = setting(
        600.0,
        "how long to wait for the first worker (it tells the model and tokenizer)",
        parse=positive_float,
    )
    seed: int = setting(0, "router seed", parse=int64)


@dataclass(frozen=True, kw_only=True)
class ServeConfig:
    """`armature serve`: a frontend and its workers, in this process or as child processes."""

    workers: int = setting(
        1,
        "worker engines: one runs in this process; more run as worker processes behind this "
        "frontend (see --in-process-workers, --worker-processes)",
        parse=positive_int,
    )
    in_process_workers: bool = setting(
        False, "run every worker engine in this process (cheap mocker fleets, tests)"
    )
    worker_processes: bool = setting(
        False,
        "run a lone worker as a process too: its engine then steps on an interpreter of its "
        "own instead of sharing the frontend's",
    )
    frontends: int = setting(
        1,
        "frontend processes serving --port together (SO_REUSEPORT), sharing their in-flight "
        "load for routing; more than one runs the workers as processes",
        parse=positive_int,
    )
    prefill_workers: int | None = setting(
        None,
        "disaggregated serving: prefill workers (with --decode-workers; replaces --workers)",
        parse=non_negative_int,
    )
    decode_workers: int | None = setting(
        None,
        "disaggregated serving: decode workers (alone, or with --prefill-workers 0: they "
        "prefill their own prompts until prefill workers join)",
        parse=positive_int,
    )
    engine: EngineConfig = EngineConfig()
    kv: KvCacheConfig = KvCacheConfig()
    tiers: KvTierConfig = KvTierConfig()
    transfer: TransferConfig = TransferConfig()
    router: RouterConfig = RouterConfig()
    disagg: DisaggConfig = DisaggConfig()
    health: HealthConfig = HealthConfig()
    replicas: ReplicaConfig = ReplicaConfig()
    http: HttpConfig = HttpConfig()
    security: SecurityConfig = SecurityConfig()
    overload: OverloadConfig = OverloadConfig()
    chat: ChatConfig = ChatConfig()
    responses: ResponsesConfig = ResponsesConfig()
    slo: SloConfig = SloConfig()

    def get_worker_roles(self) -> list[WorkerRole]:
        """The role of each worker, from --workers or --prefill/--decode-workers."""
        if self.prefill_workers is None and self.decode_workers is None:
            return [WorkerRole.AGG] * self.workers
        if self.decode_workers is None:
            raise ConfigError("--prefill-workers needs --decode-workers")
        if self.workers != 1:
            raise ConfigError("give either --workers or --prefill-workers/--decode-workers")
        num_prefill = self.prefill_workers or 0
        return [WorkerRole.PREFILL] * num_prefill + [WorkerRole.DECODE] * self.decode_workers


@dataclass(frozen=True, kw_only=True)
class PlannerCommandConfig:
    """`armature planner`: the planner's targets and limits, its service, and the runtime its
    workers meet on (discovery, event plane)."""

    planner: PlannerConfig = PlannerConfig()
    service: PlannerServiceConfig = PlannerServiceConfig()
    runtime: RuntimeConfig = RuntimeConfig()


@dataclass(frozen=True, kw_only=True)
class ProfileConfig:
    """`armature profile`: one engine alone, swept, written as a timing profile."""

    engine: EngineConfig = EngineConfig()
    kv: KvCacheConfig = KvCacheConfig()
    sweep: ProfileSweepConfig = ProfileSweepConfig()
    output: str = setting(
        "timing_profile.json",
        "write the timing profile (JSON) here",
        flag="output",
        env="ARMATURE_PROFILE_OUTPUT",
    )
    report_dir: str | None = setting(
        None,
        "write plots (PNG) of the profile into this directory",
        flag="report",
        env="ARMATURE_PROFILE_REPORT",
    )
    engines_at_once: int = setting(
        1,
        "profile this many engines at once, each in a process of its own, and keep each "
        "point's median over them: the step times each worker of a deployment of that many "
        "on this host sees (they share its memory bandwidth and caches)",
        flag="engines-at-once",
        env="ARMATURE_PROFILE_ENGINES_AT_ONCE",
        parse=int_between(1, 64),  # a host's accelerators (or cores): more is a typo
    )
