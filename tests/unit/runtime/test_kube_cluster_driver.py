"""The Kubernetes tests' own machinery: the writes the fake API server serves to the API-only
cluster driver, with the real server's answers (tests/kube_pod_writes.py, kube_workloads.py);
the opt-in that a real cluster needs (tests/kube_cluster.py); and the kubeconfig the driver
derives for the code under test (tests/kube_cluster_api.py)."""

from __future__ import annotations

import json
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from kube_api import POD_RULES, KubeApiFake
from kube_cluster import MODE_VARIABLE, fake_only, get_drivers, is_cluster_mode
from kube_cluster_api import derive_kubeconfig

ADMIN = "admin-token"
PODS = "/api/v1/namespaces/serving/pods"
STRATEGIC = {"Content-Type": "application/strategic-merge-patch+json"}
MERGE = {"Content-Type": "application/merge-patch+json"}
CONTAINERS = [{"name": "c", "image": "pause"}]


@pytest.fixture
def api() -> Iterator[tuple[KubeApiFake, httpx.Client]]:
    """A fake with no namespace yet, and an admin's HTTP client for it."""
    fake = KubeApiFake(
        token="sa", rules=POD_RULES, admin_token=ADMIN, namespace="serving", create_namespace=False
    )
    with fake, httpx.Client(base_url=fake.url, headers={"Authorization": f"Bearer {ADMIN}"}) as c:
        yield fake, c


def pod(name: str, **extra: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, **extra}, "spec": {"containers": CONTAINERS}}


def kinds(fake: KubeApiFake) -> list[tuple[str, str]]:
    """The Pods' changes so far: (watch event type, resourceVersion)."""
    return [(kind, str(version)) for version, kind, _ in fake.pods.history]


@fake_only("it checks the fake itself")
def test_pod_writes_follow_the_real_servers_rules(api: tuple[KubeApiFake, httpx.Client]) -> None:
    fake, client = api
    assert client.post(PODS, json=pod("w0")).json()["message"] == 'namespaces "serving" not found'
    assert (
        client.post("/api/v1/namespaces", json={"metadata": {"name": "serving"}}).status_code == 201
    )
    assert (
        client.post("/api/v1/namespaces", json={"metadata": {"name": "serving"}}).status_code == 409
    )
    assert client.get("/api/v1/namespaces/serving/serviceaccounts/default").status_code == 200
    assert client.post(PODS, json={"metadata": {"name": "w0"}, "spec": {}}).status_code == 422
    # a created Pod's status is the server's (Pending), whatever the client sent
    sent = {**pod("w0", finalizers=["t/hold"]), "status": {"phase": "Running"}}
    created = client.post(PODS, json=sent)
    assert created.status_code == 201
    assert created.json()["status"] == {"phase": "Pending"}
    assert created.json()["metadata"]["resourceVersion"] == "1"
    assert client.post(PODS, json=pod("w0")).status_code == 409

    # pods/status: the conditions merge by type; spec and deletionTimestamp stay
    scheduled = {"type": "PodScheduled", "status": "False"}
    body = {"status": {"conditions": [scheduled]}, "spec": {"nodeName": "n1"}}
    assert client.patch(f"{PODS}/w0/status", json=body, headers=STRATEGIC).status_code == 200
    ready = {"type": "Ready", "status": "True"}
    body = {"status": {"conditions": [ready]}, "metadata": {"deletionTimestamp": "now"}}
    answer = client.patch(f"{PODS}/w0/status", json=body, headers=STRATEGIC).json()
    assert answer["status"]["conditions"] == [scheduled, ready]
    assert "nodeName" not in answer["spec"] and "deletionTimestamp" not in answer["metadata"]
    # a status write that changes nothing: no new version, no event
    client.patch(f"{PODS}/w0/status", json={"status": {"conditions": [ready]}}, headers=STRATEGIC)
    # the Pod itself: its status is not written there
    body = {"status": {"phase": "Failed"}, "metadata": {"annotations": {"a": "1"}}}
    answer = client.patch(f"{PODS}/w0", json=body, headers=MERGE).json()
    assert (answer["status"]["phase"], answer["metadata"]["annotations"]) == ("Pending", {"a": "1"})
    assert kinds(fake) == [("ADDED", "1"), ("MODIFIED", "2"), ("MODIFIED", "3"), ("MODIFIED", "4")]

    # held by its finalizer, a deleted Pod terminates; it goes once released
    deleted = client.delete(f"{PODS}/w0").json()
    assert deleted["metadata"]["deletionTimestamp"]
    assert client.get(f"{PODS}/w0").status_code == 200
    body = {"metadata": {"finalizers": None}}
    assert client.patch(f"{PODS}/w0", json=body, headers=MERGE).status_code == 200
    assert client.get(f"{PODS}/w0").status_code == 404
    assert kinds(fake)[-2:] == [("MODIFIED", "5"), ("DELETED", "6")]
    # no finalizer, not bound to a node: it goes at once
    client.post(PODS, json=pod("w1"))
    assert client.delete(f"{PODS}/w1").status_code == 200
    assert kinds(fake)[-2:] == [("ADDED", "7"), ("DELETED", "8")]


