"""The Kubernetes cluster the Kubernetes tests drive, behind one interface (`KubeCluster`),
in three ways (the drivers, which are also the tests' parameter ids):

    fake       the fake API server (tests/kube_api.py), set up through its back door
               (`fake.pods.add`, `fake.deployments[...] = n`): exactly what it is told
    api-fake   the same fake, set up through its API alone (tests/kube_cluster_api.py),
               as a real cluster is: this shows that driver works without a cluster
    cluster    a real cluster, through that same API driver

    @pytest.fixture(params=get_drivers())
    def cluster(request, monkeypatch):
        with open_cluster(request.param, FakeSetup(token=..., rules=POD_RULES)) as found:
            monkeypatch.setenv("KUBECONFIG", str(found.kubeconfig))   # the code under test's
            yield found

By default the behavioural tests run with `fake` and `api-fake`. With ARMATURE_TEST_KUBE=cluster
they run with `cluster` alone, against the cluster KUBECONFIG points at, each in a namespace
of its own; the tests of the fake's internals (`fake_only`) are then skipped. A KUBECONFIG
alone never selects a cluster: the suite would create namespaces on whatever cluster a
developer's shell points at, production included.

`cluster.fake` is the fake behind the cluster (None on a real one): tests check the exact
requests of the code under test there (`fake.get_requests()` leaves out the driver's own).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import pytest

from kube_api import KubeApiFake
from kube_cluster_api import derive_kubeconfig, open_api_cluster

__all__ = [
    "MODE_VARIABLE",
    "FakeSetup",
    "KubeCluster",
    "fake_only",
    "get_drivers",
    "is_cluster_mode",
    "open_cluster",
]

MODE_VARIABLE = "ARMATURE_TEST_KUBE"  # "cluster": run against $KUBECONFIG's cluster
_ADMIN_TOKEN = "test-admin-token"  # the api-fake driver's own user on the fake


class KubeCluster(Protocol):
    """A namespace of a cluster, as the Kubernetes tests drive it."""

    namespace: str
    kubeconfig: Path  # for the code under test: this namespace is its context's
    fake: KubeApiFake | None  # the fake API server behind it; None on a real cluster

    def write_kubeconfig(self, path: Path, *, namespace: str) -> Path:
        """Another kubeconfig for the code under test, whose context names `namespace`."""
        ...

    def add_pod(
        self,
        name: str,
        *,
        labels: Mapping[str, str],
        annotations: Mapping[str, str] | None = None,
        ready: bool = False,
    ) -> None:
        """A worker's Pod, scheduled; Ready (its readiness probe passed) or not yet."""
        ...

    def set_ready(self, name: str, ready: bool) -> None:
        """The Pod's Ready condition flips, as when its readiness probe passes or fails."""
        ...

    def terminate_pod(self, name: str) -> None:
        """The Pod is being deleted (deletionTimestamp set) but still there, draining."""
        ...

    def delete_pod(self, name: str) -> None:
        """The Pod is gone."""
        ...

    def get_pod_annotations(self, name: str) -> dict[str, str]: ...

    def add_deployment(self, name: str, replicas: int) -> None:
        """A Deployment with `replicas`, and its `scale` subresource."""
        ...

    def get_replicas(self, name: str) -> int:
        """The Deployment's spec.replicas, read through `deployments/scale`."""
        ...


def is_cluster_mode() -> bool:
    """Whether the run opted in to a real cluster; a usage error for a wrong opt-in."""
    mode = os.environ.get(MODE_VARIABLE, "")
    if mode in ("", "fake"):
        return False
    if mode != "cluster":
        raise pytest.UsageError(f"{MODE_VARIABLE}={mode!r}: expected 'cluster' or 'fake'")
    kubeconfig = os.environ.get("KUBECONFIG", "")
    if not kubeconfig or os.pathsep in kubeconfig or not Path(kubeconfig).is_file():
        raise pytest.UsageError(
            f"{MODE_VARIABLE}=cluster needs KUBECONFIG to name one kubeconfig file of the "
            f"cluster to test against (it is {kubeconfig!r})"
        )
    return True


