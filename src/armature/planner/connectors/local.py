"""The `local` connector: `armature worker` processes on this host, one per worker.

It owns the workers it starts (and only those: a worker started by hand is never stopped).
Scaling up launches workers of the role; scaling down picks the newest, sends it SIGTERM,
which makes the worker leave discovery (the frontend stops routing to it), finish its
in-flight requests within its --shutdown-grace-s and exit; only one that outlives
`drain_timeout_s` is killed. A worker that died by itself is dropped from the count (and
logged) the next time the connector looks, so the planner starts a replacement: at once
after one that ran a while or a first quick exit, later after each quick exit in a row
(`CrashBackoff`: a worker whose flags or machine make it exit at start is not restarted
every few seconds for good, each start a new log file).

Processes come from a `ProcessLauncher` (the seam tests fake); `SubprocessLauncher` runs
`python -m armature.cli worker <worker args> --role R <runtime flags>`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import math
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from armature.config import RuntimeConfig, to_argv
from armature.planner.connectors.api import ConnectorError
from armature.protocols.worker import WorkerRole

__all__ = [
    "CrashBackoff",
    "LocalConnector",
    "ProcessLauncher",
    "SubprocessLauncher",
    "WorkerProcess",
]

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


@dataclass
class CrashBackoff:
    """When a role's next worker may start after its workers exited by themselves: a worker
    that exits within `quick_exit_s` of its start is a quick exit; the first of a row is
    replaced at once, each later one waits twice as long as the one before (`first_wait_s`,
    at most `max_wait_s`). A worker that ran `quick_exit_s` ends the row. Pure: the caller
    passes the time."""

    quick_exit_s: float = 60.0
    first_wait_s: float = 5.0
    max_wait_s: float = 300.0
    num_quick_exits: int = 0
    start_after_s: float = field(default=-math.inf)

    def on_exit(self, started_s: float, now_s: float) -> None:
        if now_s - started_s >= self.quick_exit_s:
            self.num_quick_exits = 0
            return
        self.num_quick_exits += 1
        if self.num_quick_exits > 1:
            wait_s = self.first_wait_s * 2 ** (self.num_quick_exits - 2)
            self.start_after_s = now_s + min(self.max_wait_s, wait_s)

    def on_running(self, started_s: float, now_s: float) -> None:
        """A worker still running: one past `quick_exit_s` ends the row."""
        if now_s - started_s >= self.quick_exit_s:
            self.num_quick_exits = 0

    def get_wait_s(self, now_s: float) -> float:
        return max(0.0, self.start_after_s - now_s)


class LocalConnector:
    """Scales roles by starting and stopping worker processes through `launcher`. Owns the
    processes it started (a list per role, oldest first)."""

    def __init__(
        self,
        launcher: ProcessLauncher,
        *,
        drain_timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._launcher = launcher
        self._drain_timeout_s = drain_timeout_s
        self._workers: dict[WorkerRole, list[WorkerProcess]] = {}
        self._started_s: dict[int, float] = {}  # by pid
        self._backoffs: dict[WorkerRole, CrashBackoff] = {}
        self._clock = clock
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
        backoff = self._backoffs.get(role)
        wait_s = 0.0 if backoff is None else backoff.get_wait_s(self._clock())
        if len(procs) < num_workers and wait_s > 0:
            assert backoff is not None
            raise ConnectorError(
                f"{role.value} workers exited within {backoff.quick_exit_s:g} s of their "
                f"start {backoff.num_quick_exits} times in a row (see their logs); the next "
                f"starts in {wait_s:.0f} s"
            )
        while len(procs) < num_workers:
            self._num_started += 1
            name = f"{role.value}-{self._num_started}"
            try:
                proc = await self._launcher.launch(role, name)
            except OSError as exc:
                raise ConnectorError(f"cannot start worker {name}: {exc}") from None
            procs.append(proc)
            self._started_s[proc.pid] = self._clock()
            log.info("started worker %s (pid %d): %s", name, proc.pid, reason)
        while len(procs) > num_workers:
            await self._stop(procs[-1], reason)
            self._started_s.pop(procs.pop().pid, None)

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
        now_s = self._clock()
        for role, procs in self._workers.items():
            backoff = self._backoffs.setdefault(role, CrashBackoff())
            for proc in [p for p in procs if not p.is_running()]:
                log.warning("worker %s (pid %d) exited by itself", proc.name, proc.pid)
                backoff.on_exit(self._started_s.pop(proc.pid, now_s), now_s)
                procs.remove(proc)
            for proc in procs:
                backoff.on_running(self._started_s.get(proc.pid, now_s), now_s)

    async def close(self) -> None:
        """Stop every worker this connector started (draining, all at once)."""
        procs = [p for ps in self._workers.values() for p in ps]
        self._workers = {}
        self._started_s = {}
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
    output to `<log_dir>/<name>.log` or discarded; prefill workers with `prefill_worker_args`
    where given."""

    def __init__(
        self,
        worker_args: Sequence[str],
        runtime: RuntimeConfig,
        *,
        log_dir: Path | None = None,
        environ: Mapping[str, str] | None = None,
        prefill_worker_args: Sequence[str] | None = None,
    ) -> None:
        self._worker_args = list(worker_args)
        self._prefill_worker_args = (
            self._worker_args if prefill_worker_args is None else list(prefill_worker_args)
        )
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
            *(self._prefill_worker_args if role is WorkerRole.PREFILL else self._worker_args),
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
