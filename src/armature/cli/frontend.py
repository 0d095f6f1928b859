"""`armature frontend`: the OpenAI HTTP API in front of the workers found in discovery."""

from __future__ import annotations

import argparse

from armature.cli.options import HelpFormatter, add_settings, read_settings, setup_logging
from armature.config import FrontendConfig
from armature.router.policies import POLICY_NAMES

__all__ = ["add_parser", "run"]

CHOICES = {"router.policy": list(POLICY_NAMES)}


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "frontend",
        help="serve the OpenAI API, routing to the workers found in discovery",
        description="Serve the OpenAI API over the workers registered in discovery; workers "
        "that join or leave are picked up live.",
        formatter_class=HelpFormatter,
    )
    add_settings(parser, FrontendConfig(), choices=CHOICES)


def run(args: argparse.Namespace) -> int:
    from armature.frontend.main import run_frontend
    from armature.frontend.preprocess import encode_on_calling_thread

    encode_on_calling_thread()  # first: before any thread that might read the environment

    config = read_settings(args, FrontendConfig)
    setup_logging(config.http.log_level)
    run_frontend(config)
    return 0
