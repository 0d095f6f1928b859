"""The fake API server's Pods (tests/kube_api.py serves them): get, list and watch with the
real watch protocol, and the writes of tests/kube_pod_writes.py (create, patch, pods/status
patch, delete with finalizers); or driven by the test from its own thread (the back door):

    pods = fake.pods
    pods.add("w0", labels={...})                 # ADDED, not Ready
    pods.set_ready("w0", True)                    # MODIFIED: the Ready condition flips
    pods.terminate("w0"); pods.delete("w0")       # deletionTimestamp set; then DELETED
    pods.send_bookmarks()                         # a BOOKMARK to each watch that allows them
    pods.expire_watches()                         # compact, then ERROR 410 Gone to every watch

Every change takes the next resourceVersion (one counter, like etcd's revision) and is kept
in a history. A watch with `resourceVersion=R` replays the history after R and follows; one
with R older than the last compaction gets a single ERROR event (410 Expired), as the real
server does when R fell out of its watch cache; one without R starts with a synthetic ADDED
per Pod. `timeoutSeconds` ends a watch (after a bookmark, when allowed). The state survives
`KubeApiFake.stop`/`start`, as the real server's state lives in etcd; `end_watches` (called
by stop) ends every open stream so that the server can stop.

Thread safety: everything is under `lock`; the watch streams run on the server's event loop
and are fed through `call_soon_threadsafe`, in the order of the changes.
"""

from __future__ import annotations

import asyncio
import copy
import json
import threading
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from starlette.responses import JSONResponse, Response, StreamingResponse

from kube_objects import status_response
from kube_pod_writes import create_pod, delete_pod, patch_pod

if TYPE_CHECKING:
    from kube_api import KubeRequest

__all__ = ["POD_RULES", "POD_WATCH_RULES", "PodStore"]

# a watcher's Role rules (verb, API group, resource); a process that registers also patches
POD_WATCH_RULES = frozenset({("get", "", "pods"), ("list", "", "pods"), ("watch", "", "pods")})
POD_RULES = POD_WATCH_RULES | {("patch", "", "pods")}


def _parse_selector(text: str) -> dict[str, str]:
    """An equality label selector `k=v,k2=v2` (all the fake serves); ValueError otherwise."""
    selector = {}
    for term in filter(None, text.split(",")):
        key, sep, value = term.partition("=")
        if not sep or value.startswith("=") or key.endswith("!"):
            raise ValueError(term)
        selector[key] = value
    return selector


def _line(kind: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": obj}).encode() + b"\n"


def _matches(pod: dict[str, Any], selector: dict[str, str]) -> bool:
    labels = pod["metadata"].get("labels") or {}
    return all(labels.get(k) == v for k, v in selector.items())


@dataclass
class _Watch:
    selector: dict[str, str]
    bookmarks: bool
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[bytes | None]

    def matches(self, pod: dict[str, Any]) -> bool:
        return _matches(pod, self.selector)

    def send(self, line: bytes | None) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, line)


