"""The Kubernetes tests' cluster through its API alone (lightkube, from a kubeconfig): what
runs them against a real cluster, and against the fake API server (tests/kube_api.py) with no
back door, to show that it does.

    with open_api_cluster(admin_kubeconfig, "armature-test-1a2b3c4d", write_kubeconfig) as c:
        c.add_pod("w0", labels={...}, ready=True)   # create, then PATCH pods/status
        c.set_ready("w0", False)
        c.terminate_pod("w0"); c.delete_pod("w0")
        c.add_deployment("armature-decode", 2); c.get_replicas("armature-decode")

Each run gets a namespace of its own, labelled `armature.dev/test=true` and deleted at the end
(with whatever the test left in it). Nothing in it ever runs:
  - A Pod names a scheduler nobody serves (SCHEDULER), so it stays Pending, bound to no node.
    No kubelet writes its status, and PodGC leaves it alone (it collects only Pods of gone
    nodes, finished ones, and unscheduled ones already being deleted). Readiness is set the
    way a kubelet sets it: a strategic merge PATCH of the `pods/status` subresource with the
    Ready condition (merged by its `type`).
  - An unbound Pod has no grace period: a DELETE removes it at once. So that a Pod can be
    seen terminating first, as a draining worker is, each carries the finalizer FINALIZER: a
    DELETE only sets its deletionTimestamp, and removing the finalizer lets it go.
  - A Deployment is created paused, so the controller makes no ReplicaSet and no Pod; its
    `scale` subresource still reads and writes spec.replicas, which is all the planner uses.
The Pods also meet Pod Security "restricted" and carry small requests, for clusters that
enforce them.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx2
import yaml
from lightkube import ApiError, Client, KubeConfig, codecs
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.core_v1 import Namespace, Pod, ServiceAccount
from lightkube.types import PatchType

if TYPE_CHECKING:
    from kube_api import KubeApiFake

__all__ = [
    "FINALIZER",
    "SCHEDULER",
    "TEST_LABEL",
    "ApiCluster",
    "derive_kubeconfig",
    "open_api_cluster",
]

FINALIZER = "armature.dev/test-hold"
SCHEDULER = "armature-test-unscheduled"  # no scheduler serves it: the Pods stay unbound
TEST_LABEL = "armature.dev/test"  # on each namespace the tests create
FIELD_MANAGER = "armature-tests"
WAIT_S = 60.0  # for the namespace's default service account (a controller creates it)

WriteKubeconfig = Callable[[Path, str], Path]


def _placeholder_pod_spec() -> dict[str, Any]:
    """A Pod spec that is never scheduled, meets Pod Security "restricted", requests little."""
    return {
        "schedulerName": SCHEDULER,
        "automountServiceAccountToken": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 65535,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [
            {
                "name": "placeholder",
                "image": "registry.k8s.io/pause:3.10",
                "resources": {
                    "requests": {"cpu": "1m", "memory": "8Mi"},
                    "limits": {"cpu": "10m", "memory": "16Mi"},
                },
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "capabilities": {"drop": ["ALL"]},
                },
            }
        ],
    }


class ApiCluster:
    """A namespace of a cluster, driven through the API with `client` (whose namespace is
    it). `kubeconfig`: for the code under test, with that namespace as its context's."""

    def __init__(
        self,
        client: Client,
        namespace: str,
        kubeconfig: Path,
        write_kubeconfig: WriteKubeconfig,
        fake: KubeApiFake | None,
    ) -> None:
        self._client = client
        self.namespace = namespace
        self.kubeconfig = kubeconfig
        self._write_kubeconfig = write_kubeconfig
        self.fake = fake

    def write_kubeconfig(self, path: Path, *, namespace: str) -> Path:
        return self._write_kubeconfig(path, namespace)

    def add_pod(
        self,
        name: str,
        *,
        labels: Mapping[str, str],
        annotations: Mapping[str, str] | None = None,
        ready: bool = False,
    ) -> None:
        meta = {"name": name, "labels": dict(labels), "finalizers": [FINALIZER]}
        if annotations:
            meta["annotations"] = dict(annotations)
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": meta}
        self._client.create(codecs.from_dict({**pod, "spec": _placeholder_pod_spec()}))
        if ready:
            self.set_ready(name, True)

    def set_ready(self, name: str, ready: bool) -> None:
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        condition = {"type": "Ready", "status": str(ready), "lastTransitionTime": now}
        body = {"status": {"conditions": [condition]}}
        self._client.patch(Pod.Status, name, body, patch_type=PatchType.STRATEGIC)

    def terminate_pod(self, name: str) -> None:
        """Deleted, held by its finalizer: terminating, as a draining worker's Pod is."""
        self._client.delete(Pod, name)

    def delete_pod(self, name: str) -> None:
        """Gone (its finalizer removed; then deleted, unless it was terminating already)."""
        body = {"metadata": {"finalizers": None}}
        pod = self._client.patch(Pod, name, body, patch_type=PatchType.MERGE)
        if pod.metadata is None or pod.metadata.deletionTimestamp is None:
            self._client.delete(Pod, name)

    def get_pod_annotations(self, name: str) -> dict[str, str]:
        meta = self._client.get(Pod, name).metadata
        return dict((meta.annotations if meta is not None else None) or {})

    def add_deployment(self, name: str, replicas: int) -> None:
        labels = {"app": name}
        spec = {
            "replicas": replicas,
            "paused": True,  # no ReplicaSet, no Pod: only spec.replicas matters
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": _placeholder_pod_spec()},
        }
        deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name}}
        self._client.create(codecs.from_dict({**deployment, "spec": spec}))

    def get_replicas(self, name: str) -> int:
        scale = self._client.get(Deployment.Scale, name)
        assert scale.spec is not None and scale.spec.replicas is not None
        return scale.spec.replicas


