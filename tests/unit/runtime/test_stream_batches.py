"""A consumer that fell behind catches up in one step: the request plane hands over every
payload waiting at once, and a RemoteEngine merges the outputs in it (failures apart)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import msgspec
import pytest
from test_fleet import card

from armature.config import HealthConfig
from armature.engines.api import EngineDeadError
from armature.protocols.engine import (
    EngineLoad,
    EngineOutput,
    EngineRequest,
    FinishReason,
    SamplingParams,
    coalesce_outputs,
)
from armature.protocols.failures import FailureCode
from armature.protocols.worker import WorkerUpdate
from armature.runtime.events import ZmqEventPlane
from armature.runtime.frames import Data, End
from armature.runtime.remote_engine import RemoteEngine
from armature.runtime.request_plane import RemoteError, payloads, take_waiting


def test_take_waiting_stops_at_the_first_other_item() -> None:
    queue: asyncio.Queue[object] = asyncio.Queue()
    for item in (Data(1, b"b"), Data(1, b"c"), End(1), Data(1, b"late")):
        queue.put_nowait(item)
    assert take_waiting(queue, Data(1, b"a")) == ([b"a", b"b", b"c"], End(1))
    assert queue.qsize() == 1 and queue.get_nowait() == Data(1, b"late")
    assert take_waiting(queue, Data(1, b"x")) == ([b"x"], None)


async def test_payloads_flatten_in_order_and_close_the_batches() -> None:
    closed = asyncio.Event()

    async def batches() -> AsyncIterator[list[bytes]]:
        try:
            yield [b"1", b"2"]
            yield [b"3"]
            yield [b"4", b"5"]
        finally:
            closed.set()

    stream = payloads(batches())
    assert [await anext(stream) for _ in range(4)] == [b"1", b"2", b"3", b"4"]
    await stream.aclose()
    assert closed.is_set()


def output(tokens: list[int], finish: FinishReason | None = None, **fields: object) -> EngineOutput:
    return EngineOutput(request_id="r", new_token_ids=tokens, finish_reason=finish, **fields)


def test_coalesce_merges_tokens_and_keeps_a_failure_apart() -> None:
    first = output([1], num_prompt_tokens=7, num_cached_tokens=4)
    assert coalesce_outputs([first]) == [first]
    merged = coalesce_outputs([first, output([2, 3]), output([4], FinishReason.LENGTH)])
    assert merged == [
        output([1, 2, 3, 4], FinishReason.LENGTH, num_prompt_tokens=7, num_cached_tokens=4)
    ]
    failed = output([], FinishReason.ERROR, error="engine fault")
    assert coalesce_outputs([first, output([2]), failed]) == [
        output([1, 2], num_prompt_tokens=7, num_cached_tokens=4),
        failed,
    ]
    assert coalesce_outputs([output([5]), failed]) == [output([5]), failed]


class BatchesClient:
    """The request plane seam: `generate` answers with the given batches of outputs, then
    ends, or fails with `fail_code` if one is set."""

    def __init__(
        self,
        batches: list[list[EngineOutput]],
        fail_code: FailureCode | None = None,
        then_hang: bool = False,
    ) -> None:
        self.batches = batches
        self.fail_code = fail_code
        self.then_hang = then_hang  # after the batches, send nothing more
        self.closed = False  # the stream was closed (the plane then cancels it)

    def stream(self, url: str, endpoint: str, payload: bytes) -> AsyncIterator[bytes]:
        return payloads(self.stream_batches(url, endpoint, payload))

    async def stream_batches(
        self, url: str, endpoint: str, payload: bytes
    ) -> AsyncIterator[list[bytes]]:
        assert endpoint == "generate"
        try:
            for batch in self.batches:
                yield [msgspec.msgpack.encode(o) for o in batch]
            if self.then_hang:
                await asyncio.Event().wait()
            if self.fail_code is not None:
                raise RemoteError(self.fail_code, "worker lost its engine")
        finally:
            self.closed = True

    async def close(self) -> None:
        return None


def engine(client: BatchesClient, health: HealthConfig = HealthConfig()) -> RemoteEngine:
    return RemoteEngine(card(1), client, ZmqEventPlane(), health=health)


REQUEST = EngineRequest(
    request_id="r", prompt_token_ids=[1, 2, 3], sampling=SamplingParams(max_tokens=6)
)


async def test_generate_merges_each_batch() -> None:
    failed = output([], FinishReason.ERROR, error="engine fault")
    client = BatchesClient(
        [
            [output([1], num_prompt_tokens=3)],
            [output([2]), output([3]), output([4])],
            [output([5]), failed],
        ]
    )
    got = [o async for o in engine(client).generate(REQUEST)]
    assert got == [output([1], num_prompt_tokens=3), output([2, 3, 4]), output([5]), failed]


async def test_generate_gives_the_batch_before_a_lost_worker() -> None:
    client = BatchesClient([[output([1]), output([2])]], fail_code=FailureCode.INTERNAL)
    stream = engine(client).generate(REQUEST)
    assert await anext(stream) == output([1, 2])
    with pytest.raises(EngineDeadError, match="worker lost its engine"):
        await anext(stream)


async def test_a_stream_that_stalls_fails_and_is_closed() -> None:
    client = BatchesClient([[output([1]), output([2])]], then_hang=True)
    remote = engine(client, HealthConfig(worker_stall_timeout_s=0.05))
    stream = remote.generate(REQUEST)
    assert await anext(stream) == output([1, 2])
    with pytest.raises(EngineDeadError, match=r"sent nothing for 0\.05 s"):
        await anext(stream)
    assert client.closed  # the stream to the worker was closed: the plane sends its Cancel
    assert not remote.is_alive  # not routed to until its steps advance


async def test_a_silent_worker_fails_its_streams_at_the_liveness_timeout() -> None:
    """A worker killed on a plane with no connection per stream (NATS) sends nothing: its
    streams failed only at the stall timeout (60 s), long after its updates stopped. They
    fail once it has sent no update for the liveness timeout, without marking it stalled."""
    client = BatchesClient([[output([1])]], then_hang=True)
    health = HealthConfig(worker_liveness_timeout_s=0.2, worker_stall_timeout_s=600.0)
    remote = engine(client, health)
    remote.start()  # no update ever comes on its events url
    try:
        stream = remote.generate(REQUEST)
        assert await anext(stream) == output([1])
        with pytest.raises(EngineDeadError, match=r"sent no update for 0\.2 s"):
            await asyncio.wait_for(anext(stream), 30)
        assert client.closed
        assert remote._stalled_at_steps is None  # silence, not a stall
    finally:
        await remote.stop()


async def test_a_worker_gone_from_discovery_is_still_heard_until_its_streams_end() -> None:
    """A crashed worker often leaves discovery (its lease ends) before its silence reaches
    the liveness timeout: stopping it cancelled the watch, and its streams waited out the
    stall timeout. Its streams still fail at the liveness timeout; the watch ends with
    them."""
    client = BatchesClient([[output([1])]], then_hang=True)
    health = HealthConfig(worker_liveness_timeout_s=0.3, worker_stall_timeout_s=600.0)
    remote = engine(client, health)
    remote.start()
    stream = remote.generate(REQUEST)
    assert await anext(stream) == output([1])
    pending = asyncio.ensure_future(anext(stream))
    await remote.stop()  # left discovery with a stream in flight
    assert remote._liveness is not None and not pending.done()
    with pytest.raises(EngineDeadError, match=r"sent no update for 0\.3 s"):
        await asyncio.wait_for(pending, 30)
    assert remote._liveness is None and remote._subscription is None  # stopped with it


class SilentClient:
    """A worker that takes any call and never answers it (its engine hangs)."""

    def stream(self, url: str, endpoint: str, payload: bytes) -> AsyncIterator[bytes]:
        return payloads(self.stream_batches(url, endpoint, payload))

    async def stream_batches(
        self, url: str, endpoint: str, payload: bytes
    ) -> AsyncIterator[list[bytes]]:
        await asyncio.Event().wait()
        yield []

    async def close(self) -> None:
        return None


async def test_calls_other_than_generate_are_answered_within_the_stall_timeout() -> None:
    """A LoRA load (or a release: the same wait) on a worker whose engine hangs waited
    forever (no stream watch covers them): now an EngineDeadError at the stall timeout."""
    remote = RemoteEngine(
        card(1),
        SilentClient(),  # type: ignore[arg-type]
        ZmqEventPlane(),
        health=HealthConfig(worker_stall_timeout_s=0.05),
    )
    with pytest.raises(EngineDeadError, match=r"did not answer load_lora within 0\.05 s"):
        await asyncio.wait_for(remote.load_lora("a", "/adapters/a"), 30)


class FlakyEvents:
    """An event plane whose first subscription fails (a NATS client error), the next one
    brings one update."""

    def __init__(self, update: bytes) -> None:
        self.update = update
        self.num_subscribes = 0

    async def subscribe(self, url: str) -> AsyncIterator[bytes]:
        self.num_subscribes += 1
        if self.num_subscribes == 1:
            raise RuntimeError("nats: connection closed")
        yield self.update
        await asyncio.Event().wait()


async def test_a_failed_subscription_to_a_worker_is_made_again() -> None:
    """It ended the subscription task unseen: the worker looked silent for good (never
    routed to, its streams ended at the liveness timeout)."""
    update = WorkerUpdate(kv_events=[], load=EngineLoad.idle(77))
    plane = FlakyEvents(msgspec.msgpack.encode(update))
    remote = RemoteEngine(card(1), BatchesClient([]), plane)  # type: ignore[arg-type]
    remote.start()
    try:
        await asyncio.wait_for(remote.wait_for_update(30), 30)
        assert plane.num_subscribes == 2
        assert remote.get_load().num_total_blocks == 77
    finally:
        await remote.stop()