class PodStore:
    """The Pods of one namespace (`namespace`), their history and the open watches."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.lock = threading.Lock()
        self.pods: dict[str, dict[str, Any]] = {}
        self.resource_version = 0
        self.compacted_version = 0  # a watch from an older version gets 410
        self.history: list[tuple[int, str, dict[str, Any]]] = []  # (version, type, object)
        self.watches: list[_Watch] = []

    # -- the test's controls (any thread) --------------------------------------------------

    def add(
        self,
        name: str,
        *,
        labels: dict[str, str],
        ready: bool = False,
        annotations: dict[str, str] | None = None,
        pod_ip: str = "127.0.0.1",
    ) -> None:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "uid": str(uuid.uuid4()),
                "labels": dict(labels),
                "annotations": dict(annotations or {}),
                "creationTimestamp": "2025-01-01T00:00:00Z",
            },
            "spec": {"containers": [{"name": "armature", "image": "armature:test"}]},
            "status": {"phase": "Running", "podIP": pod_ip, "conditions": []},
        }
        with self.lock:
            assert name not in self.pods, f"Pod {name} exists"
            self._set_ready(pod, ready)
            self.change("ADDED", name, pod)

    def set_ready(self, name: str, ready: bool) -> None:
        """The kubelet's readiness probe passed (or failed): the Ready condition flips."""
        with self.lock:
            pod = copy.deepcopy(self.pods[name])
            self._set_ready(pod, ready)
            self.change("MODIFIED", name, pod)

    def terminate(self, name: str) -> None:
        """The Pod is being deleted (its preStop runs): deletionTimestamp is set."""
        with self.lock:
            pod = copy.deepcopy(self.pods[name])
            pod["metadata"]["deletionTimestamp"] = "2025-01-01T00:01:00Z"
            self.change("MODIFIED", name, pod)

    def delete(self, name: str) -> None:
        with self.lock:
            self.change("DELETED", name, copy.deepcopy(self.pods[name]))

    def get(self, name: str) -> dict[str, Any]:
        with self.lock:
            return copy.deepcopy(self.pods[name])

    def send_bookmarks(self) -> None:
        with self.lock:
            for watch in self.watches:
                if watch.bookmarks:
                    watch.send(self._bookmark())

    def compact(self) -> None:
        """Forget the history: a watch from any version seen so far gets 410 Gone."""
        with self.lock:
            self.compacted_version = self.resource_version
            self.history.clear()

    def expire_watches(self) -> None:
        """Compact, and end every open watch with ERROR 410 (its version is too old)."""
        self.compact()
        with self.lock:
            for watch in self.watches:
                watch.send(_line("ERROR", self._gone(self.compacted_version)))
                watch.send(None)
            self.watches.clear()

    def end_watches(self) -> None:
        """End every open watch stream (cleanly, as a stopping server does)."""
        with self.lock:
            for watch in self.watches:
                watch.send(None)
            self.watches.clear()

    def get_num_watches(self) -> int:
        with self.lock:
            return len(self.watches)

    def get_num_pods(self) -> int:
        with self.lock:
            return len(self.pods)

    def delete_all(self) -> None:
        """What deleting the namespace does to its Pods: each goes, or, held by finalizers,
        starts terminating (and goes when they are removed)."""
        with self.lock:
            for name in sorted(self.pods):
                delete_pod(self, name)

    # -- under the lock ----------------------------------------------------------------------

    @staticmethod
    def _set_ready(pod: dict[str, Any], ready: bool) -> None:
        status = "True" if ready else "False"
        pod["status"]["conditions"] = [
            {"type": "Ready", "status": status, "lastTransitionTime": "2025-01-01T00:00:00Z"}
        ]

    def change(self, kind: str, name: str, pod: dict[str, Any]) -> None:
        """Store `pod` (or drop it, DELETED) at the next resourceVersion and tell the
        watches."""
        self.resource_version += 1
        pod["metadata"]["resourceVersion"] = str(self.resource_version)
        if kind == "DELETED":
            del self.pods[name]
        else:
            self.pods[name] = pod
        self.history.append((self.resource_version, kind, copy.deepcopy(pod)))
        for watch in self.watches:
            if watch.matches(pod):
                watch.send(_line(kind, pod))

    def _bookmark(self) -> bytes:
        meta = {"resourceVersion": str(self.resource_version)}
        return _line("BOOKMARK", {"kind": "Pod", "apiVersion": "v1", "metadata": meta})

    def _gone(self, version: int) -> dict[str, Any]:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": f"too old resource version: {version}",
            "reason": "Expired",
            "code": 410,
        }

    # -- the API (the server's thread) -------------------------------------------------------

    def handle(self, info: KubeRequest) -> Response:
        """A request for ("", "pods") or ("", "pods/status"), authorized already (a create
        also found its namespace open)."""
        verb, name, query = info.verb, info.name, info.query
        if info.namespace != self.namespace:
            return status_response(404, "NotFound", f'no Pods in namespace "{info.namespace}"')
        if verb == "create":
            return create_pod(self, info)
        if name is not None:
            with self.lock:
                if name not in self.pods:
                    return status_response(
                        404, "NotFound", f'pods "{name}" not found', name=name, kind="pods"
                    )
                if verb == "get":
                    return JSONResponse(copy.deepcopy(self.pods[name]))
                if verb == "patch":
                    return patch_pod(self, info)
                if verb == "delete" and info.resource == "pods":
                    return delete_pod(self, name)
            return status_response(405, "MethodNotAllowed", f"{verb} is not served")
        try:
            selector = _parse_selector(query.get("labelSelector", ""))
        except ValueError as exc:
            return status_response(400, "BadRequest", f"unsupported label selector: {exc}")
        if verb == "list":
            return self._list(selector)
        return self._watch(selector, query)

    def _list(self, selector: dict[str, str]) -> Response:
        with self.lock:
            items = [
                copy.deepcopy(p) for _, p in sorted(self.pods.items()) if _matches(p, selector)
            ]
            meta = {"resourceVersion": str(self.resource_version)}
        return JSONResponse(
            {"apiVersion": "v1", "kind": "PodList", "metadata": meta, "items": items}
        )

    def _watch(self, selector: dict[str, str], query: dict[str, str]) -> Response:
        since = query.get("resourceVersion", "")
        timeout_s = float(query["timeoutSeconds"]) if "timeoutSeconds" in query else None
        bookmarks = query.get("allowWatchBookmarks") in ("1", "true")
        watch = _Watch(selector, bookmarks, asyncio.get_running_loop(), asyncio.Queue())
        with self.lock:
            if since not in ("", "0") and int(since) < self.compacted_version:
                first = [_line("ERROR", self._gone(int(since)))]
                watch.send(None)
            else:
                if since in ("", "0"):
                    first = [
                        _line("ADDED", copy.deepcopy(p))
                        for _, p in sorted(self.pods.items())
                        if watch.matches(p)
                    ]
                else:
                    first = [
                        _line(kind, copy.deepcopy(p))
                        for v, kind, p in self.history
                        if v > int(since) and watch.matches(p)
                    ]
                self.watches.append(watch)
        return StreamingResponse(
            self._stream(watch, first, timeout_s), media_type="application/json"
        )

    async def _stream(
        self, watch: _Watch, first: list[bytes], timeout_s: float | None
    ) -> AsyncIterator[bytes]:
        try:
            for line in first:
                yield line
            loop = asyncio.get_running_loop()
            deadline = None if timeout_s is None else loop.time() + timeout_s
            while True:
                left = None if deadline is None else max(0.0, deadline - loop.time())
                try:
                    line = await asyncio.wait_for(watch.queue.get(), left)
                except TimeoutError:
                    if watch.bookmarks:
                        with self.lock:
                            bookmark = self._bookmark()
                        yield bookmark
                    return
                if line is None:
                    return
                yield line
        finally:
            with self.lock:
                if watch in self.watches:
                    self.watches.remove(watch)