@fake_only("it checks the fake itself")
def test_a_namespace_stays_terminating_while_a_finalizer_holds_a_pod(
    api: tuple[KubeApiFake, httpx.Client],
) -> None:
    fake, client = api
    client.post("/api/v1/namespaces", json={"metadata": {"name": "serving"}})
    client.post(PODS, json=pod("held", finalizers=["t/hold"]))
    client.post(PODS, json=pod("free"))
    deployment = {
        "metadata": {"name": "d"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "d"}},
            "template": {"metadata": {"labels": {"app": "x"}}, "spec": {"containers": CONTAINERS}},
        },
    }
    deployments = "/apis/apps/v1/namespaces/serving/deployments"
    assert client.post(deployments, json=deployment).status_code == 422  # selector mismatch
    deployment["spec"]["template"]["metadata"]["labels"] = {"app": "d"}
    assert client.post(deployments, json=deployment).status_code == 201
    assert client.get(f"{deployments}/d/scale").json()["spec"]["replicas"] == 2

    assert client.delete("/api/v1/namespaces/serving").json()["status"]["phase"] == "Terminating"
    assert client.get("/api/v1/namespaces/serving").json()["status"]["phase"] == "Terminating"
    refused = client.post(PODS, json=pod("late"))
    assert (refused.status_code, refused.json()["reason"]) == (403, "Forbidden")
    assert client.get(f"{deployments}/d/scale").status_code == 404
    assert sorted(fake.pods.pods) == ["held"]
    client.patch(f"{PODS}/held", json={"metadata": {"finalizers": None}}, headers=MERGE)
    assert client.get("/api/v1/namespaces/serving").status_code == 404


def test_only_an_explicit_opt_in_selects_a_real_cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("{}")
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))  # a developer's, pointing anywhere
    monkeypatch.delenv(MODE_VARIABLE, raising=False)
    assert (is_cluster_mode(), get_drivers(), get_drivers(slow=True)) == (
        False,
        ["fake", "api-fake"],
        ["api-fake"],
    )
    monkeypatch.setenv(MODE_VARIABLE, "cluster")
    assert (is_cluster_mode(), get_drivers(), get_drivers(slow=True)) == (
        True,
        ["cluster"],
        ["cluster"],
    )
    monkeypatch.setenv(MODE_VARIABLE, "yes")
    with pytest.raises(pytest.UsageError, match="expected 'cluster' or 'fake'"):
        is_cluster_mode()
    monkeypatch.setenv(MODE_VARIABLE, "cluster")
    monkeypatch.delenv("KUBECONFIG")
    with pytest.raises(pytest.UsageError, match="needs KUBECONFIG to name one kubeconfig file"):
        is_cluster_mode()


def test_the_derived_kubeconfig_names_the_namespace_and_keeps_the_credentials(
    tmp_path: Path,
) -> None:
    source = tmp_path / "home" / "config"
    source.parent.mkdir()
    config = {
        "current-context": "dev",
        "contexts": [
            {"name": "prod", "context": {"cluster": "c", "user": "u", "namespace": "prod"}},
            {"name": "dev", "context": {"cluster": "c", "user": "u"}},
        ],
        "clusters": [
            {"name": "c", "cluster": {"server": "https://k", "certificate-authority": "ca.crt"}}
        ],
        "users": [{"name": "u", "user": {"client-key": "/abs/key", "tokenFile": "tok"}}],
    }
    source.write_text(json.dumps(config))
    derived = derive_kubeconfig(source, tmp_path / "derived", "armature-test-1")
    assert stat.S_IMODE(derived.stat().st_mode) == 0o600
    found = yaml.safe_load(derived.read_text())
    assert found["contexts"][0]["context"]["namespace"] == "prod"
    assert found["contexts"][1]["context"] == {
        "cluster": "c",
        "user": "u",
        "namespace": "armature-test-1",
    }
    home = str(source.parent.resolve())
    assert found["clusters"][0]["cluster"]["certificate-authority"] == f"{home}/ca.crt"
    assert found["users"][0]["user"] == {"client-key": "/abs/key", "tokenFile": f"{home}/tok"}
