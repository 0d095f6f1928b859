"""What carrying one small message costs each request plane's transport, apart from Armature:
a publisher process sends `N` 100-byte messages (one loop turn each, as a worker sends one
token per engine step) and a subscriber in this process takes them; reported are the
subscriber's CPU microseconds per message (the frontend's side of the plane), the
nats-server's, and the wall time per message.

    tcp   asyncio streams, 4-byte length prefix (the TCP plane's framing)
    nats  nats-py publish -> nats-server -> nats-py subscription callback (the NATS plane's)

    python -m bench.plane_floor          # prints
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable

import nats

from bench.request_plane import cpu_s, free_port, start_nats_server

PAYLOAD = b"x" * 100


async def _publish_tcp(port: int, count: int) -> None:
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    frame = len(PAYLOAD).to_bytes(4, "big") + PAYLOAD
    for _ in range(count):
        writer.write(frame)
        await writer.drain()
        await asyncio.sleep(0)
    writer.close()


async def _publish_nats(url: str, count: int) -> None:
    nc = await nats.connect(url)
    for _ in range(count):
        await nc.publish("floor", PAYLOAD)
        await asyncio.sleep(0)
    await nc.flush()
    await nc.close()


def publisher(kind: str, address: str, count: int) -> None:
    if kind == "tcp":
        asyncio.run(_publish_tcp(int(address), count))
    else:
        asyncio.run(_publish_nats(address, count))


async def _take_tcp(port: int, count: int) -> tuple[float, float]:
    done = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for _ in range(count):
            size = int.from_bytes(await reader.readexactly(4), "big")
            await reader.readexactly(size)
        done.set()

    server = await asyncio.start_server(serve, "127.0.0.1", port)
    return await _timed(["tcp", str(port)], count, done, server.close)


async def _take_nats(url: str, count: int) -> tuple[float, float]:
    nc = await nats.connect(url)
    done = asyncio.Event()
    seen = 0

    async def on_message(msg: object) -> None:
        nonlocal seen
        seen += 1
        if seen == count:
            done.set()

    await nc.subscribe("floor", cb=on_message)
    await nc.flush()
    try:
        return await _timed(["nats", url], count, done, lambda: None)
    finally:
        await nc.close()


async def _timed(
    args: list[str], count: int, done: asyncio.Event, close: Callable[[], object]
) -> tuple[float, float]:
    """(wall s, this process's CPU s) from the publisher's start to the last message."""
    command = [sys.executable, "-m", "bench.plane_floor", "--publish", *args, str(count)]
    started_s, started_cpu_s = time.perf_counter(), time.process_time()
    proc = await asyncio.create_subprocess_exec(*command)
    await done.wait()
    wall_s, cpu = time.perf_counter() - started_s, time.process_time() - started_cpu_s
    await proc.wait()
    close()
    return wall_s, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=20000)
    parser.add_argument("--publish", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.publish:
        kind, address, count = args.publish
        publisher(kind, address, int(count))
        return
    server, nats_url = start_nats_server()
    try:
        for kind in ("tcp", "nats"):
            server_cpu_s = cpu_s(server.pid)
            if kind == "tcp":
                wall_s, sub_cpu_s = asyncio.run(_take_tcp(free_port(), args.count))
            else:
                wall_s, sub_cpu_s = asyncio.run(_take_nats(nats_url, args.count))
            server_us = 1e6 * (cpu_s(server.pid) - server_cpu_s) / args.count
            print(
                f"{kind}: subscriber {1e6 * sub_cpu_s / args.count:.1f} us CPU/message, "
                f"nats-server {server_us:.1f} us CPU/message, "
                f"wall {1e6 * wall_s / args.count:.1f} us/message"
            )
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
