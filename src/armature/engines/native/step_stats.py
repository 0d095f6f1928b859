"""`StepStats`: what an engine's steps measured: one `StepRecord` per batch that ran (kept
until taken) and the prefill-only steps' seconds per block that routing weighs. Pure: the
core hands it each step's batch, queues and wall time. Engine thread only.

Until taken, a step is a row (StepRecord's fields in a tuple) and a decode run's steps are one
`_DecodeRows` (the fields its steps share, and their wall times): a simulated fleet runs
millions of decode steps whose records nobody may take."""

from __future__ import annotations

import operator
from collections import deque
from collections.abc import Iterator, Sequence
from itertools import accumulate, islice, repeat
from typing import NamedTuple

from armature.engines.native.scheduler import SchedulerOutput
from armature.protocols.engine import StepRecord

__all__ = ["MAX_STEP_RECORDS", "StepStats", "UniformDecodeRows", "uniform_step_durations"]

MAX_STEP_RECORDS = 1024  # kept until taken; beyond this the oldest are dropped
# a record until taken: StepRecord's fields in order (a tuple costs a tenth of a record)
_Row = tuple[int, int, int, int, int, int, int, float, int]


class _DecodeRows(NamedTuple):  # a tuple: made once per stretch of a decode run
    """Steps of one batch of decodes only, one per `wall_s`: the first attends over
    `first_decode_kv_tokens`, each next one a token more per request."""

    num_decode_requests: int
    first_decode_kv_tokens: int
    num_kv_tokens_used: int
    num_queued_prefill_requests: int
    num_queued_prefill_tokens: int
    wall_s: Sequence[float]

    def rows(self) -> Iterator[_Row]:
        n, first = self.num_decode_requests, self.first_decode_kv_tokens
        return zip(
            repeat(0),
            repeat(0),
            repeat(self.num_queued_prefill_requests),
            repeat(self.num_queued_prefill_tokens),
            repeat(n),
            range(first, first + n * len(self.wall_s), n),
            repeat(self.num_kv_tokens_used),
            self.wall_s,
            repeat(0),
        )


def uniform_step_durations(start_s: float, seconds: float, num_steps: int) -> list[float]:
    """How long each of `num_steps` steps of `seconds` took on a virtual clock that added them
    one by one from `start_s`: differences of the rounded sums, so not all exactly
    `seconds`."""
    times = list(accumulate(repeat(seconds, num_steps), initial=start_s))
    return list(map(operator.sub, times[1:], times[:-1]))


class UniformDecodeRows(NamedTuple):  # made by the native decode kernel, once per stretch
    """`_DecodeRows` whose steps all took `seconds` on a virtual clock that added them one by
    one from `start_s` (each step's wall time worked out when read, as `UniformSteps`)."""

    num_decode_requests: int
    first_decode_kv_tokens: int
    num_kv_tokens_used: int
    num_queued_prefill_requests: int
    num_queued_prefill_tokens: int
    start_s: float
    seconds: float
    num_steps: int

    def rows(self) -> Iterator[_Row]:
        wall_s = uniform_step_durations(self.start_s, self.seconds, self.num_steps)
        return _DecodeRows(*self[:5], wall_s).rows()


