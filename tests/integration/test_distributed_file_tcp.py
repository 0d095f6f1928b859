"""Frontend and workers as separate processes on the embedded runtime (file discovery, TCP
request plane): greedy outputs equal the single-process server's, a kill -9'd worker leaves
discovery within its lease and traffic goes on, a new worker joins and gets traffic, and a
clean stop leaves no registration behind."""

from __future__ import annotations

import signal
import time

import httpx
import pytest
from fleet import LEASE_TTL_S, PROMPTS, SERVED_MODEL_NAME, Fleet, complete, decisions


@pytest.mark.slow
@pytest.mark.integration
def test_processes_serve_fail_over_and_join(fleet: Fleet, base_url: str) -> None:
    first = fleet.start_worker("worker-a")
    fleet.start_worker("worker-b")
    url = fleet.start_frontend()
    expected = [complete(base_url, p) for p in PROMPTS]  # the single-process server
    assert [complete(url, p) for p in PROMPTS] == expected
    # one request can be followed through the frontend's and a worker's logs
    response = httpx.post(
        f"{url}/v1/completions",
        json={"model": SERVED_MODEL_NAME, "prompt": "trace me", "max_tokens": 2},
        timeout=60,
    )
    request_id = response.headers["x-request-id"]
    assert request_id == response.json()["id"]
    logs = logs_naming(fleet, request_id)
    assert request_id in logs["frontend.log"]
    assert sum(request_id in text for name, text in logs.items() if name != "frontend.log") == 1
    assert len(fleet.registered()) == 2

    first.send_signal(signal.SIGKILL)
    killed_s = time.monotonic()
    for prompt in PROMPTS:  # no request is lost: one routed to the dead worker is rerouted
        assert complete(url, prompt) in expected
    while len(fleet.registered()) != 1:
        assert time.monotonic() - killed_s < LEASE_TTL_S + 2.0, "the dead worker lingers"
        time.sleep(0.1)

    before = decisions(url)
    fleet.start_worker("worker-c")
    deadline = time.monotonic() + 30
    joined: set[str] = set()
    while not joined and time.monotonic() < deadline:
        # fresh prompts have no cached prefix anywhere: kv routing spreads them by load and
        # cache size, so the new, empty worker gets its share
        complete(url, f"Question {time.monotonic()}: what is new?")
        joined = set(decisions(url)) - set(before)
    assert len(joined) == 1

    fleet.stop()
    assert fleet.registered_keys() == []  # clean stops deregister (workers and the frontend)


def logs_naming(fleet: Fleet, request_id: str) -> dict[str, str]:
    """Every process's log, once the frontend's and some worker's name the request: each
    writes its line when the request ends there, which may come after the response."""
    deadline = time.monotonic() + 30
    while True:
        logs = {p.name: p.read_text() for p in fleet.root.glob("*.log")}
        frontend = request_id in logs.get("frontend.log", "")
        worker = any(request_id in text for name, text in logs.items() if name != "frontend.log")
        if (frontend and worker) or time.monotonic() > deadline:
            return logs
        time.sleep(0.05)
