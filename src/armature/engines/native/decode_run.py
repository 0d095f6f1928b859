"""The decode fast path: many engine steps of a batch of decodes at once, with exactly the
effects `EngineCore.step` would have had one step at a time (the simulator's jump over
steps; `EngineCore.step` stays the reference, and tests hold the two equal).

A batch of decodes only changes at known steps, so the steps between are cheap:

    step:        i0 ........ a ........ r ............ f
    request j:   decode      allocate   register       finish (max_tokens)
                 (a block    (its next  (its newest    (the run ends after
                  boundary)   block)     block full)     this step)

Each step still runs the scheduler's block calls in the scheduler's order (allocations in
running order, then registrations in running order, then finishes), asks the runner for the
step's time and records its `StepRecord`; what is skipped is everything that does not change:
scheduling, chunks, token appends (tokens are filled in when a block is hashed or the run
ends) and per-step outputs (the caller delivers one token per request per step).

A run needs a runner that knows a step's time before running it and picks tokens without the
batch (`DecodeRunner`: the mocker), and a batch that can only decode: every running request
has one token left to compute, no stop strings or remote prefill, and no waiting request
could be admitted (the queue is empty, or the batch holds `max_num_seqs` or the whole token
budget). It stops before a step whose blocks would not fit (the step-by-step path preempts),
after a step that finishes a request, and before a step starting at or after `horizon_ms`.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from armature.engines.native.request import RequestState
from armature.engines.native.scheduler import Scheduler
from armature.engines.native.step_stats import StepStats
from armature.protocols.engine import EngineOutput, FinishReason

__all__ = ["DecodeRun", "DecodeRunner", "can_run_decodes", "run_decodes"]


class DecodeRunner(Protocol):
    @property
    def decode_uses_context(self) -> bool:
        """Whether a decode step's time depends on the tokens it attends over (else only on
        its requests and the KV cache's use, so steps that allocate nothing take as long)."""
        ...

    def get_decode_step_ms(self, num_requests: int, num_kv_tokens: int) -> float:
        """The time of a step of `num_requests` decodes attending over `num_kv_tokens` tokens
        (their new ones included), with the KV cache as it is now."""
        ...

    def advance_steps(self, step_ms: float, num_steps: int) -> list[float]:
        """Let `num_steps` steps of `step_ms` pass, as `ModelRunner.execute` of each would
        (no tokens); returns each one's seconds on the engine's clock (`time_s`)."""
        ...

    def get_tokens(self, request_id: str, start: int, stop: int) -> list[int]:
        """The request's tokens at positions `start..stop-1` (the same whatever the batch)."""
        ...


@dataclass(frozen=True)
class DecodeRun:
    """Steps run at once: the batch (`request_ids`, in running order) decoded one token each
    step; step i ended at `step_end_ms[i]` (the first started at the run's `now_ms`). Every
    step but the last is done; `outputs` are the last step's, as `EngineCore.step` returns
    them, to deliver at `step_end_ms[-1]`."""

    request_ids: list[str]
    step_end_ms: list[float]
    outputs: list[EngineOutput]

    @property
    def num_steps(self) -> int:
        return len(self.step_end_ms)


def can_run_decodes(scheduler: Scheduler, eos_token_ids: tuple[int, ...]) -> bool:
    """Whether the next step is a batch of decodes only that a run can take (see above)."""
    running = scheduler.running
    if not running or scheduler.onboarding is not None:
        return False
    num_running = len(running)
    if num_running > scheduler.max_num_batched_tokens:
        return False
    if scheduler.waiting and not (
        num_running >= scheduler.max_num_seqs or num_running == scheduler.max_num_batched_tokens
    ):
        return False  # a waiting request may be admitted next step
    for r in running:
        if r.num_tokens - r.num_computed_tokens != 1 or r.num_computed_tokens == 0:
            return False
        if r.remote_prefill or r.sampling.stop_token_ids or r.grammar is not None:
            return False  # a guided request's grammar reads each token
        if eos_token_ids and not r.sampling.ignore_eos:
            return False
        if r.num_tokens - r.num_prompt_tokens == r.num_output_at_start:
            return False  # its next token is its first
    return True


