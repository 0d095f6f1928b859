"""The planner with the `local` connector and mocker workers, as processes, sized by a timing
profile of that worker (`armature profile`): it starts the fleet's minimum, adds a worker
under a step load (which then receives traffic), and removes it when the load stops, draining
it: no request fails. Aggregated, and disaggregated (the worker added is a decode one).
Bounded: at most 3 workers, a fixed number of client threads, every wait an event with a
deadline."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import msgspec
import pytest
from fleet import Fleet, decisions
from serve_process import SERVED_MODEL_NAME, _free_port, _wait_healthy, parse_metrics

from armature.protocols.timing_profile import read_profile
from armature.protocols.worker import WorkerCard, worker_prefix
from armature.runtime.discovery_file import FileDiscovery
from profiles import write_small_profile

DEADLINE_S = 120.0
# a mocker at real H100 speed on a small KV cache: a burst fills it and its decode steps
# (-25.74 u^2 + 54.01 u + 5.74 ms at KV use u) pass the 15 ms ITL target; a single request
# steps in ~6 ms, well under half of it
ENGINE_ARGS = (
    "--engine mocker --speedup-ratio 1 --num-kv-blocks 96 --max-num-seqs 32 "
    f"--served-model-name {SERVED_MODEL_NAME}"
)
WORKER_ARGS = f"{ENGINE_ARGS} --lease-ttl-s 2 --shutdown-grace-s 30"
# the planner's performance model: that worker profiled (a few seconds; 32 requests of at
# most 48 tokens fill the 96 blocks)
SWEEP_ARGS = (
    "--prefill-input-tokens 16,256,1024 --prefill-repeats 1 --prefill-batch-requests 0 "
    "--decode-requests 1,8,32 --decode-context-tokens 16,40 --decode-output-tokens 4"
)


def profile_worker(model_dir: Path, path: Path) -> None:
    """`armature profile` of the mocker worker the planner starts, written to `path`."""
    argv = ["profile", "--model", str(model_dir), *ENGINE_ARGS.split(), *SWEEP_ARGS.split()]
    done = subprocess.run(
        [sys.executable, "-m", "armature.cli", *argv, "--output", str(path)],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
    )
    assert done.returncode == 0, done.stderr
    profile = read_profile(path)
    assert (profile.num_kv_blocks, profile.max_num_seqs) == (96, 32)


def start_planner(
    fleet: Fleet, mode: str, frontend_port: int, extra: list[str]
) -> subprocess.Popen[bytes]:
    """The planner in `mode` with the local connector: 1 to 2 workers of each role, scaled
    by the load rule alone on the worker's profile (taken first), for a frontend (not yet
    started) on `frontend_port`; its log is planner.log, its workers' logs in workers/."""
    profile = fleet.root / "profile.json"
    profile_worker(fleet.model_dir, profile)
    return fleet._spawn(
        "planner",
        [
            "planner",
            "--planner-mode", mode,
            "--min-workers", "1",
            "--max-workers", "2",
            "--ttft-ms", "2000",
            "--itl-ms", "15",
            "--load-interval-s", "0.5",
            "--planner-interval-s", "3600",
            "--planner-queue-blind",
            "--scale-up-cooldown-s", "1",
            "--scale-down-cooldown-s", "3",
            # down below 12 ms of live ITL: a lone request's ~6 ms steps with room for a
            # loaded machine's slower ones; a burst's full-KV steps run ~30 ms
            "--scale-down-ratio", "0.8",
            "--performance-model", str(profile),
            "--frontend-url", f"http://127.0.0.1:{frontend_port}",
            "--frontend-wait-s", "120",
            "--worker-args", f"--model {fleet.model_dir} {WORKER_ARGS}",
            "--worker-log-dir", str(fleet.root / "workers"),
            *extra,
            *fleet.runtime_args(),
        ],
    )  # fmt: skip


def assert_stopped_cleanly(fleet: Fleet, planner: subprocess.Popen[bytes]) -> None:
    """After `fleet.stop()`: the planner exited 0 having stopped its workers, no tracebacks."""
    assert planner.returncode == 0
    assert fleet.registered() == []
    fleet.assert_no_tracebacks()
    for worker_log in (fleet.root / "workers").glob("*.log"):
        assert "Traceback" not in worker_log.read_text(), worker_log.name


def wait_for(what: str, check: Callable[[], bool], log: Path) -> None:
    deadline_s = time.monotonic() + DEADLINE_S
    while not check():
        if time.monotonic() > deadline_s:
            pytest.fail(f"timed out waiting for {what}:\n{log.read_text(errors='replace')}")
        time.sleep(0.1)


