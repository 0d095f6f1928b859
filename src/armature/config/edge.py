"""The HTTP edge: the server, who may call it, and overload control."""

from __future__ import annotations

from dataclasses import dataclass

from armature.config.runtime import LOG_LEVELS
from armature.config.settings import setting
from armature.config.values import (
    api_key,
    float_at_most,
    fraction,
    int_between,
    listen_host,
    non_negative_float,
    parse_bytes,
    port,
    positive_float,
)

__all__ = [
    "MAX_QUEUED_REQUESTS",
    "MAX_QUEUE_TIMEOUT_S",
    "HttpConfig",
    "OverloadConfig",
    "SecurityConfig",
    "SloConfig",
]

# Bounds of the overload settings, on the command line and at /admin/overload alike.
MAX_QUEUED_REQUESTS = 1_000_000
MAX_QUEUE_TIMEOUT_S = 3600.0


@dataclass(frozen=True, kw_only=True)
class HttpConfig:
    """The HTTP server: where it listens, what it accepts, how it stops."""

    host: str = setting("127.0.0.1", "address to listen on", parse=listen_host)
    port: int = setting(8000, "port to listen on", parse=port)
    reuse_port: bool = setting(
        False,
        "listen with SO_REUSEPORT, so that several frontends on this host share --port (the "
        "kernel spreads connections over them); `serve --frontends` sets it for its replicas",
    )
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
        parse=api_key,
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
        parse=int_between(1, 2**31 - 1),
    )
    max_queued_requests: int = setting(
        256,
        "overload control: requests that may wait for a free worker; more get 503",
        parse=int_between(0, MAX_QUEUED_REQUESTS),
    )
    queue_timeout_s: float = setting(
        30.0,
        "overload control: a request waiting longer gets 503 with Retry-After",
        parse=float_at_most(MAX_QUEUE_TIMEOUT_S),
    )

    @property
    def enabled(self) -> bool:
        return self.busy_kv_usage is not None or self.busy_prefill_tokens is not None


@dataclass(frozen=True, kw_only=True)
class SloConfig:
    """Targets each finished request is judged against (`armature_slo_requests_total`, met or
    missed): the planner reads its measured attainment from it. None: not judged by that
    target; neither: no request is judged."""

    ttft_ms: float | None = setting(
        None,
        "judge each request's time to first token against this target, ms (met when within "
        "it and within --slo-itl-ms); set it as the planner's --ttft-ms",
        flag="slo-ttft-ms",
        parse=positive_float,
    )
    itl_ms: float | None = setting(
        None,
        "judge each request's mean inter-token latency against this target, ms; set it as "
        "the planner's --itl-ms",
        flag="slo-itl-ms",
        parse=positive_float,
    )

    @property
    def enabled(self) -> bool:
        return self.ttft_ms is not None or self.itl_ms is not None
