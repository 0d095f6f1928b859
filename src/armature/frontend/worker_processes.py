"""`armature serve` with worker processes: N `armature worker` processes and the frontend in
this process, on the embedded runtime (file discovery in a private directory, the TCP request
plane, the zmq event plane). Each worker's command line is `to_argv` of its `WorkerConfig`,
so every worker setting `serve` took reaches the workers. With `--frontends N`, N-1 more
`armature frontend` processes (`to_argv` of this frontend's config) serve the same port
beside this one: each listens on a socket of its own with SO_REUSEPORT (the kernel spreads
connections over them; one that dies takes only its own queued connections), and they share
their in-flight load over the fleet's event plane (frontend/replicas.py). A child that fails
while the fleet serves is started again (frontend/children.py). The children die with this
process (SIGTERM on exit, and the kernel's parent-death signal should it be killed outright);
no registration outlives it. The private directory lies where the OS cleans up;
a serve killed outright leaves it to its workers, which remove it as they stop, and one left
when the workers were killed outright too is removed by the next serve to start
(serve_dir.py)."""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

from armature.config import (
    FrontendConfig,
    RuntimeConfig,
    ServeConfig,
    WorkerConfig,
    WorkerProcessConfig,
    setting_env_names,
    to_argv,
)
from armature.engines.registry import get_kind
from armature.engines.spec import resolve_engine_model
from armature.frontend.children import Child, ChildWatch
from armature.frontend.main import run_frontend
from armature.frontend.serve_dir import create_serve_dir, remove_stale_serve_dirs, serve_dir_root
from armature.model.source import ResolvedModel
from armature.runtime.ports import reserve_listen_socket, reserve_shared_listen_socket

__all__ = [
    "fleet_runtime",
    "frontend_command",
    "frontend_environment",
    "serve_with_worker_processes",
    "stop_processes",
    "worker_command",
    "worker_configs",
]

log = logging.getLogger("armature")

_PR_SET_PDEATHSIG = 1
SERVE_NAMESPACE = "serve"
STOP_MARGIN_S = 10.0  # past a child's shutdown grace before it is killed


def _find_prctl() -> Callable[..., int] | None:
    """libc's prctl, found once in the parent: a child forked from a process with threads
    (serve starts children again while it serves) must not load a library itself."""
    try:
        prctl: Callable[..., int] = ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux: the SIGTERM on exit still applies
        return None
    return prctl


_PRCTL = _find_prctl()


def _die_with_parent() -> None:
    """In the child, before exec: get SIGTERM when the parent dies (Linux)."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)


def fleet_runtime(directory: Path, secret: str) -> RuntimeConfig:
    """The embedded runtime a serve fleet meets on: private, one host, no server."""
    return RuntimeConfig(
        plane_secret=secret,
        namespace=SERVE_NAMESPACE,
        discovery="file",
        discovery_dir=str(directory),
        request_plane="tcp",
        event_plane="zmq",
    )


def worker_configs(
    config: ServeConfig, runtime: RuntimeConfig, model: ResolvedModel
) -> list[WorkerConfig]:
    """One configuration per worker `config` asks for: the engine, KV cache and transfer
    sections are serve's own (the model resolved once, here: N workers must not convert the
    default model side by side); the runtime, role and instance id are the fleet's."""
    engine = dataclasses.replace(
        config.engine,
        model=str(model.path),
        served_model_name=config.engine.served_model_name or model.served_name,
    )
    roles = config.get_worker_roles()
    return [
        WorkerConfig(
            engine=engine,
            kv=config.kv,
            tiers=config.tiers.for_worker(index, len(roles)),
            transfer=config.transfer,
            runtime=runtime,
            process=WorkerProcessConfig(
                role=role, instance_id=index, log_level=config.http.log_level
            ),
        )
        for index, role in enumerate(roles)
    ]


def worker_command(worker: WorkerConfig) -> list[str]:
    return [sys.executable, "-m", "armature.cli", "worker", *to_argv(worker)]


def worker_environment(runtime: RuntimeConfig) -> dict[str, str]:
    """This process's environment without the variables of worker settings (the command
    line carries them all), with the fleet's plane secret."""
    settings = setting_env_names(WorkerConfig)
    env = {k: v for k, v in os.environ.items() if k not in settings}
    assert runtime.plane_secret is not None
    env["ARMATURE_PLANE_SECRET"] = runtime.plane_secret
    return env


def frontend_command(frontend: FrontendConfig) -> list[str]:
    return [sys.executable, "-m", "armature.cli", "frontend", *to_argv(frontend)]


