"""`--discovery kubernetes` with the real client (lightkube), found through a kubeconfig.

The behavioural tests take a `cluster` (tests/kube_cluster.py): the fake API server
(tests/kube_api.py, tests/kube_pods.py) set up through its back door or through its API, or,
with ARMATURE_TEST_KUBE=cluster, a real cluster: registration in the Pod's annotation (and,
on the fake, the exact PATCH bodies), list + watch with readiness, flapping, termination and
deletion. The others need the fake's internals and run on it alone (`fake_only`): bookmarks,
watch expiry (410) and re-list, API server restarts (resumed, no duplicates, no losses), and
one-line start errors for refused credentials and missing permissions.

Each test waits for events, never for time: `Follower.next` waits (bounded) for the next
discovery event, and "nothing else happened" is shown by a marker change made afterwards
being the very next event."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import parse_qs

import pytest

from armature.cli.main import main
from armature.config import RuntimeConfig
from armature.errors import ConfigError
from armature.runtime.discovery import Discovery, WatchEvent
from armature.runtime.discovery_kubernetes import (
    FIELD_MANAGER,
    KubeDiscoveryError,
    KubernetesDiscovery,
)
from armature.runtime.factory import open_discovery
from armature.runtime.kube_client import make_kube_client
from armature.runtime.kube_membership import ANNOTATION, encode_entries
from armature.runtime.ports import free_port
from freezing_proxy import FreezingProxy
from kube_api import POD_RULES, POD_WATCH_RULES, KubeApiFake, RecordedRequest
from kube_cluster import FakeSetup, KubeCluster, fake_only, get_drivers, open_cluster

TOKEN = "discovery-sa-token"
NAMESPACE = "serving"
LABELS = {"armature.dev/namespace": "armature"}
PREFIX = "instances/armature/worker/generate/"
A, B, MARK = PREFIX + "a", PREFIX + "b", PREFIX + "marker"
PODS = "/api/v1/namespaces/serving/pods"
MERGE_PATCH = "application/merge-patch+json"


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[KubeApiFake]:
    """A started fake whose service account may use Pods; KUBECONFIG points at it."""
    server = KubeApiFake(token=TOKEN, namespace=NAMESPACE, rules=POD_RULES, user="armature")
    with server:
        monkeypatch.setenv("KUBECONFIG", str(server.write_kubeconfig(tmp_path / "kubeconfig")))
        yield server


@pytest.fixture(params=get_drivers())
def cluster(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[KubeCluster]:
    """A namespace of the cluster a driver sets up; KUBECONFIG points at it."""
    setup = FakeSetup(token=TOKEN, rules=POD_RULES, user="armature", namespace=NAMESPACE)
    with open_cluster(request.param, setup) as found:
        monkeypatch.setenv("KUBECONFIG", str(found.kubeconfig))
        yield found


def runtime(pod_name: str | None = None) -> RuntimeConfig:
    return RuntimeConfig(discovery="kubernetes", k8s_pod_name=pod_name)


def with_entries(
    cluster: KubeCluster | KubeApiFake, name: str, entries: dict[str, bytes], *, ready: bool
) -> None:
    """A Pod as a registered process leaves it (the annotation written), Ready or not."""
    annotations = {ANNOTATION: encode_entries(entries)}
    if isinstance(cluster, KubeApiFake):
        cluster.pods.add(name, labels=LABELS, ready=ready, annotations=annotations)
    else:
        cluster.add_pod(name, labels=LABELS, ready=ready, annotations=annotations)


class Follower:
    """A watch running in a task, its events queued."""

    def __init__(self, discovery: Discovery, prefix: str = PREFIX) -> None:
        self.events: asyncio.Queue[WatchEvent] = asyncio.Queue()
        self.task = asyncio.get_running_loop().create_task(self._run(discovery.watch(prefix)))

    async def _run(self, watch: AsyncIterator[WatchEvent]) -> None:
        async for event in watch:
            self.events.put_nowait(event)

    async def next(self, count: int = 1) -> list[WatchEvent]:
        return [await asyncio.wait_for(self.events.get(), 10.0) for _ in range(count)]

    async def then_only(self, cluster: KubeCluster | KubeApiFake, marker_pod: str) -> None:
        """Nothing more is queued: a marker Pod that becomes Ready now is the next event."""
        key = MARK + marker_pod
        with_entries(cluster, marker_pod, {key: b"marker"}, ready=True)
        assert await self.next() == [WatchEvent("put", key, b"marker")]

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


@contextlib.asynccontextmanager
async def following() -> AsyncIterator[tuple[Discovery, Follower]]:
    """A watcher's discovery (no Pod of its own) and a Follower of its watch."""
    discovery = await open_discovery(runtime())
    follower = Follower(discovery)
    try:
        yield discovery, follower
    finally:
        await follower.close()
        await discovery.close()


