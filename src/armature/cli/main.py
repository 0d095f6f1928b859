"""`armature <command>`: the subcommands' parsers, and the one place user mistakes become one
line on stderr with exit code 2."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

import armature
from armature.cli import (  # the subcommands
    bench,
    configure,
    frontend,
    planner,
    profile,
    replay,
    serve,
    worker,
)
from armature.cli.options import Parser, check_env_errors
from armature.errors import ConfigError

__all__ = ["build_parser", "main"]

# each command: (name, add its parser, run it from the parsed flags -> exit code)
COMMANDS: dict[str, tuple[Callable[[argparse._SubParsersAction], None], Callable[..., int]]] = {
    "serve": (serve.add_parser, serve.run),
    "replay": (replay.add_parser, replay.run),
    "worker": (worker.add_parser, worker.run),
    "frontend": (frontend.add_parser, frontend.run),
    "bench": (bench.add_parser, bench.run),
    "planner": (planner.add_parser, planner.run),
    "profile": (profile.add_parser, profile.run),
    "configure": (configure.add_parser, configure.run),
}


def build_parser() -> argparse.ArgumentParser:
    """Every subcommand's flags; a malformed `ARMATURE_*` variable is a ConfigError."""
    parser = Parser(prog="armature", description="Armature: LLM inference serving.")
    parser.add_argument("--version", action="version", version=f"armature {armature.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for add, _ in COMMANDS.values():
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        check_env_errors(args)
        code = COMMANDS[args.command][1](args)
        sys.stdout.flush()  # a reader that went away shows here, not at the interpreter's exit
        return code
    except ConfigError as exc:
        print(f"armature: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away (`| head`): stop quietly, as SIGPIPE would
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
        return 141
