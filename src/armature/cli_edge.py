"""The HTTP edge's flags (API keys, request size), shared by `serve` and `frontend`."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from armature.cli_args import (
    CliError,
    non_negative_float,
    non_negative_int,
    parse_bytes,
    positive_float,
    positive_int,
)

if TYPE_CHECKING:
    from armature.frontend.admission import Overload
    from armature.frontend.auth import ApiKeys

__all__ = ["add_edge_args", "api_keys_from", "overload_from"]


def fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in 0..1, got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in 0..1, got {text!r}")
    return value


def overload_from(args: argparse.Namespace) -> Overload:
    from armature.frontend.admission import Overload

    return Overload(
        busy_kv_usage=args.busy_kv_usage,
        busy_prefill_tokens=args.busy_prefill_tokens,
        max_queued_requests=args.max_queued_requests,
        queue_timeout_s=args.queue_timeout_s,
    )


def add_edge_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--api-key",
        action="append",
        default=None,
        help="require 'Authorization: Bearer KEY' on the API (repeatable; also "
        "$ARMATURE_API_KEYS, comma-separated). /health and /live stay open",
    )
    parser.add_argument(
        "--api-key-file",
        default=os.environ.get("ARMATURE_API_KEY_FILE"),
        help="a file of API keys, one per line, # comments (env ARMATURE_API_KEY_FILE)",
    )
    parser.add_argument(
        "--max-request-bytes",
        type=parse_bytes,
        default=8 << 20,
        help="refuse request bodies larger than this with 413 (e.g. 8MiB)",
    )
    parser.add_argument(
        "--busy-kv-usage",
        type=fraction,
        default=None,
        help="overload control: a worker whose KV usage reaches this (0..1) is busy; when "
        "every worker is busy, requests queue (default: no KV threshold)",
    )
    parser.add_argument(
        "--busy-prefill-tokens",
        type=positive_int,
        default=None,
        help="overload control: a worker with this many prompt tokens waiting is busy",
    )
    parser.add_argument(
        "--max-queued-requests",
        type=non_negative_int,
        default=256,
        help="overload control: requests that may wait for a free worker; more get 503",
    )
    parser.add_argument(
        "--queue-timeout-s",
        type=positive_float,
        default=30.0,
        help="overload control: a request waiting longer gets 503 with Retry-After",
    )
    parser.add_argument(
        "--shutdown-grace-s",
        type=non_negative_float,
        default=30.0,
        help="on SIGTERM: stop accepting, then give in-flight requests this long to finish",
    )
    parser.add_argument(
        "--protect-metrics",
        action="store_true",
        help="with API keys, /metrics needs a key too (default: open for scrapers)",
    )


def api_keys_from(args: argparse.Namespace) -> ApiKeys | None:
    """The keys from the flags, the key file and the environment; None when there are none."""
    from armature.frontend.auth import ApiKeys, read_key_file

    keys = list(args.api_key or [])
    keys += [k.strip() for k in os.environ.get("ARMATURE_API_KEYS", "").split(",") if k.strip()]
    if args.api_key_file:
        path = Path(args.api_key_file)
        try:
            from_file = read_key_file(path)
        except OSError as exc:
            raise CliError(f"cannot read the API key file {path}: {exc.strerror}") from None
        if not from_file:
            raise CliError(f"the API key file {path} holds no key")
        keys += from_file
    if any(not k or k != k.strip() for k in args.api_key or []):
        raise CliError("--api-key must not be empty or carry surrounding spaces")
    if not keys:
        if args.protect_metrics:
            raise CliError("--protect-metrics needs an API key")
        return None
    return ApiKeys(keys)
