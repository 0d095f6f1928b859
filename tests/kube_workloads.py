"""The fake API server's namespaces, service accounts and Deployments (tests/kube_api.py
serves them), with the real server's answers:

    POST   /api/v1/namespaces                                   201; 409 when it exists
    GET    /api/v1/namespaces/{ns}                              200; 404
    DELETE /api/v1/namespaces/{ns}                              200, phase Terminating
    GET    /api/v1/namespaces/{ns}/serviceaccounts/default      200 once the namespace exists
    POST   /apis/apps/v1/namespaces/{ns}/deployments            201; 409; 422 (selector)
    GET    /apis/apps/v1/namespaces/{ns}/deployments/{name}/scale
    PATCH  .../scale    a merge or strategic merge patch of spec.replicas (status follows)

Deleting a namespace does at once what the namespace controller does in the background: its
Deployments go, and so do its Pods, except that a Pod with finalizers only starts terminating
and stays until they are removed; the namespace stays (Terminating) until its last Pod is gone,
and in that time it takes no new object (403). The controller's work is finished lazily, when
the namespace is next read. A namespace's `default` service account exists as soon as the
namespace does (the service account controller's work, done at once).

Objects are read and changed on the server's thread, except where the test sets them up
before starting it (`deployments`, `namespaces`).
"""

from __future__ import annotations

import copy
import itertools
import uuid
from typing import TYPE_CHECKING, Any

from starlette.responses import JSONResponse, Response

from kube_objects import CREATED_AT, new_metadata, refuse_patch_type, status_response
from kube_pods import PodStore

if TYPE_CHECKING:
    from kube_api import KubeRequest

__all__ = ["Workloads"]

_DELETED_AT = "2025-01-01T00:02:00Z"


def _not_found(kind: str, name: str, group: str = "") -> Response:
    qualified = f"{kind}.{group}" if group else kind
    return status_response(
        404, "NotFound", f'{qualified} "{name}" not found', name=name, group=group, kind=kind
    )


