"""The typed configuration tree: one frozen dataclass per concern, built once at startup (by
the CLI) and passed down. Each setting is defined once, in this package, with its default,
its unit (in its name) and its help text; the CLI derives the flag, its `ARMATURE_*`
variable and `--help` from that definition (`cli/options.py`), and `to_argv` turns a
configuration back into the command line that rebuilds it.

    ServeConfig ─┬─ EngineConfig, KvCacheConfig, KvTierConfig, TransferConfig  (a worker)
                 ├─ RouterConfig, DisaggConfig, HealthConfig            (how the frontend routes)
                 ├─ ReplicaConfig             (frontend replicas: --frontends, shared load)
                 ├─ HttpConfig, SecurityConfig, OverloadConfig          (the HTTP edge)
                 ├─ ChatConfig                 (chat template, tool-call and reasoning parsers)
                 └─ ResponsesConfig            (the Responses API's store of responses)
    WorkerConfig ── EngineConfig, KvCacheConfig, KvTierConfig, TransferConfig, RuntimeConfig,
                    WorkerProcessConfig
    FrontendConfig ─ RuntimeConfig, RouterConfig, DisaggConfig, HealthConfig, ReplicaConfig,
                     the edge's three, ChatConfig, ResponsesConfig
    PlannerCommandConfig ─ PlannerConfig, PlannerServiceConfig, RuntimeConfig
    ProfileConfig ── EngineConfig, KvCacheConfig, ProfileSweepConfig

    values.py    text -> value parsers           settings.py  Setting, flags, variables, to_argv
    engine.py    engine, KV cache, transfer      runtime.py   planes, discovery, one worker
    routing.py   router, disaggregation, health, replicas   edge.py   HTTP, API keys, overload
    chat.py      chat template, output parsers
    responses.py the Responses API's store (size, TTL)
    kv_tiers.py  lower KV tiers (G2-G4)         commands.py  WorkerConfig, FrontendConfig, ...
    planner.py   the planner's targets, predictor, limits, cool-downs; its service's settings
    profiling.py the profiler's sweep
    configure.py `armature configure`: model, system, workload, targets, search space

A field whose metadata has no `Setting` is not a flag (a value the code sets, like the
router's block size, which comes from the workers).
"""

from __future__ import annotations

from armature.config.chat import ChatConfig
from armature.config.commands import (
    FrontendConfig,
    PlannerCommandConfig,
    ProfileConfig,
    ServeConfig,
    WorkerConfig,
)
from armature.config.configure import ConfigureConfig
from armature.config.edge import HttpConfig, OverloadConfig, SecurityConfig, SloConfig
from armature.config.engine import (
    DEFAULT_BLOCK_SIZE_TOKENS,
    DEFAULT_KV_PIN_TTL_S,
    EngineConfig,
    KvCacheConfig,
    TransferConfig,
)
from armature.config.kv_tiers import KvTierConfig
from armature.config.planner import PlannerConfig, PlannerServiceConfig
from armature.config.profiling import ProfileSweepConfig
from armature.config.responses import ResponsesConfig
from armature.config.routing import DisaggConfig, HealthConfig, ReplicaConfig, RouterConfig
from armature.config.runtime import DEFAULT_LEASE_TTL_S, RuntimeConfig, WorkerProcessConfig
from armature.config.settings import (
    Setting,
    env_name,
    flag_name,
    get_setting_value,
    iter_settings,
    setting,
    setting_env_names,
    to_argv,
)
from armature.config.values import (
    TRANSFER_BACKENDS,
    at_least_one,
    fraction,
    non_negative_float,
    non_negative_int,
    parse_bytes,
    port,
    positive_float,
    positive_int,
    positive_ints,
    transfer_backends,
)

__all__ = [
    "DEFAULT_BLOCK_SIZE_TOKENS",
    "DEFAULT_KV_PIN_TTL_S",
    "DEFAULT_LEASE_TTL_S",
    "TRANSFER_BACKENDS",
    "ChatConfig",
    "ConfigureConfig",
    "DisaggConfig",
    "EngineConfig",
    "FrontendConfig",
    "HealthConfig",
    "HttpConfig",
    "KvCacheConfig",
    "KvTierConfig",
    "OverloadConfig",
    "PlannerCommandConfig",
    "PlannerConfig",
    "PlannerServiceConfig",
    "ProfileConfig",
    "ProfileSweepConfig",
    "ReplicaConfig",
    "ResponsesConfig",
    "RouterConfig",
    "RuntimeConfig",
    "SecurityConfig",
    "ServeConfig",
    "Setting",
    "SloConfig",
    "TransferConfig",
    "WorkerConfig",
    "WorkerProcessConfig",
    "at_least_one",
    "env_name",
    "flag_name",
    "fraction",
    "get_setting_value",
    "iter_settings",
    "non_negative_float",
    "non_negative_int",
    "parse_bytes",
    "port",
    "positive_float",
    "positive_int",
    "positive_ints",
    "setting",
    "setting_env_names",
    "to_argv",
    "transfer_backends",
]
