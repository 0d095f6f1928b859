"""Several sequences for one prompt (n > 1, best_of): prefill once, then fork. Several prompts
(a batch of completions): all at once (`merge_streams`).

The first sequence starts alone. Once it yields its first item, its engine has computed the
prompt and cached its full blocks, so the others start then, on the same worker (a
`RouteGroup`), and each finds the whole prompt in the prefix cache but for the block holding
its last token (whose logits every sequence needs). This is how vLLM v1 runs n > 1: child
requests sharing the parent's prompt through the prefix cache. Items are yielded as they
arrive, tagged with their sequence's index, so streams interleave the choices.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Generic, TypeVar

__all__ = ["fork_streams", "merge_streams", "top_by_score"]

T = TypeVar("T")


class _End:
    """A stream has ended (distinct from any item)."""


_END = _End()


async def _next(stream: AsyncGenerator[T, None]) -> T | _End:
    try:
        return await anext(stream)
    except StopAsyncIteration:
        return _END


class _Streams(Generic[T]):
    """The running sequences: each has at most one pending `anext` task."""

    def __init__(self) -> None:
        self.streams: list[AsyncGenerator[T, None]] = []
        self.pending: dict[asyncio.Task[T | _End], int] = {}

    def start(self, stream: AsyncGenerator[T, None]) -> None:
        self.streams.append(stream)
        self.advance(len(self.streams) - 1)

    def advance(self, index: int) -> None:
        task = asyncio.ensure_future(_next(self.streams[index]))
        self.pending[task] = index

    async def close(self) -> None:
        """Cancel what is pending and close every stream (which aborts its request)."""
        for task in self.pending:
            task.cancel()
        await asyncio.gather(*self.pending, return_exceptions=True)
        self.pending.clear()
        for stream in self.streams:
            await stream.aclose()


async def fork_streams(
    starts: Sequence[Callable[[], AsyncGenerator[T, None]]],
) -> AsyncGenerator[tuple[int, T], None]:
    """(index, item) from every stream `starts[i]()`; the first runs alone until its first
    item. An error in any stream ends them all and is raised; closing this generator early
    closes every stream."""
    assert starts, "at least one stream"
    streams: _Streams[T] = _Streams()
    try:
        streams.start(starts[0]())
        forked = False
        while streams.pending:
            done, _ = await asyncio.wait(streams.pending, return_when=asyncio.FIRST_COMPLETED)
            for task in sorted(done, key=lambda t: streams.pending[t]):
                index = streams.pending.pop(task)
                item = task.result()
                if not isinstance(item, _End):
                    yield index, item
                    streams.advance(index)
                if not forked:  # the first stream has its first item (or ended): fork
                    forked = True
                    for start in starts[1:]:
                        streams.start(start())
    finally:
        await streams.close()


async def merge_streams(
    streams: Sequence[AsyncGenerator[T, None]],
) -> AsyncGenerator[tuple[int, T], None]:
    """(index, item) from every stream in `streams`, all running at once (a batch's prompts),
    items as they come. An error in any stream ends them all and is raised; closing this
    generator early closes every stream."""
    running: _Streams[T] = _Streams()
    try:
        for stream in streams:
            running.start(stream)
        while running.pending:
            done, _ = await asyncio.wait(running.pending, return_when=asyncio.FIRST_COMPLETED)
            for task in sorted(done, key=lambda t: running.pending[t]):
                index = running.pending.pop(task)
                item = task.result()
                if not isinstance(item, _End):
                    yield index, item
                    running.advance(index)
    finally:
        await running.close()


def top_by_score(scores: Sequence[float], num: int) -> list[int]:
    """Indices of the `num` highest scores, highest first (ties: the lower index)."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    return order[:num]
