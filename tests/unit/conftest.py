"""Fixtures of the unit tests that talk over a real event plane: a nats-server per module,
and each event-plane backend in turn (zmq needs no server)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from armature.runtime.events import EventPlane, NatsEventPlane, ZmqEventPlane
from servers import Nats


@pytest.fixture(scope="module")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nats]:
    server = Nats(tmp_path_factory.mktemp("nats"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["zmq", "nats"])
async def plane(request: pytest.FixtureRequest, nats_server: Nats) -> AsyncIterator[EventPlane]:
    if request.param == "zmq":
        p: EventPlane = ZmqEventPlane()
    else:
        nats_plane = NatsEventPlane(nats_server.url)
        await nats_plane.connect()
        p = nats_plane
    yield p
    await p.close()
