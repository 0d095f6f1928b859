"""`armature planner`: scales the workers behind a frontend to hold TTFT and ITL targets."""

from __future__ import annotations

import argparse
import logging

from armature.cli.options import HelpFormatter, add_settings, read_settings, setup_logging
from armature.config import PlannerCommandConfig

__all__ = ["add_parser", "run"]


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
    setup_logging(config.service.log_level)
    if config.service.log_level != "debug":  # one line per scrape otherwise
        logging.getLogger("httpx").setLevel(logging.WARNING)
    run_planner(config)
    return 0
