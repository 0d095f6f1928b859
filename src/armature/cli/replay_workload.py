"""What `armature replay` replays: a trace or a synthetic workload (`load_requests`), its
arrival rate reshaped when asked (`--rate-shape`)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from armature.cli.options import CliError, is_given
from armature.cli.paths import read_trace
from armature.cli.replay_args import DEFAULT_NUM_REQUESTS, DEFAULT_RATE_RPS, SHAPE_DEFAULTS

if TYPE_CHECKING:
    from armature.workload.traces import TraceRequest

__all__ = ["load_requests"]


def load_requests(args: argparse.Namespace) -> list[TraceRequest]:
    """The workload `args` name, reshaped by --rate-shape; a one-line CliError when the trace
    cannot be read, is empty, or spans more simulated time than a replay should take."""
    from armature.sim.planned_fleet import get_max_samples

    requests = _reshape(args, _read(args))
    if not requests:
        raise CliError(f"trace {args.trace} has no requests")
    span_s = (requests[-1].arrival_ms - requests[0].arrival_ms) / 1000.0
    max_samples = get_max_samples(args.planner is not None)
    if span_s / args.load_interval_s > max_samples:
        raise CliError(
            f"the workload spans {span_s:.3g} s of simulated time, more than {max_samples:,} "
            f"fleet samples of --load-interval-s {args.load_interval_s:g} (compress it with "
            "--time-scale or raise the rate)"
        )
    # the throughput plan (a forecaster's fit each) runs every --planner-interval-s
    if args.planner in ("sla", "both") and span_s / args.interval_s > max_samples:
        raise CliError(
            f"the workload spans {span_s:.3g} s of simulated time, more than {max_samples:,} "
            f"throughput plans of --planner-interval-s {args.interval_s:g} (raise it)"
        )
    return requests


def _read(args: argparse.Namespace) -> list[TraceRequest]:
    """The synthetic workload, or the trace (a one-line error when it cannot be read)."""
    from pathlib import Path

    if args.synthetic:
        for flag, given in (
            ("--limit", args.limit is not None),
            ("--time-scale", is_given(args, "time_scale", 1.0)),
        ):
            if given:
                raise CliError(
                    f"{flag} is for --trace (a synthetic workload: --num-requests, --rate-rps)"
                )
        return _synthetic_workload(args)
    for flag, given in (
        ("--num-requests", is_given(args, "num_requests", DEFAULT_NUM_REQUESTS)),
        ("--rate-rps", is_given(args, "rate_rps", DEFAULT_RATE_RPS)),
    ):
        if given:
            raise CliError(f"{flag} is for --synthetic (a trace: --limit, --time-scale)")
    return read_trace(Path(args.trace), limit=args.limit, time_scale=args.time_scale)


def _reshape(args: argparse.Namespace, requests: list[TraceRequest]) -> list[TraceRequest]:
    from armature.workload.rate_shapes import DiurnalShape, StepShape, reshape_arrivals

    _check_shape_flags(args)
    if args.rate_shape is None:
        return requests
    if args.rate_shape == "step":
        span_s = (requests[-1].arrival_ms - requests[0].arrival_ms) / 1000.0 if requests else 0.0
        if args.step_at_s >= span_s:
            given = is_given(args, "step_at_s", SHAPE_DEFAULTS["step_at_s"])
            at = "" if given else " (the default; give an earlier one)"
            raise CliError(
                f"--step-at-s {args.step_at_s:g}{at}: the workload's last arrival is "
                f"{span_s:.4g} s after its first, so the step would change nothing"
            )
        return reshape_arrivals(
            requests, StepShape(args.shape_factor, args.step_at_s, args.step_for_s)
        )
    return reshape_arrivals(requests, DiurnalShape(args.shape_factor, args.shape_period_s))


def _check_shape_flags(args: argparse.Namespace) -> None:
    """A one-line CliError for a shape's flag given without that shape."""
    needs = {
        "--shape-factor": ("step", "diurnal"),
        "--step-at-s": ("step",),
        "--step-for-s": ("step",),
        "--shape-period-s": ("diurnal",),
    }
    for flag, shapes in needs.items():
        name = flag.removeprefix("--").replace("-", "_")
        if is_given(args, name, SHAPE_DEFAULTS[name]) and args.rate_shape not in shapes:
            wanted = " or ".join(shapes)
            raise CliError(f"{flag} is for --rate-shape {wanted}")


def _synthetic_workload(args: argparse.Namespace) -> list[TraceRequest]:
    """Prefix groups: 8 groups sharing 2,048-token prefixes + 512 unique tokens. Multi-turn:
    4-turn sessions on a shared 1,024-token system prompt, 256 tokens per turn (the first
    --num-requests arrivals of enough sessions)."""
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
    sessions = synthetic_multi_turn(
        num_sessions=-(-args.num_requests // 4),  # the last turns of the last cut below
        turns_per_session=4,
        system_prompt_tokens=1024,
        turn_tokens=256,
        output_length=128,
        rate_rps=args.rate_rps / 4,
        think_time_ms=5000.0,
        seed=args.seed,
    )
    return sorted(sessions, key=lambda r: r.arrival_ms)[: args.num_requests]