def frontend_environment(frontend: FrontendConfig) -> dict[str, str]:
    """This process's environment without the variables of frontend settings (the command
    line carries them), with the secrets a command line leaves out: the fleet's plane secret
    and the API keys."""
    settings = setting_env_names(FrontendConfig)
    env = {k: v for k, v in os.environ.items() if k not in settings}
    assert frontend.runtime.plane_secret is not None
    env["ARMATURE_PLANE_SECRET"] = frontend.runtime.plane_secret
    if frontend.security.api_keys:
        env["ARMATURE_API_KEYS"] = ",".join(frontend.security.api_keys)
    return env


def stop_processes(procs: list[subprocess.Popen[bytes]], grace_s: float) -> None:
    """SIGTERM to each process still running (again to one signalled before: harmless),
    then SIGKILL to those not ended within `grace_s` + STOP_MARGIN_S of it (their drain's
    grace, then leaving discovery and closing the planes)."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline_s = time.monotonic() + grace_s + STOP_MARGIN_S
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline_s - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class _Terminated(BaseException):
    """SIGTERM, raised so that the `finally` blocks on the way out run."""


@contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    """Within: SIGTERM raises `_Terminated`, so cleanup in `finally` blocks runs (uvicorn,
    which handles SIGTERM itself while serving, raises the signal again once drained: by
    default that ends the process on the spot). On the way out the process still ends by
    SIGTERM, as its parent expects."""

    def terminated(signum: int, frame: FrameType | None) -> None:
        raise _Terminated

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    except _Terminated:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.raise_signal(signal.SIGTERM)
        raise  # only if SIGTERM were blocked
    finally:
        signal.signal(signal.SIGTERM, previous)


def serve_with_worker_processes(config: ServeConfig) -> None:
    """Start the workers, then serve the frontend over them until SIGINT/SIGTERM."""
    roles = config.get_worker_roles()
    get_kind(config.engine.engine).check(config.engine, roles)
    http = config.http
    if config.frontends > 1:
        listen_socket = reserve_shared_listen_socket(http.host, http.port)
    else:
        listen_socket = reserve_listen_socket(http.host, http.port)
    with listen_socket:
        model = resolve_engine_model(config.engine)
        root = serve_dir_root()
        remove_stale_serve_dirs(root)
        with _sigterm_unwinds():
            _serve_fleet(config, model, create_serve_dir(root), listen_socket)


def _serve_fleet(
    config: ServeConfig, model: ResolvedModel, directory: Path, listen_socket: socket.socket
) -> None:
    """Serve over worker processes meeting in `directory`; stop them and remove it on the
    way out."""
    log.info("the workers meet in %s", directory)
    # a fresh secret per run: only this frontend and its workers speak on their planes
    runtime = fleet_runtime(directory, secrets.token_hex(16))
    workers: list[Child] = []
    frontends: list[Child] = []
    configs: list[WorkerConfig] = []
    try:
        configs = worker_configs(config, runtime, model)
        env = worker_environment(runtime)
        for index, worker in enumerate(configs):
            name = f"worker {index} ({worker.process.role})"
            workers.append(_start_child(name, worker_command(worker), env))
        frontend = FrontendConfig(
            runtime=runtime,
            router=config.router,
            disagg=config.disagg,
            health=config.health,
            replicas=config.replicas,
            http=config.http,
            security=config.security,
            overload=config.overload,
            chat=config.chat,
            responses=config.responses,
            slo=config.slo,
            seed=config.engine.seed,
        )
        replica = replica_config(frontend, listen_socket.getsockname()[1])
        for index in range(1, config.frontends):
            command, replica_env = frontend_command(replica), frontend_environment(replica)
            child = _start_child(f"frontend replica {index}", command, replica_env)
            frontends.append(dataclasses.replace(child, drains_beside=True))
        run_frontend(
            frontend,
            min_workers=len(workers),
            worker_processes=[w.proc for w in workers],
            listen_socket=listen_socket,
            children=ChildWatch([*workers, *frontends], _start_process),
        )
    finally:
        # the replicas first (signalled when this frontend stopped: they drained beside it),
        # their requests served by the workers to the end
        stop_processes([c.proc for c in frontends], config.http.shutdown_grace_s)
        worker_grace_s = max((w.process.shutdown_grace_s for w in configs), default=0.0)
        stop_processes([c.proc for c in workers], worker_grace_s)
        shutil.rmtree(directory, ignore_errors=True)


def _start_process(command: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(command, preexec_fn=_die_with_parent, env=env)


def _start_child(name: str, command: list[str], env: dict[str, str]) -> Child:
    return Child(name, command, env, _start_process(command, env), time.monotonic())


def replica_config(frontend: FrontendConfig, port: int) -> FrontendConfig:
    """The configuration of one more frontend process beside `frontend`: the port it bound
    (not 0), shared with SO_REUSEPORT."""
    http = dataclasses.replace(frontend.http, port=port, reuse_port=True)
    return dataclasses.replace(frontend, http=http)
