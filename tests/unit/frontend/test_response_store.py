"""ResponseStore: exact keys held, the order they go in (oldest first when full or past
the TTL), tombstones of store: false responses, and a hypothesis run against a naive model."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from armature.frontend.response_store import Missing, ResponseStore


def test_the_oldest_goes_first_when_full() -> None:
    store: ResponseStore[str] = ResponseStore(max_entries=2, ttl_s=10.0)
    store.put("a", "A", now_s=0.0)
    store.put("b", "B", now_s=1.0)
    store.put("c", "C", now_s=2.0)
    assert store.get_keys() == ["b", "c"]
    assert (store.get("a", 2.0), store.get("b", 2.0), store.get("c", 2.0)) == (
        Missing.UNKNOWN,
        "B",
        "C",
    )
    store.check_integrity()


def test_entries_expire_after_the_ttl() -> None:
    store: ResponseStore[str] = ResponseStore(max_entries=8, ttl_s=10.0)
    store.put("a", "A", now_s=0.0)
    store.put("b", "B", now_s=5.0)
    assert store.get("a", 9.9) == "A"
    assert store.get("a", 10.0) is Missing.EXPIRED  # dropped as it is seen
    assert store.get("a", 10.0) is Missing.UNKNOWN
    store.put("c", "C", now_s=15.0)  # "b" expired: dropped on the way in
    assert store.get_keys() == ["c"]


def test_tombstones_say_why_and_count_toward_the_bound() -> None:
    store: ResponseStore[str] = ResponseStore(max_entries=2, ttl_s=10.0)
    store.put_tombstone("a", now_s=0.0)
    store.put("b", "B", now_s=1.0)
    assert store.get("a", 1.0) is Missing.NOT_STORED
    assert not store.delete("a", 1.0)
    store.put("c", "C", now_s=2.0)
    assert store.get_keys() == ["b", "c"]
    assert store.delete("b", 2.0)
    assert not store.delete("b", 2.0)
    assert store.get_keys() == ["c"]


operations = st.lists(
    st.tuples(
        st.sampled_from(["put", "tombstone", "get", "delete"]),
        st.sampled_from("abcdefgh"),
        st.floats(min_value=0.0, max_value=5.0),
    ),
    max_size=60,
)


@given(operations)
def test_matches_a_naive_model(steps: list[tuple[str, str, float]]) -> None:
    """Against a list of (key, value, time) that drops the expired and then the oldest."""
    max_entries, ttl_s = 3, 4.0
    store: ResponseStore[str] = ResponseStore(max_entries, ttl_s)
    model: list[tuple[str, str | None, float]] = []
    now_s = 0.0
    for op, key, step_s in steps:
        now_s += step_s
        live = [e for e in model if now_s - e[2] < ttl_s]
        if op in ("put", "tombstone"):
            if any(k == key for k, _, _ in model):
                continue  # ids are fresh uuids: never put twice
            value = key.upper() if op == "put" else None
            while model and (now_s - model[0][2] >= ttl_s or len(model) >= max_entries):
                model.pop(0)
            model.append((key, value, now_s))
            if value is None:
                store.put_tombstone(key, now_s)
            else:
                store.put(key, value, now_s)
        elif op == "get":
            entry = next((e for e in model if e[0] == key), None)
            expected: str | Missing
            if entry is None:
                expected = Missing.UNKNOWN
            elif entry not in live:
                expected = Missing.EXPIRED
                model.remove(entry)
            else:
                expected = Missing.NOT_STORED if entry[1] is None else entry[1]
            assert store.get(key, now_s) == expected
        else:
            entry = next((e for e in model if e[0] == key), None)
            deleted = entry is not None and entry in live and entry[1] is not None
            if entry is not None and (entry not in live or deleted):
                model.remove(entry)
            assert store.delete(key, now_s) == deleted
        assert store.get_keys() == [k for k, _, _ in model]
        store.check_integrity()
