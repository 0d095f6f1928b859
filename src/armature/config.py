"""The typed configuration tree: one frozen dataclass per concern, built once at startup (by
the CLI) and passed down. Each setting is defined here once, with its default, its unit (in
its name), and its help text; the CLI derives the flag, its `ARMATURE_*` environment variable
and `--help` from that definition (`cli/options.py`), and `to_argv` turns a configuration back
into the command line that rebuilds it.

    ServeConfig ─┬─ EngineConfig, KvCacheConfig, TransferConfig        (what a worker runs)
                 ├─ RouterConfig, DisaggConfig, HealthConfig            (how the frontend routes)
                 └─ HttpConfig, SecurityConfig, OverloadConfig          (the HTTP edge)
    WorkerConfig ── EngineConfig, KvCacheConfig, TransferConfig, RuntimeConfig, WorkerProcessConfig
    FrontendConfig ─ RuntimeConfig, RouterConfig, DisaggConfig, HealthConfig, the edge's three

A field whose metadata has no `Setting` is not a flag (a value the code sets, like the
router's block size, which comes from the workers).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, get_type_hints

from armature.errors import ConfigError
from armature.protocols.worker import WorkerRole

__all__ = [
    "DEFAULT_BLOCK_SIZE_TOKENS",
    "DEFAULT_KV_PIN_TTL_S",
    "DEFAULT_LEASE_TTL_S",
    "TRANSFER_BACKENDS",
    "DisaggConfig",
    "EngineConfig",
    "FrontendConfig",
    "HealthConfig",
    "HttpConfig",
    "KvCacheConfig",
    "OverloadConfig",
    "RouterConfig",
    "RuntimeConfig",
    "SecurityConfig",
    "ServeConfig",
    "Setting",
    "TransferConfig",
    "WorkerConfig",
    "WorkerProcessConfig",
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
    "setting",
    "setting_env_names",
    "to_argv",
    "transfer_backends",
]

DEFAULT_BLOCK_SIZE_TOKENS = 16
DEFAULT_KV_PIN_TTL_S = 30.0
DEFAULT_LEASE_TTL_S = 10.0
TRANSFER_BACKENDS = ("shm", "nixl", "tcp")
LOG_LEVELS = ("debug", "info", "warning", "error")


# ---- value parsers: text -> value, ConfigError naming what was wrong ---------------------
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "m": 1000**2,
    "g": 1000**3,
    "t": 1000**4,
    "ki": 1 << 10,
    "mi": 1 << 20,
    "gi": 1 << 30,
    "ti": 1 << 40,
}


def parse_bytes(text: str) -> int:
    """'1073741824', '1GiB', '512MiB', '2G' -> bytes."""
    match = _SIZE.match(text)
    if not match:
        raise ConfigError(f"not a size: {text!r} (e.g. 2GiB, 512MiB, 1000000)")
    unit = (match.group(2) or "").lower().removesuffix("b")
    value = int(float(match.group(1)) * _UNITS[unit])
    if value <= 0:
        raise ConfigError("size must be positive")
    return value


def _number(text: str, kind: type[int] | type[float], *, allow_zero: bool) -> float:
    try:
        value = kind(text)
    except ValueError:
        noun = "an integer" if kind is int else "a number"
        raise ConfigError(f"not {noun}: {text!r}") from None
    if not (value >= 0 if allow_zero else value > 0):
        bound = ">= 0" if allow_zero else "positive"
        raise ConfigError(f"must be {bound}, got {text.strip()}")
    return value


def positive_int(text: str) -> int:
    return int(_number(text, int, allow_zero=False))


def non_negative_int(text: str) -> int:
    return int(_number(text, int, allow_zero=True))


def positive_float(text: str) -> float:
    return _number(text, float, allow_zero=False)


def non_negative_float(text: str) -> float:
    return _number(text, float, allow_zero=True)


def integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"not an integer: {text!r}") from None


def port(text: str) -> int:
    value = positive_int(text)
    if value > 65535:
        raise ConfigError(f"port must be 1..65535, got {value}")
    return value


def fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"expected a number in 0..1, got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise ConfigError(f"expected a number in 0..1, got {text!r}")
    return value


def worker_role(text: str) -> WorkerRole:
    try:
        return WorkerRole(text)
    except ValueError:
        known = ", ".join(WorkerRole)
        raise ConfigError(f"expected one of {known}, got {text!r}") from None


def transfer_backends(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in TRANSFER_BACKENDS]
    if unknown or "tcp" not in names:
        raise ConfigError(f"expected a comma list of shm,nixl,tcp that includes tcp, got {text!r}")
    return names


# ---- how a field becomes a flag -----------------------------------------------------------
@dataclass(frozen=True)
class Setting:
    """A field's one definition as a command-line setting.

    The flag is `--<field name with dashes>` unless `flag` names it; the environment variable
    is `ARMATURE_<flag name in capitals>` unless `env` names it. `parse` turns the flag's text
    into the value (str when None); `choices` limits it. A bool field is a switch: present sets
    it to True, or to False with `negate`. `repeat`: the flag may be given several times
    (a tuple of values; its variable holds a comma list). `secret`: never on a command line
    (`to_argv` leaves it out; pass it in the environment)."""

    help: str
    flag: str | None = None
    env: str | None = None
    parse: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | None = None
    negate: bool = False
    repeat: bool = False
    secret: bool = False


def setting(default: Any, help: str, **kwargs: Any) -> Any:
    """A dataclass field that is also a command-line setting (see `Setting`)."""
    return field(default=default, metadata={"setting": Setting(help, **kwargs)})


# ---- engines ------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """What model a worker runs, on which engine, with what batch limits."""

    model: str | None = setting(
        None,
        "local HF directory, ORG/NAME in the local HF cache, or omitted for the embedded "
        "SmolLM2-135M-Instruct",
    )
    engine: str = setting(
        "torch",
        "torch: the native PyTorch engine; mocker: the same scheduler and KV cache with a "
        "timing model instead of a model (no weights loaded); vllm: vLLM's engine (needs pip "
        "install 'armature[vllm]')",
    )
    served_model_name: str | None = setting(
        None, "name clients pass as `model` (default: derived from --model)"
    )
    speedup_ratio: float = setting(
        1.0, "mocker only: divide every simulated step time by this", parse=positive_float
    )
    dtype: str = setting(
        "auto",
        "weights and KV dtype; auto = bfloat16 where supported",
        choices=("auto", "float32", "bfloat16", "float16"),
    )
    device: str = setting(
        "auto", "auto = cuda where present, else cpu", choices=("auto", "cpu", "cuda")
    )
    block_size_tokens: int | None = setting(
        None,
        f"tokens per KV block (default: {DEFAULT_BLOCK_SIZE_TOKENS}; vllm: its platform's, 128 "
        "on CPU, where it must be a multiple of 32)",
        flag="block-size",
        parse=positive_int,
    )
    enforce_eager: bool = setting(
        False,
        "vllm only: skip torch.compile (vLLM then starts in ~45 s instead of ~2 min on 2 CPU "
        "cores, and runs slower)",
    )
    max_num_seqs: int = setting(64, "requests running at once", parse=positive_int)
    max_num_batched_tokens: int = setting(
        1024, "tokens per engine step (prefill chunk budget)", parse=positive_int
    )
    max_model_len_tokens: int | None = setting(
        None, "context length (default: the model's)", flag="max-model-len", parse=positive_int
    )
    seed: int = setting(0, "seed for requests that bring none", parse=integer)
    cache_dir: str | None = setting(
        None, "where the default model is converted (default: the XDG cache)"
    )

    def get_block_size_tokens(self) -> int:
        """The block size a native or mocker engine uses."""
        return self.block_size_tokens or DEFAULT_BLOCK_SIZE_TOKENS


@dataclass(frozen=True, kw_only=True)
class KvCacheConfig:
    """The engine's own KV cache (G1)."""

    kv_cache_bytes: int = setting(
        1 << 30, "KV cache capacity in bytes (e.g. 2GiB)", parse=parse_bytes
    )
    num_kv_blocks: int | None = setting(
        None, "KV cache capacity in blocks (overrides --kv-cache-bytes)", parse=positive_int
    )
    enable_prefix_caching: bool = setting(
        True, "disable prefix caching", flag="no-prefix-caching", negate=True
    )


