"""The `kubernetes` connector: one Deployment per role, scaled through its `scale`
subresource (lightkube; `pip install 'armature[kubernetes]'`, imported only when chosen).

    GET   /apis/apps/v1/namespaces/{ns}/deployments/{name}/scale   at start: each role's replicas
    PATCH /apis/apps/v1/namespaces/{ns}/deployments/{name}/scale   application/merge-patch+json
          ?fieldManager=armature-planner                           {"spec": {"replicas": N}}

Those two are all it ever asks, so the planner's service account needs only `get` and `patch`
on `deployments/scale` (API group `apps`) in the workers' namespace; it never reads or writes
the Deployment itself, its Pods or anything else.

The cluster configuration is the Pod's service account when the planner runs in a cluster
(its token file read again when the API server refuses the token: runtime/kube_client.py),
else `$KUBECONFIG`, else `~/.kube/config`.
At start `open_kubernetes_connector` reads each role's Deployment: missing configuration,
refused credentials, an unreachable API server, a missing Deployment or a forbidden verb is
a one-line ConfigError (`armature planner` exits 2). Later, any failure of a PATCH is a
ConnectorError, which the actuator logs and retries (a merge patch of an absolute count is
idempotent; it also never conflicts, carrying no resourceVersion).

Scale-down loses nothing, but not through this connector: the ReplicaSet controller picks the
Pods to delete, and each worker Pod's preStop hook (the Helm chart provides it) drains the
worker before the container gets SIGTERM: it leaves discovery, so the frontend stops routing
to it, and finishes its in-flight requests; the Pod's terminationGracePeriodSeconds must cover
that drain (the worker's --shutdown-grace-s), or Kubernetes kills it mid-request.

The counts it reports are the Deployments' `spec.replicas` as read at start and after each
PATCH it made (what was asked for, not the Pods running yet); a change made by someone else
(kubectl scale, an HPA) is seen only at the next PATCH. The planner starts from the counts
read at start, brought within its limits (a Deployment at 0 replicas goes to --min-workers).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import httpx2
from lightkube import AsyncClient
from lightkube.resources.apps_v1 import Deployment
from lightkube.types import PatchType

from armature.errors import ConfigError
from armature.planner.connectors.api import ConnectorError
from armature.protocols.worker import WorkerRole
from armature.runtime.kube_client import (
    SERVICE_ACCOUNT_DIR,
    describe_api_failure,
    get_credentials_source,
    make_kube_client,
)

__all__ = ["FIELD_MANAGER", "KubernetesConnector", "open_kubernetes_connector"]

log = logging.getLogger(__name__)

FIELD_MANAGER = "armature-planner"  # who scaled, in each Deployment's managedFields


class KubernetesConnector:
    """Scales each role's Deployment. Owns its API client (`close` closes it)."""

    def __init__(
        self,
        client: AsyncClient,
        namespace: str,
        deployments: Mapping[WorkerRole, str],
        num_workers: Mapping[WorkerRole, int],
    ) -> None:
        self._client = client
        self._namespace = namespace
        self._deployments = dict(deployments)
        self._num_workers = dict(num_workers)

    def get_num_workers(self) -> dict[WorkerRole, int]:
        return dict(self._num_workers)

    async def scale(self, role: WorkerRole, num_workers: int, reason: str) -> None:
        name = self._deployments[role]
        try:
            scale = await self._client.patch(
                Deployment.Scale,
                name,
                {"spec": {"replicas": num_workers}},
                namespace=self._namespace,
                patch_type=PatchType.MERGE,
            )
        except httpx2.HTTPError as exc:
            raise ConnectorError(_describe(exc, "patch", self._namespace, name)) from None
        replicas = scale.spec.replicas if scale.spec is not None else None
        if replicas != num_workers:
            raise ConnectorError(
                f"Deployment {self._namespace}/{name} answered {replicas} replicas to a patch "
                f"to {num_workers}"
            )
        log.info(
            "scaled Deployment %s/%s from %d to %d replicas: %s",
            self._namespace,
            name,
            self._num_workers.get(role, 0),
            num_workers,
            reason,
        )
        self._num_workers[role] = num_workers

    async def close(self) -> None:
        """Close the API client; the Deployments keep their replicas."""
        await self._client.close()


async def open_kubernetes_connector(
    deployments: Mapping[WorkerRole, str],
    *,
    namespace: str | None = None,
    service_account_dir: Path = SERVICE_ACCOUNT_DIR,
) -> KubernetesConnector:
    """Connect with the Pod's service account (mounted in `service_account_dir`) or the
    kubeconfig and read each role's replicas; `namespace` None is the configuration's (the
    Pod's, or the context's). ConfigError, one line, when that fails."""
    client = make_kube_client(
        namespace=namespace,
        field_manager=FIELD_MANAGER,
        user="--connector kubernetes",
        service_account_dir=service_account_dir,
    )
    ns = client.namespace
    server = client.config.cluster.server
    num_workers: dict[WorkerRole, int] = {}
    try:
        for role, name in deployments.items():
            try:
                scale = await client.get(Deployment.Scale, name, namespace=ns)
            except httpx2.HTTPError as exc:
                source = get_credentials_source(client)
                raise ConfigError(
                    f"--connector kubernetes (API server {server}, credentials from {source}): "
                    f"{_describe(exc, 'get', ns, name, flag=f'--k8s-{role.value}-deployment')}"
                ) from None
            num_workers[role] = (scale.spec.replicas if scale.spec is not None else None) or 0
    except BaseException:
        await client.close()
        raise
    log.info(
        "kubernetes: API server %s, namespace %s, Deployments %s",
        server,
        ns,
        ", ".join(f"{r.value}={deployments[r]} ({n} replicas)" for r, n in num_workers.items()),
    )
    return KubernetesConnector(client, ns, deployments, num_workers)


def _describe(
    exc: httpx2.HTTPError, verb: str, namespace: str, name: str, *, flag: str = ""
) -> str:
    """One line for a failed call on deployments/`name`/scale."""
    target = f"Deployment {namespace}/{name}"
    code, message = describe_api_failure(exc)
    if code is None:
        return f"the API server is unreachable ({verb} {target}): {message}"
    if code == 401:
        return f"the API server refused the credentials (401 Unauthorized): {message}"
    if code == 403:
        return (
            f"forbidden to {verb} the scale of {target} (403): the service account needs get and "
            f"patch on deployments/scale in namespace {namespace}: {message}"
        )
    if code == 404:
        hint = f" (check {flag} and --k8s-namespace)" if flag else ""
        return f"{target} not found (404){hint}: {message}"
    return f"{verb} the scale of {target}: {code} {message}"
