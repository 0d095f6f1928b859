"""The frontend process, assembled: the OpenAI app over a router, served by uvicorn.

`run_frontend` follows the workers registered in discovery (`armature frontend`, and `serve`
with worker processes); `serve_app` runs any built app until SIGINT/SIGTERM.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import ipaddress
import logging
import socket
import subprocess
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI

from armature.config import FrontendConfig, HttpConfig, RuntimeConfig
from armature.errors import ConfigError
from armature.frontend.app import Background, ServedModel, build_app, build_replica_app
from armature.frontend.auth import load_api_keys
from armature.frontend.chat_setup import load_chat_setup
from armature.frontend.children import ChildWatch
from armature.frontend.compose import FrontendParts, compose_frontend
from armature.frontend.fleet import WorkerFleet, served_cards
from armature.frontend.replicas import LoadSharing
from armature.protocols.worker import WorkerCard, worker_prefix
from armature.runtime.factory import (
    connect_nats,
    make_event_plane,
    make_request_client,
    open_discovery,
)
from armature.runtime.heap import settle_heap
from armature.runtime.ports import check_bindable, reserve_listen_socket

__all__ = [
    "get_http_url",
    "make_server",
    "reserve_replica_socket",
    "run_frontend",
    "run_serving",
    "serve_app",
    "serve_beside",
    "uvicorn_config",
]

log = logging.getLogger("armature")


# a shutdown's requests still in flight end this long before its grace does: time for their
# 503s and streams' error events to go out before uvicorn cancels what is left
CLOSING_MARGIN_S = 0.5


class GracefulServer(uvicorn.Server):
    """uvicorn's server that, on shutdown, first tells `on_stopping` (it stops listening
    now), then tells `on_grace_ending` CLOSING_MARGIN_S before the graceful shutdown's
    timeout (then uvicorn cancels the requests left, which reached clients as a cut stream
    or an empty 499)."""

    def __init__(
        self,
        config: uvicorn.Config,
        on_grace_ending: Callable[[], None],
        on_stopping: Callable[[], None] = lambda: None,
    ):
        super().__init__(config)
        self.on_grace_ending = on_grace_ending
        self.on_stopping = on_stopping

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.on_stopping()
        grace_s = self.config.timeout_graceful_shutdown
        if grace_s is not None:
            delay_s = max(0.0, grace_s - CLOSING_MARGIN_S)
            asyncio.get_running_loop().call_later(delay_s, self.on_grace_ending)
        await super().shutdown(sockets)


class GraceEndFilter(logging.Filter):
    """uvicorn logs a request cancelled at the end of a shutdown's grace (a client that went
    silent mid-request) as an application error with a traceback: one warning line."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, asyncio.CancelledError) and "graceful shutdown" in str(exc):
            record.msg = "a request still in progress when the shutdown's grace ended was cut"
            record.args = ()
            record.exc_info = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def _quiet_grace_end() -> None:
    """GraceEndFilter on uvicorn's error log (once: its logging is set up by then)."""
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, GraceEndFilter) for f in logger.filters):
        logger.addFilter(GraceEndFilter())


def make_server(
    app: FastAPI, http: HttpConfig, on_stopping: Callable[[], None] = lambda: None
) -> uvicorn.Server:
    """The server of `app` (built by `build_app`): it tells `on_stopping` when SIGINT or
    SIGTERM came, ends the requests in flight cleanly when a shutdown's grace is about to
    end, and a failed background task stops it."""
    server = GracefulServer(uvicorn_config(app, http), app.state.begin_closing, on_stopping)
    _quiet_grace_end()
    app.state.stop_serving = functools.partial(setattr, server, "should_exit", True)
    app.state.is_stopping = lambda: bool(server.should_exit)  # SIGINT/SIGTERM came
    return server


def uvicorn_config(app: FastAPI, http: HttpConfig) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=http.host,
        port=http.port,
        log_level=http.log_level,
        access_log=False,
        timeout_graceful_shutdown=max(1, round(http.shutdown_grace_s)),
    )


def run_serving(main: Coroutine[Any, Any, None]) -> None:
    """Run a serving process's main coroutine on the event loop uvicorn would pick (uvloop
    where installed)."""
    loop_factory = uvicorn.Config(app="unused:app").get_loop_factory()
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(main)


