"""The planner's connectors against their seams: the local one with a fake process launcher
(exact start/stop order, SIGTERM before any kill, a worker that died by itself replaced),
the virtual one against in-process discovery with a fake orchestrator, and the actuator's
retries after a connector failure."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from armature.config import RuntimeConfig
from armature.errors import ConfigError
from armature.planner.actuator import Actuator
from armature.planner.connectors.api import ConnectorError
from armature.planner.connectors.local import CrashBackoff, LocalConnector, SubprocessLauncher
from armature.planner.connectors.virtual import VirtualConnector
from armature.planner.main import get_worker_argv
from armature.protocols.planner import ScaleAck, ScaleTarget, planner_ack_key, planner_prefix
from armature.protocols.worker import WorkerRole
from armature.runtime.discovery import MemDiscovery, MemStore

AGG, PREFILL, DECODE = WorkerRole.AGG, WorkerRole.PREFILL, WorkerRole.DECODE


class FakeProcess:
    def __init__(self, name: str, pid: int, journal: list[str], *, drains: bool) -> None:
        self.name = name
        self.pid = pid
        self._journal = journal
        self._drains = drains  # exits on SIGTERM (False: only a kill ends it)
        self.running = True

    def is_running(self) -> bool:
        return self.running

    def terminate(self) -> None:
        self._journal.append(f"term {self.name}")
        if self._drains:
            self.running = False

    def kill(self) -> None:
        self._journal.append(f"kill {self.name}")
        self.running = False

    async def wait(self, timeout_s: float) -> bool:
        self._journal.append(f"wait {self.name} {timeout_s:g}")
        return not self.running


class FakeLauncher:
    def __init__(self, *, fail_after: int | None = None, drains: bool = True) -> None:
        self.journal: list[str] = []
        self.procs: list[FakeProcess] = []
        self._fail_after = fail_after
        self._drains = drains

    async def launch(self, role: WorkerRole, name: str) -> FakeProcess:
        if self._fail_after is not None and len(self.procs) >= self._fail_after:
            self.journal.append(f"refused {name}")
            raise OSError("no more processes")
        proc = FakeProcess(name, 100 + len(self.procs), self.journal, drains=self._drains)
        self.procs.append(proc)
        self.journal.append(f"launch {name} as {role.value}")
        return proc


async def test_local_scales_up_and_drains_the_newest_first() -> None:
    launcher = FakeLauncher()
    connector = LocalConnector(launcher, drain_timeout_s=30.0)
    await connector.scale(PREFILL, 1, "start")
    await connector.scale(DECODE, 3, "start")
    await connector.scale(DECODE, 1, "idle")
    assert launcher.journal == [
        "launch prefill-1 as prefill",
        "launch decode-2 as decode",
        "launch decode-3 as decode",
        "launch decode-4 as decode",
        "term decode-4",
        "wait decode-4 30",
        "term decode-3",
        "wait decode-3 30",
    ]
    assert connector.get_num_workers() == {PREFILL: 1, DECODE: 1}
    assert [p.name for p in connector.get_processes(DECODE)] == ["decode-2"]
    await connector.close()
    assert launcher.journal[-4:] == [
        "term prefill-1",
        "wait prefill-1 30",
        "term decode-2",
        "wait decode-2 30",
    ]
    assert connector.get_num_workers() == {}


async def test_local_kills_only_a_worker_that_outlives_its_drain() -> None:
    launcher = FakeLauncher(drains=False)
    connector = LocalConnector(launcher, drain_timeout_s=5.0)
    await connector.scale(AGG, 1, "start")
    await connector.scale(AGG, 0, "idle")
    assert launcher.journal == [
        "launch agg-1 as agg",
        "term agg-1",
        "wait agg-1 5",
        "kill agg-1",
        "wait agg-1 5",
    ]


async def test_local_replaces_a_worker_that_died_and_reports_a_refused_start() -> None:
    launcher = FakeLauncher(fail_after=2)
    connector = LocalConnector(launcher, drain_timeout_s=5.0)
    await connector.scale(AGG, 2, "start")
    launcher.procs[0].running = False  # crashed
    assert connector.get_num_workers() == {AGG: 1}
    with pytest.raises(ConnectorError, match="cannot start worker agg-3: no more processes"):
        await connector.scale(AGG, 2, "replace")
    assert connector.get_num_workers() == {AGG: 1}


def test_crash_backoff_waits_longer_after_each_quick_exit_in_a_row() -> None:
    backoff = CrashBackoff(quick_exit_s=60.0, first_wait_s=5.0, max_wait_s=30.0)
    waits = []
    now_s = 0.0
    for _ in range(6):  # each worker exits 1 s after its start
        backoff.on_exit(started_s=now_s, now_s=now_s + 1.0)
        now_s += 1.0
        waits.append(backoff.get_wait_s(now_s))
        now_s += waits[-1]
    assert waits == [0.0, 5.0, 10.0, 20.0, 30.0, 30.0]  # the first replaced at once
    assert backoff.num_quick_exits == 6
    backoff.on_running(started_s=now_s, now_s=now_s + 60.0)  # one ran a minute: row over
    assert backoff.num_quick_exits == 0
    backoff.on_exit(started_s=now_s, now_s=now_s + 61.0)  # and its exit is no quick one
    assert backoff.num_quick_exits == 0
    assert backoff.get_wait_s(now_s + 61.0) == 0.0


async def test_local_backs_off_a_role_whose_workers_exit_at_start() -> None:
    """A worker whose flags make it exit at once: the first is replaced at once, the second
    only after the wait (a ConnectorError meanwhile, which the actuator logs and retries):
    every few seconds for good before, each start a new log file."""
    clock = Clock()
    launcher = FakeLauncher()
    connector = LocalConnector(launcher, drain_timeout_s=5.0, clock=clock)
    await connector.scale(AGG, 1, "start")
    clock.now_s += 1.0
    launcher.procs[-1].running = False
    await connector.scale(AGG, 1, "replace")  # the first quick exit: at once
    clock.now_s += 1.0
    launcher.procs[-1].running = False
    with pytest.raises(ConnectorError, match="exited within 60 s of their start 2 times in a row"):
        await connector.scale(AGG, 1, "replace")
    assert len(launcher.procs) == 2
    clock.now_s += 5.0
    await connector.scale(AGG, 1, "replace")
    assert [p.name for p in connector.get_processes(AGG)] == ["agg-3"]
    # scaling down is never held back
    await connector.scale(AGG, 0, "idle")
    assert connector.get_num_workers() == {AGG: 0}


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


class FlakyConnector:
    """Fails its first `num_failures` actions with `error`, then does them; its first
    `num_count_failures` counts raise `error` too."""

    def __init__(
        self,
        num_failures: int,
        error: Exception | None = None,
        num_count_failures: int = 0,
    ) -> None:
        self.num_failures = num_failures
        self.num_count_failures = num_count_failures
        self.error = error or ConnectorError("the orchestrator is down")
        self.counts: dict[WorkerRole, int] = {}
        self.calls: list[tuple[WorkerRole, int, str]] = []

    def get_num_workers(self) -> dict[WorkerRole, int]:
        if self.num_count_failures > 0:
            self.num_count_failures -= 1
            raise self.error
        return dict(self.counts)

    async def scale(self, role: WorkerRole, num_workers: int, reason: str) -> None:
        self.calls.append((role, num_workers, reason))
        if self.num_failures > 0:
            self.num_failures -= 1
            raise self.error
        self.counts[role] = num_workers

    async def close(self) -> None:
        return None


@pytest.mark.parametrize(
    "error",
    [ConnectorError("the orchestrator is down"), RuntimeError("etcd is unreachable")],
    ids=["connector-error", "any-other-error"],
)
async def test_the_actuator_logs_and_retries_a_failed_action(error: Exception) -> None:
    """Any error a connector raises (a discovery backend's, a malformed answer's) is logged
    and retried: another than ConnectorError ended the actuator for good, unseen."""
    connector = FlakyConnector(num_failures=2, error=error)
    failures: list[int] = []
    actuator = Actuator(connector, retry_s=0.01, on_failure=lambda: failures.append(1))
    task = asyncio.create_task(actuator.run())
    try:
        actuator.set_targets({AGG: 2}, {AGG: "planner: agg 1 -> 2 workers, ttft_above_target"})
        await asyncio.wait_for(actuator.idle.wait(), 5.0)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    reason = "planner: agg 1 -> 2 workers, ttft_above_target"
    assert connector.calls == [(AGG, 2, reason)] * 3
    assert connector.counts == {AGG: 2} and len(failures) == 2
    assert actuator.get_pending() == {}


async def test_the_actuator_survives_a_connector_that_cannot_count() -> None:
    connector = FlakyConnector(num_failures=0, error=ValueError("not JSON"), num_count_failures=2)
    failures: list[int] = []
    actuator = Actuator(connector, retry_s=0.01, on_failure=lambda: failures.append(1))
    task = asyncio.create_task(actuator.run())
    try:
        actuator.set_targets({AGG: 1}, {AGG: "planner: agg 0 -> 1 workers, throughput"})
        await asyncio.wait_for(actuator.idle.wait(), 5.0)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert connector.counts == {AGG: 1} and len(failures) == 2


async def test_the_actuator_replaces_a_worker_that_died_without_a_new_target() -> None:
    launcher = FakeLauncher()
    connector = LocalConnector(launcher, drain_timeout_s=5.0)
    actuator = Actuator(connector, retry_s=0.01)
    task = asyncio.create_task(actuator.run())
    try:
        actuator.set_targets({AGG: 2}, {AGG: "planner: agg 0 -> 2 workers, throughput"})
        await asyncio.wait_for(actuator.idle.wait(), 5.0)
        launcher.procs[0].running = False  # crashed; the planner sets no new target

        async def replaced() -> None:
            while len(launcher.procs) < 3:
                await asyncio.sleep(0.005)

        await asyncio.wait_for(replaced(), 5.0)
        await asyncio.wait_for(actuator.idle.wait(), 5.0)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert launcher.journal == ["launch agg-1 as agg", "launch agg-2 as agg", "launch agg-3 as agg"]
    assert connector.get_num_workers() == {AGG: 2}


async def fake_orchestrator(discovery: MemDiscovery, namespace: str, acks: list[ScaleAck]) -> None:
    """Does every target it sees and acks it (under its own lease)."""
    registrations = {}
    async for event in discovery.watch(planner_prefix(namespace) + "targets/"):
        if event.kind != "put":
            continue
        target = msgspec.msgpack.decode(event.value, type=ScaleTarget)
        ack = ScaleAck(role=target.role, num_workers=target.num_workers, sequence=target.sequence)
        old = registrations.pop(target.role, None)
        if old is not None:
            await old.close()
        key = planner_ack_key(namespace, target.role)
        registrations[target.role] = await discovery.register(
            key, msgspec.msgpack.encode(ack), 10.0
        )
        acks.append(ack)


async def test_virtual_publishes_targets_and_waits_for_their_acks() -> None:
    store = MemStore()
    planner_side, orchestrator_side = MemDiscovery(store), MemDiscovery(store)
    acks: list[ScaleAck] = []
    orchestrator = asyncio.create_task(fake_orchestrator(orchestrator_side, "ns", acks))
    connector = VirtualConnector(
        planner_side, "ns", num_workers={DECODE: 1}, ack_timeout_s=5.0, lease_ttl_s=10.0
    )
    try:
        assert connector.get_num_workers() == {DECODE: 1}
        await connector.scale(DECODE, 3, "load")
        await connector.scale(PREFILL, 2, "load")
        assert connector.get_num_workers() == {DECODE: 3, PREFILL: 2}
        assert acks == [
            ScaleAck(role=DECODE, num_workers=3, sequence=1),
            ScaleAck(role=PREFILL, num_workers=2, sequence=2),
        ]
        published = await planner_side.list(planner_prefix("ns") + "targets/")
        assert msgspec.msgpack.decode(
            published["planner/ns/targets/decode"], type=ScaleTarget
        ) == ScaleTarget(role=DECODE, num_workers=3, sequence=1, reason="load")
    finally:
        await connector.close()
        orchestrator.cancel()
        await asyncio.gather(orchestrator, return_exceptions=True)
    # the planner's lease is gone with it: no target outlives the planner
    assert await planner_side.list(planner_prefix("ns") + "targets/") == {}
    await planner_side.close()
    await orchestrator_side.close()


async def test_virtual_without_an_orchestrator_times_out_and_starts_above_old_acks() -> None:
    store = MemStore()
    discovery = MemDiscovery(store)
    stale = ScaleAck(role=AGG, num_workers=4, sequence=7)  # a previous planner's
    registration = await discovery.register(
        planner_ack_key("ns", AGG), msgspec.msgpack.encode(stale), 10.0
    )
    connector = VirtualConnector(
        discovery, "ns", num_workers={AGG: 4}, ack_timeout_s=0.05, lease_ttl_s=10.0
    )
    with pytest.raises(ConnectorError, match=r"no ack for target agg=2 \(#8\) within 0 s"):
        await connector.scale(AGG, 2, "idle")
    assert connector.get_num_workers() == {AGG: 4}
    await connector.close()
    await registration.close()
    await discovery.close()


def test_prefill_workers_start_with_their_own_flags_where_given() -> None:
    """--prefill-worker-args: a disaggregated fleet's prefill workers at another TP run
    another KV pool (they were started with the decode workers' flags)."""
    runtime = RuntimeConfig(namespace="fleet", discovery_dir="/tmp/d")
    launcher = SubprocessLauncher(
        get_worker_argv(("--engine mocker --num-kv-blocks 900",)),
        runtime,
        environ={},
        prefill_worker_args=get_worker_argv(("--engine mocker --num-kv-blocks 300",)),
    )
    assert launcher.get_argv(PREFILL)[4:9] == [
        "--engine",
        "mocker",
        "--num-kv-blocks",
        "300",
        "--role",
    ]
    assert launcher.get_argv(DECODE)[4:9] == [
        "--engine",
        "mocker",
        "--num-kv-blocks",
        "900",
        "--role",
    ]
    same = SubprocessLauncher(get_worker_argv(("--engine mocker",)), runtime, environ={})
    assert same.get_argv(PREFILL)[4:7] == ["--engine", "mocker", "--role"]


def test_the_subprocess_launcher_adds_the_role_and_the_runtime() -> None:
    runtime = RuntimeConfig(namespace="fleet", discovery_dir="/tmp/d", plane_secret="s3")
    launcher = SubprocessLauncher(
        get_worker_argv(("--engine mocker", "--model './my model'")), runtime, environ={}
    )
    argv = launcher.get_argv(DECODE)
    assert argv[1:] == [
        "-m",
        "armature.cli",
        "worker",
        "--engine",
        "mocker",
        "--model",
        "./my model",
        "--role",
        "decode",
        "--namespace",
        "fleet",
        "--discovery-dir",
        "/tmp/d",
    ]
    assert "s3" not in argv


def test_bad_worker_args_are_a_config_error() -> None:
    with pytest.raises(ConfigError, match="--worker-args"):
        get_worker_argv(("--model 'unclosed",))
