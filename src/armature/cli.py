"""The `armature` command. User mistakes end with one line on stderr and exit code 2."""

from __future__ import annotations

import argparse
import logging
import re
import socket
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn

from armature.router.policies import POLICY_NAMES

if TYPE_CHECKING:
    from armature.workload.traces import TraceRequest

__all__ = ["main"]

log = logging.getLogger("armature")

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


class CliError(Exception):
    """A user mistake: printed as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
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


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _port(text: str) -> int:
    value = _positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"port must be 1..65535, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="armature", description="Armature: LLM inference serving.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    serve = sub.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible HTTP API (one process)",
        description="Serve a model over an OpenAI-compatible HTTP API, engine in-process.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    serve.add_argument(
        "--model",
        default=None,
        help="local HF directory, ORG/NAME in the local HF cache, or omitted "
        "for the embedded SmolLM2-135M-Instruct",
    )
    serve.add_argument(
        "--engine",
        choices=["torch", "mocker"],
        default="torch",
        help="torch: the native PyTorch engine; mocker: the same scheduler and KV cache with "
        "a timing model instead of a model (no weights loaded)",
    )
    serve.add_argument(
        "--workers", type=_positive_int, default=1, help="worker engines in this process"
    )
    serve.add_argument(
        "--router",
        choices=list(POLICY_NAMES),
        default="round-robin",
        help="how requests are spread over workers (direct: by the x-worker-id header)",
    )
    serve.add_argument(
        "--kv-overlap-weight",
        type=_non_negative_float,
        default=1.0,
        help="kv router: weight of prefill blocks against decode blocks in the cost",
    )
    serve.add_argument(
        "--router-temperature",
        type=_non_negative_float,
        default=0.0,
        help="kv router: 0 picks the cheapest worker, above 0 samples by softmax",
    )
    serve.add_argument(
        "--speedup-ratio",
        type=_positive_float,
        default=1.0,
        help="mocker only: divide every simulated step time by this",
    )
    serve.add_argument(
        "--served-model-name",
        default=None,
        help="name clients pass as `model` (default: derived from --model)",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on")
    serve.add_argument("--port", type=_port, default=8000, help="port to listen on")
    serve.add_argument(
        "--dtype",
        choices=["auto", "float32", "bfloat16", "float16"],
        default="auto",
        help="weights and KV dtype; auto = bfloat16 where supported",
    )
    serve.add_argument(
        "--device",
        choices=["auto", "cpu", "cuda"],
        default="auto",
        help="auto = cuda where present, else cpu",
    )
    serve.add_argument("--block-size", type=_positive_int, default=16, help="tokens per KV block")
    serve.add_argument(
        "--kv-cache-bytes",
        type=parse_bytes,
        default=1 << 30,
        help="KV cache capacity in bytes (e.g. 2GiB)",
    )
    serve.add_argument(
        "--num-kv-blocks",
        type=_positive_int,
        default=None,
        help="KV cache capacity in blocks (overrides --kv-cache-bytes)",
    )
    serve.add_argument(
        "--max-num-seqs", type=_positive_int, default=64, help="requests running at once"
    )
    serve.add_argument(
        "--max-num-batched-tokens",
        type=_positive_int,
        default=1024,
        help="tokens per engine step (prefill chunk budget)",
    )
    serve.add_argument(
        "--max-model-len",
        type=_positive_int,
        default=None,
        help="context length (default: the model's)",
    )
    serve.add_argument("--no-prefix-caching", action="store_true", help="disable prefix caching")
    serve.add_argument("--seed", type=int, default=0, help="seed for requests that bring none")
    serve.add_argument(
        "--cache-dir",
        default=None,
        help="where the default model is converted (default: $ARMATURE_CACHE_DIR or the XDG cache)",
    )
    serve.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        default="info",
        help="log verbosity",
    )
    _add_replay_parser(sub)
    return parser


def _add_replay_parser(sub: argparse._SubParsersAction) -> None:
    replay = sub.add_parser(
        "replay",
        help="simulate a request trace through mocker workers and the router (offline)",
        description="Discrete-event replay of a Mooncake-format trace on a virtual clock: "
        "N mocker workers (real scheduler and KV cache, timing model) behind the real router.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    source = replay.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace", help="Mooncake JSONL trace file")
    source.add_argument(
        "--synthetic",
        choices=["prefix-groups", "multi-turn"],
        help="a generated workload instead of a trace (see --num-requests, --rate-rps)",
    )
    replay.add_argument(
        "--num-requests", type=_positive_int, default=1000, help="synthetic: requests to generate"
    )
    replay.add_argument(
        "--rate-rps",
        type=_positive_float,
        default=8.0,
        help="synthetic: mean arrival rate (Poisson)",
    )
    replay.add_argument("--workers", type=_positive_int, default=8, help="mocker workers")
    replay.add_argument(
        "--router",
        choices=["round-robin", "random", "least-loaded", "kv"],
        default="kv",
        help="routing policy",
    )
    replay.add_argument("--block-size", type=_positive_int, default=16, help="tokens per block")
    replay.add_argument(
        "--num-kv-blocks", type=_positive_int, default=16384, help="KV blocks per worker"
    )
    replay.add_argument(
        "--max-num-batched-tokens", type=_positive_int, default=8192, help="tokens per engine step"
    )
    replay.add_argument(
        "--max-num-seqs",
        type=_positive_int,
        default=256,
        help="requests running at once per worker",
    )
    replay.add_argument(
        "--speedup",
        type=_positive_float,
        default=1.0,
        help="divide every simulated step time by this",
    )
    replay.add_argument(
        "--time-scale",
        type=_positive_float,
        default=1.0,
        help="multiply arrival times (below 1: a higher request rate)",
    )
    replay.add_argument(
        "--limit", type=_positive_int, default=None, help="replay only the first N requests"
    )
    replay.add_argument(
        "--kv-overlap-weight",
        type=_non_negative_float,
        default=1.0,
        help="kv router: weight of prefill blocks in the cost",
    )
    replay.add_argument(
        "--router-temperature",
        type=_non_negative_float,
        default=0.0,
        help="kv router: softmax sampling temperature (0 = argmin)",
    )
    replay.add_argument("--seed", type=int, default=0, help="seed for prompts and tokens")
    replay.add_argument("--report", default=None, help="write the report as JSON here")


def _replay(args: argparse.Namespace) -> None:
    import dataclasses
    import json
    from pathlib import Path

    from armature.sim.replay import ReplayConfig, replay
    from armature.workload.traces import TraceFormatError, read_mooncake_trace

    if args.synthetic:
        requests = _synthetic_workload(args)
    else:
        path = Path(args.trace)
        if not path.is_file():
            raise CliError(f"trace file {path} does not exist")
        try:
            requests = read_mooncake_trace(path, limit=args.limit, time_scale=args.time_scale)
        except TraceFormatError as exc:
            raise CliError(str(exc)) from None
    config = ReplayConfig(
        num_workers=args.workers,
        router=args.router,
        block_size=args.block_size,
        num_kv_blocks=args.num_kv_blocks,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        speedup_ratio=args.speedup,
        overlap_weight=args.kv_overlap_weight,
        router_temperature=args.router_temperature,
        seed=args.seed,
    )
    report = dataclasses.asdict(replay(requests, config))
    summary = {
        k: report[k]
        for k in (
            "num_requests",
            "num_rejected",
            "prefix_hit_ratio",
            "throughput_tokens_s",
            "load_skew",
            "simulated_time_s",
            "wall_time_s",
        )
    }
    for key in ("ttft_ms", "itl_ms", "e2e_ms"):
        summary[f"{key} p50/p90/p99"] = "/".join(
            f"{report[key][p]:.1f}" for p in ("p50", "p90", "p99")
        )
    for key, value in summary.items():
        print(f"{key:>24}: {value:.4g}" if isinstance(value, float) else f"{key:>24}: {value}")
    if args.report:
        Path(args.report).write_text(json.dumps(report, indent=2) + "\n")
        print(f"{'report':>24}: {args.report}")


def _synthetic_workload(args: argparse.Namespace) -> list[TraceRequest]:
    """Prefix groups: 8 groups sharing 2,048-token prefixes + 512 unique tokens. Multi-turn:
    4-turn sessions on a shared 1,024-token system prompt, 256 tokens per turn."""
    from armature.workload.traces import synthetic_multi_turn, synthetic_prefix_groups

    if args.synthetic == "prefix-groups":
        return synthetic_prefix_groups(
            num_requests=args.num_requests,
            num_groups=8,
            shared_prefix_tokens=2048,
            unique_tokens=512,
            output_length=128,
            rate_rps=args.rate_rps,
            seed=args.seed,
        )
    return synthetic_multi_turn(
        num_sessions=max(1, args.num_requests // 4),
        turns_per_session=4,
        system_prompt_tokens=1024,
        turn_tokens=256,
        output_length=128,
        rate_rps=args.rate_rps / 4,
        think_time_ms=5000.0,
        seed=args.seed,
    )


def _check_port_free(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise CliError(f"cannot listen on {host}:{port}: {exc.strerror}") from None


def _serve(args: argparse.Namespace) -> None:
    from pathlib import Path

    import torch
    import uvicorn

    from armature.engine.async_engine import AsyncEngine
    from armature.engine.config import EngineConfig, parse_dtype
    from armature.engine.core import EngineCore
    from armature.engine.device import pick_device, pick_dtype
    from armature.frontend.app import ServedModel, build_app
    from armature.frontend.preprocess import Preprocessor
    from armature.frontend.routing import EngineRouter, RouterConfig
    from armature.model.source import ModelSourceError, resolve_model
    from armature.sim.mocker import build_mocker_core
    from armature.sim.timing import PolynomialTiming

    _check_port_free(args.host, args.port)
    try:
        device = pick_device(args.device)
        dtype = parse_dtype(pick_dtype(args.dtype, device))
    except ValueError as exc:
        raise CliError(str(exc)) from None
    cache_dir = Path(args.cache_dir) if args.cache_dir else None
    try:
        resolved = resolve_model(args.model, cache_dir=cache_dir, log=log.info)
    except ModelSourceError as exc:
        raise CliError(str(exc)) from None
    started_s = time.perf_counter()
    try:
        config = EngineConfig(
            model_dir=resolved.path,
            dtype=dtype,
            device=device,
            block_size=args.block_size,
            num_kv_blocks=args.num_kv_blocks,
            kv_cache_bytes=args.kv_cache_bytes,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_model_len=args.max_model_len,
            enable_prefix_caching=not args.no_prefix_caching,
            seed=args.seed,
        )
        cores = []
        for _ in range(args.workers):
            if args.engine == "mocker":
                timing = PolynomialTiming(speedup_ratio=args.speedup_ratio)
                cores.append(build_mocker_core(config, timing=timing))
            else:
                cores.append(EngineCore(config))
        core = cores[0]
    except (ValueError, KeyError, FileNotFoundError) as exc:
        raise CliError(f"cannot load {resolved.path}: {exc}") from None
    except torch.OutOfMemoryError:
        raise CliError(
            "out of memory while allocating the model or KV cache; lower --kv-cache-bytes"
        ) from None
    preprocessor = Preprocessor(resolved.path)
    name = args.served_model_name or resolved.served_name
    log.info(
        "loaded %s (%d x %s engine, %s router; %s, %s on %s) in %.1f s; KV cache %d blocks "
        "x %d tokens per worker; context %d",
        name,
        args.workers,
        args.engine,
        args.router,
        resolved.path,
        str(dtype).removeprefix("torch."),
        device,
        time.perf_counter() - started_s,
        core.pool.num_blocks,
        config.block_size,
        core.max_model_len,
    )
    model = ServedModel(name=name, max_model_len=core.max_model_len, created=int(time.time()))
    router_config = RouterConfig(
        policy=args.router,
        block_size=config.block_size,
        overlap_weight=args.kv_overlap_weight,
        temperature=args.router_temperature,
        seed=args.seed,
    )
    engines = {f"worker-{i}": AsyncEngine(c) for i, c in enumerate(cores)}
    app = build_app(EngineRouter(engines, router_config), preprocessor, model)
    log.info("serving %r on http://%s:%d (OpenAI API under /v1)", name, args.host, args.port)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, access_log=False)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=getattr(args, "log_level", "info").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        if args.command == "serve":
            _serve(args)
        elif args.command == "replay":
            _replay(args)
    except CliError as exc:
        print(f"armature: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