@dataclass(frozen=True, kw_only=True)
class TransferConfig:
    """KV transfer between prefill and decode workers."""

    kv_transfer_backends: tuple[str, ...] = setting(
        ("shm", "tcp"),
        "KV transfer backends to offer and use, best first: shm (same host, CPU KV cache), "
        "nixl (pip install 'armature[nixl]'; UCX, any host) and tcp (any host; always on: it "
        "also carries the control messages)",
        parse=transfer_backends,
    )
    kv_pin_ttl_s: float = setting(
        DEFAULT_KV_PIN_TTL_S,
        "a prefill worker frees a prompt's pinned KV blocks after this long if no decode "
        "worker released them",
        parse=positive_float,
    )


# ---- the distributed runtime -----------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class RuntimeConfig:
    """Where processes meet (discovery) and how they talk (request and event planes)."""

    plane_secret: str | None = setting(
        None,
        "a shared secret every frontend and worker must present on the TCP request plane and "
        "for KV transfers (prefer the environment variable: flags show in ps)",
        secret=True,
    )
    namespace: str = setting("armature", "workers and frontends meet within a namespace")
    discovery: str = setting(
        "file",
        "file: processes on one host, no server; etcd: many hosts",
        choices=("file", "etcd"),
    )
    discovery_dir: str | None = setting(
        None, "file discovery's directory (default: under $XDG_RUNTIME_DIR or /tmp, per user)"
    )
    etcd_endpoints: str = setting("http://127.0.0.1:2379", "comma-separated etcd client URLs")
    etcd_user: str | None = setting(
        None, "etcd user, with its password in the env ARMATURE_ETCD_PASSWORD"
    )
    etcd_ca_file: str | None = setting(
        None,
        "CA bundle that signed etcd's certificate, for https endpoints (default: the system's CAs)",
    )
    etcd_cert_file: str | None = setting(
        None, "client certificate for etcd's --client-cert-auth (with --etcd-key-file)"
    )
    etcd_key_file: str | None = setting(None, "the client certificate's private key")
    request_plane: str = setting(
        "tcp", "requests and token streams: tcp (direct) or nats", choices=("tcp", "nats")
    )
    event_plane: str = setting(
        "zmq", "KV events and load: zmq (no server) or nats", choices=("zmq", "nats")
    )
    nats_url: str = setting("nats://127.0.0.1:4222", "NATS server for the nats planes")
    lease_ttl_s: float = setting(
        DEFAULT_LEASE_TTL_S,
        "a crashed process leaves discovery within this many seconds",
        parse=positive_float,
    )


