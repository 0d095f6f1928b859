"""Continuous-batching scheduler with chunked prefill, prefix caching and preemption.

Each step has a token budget (`max_num_batched_tokens`). Running requests go first, in
admission order: a decode takes one token, an unfinished prefill takes the next chunk. When
blocks run out, the most recently admitted running request is preempted: its blocks are freed
and it goes back to the head of the waiting queue, to be recomputed from prompt + output so far
(its own blocks usually still hit the prefix cache). Waiting requests are admitted in order
with what budget and blocks remain; those holding imported KV blocks (a decode worker's pulled
prompts) may pass a head that does not fit (`_admit_past_head`). Pure: no I/O, no threads, no
model.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import NamedTuple

from armature.engines.native.kv_manager import KvCacheManager
from armature.engines.native.onboarding import Onboarding, OnboardStart
from armature.engines.native.request import RequestState, RequestStatus
from armature.engines.native.waiting_queue import WaitingQueue
from armature.protocols.engine import FinishReason

__all__ = ["ScheduledChunk", "Scheduler", "SchedulerOutput"]


class ScheduledChunk(NamedTuple):  # a tuple: hundreds are made per step under load
    request: RequestState
    start_pos: int  # request.num_computed_tokens when scheduled
    num_tokens: int

    @property
    def is_decode(self) -> bool:
        """One new token after a computed context (prefills and recomputes are not)."""
        return self.num_tokens == 1 and self.start_pos > 0

    @property
    def completes_sequence(self) -> bool:
        """True when this chunk reaches the end of the request's tokens: sample after it."""
        return self.start_pos + self.num_tokens == self.request.num_tokens


@dataclass(frozen=True)
class SchedulerOutput:
    chunks: list[ScheduledChunk]
    preempted: list[RequestState]

    @property
    def num_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks)


