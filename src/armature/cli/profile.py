"""`armature profile`: time one engine alone (or `--engines-at-once` N side by side) over
prefill and decode work, and write the timing profile that `--timing-profile` runs the
mocker from."""

from __future__ import annotations

import argparse
from pathlib import Path

from armature.cli.options import (
    CliError,
    HelpFormatter,
    add_settings,
    read_settings,
    setup_logging,
)
from armature.cli.paths import check_file, make_dir, writing
from armature.config import ProfileConfig
from armature.engines.registry import KINDS
from armature.protocols.timing_profile import TimingProfile

__all__ = ["add_parser", "run"]

CHOICES = {"engine.engine": list(KINDS)}


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "profile",
        help="time one engine alone (prefill and decode sweeps) and write a timing profile",
        description="Drive one engine in isolation: prefill TTFT and tokens/s by input length "
        "(alone and in batches), decode ITL and tokens/s by running requests and context "
        "length (--engines-at-once N: N engines side by side, each point their median), "
        "then with --load-requests N a load pass of N Poisson arrivals whose step times, "
        "against the tables', give a factor on the steps that carry prefill tokens (prompt "
        "steps against the tables over decode steps against them). "
        "Writes a versioned JSON profile (--output) that the mocker runs from "
        "(--timing-profile), and plots (--report).",
        formatter_class=HelpFormatter,
    )
    add_settings(parser, ProfileConfig(), choices=CHOICES)


def run(args: argparse.Namespace) -> int:
    import asyncio

    from armature.profiler.plan import check_sweep_flags
    from armature.profiler.run import profile_engine
    from armature.protocols.timing_profile import write_profile

    config = read_settings(args, ProfileConfig)
    # the batch limits' mistakes before any engine or model is built (a first conversion of
    # the default model alone takes seconds)
    engine = config.engine
    check_sweep_flags(config.sweep, engine.max_num_seqs, engine.max_num_batched_tokens)
    check_file(Path(config.output), "--output")  # before the sweep, which takes minutes
    if config.report_dir is not None:
        if not config.report_dir.strip():
            raise CliError("--report needs a directory (an empty path names none)")
        make_dir(Path(config.report_dir), "--report")
    setup_logging("info")
    engines: list[TimingProfile] = []
    if config.engines_at_once > 1:
        from armature.profiler.at_once import profile_at_once
        from armature.profiler.points import median_profile

        engines = profile_at_once(config)
        profile = median_profile(engines)
    else:
        profile = asyncio.run(profile_engine(config))
    output = Path(config.output)
    with writing("--output", output):
        write_profile(profile, output)
    for p in profile.prefill:
        after = f" after {p.context_tokens} cached" if p.context_tokens else ""
        print(
            f"prefill {p.num_requests:>3} x {p.input_tokens:>6} tokens{after}: TTFT "
            f"{p.ttft_ms:9.1f} ms  {p.tokens_per_s:10.1f} tokens/s"
        )
    for d in profile.decode:
        print(
            f"decode {d.num_requests:>4} requests x {d.context_tokens:>6} context: ITL "
            f"{d.itl_ms:8.2f} ms  {d.tokens_per_s:10.1f} tokens/s"
        )
    if profile.load is not None:
        load = profile.load
        print(
            f"load pass: {load.num_requests} requests at {load.request_rate_per_s:.2f}/s, "
            f"{load.num_steps} steps: {load.measured_s:.2f} s measured, {load.modeled_s:.2f} s "
            f"by the tables: factor {load.factor:.3f}"
        )
        if load.prompt_step_factor is not None:
            decode = load.decode_step_factor
            print(
                f"load pass: prompt steps {load.prompt_measured_s:.2f} s measured, "
                f"{load.prompt_modeled_s:.2f} s by the tables: prompt step factor "
                f"{load.prompt_step_factor:.3f}; decode steps {load.decode_measured_s:.2f} s, "
                f"{load.decode_modeled_s:.2f} s"
                + ("" if decode is None else f" (factor {decode:.3f})")
            )
    print(f"profile: {output}")
    if config.report_dir is not None:
        from armature.profiler.plots import plot_profile

        report_dir = Path(config.report_dir)
        with writing("--report", report_dir):
            plots = plot_profile(profile, report_dir)
        for path in plots:
            print(f"plot: {path}")
        for number, one in enumerate(engines, 1):  # each engine's own, beside the plots
            path = report_dir / f"engine{number}.json"
            with writing("--report", path):
                write_profile(one, path)
            print(f"engine {number}'s profile: {path}")
    return 0