def get_drivers(*, slow: bool = False) -> list[str]:
    """The drivers a behavioural test runs with: `cluster` in cluster mode; else `fake` and
    `api-fake`, or `api-fake` alone for a `slow` test (whose processes do the same either
    way: the driver only sets the scene)."""
    if is_cluster_mode():
        return ["cluster"]
    return ["api-fake"] if slow else ["fake", "api-fake"]


def fake_only(reason: str) -> pytest.MarkDecorator:
    """Skip the test in cluster mode: it needs the fake API server's internals."""
    return pytest.mark.skipif(is_cluster_mode(), reason=f"needs the fake API server: {reason}")


@dataclass(frozen=True)
class FakeSetup:
    """The fake API server of the fake drivers: the code under test's token, user and RBAC
    rules, and the namespace of its context."""

    token: str
    rules: frozenset[tuple[str, str, str]]
    user: str
    namespace: str = "serving"


class BackdoorCluster:
    """The `fake` driver: the fake's objects set directly."""

    def __init__(self, fake: KubeApiFake, kubeconfig: Path) -> None:
        self.fake: KubeApiFake | None = fake
        self._fake = fake
        self.namespace = fake.namespace
        self.kubeconfig = fake.write_kubeconfig(kubeconfig)

    def write_kubeconfig(self, path: Path, *, namespace: str) -> Path:
        return self._fake.write_kubeconfig(path, namespace=namespace)

    def add_pod(
        self,
        name: str,
        *,
        labels: Mapping[str, str],
        annotations: Mapping[str, str] | None = None,
        ready: bool = False,
    ) -> None:
        self._fake.pods.add(
            name, labels=dict(labels), ready=ready, annotations=dict(annotations or {})
        )

    def set_ready(self, name: str, ready: bool) -> None:
        self._fake.pods.set_ready(name, ready)

    def terminate_pod(self, name: str) -> None:
        self._fake.pods.terminate(name)

    def delete_pod(self, name: str) -> None:
        self._fake.pods.delete(name)

    def get_pod_annotations(self, name: str) -> dict[str, str]:
        return dict(self._fake.pods.get(name)["metadata"].get("annotations") or {})

    def add_deployment(self, name: str, replicas: int) -> None:
        self._fake.deployments[(self.namespace, name)] = replicas

    def get_replicas(self, name: str) -> int:
        return self._fake.deployments[(self.namespace, name)]


@contextlib.contextmanager
def open_cluster(driver: str, setup: FakeSetup) -> Iterator[KubeCluster]:
    """The cluster of `driver` (see get_drivers), for one test; its kubeconfigs live in a
    private temporary directory, removed at the end (a real cluster's hold credentials)."""
    with tempfile.TemporaryDirectory(prefix="armature-kube-") as root:
        kubeconfig = Path(root) / "kubeconfig"
        if driver == "cluster":
            source = Path(os.environ["KUBECONFIG"])
            namespace = f"armature-test-{secrets.token_hex(4)}"

            def write(path: Path, ns: str) -> Path:
                return derive_kubeconfig(source, path, ns)

            with open_api_cluster(source, namespace, kubeconfig, write) as cluster:
                yield cluster
            return
        api = driver == "api-fake"
        assert api or driver == "fake", driver
        fake = KubeApiFake(
            token=setup.token,
            namespace=setup.namespace,
            rules=setup.rules,
            user=setup.user,
            admin_token=_ADMIN_TOKEN if api else None,
            create_namespace=not api,
        )
        with fake:
            if not api:
                yield BackdoorCluster(fake, kubeconfig)
                return
            admin = fake.write_kubeconfig(Path(root) / "admin", token=_ADMIN_TOKEN)

            def write_fake(path: Path, ns: str) -> Path:
                return fake.write_kubeconfig(path, namespace=ns)

            with open_api_cluster(admin, setup.namespace, kubeconfig, write_fake, fake) as c:
                yield c
            # the driver cleaned up: the namespace and all it held are gone
            assert fake.workloads.get_phase(setup.namespace) is None
            assert fake.pods.get_num_pods() == 0
            assert not fake.deployments
