"""In-cluster configuration, for real: Kubernetes discovery and the planner's `kubernetes`
connector as they run in a Pod, with lightkube reading a service-account directory (token,
namespace, ca.crt; passed through `service_account_dir`, lightkube's own `from_env`
argument) and finding the API server through $KUBERNETES_SERVICE_HOST and
$KUBERNETES_SERVICE_PORT: the fake API server (tests/kube_api.py) over https, with a
certificate for 127.0.0.1 from a CA made here (servers.TlsFiles). $KUBECONFIG names no file,
so a test that reaches the server went through the service account.

Pinned: the bearer token the server receives, the namespace (only the service account's
`namespace` file names it), the server's certificate checked against `ca.crt`, the one-line
errors for a refused token, and lightkube 1.0's handling of a rotated token: the token file is
read at the first request and again only when the server answers 401, and that request is
then sent once more with the new token; a rewritten file alone changes nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from armature.errors import ConfigError
from armature.planner.connectors.kubernetes import open_kubernetes_connector
from armature.protocols.worker import WorkerRole
from armature.runtime.discovery_kubernetes import (
    FIELD_MANAGER,
    KubeDiscoveryError,
    KubernetesDiscovery,
)
from armature.runtime.kube_client import make_kube_client
from armature.runtime.kube_membership import ANNOTATION
from kube_api import POD_RULES, SCALE_RULES, KubeApiFake, RecordedRequest
from kube_cluster import fake_only
from servers import TlsFiles

pytestmark = fake_only("a service account and a TLS certificate of the fake's")

TOKEN = "pod-sa-token"
NAMESPACE = "armature-pods"  # named by the service account's `namespace` file alone
LABELS = {"armature.dev/namespace": "armature"}
KEY = "instances/armature/worker/generate/a"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
REVIEWS = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
SCALE = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{{}}/scale"
PREFILL, DECODE = WorkerRole.PREFILL, WorkerRole.DECODE
DEPLOYMENTS = {PREFILL: "armature-prefill", DECODE: "armature-decode"}


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return TlsFiles(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def fake(certs: TlsFiles, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[KubeApiFake]:
    """The fake over https, found as a Pod finds its API server; no kubeconfig."""
    server = KubeApiFake(
        token=TOKEN,
        namespace=NAMESPACE,
        rules=POD_RULES | SCALE_RULES,
        user=f"system:serviceaccount:{NAMESPACE}:armature",
        deployments={"armature-prefill": 1, "armature-decode": 2},
        tls=certs,
    )
    with server:
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(server.port))
        monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
        yield server


@pytest.fixture
def account(fake: KubeApiFake, tmp_path: Path) -> Path:
    """The Pod's service-account directory: the fake's token, namespace and CA."""
    return fake.write_service_account(tmp_path / "serviceaccount")


def seen(fake: KubeApiFake) -> list[tuple[str, str, str | None, int]]:
    """(method, path, bearer token, status) of every request the fake received."""
    return [(r.method, r.path, _token(r), r.status) for r in fake.get_requests()]


def _token(r: RecordedRequest) -> str | None:
    return r.authorization.removeprefix("Bearer ") if r.authorization else None


def discovery_in(service_account: Path, *, pod_name: str | None) -> KubernetesDiscovery:
    """Discovery as `armature worker` makes it in a Pod (runtime/factory.py), reading
    `service_account`."""
    client = make_kube_client(
        namespace=None,
        field_manager=FIELD_MANAGER,
        user="--discovery kubernetes",
        service_account_dir=service_account,
    )
    return KubernetesDiscovery(client, "armature", pod_name=pod_name)


async def get_start_error(service_account: Path) -> str:
    """The KubeDiscoveryError of a watcher's start check, reading `service_account`."""
    discovery = discovery_in(service_account, pod_name=None)
    try:
        with pytest.raises(KubeDiscoveryError) as caught:
            await discovery.check()
    finally:
        await discovery.close()
    return str(caught.value)


async def test_discovery_in_a_pod_uses_its_service_account(
    fake: KubeApiFake, account: Path
) -> None:
    fake.pods.add("w0", labels=LABELS, ready=True)
    discovery = discovery_in(account, pod_name="w0")
    assert discovery.pods_namespace == NAMESPACE
    try:
        await discovery.check()
        registration = await discovery.register(KEY, b"card", ttl_s=10)
        assert await discovery.list("instances/") == {KEY: b"card"}
        await registration.close()
    finally:
        await discovery.close()
    assert fake.url == f"https://127.0.0.1:{fake.port}"
    assert seen(fake) == [
        ("GET", PODS, TOKEN, 200),
        ("POST", REVIEWS, TOKEN, 201),
        ("GET", f"{PODS}/w0", TOKEN, 200),
        ("PATCH", f"{PODS}/w0", TOKEN, 200),  # what an earlier container left
        ("PATCH", f"{PODS}/w0", TOKEN, 200),  # the registration
        ("GET", PODS, TOKEN, 200),
        ("PATCH", f"{PODS}/w0", TOKEN, 200),  # the registration removed
    ]
    review = fake.get_requests()[1].body
    assert review["spec"]["resourceAttributes"]["namespace"] == NAMESPACE
    assert ANNOTATION not in fake.pods.get("w0")["metadata"].get("annotations", {})


