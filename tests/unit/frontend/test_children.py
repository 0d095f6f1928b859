"""`serve`'s processes kept running (ChildWatch) with real child processes and a hand-moved
clock: a failed child starts again after a wait that doubles while it keeps failing soon
after its start, and resets once it ran long; one stopped cleanly or by SIGTERM stays
stopped; nothing starts once the fleet is stopping."""

from __future__ import annotations

import dataclasses
import logging
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from armature.frontend.children import FIRST_WAIT_S, STABLE_S, Child, ChildWatch
from armature.frontend.worker_processes import STOP_MARGIN_S, stop_processes


class Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def exiting(code: int) -> list[str]:
    return [sys.executable, "-c", f"import sys; sys.exit({code})"]


def killed_by(signum: int) -> list[str]:
    """A child that ends by `signum` at its default action."""
    code = "import os, signal; signal.signal({0}, signal.SIG_DFL); os.kill(os.getpid(), {0})"
    return [sys.executable, "-c", code.format(signum)]


SLEEPING = [sys.executable, "-c", "import time; time.sleep(600)"]


class Starts:
    """Starts real processes, every one recorded (all ended at the test's end)."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def __call__(self, command: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(command, env=env)
        self.procs.append(proc)
        return proc

    def child(self, name: str, command: list[str], clock: Clock) -> Child:
        return Child(name, command, {}, self(command, {}), clock())

    def end(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


@pytest.fixture
def starts() -> Iterator[Starts]:
    s = Starts()
    yield s
    s.end()


def test_a_failed_child_starts_again_with_a_doubling_wait(
    starts: Starts, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="armature")
    clock = Clock()
    child = starts.child("worker 0 (aggregated)", exiting(3), clock)
    watch = ChildWatch([child], starts, clock=clock)
    child.proc.wait()
    first_pid = child.proc.pid
    watch.check()  # noticed: it starts again in FIRST_WAIT_S
    assert (child.restart_at_s, watch.num_restarts) == (FIRST_WAIT_S, 0)
    assert (
        f"worker 0 (aggregated) (pid {first_pid}) failed (exit code 3); starting it again in 1 s"
        in caplog.text
    )
    clock.now_s = FIRST_WAIT_S - 0.01
    watch.check()
    assert watch.num_restarts == 0 and child.proc.pid == first_pid
    clock.now_s = FIRST_WAIT_S
    watch.check()
    assert watch.num_restarts == 1 and child.proc.pid != first_pid and child.restart_at_s is None
    assert f"worker 0 (aggregated) started again (pid {child.proc.pid})" in caplog.text
    child.proc.wait()  # fails again at once: the wait doubles
    clock.now_s = 2.0
    watch.check()
    assert child.restart_at_s == 2.0 + 2 * FIRST_WAIT_S
    clock.now_s = 4.0
    watch.check()
    child.proc.wait()
    clock.now_s = 4.0 + STABLE_S  # it ran long before it failed: the first wait again
    watch.check()
    assert child.restart_at_s == 4.0 + STABLE_S + FIRST_WAIT_S
    assert watch.num_restarts == 2


@pytest.mark.parametrize("how", ["code 0", "SIGTERM", "SIGINT", "code 130"])
def test_a_child_stopped_on_purpose_stays_stopped(
    starts: Starts, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    # 130: the CLI's exit code for a KeyboardInterrupt (SIGINT before its handlers are set).
    # The signals are the child's own, at their default action: a child of a test process may
    # inherit SIGINT ignored (pytest-xdist's workers ignore it), and would sleep on.
    exits = {
        "code 0": exiting(0),
        "code 130": exiting(130),
        "SIGTERM": killed_by(signal.SIGTERM),
        "SIGINT": killed_by(signal.SIGINT),
    }
    child = starts.child("frontend replica 1", exits[how], clock)
    child.proc.wait()
    assert child.proc.returncode in (0, 130, -signal.SIGTERM, -signal.SIGINT)
    watch = ChildWatch([child], starts, clock=clock)
    for clock.now_s in (0.0, 100.0, 1000.0):
        watch.check()
    assert child.stopped and watch.num_restarts == 0 and len(starts.procs) == 1
    assert "frontend replica 1" in caplog.text and "not started again" in caplog.text


def test_nothing_starts_once_the_fleet_is_stopping(starts: Starts) -> None:
    clock = Clock()
    stopping = False
    child = starts.child("worker 1 (decode)", exiting(1), clock)
    watch = ChildWatch([child], starts, stopping=lambda: stopping, clock=clock)
    child.proc.wait()
    watch.check()
    stopping = True  # SIGTERM reached serve while the child waited to start again
    clock.now_s = 100.0
    watch.check()
    assert watch.num_restarts == 0 and len(starts.procs) == 1


def test_a_running_child_is_left_alone(starts: Starts) -> None:
    clock = Clock()
    child = starts.child("worker 0 (aggregated)", SLEEPING, clock)
    watch = ChildWatch([child], starts, clock=clock)
    for clock.now_s in (0.0, 1.0, 1000.0):
        watch.check()
    assert child.proc.poll() is None and child.restart_at_s is None and not child.stopped


def test_a_start_that_fails_is_tried_again_later(
    starts: Starts, caplog: pytest.LogCaptureFixture
) -> None:
    """Starting the child again raised (no fork for now: memory, pids; the command gone):
    the watch ended, and with it (a background task that fails stops the frontend) the
    whole fleet. It is logged and tried again after the next wait."""
    clock = Clock()
    child = starts.child("worker 0 (agg)", exiting(1), clock)
    failing = True

    def start(command: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        if failing:
            raise BlockingIOError(11, "Resource temporarily unavailable")
        return starts(command, env)

    watch = ChildWatch([child], start, clock=clock)
    child.proc.wait()
    watch.check()  # noticed: starts again at FIRST_WAIT_S
    clock.now_s = FIRST_WAIT_S
    watch.check()  # the start raises: logged, tried again after twice the wait
    assert "worker 0 (agg) could not be started again" in caplog.text
    assert child.restart_at_s == FIRST_WAIT_S + 2 * FIRST_WAIT_S and watch.num_restarts == 0
    failing = False
    clock.now_s = 3 * FIRST_WAIT_S
    watch.check()
    assert watch.num_restarts == 1 and child.proc is starts.procs[-1]


def test_the_fleet_stopping_signals_the_children_that_drain_beside_it(starts: Starts) -> None:
    """serve's frontend replicas are told as soon as serve's frontend stops listening (they
    kept accepting connections on the shared port until it had drained); the workers are
    left serving, and nothing is started again."""
    clock = Clock()
    replica = dataclasses.replace(starts.child("replica", SLEEPING, clock), drains_beside=True)
    worker = starts.child("worker", SLEEPING, clock)
    stopping = False
    watch = ChildWatch([replica, worker], starts, lambda: stopping, clock)
    watch.signal_drainers()
    assert replica.proc.wait(timeout=30) == -signal.SIGTERM
    assert worker.proc.poll() is None
    stopping = True
    watch.check()
    assert (replica.restart_at_s, replica.stopped, watch.num_restarts) == (None, False, 0)
    assert len(starts.procs) == 2


def test_stop_processes_waits_out_the_grace_then_kills() -> None:
    """serve stops its children with their shutdown grace (it killed them after 20 s
    whatever --shutdown-grace-s said): one that drains within it ends by itself, one that
    does not is killed once the grace and the margin are over."""
    drains = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))"
    slow = "import signal, time; signal.signal(signal.SIGTERM, lambda *a: time.sleep(600))"
    ready = "; print('ready', flush=True); time.sleep(600)"
    procs = [
        subprocess.Popen([sys.executable, "-c", code + ready], stdout=subprocess.PIPE)
        for code in (drains, slow)
    ]
    try:
        for proc in procs:  # their handlers are in place
            assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        started_s = time.monotonic()
        stop_processes(procs, grace_s=0.5)
        waited_s = time.monotonic() - started_s
        assert [p.returncode for p in procs] == [0, -signal.SIGKILL]
        assert waited_s >= 0.5 + STOP_MARGIN_S
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            assert proc.stdout is not None
            proc.stdout.close()