@dataclass(frozen=True, kw_only=True)
class WorkerProcessConfig:
    """One `armature worker` process: where it listens and what part it plays."""

    host: str = setting("127.0.0.1", "request-plane address to listen on")
    port: int = setting(0, "request-plane port (0: any free)", parse=non_negative_int)
    metrics_port: int = setting(
        0, "Prometheus /metrics port on --host (0: any free port; -1: no endpoint)", parse=integer
    )
    instance_id: int | None = setting(
        None,
        "64-bit instance id (default: random); the worker is named worker-<hex id>",
        parse=integer,
    )
    role: WorkerRole = setting(
        WorkerRole.AGG,
        "agg: whole requests; prefill: prompts for decode workers (disaggregated serving); "
        "decode: continues from a prefill worker's KV (or prefills itself)",
        parse=worker_role,
        choices=tuple(WorkerRole),
    )
    kv_transfer_port: int = setting(
        0, "KV transfer server port on --host (0: any free port)", parse=integer
    )
    shutdown_grace_s: float = setting(
        30.0,
        "on SIGTERM: leave discovery, then give in-flight requests this long to finish",
        parse=non_negative_float,
    )
    log_level: str = setting("info", "log verbosity", choices=LOG_LEVELS)


# ---- routing ------------------------------------------------------------------------------
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
        1.0,
        "kv router: weight of a worker's active blocks in the cost (1: the DESIGN baseline; "
        "lower favours cache affinity over spreading memory load)",
        flag="kv-decode-weight",
        parse=non_negative_float,
    )
    temperature: float = setting(
        0.0,
        "kv router: 0 picks the cheapest worker, above 0 samples by softmax",
        flag="router-temperature",
        parse=non_negative_float,
    )
    migration_limit: int = setting(
        3,
        "times a request moves to another worker (with its tokens so far) when its worker "
        "dies mid-stream; 0 fails it instead",
        parse=non_negative_int,
    )
    block_size_tokens: int = DEFAULT_BLOCK_SIZE_TOKENS
    seed: int = 0
    # KV events are pulled from the engines every event_sync_interval_s while they flow or
    # requests are being routed; after rounds that found none the wait doubles, up to
    # event_sync_idle_interval_s (a 5 ms poll alone costs ~3% of a core, which the model's
    # steps pay for on a small CPU machine)
    event_sync_interval_s: float = 0.005
    event_sync_idle_interval_s: float = 0.025
    routed_ttl_s: float = 120.0  # how long a routing decision counts as a cached prefix
    failover_wait_s: float = 10.0  # how long a failed-over request waits for a live worker


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


