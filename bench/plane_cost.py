"""What the request plane costs per frame, by process, over TCP and over NATS.

A server process streams small items (60 bytes, an engine output's size) to a client in this
process, the way a worker streams a request's tokens to a frontend: streams of 64 items, one
at a time (concurrency 1). No engine and no HTTP: only the plane. CPU per frame is read from
/proc for the server process and nats-server, and from this process's own clock for the
client; wall time per stream says how fast the plane alone can pace 64 frames.

    python -m bench.plane_cost            # prints a table; docs/benchmarks.md quotes it
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from collections.abc import AsyncIterator

from armature.runtime.request_plane import RequestClient
from bench.request_plane import cpu_s, free_port, start_nats_server

ITEM = b"x" * 60
ITEMS_PER_STREAM = 64
SUBJECT = "plane-cost.worker"


async def items(payload: bytes) -> AsyncIterator[bytes]:
    for _ in range(int(payload)):
        yield ITEM


async def serve(kind: str, where: str) -> None:
    """The server side until killed: TCP on port `where`, or NATS at url `where`."""
    if kind == "tcp":
        from armature.runtime.tcp_server import RequestPlaneServer

        server = RequestPlaneServer({"items": items}, port=int(where))
        await server.start()
    else:
        from armature.runtime.nats_conn import connect_nats
        from armature.runtime.nats_plane import NatsRequestPlaneServer

        nats_server = NatsRequestPlaneServer(await connect_nats(where), SUBJECT, {"items": items})
        await nats_server.start()
    print("ready", flush=True)
    await asyncio.Event().wait()


async def measure(kind: str, url: str, nats_url: str, num_streams: int) -> tuple[float, float]:
    """(client CPU s, wall s) over `num_streams` streams of ITEMS_PER_STREAM items, after a
    warm-up."""
    client: RequestClient
    nc = None
    if kind == "tcp":
        from armature.runtime.tcp_client import RequestPlaneClient

        client = RequestPlaneClient()
    else:
        from armature.runtime.nats_conn import connect_nats
        from armature.runtime.nats_plane import NatsRequestPlaneClient

        nc = await connect_nats(nats_url)
        client = NatsRequestPlaneClient(nc)

    async def one() -> None:
        got = 0
        async for _ in client.stream(url, "items", str(ITEMS_PER_STREAM).encode()):
            got += 1
        assert got == ITEMS_PER_STREAM

    for _ in range(50):
        await one()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for _ in range(num_streams):
        await one()
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    await client.close()
    if nc is not None:
        await nc.close()
    return cpu, wall


def run(kind: str, num_streams: int) -> dict[str, float]:
    """µs of CPU per frame: client, server, nats-server; and ms of wall time per stream."""
    procs: list[subprocess.Popen[bytes]] = []
    nats_pid = None
    nats_url = ""
    try:
        if kind == "nats":
            nats_server, nats_url = start_nats_server()
            procs.append(nats_server)
            nats_pid = nats_server.pid
            where, url = nats_url, f"nats:{SUBJECT}"
        else:
            port = free_port()
            where, url = str(port), f"tcp://127.0.0.1:{port}"
        server = subprocess.Popen(
            [sys.executable, "-m", "bench.plane_cost", "--serve", kind, where],
            stdout=subprocess.PIPE,
        )
        procs.append(server)
        assert server.stdout is not None and server.stdout.readline().strip() == b"ready"
        server_cpu0 = cpu_s(server.pid)
        nats_cpu0 = cpu_s(nats_pid) if nats_pid else 0.0
        client_cpu, wall = asyncio.run(measure(kind, url, nats_url, num_streams))
        # the warm-up's server CPU is inside server_cpu: 50 streams of num_streams + 50
        frames = (num_streams + 50) * ITEMS_PER_STREAM
        server_cpu = cpu_s(server.pid) - server_cpu0
        nats_cpu = (cpu_s(nats_pid) - nats_cpu0) if nats_pid else 0.0
    finally:
        for proc in reversed(procs):
            proc.terminate()
            proc.wait(10)
    measured_frames = num_streams * ITEMS_PER_STREAM
    return {
        "client_us": client_cpu / measured_frames * 1e6,
        "server_us": server_cpu / frames * 1e6,
        "nats_server_us": nats_cpu / frames * 1e6,
        "stream_ms": wall / num_streams * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--serve", nargs=2, metavar=("KIND", "WHERE"), help=argparse.SUPPRESS)
    parser.add_argument("--streams", type=int, default=400, help="measured streams per plane")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each plane, in turn")
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(*args.serve))
        return
    print(
        "| plane | run | client us CPU/frame | server us CPU/frame | nats-server us CPU/frame "
        "| ms per 64-frame stream |"
    )
    print("|---|---|---|---|---|---|")
    for i in range(args.repeat):
        for kind in ("tcp", "nats"):
            r = run(kind, args.streams)
            print(
                f"| {kind} | {i + 1} | {r['client_us']:.1f} | {r['server_us']:.1f} "
                f"| {r['nats_server_us']:.1f} | {r['stream_ms']:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
