"""`armature bench`: load against any OpenAI-compatible server, with a live progress line,
a summary table, and a report directory (JSON + Markdown). Exit 0 when every request
succeeded, 1 when some failed (results kept), 2 for a usage mistake, an unreachable server or
a --model it does not serve: all found before the first request is sent."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

from armature.cli.bench_checks import (
    DEFAULT_INPUT_LEN,
    DEFAULT_OUTPUT_LEN,
    DEFAULT_PREFIX_RATIO,
    MAX_CONCURRENCY,
    MAX_NUM_REQUESTS,
    MAX_TURNS,
    MAX_WARMUP,
    check_context,
    check_report_dir,
    check_workload,
    check_workload_flags,
    concurrency,
    len_spread,
    list_of,
    sequence_tokens,
    server_url,
)
from armature.cli.options import CliError, HelpFormatter, arg_type, setup_logging
from armature.config import fraction, positive_float, positive_int
from armature.config.values import int_between

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser(
        "bench",
        help="load-test an OpenAI-compatible server (TTFT, ITL, throughput, goodput)",
        description="Load-test an OpenAI-compatible server: closed loop (--concurrency), open "
        "loop (--rate) or a trace's own schedule (--trace).",
        formatter_class=HelpFormatter,
    )
    bench.add_argument(
        "--url",
        required=True,
        type=arg_type(server_url),
        help="server root, e.g. http://127.0.0.1:8000",
    )
    bench.add_argument(
        "--api-key",
        default=None,
        help="sent as 'Authorization: Bearer KEY' to a server with API keys (default: the env "
        f"{API_KEY_ENV})",
    )
    bench.add_argument("--model", default=None, help="model name (default: the server's first)")
    bench.add_argument("--endpoint", choices=["chat", "completions"], default="completions")
    _add_schedule_args(bench)
    _add_workload_args(bench)
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
    bench.add_argument(
        "--report", type=Path, default=None, help="a directory: report.json, report.md, plots"
    )
    bench.add_argument(
        "--log-level", choices=["debug", "info", "warning", "error"], default="warning"
    )


def _add_schedule_args(bench: argparse.ArgumentParser) -> None:
    """How requests are sent: a closed or open loop (or a sweep of either), or a trace's
    schedule."""
    shape = bench.add_mutually_exclusive_group()
    shape.add_argument(
        "--concurrency", type=arg_type(concurrency), default=None, help="closed loop"
    )
    shape.add_argument(
        "--rate", type=arg_type(positive_float), default=None, help="Poisson requests/s"
    )
    shape.add_argument(
        "--sweep-concurrency",
        type=arg_type(list_of(concurrency, f"integers in 1..{MAX_CONCURRENCY}")),
        default=None,
        help="e.g. 1,4,16,64: one run each",
    )
    shape.add_argument(
        "--sweep-rate",
        type=arg_type(list_of(positive_float, "positive numbers")),
        default=None,
        help="e.g. 1,2,4: one run each",
    )
    bench.add_argument("--trace", type=Path, default=None, help="Mooncake JSONL; its schedule")
    bench.add_argument(
        "--time-scale", type=arg_type(positive_float), default=1.0, help="trace times x"
    )


def _add_workload_args(bench: argparse.ArgumentParser) -> None:
    """What is sent: a prompts file or synthetic prompts (lengths, prefixes, sessions), how
    many, and for how long."""
    bench.add_argument("--prompts", type=Path, default=None, help='JSONL of {"prompt": ...}')
    bench.add_argument(
        "--input-len",
        type=arg_type(sequence_tokens),
        default=DEFAULT_INPUT_LEN,
        help="synthetic tokens",
    )
    bench.add_argument(
        "--output-len",
        type=arg_type(sequence_tokens),
        default=DEFAULT_OUTPUT_LEN,
        help="max_tokens",
    )
    bench.add_argument(
        "--len-spread", type=arg_type(len_spread), default=0.0, help="lengths +- this fraction"
    )
    bench.add_argument("--prefix-groups", type=arg_type(positive_int), default=None)
    bench.add_argument(
        "--multi-turn",
        type=arg_type(int_between(1, MAX_TURNS)),
        default=None,
        help="sessions of this many turns, each resending the history (--num-requests "
        "counts sessions; --input-len is the length of one user turn)",
    )
    bench.add_argument("--prefix-ratio", type=arg_type(fraction), default=DEFAULT_PREFIX_RATIO)
    bench.add_argument(
        "--num-requests", type=arg_type(int_between(1, MAX_NUM_REQUESTS)), default=100
    )
    bench.add_argument(
        "--duration-s", type=arg_type(positive_float), default=None, help="stop sending"
    )
    bench.add_argument(
        "--warmup",
        type=arg_type(int_between(0, MAX_WARMUP)),
        default=2,
        help="requests sent first, not counted",
    )


def _tokenizer(spec: str | None) -> Any:
    from armature.errors import ConfigError
    from armature.frontend.preprocess import load_tokenizer
    from armature.model.source import ModelSourceError, resolve_model

    if spec is not None and Path(spec).expanduser().is_dir():
        path = Path(spec).expanduser()  # a tokenizer's own files need no model config
    else:
        try:
            path = resolve_model(spec).path
        except ModelSourceError as exc:
            raise CliError(f"--tokenizer: {exc}" if spec is not None else str(exc)) from None
    try:
        return load_tokenizer(path)
    except ConfigError as exc:
        raise CliError(f"--tokenizer: {exc}") from None


def _read_files(args: argparse.Namespace) -> tuple[list[Any] | None, list[Any] | None]:
    """(the --prompts file's requests, the --trace's requests): each None when not given."""
    from armature.bench import workloads

    total = args.num_requests + args.warmup
    try:
        if args.prompts is not None:
            items = workloads.from_prompts_file(args.prompts, args.output_len)
            return [items[i % len(items)] for i in range(total)], None
        if args.trace is not None:
            return None, workloads.read_trace(args.trace, total, args.time_scale)
    except workloads.WorkloadError as exc:
        raise CliError(str(exc)) from None
    return None, None


def _requests(
    args: argparse.Namespace, tokenizer: Any, prompts: list[Any] | None, trace: list[Any] | None
) -> list[Any]:
    from armature.bench import workloads
    from armature.bench.prompts import TextSynth

    if prompts is not None:
        return prompts
    total = args.num_requests + args.warmup
    try:
        synth = TextSynth(tokenizer, args.seed)
    except ValueError as exc:
        raise CliError(f"--tokenizer {args.tokenizer}: {exc}") from None
    try:
        if trace is not None:
            return workloads.from_trace(synth, trace)
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


API_KEY_ENV = "ARMATURE_BENCH_API_KEY"


def get_api_key(args: argparse.Namespace) -> str | None:
    """--api-key, else its variable; CliError for a key no header can carry."""
    key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV)
    if key is None:
        return None
    if not key or key != key.strip() or not all(" " < c <= "~" for c in key):
        raise CliError("--api-key must be printable ASCII without spaces")
    return str(key)


async def _get_model(args: argparse.Namespace) -> tuple[str, int | None]:
    """The model to ask for, checked against what the server lists, and the context it lists
    for it (None: none listed): CliError when the server cannot be reached or does not serve
    --model."""
    import httpx

    from armature.bench.server import (
        ModelListError,
        ServerCheckError,
        choose_model,
        get_served_models,
    )

    timeout = httpx.Timeout(args.timeout_s, connect=10.0)
    key = get_api_key(args)
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    try:
        async with httpx.AsyncClient(timeout=timeout, headers=headers) as client:
            try:
                served = await get_served_models(client, args.url)
            except ModelListError as exc:
                if args.model is None:
                    raise
                # a server without a model listing: its answers to the run say the rest
                print(f"armature bench: note: {exc}; --model not checked", file=sys.stderr)
                return str(args.model), None
        model = choose_model(args.url, list(served), args.model)
        return model, served[model]
    except ServerCheckError as exc:
        raise CliError(str(exc)) from None


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
    clients = args.concurrency or 1
    return [(f"c={clients}", LoadShape("closed", concurrency=clients))]


async def _run(args: argparse.Namespace, model: str, requests: list[Any], count: Any) -> int:
    from armature.bench.client import count_chunk_tokens, send
    from armature.bench.http import HttpPool
    from armature.bench.report import pareto_table, summary_table, write_report
    from armature.bench.runner import run_load
    from armature.bench.stats import summarize

    url = args.url
    results = []
    failed = 0
    try:
        pool = HttpPool(url, read_timeout_s=args.timeout_s, api_key=get_api_key(args))
    except ValueError as exc:
        raise CliError(str(exc)) from None

    async def one(request: Any) -> Any:
        return await send(pool, args.endpoint, model, request, ignore_eos=args.ignore_eos)

    for label, shape in _shapes(args):
        measured = requests[args.warmup :]
        progress = _Progress(sum(1 + len(r.followups) for r in measured), label)
        cpu_started = [time.process_time()]  # reset when the measured requests start

        def measuring(cpu_started: list[float] = cpu_started) -> None:
            cpu_started[0] = time.process_time()

        try:
            records, wall_s = await run_load(
                requests,
                shape,
                one,
                num_warmup=args.warmup,
                duration_s=args.duration_s,
                on_record=progress.update,
                on_start=measuring,
                seed=args.seed,
            )
        finally:
            progress.close()
        client_cpu = 100 * (time.process_time() - cpu_started[0]) / max(wall_s, 1e-9)
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
        try:
            written = write_report(args.report, results, settings)
        except OSError as exc:  # changed since the check before the run
            raise CliError(
                f"--report {args.report}: cannot write the report ({exc.strerror or exc}); "
                "the tables above are the run's results"
            ) from None
        for path in written:
            print(f"wrote {path}")
    return 1 if failed else 0


def run(args: argparse.Namespace) -> int:
    """Every check that can fail runs before the first request: the flags, the report
    directory, the input files, the tokenizer, then the server (reachable, serving
    --model)."""
    if args.trace is not None and (
        args.rate or args.sweep_rate or args.concurrency or args.sweep_concurrency
    ):
        raise CliError("--trace brings its own schedule; drop --rate/--concurrency/sweeps")
    if args.prompts is not None and (args.trace or args.multi_turn or args.prefix_groups):
        raise CliError(
            "--prompts brings its own prompts; drop --trace/--multi-turn/--prefix-groups"
        )
    check_workload_flags(args)
    setup_logging(args.log_level)
    if args.report is not None:
        check_report_dir(args.report)
    prompts, trace = _read_files(args)
    check_workload(args, trace)
    tokenizer = _tokenizer(args.tokenizer)
    model, max_model_len = asyncio.run(_get_model(args))
    check_context(args, max_model_len, trace)

    def count(texts: list[str]) -> list[int]:
        return [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]

    requests = _requests(args, tokenizer, prompts, trace)
    return asyncio.run(_run(args, model, requests, count))
