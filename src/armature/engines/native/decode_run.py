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
step's time and records its `StepRecord`. Steps of one length run as a stretch, up to the next
allocation (which changes the KV cache's use, and so the next step's time); the registrations
due within it are made at its end in the same order (they change no step's time, and no
allocation comes between). What is skipped is everything that does not change:
scheduling, chunks, token appends (tokens are filled in when a block is hashed or the run
ends) and per-step outputs (the caller delivers one token per request per step).

A run needs a runner that knows a step's time before running it and picks tokens without the
batch (`DecodeRunner`: the mocker), and a batch that can only decode: every running request
has one token left to compute, no stop strings or remote prefill, and no waiting request
could be admitted (the queue is empty, or the batch holds `max_num_seqs` or the whole token
budget). It stops before a step whose blocks would not fit (the step-by-step path preempts),
after a step that finishes a request, and before a step starting at or after `horizon_ms`.

At the horizon a run is suspended rather than ended: the caller (the simulator, whose
horizon is the fleet's next arrival or observer) goes on with it at its last step's end when
nothing joined its engine meanwhile, so that a run costs per request once, not once per
horizon (at 256 workers the fleet's arrivals come every ~13 steps of a worker).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

from armature.engines.native.request import RequestState
from armature.engines.native.scheduler import Scheduler
from armature.engines.native.step_stats import StepStats, UniformDecodeRows
from armature.kv.native_block_pool import DecodeKernel, NativeBlockPool
from armature.protocols.engine import EngineOutput, FinishReason
from armature.protocols.kv_events import KvTier, StoredBlock

__all__ = ["DecodeRun", "DecodeRunner", "NativeDecode", "can_run_decodes", "run_decodes"]

# PoolCore.run_decodes' outcomes (kv/pool_decode.h)
_SUSPENDED, _DONE, _PREEMPTED, _NO_FIT = 0, 1, 2, 3


class VirtualTime(Protocol):
    now_s: float  # a virtual clock's time, which a native run reads and the runner moves on


class NativeDecode(NamedTuple):
    """A runner whose decode stretches can run natively: its virtual clock, and its
    tokens' seed and vocabulary (a token is XXH3-64(seed) of "<request id>/<position>" modulo
    the vocabulary); where its decode step is max(min_ms, a u^2 + b u + c) / speedup with
    u = `utilization_pool`'s blocks in use over its blocks, `decode_poly` = (a, b, c, min_ms,
    speedup) (else None: the kernel asks `get_decode_step_ms`)."""

    clock: VirtualTime
    token_seed: int
    vocab_size: int
    decode_poly: tuple[float, float, float, float, float] | None = None
    utilization_pool: object | None = None


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

    def advance_steps(self, step_ms: float, num_steps: int) -> Sequence[float]:
        """Let `num_steps` steps of `step_ms` pass, as `ModelRunner.execute` of each would
        (no tokens); returns each one's seconds on the engine's clock (`time_s`)."""
        ...

    def get_tokens(self, request_id: str, start: int, stop: int) -> list[int]:
        """The request's tokens at positions `start..stop-1` (the same whatever the batch)."""
        ...

    def get_native_decode(self) -> NativeDecode | None:
        """Its clock and tokens where a run's stretches may run natively, else None."""
        ...

    def end_native_decode(self, now_s: float, last_step_ms: float, num_steps: int) -> None:
        """Catch up after `num_steps` steps ran natively (as `advance_steps` of each)."""
        ...


class DecodeRun:
    """Steps run at once: the batch (`request_ids`, in running order) decoded one token each
    step; step i ended at `step_end_ms[i]` (the first started at the run's `now_ms`).

    A run that reaches its horizon is *suspended*: its steps are done, the last one is still
    in progress (it started before the horizon) and the run has no `outputs` yet. At that
    step's end the caller either `extend`s it to a new horizon, when nothing reached its
    engine since (`can_extend`), or `end`s it there. A run that finished a request, or whose
    next step would preempt, is done: every step but the last is done and `outputs` are the
    last step's, as `EngineCore.step` returns them, to deliver at `step_end_ms[-1]`. Either
    way the tokens of all steps but the last are the caller's to deliver at their ends (none
    is a first token or a finish)."""

    def __init__(
        self,
        scheduler: Scheduler,
        stats: StepStats,
        runner: DecodeRunner,
        *,
        max_model_len: int,
        finish: Callable[[RequestState, FinishReason], None],
    ):
        self._scheduler = scheduler
        self._stats = stats
        self._runner = runner
        self._finish = finish
        running = list(scheduler.running)
        self._running = running
        self.request_ids = [r.request_id for r in running]
        bs = scheduler.kv.block_size
        self._start_computed = [r.num_computed_tokens for r in running]
        # steps (from 0) at which each request allocates a block, registers a full block,
        # finishes
        self._allocations = [(_next_allocation(r, bs), j) for j, r in enumerate(running)]
        self._registrations = [(_next_registration(r, bs), j) for j, r in enumerate(running)]
        heapq.heapify(self._allocations)
        heapq.heapify(self._registrations)
        self._finish_at = [_steps_to_finish(r, max_model_len) for r in running]
        self._last_step = min(self._finish_at)
        self._num_waiting = len(scheduler.waiting)
        self._queued = (self._num_waiting, scheduler.get_num_prefill_tokens_queued())
        self._kv_tokens = sum(self._start_computed) + len(running)
        self._step = 0  # the next step to run
        self.step_end_ms: list[float] = []
        self.outputs: list[EngineOutput] | None = None
        self._native = _get_native(scheduler, runner)  # None: the Python loop

    @property
    def num_steps(self) -> int:
        return len(self.step_end_ms)

    @property
    def is_done(self) -> bool:
        return self.outputs is not None

    def can_extend(self) -> bool:
        """Whether a suspended run may go on: no request joined its engine's queue since it
        began (which would change what the next step schedules, or its records) and none
        left its batch."""
        scheduler = self._scheduler
        return (
            self.outputs is None
            and len(scheduler.waiting) == self._num_waiting
            and len(scheduler.running) == len(self._running)
        )

    def get_quiet_until_ms(self) -> float | None:
        """For a suspended run: a time at or before the start of its next step that others
        could see (one that finishes a request, or whose allocations would evict a cached
        block or not fit), so that until then its steps only decode and cache new blocks of
        their own. None where the run cannot tell: its steps are priced outside the pool's
        core, or by a polynomial that may fall as the KV cache fills (a step's time is
        bounded below by the next one's at the cache's use now, which only grows within a
        run)."""
        native = self._native
        if native is None or native.decode_poly is None or self.outputs is not None:
            return None
        a, b, c, min_ms, speedup = native.decode_poly
        pool = self._scheduler.kv.pool
        use = pool.get_num_active_blocks() / pool.num_blocks
        if speedup <= 0 or 2 * a * use + b < 0 or 2 * a + b < 0:
            return None
        step_ms = max(min_ms, a * use * use + b * use + c) / speedup
        last_step, bs = self._last_step, pool.block_size
        due = [step for step, _ in self._allocations if step <= last_step]
        num_due = _count_allocations_through(due, bs, last_step)
        quiet = pool.count_allocations_before_eviction(num_due)
        target = last_step if quiet == num_due else _nth_allocation_step(due, bs, quiet)
        num_steps = target - self._step  # the steps that start before the target's start
        start_ms = self.step_end_ms[-1]
        if num_steps <= 0 or step_ms <= 0:
            return start_ms
        until_ms = start_ms + num_steps * step_ms
        # less what the step ends' one-by-one sums may round below it
        return until_ms - (num_steps + 4) * abs(until_ms) * 2.0**-50

    def end(self) -> list[EngineOutput]:
        """End a suspended run with its last step (in progress): that step's outputs."""
        assert self.outputs is None
        self.outputs = self._last_step_outputs(self._step - 1)
        return self.outputs

    def extend(self, horizon_ms: float) -> None:
        """Go on from a suspended run's last step's end, to a new horizon (`can_extend`)."""
        assert self.can_extend()
        self._run(self.step_end_ms[-1], horizon_ms)

    def _run(self, now_ms: float, horizon_ms: float) -> bool:
        """Run steps from `self._step` (the first starting at `now_ms`) until one finishes a
        request, the next would need blocks that are not free, or the next would start at or
        after `horizon_ms`; False (nothing changed) when the first step of a new run does
        not fit. Natively where the pool and runner allow (`_run_native`), else in Python."""
        native = self._native
        if native is not None:
            return self._run_native(native, now_ms, horizon_ms)
        return self._run_python(now_ms, horizon_ms)

    def _run_native(self, native: _NativeRun, now_ms: float, horizon_ms: float) -> bool:
        """`_run_python` in the pool's core (`PoolCore.run_decodes`, kv/pool_decode.h): the
        same block calls, events, step ends, clock and records, one Python call a stretch
        (the runner's step time) where the loop made ~23."""
        kernel, runner_side = native.kernel, native.runner
        entries: list[tuple[object, ...]] = []
        now_s = runner_side.clock.now_s
        progress = [now_s, 0.0, 0]  # the clock, last step and steps, as they ran
        try:
            status, step, kv_tokens = kernel.core.run_decodes(
                self._running,
                self._start_computed,
                self._allocations,
                self._registrations,
                self._step,
                self._kv_tokens,
                self._last_step,
                self.step_end_ms,
                now_ms,
                horizon_ms,
                self._runner.get_decode_step_ms,
                now_s,
                runner_side.token_seed,
                runner_side.vocab_size,
                self._scheduler.kv.block_size,
                StoredBlock,
                kernel.stored,
                kernel.removed,
                KvTier.DEVICE,
                entries,
                UniformDecodeRows,
                self._queued[0],
                self._queued[1],
                native.decode_poly,
                progress,
            )
        finally:  # what ran is recorded even if a call back into Python raised
            now_s, last_step_ms, num_steps = progress
            if num_steps:
                self._runner.end_native_decode(float(now_s), float(last_step_ms), int(num_steps))
                self._stats.add_uniform_decodes(entries)  # type: ignore[arg-type]
        self._kv_tokens = kv_tokens
        if status == _NO_FIT:
            return False
        if status == _PREEMPTED:
            self.outputs = self._last_step_outputs(step - 1)  # the reference preempts
        elif status == _DONE:
            self.outputs = self._last_step_outputs(step)
        else:
            self._step = step  # suspended
        return True

    def _run_python(self, now_ms: float, horizon_ms: float) -> bool:
        """`_run` in Python: the reference of `_run_native`."""
        kv = self._scheduler.kv
        running, start_computed = self._running, self._start_computed
        allocations, registrations = self._allocations, self._registrations
        last_step, runner = self._last_step, self._runner
        num_requests = len(running)
        bs = kv.block_size
        kv_tokens = self._kv_tokens
        # a stretch: steps of one length, from one that may allocate to the next event
        stretch_ends = not runner.decode_uses_context
        step_end_ms = self.step_end_ms
        step = self._step  # the stretch's first step
        while True:
            if allocations[0][0] == step and not _allocate_due(
                self._scheduler, running, start_computed, allocations, step
            ):
                if not step_end_ms:
                    return False
                self.outputs = self._last_step_outputs(step - 1)  # the reference preempts
                return True
            # the stretch's last step: before the next allocation, at the finish (one step
            # when step times read the context); registrations change no step's time, so
            # those due within it are made after its steps, in the order step by step makes
            # them (by step, then running order), before the next allocation
            last = min(last_step, allocations[0][0] - 1) if stretch_ends else step
            num_kv_tokens_used = kv.pool.get_num_active_blocks() * bs
            step_ms = runner.get_decode_step_ms(num_requests, kv_tokens)
            t_ms = step_end_ms[-1] if step_end_ms else now_ms
            # the stretch's step ends, one step_ms apart (added one by one, as step by
            # step), to the first at or after the horizon
            ends_ms = list(
                itertools.accumulate(itertools.repeat(step_ms, last - step + 1), initial=t_ms)
            )
            del ends_ms[0]
            del ends_ms[bisect.bisect_left(ends_ms, horizon_ms) + 1 :]
            wall_s = runner.advance_steps(step_ms, len(ends_ms))
            self._stats.record_decodes(
                num_decode_requests=num_requests,
                first_decode_kv_tokens=kv_tokens,
                num_kv_tokens_used=num_kv_tokens_used,
                num_queued_prefill_requests=self._queued[0],
                num_queued_prefill_tokens=self._queued[1],
                wall_s=wall_s,
            )
            step_end_ms += ends_ms
            step += len(ends_ms) - 1
            kv_tokens += num_requests * len(ends_ms)
            self._kv_tokens = kv_tokens
            t_ms = ends_ms[-1]
            while registrations[0][0] <= step:
                due, j = heapq.heappop(registrations)
                r = running[j]
                _sync(r, start_computed[j] + due + 1, runner)  # before that step's token
                kv.register_full_blocks(r)
                heapq.heappush(registrations, (due + bs, j))
            if step == last_step:
                self.outputs = self._last_step_outputs(step)
                return True
            if t_ms >= horizon_ms:
                self._step = step + 1  # suspended
                return True
            step += 1

    def _last_step_outputs(self, step: int) -> list[EngineOutput]:
        """The run's last step, `step`: each request caught up to it, its token sampled, and
        those whose length limit it reaches ended."""
        outputs = []
        runner, finish = self._runner, self._finish
        for j, r in enumerate(self._running):
            _sync(r, self._start_computed[j] + step + 1, runner)
            position = r.num_tokens
            token = runner.get_tokens(r.request_id, position, position + 1)[0]
            r.token_ids.append(token)
            reason = FinishReason.LENGTH if self._finish_at[j] == step else None
            if reason is not None:
                finish(r, reason)
            outputs.append(
                EngineOutput(request_id=r.request_id, new_token_ids=[token], finish_reason=reason)
            )
        return outputs


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
    would start at or after `horizon_ms` (then the run is suspended). `finish` ends a request
    as the engine does; the runner's clock is the engine's (its steps' seconds are recorded).
    None (nothing changed) when the first step's blocks do not fit."""
    run = DecodeRun(scheduler, stats, runner, max_model_len=max_model_len, finish=finish)
    return run if run._run(now_ms, horizon_ms) else None


class _NativeRun(NamedTuple):
    """A run's native side, fixed for its life: the pool's kernel, the runner's clock and
    tokens, and the decode step's polynomial where the kernel prices it on this pool."""

    kernel: DecodeKernel
    runner: NativeDecode
    decode_poly: tuple[float, float, float, float, float] | None


def _get_native(scheduler: Scheduler, runner: DecodeRunner) -> _NativeRun | None:
    """A run's native side where it may run natively: a native pool that no eviction observer
    or write-through tier watches, step times independent of the context (a stretch runs to
    the next allocation), a runner with a native side; else None (the Python loop)."""
    pool = scheduler.kv.pool
    if runner.decode_uses_context or type(pool) is not NativeBlockPool:
        return None  # (a subclass may change what the kernel does in the pool's place)
    if scheduler.kv.on_blocks_written is not None:
        return None
    kernel = pool.get_decode_kernel()
    side = runner.get_native_decode() if kernel is not None else None
    if kernel is None or side is None:
        return None
    # a polynomial priced on another pool's use: the runner's own call each stretch
    poly = side.decode_poly if side.utilization_pool is pool else None
    return _NativeRun(kernel, side, poly)


def _allocate_due(
    scheduler: Scheduler,
    running: list[RequestState],
    start_computed: list[int],
    allocations: list[tuple[int, int]],
    step: int,
) -> bool:
    """Give each request due at `step` in `allocations` its next block (in running order, one
    pool call each, as `KvCacheManager.allocate_slots` of one token makes it), and queue its
    next allocation a block later; False (nothing allocated) when the blocks due are not
    free."""
    pool = scheduler.kv.pool
    due = []
    while allocations and allocations[0][0] == step:
        due.append(heapq.heappop(allocations)[1])
    if len(due) > pool.get_num_free_blocks():
        return False
    bs = scheduler.kv.block_size
    for j in due:
        r = running[j]
        r.num_computed_tokens = start_computed[j] + step  # all allocation reads
        # due: its blocks hold exactly its computed tokens; the step's token needs one more
        assert len(r.block_ids) * bs == r.num_computed_tokens
        r.block_ids += pool.allocate(1)
        heapq.heappush(allocations, (step + bs, j))
    return True


def _count_allocations_through(due: list[int], block_size: int, last: int) -> int:
    """The allocations at steps up to `last` of requests whose next allocations are at steps
    `due`, each one a block after the last."""
    return sum((last - step) // block_size + 1 for step in due if step <= last)


def _nth_allocation_step(due: list[int], block_size: int, n: int) -> int:
    """The step of allocation number `n` (from 0, in step order) of requests whose next
    allocations are at steps `due`, each one a block after the last."""
    low, high = min(due), max(due) + n * block_size  # the answer is in [low, high]
    while low < high:
        middle = (low + high) // 2
        if _count_allocations_through(due, block_size, middle) > n:
            high = middle
        else:
            low = middle + 1
    return low


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