class Load:
    """`num_clients` threads sending completions until stopped; every status kept."""

    def __init__(self, url: str, num_clients: int, max_tokens: int) -> None:
        self.url = url
        self.max_tokens = max_tokens
        self.statuses: list[int] = []
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(num_clients)
        self._futures = [self._pool.submit(self._client, i) for i in range(num_clients)]

    def _client(self, index: int) -> None:
        with httpx.Client(timeout=60.0) as client:
            n = 0
            while not self._stop.is_set():
                n += 1
                body = {
                    "model": SERVED_MODEL_NAME,
                    "prompt": f"client {index} request {n}: tell me a long story",
                    "max_tokens": self.max_tokens,
                    "ignore_eos": True,
                }
                response = client.post(f"{self.url}/v1/completions", json=body)
                self.statuses.append(response.status_code)

    def stop(self) -> list[int]:
        self._stop.set()
        for future in self._futures:
            future.result()
        self._pool.shutdown()
        return self.statuses


def burst_until_scaled_up(
    fleet: Fleet, url: str, num_workers: int, log: Path
) -> tuple[dict[str, str], list[int]]:
    """24 clients of 64-token completions until the planner runs `num_workers` workers and
    the one it added has been routed a request: that worker (id -> role) and the statuses."""
    before = _worker_roles(fleet)
    load = Load(url, num_clients=24, max_tokens=64)
    try:
        wait_for(f"{num_workers} workers", lambda: len(fleet.registered()) == num_workers, log)
        added = {w: r for w, r in _worker_roles(fleet).items() if w not in before}
        assert len(added) == 1, added
        wait_for(
            "traffic on the added worker", lambda: decisions(url).get(next(iter(added)), 0) > 0, log
        )
    finally:
        statuses = load.stop()
    return added, statuses


def trickle_until_scaled_down(fleet: Fleet, url: str, num_workers: int, log: Path) -> list[int]:
    """Single requests, well under the targets, until the planner is back to `num_workers`
    workers and the one it removed has drained and exited (while these run): the statuses."""
    trickle = Load(url, num_clients=1, max_tokens=32)
    try:
        wait_for("the scale-down", lambda: len(fleet.registered()) == num_workers, log)
        wait_for("the drained worker to exit", lambda: "stopped" in log.read_text(), log)
    finally:
        statuses = trickle.stop()
    return statuses


def start_frontend(fleet: Fleet, port: int, extra: list[str]) -> str:
    """The frontend on `port`, once healthy; its url."""
    url = f"http://127.0.0.1:{port}"
    args = ["frontend", "--port", str(port), "--host", "127.0.0.1", *extra]
    frontend = fleet._spawn("frontend", [*args, *fleet.runtime_args()])
    _wait_healthy(frontend, url, fleet.root / "frontend.log")
    return url


@pytest.mark.integration
def test_the_planner_adds_a_worker_under_load_and_drains_it_after(
    default_model_dir: Path, tmp_path: Path
) -> None:
    fleet = Fleet(default_model_dir, tmp_path)
    metrics_port = _free_port()
    frontend_port = _free_port()
    log = tmp_path / "planner.log"
    planner = start_planner(fleet, "agg", frontend_port, ["--metrics-port", str(metrics_port)])
    try:
        # the planner starts the minimum (one worker) before the frontend can answer
        wait_for("the first worker", lambda: len(fleet.registered()) == 1, log)
        url = start_frontend(fleet, frontend_port, [])
        fleet.wait_for_log("planner", "planner ready", planner)
        _assert_a_profile_of_another_model_is_refused(fleet, url, tmp_path)

        _, statuses = burst_until_scaled_up(fleet, url, 2, log)
        assert re.search(r"planner: agg 1 -> 2 workers, (itl|ttft)_above_target", log.read_text())
        # draining loses none of the trickle's requests
        statuses += trickle_until_scaled_down(fleet, url, 1, log)
        assert "planner: agg 2 -> 1 workers, below_target" in log.read_text()
        assert statuses and set(statuses) == {200}, sorted(set(statuses))
        planner_metrics = parse_metrics(
            httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
        )
        assert planner_metrics['armature_planner_target_workers{role="agg"}'] == 1
        assert (
            planner_metrics['armature_planner_decisions_total{reason="below_target",role="agg"}']
            == 1
        )
    finally:
        fleet.stop()  # SIGTERM: the planner drains and stops the workers it started
    assert_stopped_cleanly(fleet, planner)


