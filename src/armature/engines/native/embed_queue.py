"""The embedding engine's queue: requests in, batches of prompts out, finished requests back.
Pure (no threads, no torch): the engine thread owns one under its lock.

Requests are served first come, first served; a request's prompts may span several batches
and a batch may hold prompts of several requests. A batch takes prompts while they fit in
`max_num_batched_tokens` and `max_num_seqs` (a prompt longer than the budget goes alone).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from armature.protocols.embedding import EmbedRequest

__all__ = ["EmbedItem", "EmbedQueue"]


@dataclass(frozen=True)
class EmbedItem:
    """One prompt of a request, taken into a batch."""

    request_id: str
    index: int  # of the prompt in its request
    token_ids: list[int]


@dataclass
class _Pending:
    request: EmbedRequest
    vectors: dict[int, bytes] = field(default_factory=dict)  # prompt index -> its vector
    num_taken: int = 0  # prompts [0, num_taken) are in a batch or done


class EmbedQueue:
    def __init__(self, max_num_batched_tokens: int, max_num_seqs: int):
        assert max_num_batched_tokens > 0 and max_num_seqs > 0
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self._pending: OrderedDict[str, _Pending] = OrderedDict()  # arrival order

    def add(self, request: EmbedRequest) -> None:
        """Queue `request` (ValueError for an id already queued)."""
        if request.request_id in self._pending:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        self._pending[request.request_id] = _Pending(request)

    def abort(self, request_id: str) -> None:
        """Forget `request_id`; vectors of its prompts still in a batch are dropped."""
        self._pending.pop(request_id, None)

    def take_batch(self) -> list[EmbedItem]:
        """The next prompts to compute, oldest request first (empty: nothing waits)."""
        batch: list[EmbedItem] = []
        num_tokens = 0
        for pending in self._pending.values():
            prompts = pending.request.prompts
            while pending.num_taken < len(prompts) and len(batch) < self.max_num_seqs:
                prompt = prompts[pending.num_taken]
                if batch and num_tokens + len(prompt) > self.max_num_batched_tokens:
                    return batch
                batch.append(EmbedItem(pending.request.request_id, pending.num_taken, prompt))
                num_tokens += len(prompt)
                pending.num_taken += 1
            if len(batch) >= self.max_num_seqs:
                break
        return batch

    def complete(
        self, items: list[EmbedItem], vectors: list[bytes]
    ) -> list[tuple[EmbedRequest, list[bytes]]]:
        """Record the vectors of a batch taken earlier; returns each request now complete
        (removed from the queue) with its vectors in prompt order."""
        assert len(items) == len(vectors)
        done: list[tuple[EmbedRequest, list[bytes]]] = []
        for item, vector in zip(items, vectors, strict=True):
            pending = self._pending.get(item.request_id)
            if pending is None:
                continue  # aborted while its batch ran
            pending.vectors[item.index] = vector
            num_prompts = len(pending.request.prompts)
            if len(pending.vectors) == num_prompts:
                del self._pending[item.request_id]
                done.append((pending.request, [pending.vectors[i] for i in range(num_prompts)]))
        return done

    def get_num_requests(self) -> int:
        """Requests queued or in a batch."""
        return len(self._pending)

    def get_num_waiting_tokens(self) -> int:
        """Tokens of the prompts no batch has taken yet."""
        return sum(
            len(prompt)
            for pending in self._pending.values()
            for prompt in pending.request.prompts[pending.num_taken :]
        )

    def has_waiting(self) -> bool:
        return any(p.num_taken < len(p.request.prompts) for p in self._pending.values())
