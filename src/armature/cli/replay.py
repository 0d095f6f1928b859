"""`armature replay`: offline discrete-event replay of a trace or a synthetic workload."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Collection
from typing import Any

from armature.cli.options import CliError, check_fits_index, is_given, setup_logging
from armature.cli.paths import check_apart, check_file, check_image, writing
from armature.cli.replay_args import (
    DISAGG_DEFAULTS,
    PLANNER_SETTINGS,
    ROUTER_SETTINGS,
    TIER_SETTINGS,
    add_parser,
)
from armature.cli.replay_workload import load_requests
from armature.config import KvTierConfig, PlannerConfig, RouterConfig, flag_name, iter_settings
from armature.config.routing import check_routed_ttl
from armature.errors import ConfigError
from armature.sim.replay_config import (
    ReplayConfig,
    ReplayReport,
    bytes_s_from_gbs,
)

__all__ = ["add_parser", "run"]


def run(args: argparse.Namespace) -> int:
    setup_logging("info")
    import dataclasses
    import json
    from pathlib import Path

    from armature.outputs import write_atomically
    from armature.sim.planned_fleet import ReplayTooLongError
    from armature.sim.profile_timing import load_profile_timing
    from armature.sim.replay import replay

    check_routed_ttl(args.router, args.routed_ttl_s)
    timing = prefill_timing = None
    if args.timing_profile is not None:  # before the trace: a bad profile fails at once
        timing = load_profile_timing(Path(args.timing_profile), args.speedup)
    if args.prefill_timing_profile is not None:
        if not args.prefill_workers:
            raise CliError("--prefill-timing-profile is the step times of --prefill-workers")
        prefill_timing = load_profile_timing(Path(args.prefill_timing_profile), args.speedup)
    requests = load_requests(args)
    config = _replay_config(args)
    _check_before(args, config)
    try:
        result = replay(requests, config, timing, prefill_timing)
    except ReplayTooLongError as exc:
        raise CliError(str(exc)) from None
    _check_result(args, result, len(requests))
    report = dataclasses.asdict(result)
    _print_summary(args, config, report)
    if args.report:
        with writing("--report", args.report):
            write_atomically(Path(args.report), json.dumps(report, indent=2) + "\n")
        print(f"{'report':>24}: {args.report}")
    if args.plot:
        _write_plot(args, config, result)
    return 0


def _replay_config(args: argparse.Namespace) -> ReplayConfig:
    from armature.workload.measure import Slo

    return ReplayConfig(
        num_workers=args.workers,
        router=args.router,
        block_size=args.block_size,
        num_kv_blocks=args.num_kv_blocks,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        speedup_ratio=args.speedup,
        overlap_weight=args.overlap_weight,
        decode_weight=args.decode_weight,
        load_bound=args.load_bound,
        share_bound=args.share_bound,
        share_window=args.share_window,
        router_temperature=args.temperature,
        routed_ttl_s=args.routed_ttl_s,
        seed=args.seed,
        reference_steps=args.reference_steps,
        num_prefill_workers=args.prefill_workers,
        max_local_prefill_tokens=args.max_local_prefill_tokens,
        transfer_bandwidth_bytes_s=bytes_s_from_gbs(args.transfer_bandwidth_gbs),
        kv_bytes_per_block=args.kv_bytes_per_block,
        tiers=KvTierConfig(**{name: getattr(args, name) for name in TIER_SETTINGS}),
        tier_aware=args.tier_aware,
        # goodput needs a bound: without one every finished request would count, and
        # goodput would read as throughput beside a low sla_attainment
        slos=(Slo("sla", args.slo_ttft_ms, args.slo_itl_ms, args.slo_itl_quantile),)
        if args.slo_ttft_ms is not None or args.slo_itl_ms is not None
        else (),
        planner=_planner_config(args),
        planner_rule=args.planner,
        worker_startup_s=args.worker_startup_s,
    )


def _check_before(args: argparse.Namespace, config: ReplayConfig) -> None:
    """One-line errors for what cannot run, notes for what will not do what it seems to, and
    the output files opened, before the replay."""
    from pathlib import Path

    if args.prefill_workers >= args.workers:
        raise CliError("--prefill-workers must leave at least one of --workers for decode")
    _check_index_room(args, config)
    if args.slo_itl_quantile is not None and args.slo_itl_ms is None:
        raise CliError("--slo-itl-quantile is a quantile of --slo-itl-ms: give that too")
    _note_ignored_flags(args, config)
    for flag, value in (("--report", args.report), ("--plot", args.plot)):
        if value is not None and not value.strip():  # else quietly not written
            raise CliError(f"{flag} is empty: give a file")
    inputs = {
        "--trace": args.trace,
        "--timing-profile": args.timing_profile,
        "--prefill-timing-profile": args.prefill_timing_profile,
    }
    check_apart({"--report": args.report, "--plot": args.plot}, inputs)
    if args.report:
        check_file(Path(args.report), "--report")
    if args.plot:
        check_image(Path(args.plot), "--plot")
    if args.planner is not None:
        low, high = config.planner.min_workers, config.planner.max_workers
        asked = (
            [("--workers", args.workers)]
            if not args.prefill_workers
            else [
                ("--prefill-workers", args.prefill_workers),
                ("decode workers (the rest of --workers)", args.workers - args.prefill_workers),
            ]
        )
        outside = [f"{flag} {n}" for flag, n in asked if not low <= n <= high]
        if outside:
            print(
                f"armature: note: the planner starts the fleet within --min-workers {low} and "
                f"--max-workers {high} per role, not at {' and '.join(outside)}",
                file=sys.stderr,
            )
        total = config.planner.get_max_total_workers()
        if total is not None and args.workers > total:
            print(
                f"armature: note: the planner starts the fleet within {total} workers in all "
                "(--max-total-workers, or --gpu-budget over --gpus-per-worker), not at "
                f"--workers {args.workers}",
                file=sys.stderr,
            )


def _check_index_room(args: argparse.Namespace, config: ReplayConfig) -> None:
    """A one-line error where a role's fleet could outgrow the router's prefix index."""
    from armature.cli.planner import check_index_room

    check_fits_index("--workers", args.workers)
    if args.planner is not None:
        check_index_room(config.planner)


def _check_result(args: argparse.Namespace, result: ReplayReport, num_requests: int) -> None:
    """A note for rejected requests; a one-line error when none was replayed."""
    if result.num_rejected:
        print(
            f"armature: note: {result.num_rejected} of {num_requests} requests were rejected "
            "(longer than a worker's KV cache or the model's context)",
            file=sys.stderr,
        )
    if not result.num_requests:
        raise CliError(
            "no request was replayed: every one is longer than a worker's KV cache "
            f"(--num-kv-blocks {args.num_kv_blocks} of --block-size {args.block_size}) or "
            "the context"
        )


def _print_summary(args: argparse.Namespace, config: ReplayConfig, report: dict[str, Any]) -> None:
    summary = {
        k: report[k]
        for k in (
            "num_requests",
            "num_rejected",
            "prefix_hit_ratio",
            "prefix_hit_ceiling",
            "throughput_tokens_s",
            "load_skew",
            "num_remote_prefills",
            "goodput_requests_s",
            "goodput_tokens_s",
            "simulated_time_s",
            "wall_time_s",
            "num_engine_steps",
            "worker_seconds",
            "sla_attainment",
        )
    }
    for key in ("goodput_requests_s", "goodput_tokens_s"):
        summary[key] = report[key].get("sla", "n/a (no --slo-ttft-ms / --slo-itl-ms)")
    if config.tiers.is_enabled:
        for key in ("onboarded_token_ratio", "blocks_onboarded", "blocks_offloaded"):
            summary[key] = report[key]
    for key in ("ttft_ms", "itl_ms", "e2e_ms"):
        summary[f"{key} p50/p90/p99"] = "/".join(
            f"{report[key][p]:.1f}" for p in ("p50", "p90", "p99")
        )
    summary["peak_workers"] = _by_role(report["peak_workers"])
    if args.planner:
        summary["planner_decisions"] = _by_role(report["planner_decisions"]) or "none"
        most_wanted = report["planner_most_wanted"]
        summary["planner_limited"] = (
            ", ".join(
                f"{role} {seconds:.0f} s, asked for up to {most_wanted[role]} workers"
                for role, seconds in report["planner_limited_s"].items()
            )
            + " (held by --max-workers, --max-total-workers or --gpu-budget)"
            if report["planner_limited_s"]
            else "never"
        )
    for key, value in summary.items():
        print(f"{key:>24}: {value:.4g}" if isinstance(value, float) else f"{key:>24}: {value}")


def _write_plot(args: argparse.Namespace, config: ReplayConfig, report: ReplayReport) -> None:
    from pathlib import Path

    from armature.sim.fleet_plot import plot_fleet

    source = args.trace or f"synthetic {args.synthetic}"
    rule = f"planner {args.planner}" if args.planner else "static fleet"
    with writing("--plot", args.plot):
        plot_fleet(
            report.timeline,
            Path(args.plot),
            ttft_target_ms=config.planner.ttft_ms,
            itl_target_ms=config.planner.itl_ms,
            title=f"{source}, {rule}: SLA attainment {report.sla_attainment:.3f}, "
            f"{report.worker_seconds:.0f} worker-seconds",
        )
    print(f"{'plot':>24}: {args.plot}")


def _by_role(counts: dict[str, Any]) -> str:
    return ", ".join(f"{key} {value}" for key, value in counts.items())


def _note_ignored_flags(args: argparse.Namespace, config: ReplayConfig) -> None:
    """Settings given where they do nothing: the planner's but its targets without --planner,
    the kv cost's with another router, the tier policy's without a tier."""
    cases: list[tuple[str, type[Any], Collection[str]]] = []
    if args.planner is None:
        targets = ("ttft_ms", "itl_ms")  # they judge every replay
        cases.append(("--planner", PlannerConfig, set(PLANNER_SETTINGS) - set(targets)))
    if args.router not in ("kv", "kv-approx"):
        cases.append(("--router kv or kv-approx", RouterConfig, ROUTER_SETTINGS))
    if not config.tiers.is_enabled:
        cases.append(("a lower KV tier", KvTierConfig, TIER_SETTINGS))
        cases.append(("a lower KV tier", RouterConfig, ("tier_aware",)))
    if args.planner == "load":  # the throughput plan's settings: it never runs
        unread = ("predictor", "season_intervals", "trim_step", "trim_min_scale")
        cases.append(("--planner sla or both", PlannerConfig, unread))
    if args.planner == "sla":  # the load rule's
        cases.append(("--planner load or both", PlannerConfig, ("scale_down_ratio",)))
    if args.planner is not None and not args.prefill_workers:
        roles = [
            f"{end}_{role}_workers" for role in ("prefill", "decode") for end in ("min", "max")
        ]
        cases.append(("--prefill-workers (a disaggregated fleet)", PlannerConfig, roles))
    notes: list[tuple[str, list[str]]] = []
    for needs, config_type, names in cases:
        defaults = config_type()
        ignored = [
            f"--{flag_name(field.name, setting)}"
            for _, field, setting in iter_settings(config_type)
            if field.name in names and is_given(args, field.name, getattr(defaults, field.name))
        ]
        notes.append((needs, ignored))
    if not args.prefill_workers:
        disagg = [
            flag
            for flag, given in (
                ("--max-local-prefill-tokens", _given(args, "max_local_prefill_tokens")),
                ("--transfer-bandwidth-gbs", _given(args, "transfer_bandwidth_gbs")),
                ("--kv-bytes-per-block", _given(args, "kv_bytes_per_block")),
            )
            if given and not (flag == "--kv-bytes-per-block" and config.tiers.is_enabled)
        ]
        notes.append(("--prefill-workers (a disaggregated fleet)", disagg))
    for needs, ignored in notes:
        if ignored:
            print(
                f"armature: note: {', '.join(ignored)} "
                f"{'takes' if len(ignored) == 1 else 'take'} effect with {needs} only",
                file=sys.stderr,
            )


def _given(args: argparse.Namespace, name: str) -> bool:
    """Whether replay's disaggregation argument `name` was given."""
    return is_given(args, name, DISAGG_DEFAULTS[name])


def _planner_config(args: argparse.Namespace) -> PlannerConfig:
    mode = "disagg" if args.prefill_workers else "agg"
    try:
        return PlannerConfig(mode=mode, **{name: getattr(args, name) for name in PLANNER_SETTINGS})
    except ConfigError as exc:
        raise CliError(str(exc)) from None