# ---- the HTTP edge ------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class HttpConfig:
    """The HTTP server: where it listens, what it accepts, how it stops."""

    host: str = setting("127.0.0.1", "address to listen on")
    port: int = setting(8000, "port to listen on", parse=port)
    max_request_bytes: int = setting(
        8 << 20, "refuse request bodies larger than this with 413 (e.g. 8MiB)", parse=parse_bytes
    )
    shutdown_grace_s: float = setting(
        30.0,
        "on SIGTERM: stop accepting, then give in-flight requests this long to finish",
        parse=non_negative_float,
    )
    log_level: str = setting("info", "log verbosity", choices=LOG_LEVELS)


@dataclass(frozen=True, kw_only=True)
class SecurityConfig:
    """Who may call the API."""

    api_keys: tuple[str, ...] = setting(
        (),
        "require 'Authorization: Bearer KEY' on the API (repeatable; its variable holds a "
        "comma list). /health and /live stay open",
        flag="api-key",
        env="ARMATURE_API_KEYS",
        repeat=True,
        secret=True,
    )
    api_key_file: str | None = setting(None, "a file of API keys, one per line, # comments")
    protect_metrics: bool = setting(
        False, "with API keys, /metrics needs a key too (default: open for scrapers)"
    )


@dataclass(frozen=True, kw_only=True)
class OverloadConfig:
    """Overload control; changeable at runtime through /admin/overload."""

    busy_kv_usage: float | None = setting(
        None,
        "overload control: a worker whose KV usage reaches this (0..1) is busy; when every "
        "worker is busy, requests queue (default: no KV threshold)",
        parse=fraction,
    )
    busy_prefill_tokens: int | None = setting(
        None,
        "overload control: a worker with this many prompt tokens waiting is busy",
        parse=positive_int,
    )
    max_queued_requests: int = setting(
        256,
        "overload control: requests that may wait for a free worker; more get 503",
        parse=non_negative_int,
    )
    queue_timeout_s: float = setting(
        30.0,
        "overload control: a request waiting longer gets 503 with Retry-After",
        parse=positive_float,
    )

    @property
    def enabled(self) -> bool:
        return self.busy_kv_usage is not None or self.busy_prefill_tokens is not None


# ---- commands -----------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class WorkerConfig:
    """`armature worker`: everything one worker process needs; `to_argv` rebuilds its
    command line (how `serve` starts its workers)."""

    engine: EngineConfig = EngineConfig()
    kv: KvCacheConfig = KvCacheConfig()
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
    http: HttpConfig = HttpConfig()
    security: SecurityConfig = SecurityConfig()
    overload: OverloadConfig = OverloadConfig()
    wait_for_workers_s: float = setting(
        600.0,
        "how long to wait for the first worker (it tells the model and tokenizer)",
        parse=positive_float,
    )
    seed: int = setting(0, "router seed", parse=integer)