def run_decodes(
    scheduler: Scheduler,
    stats: StepStats,
    runner: DecodeRunner,
    *,
    max_model_len: int,
    now_ms: float,
    horizon_ms: float,
    finish: Callable[[RequestState, FinishReason], None],
) -> DecodeRun | None:
    """Run steps of the current batch of decodes (`can_run_decodes` must hold) from `now_ms`
    until one finishes a request, the next would need blocks that are not free, or the next
    would start at or after `horizon_ms`. `finish` ends a request as the engine does; the
    runner's clock is the engine's (its steps' seconds are recorded). None (nothing changed)
    when the first step's blocks do not fit."""
    kv = scheduler.kv
    running = list(scheduler.running)
    num_requests = len(running)
    bs = kv.block_size
    start_computed = [r.num_computed_tokens for r in running]
    # steps (from 0) at which each request allocates a block, registers a full block, finishes
    allocations = [(_next_allocation(r, bs), j) for j, r in enumerate(running)]
    registrations = [(_next_registration(r, bs), j) for j, r in enumerate(running)]
    heapq.heapify(allocations)
    heapq.heapify(registrations)
    finish_at = [_steps_to_finish(r, max_model_len) for r in running]
    last_step = min(finish_at)
    queued = (len(scheduler.waiting), scheduler.get_num_prefill_tokens_queued())
    kv_tokens = sum(start_computed) + num_requests
    # a stretch: steps of one length, from one that may allocate to the next event
    stretch_ends = not runner.decode_uses_context
    step_end_ms: list[float] = []
    step = 0  # the stretch's first step
    while True:
        if allocations[0][0] == step and not _allocate_due(
            scheduler, running, start_computed, allocations, step
        ):
            if step == 0:
                return None
            step -= 1  # the step-by-step path preempts at this step
            break
        # the stretch's last step: before the next allocation, at the next registration or
        # finish (one step when step times read the context)
        last = min(registrations[0][0], last_step, allocations[0][0] - 1) if stretch_ends else step
        num_kv_tokens_used = kv.pool.get_num_active_blocks() * bs
        step_ms = runner.get_decode_step_ms(num_requests, kv_tokens)
        t_ms = step_end_ms[-1] if step_end_ms else now_ms
        # the stretch's step ends, one step_ms apart (added one by one, as step by step),
        # to the first at or after the horizon
        ends_ms = list(
            itertools.accumulate(itertools.repeat(step_ms, last - step + 1), initial=t_ms)
        )
        del ends_ms[0]
        del ends_ms[bisect.bisect_left(ends_ms, horizon_ms) + 1 :]
        wall_s = runner.advance_steps(step_ms, len(ends_ms))
        stats.record_decodes(
            num_decode_requests=num_requests,
            first_decode_kv_tokens=kv_tokens,
            num_kv_tokens_used=num_kv_tokens_used,
            num_queued_prefill_requests=queued[0],
            num_queued_prefill_tokens=queued[1],
            wall_s=wall_s,
        )
        step_end_ms += ends_ms
        step += len(ends_ms) - 1
        kv_tokens += num_requests * len(ends_ms)
        t_ms = ends_ms[-1]
        if registrations[0][0] == step:
            for j in _take_due(registrations, step):
                r = running[j]
                _sync(r, start_computed[j] + step + 1, runner)  # before the step's token
                kv.register_full_blocks(r)
                heapq.heappush(registrations, (step + bs, j))
        if step == last_step or t_ms >= horizon_ms:
            break
        step += 1
    ends_at = [start + step + 1 for start in start_computed]
    outputs = _last_step_outputs(running, ends_at, [f == step for f in finish_at], runner, finish)
    return DecodeRun([r.request_id for r in running], step_end_ms, outputs)


def _allocate_due(
    scheduler: Scheduler,
    running: list[RequestState],
    start_computed: list[int],
    allocations: list[tuple[int, int]],
    step: int,
) -> bool:
    """Give each request due at `step` in `allocations` its next block, and queue its next
    allocation; False (nothing allocated) when the blocks due are not free."""
    kv = scheduler.kv
    due = _take_due(allocations, step)
    if len(due) > kv.pool.get_num_free_blocks():
        return False
    for j in due:
        r = running[j]
        r.num_computed_tokens = start_computed[j] + step  # all allocation reads
        ok = kv.allocate_slots(r, 1)
        assert ok
        heapq.heappush(allocations, (_next_allocation(r, kv.block_size) + step, j))
    return True


def _last_step_outputs(
    running: list[RequestState],
    num_computed_at_end: list[int],
    finishes: list[bool],
    runner: DecodeRunner,
    finish: Callable[[RequestState, FinishReason], None],
) -> list[EngineOutput]:
    """The run's last step: each request caught up to `num_computed_at_end`, its token
    sampled, and those in `finishes` ended at their length limit."""
    outputs = []
    for r, num_computed, finishing in zip(running, num_computed_at_end, finishes, strict=True):
        _sync(r, num_computed, runner)
        position = r.num_tokens
        token = runner.get_tokens(r.request_id, position, position + 1)[0]
        r.token_ids.append(token)
        reason = FinishReason.LENGTH if finishing else None
        if reason is not None:
            finish(r, reason)
        outputs.append(
            EngineOutput(request_id=r.request_id, new_token_ids=[token], finish_reason=reason)
        )
    return outputs


def _take_due(heap: list[tuple[int, int]], step: int) -> list[int]:
    """Pop the requests due at `step` (in running order)."""
    due = []
    while heap and heap[0][0] == step:
        due.append(heapq.heappop(heap)[1])
    return due


def _next_allocation(r: RequestState, block_size: int) -> int:
    """Steps from now until `r`'s next decode needs a new block (0: the next one does)."""
    return max(0, len(r.block_ids) * block_size - r.num_computed_tokens)


def _next_registration(r: RequestState, block_size: int) -> int:
    """Steps from now until the step after which `r` has a new full block to register."""
    if r.num_registered_blocks < (r.num_computed_tokens + 1) // block_size:
        return 0
    return (-r.num_computed_tokens - 1) % block_size


def _steps_to_finish(r: RequestState, max_model_len: int) -> int:
    """Steps from now until the step whose token ends `r` (0: the next step's)."""
    p = r.sampling
    by_tokens = p.max_tokens + r.num_output_at_start - (r.num_tokens - r.num_prompt_tokens) - 1
    by_length = max_model_len - r.num_tokens - 1
    return max(0, min(by_tokens, by_length))


def _sync(r: RequestState, num_computed_tokens: int, runner: DecodeRunner) -> None:
    """Bring `r` to `num_computed_tokens` computed, all of them in its tokens (as after a
    step's model run, before its token is appended): fill in the tokens the skipped steps
    appended (from the runner's `get_tokens`)."""
    r.num_computed_tokens = num_computed_tokens
    tokens = r.token_ids
    if len(tokens) < num_computed_tokens:
        tokens.extend(runner.get_tokens(r.request_id, len(tokens), num_computed_tokens))