class Workloads:
    """Namespaces (`namespaces`: name -> Namespace object) and each Deployment's replicas
    (`deployments`: (namespace, name) -> replicas; the Pods are `pods`'s)."""

    def __init__(self, pods: PodStore, namespaces: list[str]) -> None:
        self.pods = pods
        self._uids: dict[tuple[str, str], str] = {}
        self._resource_versions = itertools.count(1)
        self.namespaces: dict[str, dict[str, Any]] = {}
        for name in namespaces:
            self.namespaces[name] = self._namespace({"name": name})
        self.deployments: dict[tuple[str, str], int] = {}

    # -- what other resources ask --------------------------------------------------------

    def check_may_create_in(self, namespace: str | None) -> Response | None:
        """The error for a new object in `namespace` (missing, or being deleted), else None."""
        assert namespace is not None
        self._finish_deletions()
        if namespace not in self.namespaces:
            return _not_found("namespaces", namespace)
        if self.namespaces[namespace]["status"]["phase"] == "Terminating":
            return status_response(
                403,
                "Forbidden",
                f"unable to create new content in namespace {namespace} because it is being "
                "terminated",
            )
        return None

    def get_phase(self, namespace: str) -> str | None:
        """The namespace's phase (Active, Terminating), None once it is gone."""
        self._finish_deletions()
        found = self.namespaces.get(namespace)
        return None if found is None else str(found["status"]["phase"])

    # -- the API (the server's thread) -----------------------------------------------------

    def handle_namespaces(self, info: KubeRequest) -> Response:
        self._finish_deletions()
        if info.verb == "create":
            meta = (info.body or {}).get("metadata") or {}
            name = meta.get("name")
            if not isinstance(name, str) or not name:
                return status_response(422, "Invalid", "Namespace is invalid: metadata.name")
            if name in self.namespaces:
                return status_response(
                    409, "AlreadyExists", f'namespaces "{name}" already exists', name=name
                )
            self.namespaces[name] = self._namespace(meta)
            return JSONResponse(copy.deepcopy(self.namespaces[name]), status_code=201)
        name = info.name
        if info.verb not in ("get", "delete") or name is None:
            return status_response(405, "MethodNotAllowed", f"{info.verb} is not served")
        if name not in self.namespaces:
            return _not_found("namespaces", name)
        if info.verb == "delete":
            self._delete_namespace(name)
            self._finish_deletions()
            if name not in self.namespaces:  # nothing held it: gone at once
                return JSONResponse(self._terminating(name))
        return JSONResponse(copy.deepcopy(self.namespaces[name]))

    def handle_service_accounts(self, info: KubeRequest) -> Response:
        assert info.namespace is not None and info.name is not None
        self._finish_deletions()
        if info.verb != "get" or info.name != "default" or info.namespace not in self.namespaces:
            return _not_found("serviceaccounts", info.name)
        meta = {"name": "default", "namespace": info.namespace, "creationTimestamp": CREATED_AT}
        return JSONResponse({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta})

    def handle_deployments(self, info: KubeRequest) -> Response:
        if info.verb != "create":
            return status_response(405, "MethodNotAllowed", f"{info.verb} is not served")
        refused = self.check_may_create_in(info.namespace)
        if refused is not None:
            return refused
        assert info.namespace is not None
        body = info.body or {}
        name = (body.get("metadata") or {}).get("name")
        spec = body.get("spec") or {}
        selector = (spec.get("selector") or {}).get("matchLabels") or {}
        labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
        if not isinstance(name, str) or not name:
            return status_response(422, "Invalid", "Deployment.apps is invalid: metadata.name")
        if not selector or any(labels.get(k) != v for k, v in selector.items()):
            return status_response(
                422,
                "Invalid",
                f'Deployment.apps "{name}" is invalid: spec.template.metadata.labels: Invalid '
                "value: `selector` does not match template `labels`",
            )
        key = (info.namespace, name)
        if key in self.deployments:
            return status_response(
                409, "AlreadyExists", f'deployments.apps "{name}" already exists', name=name
            )
        replicas = spec.get("replicas", 1)
        self.deployments[key] = replicas
        created = {**copy.deepcopy(body), "metadata": new_metadata(body["metadata"], key[0])}
        created["metadata"]["resourceVersion"] = str(next(self._resource_versions))
        created["spec"]["replicas"] = replicas
        created["status"] = {}
        return JSONResponse(created, status_code=201)

    def handle_scale(self, info: KubeRequest) -> Response:
        assert info.namespace is not None and info.name is not None
        key = (info.namespace, info.name)
        if key not in self.deployments:
            return _not_found("deployments", info.name, "apps")
        if info.verb == "patch":
            refused = refuse_patch_type(info.content_type)
            if refused is not None:
                return refused
            replicas = (info.body or {}).get("spec", {}).get("replicas")
            if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
                return status_response(
                    422, "Invalid", f'Scale.autoscaling "{info.name}" is invalid: spec.replicas'
                )
            self.deployments[key] = replicas
        return JSONResponse(self._scale(key))

    # -- inside ------------------------------------------------------------------------------

    def _namespace(self, meta: dict[str, Any]) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                **new_metadata(meta, None),
                "resourceVersion": str(next(self._resource_versions)),
            },
            "spec": {"finalizers": ["kubernetes"]},
            "status": {"phase": "Active"},
        }

    def _terminating(self, name: str) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": name, "deletionTimestamp": _DELETED_AT},
            "spec": {"finalizers": ["kubernetes"]},
            "status": {"phase": "Terminating"},
        }

    def _delete_namespace(self, name: str) -> None:
        namespace = self.namespaces[name]
        namespace["metadata"]["deletionTimestamp"] = _DELETED_AT
        namespace["status"]["phase"] = "Terminating"
        for key in [k for k in self.deployments if k[0] == name]:
            del self.deployments[key]
        if name == self.pods.namespace:
            self.pods.delete_all()

    def _finish_deletions(self) -> None:
        """The namespace controller's last step: a Terminating namespace whose Pods are all
        gone is removed."""
        for name, namespace in list(self.namespaces.items()):
            if namespace["status"]["phase"] != "Terminating":
                continue
            if name != self.pods.namespace or self.pods.get_num_pods() == 0:
                del self.namespaces[name]

    def _scale(self, key: tuple[str, str]) -> dict[str, Any]:
        namespace, name = key
        replicas = self.deployments[key]
        uid = self._uids.setdefault(key, str(uuid.uuid4()))
        return {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": uid,
                "resourceVersion": str(next(self._resource_versions)),
                "creationTimestamp": CREATED_AT,
            },
            "spec": {"replicas": replicas},
            "status": {"replicas": replicas, "selector": f"app={name}"},
        }
