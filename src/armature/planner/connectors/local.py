"""The `local` connector: `armature worker` processes on this host, one per worker.

It owns the workers it starts (and only those: a worker started by hand is never stopped).
Scaling up launches workers of the role; scaling down picks the newest, sends it SIGTERM,
which makes the worker leave discovery (the frontend stops routing to it), finish its
in-flight requests within its --shutdown-grace-s and exit; only one that outlives
`drain_timeout_s` is killed. A worker that died by itself is dropped from the count (and
logged) the next time the connector looks, so the planner starts a replacement.

Processes come from a `ProcessLauncher` (the seam tests fake); `SubprocessLauncher` runs
`python -m armature.cli worker <worker args> --role R <runtime flags>`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

from armature.config import RuntimeConfig, to_argv
from armature.planner.connectors.api import ConnectorError
from armature.protocols.worker import WorkerRole

__all__ = ["LocalConnector", "ProcessLauncher", "SubprocessLauncher", "WorkerProcess"]

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


class WorkerProcess(Protocol):
    """One started worker process."""

    name: str
    pid: int

    def is_running(self) -> bool: ...

    def terminate(self) -> None:
        """SIGTERM: leave discovery, drain, exit."""
        ...

    def kill(self) -> None: ...

    async def wait(self, timeout_s: float) -> bool:
        """Whether it exited within `timeout_s`."""
        ...


class ProcessLauncher(Protocol):
    async def launch(self, role: WorkerRole, name: str) -> WorkerProcess:
        """Start a worker of `role`; OSError when it cannot be started."""
        ...


class LocalConnector:
    """Scales roles by starting and stopping worker processes through `launcher`. Owns the
    processes it started (a list per role, oldest first)."""

    def __init__(self, launcher: ProcessLauncher, *, drain_timeout_s: float) -> None:
        self._launcher = launcher
        self._drain_timeout_s = drain_timeout_s
        self._workers: dict[WorkerRole, list[WorkerProcess]] = {}
        self._num_started = 0

    def get_num_workers(self) -> dict[WorkerRole, int]:
        self._reap()
        return {role: len(procs) for role, procs in self._workers.items()}

    def get_processes(self, role: WorkerRole) -> list[WorkerProcess]:
        """The running workers of `role`, oldest first."""
        self._reap()
        return list(self._workers.get(role, []))

    async def scale(self, role: WorkerRole, num_workers: int, reason: str) -> None:
        self._reap()
        procs = self._workers.setdefault(role, [])
        while len(procs) < num_workers:
            self._num_started += 1
            name = f"{role.value}-{self._num_started}"
            try:
                proc = await self._launcher.launch(role, name)
            except OSError as exc:
                raise ConnectorError(f"cannot start worker {name}: {exc}") from None
            procs.append(proc)
            log.info("started worker %s (pid %d): %s", name, proc.pid, reason)
        while len(procs) > num_workers:
            await self._stop(procs[-1], reason)
            procs.pop()

    async def _stop(self, proc: WorkerProcess, reason: str) -> None:
        log.info("draining worker %s (pid %d): %s", proc.name, proc.pid, reason)
        proc.terminate()
        if await proc.wait(self._drain_timeout_s):
            log.info("worker %s (pid %d) stopped", proc.name, proc.pid)
            return
        log.warning(
            "worker %s (pid %d) did not exit within %.0f s of SIGTERM; killing it",
            proc.name,
            proc.pid,
            self._drain_timeout_s,
        )
        proc.kill()
        await proc.wait(self._drain_timeout_s)

    def _reap(self) -> None:
        for procs in self._workers.values():
            for proc in [p for p in procs if not p.is_running()]:
                log.warning("worker %s (pid %d) exited by itself", proc.name, proc.pid)
                procs.remove(proc)

    async def close(self) -> None:
        """Stop every worker this connector started (draining, all at once)."""
        procs = [p for ps in self._workers.values() for p in ps]
        self._workers = {}
        await asyncio.gather(*(self._stop(p, "the planner is stopping") for p in procs))


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the planner dies (Linux), so no worker it
    started outlives it unmanaged."""
    with contextlib.suppress(OSError, AttributeError):  # not Linux: close() still stops them
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class _Subprocess:
    def __init__(self, name: str, proc: asyncio.subprocess.Process) -> None:
        self.name = name
        self.pid = proc.pid
        self._proc = proc

    def is_running(self) -> bool:
        return self._proc.returncode is None

    def terminate(self) -> None:
        if self._proc.returncode is None:
            self._proc.terminate()

    def kill(self) -> None:
        if self._proc.returncode is None:
            self._proc.kill()

    async def wait(self, timeout_s: float) -> bool:
        try:
            await asyncio.wait_for(self._proc.wait(), timeout_s)
        except TimeoutError:
            return False
        return True


class SubprocessLauncher:
    """Starts `python -m armature.cli worker <worker_args> --role R <runtime flags>` with the
    planner's runtime (discovery, planes, namespace; the plane secret in the environment),
    output to `<log_dir>/<name>.log` or discarded."""

    def __init__(
        self,
        worker_args: Sequence[str],
        runtime: RuntimeConfig,
        *,
        log_dir: Path | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self._worker_args = list(worker_args)
        self._runtime = runtime
        self._log_dir = log_dir
        env = dict(os.environ if environ is None else environ)
        if runtime.plane_secret is not None:
            env["ARMATURE_PLANE_SECRET"] = runtime.plane_secret
        self._env = env

    def get_argv(self, role: WorkerRole) -> list[str]:
        return [
            sys.executable,
            "-m",
            "armature.cli",
            "worker",
            *self._worker_args,
            "--role",
            role.value,
            *to_argv(self._runtime),
        ]

    async def launch(self, role: WorkerRole, name: str) -> WorkerProcess:
        if self._log_dir is not None:
            self._log_dir.mkdir(parents=True, exist_ok=True)
            output = open(self._log_dir / f"{name}.log", "wb")  # noqa: SIM115 - closed below
        else:
            output = open(os.devnull, "wb")  # noqa: SIM115
        with output:
            proc = await asyncio.create_subprocess_exec(
                *self.get_argv(role),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=output,
                stderr=asyncio.subprocess.STDOUT,
                env=self._env,
                preexec_fn=_die_with_parent,
            )
        return _Subprocess(name, proc)
