"""`armature serve`: serve a model over an OpenAI-compatible HTTP API: the frontend and one
worker engine in this process, or more workers as worker processes behind it."""

from __future__ import annotations

import argparse
from collections import Counter

from armature.cli.options import (
    HelpFormatter,
    add_settings,
    check_fits_index,
    read_settings,
    setup_logging,
)
from armature.config import ServeConfig
from armature.engines.registry import KINDS
from armature.errors import ConfigError
from armature.protocols.worker import WorkerRole
from armature.router.policies import POLICY_NAMES

__all__ = ["add_parser", "run"]

CHOICES = {"engine.engine": list(KINDS), "router.policy": list(POLICY_NAMES)}


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible HTTP API (one process)",
        description="Serve a model over an OpenAI-compatible HTTP API, engine in-process.",
        formatter_class=HelpFormatter,
    )
    add_settings(parser, ServeConfig(), choices=CHOICES)


def run(args: argparse.Namespace) -> int:
    from armature.frontend.preprocess import encode_on_calling_thread

    encode_on_calling_thread()  # first: before any thread that might read the environment
    config = read_settings(args, ServeConfig)
    setup_logging(config.http.log_level)
    roles = config.get_worker_roles()
    config.tiers.check_prefix_caching(config.kv.enable_prefix_caching)
    config.tiers.check_applies()
    _check_index_room(roles)
    if config.disagg.enforce_disagg and WorkerRole.PREFILL not in roles:
        # no prefill worker can join serve's own fleet: every request would be refused
        raise ConfigError("--enforce-disagg needs --prefill-workers above 0 and --decode-workers")
    if config.frontends > 1 and config.in_process_workers:
        raise ConfigError(
            "--frontends above 1 runs the workers as processes the frontends share: drop "
            "--in-process-workers"
        )
    if config.frontends > 1 and config.replicas.replica_port != 0:
        raise ConfigError(
            f"--replica-port {config.replicas.replica_port}: with --frontends above 1 each "
            "replica takes a port of its own; leave it 0 (any free port)"
        )
    if config.worker_processes and config.in_process_workers:
        raise ConfigError("--worker-processes and --in-process-workers: give one of them")
    as_processes = len(roles) > 1 or config.frontends > 1 or config.worker_processes
    if as_processes and not config.in_process_workers:
        from armature.frontend.worker_processes import serve_with_worker_processes

        serve_with_worker_processes(config)
    else:
        from armature.frontend.serve import serve_in_process

        serve_in_process(config)
    return 0


def _check_index_room(roles: list[WorkerRole]) -> None:
    """A one-line error where a role has more workers than the router's prefix index holds
    (else the frontend would start them all and refuse the rest)."""
    for role, count in Counter(roles).items():
        flag = "--workers" if role is WorkerRole.AGG else f"--{role.value}-workers"
        check_fits_index(flag, count)
