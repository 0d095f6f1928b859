"""The planner with the `local` connector and mocker workers, as processes: it starts the
fleet's minimum, adds a worker under a step load (which then receives traffic), and removes
it when the load stops, draining it: no request fails. Bounded: at most 2 workers, a fixed
number of client threads, every wait an event with a deadline."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from fleet import Fleet, decisions

from conftest import SERVED_MODEL_NAME, _free_port, _wait_healthy, parse_metrics

DEADLINE_S = 120.0
# a mocker at real H100 speed on a small KV cache: a burst fills it and its decode steps
# (-25.74 u^2 + 54.01 u + 5.74 ms at KV use u) pass the 15 ms ITL target; a single request
# steps in ~6 ms, well under half of it
WORKER_ARGS = (
    "--engine mocker --speedup-ratio 1 --num-kv-blocks 96 --max-num-seqs 32 "
    f"--served-model-name {SERVED_MODEL_NAME} --lease-ttl-s 2 --shutdown-grace-s 30"
)
TABLE = {
    "format": "armature-planner-table/1",
    "model": SERVED_MODEL_NAME,
    "prefill_tokens": [16, 1024],
    "prefill_s": [0.017, 0.032],
    "decode_requests": [1, 32],
    "decode_context_tokens": [128, 1536],
    "decode_step_s": [[0.006, 0.012], [0.015, 0.034]],
    "max_num_seqs": 32,
    "max_kv_tokens": 1536,
}


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


@pytest.mark.integration
def test_the_planner_adds_a_worker_under_load_and_drains_it_after(
    default_model_dir: Path, tmp_path: Path
) -> None:
    fleet = Fleet(default_model_dir, tmp_path)
    table = tmp_path / "table.json"
    table.write_text(json.dumps(TABLE))
    metrics_port = _free_port()
    frontend_port = _free_port()
    planner_log = tmp_path / "planner.log"
    planner = fleet._spawn(
        "planner",
        [
            "planner",
            "--planner-mode", "agg",
            "--min-workers", "1",
            "--max-workers", "2",
            "--ttft-ms", "2000",
            "--itl-ms", "15",
            "--load-interval-s", "0.5",
            "--planner-interval-s", "3600",
            "--planner-queue-blind",
            "--scale-up-cooldown-s", "1",
            "--scale-down-cooldown-s", "3",
            "--performance-model", str(table),
            "--frontend-url", f"http://127.0.0.1:{frontend_port}",
            "--frontend-wait-s", "120",
            "--worker-args", f"--model {default_model_dir} {WORKER_ARGS}",
            "--worker-log-dir", str(tmp_path / "workers"),
            "--metrics-port", str(metrics_port),
            *fleet.runtime_args(),
        ],
    )  # fmt: skip
    load: Load | None = None
    trickle: Load | None = None
    try:
        # the planner starts the minimum (one worker) before the frontend can answer
        wait_for("the first worker", lambda: len(fleet.registered()) == 1, planner_log)
        url = f"http://127.0.0.1:{frontend_port}"
        frontend_args = ["frontend", "--port", str(frontend_port), "--host", "127.0.0.1"]
        frontend = fleet._spawn("frontend", [*frontend_args, *fleet.runtime_args()])
        _wait_healthy(frontend, url, tmp_path / "frontend.log")
        fleet.wait_for_log("planner", "planner ready", planner)
        first = set(decisions(url)) | _worker_ids(fleet)

        load = Load(url, num_clients=24, max_tokens=64)
        wait_for("a second worker", lambda: len(fleet.registered()) == 2, planner_log)
        second = _worker_ids(fleet) - first
        assert len(second) == 1
        wait_for(
            "traffic on the second worker",
            lambda: decisions(url).get(next(iter(second)), 0) > 0,
            planner_log,
        )
        statuses = load.stop()
        load = None
        log_text = planner_log.read_text()
        assert re.search(r"planner: agg 1 -> 2 workers, (itl|ttft)_above_target", log_text)

        # a trickle of single requests, well under the targets: the planner removes a
        # worker while these run; draining loses none of them
        trickle = Load(url, num_clients=1, max_tokens=32)
        wait_for("the scale-down", lambda: len(fleet.registered()) == 1, planner_log)
        wait_for(
            "the drained worker to exit", lambda: "stopped" in planner_log.read_text(), planner_log
        )
        statuses += trickle.stop()
        trickle = None
        assert "planner: agg 2 -> 1 workers, below_target" in planner_log.read_text()
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
        for running in (load, trickle):
            if running is not None:
                running.stop()
        fleet.stop()  # SIGTERM: the planner drains and stops the workers it started
    assert planner.returncode == 0
    assert fleet.registered() == []
    fleet.assert_no_tracebacks()
    for worker_log in (tmp_path / "workers").glob("*.log"):
        assert "Traceback" not in worker_log.read_text(), worker_log.name


def _worker_ids(fleet: Fleet) -> set[str]:
    """worker-<hex> of every worker in discovery (the entries' keys end with the hex id)."""
    return {"worker-" + name.rsplit("%2F", 1)[-1] for name in fleet.registered()}
