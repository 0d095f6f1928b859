"""KV transfer bandwidth and latency per backend, next to a plain memcpy of the same bytes.

A child process plays the prefill worker: a shared-memory KV cache with the default model's
layout (30 layers, 3 KV heads, head dim 64, block 16) in bfloat16, filled with random values,
its blocks pinned, served by the real transfer agent. This process plays the decode worker and
times what a decode does for a request: pull the blocks and write them into its own cache,
then checks the bytes. Backends: shm (map the peer's cache, copy straight into ours) and tcp
(loopback), nixl (NIXL 1.5 UCX reads into a registered staging tensor, then the write). memcpy:
one torch copy of the same bytes inside one process.

    python -m bench.kv_transfer [--quick]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import torch

from armature.engines.native.kv_store import PagedCacheStore
from armature.model.arch import ModelArch
from armature.model.kv_cache import PagedKvCache
from armature.protocols.kv_transfer import KvHandle, NativeTransfer
from armature.transfer.agent import KvTransferAgent
from armature.transfer.pins import PinTable
from armature.workload.measure import quantile
from bench.paths import REPO_ROOT, results_path
from bench.report import Section, get_machine_facts, markdown_table, write_section

ARCH = ModelArch(
    model_type="llama",
    num_layers=30,
    hidden_size=576,
    num_heads=9,
    num_kv_heads=3,
    head_dim=64,
    intermediate_size=1536,
    vocab_size=49152,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
    qkv_bias=False,
    max_position_embeddings=8192,
    eos_token_ids=(),
    sliding_window=None,
)
DTYPE = torch.bfloat16
SIZES = [1, 4, 16, 64, 256, 1024, 4096]


def cache(num_blocks: int, shared: bool) -> PagedKvCache:
    return PagedKvCache(ARCH, num_blocks, 16, DTYPE, torch.device("cpu"), shared=shared)


def serve_child(num_blocks: int, backends: tuple[str, ...]) -> None:
    """The prefill side: pin blocks 0..n-1 under handle h<n> for every size; serve until
    stdin closes."""
    prefill = cache(num_blocks, shared=True)
    prefill.k.copy_(torch.randn(prefill.k.shape, generator=torch.Generator().manual_seed(1)))
    prefill.v.copy_(torch.randn(prefill.v.shape, generator=torch.Generator().manual_seed(2)))
    pins = PinTable()
    for n in SIZES:
        if n <= num_blocks:
            pins.add(f"h{n}", list(range(n)), deadline_s=float("inf"))
    agent = KvTransferAgent(
        PagedCacheStore(prefill),
        pins,
        shm_path=prefill.shm_path,
        num_blocks=num_blocks,
        backends=backends,
        name="bench-prefill",
    )
    print(json.dumps(agent.start()), flush=True)
    sys.stdin.read()
    agent.stop()


def timed(fn: object, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()  # type: ignore[operator]
        out.append(time.perf_counter() - started)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--backends", default="shm,tcp", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        serve_child(args.serve, tuple(args.backends.split(",")))
        return
    sizes = SIZES[:4] if args.quick else SIZES
    results: dict[tuple[str, int], float] = {}
    # NIXL's progress threads poll without sleeping: measured apart from the others, which
    # they would otherwise starve of CPU on a small machine
    measure(sizes, ("memcpy", "shm", "tcp"), results)
    measure(sizes, ("nixl",), results)
    rows = [row_of(n, results) for n in sizes]
    write(args, sizes, rows, results)


BYTES_PER_BLOCK = 2 * ARCH.num_layers * ARCH.num_kv_heads * ARCH.head_dim * 16 * 2


def row_of(n: int, results: dict[tuple[str, int], float]) -> list[object]:
    nbytes = n * BYTES_PER_BLOCK
    row: list[object] = [n, f"{nbytes / 1e6:,.2f}"]
    for name in ("memcpy", "shm", "nixl", "tcp"):
        s = results[(name, n)]
        row += [f"{s * 1e3:,.3f}", f"{nbytes / s / 1e9:,.2f}"]
    row.append(f"{results[('memcpy', n)] / results[('shm', n)]:.0%}")
    print(row, flush=True)
    return row


def measure(
    sizes: list[int], names: tuple[str, ...], results: dict[tuple[str, int], float]
) -> None:
    num_blocks = max(sizes)
    served = ("nixl", "tcp") if "nixl" in names else ("shm", "tcp")
    serve = ["--serve", str(num_blocks), "--backends", ",".join(served)]
    child = subprocess.Popen(
        [sys.executable, "-m", "bench.kv_transfer", *serve],
        cwd=REPO_ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        while not line.startswith("{"):  # NIXL logs to stdout before the endpoints
            line = child.stdout.readline()
        endpoints = json.loads(line)
        decode = cache(num_blocks, shared=False)
        store = PagedCacheStore(decode)
        backends = {"shm": ("shm", "tcp"), "nixl": ("nixl", "tcp"), "tcp": ("tcp",)}
        agents = {
            b: KvTransferAgent(store, PinTable(), backends=backends[b], name=f"bench-{b}")
            for b in names
            if b != "memcpy"
        }
        scratch = cache(num_blocks, shared=False)
        for n in sizes:
            handle = KvHandle(
                handle_id=f"h{n}",
                worker_id="bench",
                layout=decode.layout,
                seq_hashes=list(range(n)),
                transfer=NativeTransfer(endpoints=endpoints),
            )
            ids = list(range(n))
            repeats = max(3, min(50, 2000 // n))

            def memcpy(n: int = n) -> None:
                decode.k[:, :n].copy_(scratch.k[:, :n])
                decode.v[:, :n].copy_(scratch.v[:, :n])

            def pull(backend: str, handle: KvHandle = handle, ids: list[int] = ids) -> None:
                store.write_blocks(ids, agents[backend].pull(handle, 0))

            for name in names:
                fn = memcpy if name == "memcpy" else (lambda name=name: pull(name))  # type: ignore[misc]
                fn()  # warm: maps, connections, page faults
                seconds = quantile(timed(fn, repeats), 0.5)
                results[(name, n)] = seconds
                if name != "memcpy":
                    assert agents[name].num_pulls[name] > 0
            expected_k = torch.randn(
                (ARCH.num_layers, num_blocks, 16, ARCH.num_kv_heads, ARCH.head_dim),
                generator=torch.Generator().manual_seed(1),
            ).to(DTYPE)[:, :n]
            if names != ("memcpy",):
                assert torch.equal(decode.k[:, :n], expected_k), "transferred bytes differ"
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=30)


def write(
    args: argparse.Namespace,
    sizes: list[int],
    rows: list[list[object]],
    results: dict[tuple[str, int], float],
) -> None:
    bytes_per_block = BYTES_PER_BLOCK
    big = max(sizes)
    shm_ratio = results[("memcpy", big)] / results[("shm", big)]
    tcp_gbs = big * bytes_per_block / results[("tcp", big)] / 1e9
    body = (
        "Decode side of one transfer, median over repeats: pull the blocks of a pinned handle "
        "from a prefill process and write them into this process's KV cache. Layout of the "
        "default model in bfloat16 (368,640 bytes per 16-token block); contiguous block ids; "
        "loopback for tcp; NIXL 1.5.1 with its UCX backend on CPU memory for nixl, measured in a "
        "pass of its own after the others (its progress threads poll without sleeping and "
        "would starve the other rows of CPU on this 2-core machine). memcpy: the same bytes "
        "copied by torch inside one process.\n\n"
        + markdown_table(
            [
                "blocks",
                "MB",
                "memcpy ms",
                "memcpy GB/s",
                "shm ms",
                "shm GB/s",
                "nixl ms",
                "nixl GB/s",
                "tcp ms",
                "tcp GB/s",
                "shm / memcpy",
            ],
            rows,
        )
        + f"\n\n- {'PASS' if shm_ratio >= 0.5 else 'MISS'}: shared memory at {big} blocks "
        f"reaches {shm_ratio:.0%} of memcpy (target >= 50%)\n"
        f"- {'PASS' if tcp_gbs >= 1 else 'MISS'}: TCP on loopback at {big} blocks moves "
        f"{tcp_gbs:.2f} GB/s (target >= 1 GB/s)\n"
    )
    out = results_path(args.quick)
    write_section(
        out,
        Section("kv_transfer", "KV transfer: bandwidth and latency per backend", body, "bfloat16"),
        get_machine_facts(),
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
