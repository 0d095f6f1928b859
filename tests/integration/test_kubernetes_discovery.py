"""A frontend and a mocker worker as processes with `--discovery kubernetes`: the worker
writes its card into its Pod's annotation, the frontend routes to it only while the Pod is
Ready, and its KV events reach the router over the zmq event plane at the address the card
carries (no NATS).

The cluster (tests/kube_cluster.py) is the fake API server set up through its API, or, with
ARMATURE_TEST_KUBE=cluster, a real one: both processes run here, outside it, and only their
discovery goes through its API server; the Pod is a placeholder that no node runs, whose
readiness the test sets (its card still names this machine's loopback address)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import msgspec
import pytest
from fleet import Fleet
from serve_process import parse_metrics

from armature.protocols.worker import WorkerCard
from armature.runtime.kube_membership import ANNOTATION, decode_entries
from kube_api import POD_RULES
from kube_cluster import FakeSetup, KubeCluster, get_drivers, open_cluster

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LABELS = {"armature.dev/namespace": "armature"}
MOCKER_ARGS = ["--engine", "mocker", "--speedup-ratio", "100", "--num-kv-blocks", "256"]
MOCKER_ARGS += ["--served-model-name", "mock"]
BODY = {"model": "mock", "prompt": "tell me a long story " * 8, "max_tokens": 4}


@pytest.fixture(params=get_drivers(slow=True))
def cluster(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[KubeCluster]:
    setup = FakeSetup(token="sa-token", rules=POD_RULES, user="armature")
    with open_cluster(request.param, setup) as found:
        monkeypatch.setenv("KUBECONFIG", str(found.kubeconfig))  # the processes inherit it
        yield found


def wait_for_status(url: str, status: int) -> httpx.Response:
    """Send the request until it is answered `status` (routing follows the Pod's readiness
    within a watch event's delivery; bounded, so a missed change fails the test)."""
    deadline = time.monotonic() + 30
    while True:
        response = httpx.post(f"{url}/v1/completions", json=BODY, timeout=30)
        if response.status_code == status or time.monotonic() > deadline:
            assert response.status_code == status, response.text
            return response
        time.sleep(0.1)


def test_a_worker_pod_serves_while_ready(
    cluster: KubeCluster, default_model_dir: Path, tmp_path: Path
) -> None:
    fleet = Fleet(default_model_dir, tmp_path, ["--discovery", "kubernetes"], MOCKER_ARGS)
    cluster.add_pod("w0", labels=LABELS)  # scheduled, its readiness probe not passed yet
    try:
        fleet.start_worker("w0", ["--k8s-pod-name", "w0"])
        entries = decode_entries(cluster.get_pod_annotations("w0")[ANNOTATION])
        [(key, value)] = entries.items()
        card = msgspec.msgpack.decode(value, type=WorkerCard)
        assert key == f"instances/armature/worker/generate/{card.instance_id:x}"
        assert card.events_url.startswith("tcp://127.0.0.1:")  # zmq, at the worker's --host

        cluster.set_ready("w0", True)  # the kubelet's probe passed
        url = fleet.start_frontend()
        first = wait_for_status(url, 200)
        assert first.json()["usage"]["completion_tokens"] == 4
        metrics = parse_metrics(httpx.get(f"{url}/metrics", timeout=10).text)
        assert metrics[f'armature_router_decisions_total{{worker="{card.worker_id}"}}'] == 1.0
        # the worker's KV events came over zmq: the router's index holds the prompt's blocks
        deadline = time.monotonic() + 30
        while (
            parse_metrics(httpx.get(f"{url}/metrics", timeout=10).text).get(
                "armature_router_index_blocks", 0.0
            )
            == 0.0
        ):
            assert time.monotonic() < deadline, "no KV event reached the router"
            time.sleep(0.1)

        cluster.set_ready("w0", False)  # probe failing: out of routing
        refused = wait_for_status(url, 503)
        assert refused.json()["error"]["code"] == "engine_unavailable"
        cluster.set_ready("w0", True)  # back
        wait_for_status(url, 200)
    finally:
        fleet.stop()
    # a clean stop removed the card from the Pod
    assert ANNOTATION not in cluster.get_pod_annotations("w0")
    fleet.assert_no_tracebacks()
