"""Structured output's throughput cost at concurrency 8, and its conformance.

    python -m bench.structured_output --dtype float32            # full run, docs/benchmarks.md
    python -m bench.structured_output --dtype float32 --quick    # smoke run, bench/out/

One `armature serve` (the default model, CPU) on a free loopback port. Each round sends the
same chat requests (a prompt per schema below, seeded sampling) at concurrency 8 twice, in
alternating order:
  guided: response_format json_schema (strict) with the prompt's schema;
  free:   no response_format, EOS ignored and max_tokens set to the length of the same
          request's guided output (from the warm-up run of the guided arm),
so both arms generate the same number of tokens per request with the same batch dynamics and
differ only in the masks. Throughput = completion tokens over the arm's wall time; beside it,
the server's CPU seconds (user + system, all its threads and child processes) per completion
token, which a loaded machine does not skew the way it skews wall time. Every guided output
is parsed and validated against its schema (jsonschema). The arms alternate so that the
shared machine's drift hits both.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import time
from dataclasses import dataclass
from typing import Any

import httpx
import jsonschema
import psutil

from armature.runtime.ports import free_port
from armature.workload.measure import quantile
from bench.harness import BenchArgs, parse_args, publish
from bench.paths import REPO_ROOT
from bench.report import Section, markdown_table
from bench.serving import running_server

TARGET_COST = 0.15
CONCURRENCY = 8
SERVER_LOG = REPO_ROOT / "bench" / "out" / "structured_output_server.log"

# The schema set (also the integration test's): nested objects, enums, arrays, bounded numbers.
SCHEMAS: dict[str, dict[str, Any]] = {
    "nested": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 40},
            "address": {
                "type": "object",
                "properties": {
                    "street": {"type": "string", "maxLength": 60},
                    "city": {"type": "string", "maxLength": 40},
                    "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                },
                "required": ["street", "city", "zip"],
                "additionalProperties": False,
            },
        },
        "required": ["name", "address"],
        "additionalProperties": False,
    },
    "enums": {
        "type": "object",
        "properties": {
            "color": {"enum": ["red", "green", "blue"]},
            "size": {"type": "string", "enum": ["S", "M", "L", "XL"]},
            "in_stock": {"type": "boolean"},
        },
        "required": ["color", "size", "in_stock"],
        "additionalProperties": False,
    },
    "arrays": {
        "type": "object",
        "properties": {
            "tags": {
                "type": "array",
                "items": {"type": "string", "maxLength": 20},
                "minItems": 1,
                "maxItems": 4,
            },
            "scores": {
                "type": "array",
                "items": {"type": "integer", "minimum": 0, "maximum": 100},
                "maxItems": 5,
            },
        },
        "required": ["tags", "scores"],
        "additionalProperties": False,
    },
    "bounds": {
        "type": "object",
        "properties": {
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "ratio": {"type": "number", "minimum": 0, "maximum": 1},
            "count": {"type": "integer", "exclusiveMinimum": 0, "maximum": 1000},
            "temperature_c": {"type": "number", "minimum": -50, "maximum": 60},
        },
        "required": ["age", "ratio", "count", "temperature_c"],
        "additionalProperties": False,
    },
}
PROMPTS: dict[str, str] = {
    "nested": "Give a person's name and postal address as JSON.",
    "enums": "Describe a T-shirt in stock (color, size) as JSON.",
    "arrays": "List a few tags and scores for a blog post as JSON.",
    "bounds": "Give an age, a ratio, a count and a temperature as JSON.",
}


@dataclass
class ArmResult:
    wall_s: float
    num_tokens: int
    num_valid: int
    num_requests: int
    lengths: dict[int, int]  # request index -> completion tokens
    server_cpu_s: float = 0.0  # the server's CPU seconds over the arm

    @property
    def tokens_per_s(self) -> float:
        return self.num_tokens / self.wall_s

    @property
    def cpu_ms_per_token(self) -> float:
        return self.server_cpu_s * 1000 / self.num_tokens


def server_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid`, its threads and its child processes."""
    procs = [psutil.Process(pid)]
    procs += procs[0].children(recursive=True)
    return sum(t.user + t.system for t in (p.cpu_times() for p in procs))


def chat_body(model: str, schema_name: str, guided: bool, max_tokens: int, seed: int) -> Any:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPTS[schema_name]}],
        "max_tokens": max_tokens,
        "temperature": 0.7,
        "seed": seed,
    }
    if not guided:
        body["ignore_eos"] = True
    else:
        spec = {"name": schema_name, "schema": SCHEMAS[schema_name], "strict": True}
        body["response_format"] = {"type": "json_schema", "json_schema": spec}
    return body


def conforms(text: str, schema_name: str) -> bool:
    try:
        jsonschema.validate(json.loads(text), SCHEMAS[schema_name])
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


async def run_requests(
    url: str, model: str, guided: bool, max_tokens: dict[int, int], seed: int
) -> ArmResult:
    """Requests `max_tokens`' keys (index -> max_tokens) at concurrency 8, guided or free."""
    names = list(SCHEMAS)
    queue = sorted(max_tokens, reverse=True)
    result = ArmResult(0.0, 0, 0, len(max_tokens), {})

    async def worker(client: httpx.AsyncClient) -> None:
        while queue:
            i = queue.pop()
            name = names[i % len(names)]
            body = chat_body(model, name, guided, max_tokens[i], seed + i)
            response = await client.post(f"{url}/v1/chat/completions", json=body)
            response.raise_for_status()
            data = response.json()
            num = data["usage"]["completion_tokens"]
            result.num_tokens += num
            result.lengths[i] = num
            result.num_valid += conforms(data["choices"][0]["message"]["content"], name)

    async with httpx.AsyncClient(timeout=600) as client:
        started_s = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(CONCURRENCY)))
        result.wall_s = time.perf_counter() - started_s
    return result