async def wait_for_watches(fake: KubeApiFake, count: int) -> None:
    """Until `count` watches are open on the fake (a resumed watch has reconnected)."""
    async with asyncio.timeout(10.0):
        while fake.pods.get_num_watches() != count:
            await asyncio.sleep(0.01)


def calls(fake: KubeApiFake) -> list[tuple[str, str, dict[str, list[str]], object, int]]:
    """The requests (the token checked on each), queries parsed."""
    requests = fake.get_requests()
    assert {r.authorization for r in requests} == {f"Bearer {TOKEN}"}
    return [_call(r) for r in requests]


def _call(r: RecordedRequest) -> tuple[str, str, dict[str, list[str]], object, int]:
    return (r.method, r.path, parse_qs(r.query), r.body, r.status)


def is_watch(call: tuple[str, str, dict[str, list[str]], object, int]) -> bool:
    return call[2].get("watch") == ["true"]


LIST = ("GET", PODS, {"labelSelector": ["armature.dev/namespace=armature"]}, None, 200)


def watch_from(version: int) -> tuple[str, str, dict[str, list[str]], object, int]:
    query = {
        "resourceVersion": [str(version)],
        "allowWatchBookmarks": ["true"],
        "labelSelector": ["armature.dev/namespace=armature"],
        "timeoutSeconds": ["300"],
        "watch": ["true"],
    }
    return ("GET", PODS, query, None, 200)


def annotation_patch(text: str | None) -> tuple[str, str, dict[str, list[str]], object, int]:
    body = {"metadata": {"annotations": {ANNOTATION: text}}}
    return ("PATCH", f"{PODS}/w0", {"fieldManager": ["armature-discovery"]}, body, 200)


async def test_a_worker_registers_in_its_pod_and_joins_routing_once_ready(
    cluster: KubeCluster,
) -> None:
    stale = {ANNOTATION: encode_entries({B: b"stale"})}
    cluster.add_pod("w0", labels=LABELS, annotations=stale)
    worker = await open_discovery(runtime("w0"))
    frontend = await open_discovery(runtime())
    follower = Follower(frontend)
    try:
        if cluster.fake is not None:  # the watch is open before the registration (its log)
            await wait_for_watches(cluster.fake, 1)
        registration = await worker.register(A, b"card-a", ttl_s=10)
        assert cluster.get_pod_annotations("w0") == {
            ANNOTATION: '{"instances/armature/worker/generate/a":"Y2FyZC1h"}'
        }
        assert await frontend.list(PREFIX) == {}  # not Ready yet
        cluster.set_ready("w0", True)
        assert await follower.next() == [WatchEvent("put", A, b"card-a")]
        assert await frontend.list(PREFIX) == {A: b"card-a"}
        await registration.close()  # a clean stop: the key leaves at once, the Pod stays
        assert await follower.next() == [WatchEvent("delete", A)]
        assert cluster.get_pod_annotations("w0") == {}
        await follower.then_only(cluster, "m0")
    finally:
        await follower.close()
        await worker.close()
        await frontend.close()
    if cluster.fake is None:
        return
    requests = calls(cluster.fake)
    assert [c for c in requests if c[1] == f"{PODS}/w0"] == [
        ("GET", f"{PODS}/w0", {}, None, 200),
        annotation_patch(None),  # what an earlier container of w0 left is removed at start
        annotation_patch('{"instances/armature/worker/generate/a":"Y2FyZC1h"}'),
        annotation_patch(None),
    ]
    assert [c for c in requests if is_watch(c)] == [watch_from(2)]  # add, the start's patch


