"""A discovered worker that runs otherwise than the planner's timing profile: named, logged
once as it joins, forgotten when it leaves."""

from __future__ import annotations

import asyncio
import logging

import msgspec
import pytest

from armature.planner.profile_match import ProfiledWorker, get_card_mismatches
from armature.planner.worker_feed import WorkerStepFeed
from armature.protocols.worker import WorkerCard, worker_key
from armature.runtime.discovery import MemDiscovery
from armature.runtime.events import ZmqEventPlane

PROFILED = ProfiledWorker(model_name="smollm2", block_size_tokens=16, num_kv_blocks=4096)


def card(instance_id: int, **changes: object) -> WorkerCard:
    fields: dict[str, object] = {
        "instance_id": instance_id,
        "namespace": "test",
        "model_name": "smollm2",
        "model_path": "/models/smollm2",
        "block_size": 16,
        "num_kv_blocks": 4096,
        "max_model_len": 8192,
        "vocab_size": 49152,
        "request_url": "tcp://127.0.0.1:1",
        "events_url": f"tcp://127.0.0.1:{20000 + instance_id}",
    }
    fields.update(changes)
    return WorkerCard(**fields)  # type: ignore[arg-type]


def test_mismatches_name_each_difference() -> None:
    assert get_card_mismatches(card(1), PROFILED) == []
    assert get_card_mismatches(card(1, block_size=32, num_kv_blocks=1024), PROFILED) == [
        "block size 32 tokens (profiled 16)",
        "1024 KV blocks (profiled 4096)",
    ]
    assert get_card_mismatches(card(1, model_name="other"), PROFILED) == [
        "model 'other' (profiled 'smollm2')"
    ]


async def _wait_for(predicate: object, feed: WorkerStepFeed) -> None:
    assert callable(predicate)
    while not predicate():
        feed.changed.clear()
        await asyncio.wait_for(feed.changed.wait(), timeout=10.0)


@pytest.mark.asyncio
async def test_feed_reports_a_worker_that_differs_until_it_leaves(
    caplog: pytest.LogCaptureFixture,
) -> None:
    discovery = MemDiscovery()
    plane = ZmqEventPlane("127.0.0.1")
    feed = WorkerStepFeed(discovery, plane, "test", ("load",), PROFILED)
    task = asyncio.create_task(feed.run())
    caplog.set_level(logging.WARNING, logger="armature.planner.worker_feed")
    try:
        same = await discovery.register(
            worker_key("test", 1), msgspec.msgpack.encode(card(1)), ttl_s=30.0
        )
        other = await discovery.register(
            worker_key("test", 2), msgspec.msgpack.encode(card(2, num_kv_blocks=1024)), 30.0
        )
        await _wait_for(lambda: len(feed.get_worker_ids()) == 2, feed)
        assert feed.get_mismatches() == {"worker-2": ["1024 KV blocks (profiled 4096)"]}
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and warnings[0].startswith(
            "worker worker-2 runs 1024 KV blocks (profiled 4096): the planner's timing profile"
        )
        await other.close()
        await _wait_for(lambda: feed.get_worker_ids() == ["worker-1"], feed)
        assert feed.get_mismatches() == {}
        await same.close()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await plane.close()
        await discovery.close()
