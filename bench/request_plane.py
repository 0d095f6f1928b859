"""Request-plane overhead: the mocker at effectively infinite speed behind
  inproc  `armature serve` (engine in the frontend's process: no request plane)
  tcp     `armature frontend` + `armature worker` processes, TCP request plane, zmq events
  nats    the same over a local nats-server (NATS request and event planes)
Each request streams 64 tokens (/v1/completions, stream, ignore_eos). Closed loop at
concurrency 1, 32 and 128; a minimal keep-alive HTTP/1.1 client (no SSE parsing, so the
client costs little). Reported: requests/s, end-to-end p50/p99, the frontend process's CPU
time per request (from /proc), and at concurrency 1 the latency each plane adds over inproc.

    python -m bench.request_plane [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from armature.workload.measure import quantile
from bench.paths import results_path
from bench.report import Section, get_machine_facts, markdown_table, write_section

MODEL_NAME = "mock"
TOKENS = 64
CLK_TCK = os.sysconf("SC_CLK_TCK")
KINDS = ("inproc", "tcp", "nats")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_nats_server() -> tuple[subprocess.Popen[bytes], str]:
    """A nats-server on a free loopback port, once it accepts connections, and its url."""
    nats = shutil.which("nats-server")
    assert nats, "nats-server missing: pip install -e '.[test]'"
    port = free_port()
    proc = subprocess.Popen(
        [nats, "-a", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline_s = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, f"nats://127.0.0.1:{port}"
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline_s:
                proc.kill()
                raise RuntimeError("nats-server did not start") from None
            time.sleep(0.05)


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


class Stack:
    def __init__(self, kind: str, workdir: Path):
        self.kind = kind
        self.workdir = workdir
        self.procs: list[subprocess.Popen[bytes]] = []
        self.port = free_port()
        self.frontend_pid = 0

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.workdir / f"{name}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, "-m", "armature.cli", *args], stdout=log, stderr=subprocess.STDOUT
        )
        self.procs.append(proc)
        return proc

    def start(self) -> None:
        engine = [
            "--engine",
            "mocker",
            "--speedup-ratio",
            "1e9",
            "--num-kv-blocks",
            "8192",
            "--max-num-seqs",
            "256",
            "--served-model-name",
            MODEL_NAME,
            "--log-level",
            "warning",
        ]
        if self.kind == "inproc":
            proc = self._spawn("serve", ["serve", *engine, "--port", str(self.port)])
            self.frontend_pid = proc.pid
        else:
            runtime = ["--discovery", "file", "--discovery-dir", str(self.workdir / "disc")]
            if self.kind == "nats":
                nats_server, nats_url = start_nats_server()
                self.procs.append(nats_server)
                runtime += ["--request-plane", "nats", "--event-plane", "nats"]
                runtime += ["--nats-url", nats_url]
            self._spawn("worker", ["worker", *engine, *runtime])
            proc = self._spawn(
                "frontend",
                ["frontend", *runtime, "--port", str(self.port), "--log-level", "warning"],
            )
            self.frontend_pid = proc.pid
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.kind} stack did not come up; see {self.workdir}")

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()


def request_bytes(port: int, prompt: str) -> bytes:
    body = json.dumps(
        {
            "model": MODEL_NAME,
            "prompt": prompt,
            "max_tokens": TOKENS,
            "stream": True,
            "ignore_eos": True,
        }
    ).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def client_loop(port: int, count: int, latencies_ms: list[float], slot: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for i in range(count):
            started = time.perf_counter()
            writer.write(request_bytes(port, f"hello from slot {slot} request {i}"))
            await writer.drain()
            await read_stream_end(reader)
            latencies_ms.append((time.perf_counter() - started) * 1000)
    finally:
        writer.close()


async def read_stream_end(reader: asyncio.StreamReader) -> float:
    """Read one chunked SSE response to its `[DONE]` and the chunked body's end; the
    perf_counter time its first event arrived."""
    data = b""
    first_event_s = 0.0
    while not (b"[DONE]" in data and data.endswith(b"0\r\n\r\n")):
        chunk = await reader.read(65536)
        if not chunk:
            raise RuntimeError("server closed the connection")
        if not first_event_s and b"data: " in chunk:
            first_event_s = time.perf_counter()
        data = data[-64:] + chunk if b"[DONE]" not in chunk else data + chunk
    return first_event_s


async def run_load(port: int, concurrency: int, total: int) -> tuple[float, list[float]]:
    latencies: list[float] = []
    per_slot = max(1, total // concurrency)
    started = time.perf_counter()
    await asyncio.gather(*(client_loop(port, per_slot, latencies, s) for s in range(concurrency)))
    return time.perf_counter() - started, latencies


async def paired_c1(
    ports: dict[str, int], num_pairs: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Concurrency 1 on every stack in turn, one request each per round (the order rotates
    each round), on one keep-alive connection per stack: the per-round differences cancel
    the drift of a shared machine. End-to-end ms and first-event ms, per stack, per round."""
    conns = {k: await asyncio.open_connection("127.0.0.1", p) for k, p in ports.items()}
    kinds = list(ports)
    e2e: dict[str, list[float]] = {k: [] for k in kinds}
    first: dict[str, list[float]] = {k: [] for k in kinds}
    try:
        for i in range(num_pairs):
            for kind in kinds[i % len(kinds) :] + kinds[: i % len(kinds)]:
                reader, writer = conns[kind]
                started = time.perf_counter()
                writer.write(request_bytes(ports[kind], f"paired request {i}"))
                first_event_s = await read_stream_end(reader)
                e2e[kind].append((time.perf_counter() - started) * 1000)
                first[kind].append((first_event_s - started) * 1000)
    finally:
        for _, writer in conns.values():
            writer.close()
    return e2e, first


