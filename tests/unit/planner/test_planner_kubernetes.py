"""The `kubernetes` connector with the real client (lightkube), found through a kubeconfig.

The behavioural tests take a `cluster` (tests/kube_cluster.py): the fake API server that
speaks the real HTTP protocol (tests/kube_api.py), set up through its back door or through its
API, or, with ARMATURE_TEST_KUBE=cluster, a real cluster: the replicas read and changed, a
missing Deployment, the planner's start; on the fake, also the exact requests (only GET and
PATCH of deployments/scale, the merge-patch bodies, the bearer token). The others need the
fake's internals (`fake_only`): one-line start errors (401, 403, no server), and a server that
goes down mid-run: the actuator logs the failure, retries, and finishes once it is back."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from armature.cli.main import main
from armature.config import PlannerConfig
from armature.errors import ConfigError
from armature.planner.actuator import Actuator
from armature.planner.connectors.api import ConnectorError
from armature.planner.connectors.kubernetes import open_kubernetes_connector
from armature.planner.core import Planner
from armature.planner.timing_performance import TimingPerformanceModel
from armature.protocols.worker import WorkerRole
from kube_api import SCALE_RULES, KubeApiFake, RecordedRequest
from kube_cluster import FakeSetup, KubeCluster, fake_only, get_drivers, open_cluster
from profiles import write_small_profile
from servers import free_port

PREFILL, DECODE = WorkerRole.PREFILL, WorkerRole.DECODE
TOKEN = "planner-sa-token"
NAMESPACE = "serving"
DEPLOYMENTS = {PREFILL: "armature-prefill", DECODE: "armature-decode"}
SCALE_PATH = "/apis/apps/v1/namespaces/serving/deployments/{}/scale"
MERGE_PATCH = "application/merge-patch+json"


def get(name: str) -> tuple[str, str, str, str | None, object, int]:
    return ("GET", SCALE_PATH.format(name), "", None, None, 200)


def patch(name: str, replicas: int, status: int = 200) -> tuple[str, str, str, str, object, int]:
    body = {"spec": {"replicas": replicas}}
    return (
        "PATCH",
        SCALE_PATH.format(name),
        "fieldManager=armature-planner",
        MERGE_PATCH,
        body,
        status,
    )


def calls(fake: KubeApiFake) -> list[tuple[object, ...]]:
    """The requests, with the token checked on each (every one carries the right one)."""
    requests = fake.get_requests()
    assert {r.authorization for r in requests} <= {f"Bearer {TOKEN}"}
    return [_call(r) for r in requests]


def _call(r: RecordedRequest) -> tuple[object, ...]:
    return (r.method, r.path, r.query, r.content_type, r.body, r.status)


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[KubeApiFake]:
    """A started fake with both Deployments; KUBECONFIG points at it."""
    server = KubeApiFake(
        token=TOKEN, namespace=NAMESPACE, deployments={"armature-prefill": 1, "armature-decode": 2}
    )
    with server:
        monkeypatch.setenv("KUBECONFIG", str(server.write_kubeconfig(tmp_path / "kubeconfig")))
        yield server


@pytest.fixture(params=get_drivers())
def cluster(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[KubeCluster]:
    """A namespace of the cluster a driver sets up, with both Deployments (prefill 1, decode
    2); KUBECONFIG points at it."""
    setup = FakeSetup(token=TOKEN, rules=SCALE_RULES, user="planner", namespace=NAMESPACE)
    with open_cluster(request.param, setup) as found:
        found.add_deployment("armature-prefill", 1)
        found.add_deployment("armature-decode", 2)
        monkeypatch.setenv("KUBECONFIG", str(found.kubeconfig))
        yield found


def scale_path(cluster: KubeCluster, name: str) -> str:
    return f"/apis/apps/v1/namespaces/{cluster.namespace}/deployments/{name}/scale"


async def test_reads_replicas_then_merge_patches_only_the_scale_subresource(
    cluster: KubeCluster,
) -> None:
    connector = await open_kubernetes_connector(DEPLOYMENTS)  # the context's namespace
    try:
        assert connector.get_num_workers() == {PREFILL: 1, DECODE: 2}
        await connector.scale(DECODE, 4, "itl_above_target")
        await connector.scale(PREFILL, 0, "below_target")
        assert connector.get_num_workers() == {PREFILL: 0, DECODE: 4}
    finally:
        await connector.close()
    assert [cluster.get_replicas(name) for name in DEPLOYMENTS.values()] == [0, 4]
    if cluster.fake is None:
        return
    assert calls(cluster.fake) == [
        get("armature-prefill"),
        get("armature-decode"),
        patch("armature-decode", 4),
        patch("armature-prefill", 0),
    ]
    assert cluster.fake.deployments == {
        ("serving", "armature-prefill"): 0,
        ("serving", "armature-decode"): 4,
    }


async def test_an_explicit_namespace_wins_over_the_context(
    cluster: KubeCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster.add_deployment("armature-agg", 3)
    elsewhere = cluster.write_kubeconfig(tmp_path / "kc", namespace=f"{cluster.namespace}-not")
    monkeypatch.setenv("KUBECONFIG", str(elsewhere))  # a context naming another namespace
    connector = await open_kubernetes_connector(
        {WorkerRole.AGG: "armature-agg"}, namespace=cluster.namespace
    )
    await connector.scale(WorkerRole.AGG, 2, "below_target")
    await connector.close()
    assert cluster.get_replicas("armature-agg") == 2
    if cluster.fake is not None:
        path = scale_path(cluster, "armature-agg")
        requests = cluster.fake.get_requests()
        assert [(r.method, r.path) for r in requests] == [("GET", path), ("PATCH", path)]


@fake_only("the fake refuses a token of the test's choosing")
async def test_refused_credentials_are_a_one_line_error(
    fake: KubeApiFake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kubeconfig = fake.write_kubeconfig(tmp_path / "wrong", token="expired")
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    with pytest.raises(ConfigError) as caught:
        await open_kubernetes_connector(DEPLOYMENTS)
    message = str(caught.value)
    assert "\n" not in message
    assert f"API server {fake.url}, credentials from {kubeconfig}" in message
    assert "refused the credentials (401 Unauthorized)" in message
    assert [(r.method, r.status, r.authorization) for r in fake.get_requests()] == [
        ("GET", 401, "Bearer expired")
    ]


async def test_a_missing_deployment_is_an_error_naming_it_and_its_flag(
    cluster: KubeCluster,
) -> None:
    with pytest.raises(ConfigError) as caught:
        await open_kubernetes_connector({PREFILL: "armature-prefill", DECODE: "decoders"})
    message = str(caught.value)
    assert "\n" not in message
    expected = f"Deployment {cluster.namespace}/decoders not found (404) (check --k8s-decode-"
    assert expected in message
    if cluster.fake is not None:
        assert calls(cluster.fake) == [get("armature-prefill"), (*get("decoders")[:5], 404)]


@fake_only("the RBAC rules are the fake's")
async def test_a_role_without_patch_rights_fails_its_scale_with_the_rbac_rule(
    fake: KubeApiFake,
) -> None:
    fake.rules.discard(("patch", "apps", "deployments/scale"))
    connector = await open_kubernetes_connector(DEPLOYMENTS)
    with pytest.raises(
        ConnectorError,
        match="forbidden to patch the scale of Deployment "
        "serving/armature-decode \\(403\\): the service account needs get and "
        "patch on deployments/scale in namespace serving",
    ):
        await connector.scale(DECODE, 3, "itl_above_target")
    assert connector.get_num_workers() == {PREFILL: 1, DECODE: 2}
    await connector.close()
    assert calls(fake)[-1] == patch("armature-decode", 3, status=403)


@fake_only("the fake API server is stopped")
async def test_an_unreachable_api_server_is_a_one_line_error(fake: KubeApiFake) -> None:
    fake.stop()
    with pytest.raises(ConfigError) as caught:
        await open_kubernetes_connector(DEPLOYMENTS)
    assert "the API server is unreachable (get Deployment serving/armature-prefill): " in str(
        caught.value
    )


async def test_no_configuration_is_a_one_line_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    with pytest.raises(ConfigError) as caught:
        await open_kubernetes_connector(DEPLOYMENTS)
    assert "no usable cluster configuration" in str(caught.value)
    assert f"{tmp_path / 'none'} not found" in str(caught.value)


@fake_only("the fake API server is stopped and started")
async def test_the_actuator_retries_while_the_api_server_is_down_and_recovers(
    fake: KubeApiFake, caplog: pytest.LogCaptureFixture
) -> None:
    connector = await open_kubernetes_connector(DEPLOYMENTS)
    failed = asyncio.Event()
    num_failures = 0

    def on_failure() -> None:
        nonlocal num_failures
        num_failures += 1
        failed.set()

    actuator = Actuator(connector, retry_s=0.05, on_failure=on_failure)
    task = asyncio.create_task(actuator.run())
    try:
        fake.stop()
        with caplog.at_level(logging.ERROR, logger="armature.planner.actuator"):
            actuator.set_targets({PREFILL: 1, DECODE: 3}, {DECODE: "itl_above_target"})
            await asyncio.wait_for(failed.wait(), 10.0)
        assert "scaling decode to 3 failed (retrying in 0 s): the API server is unreachable " in (
            caplog.text
        )
        assert connector.get_num_workers() == {PREFILL: 1, DECODE: 2}
        fake.start()  # the same port
        await asyncio.wait_for(actuator.idle.wait(), 10.0)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await connector.close()
    assert num_failures >= 1
    assert connector.get_num_workers() == {PREFILL: 1, DECODE: 3}
    # the failed attempts never reached the server: two reads at start, then the one patch
    assert calls(fake) == [
        get("armature-prefill"),
        get("armature-decode"),
        patch("armature-decode", 3),
    ]
    assert fake.deployments[("serving", "armature-decode")] == 3


async def test_the_planner_starts_from_the_deployments_within_its_limits(
    cluster: KubeCluster, profile: TimingPerformanceModel
) -> None:
    """As `armature planner` starts: the planner takes the Deployments' replicas, brought
    within its limits, and the actuator patches only the role outside them."""
    deployments = {PREFILL: "starting-prefill", DECODE: "starting-decode"}
    cluster.add_deployment("starting-prefill", 0)
    cluster.add_deployment("starting-decode", 9)
    connector = await open_kubernetes_connector(deployments)
    planner = Planner(
        PlannerConfig(min_workers=1, max_workers=4),
        profile,
        num_workers=connector.get_num_workers(),
    )
    assert planner.get_num_workers() == {PREFILL: 1, DECODE: 4}
    actuator = Actuator(connector, retry_s=0.05)
    actuator.set_targets(planner.get_num_workers(), {})
    task = asyncio.create_task(actuator.run())
    try:
        await asyncio.wait_for(actuator.idle.wait(), 10.0)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await connector.close()
    assert [cluster.get_replicas(name) for name in deployments.values()] == [1, 4]
    if cluster.fake is not None:
        assert calls(cluster.fake) == [
            get("starting-prefill"),
            get("starting-decode"),
            patch("starting-prefill", 1),
            patch("starting-decode", 4),
        ]


@fake_only("it checks the fake itself")
def test_the_fake_enforces_the_token_and_the_rbac_scope(fake: KubeApiFake) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    deployment = "/apis/apps/v1/namespaces/serving/deployments/armature-decode"
    with httpx.Client(base_url=fake.url) as client:
        assert client.get(deployment + "/scale").status_code == 401
        assert client.get(deployment + "/scale", headers=auth).status_code == 200
        assert client.get(deployment, headers=auth).status_code == 403
        assert client.get("/api/v1/namespaces/serving/pods", headers=auth).status_code == 403
        assert client.put(deployment + "/scale", json={}, headers=auth).status_code == 403
        answer = client.patch(
            deployment + "/scale",
            content=b'[{"op": "replace", "path": "/spec/replicas", "value": 1}]',
            headers={**auth, "Content-Type": "application/json-patch+json"},
        )
        assert answer.status_code == 415
    assert fake.deployments[("serving", "armature-decode")] == 2


@fake_only("the fake refuses a token of the test's choosing")
def test_planner_with_refused_kubernetes_credentials_exits_2_with_one_line(
    fake: KubeApiFake,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(fake.write_kubeconfig(tmp_path / "kc", token="nope")))
    profile = tmp_path / "profile.json"
    write_small_profile(profile)
    argv = ["planner", "--connector", "kubernetes", "--performance-model", str(profile)]
    argv += ["--frontend-url", f"http://127.0.0.1:{free_port()}", "--frontend-wait-s", "0"]
    argv += ["--discovery-dir", str(tmp_path / "discovery"), "--metrics-port", "-1"]
    argv += ["--k8s-prefill-deployment", "p", "--k8s-decode-deployment", "d"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("armature: error: --connector kubernetes")
    assert "refused the credentials (401 Unauthorized)" in err
    assert [(r.method, r.path, r.status) for r in fake.get_requests()] == [
        ("GET", SCALE_PATH.format("p"), 401)
    ]
