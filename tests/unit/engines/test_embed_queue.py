"""The embedding engine's queue: exact batches (FIFO, token and prompt budgets, a long
prompt alone), completion in prompt order across batches, and aborts mid-batch."""

from __future__ import annotations

import pytest

from armature.engines.native.embed_queue import EmbedItem, EmbedQueue
from armature.protocols.embedding import EmbedRequest


def request(request_id: str, *lengths: int) -> EmbedRequest:
    return EmbedRequest(request_id=request_id, prompts=[[i + 1] * n for i, n in enumerate(lengths)])


def taken(batch: list[EmbedItem]) -> list[tuple[str, int, int]]:
    return [(item.request_id, item.index, len(item.token_ids)) for item in batch]


def test_batches_fill_the_token_budget_oldest_first_and_span_requests() -> None:
    queue = EmbedQueue(max_num_batched_tokens=10, max_num_seqs=8)
    queue.add(request("a", 4, 4, 4))
    queue.add(request("b", 2))
    assert queue.get_num_waiting_tokens() == 14
    first = queue.take_batch()
    assert taken(first) == [("a", 0, 4), ("a", 1, 4)]  # a's third would make 12 > 10
    second = queue.take_batch()
    assert taken(second) == [("a", 2, 4), ("b", 0, 2)]
    assert queue.take_batch() == []
    assert not queue.has_waiting() and queue.get_num_waiting_tokens() == 0

    assert queue.complete(second, [b"a2", b"b0"]) == [(request("b", 2), [b"b0"])]
    assert queue.get_num_requests() == 1  # a waits for its first batch
    assert queue.complete(first, [b"a0", b"a1"]) == [(request("a", 4, 4, 4), [b"a0", b"a1", b"a2"])]
    assert queue.get_num_requests() == 0


def test_a_prompt_longer_than_the_budget_goes_alone_and_max_num_seqs_caps_a_batch() -> None:
    queue = EmbedQueue(max_num_batched_tokens=8, max_num_seqs=2)
    queue.add(request("long", 20, 1))
    queue.add(request("short", 1, 1, 1))
    assert taken(queue.take_batch()) == [("long", 0, 20)]
    assert taken(queue.take_batch()) == [("long", 1, 1), ("short", 0, 1)]
    assert taken(queue.take_batch()) == [("short", 1, 1), ("short", 2, 1)]


def test_an_aborted_request_is_dropped_even_while_its_batch_runs() -> None:
    queue = EmbedQueue(max_num_batched_tokens=100, max_num_seqs=8)
    queue.add(request("gone", 3, 3))
    queue.add(request("kept", 2))
    batch = queue.take_batch()
    queue.abort("gone")
    assert queue.complete(batch, [b"g0", b"g1", b"k0"]) == [(request("kept", 2), [b"k0"])]
    assert queue.get_num_requests() == 0
    queue.abort("never-queued")  # no error


def test_a_duplicate_request_id_is_refused() -> None:
    queue = EmbedQueue(max_num_batched_tokens=10, max_num_seqs=2)
    queue.add(request("x", 1))
    with pytest.raises(ValueError, match="duplicate request id 'x'"):
        queue.add(request("x", 2))