def run_paired(num_pairs: int) -> None:
    """Print what tcp and nats add over inproc at concurrency 1, from paired rounds."""
    stacks = {k: Stack(k, Path(tempfile.mkdtemp(prefix=f"rp-{k}-"))) for k in KINDS}
    try:
        for stack in stacks.values():
            stack.start()
        ports = {k: s.port for k, s in stacks.items()}
        asyncio.run(paired_c1(ports, 10))  # warm-up
        e2e, first = asyncio.run(paired_c1(ports, num_pairs))
    finally:
        for stack in stacks.values():
            stack.stop()
    for kind in KINDS:
        print(
            f"{kind}: p50 {quantile(e2e[kind], 0.5):.2f} ms, "
            f"first event p50 {quantile(first[kind], 0.5):.2f} ms"
        )
    for kind in ("tcp", "nats"):
        added = [a - b for a, b in zip(e2e[kind], e2e["inproc"], strict=True)]
        print(f"{kind} adds {quantile(added, 0.5):.2f} ms at p50 over inproc (paired rounds)")
        if kind == "nats":
            over_tcp = [a - b for a, b in zip(e2e["nats"], e2e["tcp"], strict=True)]
            print(f"nats adds {quantile(over_tcp, 0.5):.2f} ms at p50 over tcp (paired rounds)")
            first_over = [a - b for a, b in zip(first["nats"], first["tcp"], strict=True)]
            print(f"  of which {quantile(first_over, 0.5):.2f} ms before the first event")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--paired", type=int, default=0, help="only N paired rounds at concurrency 1; print"
    )
    args = parser.parse_args()
    if args.paired:
        run_paired(args.paired)
        return
    plan = [(1, 200), (32, 1024), (128, 1024)] if not args.quick else [(1, 20), (32, 64)]

    rows = []
    p50_c1: dict[str, float] = {}
    checks = []
    for kind in KINDS:
        workdir = Path(tempfile.mkdtemp(prefix=f"rp-{kind}-"))
        stack = Stack(kind, workdir)
        stack.start()
        try:
            asyncio.run(run_load(stack.port, 4, 64))  # warm-up
            for concurrency, total in plan:
                cpu0 = cpu_s(stack.frontend_pid)
                wall_s, lat = asyncio.run(run_load(stack.port, concurrency, total))
                cpu = cpu_s(stack.frontend_pid) - cpu0
                rps = len(lat) / wall_s
                cpu_pct_per_rps = 100 * cpu / wall_s / rps
                p50, p99 = quantile(lat, 0.5), quantile(lat, 0.99)
                if concurrency == 1:
                    p50_c1[kind] = p50
                rows.append([kind, concurrency, len(lat), rps, p50, p99, cpu_pct_per_rps])
                print(rows[-1], flush=True)
                if kind != "inproc" and concurrency == 32:
                    ok = rps >= 400 and cpu_pct_per_rps <= 0.35
                    checks.append(
                        f"{'PASS' if ok else 'MISS'}: {kind} at concurrency 32: {rps:.0f} "
                        f"requests/s (target >= 400), frontend {cpu_pct_per_rps:.2f}% of a core "
                        "per request/s (target <= 0.35%)"
                    )
        finally:
            stack.stop()
    for kind in ("tcp", "nats"):
        added = p50_c1[kind] - p50_c1["inproc"]
        checks.append(
            f"{'PASS' if added < 1.0 else 'MISS'}: {kind} adds {added:.2f} ms at p50, "
            "concurrency 1 (target < 1 ms)"
        )
    body = (
        f"Mocker at speedup 1e9, {TOKENS} streamed tokens per request, closed loop; "
        "requests/s and end-to-end latency seen by a minimal keep-alive HTTP client; frontend "
        "CPU from /proc (utime + stime).\n\n"
        + markdown_table(
            [
                "stack",
                "concurrency",
                "requests",
                "requests/s",
                "p50 ms",
                "p99 ms",
                "frontend % core per req/s",
            ],
            rows,
        )
        + "\n\n"
        + "\n".join(f"- {c}" for c in checks)
        + "\n"
    )
    out = results_path(args.quick)
    write_section(
        out,
        Section(
            "request_plane", "Request plane: overhead through frontend and worker", body, "n/a"
        ),
        get_machine_facts(),
    )
    print("\n".join(checks))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
