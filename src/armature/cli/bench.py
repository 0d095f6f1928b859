"""`armature bench`: load against any OpenAI-compatible server, with a live progress line,
a summary table, and a report directory (JSON + Markdown). Exit 0 when every request
succeeded, 1 when some failed (results kept), 2 for a usage mistake or an unreachable
server."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

from armature.cli.options import CliError, HelpFormatter, arg_type, setup_logging
from armature.config import positive_float, positive_int

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser(
        "bench",
        help="load-test an OpenAI-compatible server (TTFT, ITL, throughput, goodput)",
        description="Load-test an OpenAI-compatible server: closed loop (--concurrency), open "
        "loop (--rate) or a trace's own schedule (--trace).",
        formatter_class=HelpFormatter,
    )
    bench.add_argument("--url", required=True, help="server root, e.g. http://127.0.0.1:8000")
    bench.add_argument("--model", default=None, help="model name (default: the server's first)")
    bench.add_argument("--endpoint", choices=["chat", "completions"], default="completions")
    shape = bench.add_mutually_exclusive_group()
    shape.add_argument(
        "--concurrency", type=arg_type(positive_int), default=None, help="closed loop"
    )
    shape.add_argument(
        "--rate", type=arg_type(positive_float), default=None, help="Poisson requests/s"
    )
    shape.add_argument(
        "--sweep-concurrency", type=_int_list, default=None, help="e.g. 1,4,16,64: one run each"
    )
    shape.add_argument(
        "--sweep-rate", type=_float_list, default=None, help="e.g. 1,2,4: one run each"
    )
    bench.add_argument("--trace", type=Path, default=None, help="Mooncake JSONL; its schedule")
    bench.add_argument(
        "--time-scale", type=arg_type(positive_float), default=1.0, help="trace times x"
    )
    bench.add_argument("--prompts", type=Path, default=None, help='JSONL of {"prompt": ...}')
    bench.add_argument(
        "--input-len", type=arg_type(positive_int), default=256, help="synthetic tokens"
    )
    bench.add_argument("--output-len", type=arg_type(positive_int), default=128, help="max_tokens")
    bench.add_argument("--len-spread", type=float, default=0.0, help="lengths +- this fraction")
    bench.add_argument("--prefix-groups", type=arg_type(positive_int), default=None)
    bench.add_argument(
        "--multi-turn",
        type=arg_type(positive_int),
        default=None,
        help="sessions of this many turns, each resending the history (--num-requests "
        "counts sessions; --input-len is the length of one user turn)",
    )
    bench.add_argument("--prefix-ratio", type=float, default=0.5)
    bench.add_argument("--num-requests", type=arg_type(positive_int), default=100)
    bench.add_argument(
        "--duration-s", type=arg_type(positive_float), default=None, help="stop sending"
    )
    bench.add_argument("--warmup", type=int, default=2, help="requests sent first, not counted")
    bench.add_argument("--ignore-eos", action="store_true", help="ask for exactly max_tokens")
    bench.add_argument("--slo-ttft-ms", type=arg_type(positive_float), default=None)
    bench.add_argument("--slo-itl-ms", type=arg_type(positive_float), default=None)
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument(
        "--timeout-s", type=arg_type(positive_float), default=600.0, help="per request"
    )
    bench.add_argument(
        "--tokenizer",
        default=None,
        help="local HF directory to synthesize prompts and count tokens (default: the "
        "embedded SmolLM2 tokenizer)",
    )
    bench.add_argument("--report", type=Path, default=None, help="write JSON + Markdown here")
    bench.add_argument(
        "--log-level", choices=["debug", "info", "warning", "error"], default="warning"
    )


def _int_list(text: str) -> list[int]:
    return [int(positive_int(part)) for part in text.split(",") if part.strip()]


def _float_list(text: str) -> list[float]:
    return [float(positive_float(part)) for part in text.split(",") if part.strip()]


def _tokenizer(spec: str | None) -> Any:
    from transformers import AutoTokenizer

    from armature.model.source import ModelSourceError, resolve_model

    try:
        path = resolve_model(spec).path
    except ModelSourceError as exc:
        raise CliError(str(exc)) from None
    return AutoTokenizer.from_pretrained(str(path))


def _requests(args: argparse.Namespace, tokenizer: Any) -> list[Any]:
    from armature.bench import workloads
    from armature.bench.prompts import TextSynth

    total = args.num_requests + max(0, args.warmup)
    try:
        if args.prompts is not None:
            items = workloads.from_prompts_file(args.prompts, args.output_len)
            return [items[i % len(items)] for i in range(total)]
        synth = TextSynth(tokenizer, args.seed)
        if args.trace is not None:
            return workloads.from_trace(synth, args.trace, total, args.time_scale)
        if args.multi_turn is not None:
            return workloads.multi_turn(
                synth, total, args.multi_turn, args.input_len, args.output_len, args.seed
            )
        if args.prefix_groups is not None:
            return workloads.prefix_groups(
                synth,
                total,
                args.input_len,
                args.output_len,
                args.prefix_groups,
                args.prefix_ratio,
                args.seed,
            )
        return workloads.synthetic(
            synth, total, args.input_len, args.output_len, args.len_spread, args.seed
        )
    except workloads.WorkloadError as exc:
        raise CliError(str(exc)) from None


class _Progress:
    def __init__(self, total: int, label: str):
        self.total = total
        self.label = label
        self.done = 0
        self.errors = 0
        self.started = time.perf_counter()
        self.last_print = 0.0
        self.tty = sys.stderr.isatty()

    def update(self, record: Any) -> None:
        self.done += 1
        self.errors += record.error is not None
        now = time.perf_counter()
        if now - self.last_print >= (0.25 if self.tty else 5.0) or self.done == self.total:
            self.last_print = now
            elapsed = now - self.started
            line = (
                f"[bench {self.label}] {self.done}/{self.total} done, {self.errors} errors, "
                f"{self.done / max(elapsed, 1e-9):.1f} req/s, {elapsed:.0f} s"
            )
            print(
                ("\r" + line) if self.tty else line, end="" if self.tty else "\n", file=sys.stderr
            )

    def close(self) -> None:
        if self.tty:
            print(file=sys.stderr)


async def _first_model(client: Any, url: str) -> str:
    import httpx

    try:
        response = await client.get(f"{url}/v1/models")
    except httpx.HTTPError as exc:
        raise CliError(f"cannot reach {url}: {exc}") from None
    if response.status_code != 200:
        raise CliError(f"{url}/v1/models answered {response.status_code}")
    try:
        return str(response.json()["data"][0]["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        raise CliError(f"{url}/v1/models lists no model") from None


def _shapes(args: argparse.Namespace) -> list[tuple[str, Any]]:
    from armature.bench.runner import LoadShape

    if args.sweep_concurrency:
        return [(f"c={c}", LoadShape("closed", concurrency=c)) for c in args.sweep_concurrency]
    if args.sweep_rate:
        return [(f"rate={r:g}", LoadShape("poisson", rate_rps=r)) for r in args.sweep_rate]
    if args.trace is not None:
        return [("trace", LoadShape("trace"))]
    if args.rate is not None:
        return [(f"rate={args.rate:g}", LoadShape("poisson", rate_rps=args.rate))]
    concurrency = args.concurrency or 1
    return [(f"c={concurrency}", LoadShape("closed", concurrency=concurrency))]


async def _run(args: argparse.Namespace, requests: list[Any], count: Any) -> int:
    import httpx

    from armature.bench.client import count_chunk_tokens, send
    from armature.bench.http import HttpPool
    from armature.bench.report import pareto_table, summary_table, write_report
    from armature.bench.runner import run_load
    from armature.bench.stats import summarize

    url = args.url.rstrip("/")
    timeout = httpx.Timeout(args.timeout_s, connect=10.0)
    results = []
    failed = 0
    try:
        pool = HttpPool(url, read_timeout_s=args.timeout_s)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    async with httpx.AsyncClient(timeout=timeout) as client:
        model = args.model or await _first_model(client, url)

        async def one(request: Any) -> Any:
            ignore_eos = args.ignore_eos
            return await send(pool, args.endpoint, model, request, ignore_eos=ignore_eos)

        for label, shape in _shapes(args):
            measured = requests[max(0, args.warmup) :]
            progress = _Progress(sum(1 + len(r.followups) for r in measured), label)
            cpu_started = time.process_time()
            try:
                records, wall_s = await run_load(
                    requests,
                    shape,
                    one,
                    num_warmup=max(0, args.warmup),
                    duration_s=args.duration_s,
                    on_record=progress.update,
                    seed=args.seed,
                )
            finally:
                progress.close()
            client_cpu = 100 * (time.process_time() - cpu_started) / max(wall_s, 1e-9)
            count_chunk_tokens(records, count)
            summary = summarize(records, wall_s, args.slo_ttft_ms, args.slo_itl_ms, client_cpu)
            results.append((label, shape, summary, records))
            print(f"== {label}\n{summary_table(summary)}")
            if summary.errors:
                failed += summary.num_requests - summary.num_ok
                first = next(r for r in records if r.error is not None)
                print(
                    f"armature bench: {summary.num_requests - summary.num_ok} requests failed "
                    f"at {label} (first: {first.error} {first.error_detail})",
                    file=sys.stderr,
                )
    pool.close()
    if len(results) > 1:
        print("== sweep\n" + pareto_table([(label, s) for label, _, s, _ in results]))
    if args.report is not None:
        settings = {
            "url": url,
            "model": model,
            "endpoint": args.endpoint,
            "trace": str(args.trace) if args.trace else None,
            "num_requests": args.num_requests,
            "ignore_eos": args.ignore_eos,
            "seed": args.seed,
            "slo_ttft_ms": args.slo_ttft_ms,
            "slo_itl_ms": args.slo_itl_ms,
        }
        for path in write_report(args.report, results, settings):
            print(f"wrote {path}")
    return 1 if failed else 0


def run(args: argparse.Namespace) -> int:
    if args.trace is not None and (args.rate or args.sweep_rate or args.concurrency):
        raise CliError("--trace brings its own schedule; drop --rate/--concurrency/sweeps")
    if args.warmup < 0:
        raise CliError("--warmup must be >= 0")
    setup_logging(args.log_level)
    tokenizer = _tokenizer(args.tokenizer)

    def count(texts: list[str]) -> list[int]:
        return [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]

    requests = _requests(args, tokenizer)
    return asyncio.run(_run(args, requests, count))