class Scheduler:
    def __init__(
        self,
        kv: KvCacheManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        onboarding: Onboarding | None = None,
    ):
        """With `onboarding`, a request whose prompt continues in lower KV tiers waits out of
        the queues while those blocks load (see `armature.engines.native.onboarding`)."""
        self.kv = kv
        self.onboarding = onboarding
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting = WaitingQueue()
        self.running: list[RequestState] = []

    # ---- queue management --------------------------------------------------------------
    def add_request(self, request: RequestState) -> None:
        request.status = RequestStatus.WAITING
        self.waiting.append(request)

    def requeue_onboarded(self, requests: list[RequestState]) -> None:
        """Requests whose onboarding finished go back to the head of the waiting queue, in
        their order."""
        for request in reversed(requests):
            request.status = RequestStatus.WAITING
            self.waiting.appendleft(request)

    def finish(self, request: RequestState, reason: FinishReason) -> None:
        """Take `request` out of the queues and free its blocks (finish, abort or error)."""
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
        elif request.status is RequestStatus.WAITING:
            self.waiting.remove(request)
        elif request.status is RequestStatus.ONBOARDING:
            assert self.onboarding is not None
            self.onboarding.cancel(request)  # its loads still write its blocks
        if request.status is not RequestStatus.FINISHED:
            self.kv.free(request)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def get_num_prefill_tokens_queued(self) -> int:
        """Tokens still to prefill: all of a waiting request's uncomputed tokens, and a running
        one's unless only its next decode token is left."""
        queued = self.waiting.num_tokens_left
        for r in self.running:
            if not _only_decode_left(r):
                queued += r.num_tokens - r.num_computed_tokens
        return queued

    def get_num_prefill_requests_queued(self) -> int:
        """Requests with tokens still to prefill (those `get_num_prefill_tokens_queued` counts)."""
        return len(self.waiting) + sum(1 for r in self.running if not _only_decode_left(r))

    # ---- one step ----------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        budget = self.max_num_batched_tokens
        chunks: list[ScheduledChunk] = []
        preempted: list[RequestState] = []
        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            assert num_new > 0
            scheduled = True
            while not self.kv.allocate_slots(request, num_new):
                victim = self.running.pop()
                self._preempt(victim)
                preempted.append(victim)
                if victim is request:
                    scheduled = False
                    break
            if not scheduled:
                break
            chunks.append(ScheduledChunk(request, request.num_computed_tokens, num_new))
            budget -= num_new
            index += 1
        if not preempted:
            budget = self._admit_waiting(budget, chunks)
        return SchedulerOutput(chunks, preempted)

    def _admit_waiting(self, budget: int, chunks: list[ScheduledChunk]) -> int:
        """Admit waiting requests in order while budget, sequences and blocks last. When the
        head's blocks do not fit, requests behind it that hold imported KV blocks may go
        first (their blocks are only given back by running them); when nothing runs either,
        those holds are dropped so that the head fits (see `_admit_past_head`)."""
        head_blocked = False
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            cached = None
            if (
                self.onboarding is not None
                and not request.onboard_checked
                and request.prompt_logprobs is None  # computes its whole prompt
            ):
                cached = self.kv.find_cached_prefix(request)
                start = self.onboarding.try_start(request, cached)
                if start is OnboardStart.WAIT:
                    # its loads wait for free blocks or the tiers: where requests behind it
                    # hold imported blocks (which only running them gives back, and which
                    # may be what it waits for), they may go first, as past a head whose
                    # blocks do not fit
                    head_blocked = self.waiting.num_joined_holding > 0
                    break
                request.onboard_checked = True
                if start is OnboardStart.STARTED:
                    self.waiting.popleft()
                    request.status = RequestStatus.ONBOARDING
                    continue
            admitted = self._admit(request, budget, chunks, cached)
            if admitted is None:
                head_blocked = True
                break
            budget = admitted
        if head_blocked:
            budget = self._admit_past_head(budget, chunks)
        return budget

    def _admit_past_head(self, budget: int, chunks: list[ScheduledChunk]) -> int:
        """The head's blocks do not fit. Requests behind it holding imported KV blocks (a
        decode worker's pulled prompts) go first where theirs do, in queue order: held blocks
        are taken from the pool until their request runs and finishes, so waiting behind the
        head would keep them from it for good once nothing runs. If nothing runs after that,
        every hold behind the head is dropped (the imported blocks stay cached, evictable,
        and hit again if still there) and the head is tried once more."""
        holders = (
            [r for r in itertools.islice(self.waiting, 1, None) if r.held_block_ids]
            if self.waiting.num_joined_holding
            else []
        )
        for request in holders:
            if budget <= 0 or len(self.running) >= self.max_num_seqs:
                return budget
            admitted = self._admit(request, budget, chunks)
            budget = budget if admitted is None else admitted
        if self.running or not self.waiting:
            return budget
        for request in holders:
            self.kv.release_held(request)
        admitted = self._admit(self.waiting[0], budget, chunks)
        return budget if admitted is None else admitted

    def _admit(
        self,
        request: RequestState,
        budget: int,
        chunks: list[ScheduledChunk],
        cached: list[int] | None = None,
    ) -> int | None:
        """Admit waiting `request` with its cached prefix (`cached`, when already looked up)
        and a first chunk within `budget`; the budget left, or None (nothing changed) when
        its blocks do not fit."""
        if cached is None:
            cached = self.kv.find_cached_prefix(request)
        num_cached_tokens = len(cached) * self.kv.block_size
        num_new = min(request.num_tokens - num_cached_tokens, budget)
        if not self.kv.allocate_slots(request, num_new, cached):
            return None
        self.waiting.remove(request)
        self.kv.release_held(request)  # the request now holds its own references
        if request.num_preemptions == 0:
            request.num_cached_tokens = num_cached_tokens
        request.status = RequestStatus.RUNNING
        self.running.append(request)
        chunks.append(ScheduledChunk(request, request.num_computed_tokens, num_new))
        return budget - num_new

    def _preempt(self, request: RequestState) -> None:
        self.kv.free(request)
        request.status = RequestStatus.WAITING
        request.onboard_checked = False  # its blocks may have gone down a tier meanwhile
        request.num_preemptions += 1
        self.waiting.appendleft(request)

    def update_after_step(self, output: SchedulerOutput) -> None:
        """Advance computed-token counts and cache newly full blocks. Sampled tokens are
        appended by the engine core afterwards."""
        for chunk in output.chunks:
            chunk.request.num_computed_tokens = chunk.start_pos + chunk.num_tokens
            self.kv.register_full_blocks(chunk.request)


def _only_decode_left(request: RequestState) -> bool:
    """Only the next decode token is left to compute (the rest is computed)."""
    return request.num_tokens - request.num_computed_tokens == 1 and request.num_computed_tokens > 0
