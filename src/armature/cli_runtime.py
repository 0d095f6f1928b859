"""Runtime flags (namespace, discovery backend) shared by `armature worker`, `armature
frontend` and `armature serve`."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from armature.cli_args import CliError, positive_float
from armature.runtime.address import AddressError, EndpointAddress
from armature.runtime.discovery import DEFAULT_LEASE_TTL_S, Discovery

__all__ = ["add_runtime_args", "make_discovery"]


def add_runtime_args(parser: argparse.ArgumentParser) -> None:
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
        "--lease-ttl-s",
        type=positive_float,
        default=DEFAULT_LEASE_TTL_S,
        help="a crashed process leaves discovery within this many seconds",
    )


def check_namespace(namespace: str) -> None:
    try:
        EndpointAddress(namespace, "worker", "generate")
    except AddressError as exc:
        raise CliError(str(exc)) from None


def make_discovery(args: argparse.Namespace) -> Discovery:
    """The discovery backend the flags ask for (create it inside the loop that uses it)."""
    check_namespace(args.namespace)
    if args.discovery == "file":
        from armature.runtime.discovery_file import FileDiscovery

        try:
            return FileDiscovery(Path(args.discovery_dir) if args.discovery_dir else None)
        except OSError as exc:
            raise CliError(f"cannot use the discovery directory: {exc}") from None
    from armature.runtime.discovery_etcd import EtcdDiscovery

    endpoints = [e.strip() for e in args.etcd_endpoints.split(",") if e.strip()]
    if not endpoints or not all(e.startswith(("http://", "https://")) for e in endpoints):
        raise CliError(f"--etcd-endpoints needs http(s) URLs, got {args.etcd_endpoints!r}")
    return EtcdDiscovery(endpoints)