@pytest.mark.integration
def test_the_disagg_planner_adds_a_decode_worker_under_load_and_drains_it_after(
    default_model_dir: Path, tmp_path: Path
) -> None:
    """Disaggregated: the planner starts one prefill and one decode worker; a decode-heavy
    burst (short prompts, every one prefilled on the prefill worker) passes the ITL target
    but not the TTFT one, so it adds a decode worker, never a prefill one; the new decode
    worker gets traffic, and the trickle after lets the planner drain it. At most 3 workers."""
    fleet = Fleet(default_model_dir, tmp_path)
    frontend_port = _free_port()
    log = tmp_path / "planner.log"
    planner = start_planner(fleet, "disagg", frontend_port, ["--metrics-port", "-1"])
    try:
        wait_for("the first two workers", lambda: len(fleet.registered()) == 2, log)
        assert sorted(_worker_roles(fleet).values()) == ["decode", "prefill"]
        url = start_frontend(fleet, frontend_port, ["--enforce-disagg"])
        fleet.wait_for_log("planner", "planner ready", planner)

        added, statuses = burst_until_scaled_up(fleet, url, 3, log)
        assert list(added.values()) == ["decode"]
        assert re.search(r"planner: decode 1 -> 2 workers, itl_above_target", log.read_text())
        prefills = parse_metrics(httpx.get(f"{url}/metrics", timeout=10).text)
        assert prefills['armature_router_prefills_total{where="remote"}'] >= len(statuses)
        assert prefills.get('armature_router_prefills_total{where="local"}', 0.0) == 0.0

        statuses += trickle_until_scaled_down(fleet, url, 2, log)
        assert "planner: decode 2 -> 1 workers, below_target" in log.read_text()
        assert "planner: prefill 1 -> 2" not in log.read_text()
        assert sorted(_worker_roles(fleet).values()) == ["decode", "prefill"]
        assert statuses and set(statuses) == {200}, sorted(set(statuses))
    finally:
        fleet.stop()
    assert_stopped_cleanly(fleet, planner)


def _assert_a_profile_of_another_model_is_refused(fleet: Fleet, url: str, tmp_path: Path) -> None:
    """A second planner given a profile of another model than the frontend serves stops
    before acting: one line, exit code 2. It reads the frontend from discovery, at the
    address the frontend's card names."""
    other = tmp_path / "other-profile.json"
    write_small_profile(other, model="another-model")
    argv = ["planner", "--dry-run", "--performance-model", str(other)]
    argv += ["--metrics-port", "-1", *fleet.runtime_args()]
    done = subprocess.run(
        [sys.executable, "-m", "armature.cli", *argv],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    # refused before it reads the workers, each of which would warn of the other model
    assert "joined" not in done.stderr and "timing profile was measured" not in done.stderr
    own = re.search(r"this replica alone: (http://\S+)\)", fleet.log_text("frontend"))
    assert own, fleet.log_text("frontend")
    assert done.stderr.splitlines()[-1] == (  # after the log lines of its start
        "armature: error: --performance-model was measured on model 'another-model'; the "
        f"frontend at {own.group(1)} serves '{SERVED_MODEL_NAME}' (profile that model)"
    )


def _worker_roles(fleet: Fleet) -> dict[str, str]:
    """worker-<hex> -> role of every worker card in discovery."""

    async def read() -> dict[str, bytes]:
        discovery = FileDiscovery(fleet.discovery_dir)
        try:
            return await discovery.list(worker_prefix("armature"))
        finally:
            await discovery.close()

    cards = [msgspec.msgpack.decode(v, type=WorkerCard) for v in asyncio.run(read()).values()]
    return {card.worker_id: card.role.value for card in cards}


@pytest.mark.integration
def test_a_planner_stopped_while_it_waits_for_the_frontend_stops_its_workers(
    default_model_dir: Path, tmp_path: Path
) -> None:
    """SIGTERM while the planner waits for a frontend (the README starts the planner first):
    it ended on the spot (exit -15), its clean-up skipped; now it drains the worker it
    started, leaves discovery and exits 0."""
    fleet = Fleet(default_model_dir, tmp_path)
    log = tmp_path / "planner.log"
    planner = start_planner(fleet, "agg", _free_port(), [])  # no frontend ever answers
    try:
        wait_for("the first worker", lambda: len(fleet.registered()) == 1, log)
        fleet.wait_for_log("planner", "waiting up to", planner)
    finally:
        fleet.stop()
    assert_stopped_cleanly(fleet, planner)
    assert "planner stopping before it read the frontend" in log.read_text()
