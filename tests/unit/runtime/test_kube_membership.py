"""Kubernetes discovery's pure core: Pod objects to PodState, and the exact discovery events
each Pod change or re-list produces (readiness, termination, deletion, repeats, conflicts)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from lightkube.models.core_v1 import PodCondition, PodSpec, PodStatus
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Pod

from armature.runtime.discovery import WatchEvent
from armature.runtime.kube_membership import (
    ANNOTATION,
    PodMembership,
    PodState,
    check_label_value,
    decode_entries,
    encode_entries,
    get_pod_state,
)

PREFIX = "instances/ns/"
A, B = "instances/ns/worker/generate/a", "instances/ns/worker/generate/b"


def pod(
    name: str,
    *,
    ready: bool = True,
    terminating: bool = False,
    entries: dict[str, bytes] | None = None,
) -> PodState:
    return PodState(name, "1", ready, terminating, entries if entries is not None else {})


def put(key: str, value: bytes) -> WatchEvent:
    return WatchEvent("put", key, value)


def delete(key: str) -> WatchEvent:
    return WatchEvent("delete", key)


def test_entries_round_trip_through_the_annotation_text() -> None:
    entries = {B: b"\x00card-b", A: b"card-a"}
    text = encode_entries(entries)
    assert text == '{"instances/ns/worker/generate/a":"Y2FyZC1h",' + (
        '"instances/ns/worker/generate/b":"AGNhcmQtYg=="}'
    )
    assert decode_entries(text) == entries


@pytest.mark.parametrize(
    ("text", "why"),
    [("nope", "not JSON"), ('["a"]', "not an object"), ('{"k": 1}', "not an object"),
     ('{"k": "!!"}', "bad base64")],
)  # fmt: skip
def test_unreadable_annotations_are_refused_with_the_reason(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        decode_entries(text)


def test_get_pod_state_reads_ready_termination_and_the_annotation() -> None:
    meta = ObjectMeta(
        name="w0",
        resourceVersion="17",
        annotations={ANNOTATION: encode_entries({A: b"a"}), "other": "x"},
    )
    status = PodStatus(
        conditions=[
            PodCondition(type="PodScheduled", status="True"),
            PodCondition(type="Ready", status="True"),
        ]
    )
    ready = Pod(metadata=meta, spec=PodSpec(containers=[]), status=status)
    assert get_pod_state(ready) == PodState("w0", "17", True, False, {A: b"a"})
    not_ready = Pod(
        metadata=ObjectMeta(name="w1", deletionTimestamp="2025-01-01T00:00:00Z"),
        status=PodStatus(conditions=[PodCondition(type="Ready", status="False")]),
    )
    assert get_pod_state(not_ready) == PodState("w1", "", False, True, {})
    bad = Pod(metadata=ObjectMeta(name="w2", annotations={ANNOTATION: "{"}))
    state = get_pod_state(bad)
    assert (state.ready, state.entries) == (False, {})
    assert state.problem is not None
    assert state.problem.startswith(
        "Pod w2: unreadable annotation armature.dev/discovery: not JSON"
    )


def test_a_pod_joins_when_ready_and_leaves_when_unready_terminating_or_deleted() -> None:
    m = PodMembership(PREFIX)
    assert m.apply(pod("w0", ready=False, entries={A: b"a"})) == []
    assert m.apply(pod("w0", entries={A: b"a"})) == [put(A, b"a")]
    assert m.apply(pod("w0", entries={A: b"a"})) == []  # a repeat (resumed watch): nothing
    assert m.apply(pod("w0", entries={A: b"a2"})) == [put(A, b"a2")]  # re-registered
    assert m.apply(pod("w0", ready=False, entries={A: b"a2"})) == [delete(A)]
    assert m.apply(pod("w0", entries={A: b"a2"})) == [put(A, b"a2")]  # flapped back
    assert m.apply(pod("w0", terminating=True, entries={A: b"a2"})) == [delete(A)]
    assert m.apply(pod("w0", terminating=True), deleted=True) == []
    assert (m.pods, m.live) == ({}, {})
    m.apply(pod("w1", entries={B: b"b"}))
    assert m.apply(pod("w1", entries={B: b"b"}), deleted=True) == [delete(B)]
    assert m.apply(pod("w1"), deleted=True) == []  # a DELETED seen twice


def test_keys_outside_the_prefix_and_deregistration_in_the_annotation() -> None:
    m = PodMembership(PREFIX)
    assert m.apply(pod("w0", entries={A: b"a", "planner/acks/x": b"p"})) == [put(A, b"a")]
    assert m.apply(pod("w0", entries={"planner/acks/x": b"p"})) == [delete(A)]
    assert m.live == {}


def test_relist_emits_the_difference_and_drops_pods_it_no_longer_reports() -> None:
    m = PodMembership(PREFIX)
    assert m.relist([pod("w0", entries={A: b"a"}), pod("w1", ready=False, entries={B: b"b"})]) == [
        put(A, b"a")
    ]
    # while the watch was gone: w0 was deleted, w1 became Ready
    assert m.relist([pod("w1", entries={B: b"b"})]) == [put(B, b"b"), delete(A)]
    assert sorted(m.pods) == ["w1"]
    assert m.relist([pod("w1", entries={B: b"b"})]) == []


def test_a_key_on_two_live_pods_belongs_to_the_first_name() -> None:
    m = PodMembership(PREFIX)
    assert m.apply(pod("w1", entries={A: b"from-w1"})) == [put(A, b"from-w1")]
    assert m.apply(pod("w0", entries={A: b"from-w0"})) == [put(A, b"from-w0")]
    assert m.apply(pod("w1", ready=False, entries={A: b"from-w1"})) == []
    assert m.apply(pod("w0", ready=False, entries={A: b"from-w0"})) == [delete(A)]


pod_states = st.builds(
    PodState,
    name=st.sampled_from(["w0", "w1", "w2"]),
    resource_version=st.just("1"),
    ready=st.booleans(),
    terminating=st.booleans(),
    entries=st.dictionaries(st.sampled_from([A, B, "other/k"]), st.binary(max_size=2), max_size=2),
)


@given(st.lists(st.tuples(pod_states, st.booleans()), max_size=30))
def test_replaying_the_events_always_gives_the_naive_live_set(
    changes: list[tuple[PodState, bool]],
) -> None:
    """Against a naive oracle: the events, applied to a dict, rebuild exactly `live`, which is
    the union of the live Pods' entries under the prefix (first name wins)."""
    m = PodMembership(PREFIX)
    seen: dict[str, bytes] = {}
    pods: dict[str, PodState] = {}
    for state, deleted in changes:
        for event in m.apply(state, deleted=deleted):
            if event.kind == "put":
                assert seen.get(event.key) != event.value, "a put that changes nothing"
                seen[event.key] = event.value
            else:
                del seen[event.key]
        if deleted:
            pods.pop(state.name, None)
        else:
            pods[state.name] = state
        expected: dict[str, bytes] = {}
        for name in sorted(pods):
            for key, value in pods[name].entries.items():
                if pods[name].is_live and key.startswith(PREFIX):
                    expected.setdefault(key, value)
        assert seen == expected == m.live
        m.check_integrity()


@pytest.mark.parametrize("value", ["armature", "a", "A.b_c-9", "x" * 63])
def test_label_values_kubernetes_accepts(value: str) -> None:
    check_label_value(value)


@pytest.mark.parametrize("value", ["-a", "a-", "_a", "x" * 64])
def test_label_values_kubernetes_refuses(value: str) -> None:
    with pytest.raises(ValueError, match="not a Kubernetes label value"):
        check_label_value(value)