def serve_app(
    app: FastAPI,
    http: HttpConfig,
    listen_socket: socket.socket,
    on_stopping: Callable[[], None] = lambda: None,
) -> None:
    """Serve `app` on `listen_socket` (bound to `http.host:http.port`) until SIGINT/SIGTERM
    (then tell `on_stopping`, and drain), or until a background task of the app fails (then
    drain, and exit 1: the app logged why)."""
    settle_heap()
    make_server(app, http, on_stopping).run(sockets=[listen_socket])
    if getattr(app.state, "background_failure", None) is not None:
        raise SystemExit(1)


async def _first_card(
    config: FrontendConfig, min_workers: int, processes: Sequence[subprocess.Popen[bytes]]
) -> WorkerCard:
    """The card of the first worker, once `min_workers` have registered. Fails early if a
    worker process this command started (`processes`) exits."""
    discovery = await open_discovery(config.runtime)
    namespace = config.runtime.namespace
    model_name = config.served_model_name
    deadline = time.monotonic() + config.wait_for_workers_s
    logged = False
    try:
        while True:
            cards = served_cards(await discovery.list(worker_prefix(namespace)), model_name)
            if cards and len(cards) >= min_workers:
                return cards[0]
            for proc in processes:
                if proc.poll() is not None:
                    raise ConfigError(f"a worker exited with code {proc.returncode} at start")
            if time.monotonic() > deadline:
                of_model = f" of model {model_name!r}" if model_name else ""
                raise ConfigError(
                    f"{len(cards)} of {min_workers} workers{of_model} registered in namespace "
                    f"{namespace!r} within {config.wait_for_workers_s:g} s"
                )
            if not logged:
                log.info("waiting for workers in namespace %r", namespace)
                logged = True
            await asyncio.sleep(0.2)
    finally:
        await discovery.close()


async def _share_load(sharing: LoadSharing) -> None:
    """`sharing.run()`; its failure is logged and leaves this frontend routing on its own
    load (following the workers goes on: a frontend without it serves nothing)."""
    try:
        await sharing.run()
    except Exception:
        log.exception("sharing load with the other frontends stopped; this one counts its own")


def _compose(config: FrontendConfig, served: WorkerCard) -> FrontendParts:
    """The frontend's parts for the model the first worker serves (no engine yet: workers
    join from discovery)."""
    chat = load_chat_setup(Path(served.model_path), config.chat)
    return compose_frontend(
        engines={},
        router_config=dataclasses.replace(
            config.router, block_size_tokens=served.block_size, seed=config.seed
        ),
        preprocessor=chat.preprocessor,
        model=ServedModel(
            name=served.model_name, max_model_len=served.max_model_len, created=int(time.time())
        ),
        disagg=config.disagg,
        overload=config.overload,
        parsers=chat.parsers,
        responses=config.responses,
        slo=config.slo,
    )


async def _check_nats(runtime: RuntimeConfig) -> None:
    """ConfigError (one line at start) where a plane is NATS and it cannot be reached."""
    if "nats" in (runtime.request_plane, runtime.event_plane):
        client = await connect_nats(runtime)
        await client.close()


def _is_stopping(app: FastAPI) -> bool:
    """Whether the server of `app` (`make_server`'s) was told to stop."""
    is_stopping = getattr(app.state, "is_stopping", None)
    return is_stopping is not None and bool(is_stopping())


def run_frontend(
    config: FrontendConfig,
    *,
    min_workers: int = 1,
    worker_processes: Sequence[subprocess.Popen[bytes]] = (),
    listen_socket: socket.socket | None = None,
    children: ChildWatch | None = None,
) -> None:
    """Serve the OpenAI API over the workers in discovery, following joins and leaves, on
    `listen_socket` (`serve` reserves it before starting its workers) or on a socket bound
    to `config.http` now. `children` (serve's processes) are kept running while it serves."""
    api_keys = load_api_keys(config.security)
    check_bindable("--replica-host", config.replicas.replica_host)
    if listen_socket is None:
        listen_socket = _reserve_client_socket(config.http)
    own_socket = reserve_replica_socket(config)
    http_url = get_http_url(own_socket)
    asyncio.run(_check_nats(config.runtime))  # before waiting for workers, not after
    served = asyncio.run(_first_card(config, min_workers, worker_processes))
    parts = _compose(config, served)

    sharings: list[LoadSharing] = []  # the load sharing, once discovery is open

    def get_peer_urls() -> dict[str, str]:
        return sharings[0].get_peer_urls() if sharings else {}

    security = config.security
    replica_app = build_replica_app(
        parts,
        api_keys=api_keys,
        protect_metrics=security.protect_metrics,
        max_request_bytes=config.http.max_request_bytes,
        peer_urls=get_peer_urls,
    )

    # served from the app's start until its shutdown's end: it answers while the app drains
    async def serve_replica_app() -> None:
        await serve_beside(replica_app, own_socket, config.http.shutdown_grace_s)

    follow = functools.partial(_follow_fleet, config, parts, served, http_url, sharings)
    background: list[Background] = [follow, serve_replica_app]
    if children is not None:
        children.stopping = lambda: _is_stopping(app)
        background.append(children.run)
    app = build_app(
        parts,
        background=background,
        api_keys=api_keys,
        protect_metrics=security.protect_metrics,
        max_request_bytes=config.http.max_request_bytes,
        peer_urls=get_peer_urls,
    )
    _log_serving(config, served, http_url)
    with own_socket:
        # serve's frontend replicas stop listening on the shared port when this one does
        on_stopping = children.signal_drainers if children is not None else lambda: None
        serve_app(app, config.http, listen_socket, on_stopping)


