"""`armature frontend`: the OpenAI HTTP API in front of the workers found in discovery."""

from __future__ import annotations

import argparse
import asyncio
import logging
import time

import msgspec

from armature.cli_args import (
    CliError,
    add_disagg_args,
    add_migration_arg,
    add_router_cost_args,
    add_worker_health_args,
    check_port_free,
    port,
    positive_float,
)
from armature.cli_edge import add_edge_args, api_keys_from, overload_from
from armature.cli_runtime import (
    add_runtime_args,
    make_event_plane,
    make_request_client,
    open_discovery,
)
from armature.router.policies import POLICY_NAMES

__all__ = ["add_frontend_parser", "run_frontend"]

log = logging.getLogger("armature")


def add_frontend_parser(sub: argparse._SubParsersAction) -> None:
    frontend = sub.add_parser(
        "frontend",
        help="serve the OpenAI API, routing to the workers found in discovery",
        description="Serve the OpenAI API over the workers registered in discovery; workers "
        "that join or leave are picked up live.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_runtime_args(frontend)
    frontend.add_argument(
        "--router", choices=list(POLICY_NAMES), default="kv", help="routing policy"
    )
    add_router_cost_args(frontend)
    add_worker_health_args(frontend)
    add_disagg_args(frontend)
    add_migration_arg(frontend)
    add_edge_args(frontend)
    frontend.add_argument("--host", default="127.0.0.1", help="HTTP address to listen on")
    frontend.add_argument("--port", type=port, default=8000, help="HTTP port")
    frontend.add_argument(
        "--wait-for-workers-s",
        type=positive_float,
        default=600.0,
        help="how long to wait for the first worker (it tells the model and tokenizer)",
    )
    frontend.add_argument("--seed", type=int, default=0, help="router seed")
    frontend.add_argument(
        "--log-level", choices=["debug", "info", "warning", "error"], default="info"
    )


async def _first_card(args: argparse.Namespace) -> bytes:
    """The card of the first worker, once `min_workers` (default 1) have registered. Fails
    early if a worker process this command started (`worker_processes`) exits."""
    from armature.protocols.worker import worker_prefix

    discovery = await open_discovery(args)
    deadline = time.monotonic() + args.wait_for_workers_s
    min_workers = getattr(args, "min_workers", 1)
    logged = False
    try:
        while True:
            cards = await discovery.list(worker_prefix(args.namespace))
            if len(cards) >= min_workers:
                return next(iter(sorted(cards.items())))[1]
            for proc in getattr(args, "worker_processes", []):
                if proc.poll() is not None:
                    raise CliError(f"a worker exited with code {proc.returncode} at start")
            if time.monotonic() > deadline:
                raise CliError(
                    f"{len(cards)} of {min_workers} workers registered in namespace "
                    f"{args.namespace!r} within {args.wait_for_workers_s:g} s"
                )
            if not logged:
                log.info("waiting for workers in namespace %r", args.namespace)
                logged = True
            await asyncio.sleep(0.2)
    finally:
        await discovery.close()


def run_frontend(args: argparse.Namespace) -> None:
    from pathlib import Path

    import uvicorn

    from armature.cli_args import disagg_config, router_config
    from armature.frontend.app import ServedModel, build_app
    from armature.frontend.fleet import WorkerFleet
    from armature.frontend.preprocess import Preprocessor
    from armature.protocols.worker import WorkerCard
    from armature.router.disagg import DisaggRouter

    api_keys = api_keys_from(args)
    if not getattr(args, "worker_processes", None):
        check_port_free(args.host, args.port)
    served = msgspec.msgpack.decode(asyncio.run(_first_card(args)), type=WorkerCard)
    preprocessor = Preprocessor(Path(served.model_path))
    model = ServedModel(
        name=served.model_name, max_model_len=served.max_model_len, created=int(time.time())
    )
    router = DisaggRouter(
        {},
        router_config(args, served.block_size),
        disagg_config(args),
    )

    async def follow_discovery() -> None:
        discovery = await open_discovery(args)
        event_plane = await make_event_plane(args)
        try:
            client = await make_request_client(args)
            fleet = WorkerFleet(
                router,
                discovery,
                args.namespace,
                served,
                client,
                event_plane,
                liveness_timeout_s=args.worker_liveness_timeout_s,
                stall_timeout_s=args.worker_stall_timeout_s,
            )
            await fleet.run()
        finally:
            await event_plane.close()
            await discovery.close()

    app = build_app(
        router,
        preprocessor,
        model,
        background=[follow_discovery],
        api_keys=api_keys,
        protect_metrics=args.protect_metrics,
        max_request_bytes=args.max_request_bytes,
        overload=overload_from(args),
    )
    log.info(
        "frontend serving %r on http://%s:%d (OpenAI API under /v1), %s router",
        served.model_name,
        args.host,
        args.port,
        args.router,
    )
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=False,
        timeout_graceful_shutdown=max(1, round(args.shutdown_grace_s)),
    )
