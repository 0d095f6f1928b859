"""Argument types and the user-error convention shared by the `armature` subcommands:
one line on stderr, exit code 2."""

from __future__ import annotations

import argparse
import re
import socket
from typing import TYPE_CHECKING, NoReturn

from armature.errors import ArmatureError

if TYPE_CHECKING:
    from armature.router.disagg import DisaggConfig
    from armature.router.service import RouterConfig

__all__ = [
    "CliError",
    "Parser",
    "add_disagg_args",
    "add_migration_arg",
    "add_router_cost_args",
    "add_transfer_args",
    "add_worker_health_args",
    "check_port_free",
    "disagg_config",
    "free_port",
    "non_negative_float",
    "parse_bytes",
    "port",
    "positive_float",
    "positive_int",
    "router_config",
]

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "m": 1000**2,
    "g": 1000**3,
    "t": 1000**4,
    "ki": 1 << 10,
    "mi": 1 << 20,
    "gi": 1 << 30,
    "ti": 1 << 40,
}


class CliError(ArmatureError):
    """A user mistake: printed as one line, exit code 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"armature: error: {message} (see --help)\n")


def parse_bytes(text: str) -> int:
    """'1073741824', '1GiB', '512MiB', '2G' -> bytes."""
    match = _SIZE.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 2GiB, 512MiB, 1000000)")
    unit = (match.group(2) or "").lower().removesuffix("b")
    value = int(float(match.group(1)) * _UNITS[unit])
    if value <= 0:
        raise argparse.ArgumentTypeError("size must be positive")
    return value


def _number(text: str, kind: type[int] | type[float], *, allow_zero: bool) -> float:
    try:
        value = kind(text)
    except ValueError:
        noun = "an integer" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"not {noun}: {text!r}") from None
    if not (value >= 0 if allow_zero else value > 0):
        bound = ">= 0" if allow_zero else "positive"
        raise argparse.ArgumentTypeError(f"must be {bound}, got {text.strip()}")
    return value


def positive_int(text: str) -> int:
    return int(_number(text, int, allow_zero=False))


def positive_float(text: str) -> float:
    return _number(text, float, allow_zero=False)


def non_negative_float(text: str) -> float:
    return _number(text, float, allow_zero=True)


def add_router_cost_args(parser: argparse.ArgumentParser) -> None:
    """The kv router's cost knobs, shared by `serve` and `replay`."""
    parser.add_argument(
        "--kv-overlap-weight",
        type=non_negative_float,
        default=1.0,
        help="kv router: weight of prefill blocks against decode blocks in the cost",
    )
    parser.add_argument(
        "--kv-decode-weight",
        type=non_negative_float,
        default=1.0,
        help="kv router: weight of a worker's active blocks in the cost (1: the DESIGN "
        "baseline; lower favours cache affinity over spreading memory load)",
    )
    parser.add_argument(
        "--router-temperature",
        type=non_negative_float,
        default=0.0,
        help="kv router: 0 picks the cheapest worker, above 0 samples by softmax",
    )


def non_negative_int(text: str) -> int:
    return int(_number(text, int, allow_zero=True))


def add_disagg_args(parser: argparse.ArgumentParser) -> None:
    """Conditional disaggregation in the frontend's router (`serve` and `frontend`)."""
    parser.add_argument(
        "--max-local-prefill-tokens",
        type=non_negative_int,
        default=256,
        help="with prefill workers: a prompt whose uncached part is shorter than this is "
        "prefilled on the decode worker itself",
    )
    parser.add_argument(
        "--max-prefill-queue-tokens",
        type=positive_int,
        default=65536,
        help="the prefill pool counts as saturated (prompts prefill locally) when every "
        "prefill worker has this many prompt tokens in flight",
    )
    parser.add_argument(
        "--enforce-disagg",
        action="store_true",
        help="always prefill on a prefill worker; refuse requests (503) when none is alive",
    )


def disagg_config(args: argparse.Namespace) -> DisaggConfig:
    from armature.router.disagg import DisaggConfig

    return DisaggConfig(
        max_local_prefill_tokens=args.max_local_prefill_tokens,
        max_prefill_queue_tokens=args.max_prefill_queue_tokens,
        enforce_disagg=args.enforce_disagg,
    )


def router_config(args: argparse.Namespace, block_size: int) -> RouterConfig:
    """The router's settings from the routing flags, for workers of `block_size`."""
    from armature.router.service import RouterConfig

    return RouterConfig(
        policy=args.router,
        block_size=block_size,
        overlap_weight=args.kv_overlap_weight,
        decode_weight=args.kv_decode_weight,
        temperature=args.router_temperature,
        seed=args.seed,
        migration_limit=args.migration_limit,
    )


def add_worker_health_args(parser: argparse.ArgumentParser) -> None:
    """How a frontend notices hung workers (`frontend` and `serve`)."""
    parser.add_argument(
        "--worker-liveness-timeout-s",
        type=positive_float,
        default=10.0,
        help="a worker that sends no update (heartbeats come every second) this long is not "
        "routed to",
    )
    parser.add_argument(
        "--worker-stall-timeout-s",
        type=positive_float,
        default=60.0,
        help="a stream with no output this long fails over to another worker (a hung "
        "worker); keep it above your longest prefill",
    )


def add_migration_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--migration-limit",
        type=non_negative_int,
        default=3,
        help="times a request moves to another worker (with its tokens so far) when its "
        "worker dies mid-stream; 0 fails it instead",
    )


def add_transfer_args(parser: argparse.ArgumentParser) -> None:
    """KV transfer between prefill and decode workers (`serve` and `worker`)."""
    parser.add_argument(
        "--kv-transfer-backends",
        type=transfer_backends,
        default="shm,tcp",
        help="KV transfer backends to offer and use, best first: shm (same host, CPU KV "
        "cache), nixl (pip install 'armature[nixl]'; UCX, any host) and tcp (any host; "
        "always on: it also carries the control messages)",
    )
    parser.add_argument(
        "--kv-pin-ttl-s",
        type=positive_float,
        default=30.0,
        help="a prefill worker frees a prompt's pinned KV blocks after this long if no "
        "decode worker released them",
    )


def transfer_backends(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in ("shm", "nixl", "tcp")]
    if unknown or "tcp" not in names:
        raise argparse.ArgumentTypeError(
            f"expected a comma list of shm,nixl,tcp that includes tcp, got {text!r}"
        )
    return names


def port(text: str) -> int:
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"port must be 1..65535, got {value}")
    return value


def _bind_port(host: str, port: int) -> int:
    """Bind `host`:`port` for a moment (0: any free port); the port bound, or CliError."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise CliError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
        bound: int = sock.getsockname()[1]
        return bound


def check_port_free(host: str, port: int) -> None:
    _bind_port(host, port)


def free_port(host: str) -> int:
    """A port on `host` that was free a moment ago (for servers that cannot bind port 0)."""
    return _bind_port(host, 0)