def _reserve_client_socket(http: HttpConfig) -> socket.socket:
    """The socket clients connect to, bound to `http.host:http.port`. A replica joining a
    shared port listens once it serves: a listener of the group gets its share of the
    connections at once, and they would wait out its start."""
    return reserve_listen_socket(
        http.host, http.port, reuse_port=http.reuse_port, listen_now=not http.reuse_port
    )


async def _follow_fleet(
    config: FrontendConfig,
    parts: FrontendParts,
    served: WorkerCard,
    http_url: str,
    sharings: list[LoadSharing],
) -> None:
    """Follow the workers, and share load with the other frontend replicas (the sharing
    appended to `sharings` once discovery is open: admin changes reach the replicas it
    follows)."""
    discovery = await open_discovery(config.runtime)
    # zmq: the load publisher binds the replica host (worker events are only read)
    event_plane = await make_event_plane(config.runtime, config.replicas.replica_host)
    try:
        client = await make_request_client(config.runtime)
        fleet = WorkerFleet(
            parts.router,
            discovery,
            config.runtime.namespace,
            served,
            client,
            event_plane,
            health=config.health,
            embedder=parts.embedder,
        )
        sharing = LoadSharing(
            parts.router,
            discovery,
            event_plane,
            config.runtime.namespace,
            config.replicas,
            lease_ttl_s=config.runtime.lease_ttl_s,
            registry=parts.metrics.registry,
            http_url=http_url,
        )
        sharings.append(sharing)
        async with asyncio.TaskGroup() as group:
            group.create_task(fleet.run())
            group.create_task(_share_load(sharing))
    finally:
        await event_plane.close()
        await discovery.close()


def _log_serving(config: FrontendConfig, served: WorkerCard, http_url: str) -> None:
    log.info(
        "frontend serving %r on http://%s:%d (OpenAI API under /v1; this replica alone: %s), "
        "%s router",
        served.model_name,
        config.http.host,
        config.http.port,
        http_url,
        config.router.policy,
    )


def reserve_replica_socket(config: FrontendConfig) -> socket.socket:
    """This replica's own listening socket (`--replica-host`, `--replica-port`), which its
    card in discovery names (replicas may share --port); a ConfigError naming the flags."""
    replicas = config.replicas
    if _is_unspecified(replicas.replica_host):
        raise ConfigError(
            f"--replica-host {replicas.replica_host}: the other frontends and the planner "
            "connect to it; give an address of this host they reach"
        )
    try:
        return reserve_listen_socket(replicas.replica_host, replicas.replica_port)
    except ConfigError as exc:
        raise ConfigError(f"--replica-host/--replica-port: {exc}") from None


def _is_unspecified(host: str) -> bool:
    """Whether `host` is 0.0.0.0 or :: (every address: none that a peer could dial)."""
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:  # a host name
        return False


async def serve_beside(app: FastAPI, listen_socket: socket.socket, grace_s: float) -> None:
    """Serve `app` on `listen_socket` until cancelled, then close it and wait for its
    connections at most `grace_s`: uvicorn's server without its signal handling (the main
    server owns the process's signals) nor logging setup (the main server's stands)."""
    config = uvicorn.Config(
        app,
        lifespan="off",
        access_log=False,
        log_config=None,
        timeout_graceful_shutdown=max(1, round(grace_s)),
    )
    config.load()
    _quiet_grace_end()
    server = uvicorn.Server(config)
    server.lifespan = config.lifespan_class(config)
    await server.startup(sockets=[listen_socket])
    try:
        await asyncio.Future()  # until cancelled
    finally:
        await server.shutdown(sockets=[listen_socket])


def get_http_url(sock: socket.socket) -> str:
    """The http:// url of a bound socket (IPv6 hosts in brackets)."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
