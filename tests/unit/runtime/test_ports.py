"""The HTTP listen socket reserved before a long start: taken addresses fail at once,
nothing bound meanwhile can share its port, and a replica joining a shared port takes no
connection before it serves."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

import pytest

from armature.errors import ConfigError
from armature.runtime.ports import free_port, reserve_listen_socket, reserve_shared_listen_socket


def test_a_reserved_port_accepts_connections_and_cannot_be_bound_again() -> None:
    with reserve_listen_socket("127.0.0.1", 0) as reserved:
        port = reserved.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # listening from the moment it is reserved (connections queue)
        with socket.socket() as other:
            other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            with pytest.raises(OSError):
                other.bind(("127.0.0.1", port))
        with pytest.raises(ConfigError, match=f"cannot listen on 127.0.0.1:{port}"):
            reserve_listen_socket("127.0.0.1", port)
        assert not reserved.get_inheritable()  # worker processes do not hold it


def test_the_port_is_free_again_once_the_reservation_closes() -> None:
    port = free_port("127.0.0.1")
    reserve_listen_socket("127.0.0.1", port).close()
    with reserve_listen_socket("127.0.0.1", port) as again:
        assert again.getsockname()[1] == port


def test_a_shared_port_takes_more_reuse_port_listeners_and_no_other() -> None:
    with reserve_shared_listen_socket("127.0.0.1", 0) as first:
        port = first.getsockname()[1]
        with reserve_listen_socket("127.0.0.1", port, reuse_port=True) as second:
            # the kernel spreads connections over both listeners
            accepted = set()
            for _ in range(64):
                with socket.create_connection(("127.0.0.1", port), timeout=5):
                    pass
            for listener in (first, second):
                listener.setblocking(False)
                try:
                    while True:
                        conn, _ = listener.accept()
                        conn.close()
                        accepted.add(listener.fileno())
                except BlockingIOError:
                    pass
            assert accepted == {first.fileno(), second.fileno()}
        with pytest.raises(ConfigError, match=f"cannot listen on 127.0.0.1:{port}"):
            reserve_listen_socket("127.0.0.1", port)  # a listener without SO_REUSEPORT
        with pytest.raises(ConfigError, match=f"cannot listen on 127.0.0.1:{port}"):
            reserve_shared_listen_socket("127.0.0.1", port)  # another group's first


def test_a_shared_port_is_refused_when_anything_listens_there() -> None:
    with reserve_listen_socket("127.0.0.1", 0, reuse_port=True) as other:
        port = other.getsockname()[1]
        with pytest.raises(ConfigError, match=f"cannot listen on 127.0.0.1:{port}"):
            reserve_shared_listen_socket("127.0.0.1", port)


async def test_a_replica_joining_a_shared_port_gets_no_connection_before_it_serves() -> None:
    """A SO_REUSEPORT listener gets its share of the connections as soon as it listens: one
    reserved by a replica that is still starting is bound only, so every connection goes to
    the replica serving; once it serves (asyncio listens), it takes its share."""
    accepted = {"serving": 0, "joining": 0}

    def count(name: str) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], None]:
        def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted[name] += 1
            writer.close()

        return on_connect

    async def connect_many(port: int, count: int) -> None:
        for _ in range(count):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            await reader.read()  # the server closed it: it was accepted
            writer.close()

    with reserve_shared_listen_socket("127.0.0.1", 0) as serving_socket:
        port = serving_socket.getsockname()[1]
        serving = await asyncio.start_server(count("serving"), sock=serving_socket)
        joining_socket = reserve_listen_socket("127.0.0.1", port, reuse_port=True, listen_now=False)
        await asyncio.wait_for(connect_many(port, 32), 10)
        assert accepted == {"serving": 32, "joining": 0}
        joining = await asyncio.start_server(count("joining"), sock=joining_socket)
        await asyncio.wait_for(connect_many(port, 64), 10)
        assert accepted["serving"] + accepted["joining"] == 96 and accepted["joining"] > 0
        for server in (serving, joining):
            server.close()
            await server.wait_closed()
