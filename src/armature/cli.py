"""The `armature` command. User mistakes end with one line on stderr and exit code 2."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence

from armature.cli_args import (
    CliError,
    Parser,
    add_disagg_args,
    add_migration_arg,
    add_router_cost_args,
    add_transfer_args,
    add_worker_health_args,
    check_port_free,
    disagg_config,
    non_negative_int,
    port,
    positive_int,
    router_config,
)
from armature.cli_bench import add_bench_parser, run_bench
from armature.cli_edge import add_edge_args, api_keys_from, overload_from
from armature.cli_engine import add_engine_args, build_engines
from armature.cli_frontend import add_frontend_parser, run_frontend
from armature.cli_replay import add_replay_parser, run_replay
from armature.cli_worker import add_worker_parser, run_worker
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
        "--workers",
        type=positive_int,
        default=1,
        help="worker engines: one runs in this process; more run as worker processes behind "
        "this frontend (see --in-process-workers)",
    )
    serve.add_argument(
        "--in-process-workers",
        action="store_true",
        help="run every worker engine in this process (cheap mocker fleets, tests)",
    )
    serve.add_argument(
        "--router",
        choices=list(POLICY_NAMES),
        default="round-robin",
        help="how requests are spread over workers (direct: by the x-worker-id header)",
    )
    add_router_cost_args(serve)
    serve.add_argument(
        "--prefill-workers",
        type=non_negative_int,
        default=None,
        help="disaggregated serving: prefill workers (with --decode-workers; replaces --workers)",
    )
    serve.add_argument(
        "--decode-workers",
        type=positive_int,
        default=None,
        help="disaggregated serving: decode workers",
    )
    add_disagg_args(serve)
    add_migration_arg(serve)
    add_worker_health_args(serve)
    add_edge_args(serve)
    add_transfer_args(serve)
    serve.add_argument(
        "--served-model-name",
        default=None,
        help="name clients pass as `model` (default: derived from --model)",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on")
    serve.add_argument("--port", type=port, default=8000, help="port to listen on")
    add_engine_args(serve)
    serve.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        default="info",
        help="log verbosity",
    )
    add_replay_parser(sub)
    add_worker_parser(sub)
    add_frontend_parser(sub)
    add_bench_parser(sub)
    return parser


def worker_roles(args: argparse.Namespace) -> list[str]:
    """The role of each worker `serve` runs, from --workers or --prefill/--decode-workers."""
    if args.prefill_workers is None and args.decode_workers is None:
        return ["agg"] * args.workers
    if args.decode_workers is None:
        raise CliError("--prefill-workers needs --decode-workers")
    if args.workers != 1:
        raise CliError("give either --workers or --prefill-workers/--decode-workers")
    return ["prefill"] * (args.prefill_workers or 0) + ["decode"] * args.decode_workers


def _serve(args: argparse.Namespace) -> None:
    args.roles = worker_roles(args)
    args.workers = len(args.roles)
    api_keys = api_keys_from(args)  # a bad key file fails before any model loads
    if args.workers > 1 and not args.in_process_workers:
        from armature.cli_serve_fleet import serve_fleet

        serve_fleet(args)
        return
    if args.engine == "vllm":
        from armature.cli_serve_vllm import serve_vllm

        serve_vllm(args, api_keys)
        return
    import uvicorn

    from armature.engines.native.async_engine import AsyncEngine
    from armature.engines.native.transfer import start_transfer_agent
    from armature.frontend.app import ServedModel, build_app
    from armature.frontend.preprocess import Preprocessor
    from armature.router.disagg import DisaggRouter
    from armature.transfer.wire import TransferError

    check_port_free(args.host, args.port)
    disaggregated = "prefill" in args.roles
    built = build_engines(args, args.workers, shared_kv_cache=disaggregated)
    cores, config, resolved = built.cores, built.config, built.resolved
    core = cores[0]
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
        str(config.dtype).removeprefix("torch."),
        config.device,
        built.load_s,
        core.pool.num_blocks,
        config.block_size,
        core.max_model_len,
    )
    model = ServedModel(name=name, max_model_len=core.max_model_len, created=int(time.time()))
    engines: dict[str, AsyncEngine] = {}
    prefill_engines: dict[str, AsyncEngine] = {}
    for i, (core_i, role) in enumerate(zip(cores, args.roles, strict=True)):
        worker = f"worker-{i}"
        transfer = None
        if disaggregated:
            try:
                transfer = start_transfer_agent(
                    core_i, worker_id=worker, backends=args.kv_transfer_backends
                )
            except TransferError as exc:
                raise CliError(str(exc)) from None
        pool = prefill_engines if role == "prefill" else engines
        pool[worker] = AsyncEngine(core_i, transfer)
    router = DisaggRouter(
        engines,
        router_config(args, config.block_size),
        disagg_config(args),
        prefill_engines=prefill_engines,
    )
    app = build_app(
        router,
        preprocessor,
        model,
        api_keys=api_keys,
        protect_metrics=args.protect_metrics,
        max_request_bytes=args.max_request_bytes,
        overload=overload_from(args),
    )
    log.info("serving %r on http://%s:%d (OpenAI API under /v1)", name, args.host, args.port)
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=False,
        timeout_graceful_shutdown=max(1, round(args.shutdown_grace_s)),
    )


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
        elif args.command == "worker":
            run_worker(args)
        elif args.command == "frontend":
            run_frontend(args)
        elif args.command == "bench":
            return run_bench(args)
    except CliError as exc:
        print(f"armature: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
