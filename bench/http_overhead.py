"""Latency the HTTP server adds over calling the engine in-process.

    python -m bench.http_overhead            # full run, writes docs/benchmarks.md
    python -m bench.http_overhead --quick    # smoke run, writes bench/out/benchmarks.md
    python -m bench.http_overhead --engine mocker   # the serving stack alone

The same greedy request (a short text prompt, max_tokens 1 and 16, EOS ignored) goes
  direct: `AsyncEngine.generate` on an engine in this process, token ids pre-encoded;
  HTTP:   POST /v1/completions (non-streaming, text prompt, keep-alive connection) to a real
          `armature serve` subprocess on a free loopback port.
Both engines have the CLI's default config (bfloat16, CPU, same torch thread count) and are
warmed up first. Repetitions alternate which path goes first, and the added latency is the
per-pair difference, so slow drift on a shared machine cancels out. The HTTP side includes
the client, JSON, tokenizing the prompt and detokenizing the output: all that serving adds.

With `--engine mocker` both sides run the mocker at effectively infinite speed instead: each
path's time is then the serving stack's alone, and the pair's difference is not buried under
two prefills' variance on shared cores (the torch engine's p90 of the differences is
several ms).
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, replace

import torch

from armature.config.commands import ServeConfig
from armature.engines.api import Engine
from armature.engines.native.async_engine import AsyncEngine
from armature.engines.registry import get_kind
from armature.engines.spec import EngineSpec, resolve_engine_model
from armature.frontend.preprocess import Preprocessor
from armature.protocols.engine import EngineRequest
from armature.workload.measure import quantile
from bench.harness import BenchArgs, build_core, greedy, parse_args, publish
from bench.paths import REPO_ROOT
from bench.report import Section, markdown_table

PROMPT = "The capital of France is"
MOCKER_SPEEDUP = 1e9  # the mocker's steps take no time
TARGET_ADDED_P50_MS = 2.0
SERVER_LOG = REPO_ROOT / "bench" / "out" / "http_overhead_server.log"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    """`armature serve` as a subprocess on loopback, with the bench's dtype and threads."""

    def __init__(self, args: BenchArgs, port: int, engine: str):
        self.port = port
        SERVER_LOG.parent.mkdir(parents=True, exist_ok=True)
        self._log = SERVER_LOG.open("w")
        command = [
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
            "--dtype",
            args.dtype_name,
            "--device",
            "cpu",
        ]
        if engine == "mocker":
            command += ["--engine", "mocker", "--speedup-ratio", str(MOCKER_SPEEDUP)]
        env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}
        self.proc = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT, env=env)

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        deadline_s = time.monotonic() + timeout_s
        last_error: OSError | None = None
        while time.monotonic() < deadline_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}; see {SERVER_LOG}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    conn.close()
                    return
            except OSError as exc:  # not listening yet: retry until the deadline
                last_error = exc
            time.sleep(0.5)
        raise TimeoutError(
            f"server not ready after {timeout_s:.0f} s (last error: {last_error}); see {SERVER_LOG}"
        )

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


@dataclass(frozen=True)
class Sample:
    latency_ms: float
    text: str


def http_complete(conn: http.client.HTTPConnection, model: str, max_tokens: int) -> Sample:
    body = json.dumps(
        {
            "model": model,
            "prompt": PROMPT,
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
        }
    ).encode()
    started_s = time.perf_counter()
    conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    data = response.read()
    latency_ms = (time.perf_counter() - started_s) * 1e3
    assert response.status == 200, (response.status, data)
    reply = json.loads(data)
    assert reply["usage"]["completion_tokens"] == max_tokens, reply
    return Sample(latency_ms, reply["choices"][0]["text"])


async def direct_complete(
    engine: Engine, preprocessor: Preprocessor, prompt_ids: list[int], max_tokens: int
) -> Sample:
    request = EngineRequest(
        request_id=f"direct-{uuid.uuid4().hex}",
        prompt_token_ids=prompt_ids,
        sampling=greedy(max_tokens),
    )
    tokens: list[int] = []
    started_s = time.perf_counter()
    async for output in engine.generate(request):
        tokens.extend(output.new_token_ids)
    latency_ms = (time.perf_counter() - started_s) * 1e3
    assert len(tokens) == max_tokens, tokens
    return Sample(latency_ms, preprocessor.decode(tokens))


@dataclass(frozen=True)
class Pairs:
    max_tokens: int
    direct_ms: list[float]
    http_ms: list[float]
    same_text: bool

    @property
    def added_ms(self) -> list[float]:
        return [h - d for h, d in zip(self.http_ms, self.direct_ms, strict=True)]


