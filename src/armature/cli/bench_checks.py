"""`armature bench`'s flags' bounds and parsers, and the checks of a run before it sends
anything: a workload with nothing to measure or too large to synthesize, a schedule of days, a
report directory that cannot be written. Each mistake is a one-line CliError or ConfigError."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from armature.cli.options import CliError, is_given
from armature.cli.paths import make_dir
from armature.config.values import http_url, int_between
from armature.errors import ConfigError

__all__ = [
    "DEFAULT_INPUT_LEN",
    "DEFAULT_OUTPUT_LEN",
    "DEFAULT_PREFIX_RATIO",
    "MAX_CONCURRENCY",
    "MAX_NUM_REQUESTS",
    "MAX_TURNS",
    "MAX_WARMUP",
    "check_context",
    "check_report_dir",
    "check_workload",
    "check_workload_flags",
    "concurrency",
    "len_spread",
    "list_of",
    "sequence_tokens",
    "server_url",
]

# The flags' upper bounds: past them a value is a typo, not a benchmark, and would cost
# minutes of work or gigabytes before the first request.
MAX_NUM_REQUESTS = 1_000_000
# defaults a flag is told apart from (given where its workload does not read it: an error)
DEFAULT_INPUT_LEN = 256
DEFAULT_OUTPUT_LEN = 128
DEFAULT_PREFIX_RATIO = 0.5
MAX_WARMUP = 10_000  # sent one at a time
MAX_SEQUENCE_TOKENS = 1 << 20  # --input-len, --output-len: a long-context model's window
MAX_TURNS = 1_000
MAX_CONCURRENCY = 100_000
# prompt tokens synthesized before the first request (about 30 s and 300 MB of text)
MAX_WORKLOAD_TOKENS = 50_000_000
# The longest a schedule (a trace's arrivals, --rate's) may keep a run sending: longer is a
# bad timestamp or a mistyped rate. Not `armature replay`'s bound, which counts fleet samples
# of simulated time; a bench waits in real time.
MAX_SCHEDULE_S = 7 * 24 * 3600.0


def server_url(text: str) -> str:
    """An http(s) server root that httpx can ask (a valid host), without its trailing '/'."""
    import httpx

    url = http_url(text)
    try:
        parts = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise ConfigError(f"not a valid URL: {url!r} ({exc})") from None
    if parts.query or parts.fragment:
        raise ConfigError(f"give the server's root, without a query or fragment: {url!r}")
    return url.rstrip("/")


concurrency = int_between(1, MAX_CONCURRENCY)
sequence_tokens = int_between(1, MAX_SEQUENCE_TOKENS)


def len_spread(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value < 1:  # NaN too
        raise ConfigError(f"expected a fraction of the mean in [0, 1), got {text!r}")
    return value


def list_of(parse: Any, what: str) -> Any:
    """A parser of comma-separated values, each read by `parse` (`what` names them)."""

    def parse_list(text: str) -> list[Any]:
        parts = [part.strip() for part in text.split(",")]
        try:
            if not all(parts):
                raise ConfigError("a value left out")
            return [parse(part) for part in parts]
        except ConfigError:
            raise ConfigError(f"expected comma-separated {what}, got {text!r}") from None

    return parse_list


def check_workload_flags(args: argparse.Namespace) -> None:
    """CliError for a workload flag the chosen workload does not read (after the --trace and
    --prompts checks): each workload takes its own, and one given to another did nothing."""
    if is_given(args, "time_scale", 1.0) and args.trace is None:
        raise CliError("--time-scale is for --trace (it scales the trace's arrival times)")
    if args.trace is not None and (args.multi_turn or args.prefix_groups):
        raise CliError("--trace brings its own prompts; drop --multi-turn/--prefix-groups")
    if args.multi_turn is not None and args.prefix_groups is not None:
        raise CliError("give one of --multi-turn and --prefix-groups")
    if is_given(args, "prefix_ratio", DEFAULT_PREFIX_RATIO) and args.prefix_groups is None:
        raise CliError("--prefix-ratio is for --prefix-groups (the share of a prompt shared)")
    plain = not (args.trace or args.prompts or args.multi_turn or args.prefix_groups)
    if args.len_spread and not plain:
        raise CliError(
            "--len-spread is for synthetic prompts of their own (not --trace, --prompts, "
            "--multi-turn or --prefix-groups)"
        )
    if is_given(args, "input_len", DEFAULT_INPUT_LEN) and (args.trace or args.prompts):
        raise CliError("--input-len is for synthetic prompts (--trace and --prompts bring theirs)")
    if is_given(args, "output_len", DEFAULT_OUTPUT_LEN) and args.trace:
        raise CliError("--output-len is for prompts without their own (the trace's requests have)")


def check_context(
    args: argparse.Namespace, max_model_len: int | None, trace: list[Any] | None
) -> None:
    """CliError when the longest request the workload sends cannot fit the context the server
    lists for the model (None: it lists none), before a run whose requests would all fail; a
    trace is refused when none of its requests fits, and noted when some do not."""
    if max_model_len is None or args.prompts is not None:
        return
    if trace is not None:
        over = sum(1 for r in trace if r.input_length + r.output_length > max_model_len)
        if over == len(trace):
            raise CliError(
                f"every request of trace {args.trace} is longer than the {max_model_len:,}-token"
                " context the server lists for the model (max_model_len)"
            )
        if over:
            print(
                f"armature bench: note: {over:,} of the trace's {len(trace):,} requests are "
                f"longer than the {max_model_len:,}-token context the server lists for the "
                "model: they will fail (a 400 each)",
                file=sys.stderr,
            )
        return
    turns = args.multi_turn or 1
    input_len = math.ceil(args.input_len * (1.0 + args.len_spread))
    output_len = math.ceil(args.output_len * (1.0 + args.len_spread))
    # a session's last turn resends every turn before it, answers included
    longest = turns * input_len + turns * output_len
    what = (
        f"--input-len {args.input_len} + --output-len {args.output_len}"
        + (f" over {turns} turns" if turns > 1 else "")
        + (f" (+{args.len_spread:g})" if args.len_spread else "")
    )
    if longest > max_model_len:
        raise CliError(
            f"{what} is {longest:,} tokens, more than the {max_model_len:,}-token context "
            "the server lists for the model (max_model_len)"
        )


def check_workload(args: argparse.Namespace, trace: list[Any] | None) -> None:
    """CliError for a workload with nothing to measure, one that takes minutes to synthesize,
    or a schedule that keeps the run sending for days."""
    if trace is not None:
        if len(trace) <= args.warmup:
            raise CliError(
                f"trace {args.trace} has {len(trace)} requests, none left to measure after "
                f"--warmup {args.warmup}"
                if trace
                else f"trace {args.trace} has no requests"
            )
        first, last = trace[args.warmup].arrival_ms, trace[-1].arrival_ms
        span_s = (last - first) / 1000 if math.isfinite(last) else math.inf
        what = f"trace {args.trace}'s arrivals span {span_s:.3g} s"
        _check_wait(args, span_s, what, "compress them with --time-scale below 1")
        num_tokens = sum(r.input_length for r in trace)
    elif args.prompts is not None:
        num_tokens = 0
    else:
        num_tokens = (args.num_requests + args.warmup) * args.input_len * (args.multi_turn or 1)
    if num_tokens > MAX_WORKLOAD_TOKENS:
        raise CliError(
            f"the workload is {num_tokens:,} prompt tokens to synthesize before the first "
            f"request, more than {MAX_WORKLOAD_TOKENS:,}: lower --num-requests or --input-len"
        )
    for rate in args.sweep_rate or ([args.rate] if args.rate else []):
        span_s = (args.num_requests - 1) / rate
        what = f"--rate {rate:g} spreads the requests over ~{span_s:.3g} s"
        _check_wait(args, span_s, what, "raise the rate")


def _check_wait(args: argparse.Namespace, span_s: float, what: str, hint: str) -> None:
    """CliError `what` ... `hint` when a schedule of `span_s` keeps the run sending (up to
    --duration-s) for longer than MAX_SCHEDULE_S."""
    if min(span_s, args.duration_s or math.inf) > MAX_SCHEDULE_S:
        raise CliError(
            f"{what}, more than a run may take ({MAX_SCHEDULE_S / 86400:g} days): {hint}, "
            "or stop sending after --duration-s"
        )


def check_report_dir(path: Path) -> None:
    """--report can be made a directory and written; checked before the run (the directories
    made for the check are removed again: the report makes them once the run is done)."""
    try:
        if path.exists() and not path.is_dir():
            raise CliError(
                f"--report {path} is a file; give a directory (the report is report.json, "
                "report.md and plots)"
            )
        missing = [p for p in (path, *path.parents) if not p.exists()]  # deepest first
    except OSError as exc:  # e.g. a name too long
        raise CliError(f"--report {path}: {exc.strerror}") from None
    try:
        make_dir(path, "--report")
    finally:
        for made in missing:
            if made.is_dir():
                made.rmdir()