def serve_command(args: BenchArgs, port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "armature.cli",
        "serve",
        "--model",
        str(args.model_dir),
        "--served-model-name",
        args.served_name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--device",
        "cpu",
        "--dtype",
        args.dtype_name,
        "--max-num-seqs",
        str(CONCURRENCY),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=None, help="default 3 (1 with --quick)")
    parser.add_argument("--requests", type=int, default=None, help="per arm and round")
    parser.add_argument("--max-tokens", type=int, default=64)
    args, ns = parse_args(parser.description or "", parser)
    rounds = ns.rounds or (1 if args.quick else 3)
    num_requests = ns.requests or (8 if args.quick else 24)
    port = free_port("127.0.0.1")
    url = f"http://127.0.0.1:{port}"
    SERVER_LOG.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    rows: list[list[object]] = []
    results: dict[bool, list[ArmResult]] = {False: [], True: []}
    caps = dict.fromkeys(range(num_requests), ns.max_tokens)
    with running_server(serve_command(args, port), url, SERVER_LOG, env) as server:
        model = args.served_name
        # warm-up, and the lengths the free arm copies
        lengths = asyncio.run(run_requests(url, model, True, caps, args.seed)).lengths
        for r in range(rounds):
            order = (False, True) if r % 2 == 0 else (True, False)
            for guided in order:
                arm_caps = caps if guided else lengths
                cpu_before_s = server_cpu_s(server.pid)
                arm = asyncio.run(run_requests(url, model, guided, arm_caps, args.seed))
                arm.server_cpu_s = server_cpu_s(server.pid) - cpu_before_s
                results[guided].append(arm)
                load = os.getloadavg()[0]
                label = "guided" if guided else "free"
                print(
                    f"round {r} {label}: {arm.tokens_per_s:.1f} tok/s, "
                    f"{arm.cpu_ms_per_token:.1f} server CPU ms/token, load {load:.1f}"
                )
                rows.append(
                    [
                        r,
                        label,
                        arm.num_requests,
                        arm.num_tokens,
                        arm.wall_s,
                        arm.tokens_per_s,
                        arm.cpu_ms_per_token,
                        f"{arm.num_valid}/{arm.num_requests}" if guided else "",
                        f"{load:.1f}",
                    ]
                )
    masks = re.search(
        r"grammar masks: (\d+) steps, (\d+) masks, ([\d.]+) s computing, ([\d.]+) s waited",
        SERVER_LOG.read_text(),
    )
    free_tps = quantile([a.tokens_per_s for a in results[False]], 0.5)
    guided_tps = quantile([a.tokens_per_s for a in results[True]], 0.5)
    cost = 1 - guided_tps / free_tps
    free_cpu = quantile([a.cpu_ms_per_token for a in results[False]], 0.5)
    guided_cpu = quantile([a.cpu_ms_per_token for a in results[True]], 0.5)
    num_valid = sum(a.num_valid for a in results[True])
    num_guided = sum(a.num_requests for a in results[True])
    table = markdown_table(
        [
            "round",
            "arm",
            "requests",
            "completion tokens",
            "wall s",
            "tok/s",
            "server CPU ms/token",
            "valid",
            "load 1m",
        ],
        rows,
    )
    verdict = "PASS" if cost <= TARGET_COST else "FAIL"
    body = (
        f"`armature serve` (default model, CPU, --max-num-seqs {CONCURRENCY}); chat requests "
        f"at concurrency {CONCURRENCY}, {num_requests} per arm and round, temperature 0.7 "
        f"(seeded); guided: max_tokens {ns.max_tokens}, free: EOS ignored, each request as long "
        f"as its guided twin of the warm-up run; {rounds} rounds with the arms' order "
        f"alternating. Schemas: {', '.join(SCHEMAS)} (bench/structured_output.py). Load 1m is "
        f"the machine's 1-minute load average after the arm (2 CPUs, shared).\n\n{table}\n\n"
        f"- {verdict}: guided {guided_tps:.1f} tok/s vs free {free_tps:.1f} tok/s (medians "
        f"of the rounds): cost {cost:.1%} (target <= {TARGET_COST:.0%})\n"
        f"- server CPU per completion token (medians of the rounds): guided {guided_cpu:.1f} "
        f"ms vs free {free_cpu:.1f} ms: {guided_cpu / free_cpu - 1:+.1%}\n"
        f"- conformance: {num_valid}/{num_guided} guided outputs parse and validate against "
        f"their schema\n"
        + (
            f"- masks (the server's log at exit, all arms and the warm-up): {masks[1]} steps "
            f"with guided rows, {masks[2]} masks; {masks[3]} s computing them on the mask "
            f"thread beside the forward pass, {masks[4]} s of it waited for after the forward "
            f"pass\n"
            if masks
            else "- masks: the server logged no mask times\n"
        )
    )
    print()
    print(body)
    publish(
        args,
        Section("structured_output", "Structured output: throughput cost", body, args.dtype_name),
    )


if __name__ == "__main__":
    main()
