"""A worker's --instance-id taken by a live worker is refused at start (both registered
under one key: the later hid the earlier from every frontend); one left by a worker that
died is taken over, as serve and the planner restart a worker under its id. Over file
discovery and the real TCP request plane."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from armature.errors import ConfigError
from armature.protocols.worker import WorkerCard, worker_key
from armature.runtime.discovery_file import FileDiscovery
from armature.runtime.ports import free_port
from armature.runtime.tcp_client import RequestPlaneClient
from armature.runtime.tcp_server import RequestPlaneServer
from armature.worker.instance_id import check_instance_id_free


def card(instance_id: int, request_url: str) -> WorkerCard:
    return WorkerCard(
        instance_id=instance_id,
        namespace="armature",
        model_name="tiny",
        model_path="/models/tiny",
        block_size=16,
        num_kv_blocks=64,
        max_model_len=512,
        vocab_size=1000,
        request_url=request_url,
        events_url="tcp://127.0.0.1:1",
    )


async def test_a_live_workers_id_is_refused_and_a_dead_ones_taken_over(tmp_path: Path) -> None:
    discovery = FileDiscovery(tmp_path)
    client = RequestPlaneClient(secret="s")
    live = RequestPlaneServer({}, secret="s")
    await live.start()
    try:
        dead_url = f"tcp://127.0.0.1:{free_port('127.0.0.1')}"  # nothing listens
        for instance_id, url in ((1, live.url), (2, dead_url)):
            value = msgspec.msgpack.encode(card(instance_id, url))
            await discovery.register(worker_key("armature", instance_id), value, 30)
        with pytest.raises(ConfigError) as caught:
            await check_instance_id_free(discovery, client, "armature", 1)
        assert str(caught.value) == (
            f"--instance-id 1 is taken in namespace 'armature' by a live worker at {live.url} "
            "(model 'tiny'); give each worker an id of its own"
        )
        await check_instance_id_free(discovery, client, "armature", 2)  # died: taken over
        await check_instance_id_free(discovery, client, "armature", 3)  # free
        await check_instance_id_free(discovery, client, "other", 1)  # another namespace
    finally:
        await client.close()
        await live.stop()
        await discovery.close()