def direct_engine(args: BenchArgs, kind: str) -> Engine:
    """The engine this process calls: the CLI's default config, or the mocker at infinite
    speed over the same model."""
    if kind == "torch":
        return AsyncEngine(build_core(args, max_num_seqs=64))
    config = ServeConfig()
    engine = replace(
        config.engine, model=str(args.model_dir), engine="mocker", speedup_ratio=MOCKER_SPEEDUP
    )
    spec = EngineSpec(
        engine=engine,
        kv=config.kv,
        transfer=config.transfer,
        model=resolve_engine_model(engine),
        worker_id="direct",
    )
    return get_kind("mocker").build(spec).engine


async def measure(
    args: BenchArgs, kind: str, server: Server, repeats: int, warmups: int
) -> list[Pairs]:
    preprocessor = Preprocessor(args.model_dir)
    prompt_ids = preprocessor.encode(PROMPT)
    engine = direct_engine(args, kind)
    engine.start()
    server.wait_ready()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    results = []
    try:
        for max_tokens in (1, 16):
            for _ in range(warmups):
                http_complete(conn, args.served_name, max_tokens)
                await direct_complete(engine, preprocessor, prompt_ids, max_tokens)
            direct, via_http, same = [], [], True
            for i in range(repeats):
                # blocking HTTP calls on the loop are fine: the local engine is idle meanwhile
                if i % 2 == 0:
                    d = await direct_complete(engine, preprocessor, prompt_ids, max_tokens)
                    h = http_complete(conn, args.served_name, max_tokens)
                else:
                    h = http_complete(conn, args.served_name, max_tokens)
                    d = await direct_complete(engine, preprocessor, prompt_ids, max_tokens)
                direct.append(d.latency_ms)
                via_http.append(h.latency_ms)
                same = same and d.text == h.text
            pairs = Pairs(max_tokens, direct, via_http, same)
            print(
                f"max_tokens={max_tokens:>2}: added p50 {quantile(pairs.added_ms, 0.5):.2f} ms",
                flush=True,
            )
            results.append(pairs)
    finally:
        conn.close()
        await engine.stop()
    return results


def render(results: list[Pairs], kind: str, repeats: int, warmups: int) -> str:
    rows: list[list[object]] = []
    checks = []
    for p in results:
        for label, values in (
            ("direct `generate`", p.direct_ms),
            ("HTTP `/v1/completions`", p.http_ms),
            ("**added (paired HTTP − direct)**", p.added_ms),
        ):
            rows.append([p.max_tokens, label, quantile(values, 0.5), quantile(values, 0.9)])
        added_p50 = quantile(p.added_ms, 0.5)
        medians_ms = quantile(p.http_ms, 0.5) - quantile(p.direct_ms, 0.5)
        verdict = "PASS" if added_p50 < TARGET_ADDED_P50_MS else "FAIL"
        checks.append(
            f"- {verdict}: max_tokens {p.max_tokens}: HTTP adds {added_p50:.2f} ms at p50 of the "
            f"paired differences (target < {TARGET_ADDED_P50_MS:.0f} ms; difference of the "
            f"medians: {medians_ms:.2f} ms); same text both ways: "
            + ("yes" if p.same_text else "NO" if kind == "torch" else "n/a (random tokens)")
        )
    table = markdown_table(["max_tokens", "path", "p50 ms", "p90 ms"], rows)
    return (
        f"Prompt {PROMPT!r}, greedy, EOS ignored; {repeats} paired repetitions after "
        f"{warmups} warm-ups per path, engine {kind}"
        f"{f' at speedup {MOCKER_SPEEDUP:g}' if kind == 'mocker' else ''}. Direct: "
        f"`generate` on an engine in this process with "
        f"pre-encoded token ids. HTTP: non-streaming POST /v1/completions with the text prompt "
        f"to an `armature serve` subprocess on loopback, keep-alive `http.client` "
        f"connection.\n\n{table}\n\n" + "\n".join(checks) + "\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=None, help="default 50 (6 with --quick)")
    parser.add_argument(
        "--engine", choices=["torch", "mocker"], default="torch", help="both sides' engine"
    )
    args, ns = parse_args(parser.description or "", parser)
    repeats = ns.repeats or (6 if args.quick else 50)
    warmups = 2 if args.quick else 5
    server = Server(args, _free_port(), ns.engine)  # loads while this process loads its own
    try:
        results = asyncio.run(measure(args, ns.engine, server, repeats, warmups))
    finally:
        server.stop()
    body = render(results, ns.engine, repeats, warmups)
    print()
    print(body)
    if ns.engine == "torch":
        section = Section("http_overhead", "HTTP overhead", body, args.dtype_name)
    else:
        title = "HTTP overhead: the serving stack alone (mocker)"
        section = Section("http_overhead-mocker", title, body, args.dtype_name)
    publish(args, section)


if __name__ == "__main__":
    main()
