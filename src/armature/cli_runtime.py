"""Runtime flags (namespace, discovery backend) shared by `armature worker`, `armature
frontend` and `armature serve`."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from armature.cli_args import CliError, positive_float
from armature.protocols.address import AddressError
from armature.protocols.worker import worker_prefix
from armature.runtime.discovery import DEFAULT_LEASE_TTL_S, Discovery
from armature.runtime.events import EventPlane
from armature.runtime.request_plane import RequestClient

if TYPE_CHECKING:
    from nats.aio.client import Client

__all__ = [
    "add_runtime_args",
    "connect_nats_or_exit",
    "make_discovery",
    "make_event_plane",
    "make_request_client",
    "open_discovery",
]


def add_runtime_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--plane-secret",
        default=os.environ.get("ARMATURE_PLANE_SECRET"),
        help="a shared secret every frontend and worker must present on the TCP request plane "
        "and for KV transfers (prefer the env ARMATURE_PLANE_SECRET: flags show in ps)",
    )
    parser.add_argument(
        "--namespace",
        default=os.environ.get("ARMATURE_NAMESPACE", "armature"),
        help="workers and frontends meet within a namespace (env ARMATURE_NAMESPACE)",
    )
    parser.add_argument(
        "--discovery",
        choices=["file", "etcd"],
        default=os.environ.get("ARMATURE_DISCOVERY", "file"),
        help="file: processes on one host, no server; etcd: many hosts (env ARMATURE_DISCOVERY)",
    )
    parser.add_argument(
        "--discovery-dir",
        default=os.environ.get("ARMATURE_DISCOVERY_DIR"),
        help="file discovery's directory (default: under $XDG_RUNTIME_DIR or /tmp, per user)",
    )
    parser.add_argument(
        "--etcd-endpoints",
        default=os.environ.get("ARMATURE_ETCD_ENDPOINTS", "http://127.0.0.1:2379"),
        help="comma-separated etcd client URLs (env ARMATURE_ETCD_ENDPOINTS)",
    )
    parser.add_argument(
        "--etcd-user",
        default=os.environ.get("ARMATURE_ETCD_USER"),
        help="etcd user, with its password in the env ARMATURE_ETCD_PASSWORD (env "
        "ARMATURE_ETCD_USER)",
    )
    parser.add_argument(
        "--etcd-ca-file",
        default=os.environ.get("ARMATURE_ETCD_CA_FILE"),
        help="CA bundle that signed etcd's certificate, for https endpoints (default: the "
        "system's CAs)",
    )
    parser.add_argument(
        "--etcd-cert-file",
        default=os.environ.get("ARMATURE_ETCD_CERT_FILE"),
        help="client certificate for etcd's --client-cert-auth (with --etcd-key-file)",
    )
    parser.add_argument(
        "--etcd-key-file",
        default=os.environ.get("ARMATURE_ETCD_KEY_FILE"),
        help="the client certificate's private key",
    )
    parser.add_argument(
        "--request-plane",
        choices=["tcp", "nats"],
        default=os.environ.get("ARMATURE_REQUEST_PLANE", "tcp"),
        help="requests and token streams: tcp (direct) or nats (env ARMATURE_REQUEST_PLANE)",
    )
    parser.add_argument(
        "--event-plane",
        choices=["zmq", "nats"],
        default=os.environ.get("ARMATURE_EVENT_PLANE", "zmq"),
        help="KV events and load: zmq (no server) or nats (env ARMATURE_EVENT_PLANE)",
    )
    parser.add_argument(
        "--nats-url",
        default=os.environ.get("ARMATURE_NATS_URL", "nats://127.0.0.1:4222"),
        help="NATS server for the nats planes (env ARMATURE_NATS_URL)",
    )
    parser.add_argument(
        "--lease-ttl-s",
        type=positive_float,
        default=DEFAULT_LEASE_TTL_S,
        help="a crashed process leaves discovery within this many seconds",
    )


def check_namespace(namespace: str) -> None:
    try:
        worker_prefix(namespace)
    except AddressError as exc:
        raise CliError(str(exc)) from None


async def open_discovery(args: argparse.Namespace) -> Discovery:
    """The discovery backend the flags ask for, reached (inside the loop that uses it): an
    unreachable etcd or refused credentials are a CliError."""
    discovery = make_discovery(args)
    if args.discovery == "etcd":
        from armature.runtime.discovery_etcd import EtcdDiscovery, EtcdError

        assert isinstance(discovery, EtcdDiscovery)
        try:
            await discovery.check(worker_prefix(args.namespace))
        except EtcdError as exc:
            await discovery.close()
            raise CliError(str(exc)) from None
    return discovery


def make_discovery(args: argparse.Namespace) -> Discovery:
    """The discovery backend the flags ask for (create it inside the loop that uses it)."""
    check_namespace(args.namespace)
    if args.discovery == "file":
        from armature.runtime.discovery_file import FileDiscovery

        try:
            return FileDiscovery(Path(args.discovery_dir) if args.discovery_dir else None)
        except OSError as exc:
            raise CliError(f"cannot use the discovery directory: {exc}") from None
    import ssl

    from armature.runtime.discovery_etcd import EtcdAccess, EtcdDiscovery

    endpoints = [e.strip() for e in args.etcd_endpoints.split(",") if e.strip()]
    if not endpoints or not all(e.startswith(("http://", "https://")) for e in endpoints):
        raise CliError(f"--etcd-endpoints needs http(s) URLs, got {args.etcd_endpoints!r}")
    password = os.environ.get("ARMATURE_ETCD_PASSWORD")
    if args.etcd_user is not None and password is None:
        raise CliError("--etcd-user needs its password in the env ARMATURE_ETCD_PASSWORD")
    try:
        access = EtcdAccess(
            user=args.etcd_user,
            password=password if args.etcd_user is not None else None,
            ca_file=args.etcd_ca_file,
            cert_file=args.etcd_cert_file,
            key_file=args.etcd_key_file,
        )
        return EtcdDiscovery(endpoints, access=access)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    except (OSError, ssl.SSLError) as exc:
        raise CliError(f"cannot use the etcd TLS files: {exc}") from None


async def make_event_plane(args: argparse.Namespace, host: str = "127.0.0.1") -> EventPlane:
    """The event plane the flags ask for, connected (create it inside the loop that uses it).
    zmq publishers bind on `host`."""
    from armature.runtime.events import NatsEventPlane, ZmqEventPlane
    from armature.runtime.nats_conn import NatsUnavailableError

    if args.event_plane == "zmq":
        return ZmqEventPlane(host)
    plane = NatsEventPlane(args.nats_url)
    try:
        await plane.connect()
    except NatsUnavailableError as exc:
        raise CliError(str(exc)) from None
    return plane


async def connect_nats_or_exit(args: argparse.Namespace) -> Client:
    from armature.runtime.nats_conn import NatsUnavailableError, connect_nats

    try:
        return await connect_nats(args.nats_url)
    except NatsUnavailableError as exc:
        raise CliError(str(exc)) from None


async def make_request_client(args: argparse.Namespace) -> RequestClient:
    """The frontend's request-plane client for the flags (inside the loop that uses it)."""
    if args.request_plane == "tcp":
        from armature.runtime.tcp_client import RequestPlaneClient

        return RequestPlaneClient(secret=args.plane_secret)
    from armature.runtime.nats_plane import NatsRequestPlaneClient

    return NatsRequestPlaneClient(await connect_nats_or_exit(args))
