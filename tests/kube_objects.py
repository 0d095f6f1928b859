"""What every resource of the fake API server (tests/kube_api.py) shares: `Status` errors,
the two patch formats and the metadata the server stamps on a created object.

    status_response(404, "NotFound", 'pods "w0" not found', name="w0", kind="pods")
    merge_patch(obj, {"metadata": {"annotations": {"k": None}}})       # RFC 7386
    strategic_merge_patch(obj, {"status": {"conditions": [{"type": "Ready", ...}]}})

A strategic merge patch is Kubernetes' own format: maps merge as in a merge patch, but a list
with a merge key (a Pod's `status.conditions` by `type`, `spec.containers` by `name`, ...)
merges item by item, and `metadata.finalizers` merges as a set; every other list is replaced.
The fake serves no `$patch` directive (400), which no client of these tests sends.
"""

from __future__ import annotations

import copy
import uuid
from typing import Any

from starlette.responses import JSONResponse

__all__ = [
    "CREATED_AT",
    "MERGE_PATCH_TYPES",
    "PatchError",
    "apply_patch",
    "merge_patch",
    "new_metadata",
    "refuse_patch_type",
    "status_response",
    "strategic_merge_patch",
]

MERGE_PATCH_TYPES = ("application/merge-patch+json", "application/strategic-merge-patch+json")
CREATED_AT = "2025-01-01T00:00:00Z"  # every object's creationTimestamp (the fake has no clock)

# (path of a list) -> its merge key, for the lists these tests' objects carry
_MERGE_KEYS = {
    ("status", "conditions"): "type",
    ("spec", "containers"): "name",
    ("spec", "template", "spec", "containers"): "name",
    ("metadata", "ownerReferences"): "uid",
}
_SET_LISTS = {("metadata", "finalizers")}  # patchStrategy merge of plain values: a union


class PatchError(ValueError):
    """A patch the fake cannot apply (a `$patch` directive, a list item without its key)."""


def status_response(code: int, reason: str, message: str, **details: str) -> JSONResponse:
    """A `Status` failure, as the API server answers every error."""
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return JSONResponse(body, status_code=code)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge key by key, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any, path: tuple[str, ...] = ()) -> Any:
    """Kubernetes' strategic merge patch of `target` (see the module docstring)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$"):
            raise PatchError(f"the patch directive {key} is not served")
        where = (*path, key)
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and where in _MERGE_KEYS:
            result[key] = _merge_list(result.get(key) or [], value, _MERGE_KEYS[where], where)
        elif isinstance(value, list) and where in _SET_LISTS:
            old = list(result.get(key) or [])
            result[key] = old + [v for v in value if v not in old]
        else:
            result[key] = strategic_merge_patch(result.get(key), value, where)
    return result


def _merge_list(target: list[Any], patch: list[Any], key: str, path: tuple[str, ...]) -> list[Any]:
    result = [copy.deepcopy(item) for item in target]
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            raise PatchError(f"an item of {'.'.join(path)} has no merge key {key!r}")
        at = next((i for i, old in enumerate(result) if old.get(key) == item[key]), None)
        if at is None:
            result.append(copy.deepcopy(item))
        else:
            result[at] = strategic_merge_patch(result[at], item, path)
    return result


def refuse_patch_type(content_type: str | None) -> JSONResponse | None:
    """The 415 for a patch in a format the fake does not serve (JSON patch, apply), else None."""
    if content_type in MERGE_PATCH_TYPES:
        return None
    return status_response(
        415, "UnsupportedMediaType", f"the media type {content_type} is not served"
    )


def apply_patch(target: Any, patch: Any, content_type: str | None) -> Any:
    """`patch` applied to `target` in the format its content type names (one of
    MERGE_PATCH_TYPES: see refuse_patch_type)."""
    if content_type == "application/strategic-merge-patch+json":
        return strategic_merge_patch(target, patch)
    return merge_patch(target, patch)


def new_metadata(meta: dict[str, Any], namespace: str | None) -> dict[str, Any]:
    """The metadata of an object being created: what the client sent, with the fields only
    the server sets (uid, creationTimestamp, the namespace of the request) set, and those a
    client may not set on create (resourceVersion, deletionTimestamp) dropped."""
    result = copy.deepcopy(meta)
    for field in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds"):
        result.pop(field, None)
    result["uid"] = str(uuid.uuid4())
    result["creationTimestamp"] = CREATED_AT
    if namespace is not None:
        result["namespace"] = namespace
    return result
