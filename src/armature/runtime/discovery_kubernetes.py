"""Kubernetes discovery: a process is discovered through its Pod (the core is kube_membership).

    GET   /api/v1/namespaces/{ns}/pods?labelSelector=armature.dev/namespace=<namespace>
          list: the Pods and the resourceVersion of the list
    GET   ...pods?watch=true&resourceVersion=<rv>&allowWatchBookmarks=true&labelSelector=...
          watch: every change after <rv>, and BOOKMARKs that only advance <rv>
    GET   /api/v1/namespaces/{ns}/pods/{own pod}            at start, a process with a Pod
    PATCH /api/v1/namespaces/{ns}/pods/{own pod}            application/merge-patch+json
          {"metadata": {"annotations": {"armature.dev/discovery": <its registrations>}}}
    POST  /apis/authorization.k8s.io/v1/selfsubjectaccessreviews     at start: may it watch?

register: the process writes all it holds into the annotation of its own Pod (`pod_name`,
from the downward API); at start it removes what an earlier container of the same Pod left
there (a restarted worker has a new instance id), which also proves it may patch. A Pod's
keys are live while it is Ready and not terminating: the kubelet's readiness probe and the
Pod's deletion are the lease, so `ttl_s` is not used (one registering process per Pod).

watch: list, then watch from the list's resourceVersion, following bookmarks. When the
stream ends or breaks (an API server restart) it resumes from the last resourceVersion seen,
with backoff while the server is away; when the server answers 410 Gone (that version was
compacted away) it lists again and emits the difference. The membership core turns repeats
into nothing, so a resumed watch yields no duplicates and a re-list loses no delete.

Permissions: watchers need get, list and watch on pods; a registering process also patch
(RBAC cannot narrow it to the process's own Pod: Pod names are generated). The check at start
lists (list), reads and patches its own Pod (get, patch), and asks the API server whether it
may watch (a SelfSubjectAccessReview, which every authenticated user may create), so that a
Role without `watch` fails at start, not at the first watch. A server that answers no review
(forbidden or absent) is taken at its word later.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator

import httpx2
from lightkube import AsyncClient
from lightkube.models.authorization_v1 import ResourceAttributes, SelfSubjectAccessReviewSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.authorization_v1 import SelfSubjectAccessReview
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType

from armature.errors import ArmatureError, ConfigError
from armature.runtime.discovery import Registration, WatchEvent
from armature.runtime.kube_client import (
    TIMEOUT_S,
    describe_api_failure,
    get_credentials_source,
)
from armature.runtime.kube_membership import (
    ANNOTATION,
    NAMESPACE_LABEL,
    PodMembership,
    PodState,
    encode_entries,
    get_pod_state,
)

__all__ = ["FIELD_MANAGER", "KubeDiscoveryError", "KubePodUnknownError", "KubernetesDiscovery"]

log = logging.getLogger(__name__)

FIELD_MANAGER = "armature-discovery"  # who wrote the annotation, in the Pod's managedFields
_WATCH_TIMEOUT_S = 300  # the API server ends each watch request after this (then we resume)
# A watch silent this much longer than its timeout is on a connection that died without a
# reset (a host powered off, a partition): it is dropped and resumed, where it hung for good.
_WATCH_GRACE_S = 30.0


class KubeDiscoveryError(ArmatureError, RuntimeError):
    """The API server refused or failed a discovery call; the message is one line."""


class KubePodUnknownError(KubeDiscoveryError, ConfigError):
    """Registering needs this process's own Pod and none is named: a setting to fix, not a
    failure to retry."""


class _PodRegistration:
    def __init__(self, owner: KubernetesDiscovery, key: str):
        self.owner = owner
        self.key = key

    async def close(self) -> None:
        await self.owner.unregister(self.key)


class KubernetesDiscovery:
    """Discovery over the Pods labelled `armature.dev/namespace=<namespace>` in the client's
    namespace. Owns the client (`close` closes it) and this process's registrations."""

    def __init__(
        self,
        client: AsyncClient,
        namespace: str,
        *,
        pod_name: str | None,
        retry_max_s: float = 2.0,
        watch_timeout_s: int = _WATCH_TIMEOUT_S,
        watch_idle_s: float | None = None,
    ) -> None:
        """A watch silent for `watch_idle_s` (default: `watch_timeout_s` + 30 s, by when the
        API server has ended it) is resumed on a new connection."""
        self._client = client
        self.namespace = namespace  # armature's, the value of the label
        self._selector = f"{NAMESPACE_LABEL}={namespace}"
        self.pod_name = pod_name
        self.retry_max_s = retry_max_s
        self.watch_timeout_s = watch_timeout_s
        self.watch_idle_s = (
            watch_timeout_s + _WATCH_GRACE_S if watch_idle_s is None else watch_idle_s
        )
        # lightkube reads its watches with no read timeout (this is where it keeps theirs)
        client._client._watch_timeout = httpx2.Timeout(TIMEOUT_S, read=self.watch_idle_s)
        self._entries: dict[str, bytes] = {}
        self._publish_lock = asyncio.Lock()

    @property
    def pods_namespace(self) -> str:
        return str(self._client.namespace)

    def _fail(self, exc: httpx2.HTTPError, doing: str) -> KubeDiscoveryError:
        code, message = describe_api_failure(exc)
        if code is None:
            why = f"the API server is unreachable: {message}"
        elif code == 401:
            why = f"the API server refused the credentials (401 Unauthorized): {message}"
        elif code == 403:
            why = f"forbidden (403): {message}"
        elif code == 404:
            why = f"not found (404): {message}"
        else:
            why = f"{code}: {message}"
        return KubeDiscoveryError(f"{self._where()}: {doing}: {why}")

    def _where(self) -> str:
        server = self._client.config.cluster.server
        source = get_credentials_source(self._client)
        return f"kubernetes discovery (API server {server}, credentials from {source})"

    async def check(self) -> None:
        """List the Pods now, and with a Pod of its own, read it and remove what an earlier
        container left in its annotation: KubeDiscoveryError names what is wrong."""
        await self._list_pods()
        await self._check_may_watch()
        if self.pod_name is None:
            return
        doing = f"get its own Pod {self.pods_namespace}/{self.pod_name}"
        try:
            await self._client.get(Pod, self.pod_name)
        except httpx2.HTTPError as exc:
            raise self._fail(exc, doing) from None
        async with self._publish_lock:
            await self._patch_annotation(None)

    async def _check_may_watch(self) -> None:
        """KubeDiscoveryError when the API server says this process may not watch Pods."""
        attributes = ResourceAttributes(
            verb="watch", resource="pods", namespace=self.pods_namespace
        )
        review = SelfSubjectAccessReview(
            metadata=ObjectMeta(), spec=SelfSubjectAccessReviewSpec(resourceAttributes=attributes)
        )
        try:
            answer = await self._client.create(review)
        except httpx2.HTTPError as exc:
            log.debug("no access review (%s): watch permission checked at the first watch", exc)
            return
        if answer.status is None or answer.status.allowed:
            return
        reason = f": {answer.status.reason}" if answer.status.reason else ""
        raise KubeDiscoveryError(
            f"{self._where()}: watch Pods in namespace {self.pods_namespace}: forbidden by the "
            f"API server's access review{reason} (the Role needs get, list and watch on pods)"
        )

    async def register(self, key: str, value: bytes, ttl_s: float) -> Registration:
        if ttl_s <= 0:
            raise ValueError("ttl_s must be > 0")
        if self.pod_name is None:
            raise KubePodUnknownError(
                "kubernetes discovery: registering needs this process's own Pod: set "
                "ARMATURE_K8S_POD_NAME from the downward API (fieldRef metadata.name)"
            )
        async with self._publish_lock:
            entries = {**self._entries, key: value}
            await self._patch_annotation(encode_entries(entries))
            self._entries = entries  # only once the Pod carries it
        return _PodRegistration(self, key)

    async def unregister(self, key: str) -> None:
        """Remove `key` from the Pod's annotation (the annotation itself when it was the last).
        A failure is logged: the Pod going away removes the key anyway."""
        async with self._publish_lock:
            self._entries.pop(key, None)
            text = encode_entries(self._entries) if self._entries else None
            try:
                await self._patch_annotation(text)
            except KubeDiscoveryError as exc:
                log.warning("%s", exc)

    async def _patch_annotation(self, text: str | None) -> None:
        assert self.pod_name is not None
        body = {"metadata": {"annotations": {ANNOTATION: text}}}
        try:
            await self._client.patch(Pod, self.pod_name, body, patch_type=PatchType.MERGE)
        except httpx2.HTTPError as exc:
            doing = f"patch its own Pod {self.pods_namespace}/{self.pod_name}"
            raise self._fail(exc, doing) from None

    async def _list_pods(self) -> tuple[list[PodState], str]:
        pods = self._client.list(Pod, labels={NAMESPACE_LABEL: self.namespace})
        try:
            states = [get_pod_state(pod) async for pod in pods]
        except httpx2.HTTPError as exc:
            raise self._fail(exc, f"list Pods in namespace {self.pods_namespace}") from None
        for state in states:
            if state.problem is not None:
                log.warning("%s", state.problem)
        return states, pods.resourceVersion

    async def list(self, prefix: str) -> dict[str, bytes]:
        membership = PodMembership(prefix)
        membership.relist((await self._list_pods())[0])
        return dict(membership.live)

    async def watch(self, prefix: str) -> AsyncIterator[WatchEvent]:
        membership = PodMembership(prefix)
        resource_version: str | None = None  # None: list first
        backoff_s = 0.1
        while True:
            try:
                if resource_version is None:
                    states, resource_version = await self._list_pods()
                    for event in membership.relist(states):
                        yield event
                async for change, pod in self._watch_pods(resource_version):
                    backoff_s = 0.1
                    assert pod.metadata is not None
                    resource_version = pod.metadata.resourceVersion or resource_version
                    if change in ("ADDED", "MODIFIED", "DELETED"):
                        state = get_pod_state(pod)
                        if state.problem is not None:
                            log.warning("%s", state.problem)
                        deleted = change == "DELETED"
                        for event in membership.apply(state, deleted=deleted):
                            yield event
                    # BOOKMARK: only the resourceVersion moves on
            except httpx2.HTTPStatusError as exc:
                # a 410 (in an ERROR event, or the answer) lists again, after the backoff
                # like any failure: a server that only ever answers 410 must not spin this
                if describe_api_failure(exc)[0] == 410:
                    log.info("Pod watch expired (410 Gone at %s): listing again", resource_version)
                    resource_version = None
                else:
                    log.warning("%s; retrying", self._fail(exc, "watch Pods"))
            except (httpx2.HTTPError, KubeDiscoveryError) as exc:
                log.warning("Pod watch interrupted (%s); resuming", exc)
            await asyncio.sleep(backoff_s + random.uniform(0, backoff_s))
            backoff_s = min(self.retry_max_s, backoff_s * 2)

    def _watch_pods(self, resource_version: str) -> AsyncIterator[tuple[str, Pod]]:
        """The raw watch from `resource_version`, bookmarks included. lightkube 1.0's public
        `watch` cannot ask for bookmarks, so this builds the same request through its generic
        client with `allowWatchBookmarks`; every error is raised (410 included), the caller
        decides. lightkube itself resumes a stream the server ended cleanly (timeoutSeconds)."""
        generic = self._client._client
        request = generic.prepare_request(
            "list",
            res=Pod,
            watch=True,
            params={
                "resourceVersion": resource_version,
                "allowWatchBookmarks": "true",
                "labelSelector": self._selector,
                "timeoutSeconds": self.watch_timeout_s,
            },
        )
        return generic.watch(request)

    async def close(self) -> None:
        await self._client.close()
