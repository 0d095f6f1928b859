"""What the streaming path encodes once instead of per token: a stream's events (its shared
fields encoded once, then only the choice per event) are byte for byte the whole chunk
encoded; a histogram fed an interval's tokens at once exposes what prometheus_client's
Histogram exposes when fed them one at a time."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from armature.frontend.metrics import CountedHistogram
from armature.frontend.responses import (
    ChatChoiceChunk,
    CompletionChoiceChunk,
    StreamChunk,
    StreamEvents,
    sse_event,
)

strings = st.text(st.characters(codec="utf-8"), max_size=12) | st.sampled_from(
    ['"choices":[]', '\\"choices\\":[]', "</script>", "\u2028", "é\x00\x1f"]
)
choices = st.one_of(
    st.builds(CompletionChoiceChunk, st.integers(0, 3), strings),
    st.builds(
        CompletionChoiceChunk,
        st.integers(0, 3),
        strings,
        st.just({"tokens": ["a"], "token_logprobs": [-0.5]}),
        st.sampled_from([None, "stop", "length"]),
    ),
    st.builds(
        ChatChoiceChunk,
        st.integers(0, 3),
        st.dictionaries(st.sampled_from(["role", "content", "reasoning_content"]), strings),
        st.none(),
        st.sampled_from([None, "stop", "tool_calls"]),
    ),
)


@given(
    request_id=strings,
    model=strings,
    created=st.integers(0, 2**40),
    usage=st.sampled_from([msgspec.UNSET, None]),
    choice=choices,
)
def test_an_event_is_the_whole_chunk_encoded(
    request_id: str, model: str, created: int, usage: Any, choice: Any
) -> None:
    head = (request_id, "text_completion", created, model)
    events = StreamEvents(*head, usage)
    assert events.event(choice) == sse_event(StreamChunk(*head, [choice], usage))


def test_an_event_pinned() -> None:
    events = StreamEvents("cmpl-1", "text_completion", 7, 'm"x', None)
    assert events.event(CompletionChoiceChunk(0, "hi")) == (
        b'data: {"id":"cmpl-1","object":"text_completion","created":7,"model":"m\\"x",'
        b'"choices":[{"index":0,"text":"hi","logprobs":null,"finish_reason":null}],'
        b'"usage":null}\n\n'
    )


BUCKETS = (0.001, 0.01, 0.1, 1.0)


def exposition(registry: CollectorRegistry) -> list[str]:
    return [
        line
        for line in generate_latest(registry).decode().splitlines()
        if "_created" not in line and "_sum" not in line  # made when; the sum, below
    ]


@given(
    intervals=st.lists(
        st.tuples(st.sampled_from([0.0, 0.0005, 0.001, 0.05, 0.1, 3.0, 0.25]), st.integers(1, 9)),
        max_size=8,
    )
)
def test_counted_observations_expose_what_single_ones_do(
    intervals: list[tuple[float, int]],
) -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    counted = CountedHistogram("gap_seconds", "Gaps", BUCKETS, ours)
    single = Histogram("gap_seconds", "Gaps", buckets=BUCKETS, registry=theirs)
    for value, count in intervals:
        counted.observe(value, count)
        for _ in range(count):
            single.observe(value)
    assert exposition(ours) == exposition(theirs)
    # value x count against count additions: equal up to rounding
    assert ours.get_sample_value("gap_seconds_sum") == pytest.approx(
        theirs.get_sample_value("gap_seconds_sum"), rel=1e-12, abs=1e-15
    )
    total = sum(count for _, count in intervals)
    assert ours.get_sample_value("gap_seconds_count") == total
    assert ours.get_sample_value("gap_seconds_bucket", {"le": "0.001"}) == sum(
        count for value, count in intervals if value <= 0.001
    )


def test_a_second_metric_of_the_name_is_refused() -> None:
    registry = CollectorRegistry()
    CountedHistogram("gap_seconds", "Gaps", BUCKETS, registry)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        CountedHistogram("gap_seconds", "Gaps", BUCKETS, registry)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        Histogram("gap_seconds", "Gaps", buckets=BUCKETS, registry=registry)


def test_buckets_must_increase() -> None:
    with pytest.raises(ValueError, match="increasing"):
        CountedHistogram("x", "x", (0.1, 0.01), CollectorRegistry())
    with pytest.raises(ValueError, match="increasing"):
        CountedHistogram("x", "x", (), CollectorRegistry())
