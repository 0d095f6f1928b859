"""The `armature` command. User mistakes end with one line on stderr and exit code 2."""

from __future__ import annotations

import argparse
import logging
import socket
import sys
import time
from collections.abc import Sequence

from armature.cli_args import (
    CliError,
    Parser,
    add_router_cost_args,
    parse_bytes,
    port,
    positive_float,
    positive_int,
)
from armature.cli_replay import add_replay_parser, run_replay
from armature.router.policies import POLICY_NAMES

__all__ = ["main"]

log = logging.getLogger("armature")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="armature", description="Armature: LLM inference serving.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
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
        "--workers", type=positive_int, default=1, help="worker engines in this process"
    )
    serve.add_argument(
        "--router",
        choices=list(POLICY_NAMES),
        default="round-robin",
        help="how requests are spread over workers (direct: by the x-worker-id header)",
    )
    add_router_cost_args(serve)
    serve.add_argument(
        "--speedup-ratio",
        type=positive_float,
        default=1.0,
        help="mocker only: divide every simulated step time by this",
    )
    serve.add_argument(
        "--served-model-name",
        default=None,
        help="name clients pass as `model` (default: derived from --model)",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on")
    serve.add_argument("--port", type=port, default=8000, help="port to listen on")
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
    serve.add_argument("--block-size", type=positive_int, default=16, help="tokens per KV block")
    serve.add_argument(
        "--kv-cache-bytes",
        type=parse_bytes,
        default=1 << 30,
        help="KV cache capacity in bytes (e.g. 2GiB)",
    )
    serve.add_argument(
        "--num-kv-blocks",
        type=positive_int,
        default=None,
        help="KV cache capacity in blocks (overrides --kv-cache-bytes)",
    )
    serve.add_argument(
        "--max-num-seqs", type=positive_int, default=64, help="requests running at once"
    )
    serve.add_argument(
        "--max-num-batched-tokens",
        type=positive_int,
        default=1024,
        help="tokens per engine step (prefill chunk budget)",
    )
    serve.add_argument(
        "--max-model-len",
        type=positive_int,
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
    add_replay_parser(sub)
    return parser


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
            run_replay(args)
    except CliError as exc:
        print(f"armature: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
