"""`WaitingQueue`: the scheduler's waiting requests in order, with what every step reads of
them kept as requests come and go, so that no step walks the queue (an overloaded worker's
queue holds hundreds). Pure."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from armature.engines.native.request import RequestState

__all__ = ["WaitingQueue"]


class WaitingQueue:
    """Waiting requests, head first. A request's counts are taken as it joins: a waiting
    request's tokens and computed tokens stay as they are until it leaves (it is admitted,
    starts onboarding, or finishes)."""

    def __init__(self) -> None:
        self._queue: deque[RequestState] = deque()
        # each request's tokens left to compute and whether it held imported KV blocks, as
        # it joined
        self._joined: dict[RequestState, tuple[int, bool]] = {}
        self.num_tokens_left = 0  # the sum of their tokens left to compute
        # of them, how many joined holding imported KV blocks (at least as many as hold some
        # now: a hold dropped while waiting is still counted)
        self.num_joined_holding = 0

    def __len__(self) -> int:
        return len(self._queue)

    def __bool__(self) -> bool:
        return bool(self._queue)

    def __iter__(self) -> Iterator[RequestState]:
        return iter(self._queue)

    def __getitem__(self, index: int) -> RequestState:
        return self._queue[index]

    def append(self, request: RequestState) -> None:
        self._join(request)
        self._queue.append(request)

    def appendleft(self, request: RequestState) -> None:
        self._join(request)
        self._queue.appendleft(request)

    def popleft(self) -> RequestState:
        request = self._queue.popleft()
        self._leave(request)
        return request

    def remove(self, request: RequestState) -> None:
        self._queue.remove(request)
        self._leave(request)

    def _join(self, request: RequestState) -> None:
        assert request not in self._joined, request.request_id
        tokens_left = request.num_tokens - request.num_computed_tokens
        holding = bool(request.held_block_ids)
        self._joined[request] = (tokens_left, holding)
        self.num_tokens_left += tokens_left
        self.num_joined_holding += holding

    def _leave(self, request: RequestState) -> None:
        tokens_left, holding = self._joined.pop(request)
        self.num_tokens_left -= tokens_left
        self.num_joined_holding -= holding