async def test_the_api_server_is_trusted_only_through_the_service_accounts_ca(
    fake: KubeApiFake, account: Path, tmp_path: Path
) -> None:
    other = TlsFiles(tmp_path / "other")  # another CA, of another key
    (account / "ca.crt").write_bytes(other.ca.read_bytes())
    message = await get_start_error(account)
    assert message.startswith(
        f"kubernetes discovery (API server {fake.url}, credentials from the Pod's service "
        f"account ({account / 'token'})): list Pods in namespace {NAMESPACE}: the API server is "
        "unreachable: ConnectError: "
    )
    assert "CERTIFICATE_VERIFY_FAILED" in message
    assert seen(fake) == []  # refused in the handshake, before any request


async def test_a_refused_token_is_a_one_line_error_naming_the_token_file(
    fake: KubeApiFake, account: Path
) -> None:
    (account / "token").write_text("revoked")
    where = f"API server {fake.url}, credentials from the Pod's service account "
    where += f"({account / 'token'})"
    assert await get_start_error(account) == (
        f"kubernetes discovery ({where}): list Pods in namespace {NAMESPACE}: the API server "
        "refused the credentials (401 Unauthorized): Unauthorized"
    )
    with pytest.raises(ConfigError) as refused:
        await open_kubernetes_connector(DEPLOYMENTS, service_account_dir=account)
    assert str(refused.value) == (
        f"--connector kubernetes ({where}): the API server refused the credentials "
        "(401 Unauthorized): Unauthorized"
    )
    # after a 401, lightkube reads the token file again and sends the request once more
    prefill = SCALE.format("armature-prefill")
    assert seen(fake) == [
        ("GET", PODS, "revoked", 401),
        ("GET", PODS, "revoked", 401),
        ("GET", prefill, "revoked", 401),
        ("GET", prefill, "revoked", 401),
    ]


async def test_the_planner_in_a_pod_scales_in_its_service_accounts_namespace(
    fake: KubeApiFake, account: Path
) -> None:
    connector = await open_kubernetes_connector(DEPLOYMENTS, service_account_dir=account)
    try:
        assert connector.get_num_workers() == {PREFILL: 1, DECODE: 2}
        await connector.scale(DECODE, 3, "itl_above_target")
    finally:
        await connector.close()
    assert fake.deployments[(NAMESPACE, "armature-decode")] == 3
    assert seen(fake) == [
        ("GET", SCALE.format("armature-prefill"), TOKEN, 200),
        ("GET", SCALE.format("armature-decode"), TOKEN, 200),
        ("PATCH", SCALE.format("armature-decode"), TOKEN, 200),
    ]


async def test_a_rotated_token_is_read_once_the_server_refuses_the_old_one(
    fake: KubeApiFake, account: Path
) -> None:
    connector = await open_kubernetes_connector(
        {DECODE: "armature-decode"}, service_account_dir=account
    )
    try:
        (account / "token").write_text("rotated")  # the kubelet rotates the token...
        await connector.scale(DECODE, 3, "itl_above_target")  # ...the old one still valid
        fake.token = "rotated"  # the old token expires
        await connector.scale(DECODE, 4, "itl_above_target")
    finally:
        await connector.close()
    assert fake.deployments[(NAMESPACE, "armature-decode")] == 4
    decode = SCALE.format("armature-decode")
    assert seen(fake) == [
        ("GET", decode, TOKEN, 200),
        ("PATCH", decode, TOKEN, 200),  # a rewritten file alone changes nothing
        ("PATCH", decode, TOKEN, 401),
        ("PATCH", decode, "rotated", 200),  # the same patch, with the file's new token
    ]
    patches = [r.body for r in fake.get_requests() if r.method == "PATCH"]
    assert patches[1:] == [{"spec": {"replicas": 4}}] * 2


async def test_discovery_reads_a_rotated_token_when_the_old_one_is_refused(
    fake: KubeApiFake, account: Path
) -> None:
    discovery = discovery_in(account, pod_name=None)
    try:
        await discovery.check()
        (account / "token").write_text("rotated")
        fake.token = "rotated"
        assert await discovery.list("instances/") == {}
    finally:
        await discovery.close()
    assert seen(fake) == [
        ("GET", PODS, TOKEN, 200),
        ("POST", REVIEWS, TOKEN, 201),
        ("GET", PODS, TOKEN, 401),
        ("GET", PODS, "rotated", 200),
    ]