@contextlib.contextmanager
def open_api_cluster(
    admin_kubeconfig: Path,
    namespace: str,
    kubeconfig: Path,
    write_kubeconfig: WriteKubeconfig,
    fake: KubeApiFake | None = None,
) -> Iterator[ApiCluster]:
    """Create `namespace` with the credentials of `admin_kubeconfig` (who may create and
    delete namespaces, Pods and Deployments), write `kubeconfig` for the code under test, and
    delete the namespace at the end."""
    client = Client(
        KubeConfig.from_file(admin_kubeconfig),
        namespace=namespace,
        field_manager=FIELD_MANAGER,
        timeout=httpx2.Timeout(30.0),
    )
    try:
        meta = {"name": namespace, "labels": {TEST_LABEL: "true"}}
        client.create(codecs.from_dict({"apiVersion": "v1", "kind": "Namespace", "metadata": meta}))
        try:
            _wait_for_default_service_account(client, namespace)
            write_kubeconfig(kubeconfig, namespace)
            yield ApiCluster(client, namespace, kubeconfig, write_kubeconfig, fake)
        finally:
            _delete_namespace(client, namespace)
    finally:
        client.close()


def _wait_for_default_service_account(client: Client, namespace: str) -> None:
    """Until the namespace's `default` service account exists: admission refuses a Pod
    (403) before the service account controller has created it."""
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            client.get(ServiceAccount, "default", namespace=namespace)
            return
        except ApiError as exc:
            if exc.status.code != 404 or time.monotonic() > deadline:
                raise
        time.sleep(0.1)


def _delete_namespace(client: Client, namespace: str) -> None:
    """Release every Pod's finalizer, then delete the namespace (the cluster deletes what it
    holds in the background)."""
    for pod in client.list(Pod, namespace=namespace):
        assert pod.metadata is not None and pod.metadata.name is not None
        if pod.metadata.finalizers:
            body = {"metadata": {"finalizers": None}}
            try:
                client.patch(Pod, pod.metadata.name, body, patch_type=PatchType.MERGE)
            except ApiError as exc:
                if exc.status.code != 404:  # gone meanwhile: nothing left to release
                    raise
    client.delete(Namespace, namespace)


def derive_kubeconfig(source: Path, path: Path, namespace: str) -> Path:
    """A copy of the kubeconfig `source` (its current context, its credentials) whose context
    names `namespace`; its relative file paths made absolute; readable by the owner only."""
    config = yaml.safe_load(source.read_text())
    current = config.get("current-context")
    contexts = [c for c in config.get("contexts") or [] if c.get("name") == current]
    if not contexts:
        raise ValueError(f"{source}: no current context")
    contexts[0].setdefault("context", {})["namespace"] = namespace
    for section, keys in (
        ("clusters", ("certificate-authority",)),
        ("users", ("client-certificate", "client-key", "tokenFile")),
    ):
        for entry in config.get(section) or []:
            inner = entry.get(section[:-1]) or {}
            for key in keys:
                if key in inner and not Path(inner[key]).expanduser().is_absolute():
                    inner[key] = str(source.parent.resolve() / inner[key])
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(config, f)
    return path
