"""Whether a worker's --instance-id is free in its namespace: a live worker already
registered under it would be hidden from every frontend by the later registration (one key,
the last card wins), its requests routed to the newcomer.

A registration is live when its worker answers on the request plane: a probe on an endpoint
no worker serves comes back refused by name (NOT_FOUND) from a live one, and cannot be
delivered to a dead one. A registration whose worker died (its lease not yet expired) is
taken over: serve and the planner start a failed worker again under its id."""

from __future__ import annotations

import msgspec

from armature.errors import ConfigError
from armature.protocols.worker import WorkerCard, worker_key
from armature.runtime.discovery import Discovery
from armature.runtime.request_plane import PeerUnavailableError, RemoteError, RequestClient

__all__ = ["PROBE_ENDPOINT", "check_instance_id_free"]

PROBE_ENDPOINT = "instance-probe"  # served by no worker: a live one answers NOT_FOUND


async def check_instance_id_free(
    discovery: Discovery, client: RequestClient, namespace: str, instance_id: int
) -> None:
    """ConfigError naming the worker when a live one holds `instance_id` in `namespace`."""
    key = worker_key(namespace, instance_id)
    value = (await discovery.list(key)).get(key)
    if value is None:
        return
    try:
        card = msgspec.msgpack.decode(value, type=WorkerCard)
    except msgspec.DecodeError:
        return  # unreadable: taken over, as the frontends ignore it
    if await _answers(client, card.request_url):
        raise ConfigError(
            f"--instance-id {instance_id} is taken in namespace {namespace!r} by a live "
            f"worker at {card.request_url} (model {card.model_name!r}); give each worker an "
            "id of its own"
        )


async def _answers(client: RequestClient, url: str) -> bool:
    """Whether a request-plane server answers at `url`."""
    try:
        async for _ in client.stream(url, PROBE_ENDPOINT, b""):
            break
    except RemoteError:
        return True
    except PeerUnavailableError:
        return False
    return True