async def test_readiness_flapping_and_deletion_move_a_pod_in_and_out(
    cluster: KubeCluster,
) -> None:
    with_entries(cluster, "w0", {A: b"a"}, ready=True)
    with_entries(cluster, "w1", {B: b"b"}, ready=False)
    async with following() as (frontend, follower):
        assert await follower.next() == [WatchEvent("put", A, b"a")]
        for _ in range(3):
            cluster.set_ready("w1", True)
            cluster.set_ready("w1", False)
        assert await follower.next(6) == [WatchEvent("put", B, b"b"), WatchEvent("delete", B)] * 3
        cluster.set_ready("w1", True)
        assert await follower.next() == [WatchEvent("put", B, b"b")]
        cluster.terminate_pod("w0")  # deleted: its preStop drains, it takes no new work
        assert await follower.next() == [WatchEvent("delete", A)]
        cluster.delete_pod("w0")
        cluster.delete_pod("w1")
        assert await follower.next() == [WatchEvent("delete", B)]
        await follower.then_only(cluster, "m0")
        assert await frontend.list(PREFIX) == {MARK + "m0": b"marker"}


@fake_only("bookmarks, compaction and the end of a watch are forced on the fake")
async def test_a_watch_resumes_from_its_bookmark_without_listing_again(fake: KubeApiFake) -> None:
    with_entries(fake, "w0", {A: b"a"}, ready=True)  # version 1
    async with following() as (_frontend, follower):
        assert await follower.next() == [WatchEvent("put", A, b"a")]
        await wait_for_watches(fake, 1)
        fake.pods.add("other", labels={"app": "other"})  # version 2, not ours: no event
        fake.pods.send_bookmarks()  # moves the watch to version 2
        fake.pods.compact()  # version 1 is gone now: resuming from it would be refused
        fake.pods.end_watches()  # the server ends the stream (its timeout)
        await wait_for_watches(fake, 1)
        await follower.then_only(fake, "m0")
    assert [c for c in calls(fake) if c[1] == PODS] == [LIST, LIST, watch_from(1), watch_from(2)]


