"""`StepStats`: what an engine's steps measured: one `StepRecord` per batch that ran (kept
until taken) and the prefill-only steps' seconds per block that routing weighs. Pure: the
core hands it each step's batch, queues and wall time. Engine thread only."""

from __future__ import annotations

from collections import deque

from armature.engines.native.scheduler import SchedulerOutput
from armature.protocols.engine import StepRecord

__all__ = ["MAX_STEP_RECORDS", "StepStats"]

MAX_STEP_RECORDS = 1024  # kept until taken; beyond this the oldest are dropped


class StepStats:
    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._records: deque[StepRecord] = deque(maxlen=MAX_STEP_RECORDS)
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
        for chunk in scheduled.chunks:
            if chunk.is_decode:
                num_decodes += 1
                num_decode_kv_tokens += chunk.start_pos + chunk.num_tokens
            else:
                num_prefills += 1
                num_prefill_tokens += chunk.num_tokens
        if num_prefill_tokens and not num_decodes:
            self._prefill_step_s += wall_s
            self._prefill_step_blocks += num_prefill_tokens / self.block_size
        self._records.append(
            StepRecord(
                num_scheduled_prefill_requests=num_prefills,
                num_scheduled_prefill_tokens=num_prefill_tokens,
                num_queued_prefill_requests=num_queued_prefill_requests,
                num_queued_prefill_tokens=num_queued_prefill_tokens,
                num_decode_requests=num_decodes,
                num_decode_kv_tokens=num_decode_kv_tokens,
                num_kv_tokens_used=num_kv_tokens_used,
                step_wall_s=wall_s,
            )
        )

    def record_decodes(
        self,
        *,
        num_decode_requests: int,
        num_decode_kv_tokens: int,
        num_kv_tokens_used: int,
        num_queued_prefill_requests: int,
        num_queued_prefill_tokens: int,
        wall_s: float,
    ) -> None:
        """`record` for a batch of decodes only, from its counts (the decode fast path,
        `engines.native.decode_run`, builds no SchedulerOutput)."""
        self._records.append(
            StepRecord(
                num_queued_prefill_requests=num_queued_prefill_requests,
                num_queued_prefill_tokens=num_queued_prefill_tokens,
                num_decode_requests=num_decode_requests,
                num_decode_kv_tokens=num_decode_kv_tokens,
                num_kv_tokens_used=num_kv_tokens_used,
                step_wall_s=wall_s,
            )
        )

    def take_records(self) -> list[StepRecord]:
        """Drain the records of the steps run since the last call (at most the newest
        MAX_STEP_RECORDS), oldest first."""
        records = list(self._records)
        self._records.clear()
        return records

    def get_prefill_s_per_block(self) -> float | None:
        """Seconds per prefill block over the prefill-only steps so far (None: none yet)."""
        blocks = self._prefill_step_blocks
        return self._prefill_step_s / blocks if blocks else None
