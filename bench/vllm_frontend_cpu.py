"""Where Armature's ITL overhead in front of vLLM comes from: CPU seconds that the serving
process (HTTP, detokenization, SSE and vLLM's AsyncLLM client; not vLLM's engine-core process)
spends per output token, for `vllm serve` and for `armature serve --engine vllm`, with ITL p50.

    ~/.venvs/vllm/bin/python -m bench.vllm_frontend_cpu    # writes docs/benchmarks.md

On a machine whose cores vLLM's OpenMP threads all use, every CPU-millisecond the serving
process spends during a model step delays that step, so the per-token CPU of the serving
process is what ITL pays. Both servers run eager (no torch.compile) with the engine settings of
bench/vllm_throughput.py; streaming, 256-token prompts, 128 output tokens, EOS ignored.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from armature.model.source import resolve_model
from bench.paths import DOCS_OUT
from bench.report import Section, get_machine_facts, markdown_table, write_section
from bench.serving import run_armature_bench, running_server
from bench.vllm_throughput import LOG_DIR, free_port, server_commands, server_env

CONCURRENCIES = (1, 8)
REQUESTS_PER_USER = 3
INPUT_LEN, OUTPUT_LEN = 256, 128
TARGETS = ("vllm serve", "armature --engine vllm")


@dataclass(frozen=True)
class Reading:
    cpu_ms_per_token: float
    itl_p50_ms: float
    tokens_per_s: float


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process (its threads, not its children)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    utime, stime = int(fields[11]), int(fields[12])
    return (utime + stime) / os.sysconf("SC_CLK_TCK")


def _bench(url: str, concurrency: int, num_requests: int, warmup: int | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        return run_armature_bench(
            url,
            concurrency=concurrency,
            num_requests=num_requests,
            input_len=INPUT_LEN,
            output_len=OUTPUT_LEN,
            out=Path(tmp),
            warmup=warmup,
        )


def measure(name: str, command: list[str], url: str) -> dict[int, Reading]:
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log = LOG_DIR / ("cpu-" + name.replace(" ", "_").replace("-", "") + ".log")
    with running_server([*command, "--enforce-eager"], url, log, server_env()) as proc:
        readings = {}
        for c in CONCURRENCIES:
            _bench(url, c, c, warmup=None)  # warm-up run, not measured
            before_s = process_cpu_s(proc.pid)
            summary = _bench(url, c, REQUESTS_PER_USER * c, warmup=0)
            cpu_s = process_cpu_s(proc.pid) - before_s
            tokens = summary["num_ok"] * OUTPUT_LEN
            readings[c] = Reading(
                1000 * cpu_s / tokens, summary["itl_ms"]["p50"], summary["output_tokens_per_s"]
            )
            print(f"{name} c={c}: {readings[c]}", flush=True)
        return readings


def render(results: dict[str, dict[int, Reading]]) -> str:
    rows = []
    for c in CONCURRENCIES:
        for name in TARGETS:
            r = results[name][c]
            rows.append([c, name, r.cpu_ms_per_token, r.itl_p50_ms, r.tokens_per_s])
    headers = ["concurrency", "server", "serving-process CPU ms/token", "ITL p50 ms", "tok/s"]
    return (
        f"Streaming, {INPUT_LEN}-token synthetic prompts, {OUTPUT_LEN} output tokens (EOS "
        f"ignored), {REQUESTS_PER_USER} requests per user after a warm-up, float32, eager. CPU "
        "is the serving process's own (HTTP, detokenization, SSE, vLLM's AsyncLLM client), "
        "not vLLM's engine-core process.\n\n" + markdown_table(headers, rows) + "\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--notes", default="", help="markdown appended to the section")
    args = parser.parse_args()
    model = resolve_model(None).path
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    commands = server_commands(model, port)
    results = {name: measure(name, commands[name], url) for name in TARGETS}
    body = render(results) + (f"\n{args.notes}\n" if args.notes else "")
    section = Section(
        "vllm-frontend-cpu", "vLLM engine: the serving process's CPU per token", body, "float32"
    )
    write_section(DOCS_OUT, section, get_machine_facts())
    print(body)


if __name__ == "__main__":
    main()
