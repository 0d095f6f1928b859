"""`armature worker`: one engine served over the request plane, registered in discovery,
until SIGINT/SIGTERM (then it deregisters before it stops)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import secrets
import signal
from collections.abc import Mapping

import msgspec

from armature.cli_args import CliError, add_transfer_args, free_port, non_negative_float, port
from armature.cli_engine import add_engine_args, build_engines
from armature.cli_runtime import (
    add_runtime_args,
    connect_nats_or_exit,
    make_event_plane,
    open_discovery,
)

__all__ = ["add_worker_parser", "run_worker"]

log = logging.getLogger("armature")


def add_worker_parser(sub: argparse._SubParsersAction) -> None:
    worker = sub.add_parser(
        "worker",
        help="serve one engine to frontends over the request plane",
        description="Serve one engine over the request plane and register it in discovery.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_engine_args(worker)
    add_runtime_args(worker)
    worker.add_argument(
        "--served-model-name", default=None, help="model name (default: derived from --model)"
    )
    worker.add_argument("--host", default="127.0.0.1", help="request-plane address to listen on")
    worker.add_argument("--port", type=port, default=0, help="request-plane port (0: any free)")
    worker.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        help="Prometheus /metrics port on --host (0: any free port; -1: no endpoint)",
    )
    worker.add_argument(
        "--instance-id",
        type=int,
        default=None,
        help="64-bit instance id (default: random); the worker is named worker-<hex id>",
    )
    worker.add_argument(
        "--role",
        choices=["agg", "prefill", "decode"],
        default="agg",
        help="agg: whole requests; prefill: prompts for decode workers (disaggregated "
        "serving); decode: continues from a prefill worker's KV (or prefills itself)",
    )
    add_transfer_args(worker)
    worker.add_argument(
        "--shutdown-grace-s",
        type=non_negative_float,
        default=30.0,
        help="on SIGTERM: leave discovery, then give in-flight requests this long to finish",
    )
    worker.add_argument(
        "--kv-transfer-port",
        type=int,
        default=0,
        help="KV transfer server port on --host (0: any free port)",
    )
    worker.add_argument(
        "--log-level", choices=["debug", "info", "warning", "error"], default="info"
    )


def run_worker(args: argparse.Namespace) -> None:
    asyncio.run(_run(args))


async def _run(args: argparse.Namespace) -> None:
    from armature.engines.api import Engine
    from armature.engines.native.async_engine import AsyncEngine
    from armature.engines.native.transfer import start_transfer_agent
    from armature.engines.vllm.disagg import NIXL_BACKEND  # pure: imports no vLLM
    from armature.protocols.worker import WorkerCard, worker_prefix
    from armature.runtime.nats_plane import NatsRequestPlaneServer
    from armature.runtime.request_plane import Handler, RequestServer
    from armature.runtime.tcp_server import RequestPlaneServer
    from armature.transfer.wire import TransferError
    from armature.worker.service import WorkerService

    instance_id = args.instance_id if args.instance_id is not None else secrets.randbits(63)
    if not 0 <= instance_id < 2**64:
        raise CliError(f"--instance-id must be in [0, 2**64), got {instance_id}")
    core, connector = None, None
    if args.engine == "vllm":  # vLLM's engine; it starts inside this event loop
        from armature.cli_serve_vllm import build_vllm_from_args
        from armature.engines.vllm.build import VllmConnectorConfig

        if args.role != "agg":  # vLLM's NIXL connector listens on --kv-transfer-port
            connector = VllmConnectorConfig(
                worker_id=f"worker-{instance_id:x}",
                side_channel_host=args.host,
                side_channel_port=args.kv_transfer_port or free_port(args.host),
                lease_s=max(1, round(args.kv_pin_ttl_s)),
            )
        vllm = build_vllm_from_args(args, connector)
        resolved, info = vllm.resolved, vllm.engine.info
        block_size, max_model_len, vocab_size = info.block_size, info.max_model_len, info.vocab_size
    else:
        built = build_engines(args, 1, shared_kv_cache=args.role == "prefill")
        core = built.cores[0]
        resolved, block_size = built.resolved, built.config.block_size
        max_model_len, vocab_size = core.max_model_len, core.arch.vocab_size
    name = args.served_model_name or resolved.served_name
    discovery = await open_discovery(args)
    for value in (await discovery.list(worker_prefix(args.namespace))).values():
        other = msgspec.msgpack.decode(value, type=WorkerCard)
        if other.model_name != name:
            continue
        if other.block_size != block_size:
            raise CliError(
                f"model {name!r} is already served with block size {other.block_size} in "
                f"namespace {args.namespace!r}; this worker uses {block_size}"
            )
        if other.model_path != str(resolved.path):
            raise CliError(
                f"model {name!r} is already served from {other.model_path} in namespace "
                f"{args.namespace!r}; this worker loads {resolved.path}"
            )
    event_plane = await make_event_plane(args, args.host)
    nc = await connect_nats_or_exit(args) if args.request_plane == "nats" else None
    transfer = None
    try:
        if core is not None:
            transfer = start_transfer_agent(
                core,
                worker_id=f"worker-{instance_id:x}",
                backends=args.kv_transfer_backends,
                host=args.host,
                port=args.kv_transfer_port,
                secret=args.plane_secret,
            )
    except TransferError as exc:
        raise CliError(str(exc)) from None
    except OSError as exc:
        raise CliError(
            f"cannot listen for KV transfers on {args.host}:{args.kv_transfer_port}: {exc.strerror}"
        ) from None

    engine: Engine = vllm.engine if core is None else AsyncEngine(core, transfer)

    def make_server(handlers: Mapping[str, Handler]) -> RequestServer:
        if nc is not None:
            subject = f"armature.rp.{args.namespace}.{instance_id:x}"
            return NatsRequestPlaneServer(nc, subject, handlers)
        return RequestPlaneServer(handlers, args.host, args.port, secret=args.plane_secret)

    service = WorkerService(
        engine,
        discovery,
        namespace=args.namespace,
        model_name=name,
        model_path=str(resolved.path),
        block_size=block_size,
        max_model_len=max_model_len,
        vocab_size=vocab_size,
        make_server=make_server,
        instance_id=instance_id,
        lease_ttl_s=args.lease_ttl_s,
        event_plane=event_plane,
        metrics_host=args.host,
        metrics_port=None if args.metrics_port < 0 else args.metrics_port,
        role=args.role,
        transfer=transfer,
    )
    endpoints = dict(core.kv_endpoints) if core is not None else {}
    if connector is not None:  # a vLLM worker's NIXL side channel
        endpoints[NIXL_BACKEND] = f"{connector.side_channel_host}:{connector.side_channel_port}"
    transfer_description = ", ".join(f"{k} {v}" for k, v in endpoints.items()) or "off"
    try:
        card = await service.start()
    except OSError as exc:
        raise CliError(f"cannot listen on {args.host}:{args.port}: {exc.strerror}") from None
    log.info(
        "worker %s ready: %s (%s engine, %s role, %d KV blocks of %d) on %s in namespace %r; "
        "KV transfer %s; metrics %s",
        card.worker_id,
        name,
        args.engine,
        args.role,
        card.num_kv_blocks,
        card.block_size,
        card.request_url,
        args.namespace,
        transfer_description,
        card.metrics_url or "off",
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("worker %s stopping", card.worker_id)
    await service.stop(args.shutdown_grace_s)
    await event_plane.close()
    if nc is not None:
        await nc.drain()
    await discovery.close()
