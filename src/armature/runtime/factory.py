"""The runtime's parts built from a `RuntimeConfig`: discovery, the event plane and the
request plane's client and server. Build each inside the event loop that uses it; settings
that cannot work (a bad namespace, an unreachable etcd or NATS, refused credentials) are a
ConfigError with one line that says why."""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from armature.config import RuntimeConfig
from armature.errors import ConfigError
from armature.protocols.address import AddressError
from armature.protocols.worker import worker_prefix
from armature.runtime.discovery import Discovery
from armature.runtime.events import EventPlane
from armature.runtime.request_plane import Handler, RequestClient, RequestServer

if TYPE_CHECKING:
    from nats.aio.client import Client

__all__ = [
    "RequestPlaneServerFactory",
    "check_namespace",
    "connect_nats",
    "make_discovery",
    "make_event_plane",
    "make_request_client",
    "open_discovery",
]


def check_namespace(namespace: str) -> None:
    try:
        worker_prefix(namespace)
    except AddressError as exc:
        raise ConfigError(str(exc)) from None


def make_discovery(runtime: RuntimeConfig) -> Discovery:
    """The discovery backend `runtime` asks for, not yet contacted."""
    check_namespace(runtime.namespace)
    if runtime.discovery == "kubernetes":
        return _make_kubernetes_discovery(runtime)
    if runtime.discovery == "file":
        from armature.runtime.discovery_file import FileDiscovery

        try:
            return FileDiscovery(Path(runtime.discovery_dir) if runtime.discovery_dir else None)
        except OSError as exc:
            raise ConfigError(f"cannot use the discovery directory: {exc}") from None
    from armature.runtime.discovery_etcd import EtcdAccess, EtcdDiscovery

    endpoints = [e.strip() for e in runtime.etcd_endpoints.split(",") if e.strip()]
    if not endpoints or not all(e.startswith(("http://", "https://")) for e in endpoints):
        raise ConfigError(f"--etcd-endpoints needs http(s) URLs, got {runtime.etcd_endpoints!r}")
    password = os.environ.get("ARMATURE_ETCD_PASSWORD")
    if runtime.etcd_user is not None and password is None:
        raise ConfigError("--etcd-user needs its password in the env ARMATURE_ETCD_PASSWORD")
    try:
        access = EtcdAccess(
            user=runtime.etcd_user,
            password=password if runtime.etcd_user is not None else None,
            ca_file=runtime.etcd_ca_file,
            cert_file=runtime.etcd_cert_file,
            key_file=runtime.etcd_key_file,
        )
        return EtcdDiscovery(endpoints, access=access)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot use the etcd TLS files: {exc}") from None


def _make_kubernetes_discovery(runtime: RuntimeConfig) -> Discovery:
    from armature.runtime.discovery_kubernetes import FIELD_MANAGER, KubernetesDiscovery
    from armature.runtime.kube_client import make_kube_client
    from armature.runtime.kube_membership import check_label_value

    try:
        check_label_value(runtime.namespace)
    except ValueError as exc:
        raise ConfigError(f"--discovery kubernetes: --namespace {exc}") from None
    client = make_kube_client(
        namespace=runtime.k8s_pods_namespace,
        field_manager=FIELD_MANAGER,
        user="--discovery kubernetes",
    )
    return KubernetesDiscovery(client, runtime.namespace, pod_name=runtime.k8s_pod_name)


async def open_discovery(runtime: RuntimeConfig) -> Discovery:
    """The discovery backend, reached: an unreachable etcd or API server, or refused
    credentials, are a ConfigError."""
    discovery = make_discovery(runtime)
    if runtime.discovery == "kubernetes":
        from armature.runtime.discovery_kubernetes import KubeDiscoveryError, KubernetesDiscovery

        assert isinstance(discovery, KubernetesDiscovery)
        try:
            await discovery.check()
        except KubeDiscoveryError as exc:
            await discovery.close()
            raise ConfigError(str(exc)) from None
    if runtime.discovery == "etcd":
        from armature.runtime.discovery_etcd import EtcdDiscovery, EtcdError

        assert isinstance(discovery, EtcdDiscovery)
        try:
            await discovery.check(worker_prefix(runtime.namespace))
        except EtcdError as exc:
            await discovery.close()
            raise ConfigError(str(exc)) from None
    return discovery


async def make_event_plane(runtime: RuntimeConfig, host: str = "127.0.0.1") -> EventPlane:
    """The event plane, connected. zmq publishers bind on `host`."""
    from armature.runtime.events import NatsEventPlane, ZmqEventPlane
    from armature.runtime.nats_conn import NatsUnavailableError

    if runtime.event_plane == "zmq":
        return ZmqEventPlane(host)
    plane = NatsEventPlane(runtime.nats_url)
    try:
        await plane.connect()
    except NatsUnavailableError as exc:
        raise ConfigError(str(exc)) from None
    return plane


async def connect_nats(runtime: RuntimeConfig) -> Client:
    from armature.runtime.nats_conn import NatsUnavailableError
    from armature.runtime.nats_conn import connect_nats as connect

    try:
        return await connect(runtime.nats_url)
    except NatsUnavailableError as exc:
        raise ConfigError(str(exc)) from None


async def make_request_client(runtime: RuntimeConfig) -> RequestClient:
    """A frontend's request-plane client."""
    if runtime.request_plane == "tcp":
        from armature.runtime.tcp_client import RequestPlaneClient

        return RequestPlaneClient(secret=runtime.plane_secret)
    from armature.runtime.nats_plane import NatsRequestPlaneClient

    return NatsRequestPlaneClient(await connect_nats(runtime))


class RequestPlaneServerFactory:
    """Makes a worker's request-plane server for its handlers: a TCP listener on host:port,
    or a NATS subscription on the worker's subject (connect first with `open`)."""

    def __init__(self, runtime: RuntimeConfig, host: str, port: int, instance_id: int):
        self.runtime = runtime
        self.host = host
        self.port = port
        self.instance_id = instance_id
        self.nats: Client | None = None

    async def open(self) -> None:
        if self.runtime.request_plane == "nats":
            self.nats = await connect_nats(self.runtime)

    def __call__(self, handlers: Mapping[str, Handler]) -> RequestServer:
        if self.nats is not None:
            from armature.runtime.nats_plane import NatsRequestPlaneServer

            subject = f"armature.rp.{self.runtime.namespace}.{self.instance_id:x}"
            return NatsRequestPlaneServer(self.nats, subject, handlers)
        from armature.runtime.tcp_server import RequestPlaneServer

        secret = self.runtime.plane_secret
        return RequestPlaneServer(handlers, self.host, self.port, secret=secret)

    async def close(self) -> None:
        if self.nats is not None:
            await self.nats.drain()
