"""The shared store's (G4) refresh round: the whole listing every worker did each
--kv-remote-refresh-s before the journal, against a round of the journal, on a shared directory
and on an S3 server (moto's, a subprocess on a free loopback port).

    python -m bench.g4_journal [--quick]

Each store holds `blocks` blocks. A journal round: 8 other workers each put 16 blocks and
wrote their journal object since the reader's last round (the reader then lists the journal and
reads the 8 new objects). The whole listing: `list_keys` of the same store. Time per round is
the median over the rounds, with the fastest and slowest; S3 calls are the requests the reader
sent in one round. Writes the `g4_journal` section of docs/benchmarks.md (bench/out/ with
--quick).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from armature.kv.block_key import BlockKey
from armature.tiers.disk_store import DiskStore
from armature.tiers.journal import JournaledStore, SharedStore
from armature.tiers.s3_store import S3Store, make_s3_client
from bench.report import Section, get_machine_facts, markdown_table, write_section

NAMESPACE = "bench-0123456789ab"
NUM_WRITERS = 8
BLOCKS_PER_WRITER = 16
BLOCK_BYTES = 256  # the listing's cost does not depend on it


def _key(i: int) -> BlockKey:
    return BlockKey(0x10_0000 + i, 0x20_0000 + i, None)


def _fill(store: SharedStore, num_blocks: int) -> None:
    data = b"x" * BLOCK_BYTES
    for i in range(num_blocks):
        store.put(_key(i), data)


class CallCounter:
    """Counts an S3 client's requests (botocore's before-call event)."""

    def __init__(self, client: Any) -> None:
        self.num_calls = 0
        client.meta.events.register("before-call.s3.*", self._count)

    def _count(self, **_: Any) -> None:
        self.num_calls += 1


def measure(
    make_store: Callable[[], SharedStore],
    num_blocks: int,
    num_rounds: int,
    counter: CallCounter | None,
) -> list[list[object]]:
    """Rows (path, median ms, fastest, slowest, S3 calls a round) for one filled store."""
    reader = JournaledStore(make_store())
    writers = [JournaledStore(make_store()) for _ in range(NUM_WRITERS)]
    reader.list_keys()
    whole_ms: list[float] = []
    journal_ms: list[float] = []
    calls = {"whole": 0, "journal": 0}
    next_key = num_blocks
    for _ in range(num_rounds):
        started = time.perf_counter()
        before = counter.num_calls if counter else 0
        keys = reader.store.list_keys()
        whole_ms.append((time.perf_counter() - started) * 1000)
        calls["whole"] = (counter.num_calls if counter else 0) - before
        assert len(keys) >= num_blocks
        for writer in writers:
            for _ in range(BLOCKS_PER_WRITER):
                writer.put(_key(next_key), b"y" * BLOCK_BYTES)
                next_key += 1
            writer.flush_journal()
        started = time.perf_counter()
        before = counter.num_calls if counter else 0
        new = reader.list_new_keys()
        journal_ms.append((time.perf_counter() - started) * 1000)
        calls["journal"] = (counter.num_calls if counter else 0) - before
        assert len(new) == NUM_WRITERS * BLOCKS_PER_WRITER, len(new)
    rows: list[list[object]] = []
    for path, values in (("whole listing", whole_ms), ("journal round", journal_ms)):
        key = "whole" if path == "whole listing" else "journal"
        rows.append(
            [
                path,
                f"{statistics.median(values):.2f}",
                f"{min(values):.2f}",
                f"{max(values):.2f}",
                calls[key] if counter else "",
            ]
        )
    return rows


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def moto_server() -> Iterator[str]:
    """A moto S3 server on a free loopback port, stopped by its PID at the end."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/moto-api/", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit("moto's S3 server did not start (pip install -e '.[test]')")
            time.sleep(0.2)
        yield url
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args()
    num_rounds = args.rounds or (2 if args.quick else 5)
    dir_sizes = (2_000,) if args.quick else (10_000, 50_000)
    s3_sizes = (500,) if args.quick else (2_000, 8_000)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ.setdefault(name, "bench")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    rows: list[list[object]] = []
    for num_blocks in dir_sizes:
        with tempfile.TemporaryDirectory() as root:
            _fill(DiskStore(Path(root), NAMESPACE), num_blocks)
            found = measure(lambda: DiskStore(Path(root), NAMESPACE), num_blocks, num_rounds, None)
            rows += [["shared directory", num_blocks, *row] for row in found]
            print(rows[-2:], flush=True)
    with moto_server() as url:
        for num_blocks in s3_sizes:
            bucket = f"bench-{num_blocks}"
            client = make_s3_client(url)
            client.create_bucket(Bucket=bucket)
            counter = CallCounter(client)

            def store(client: Any = client, bucket: str = bucket) -> SharedStore:
                return S3Store(client, bucket=bucket, key_prefix=f"kv/{NAMESPACE}/")

            _fill(store(), num_blocks)
            found = measure(store, num_blocks, num_rounds, counter)
            rows += [["S3 (moto)", num_blocks, *row] for row in found]
            print(rows[-2:], flush=True)
    body = (
        f"A reader's refresh round over a store of `blocks` blocks, after {NUM_WRITERS} other "
        f"workers each put {BLOCKS_PER_WRITER} blocks and wrote their journal object; "
        f"{num_rounds} rounds per row. `whole listing`: what every round cost each worker "
        "before the journal (it is still the round at start, hourly and after a missed "
        "round); `journal round`: `list_new_keys` (a listing of the journal and a read of "
        "each new object). S3 calls: the requests the reader sent in one round, what a "
        "remote S3 bills and waits for (moto is a Python server on this machine: its times "
        "are its own; a whole listing is one call per 1,000 blocks, a journal round one "
        "listing and a read per writer that wrote since).\n\n"
        + markdown_table(
            ["store", "blocks", "round", "median ms", "fastest ms", "slowest ms", "S3 calls"],
            rows,
        )
        + "\n"
    )
    out = Path(__file__).resolve().parent / (
        "out/benchmarks.md" if args.quick else "../docs/benchmarks.md"
    )
    write_section(
        out,
        Section("g4_journal", "KV tiers: the shared store's refresh round (journal)", body, "n/a"),
        get_machine_facts(),
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