class StepStats:
    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        # oldest first; the steps they hold (`_num_steps`) are kept down to MAX_STEP_RECORDS
        # but for the oldest entry's own older steps, cut when taken
        self._entries: deque[_Row | _DecodeRows | UniformDecodeRows] = deque()
        self._sizes: deque[int] = deque()  # each entry's steps
        self._num_steps = 0
        # prefill-only steps so far (no decode in the batch): wall seconds and blocks computed
        self._prefill_step_s = 0.0
        self._prefill_step_blocks = 0.0

    def record(
        self,
        scheduled: SchedulerOutput,
        *,
        num_kv_tokens_used: int,
        num_queued_prefill_requests: int,
        num_queued_prefill_tokens: int,
        wall_s: float,
    ) -> None:
        """One StepRecord for a batch that ran; KV in use is as the model saw it (after
        scheduling allocated, before finished requests freed), queues as they are now."""
        num_prefills = num_prefill_tokens = num_decodes = num_decode_kv_tokens = 0
        num_prefill_context_pairs = 0
        for chunk in scheduled.chunks:
            if chunk.is_decode:
                num_decodes += 1
                num_decode_kv_tokens += chunk.start_pos + chunk.num_tokens
            else:
                num_prefills += 1
                num_prefill_tokens += chunk.num_tokens
                num_prefill_context_pairs += chunk.start_pos * chunk.num_tokens
        if num_prefill_tokens and not num_decodes:
            self._prefill_step_s += wall_s
            self._prefill_step_blocks += num_prefill_tokens / self.block_size
        self._add(
            (
                num_prefills,
                num_prefill_tokens,
                num_queued_prefill_requests,
                num_queued_prefill_tokens,
                num_decodes,
                num_decode_kv_tokens,
                num_kv_tokens_used,
                wall_s,
                num_prefill_context_pairs,
            ),
            1,
        )

    def record_decodes(
        self,
        *,
        num_decode_requests: int,
        first_decode_kv_tokens: int,
        num_kv_tokens_used: int,
        num_queued_prefill_requests: int,
        num_queued_prefill_tokens: int,
        wall_s: Sequence[float],
    ) -> None:
        """`record` of steps of one batch of decodes only, one per `wall_s`: the first
        attends over `first_decode_kv_tokens`, each next one a token more per request (the
        decode fast path, `engines.native.decode_run`, builds no SchedulerOutput)."""
        if wall_s:
            # tuple.__new__: the named tuple's own __new__ is a Python frame per stretch
            rows = tuple.__new__(
                _DecodeRows,
                (
                    num_decode_requests,
                    first_decode_kv_tokens,
                    num_kv_tokens_used,
                    num_queued_prefill_requests,
                    num_queued_prefill_tokens,
                    wall_s,
                ),
            )
            self._add(rows, len(wall_s))

    def add_uniform_decodes(self, entries: list[UniformDecodeRows]) -> None:
        """`record_decodes` of each entry in turn (what the native decode kernel made; `_add`
        inline: a stretch costs no Python frame here)."""
        kept, sizes = self._entries, self._sizes
        num_steps = self._num_steps
        for entry in entries:
            kept.append(entry)
            sizes.append(entry[7])
            num_steps += entry[7]
            while num_steps - sizes[0] >= MAX_STEP_RECORDS:
                kept.popleft()
                num_steps -= sizes.popleft()
        self._num_steps = num_steps

    def _add(self, entry: _Row | _DecodeRows | UniformDecodeRows, num_steps: int) -> None:
        self._entries.append(entry)
        sizes = self._sizes
        sizes.append(num_steps)
        self._num_steps += num_steps
        # drop the oldest entries whose every step is past the bound
        while self._num_steps - sizes[0] >= MAX_STEP_RECORDS:
            self._entries.popleft()
            self._num_steps -= sizes.popleft()

    def take_records(self) -> list[StepRecord]:
        """Drain the records of the steps run since the last call (at most the newest
        MAX_STEP_RECORDS), oldest first."""
        rows: list[_Row] = []
        for entry in self._entries:
            if isinstance(entry, (_DecodeRows, UniformDecodeRows)):
                rows.extend(entry.rows())
            else:
                rows.append(entry)
        self._entries.clear()
        self._sizes.clear()
        self._num_steps = 0
        return [
            _to_record(*row) for row in islice(rows, max(0, len(rows) - MAX_STEP_RECORDS), None)
        ]

    def get_prefill_s_per_block(self) -> float | None:
        """Seconds per prefill block over the prefill-only steps so far (None: none yet)."""
        blocks = self._prefill_step_blocks
        return self._prefill_step_s / blocks if blocks else None


def _to_record(
    num_prefills: int,
    num_prefill_tokens: int,
    num_queued_requests: int,
    num_queued_tokens: int,
    num_decodes: int,
    num_decode_kv_tokens: int,
    num_kv_tokens_used: int,
    wall_s: float,
    num_prefill_context_pairs: int,
) -> StepRecord:
    return StepRecord(
        num_scheduled_prefill_requests=num_prefills,
        num_scheduled_prefill_tokens=num_prefill_tokens,
        num_queued_prefill_requests=num_queued_requests,
        num_queued_prefill_tokens=num_queued_tokens,
        num_decode_requests=num_decodes,
        num_decode_kv_tokens=num_decode_kv_tokens,
        num_kv_tokens_used=num_kv_tokens_used,
        step_wall_s=wall_s,
        num_prefill_context_pairs=num_prefill_context_pairs,
    )
