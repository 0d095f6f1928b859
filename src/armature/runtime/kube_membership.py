"""Kubernetes discovery's pure core: Pods in, discovery events out (no I/O, no asyncio).

A process registers by writing its keys into one annotation of its own Pod:

    metadata.annotations["armature.dev/discovery"] = {"<key>": "<base64 value>", ...}  (JSON)

A Pod's keys are live while the Pod is Ready (its Ready condition is "True") and not being
deleted (no deletionTimestamp: a terminating Pod drains, it takes no new work). `PodMembership`
folds the Pods a list or a watch reports into the live keys under one prefix, and says what
changed as `WatchEvent`s: a put when a key appears or its value changes, a delete when it
goes. Seeing the same Pod state twice (a watch resumed after a reconnect, a re-list after a
410) changes nothing and emits nothing; a re-list also drops the Pods it no longer reports.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from lightkube.resources.core_v1 import Pod

from armature.runtime.discovery import WatchEvent

__all__ = [
    "ANNOTATION",
    "NAMESPACE_LABEL",
    "PodMembership",
    "PodState",
    "check_label_value",
    "decode_entries",
    "encode_entries",
    "get_pod_state",
]

ANNOTATION = "armature.dev/discovery"  # a process's registrations, on its own Pod
NAMESPACE_LABEL = "armature.dev/namespace"  # the armature --namespace a Pod belongs to

_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")


def check_label_value(value: str) -> None:
    """ValueError unless `value` may be a label's value (what Kubernetes validates)."""
    if not _LABEL_VALUE.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a Kubernetes label value: at most 63 characters of letters, "
            "digits, '-', '_' or '.', beginning and ending with a letter or digit"
        )


def encode_entries(entries: Mapping[str, bytes]) -> str:
    """The annotation's text for `entries` (keys sorted, so equal sets give equal text)."""
    return json.dumps(
        {key: base64.b64encode(value).decode() for key, value in sorted(entries.items())},
        separators=(",", ":"),
    )


def decode_entries(text: str) -> dict[str, bytes]:
    """The entries in an annotation's text; ValueError when it is not what we write."""
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(raw, dict) or not all(isinstance(v, str) for v in raw.values()):
        raise ValueError("not an object of base64 strings")
    try:
        return {key: base64.b64decode(value, validate=True) for key, value in raw.items()}
    except binascii.Error as exc:
        raise ValueError(f"bad base64: {exc}") from None


@dataclass(frozen=True)
class PodState:
    """What discovery needs of one Pod. `problem`: why its annotation was not readable (its
    entries are then empty)."""

    name: str
    resource_version: str
    ready: bool
    terminating: bool
    entries: Mapping[str, bytes] = field(default_factory=dict)
    problem: str | None = None

    @property
    def is_live(self) -> bool:
        return self.ready and not self.terminating


def get_pod_state(pod: Pod) -> PodState:
    """The discovery view of a Pod object as the API server sent it."""
    meta = pod.metadata
    assert meta is not None and meta.name is not None, "a Pod without a name"
    conditions = (pod.status.conditions if pod.status is not None else None) or []
    ready = any(c.type == "Ready" and c.status == "True" for c in conditions)
    text = (meta.annotations or {}).get(ANNOTATION)
    entries: dict[str, bytes] = {}
    problem = None
    if text is not None:
        try:
            entries = decode_entries(text)
        except ValueError as exc:
            problem = f"Pod {meta.name}: unreadable annotation {ANNOTATION}: {exc}"
    return PodState(
        name=meta.name,
        resource_version=meta.resourceVersion or "",
        ready=ready,
        terminating=meta.deletionTimestamp is not None,
        entries=entries,
        problem=problem,
    )


class PodMembership:
    """The live keys under `prefix` of the Pods seen so far. Owns `pods` (by name) and `live`
    (key -> value); both change only through `apply` and `relist`. Where two live Pods carry
    one key, the Pod whose name sorts first wins (a fixed rule, so every watcher agrees)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.pods: dict[str, PodState] = {}
        self.live: dict[str, bytes] = {}

    def apply(self, pod: PodState, *, deleted: bool = False) -> list[WatchEvent]:
        """One watch event about `pod` (ADDED or MODIFIED; DELETED with `deleted`): what
        changed."""
        if deleted:
            self.pods.pop(pod.name, None)
        else:
            self.pods[pod.name] = pod
        return self._update()

    def relist(self, pods: Iterable[PodState]) -> list[WatchEvent]:
        """A full list replaces every Pod seen so far; what changed since."""
        self.pods = {pod.name: pod for pod in pods}
        return self._update()

    def _update(self) -> list[WatchEvent]:
        live: dict[str, bytes] = {}
        for name in sorted(self.pods, reverse=True):  # the first name is written last, wins
            pod = self.pods[name]
            if pod.is_live:
                live.update((k, v) for k, v in pod.entries.items() if k.startswith(self.prefix))
        events = [WatchEvent("put", k, v) for k, v in sorted(live.items()) if self.live.get(k) != v]
        events += [WatchEvent("delete", k) for k in sorted(self.live.keys() - live.keys())]
        self.live = live
        return events

    def check_integrity(self) -> None:
        """Every live key comes from a live Pod, under the prefix (for tests)."""
        for key in self.live:
            assert key.startswith(self.prefix), key
            assert any(p.is_live and key in p.entries for p in self.pods.values()), key
