"""Where processes meet and how they talk (discovery, request and event planes), and one
worker process's own place in it."""

from __future__ import annotations

from dataclasses import dataclass

from armature.config.settings import setting
from armature.config.values import (
    int_between,
    listen_host,
    non_negative_float,
    positive_float,
    worker_role,
)
from armature.protocols.worker import WorkerRole

__all__ = ["DEFAULT_LEASE_TTL_S", "LOG_LEVELS", "RuntimeConfig", "WorkerProcessConfig"]

DEFAULT_LEASE_TTL_S = 10.0
LOG_LEVELS = ("debug", "info", "warning", "error")


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
        "file: processes on one host, no server; etcd: many hosts; kubernetes: Pods labelled "
        "armature.dev/namespace=<--namespace>, each carrying its process's registrations in an "
        "annotation and live while Ready (pip install 'armature[kubernetes]')",
        choices=("file", "etcd", "kubernetes"),
    )
    discovery_dir: str | None = setting(
        None, "file discovery's directory (default: under $XDG_RUNTIME_DIR or /tmp, per user)"
    )
    k8s_pod_name: str | None = setting(
        None,
        "kubernetes discovery: this process's own Pod, which carries what it registers (set it "
        "from the downward API, fieldRef metadata.name); none: it can only watch",
    )
    k8s_pods_namespace: str | None = setting(
        None,
        "kubernetes discovery: the namespace of the Pods (default: this Pod's own in a cluster, "
        "else the kubeconfig context's)",
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

    host: str = setting("127.0.0.1", "request-plane address to listen on", parse=listen_host)
    port: int = setting(0, "request-plane port (0: any free)", parse=int_between(0, 65535))
    metrics_port: int = setting(
        0,
        "Prometheus /metrics port on --host (0: any free port; -1: no endpoint)",
        parse=int_between(-1, 65535),
    )
    instance_id: int | None = setting(
        None,
        "64-bit instance id (default: random); the worker is named worker-<hex id>",
        parse=int_between(0, 2**64 - 1),
    )
    role: WorkerRole = setting(
        WorkerRole.AGG,
        "agg: whole requests; prefill: prompts for decode workers (disaggregated serving); "
        "decode: continues from a prefill worker's KV (or prefills itself)",
        parse=worker_role,
        choices=tuple(WorkerRole),
    )
    kv_transfer_port: int = setting(
        0, "KV transfer server port on --host (0: any free port)", parse=int_between(0, 65535)
    )
    shutdown_grace_s: float = setting(
        30.0,
        "on SIGTERM: leave discovery, then give in-flight requests this long to finish",
        parse=non_negative_float,
    )
    log_level: str = setting("info", "log verbosity", choices=LOG_LEVELS)