@dataclass(frozen=True, kw_only=True)
class ServeConfig:
    """`armature serve`: a frontend and its workers, in this process or as child processes."""

    workers: int = setting(
        1,
        "worker engines: one runs in this process; more run as worker processes behind this "
        "frontend (see --in-process-workers)",
        parse=positive_int,
    )
    in_process_workers: bool = setting(
        False, "run every worker engine in this process (cheap mocker fleets, tests)"
    )
    prefill_workers: int | None = setting(
        None,
        "disaggregated serving: prefill workers (with --decode-workers; replaces --workers)",
        parse=non_negative_int,
    )
    decode_workers: int | None = setting(
        None, "disaggregated serving: decode workers", parse=positive_int
    )
    engine: EngineConfig = EngineConfig()
    kv: KvCacheConfig = KvCacheConfig()
    transfer: TransferConfig = TransferConfig()
    router: RouterConfig = RouterConfig()
    disagg: DisaggConfig = DisaggConfig()
    health: HealthConfig = HealthConfig()
    http: HttpConfig = HttpConfig()
    security: SecurityConfig = SecurityConfig()
    overload: OverloadConfig = OverloadConfig()

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


# ---- settings as flags, variables and command lines ---------------------------------------
def flag_name(field_name: str, setting: Setting) -> str:
    """The flag without its dashes: `max_num_seqs` -> `max-num-seqs`."""
    return setting.flag or field_name.replace("_", "-")


def env_name(field_name: str, setting: Setting) -> str:
    """The environment variable: `max_num_seqs` -> `ARMATURE_MAX_NUM_SEQS`."""
    return setting.env or "ARMATURE_" + flag_name(field_name, setting).replace("-", "_").upper()


def iter_settings(
    config_type: type[Any], path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], dataclasses.Field[Any], Setting]]:
    """Every setting of `config_type` and its sections, depth first: (field path, field,
    setting). A field whose type is a config dataclass is a section, not a setting."""
    hints = get_type_hints(config_type)
    for f in dataclasses.fields(config_type):
        kind = hints[f.name]
        if isinstance(kind, type) and dataclasses.is_dataclass(kind):
            yield from iter_settings(kind, (*path, f.name))
        elif "setting" in f.metadata:
            yield (*path, f.name), f, f.metadata["setting"]


def get_setting_value(config: Any, path: tuple[str, ...]) -> Any:
    """The value at a field path (`("engine", "max_num_seqs")`) of a config."""
    for name in path:
        config = getattr(config, name)
    return config


def setting_env_names(config_type: type[Any]) -> set[str]:
    """The environment variables every setting of `config_type` reads."""
    return {env_name(f.name, s) for _, f, s in iter_settings(config_type)}


def to_argv(config: Any) -> list[str]:
    """The flags that rebuild `config` from its type's defaults: every setting whose value
    differs, secrets left out (pass them in the environment). Parsing the result with the
    command's flags gives back `config` (a test checks every field)."""
    defaults = type(config)()
    argv: list[str] = []
    for path, f, setting in iter_settings(type(config)):
        value = get_setting_value(config, path)
        if value == get_setting_value(defaults, path) or setting.secret:
            continue
        flag = f"--{flag_name(f.name, setting)}"
        if isinstance(f.default, bool):
            if value is not setting.negate:  # the flag sets what a non-default needs
                argv.append(flag)
                continue
            raise ConfigError(f"{flag} cannot be turned off on a command line")
        if value is None:
            raise ConfigError(f"{flag} cannot be reset to its default on a command line")
        if setting.repeat:
            for item in value:
                argv += [flag, str(item)]
        elif isinstance(value, tuple):
            argv += [flag, ",".join(str(item) for item in value)]
        else:
            argv += [flag, str(value)]
    return argv
