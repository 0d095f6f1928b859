"""`armature planner`: scales the workers behind a frontend to hold TTFT and ITL targets."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import NoReturn

from armature.cli.options import (
    HelpFormatter,
    add_settings,
    check_fits_index,
    read_settings,
    setup_logging,
)
from armature.cli.paths import make_dir
from armature.config import PlannerCommandConfig, PlannerConfig
from armature.errors import ConfigError

__all__ = ["add_parser", "check_index_room", "run"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "planner",
        help="add and remove workers to hold TTFT and ITL targets",
        description="Read the frontend's metrics and the workers' step records, size the "
        "prefill and decode pools (or one aggregated pool) for --ttft-ms and --itl-ms, and "
        "start or stop workers through a connector (local processes, or a virtual one that "
        "an external orchestrator follows).",
        formatter_class=HelpFormatter,
    )
    add_settings(parser, PlannerCommandConfig())


def run(args: argparse.Namespace) -> int:
    from armature.planner.main import run_planner

    config = read_settings(args, PlannerCommandConfig)
    check_index_room(config.planner)
    if config.service.connector == "local" and not config.service.dry_run:
        check_worker_args(config.service.worker_args)
        if config.service.prefill_worker_args:
            if config.planner.mode != "disagg":
                raise ConfigError(
                    "--prefill-worker-args is for --planner-mode disagg (aggregated workers "
                    "take --worker-args alone)"
                )
            check_worker_args(config.service.prefill_worker_args, "--prefill-worker-args")
        if config.service.worker_log_dir:  # found at start, not at each worker's (for ever)
            make_dir(Path(config.service.worker_log_dir), "--worker-log-dir")
    setup_logging(config.service.log_level)
    run_planner(config)
    return 0


class _Refusing(argparse.ArgumentParser):
    """A parser whose errors are ConfigErrors (argparse's own exits the process)."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


def check_worker_args(worker_args: tuple[str, ...], flag: str = "--worker-args") -> None:
    """A one-line error for --worker-args that `armature worker` would refuse: the local
    connector's workers would each exit at start, and be started again, for good."""
    from armature.cli import worker
    from armature.planner.main import get_worker_argv

    root = _Refusing(prog="armature")
    worker.add_parser(root.add_subparsers(dest="command", parser_class=_Refusing))
    try:
        root.parse_args(["worker", *get_worker_argv(worker_args), "--role", "agg"])
    except ConfigError as exc:
        raise ConfigError(f"{flag}: {exc}") from None


def check_index_room(planner: PlannerConfig) -> None:
    """A one-line error where a role's fleet could grow past what the router's prefix index
    holds (the frontend would refuse the workers past it)."""
    from armature.router.prefix_index import MAX_WORKERS

    total = planner.max_total_workers
    if total is not None and total <= MAX_WORKERS:
        return  # the total bounds each role within the index
    for flag, most in (
        ("--max-workers", planner.max_workers),
        ("--max-prefill-workers", planner.max_prefill_workers),
        ("--max-decode-workers", planner.max_decode_workers),
    ):
        if most is not None:
            check_fits_index(
                flag, most, "workers of a role", " (or cap them with --max-total-workers)"
            )
