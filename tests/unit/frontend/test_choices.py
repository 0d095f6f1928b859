"""fork_streams: the first stream runs alone until its first item, then the others start;
items interleave as they come, tagged by index; an error or an early close ends every stream.
top_by_score: best_of's pick."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable

import pytest

from armature.frontend.choices import fork_streams, top_by_score


class Log:
    """What the fake streams did, in order: ("start", i), ("item", i, k), ("closed", i)."""

    def __init__(self) -> None:
        self.events: list[tuple[object, ...]] = []

    def stream(
        self, index: int, num_items: int, fail_at: int | None = None
    ) -> Callable[[], AsyncGenerator[str, None]]:
        async def run() -> AsyncGenerator[str, None]:
            self.events.append(("start", index))
            try:
                for k in range(num_items):
                    await asyncio.sleep(0)  # one event-loop turn per item: the streams interleave
                    if k == fail_at:
                        raise RuntimeError(f"stream {index} failed")
                    self.events.append(("item", index, k))
                    yield f"{index}.{k}"
            finally:
                self.events.append(("closed", index))

        return run


async def test_the_others_start_after_the_first_item_of_the_first() -> None:
    log = Log()
    out = [x async for x in fork_streams([log.stream(i, 3) for i in range(3)])]
    assert log.events[:2] == [("start", 0), ("item", 0, 0)]
    assert log.events[2:4] == [("start", 1), ("start", 2)]
    assert sorted(out) == [(i, f"{i}.{k}") for i in range(3) for k in range(3)]
    for i in range(3):  # each stream's items keep their order
        assert [x for j, x in out if j == i] == [f"{i}.{k}" for k in range(3)]
    indices = [i for i, _ in out]
    assert indices != sorted(indices)  # interleaved, not one stream after another
    assert sorted(e for e in log.events if e[0] == "closed") == [("closed", i) for i in range(3)]


async def test_one_stream_is_passed_through() -> None:
    log = Log()
    assert [x async for x in fork_streams([log.stream(0, 2)])] == [(0, "0.0"), (0, "0.1")]
    assert log.events[-1] == ("closed", 0)


async def test_a_first_stream_that_ends_empty_still_starts_the_others() -> None:
    log = Log()
    out = [x async for x in fork_streams([log.stream(0, 0), log.stream(1, 1)])]
    assert out == [(1, "1.0")]


async def test_an_error_in_one_stream_closes_all_and_is_raised() -> None:
    log = Log()
    starts = [log.stream(0, 5), log.stream(1, 5, fail_at=1), log.stream(2, 5)]
    with pytest.raises(RuntimeError, match="stream 1 failed"):
        async for _ in fork_streams(starts):
            pass
    assert sorted(e for e in log.events if e[0] == "closed") == [("closed", i) for i in range(3)]
    assert ("item", 0, 4) not in log.events  # the others were stopped, not run out


async def test_closing_early_closes_every_stream() -> None:
    log = Log()
    forked = fork_streams([log.stream(i, 100) for i in range(3)])
    got = [await anext(forked) for _ in range(4)]
    await forked.aclose()
    assert len(got) == 4
    assert sorted(e for e in log.events if e[0] == "closed") == [("closed", i) for i in range(3)]
    assert sum(1 for e in log.events if e[0] == "item") < 20


def test_top_by_score_picks_the_highest_first_ties_to_the_lower_index() -> None:
    assert top_by_score([-3.0, -1.0, -2.0, -1.0], 3) == [1, 3, 2]
    assert top_by_score([-0.5], 1) == [0]
