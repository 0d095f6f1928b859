"""`armature worker`: one engine served to frontends over the request plane, registered in
discovery."""

from __future__ import annotations

import argparse

from armature.cli.options import HelpFormatter, add_settings, read_settings, setup_logging
from armature.config import WorkerConfig
from armature.engines.registry import KINDS

__all__ = ["add_parser", "run"]

CHOICES = {"engine.engine": list(KINDS)}


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "worker",
        help="serve one engine to frontends over the request plane",
        description="Serve one engine over the request plane and register it in discovery.",
        formatter_class=HelpFormatter,
    )
    add_settings(parser, WorkerConfig(), choices=CHOICES)


def run(args: argparse.Namespace) -> int:
    from armature.worker.main import run_worker

    config = read_settings(args, WorkerConfig)
    setup_logging(config.process.log_level)
    config.tiers.check_prefix_caching(config.kv.enable_prefix_caching)
    config.tiers.check_applies()
    return run_worker(config)
