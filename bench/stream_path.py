"""CPU per streamed token of the frontend's stream path, in one process, without a network.

`OpenAIService.stream` (engine outputs -> detokenizer -> SSE events, with the latency
metrics) over a scripted router that yields each request's 64 tokens as engine outputs of a
few tokens each, the way the request plane hands a stream what arrived together. 32 requests
at a time, the default model's tokenizer, completions without logprobs or stop strings. CPU
from this process's clock; the request plane, HTTP and the socket writes are not in it (see
bench/serving_cpu.py for the whole stack). Repeated, with the spread.

    python -m bench.stream_path             # writes its section of docs/benchmarks.md
    python -m bench.stream_path --no-write  # prints only
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from collections.abc import AsyncGenerator

from tokenizers import Tokenizer

from armature.frontend.detokenizer import IncrementalDetokenizer
from armature.frontend.jobs import Candidate, Job
from armature.frontend.metrics import FrontendMetrics
from armature.frontend.service import OpenAIService
from armature.model.source import resolve_model
from armature.protocols.engine import (
    EngineLoad,
    EngineOutput,
    EngineRequest,
    FinishReason,
    SamplingParams,
)
from bench.paths import results_path
from bench.report import Section, get_machine_facts, markdown_table, write_section

NUM_TOKENS = 64
CONCURRENCY = 32
PROMPT_IDS = [1, 2, 3]


class ScriptedRouter:
    """Yields `tokens` as engine outputs of `tokens_per_output` each, the first carrying the
    prompt's count; one loop turn between outputs."""

    def __init__(self, tokens: list[int], tokens_per_output: int):
        self.tokens = tokens
        self.tokens_per_output = tokens_per_output

    async def generate(
        self, request: EngineRequest, target: object, group: object
    ) -> AsyncGenerator[EngineOutput, None]:
        for start in range(0, len(self.tokens), self.tokens_per_output):
            await asyncio.sleep(0)
            end = min(start + self.tokens_per_output, len(self.tokens))
            yield EngineOutput(
                request_id=request.request_id,
                new_token_ids=self.tokens[start:end],
                finish_reason=FinishReason.LENGTH if end == len(self.tokens) else None,
                num_prompt_tokens=len(PROMPT_IDS) if start == 0 else 0,
            )


def _job(tokenizer: Tokenizer, i: int) -> Job:
    request_id = f"cmpl-{i}"
    request = EngineRequest(
        request_id=request_id,
        prompt_token_ids=PROMPT_IDS,
        sampling=SamplingParams(max_tokens=NUM_TOKENS),
    )
    candidate = Candidate(request, IncrementalDetokenizer(tokenizer, PROMPT_IDS))
    return Job("completion", request_id, [candidate], True, False, False, model_name="m")


async def _run(service: OpenAIService, tokenizer: Tokenizer, num_requests: int) -> int:
    """Stream `num_requests` jobs, CONCURRENCY at a time; returns the events sent."""

    async def one(i: int) -> int:
        body = b"".join([chunk async for chunk in service.stream(_job(tokenizer, i))])
        return body.count(b"data: ") - 1  # less [DONE]

    events = 0
    for start in range(0, num_requests, CONCURRENCY):
        batch = range(start, min(start + CONCURRENCY, num_requests))
        events += sum(await asyncio.gather(*(one(i) for i in batch)))
    return events


def _plain_tokens(tokenizer: Tokenizer, num: int) -> list[int]:
    """`num` random ids that each decode, alone, to whole characters (one event each)."""
    rng = random.Random(0)
    tokens: list[int] = []
    while len(tokens) < num:
        token = rng.randrange(tokenizer.get_vocab_size())
        text = tokenizer.decode([token], skip_special_tokens=True)
        if text and "\ufffd" not in text:
            tokens.append(token)
    return tokens


def measure(tokenizer: Tokenizer, tokens_per_output: int, num_requests: int) -> float:
    """CPU microseconds per streamed token."""
    tokens = _plain_tokens(tokenizer, NUM_TOKENS)
    router = ScriptedRouter(tokens, tokens_per_output)
    metrics = FrontendMetrics("m", lambda: EngineLoad.idle(1))
    service = OpenAIService(router, None, metrics)
    asyncio.run(_run(service, tokenizer, CONCURRENCY))  # warm up
    started_s = time.process_time()
    events = asyncio.run(_run(service, tokenizer, num_requests))
    cpu_s = time.process_time() - started_s
    if events != num_requests * NUM_TOKENS:
        raise RuntimeError(f"{events} events for {num_requests * NUM_TOKENS} tokens")
    return cpu_s / events * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="requests per run")
    parser.add_argument("--repeats", type=int, default=5, help="runs per row")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    tokenizer = Tokenizer.from_file(str(resolve_model(None).path / "tokenizer.json"))
    rows = []
    for tokens_per_output in (1, 5):
        runs = [measure(tokenizer, tokens_per_output, args.requests) for _ in range(args.repeats)]
        rows.append(
            [
                str(tokens_per_output),
                f"{statistics.median(runs):.2f}",
                f"{min(runs):.2f}-{max(runs):.2f}",
            ]
        )
    headers = ["tokens per engine output", "CPU us per token (median)", "range"]
    table = markdown_table(headers, rows)
    print(table, flush=True)
    if args.no_write:
        return
    body = (
        f"`OpenAIService.stream` in one process over a scripted router: {args.requests} "
        f"completions of {NUM_TOKENS} tokens, {CONCURRENCY} at a time, the default model's "
        "tokenizer, no logprobs or stop strings; one SSE event per token. CPU from the "
        f"process clock, {args.repeats} runs per row. No request plane, HTTP or socket "
        "writes (bench/serving_cpu.py has the whole stack).\n\n" + table + "\n"
    )
    section = Section("stream_path", "Frontend stream path: CPU per token", body, "n/a")
    write_section(results_path(False), section, get_machine_facts())


if __name__ == "__main__":
    main()
