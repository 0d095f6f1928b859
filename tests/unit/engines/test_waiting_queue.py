"""The waiting queue keeps the tokens its requests have left to compute, and how many joined
holding imported KV blocks, as they come and go: equal to a walk over the queue after any
sequence of joins and leaves, and in an overloaded engine after every step."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from armature.engines.native.request import RequestState
from armature.engines.native.waiting_queue import WaitingQueue
from armature.protocols.engine import SamplingParams
from tests.unit.engines.mocker_cores import mocker_core, run_mixed_load


def state(index: int, num_tokens: int, num_computed: int, holding: bool) -> RequestState:
    return RequestState(
        request_id=f"r{index}",
        token_ids=list(range(num_tokens)),
        num_prompt_tokens=num_tokens,
        sampling=SamplingParams(max_tokens=1),
        sampling_seed=None,
        arrival_index=index,
        num_computed_tokens=num_computed,
        held_block_ids=[index] if holding else [],
    )


def walked(queue: WaitingQueue) -> tuple[int, int]:
    return (
        sum(r.num_tokens - r.num_computed_tokens for r in queue),
        sum(1 for r in queue if r.held_block_ids),
    )


OPS = st.lists(
    st.tuples(
        st.sampled_from(["append", "appendleft", "popleft", "remove"]),
        st.integers(1, 50),
        st.integers(0, 49),
        st.booleans(),
        st.integers(0, 1000),
    ),
    max_size=60,
)


@given(OPS)
def test_counts_equal_a_walk_over_the_queue(ops: list[tuple[str, int, int, bool, int]]) -> None:
    queue = WaitingQueue()
    model: list[RequestState] = []
    for index, (op, num_tokens, computed, holding, pick) in enumerate(ops):
        if op in ("append", "appendleft"):
            request = state(index, num_tokens, min(computed, num_tokens - 1), holding)
            getattr(queue, op)(request)
            model.insert(len(model) if op == "append" else 0, request)
        elif op == "popleft" and model:
            assert queue.popleft() is model.pop(0)
        elif op == "remove" and model:
            request = model.pop(pick % len(model))
            queue.remove(request)
        assert list(queue) == model
        assert len(queue) == len(model) and bool(queue) == bool(model)
        assert (queue.num_tokens_left, queue.num_joined_holding) == walked(queue)


def test_a_hold_dropped_while_waiting_is_still_counted() -> None:
    queue = WaitingQueue()
    holder = state(0, 8, 0, holding=True)
    queue.append(holder)
    holder.held_block_ids = []
    assert queue.num_joined_holding == 1  # at least as many as hold now
    queue.remove(holder)
    assert (queue.num_tokens_left, queue.num_joined_holding) == (0, 0)


def test_a_request_cannot_wait_twice() -> None:
    queue = WaitingQueue()
    request = state(0, 8, 0, holding=False)
    queue.append(request)
    with pytest.raises(AssertionError):
        queue.appendleft(request)


@pytest.mark.parametrize("seed", range(3))
def test_an_overloaded_engine_reads_the_walk_after_every_step(seed: int) -> None:
    core, _ = mocker_core(num_kv_blocks=40, block_size=4)
    waiting = core.scheduler.waiting
    lengths: list[int] = []

    def check() -> None:
        tokens, holding = walked(waiting)
        assert waiting.num_tokens_left == tokens
        assert waiting.num_joined_holding >= holding
        lengths.append(len(waiting))

    run_mixed_load(core, random.Random(seed), num_requests=80, after_step=check)
    assert max(lengths) >= 5  # requests queued up while the pool was full