@fake_only("the watch's connection is frozen by a proxy in front of the fake")
async def test_a_watch_whose_connection_dies_silently_resumes(
    fake: KubeApiFake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watch's connection stops carrying bytes without closing (a peer powered off): the
    watch waited for good (lightkube reads watches with no timeout) and missed every later
    worker; silent for watch_idle_s, it resumes from its version on a new connection."""
    proxy = FreezingProxy("127.0.0.1", fake.port)
    await proxy.start()
    config = json.loads(fake.write_kubeconfig(tmp_path / "fake").read_text())
    config["clusters"][0]["cluster"]["server"] = f"http://127.0.0.1:{proxy.port}"
    (tmp_path / "proxied").write_text(json.dumps(config))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "proxied"))
    client = make_kube_client(namespace=None, field_manager=FIELD_MANAGER, user="test")
    discovery = KubernetesDiscovery(client, "armature", pod_name=None, watch_idle_s=1.0)
    with_entries(fake, "w0", {A: b"a"}, ready=True)  # version 1
    follower = Follower(discovery)
    try:
        assert await follower.next() == [WatchEvent("put", A, b"a")]
        await wait_for_watches(fake, 1)
        proxy.freeze()
        connections_at_freeze = proxy.connections
        with_entries(fake, "w1", {B: b"b"}, ready=True)  # version 2: held in the frozen pipe
        assert await follower.next() == [WatchEvent("put", B, b"b")]
        assert proxy.connections > connections_at_freeze
    finally:
        await follower.close()
        await discovery.close()
        await proxy.close()
    assert [c for c in calls(fake) if c[1] == PODS][-1] == watch_from(1)  # resumed, no list


def test_a_watch_is_read_until_the_api_server_has_surely_ended_it(fake: KubeApiFake) -> None:
    client = make_kube_client(namespace="x", field_manager=FIELD_MANAGER, user="test")
    discovery = KubernetesDiscovery(client, "armature", pod_name=None, watch_timeout_s=300)
    assert discovery.watch_idle_s == 330.0


@fake_only("watch expiry (410) is forced by compacting the fake's history")
async def test_an_expired_watch_lists_again_and_emits_only_the_difference(
    fake: KubeApiFake,
) -> None:
    with_entries(fake, "w0", {A: b"a"}, ready=True)  # version 1
    with_entries(fake, "w1", {B: b"b"}, ready=False)  # version 2
    async with following() as (_frontend, follower):
        assert await follower.next() == [WatchEvent("put", A, b"a")]
        await wait_for_watches(fake, 1)
        fake.pods.expire_watches()  # ERROR 410 Gone to the open watch
        await wait_for_watches(fake, 1)  # listed again (nothing changed: no event), watching
        fake.pods.set_ready("w1", True)
        assert await follower.next() == [WatchEvent("put", B, b"b")]
        await follower.then_only(fake, "m0")
    assert [c for c in calls(fake) if c[1] == PODS] == [
        LIST,
        LIST,
        watch_from(2),
        LIST,
        watch_from(2),
    ]


@fake_only("the fake API server is stopped and started, its history compacted")
async def test_an_api_server_restart_loses_nothing_and_repeats_nothing(fake: KubeApiFake) -> None:
    with_entries(fake, "w0", {A: b"a"}, ready=True)
    with_entries(fake, "w1", {B: b"b"}, ready=True)
    async with following() as (_frontend, follower):
        assert sorted(e.key for e in await follower.next(2)) == [A, B]
        await wait_for_watches(fake, 1)
        fake.stop()  # while it is down, w0 goes and w2 comes (the state lives in etcd)
        fake.pods.delete("w0")
        with_entries(fake, "w2", {PREFIX + "c": b"c"}, ready=True)
        fake.start()
        assert await follower.next(2) == [
            WatchEvent("delete", A),
            WatchEvent("put", PREFIX + "c", b"c"),
        ]
        await follower.then_only(fake, "m0")
        # down again, and its history compacted meanwhile: the resumed watch is refused
        # (410) and a new list brings the difference
        await wait_for_watches(fake, 1)
        fake.stop()
        fake.pods.set_ready("w1", False)
        fake.pods.compact()
        fake.start()
        assert await follower.next() == [WatchEvent("delete", B)]
        await follower.then_only(fake, "m1")
    # a request that reached the stopping server was refused (503): the client retried
    answered = [c for c in calls(fake) if c[1] == PODS and c[4] == 200]
    assert answered == [
        LIST,  # open_discovery's check
        LIST,
        watch_from(2),
        watch_from(2),  # resumed after the first restart from what it had seen
        watch_from(5),  # after the second: answered ERROR 410 Gone
        LIST,
        watch_from(6),
    ]


@fake_only("the RBAC rules are the fake's")
@pytest.mark.parametrize(
    ("rules", "pod_name", "expected"),
    [
        (POD_RULES, "missing", "get its own Pod serving/missing: not found (404)"),
        (POD_WATCH_RULES, "w0", "patch its own Pod serving/w0: forbidden (403)"),
        (frozenset({("get", "", "pods")}), None, "list Pods in namespace serving: forbidden (403)"),
        (
            POD_RULES - {("watch", "", "pods")},
            "w0",
            "watch Pods in namespace serving: forbidden by the API server's access review: RBAC: "
            'User "armature" has no rule for watch pods (the Role needs get, list and watch',
        ),
    ],
)
async def test_missing_pods_and_permissions_are_one_line_start_errors(
    fake: KubeApiFake, rules: frozenset[tuple[str, str, str]], pod_name: str | None, expected: str
) -> None:
    fake.rules = set(rules)
    fake.pods.add("w0", labels=LABELS)
    with pytest.raises(ConfigError) as info:
        await open_discovery(runtime(pod_name))
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"kubernetes discovery (API server {fake.url}, credentials from ")
    assert expected in message


REVIEWS = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"


@fake_only("the access review is read from the fake's log, or its API switched off")
@pytest.mark.parametrize("reviews", [True, False], ids=["reviewed", "no-review-api"])
async def test_the_start_asks_whether_it_may_watch(fake: KubeApiFake, reviews: bool) -> None:
    fake.access_reviews = reviews
    discovery = await open_discovery(runtime())
    await discovery.close()
    asked = [c for c in calls(fake) if c[1] == REVIEWS]
    assert len(asked) == 1
    method, _, _, body, status = asked[0]
    assert method == "POST" and status == (201 if reviews else 404)
    assert isinstance(body, dict)
    assert body["spec"]["resourceAttributes"] == {
        "verb": "watch",
        "resource": "pods",
        "namespace": NAMESPACE,
    }


async def test_registering_without_a_pod_of_its_own_says_how_to_set_it(
    cluster: KubeCluster,
) -> None:
    discovery = await open_discovery(runtime())
    try:
        with pytest.raises(KubeDiscoveryError, match="set ARMATURE_K8S_POD_NAME from the downward"):
            await discovery.register(A, b"a", ttl_s=10)
    finally:
        await discovery.close()


@fake_only("the fake refuses a token of the test's choosing")
def test_refused_credentials_exit_2_with_one_line(
    fake: KubeApiFake,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    kubeconfig = fake.write_kubeconfig(tmp_path / "wrong", token="not-the-token")
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    argv = [
        "frontend",
        "--discovery",
        "kubernetes",
        "--wait-for-workers-s",
        "1",
        "--port",
        str(free_port("127.0.0.1")),
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"armature: error: kubernetes discovery (API server {fake.url}, ")
    assert "refused the credentials (401 Unauthorized)" in err
    assert [(r.method, r.path, r.status) for r in fake.get_requests()] == [("GET", PODS, 401)]


def test_no_cluster_configuration_exits_2_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    argv = [
        "frontend",
        "--discovery",
        "kubernetes",
        "--k8s-pod-name",
        "f0",
        "--port",
        str(free_port("127.0.0.1")),
    ]
    assert main(argv) == 2  # (the frontend binds its port before discovery)
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(
        "armature: error: --discovery kubernetes: no usable cluster configuration"
    )


def test_a_namespace_that_is_no_label_value_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "frontend",
        "--discovery",
        "kubernetes",
        "--namespace=-bad",
        "--port",
        str(free_port("127.0.0.1")),
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "--namespace '-bad' is not a Kubernetes label value" in err


@fake_only("the fake API server is stopped and started")
async def test_an_unreachable_api_server_fails_a_registration_and_its_close_only_logs(
    fake: KubeApiFake, caplog: pytest.LogCaptureFixture
) -> None:
    fake.pods.add("w0", labels=LABELS)
    worker = await open_discovery(runtime("w0"))
    try:
        registration = await worker.register(A, b"a", ttl_s=10)
        fake.stop()
        with pytest.raises(KubeDiscoveryError, match="patch its own Pod serving/w0: the API"):
            await worker.register(B, b"b", ttl_s=10)
        await registration.close()  # logged; the Pod's deletion removes the key anyway
        assert "patch its own Pod serving/w0: the API server is unreachable" in caplog.text
        fake.start()
        # B never counted; A was dropped: a new registration writes C alone
        await worker.register(PREFIX + "c", b"c", ttl_s=10)
        annotations = fake.pods.get("w0")["metadata"]["annotations"]
        assert annotations == {ANNOTATION: encode_entries({PREFIX + "c": b"c"})}
    finally:
        await worker.close()
