"""The writes of the fake API server's Pods (tests/kube_pods.py), as the real server does them:

    POST   .../pods                 201 with the Pod as stored: uid and creationTimestamp set,
                                    status reset to Pending (a client cannot create a status);
                                    409 when it exists, 422 without a name or containers
    PATCH  .../pods/{name}          merge or strategic merge; the status is kept (only
                                    pods/status writes it), deletionTimestamp too
    PATCH  .../pods/{name}/status   the same, but only the status (and the metadata a status
                                    writer may touch) changes: spec, deletionTimestamp and
                                    ownerReferences are kept, as the Pod status strategy does
    DELETE .../pods/{name}          a Pod no node runs (no spec.nodeName) has no grace period:
                                    it goes at once (DELETED), unless it has finalizers; then
                                    it is only marked (deletionTimestamp; MODIFIED) and goes
                                    when a patch removes the last of them

A write that changes nothing keeps the resourceVersion and sends no watch event, as etcd's
store skips an unchanged object. Each function runs on the server's thread; `patch_pod` and
`delete_pod` with the store's lock held (the caller found the Pod).
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from starlette.responses import JSONResponse, Response

from kube_objects import (
    PatchError,
    apply_patch,
    new_metadata,
    refuse_patch_type,
    status_response,
)

if TYPE_CHECKING:
    from kube_api import KubeRequest
    from kube_pods import PodStore

__all__ = ["create_pod", "delete_pod", "patch_pod"]

_DELETED_AT = "2025-01-01T00:01:00Z"
_SERVER_METADATA = ("name", "namespace", "uid", "creationTimestamp", "resourceVersion")


def _invalid(name: str, why: str) -> Response:
    return status_response(422, "Invalid", f'Pod "{name}" is invalid: {why}', name=name)


def create_pod(store: PodStore, info: KubeRequest) -> Response:
    body = info.body if isinstance(info.body, dict) else {}
    meta = body.get("metadata") or {}
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        return _invalid("", "metadata.name: Required value (generateName is not served)")
    if meta.get("namespace") not in (None, info.namespace):
        return status_response(
            400,
            "BadRequest",
            "the namespace of the provided object does not match the namespace sent on the request",
        )
    spec = copy.deepcopy(body.get("spec") or {})
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        return _invalid(name, "spec.containers: Required value")
    spec.setdefault("schedulerName", "default-scheduler")
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": new_metadata(meta, info.namespace),
        "spec": spec,
        "status": {"phase": "Pending"},
    }
    with store.lock:
        if name in store.pods:
            return status_response(
                409, "AlreadyExists", f'pods "{name}" already exists', name=name, kind="pods"
            )
        store.change("ADDED", name, pod)
        return JSONResponse(copy.deepcopy(pod), status_code=201)


def patch_pod(store: PodStore, info: KubeRequest) -> Response:
    assert info.name is not None
    refused = refuse_patch_type(info.content_type)
    if refused is not None:
        return refused
    current = store.pods[info.name]
    try:
        pod = apply_patch(current, info.body or {}, info.content_type)
    except PatchError as exc:
        return status_response(400, "BadRequest", str(exc))
    if not isinstance(pod.get("metadata"), dict):
        return _invalid(info.name, "metadata: Required value")
    kept = ("spec",) if info.resource == "pods/status" else ("status",)
    for field in kept:
        pod[field] = copy.deepcopy(current[field])
    _keep_metadata(pod["metadata"], current["metadata"], status=info.resource == "pods/status")
    if pod == current:
        return JSONResponse(copy.deepcopy(current))
    # the last finalizer of a Pod deleted with no grace period left: it goes now
    meta = pod["metadata"]
    deleted = meta.get("deletionGracePeriodSeconds") == 0 and not meta.get("finalizers")
    store.change("DELETED" if deleted else "MODIFIED", info.name, pod)
    return JSONResponse(copy.deepcopy(pod))


def _keep_metadata(meta: dict[str, Any], current: dict[str, Any], *, status: bool) -> None:
    """Put back in `meta` what the patch may not change."""
    fields = [*_SERVER_METADATA, "deletionTimestamp", "deletionGracePeriodSeconds"]
    if status:
        fields.append("ownerReferences")
    for field in fields:
        if field in current:
            meta[field] = copy.deepcopy(current[field])
        else:
            meta.pop(field, None)


def delete_pod(store: PodStore, name: str) -> Response:
    pod = copy.deepcopy(store.pods[name])
    meta = pod["metadata"]
    if not meta.get("finalizers"):
        store.change("DELETED", name, pod)
        return JSONResponse(copy.deepcopy(pod))
    if "deletionTimestamp" not in meta:
        meta["deletionTimestamp"] = _DELETED_AT
        meta["deletionGracePeriodSeconds"] = 0
        store.change("MODIFIED", name, pod)
    return JSONResponse(copy.deepcopy(pod))
