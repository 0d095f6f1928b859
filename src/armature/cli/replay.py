"""`armature replay`: offline discrete-event replay of a trace or a synthetic workload."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Collection
from typing import Any

from armature.cli.options import (
    CliError,
    HelpFormatter,
    add_settings,
    arg_type,
    check_fits_index,
    setup_logging,
)
from armature.cli.paths import check_apart, check_file, check_image
from armature.cli.replay_workload import load_requests
from armature.config import (
    KvTierConfig,
    PlannerConfig,
    RouterConfig,
    at_least_one,
    flag_name,
    fraction,
    iter_settings,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
)
from armature.config.routing import check_routed_ttl
from armature.config.values import float_at_least, int64, kv_blocks
from armature.errors import ConfigError
from armature.sim.replay_config import (
    PLANNER_RULES,
    REPLAY_POLICIES,
    ReplayConfig,
    ReplayReport,
    bytes_s_from_gbs,
    gbs_from_bytes_s,
)

__all__ = ["add_parser", "run"]

DEFAULTS = ReplayConfig()
# the planner's settings replay takes: all but its mode (from --prefill-workers)
PLANNER_SETTINGS = tuple(name for name in PlannerConfig.__dataclass_fields__ if name != "mode")
# the router settings replay takes, which only the kv policies read
ROUTER_SETTINGS = (
    "overlap_weight",
    "decode_weight",
    "temperature",
    "load_bound",
    "share_bound",
    "share_window",
    "routed_ttl_s",
)


# the lower KV tiers' settings replay takes: all but where real blocks would be stored and
# how often a real shared store is listed (the modeled G4 is each worker's own)
TIER_SETTINGS = tuple(
    name
    for name in KvTierConfig.__dataclass_fields__
    if name not in ("kv_disk_dir", "kv_remote_endpoint", "kv_remote_refresh_s")
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    replay = sub.add_parser(
        "replay",
        help="simulate a request trace through mocker workers and the router (offline)",
        description="Discrete-event replay of a Mooncake-format trace on a virtual clock: "
        "N mocker workers (real scheduler and KV cache, timing model) behind the real router.",
        formatter_class=HelpFormatter,
    )
    _add_workload_args(replay)
    _add_shape_args(replay)
    _add_fleet_args(replay)
    add_settings(
        replay,
        RouterConfig(),
        only=ROUTER_SETTINGS,
    )
    _add_disagg_args(replay)
    tiers = replay.add_argument_group(
        "lower KV tiers",
        "every worker's G2 host, G3 disk and G4 shared tiers, modeled as the mocker models "
        "them: the real tier policy, no bytes, a load taking blocks x --kv-bytes-per-block / "
        "the tier's bandwidth",
    )
    add_settings(tiers, KvTierConfig(), only=TIER_SETTINGS)
    add_settings(tiers, RouterConfig(), only=("tier_aware",))
    _add_goodput_args(replay)
    _add_planner_args(replay)
    replay.add_argument(
        "--seed", type=arg_type(int64), default=DEFAULTS.seed, help="seed for prompts and tokens"
    )
    replay.add_argument(
        "--reference-steps",
        action="store_true",
        help="simulate every engine step on its own instead of a batch of decodes' steps at "
        "once (the same report, slower: the reference the fast path is tested against)",
    )
    replay.add_argument("--report", default=None, help="write the report as JSON here")
    replay.add_argument(
        "--plot",
        default=None,
        help="write a PNG of the workers, the arrival rate, TTFT and ITL over time here",
    )


def _add_workload_args(replay: argparse.ArgumentParser) -> None:
    source = replay.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace", help="Mooncake JSONL trace file")
    source.add_argument(
        "--synthetic",
        choices=["prefix-groups", "multi-turn"],
        help="a generated workload instead of a trace (see --num-requests, --rate-rps)",
    )
    replay.add_argument(
        "--num-requests",
        type=arg_type(positive_int),
        default=1000,
        help="synthetic: requests to generate",
    )
    replay.add_argument(
        "--rate-rps",
        type=arg_type(positive_float),
        default=8.0,
        help="synthetic: mean arrival rate (Poisson)",
    )
    replay.add_argument(
        "--time-scale",
        type=arg_type(positive_float),
        default=1.0,
        help="multiply arrival times (below 1: a higher request rate)",
    )
    replay.add_argument(
        "--limit",
        type=arg_type(positive_int),
        default=None,
        help="replay only the first N requests",
    )


def _add_shape_args(replay: argparse.ArgumentParser) -> None:
    shape = replay.add_argument_group(
        "rate shape",
        "move the workload's arrivals so its rate follows a shape (the requests and their "
        "order stay): a step (x --shape-factor from --step-at-s for --step-for-s) or a day "
        "(a cosine from the trough to --shape-factor x at half of --shape-period-s)",
    )
    shape.add_argument("--rate-shape", choices=["step", "diurnal"], default=None)
    shape.add_argument(
        "--shape-factor",
        type=arg_type(at_least_one),
        default=4.0,
        help="the peak's rate over the base rate",
    )
    shape.add_argument(
        "--step-at-s",
        type=arg_type(non_negative_float),
        default=120.0,
        help="step: seconds from the first arrival to the step",
    )
    shape.add_argument(
        "--step-for-s", type=arg_type(positive_float), default=300.0, help="step: its length"
    )
    shape.add_argument(
        "--shape-period-s",
        type=arg_type(positive_float),
        default=1800.0,
        help="diurnal: the length of one day, seconds",
    )


def _add_planner_args(replay: argparse.ArgumentParser) -> None:
    planner = replay.add_argument_group(
        "planner",
        "the planner in the loop, on the virtual clock: it sizes the fleet (--workers and "
        "--prefill-workers at start) by the throughput plan (sla), the load rule (load) or "
        "both; its targets --ttft-ms and --itl-ms also give every replay's sla_attainment",
    )
    planner.add_argument(
        "--planner",
        choices=list(PLANNER_RULES),
        default=None,
        help="size the fleet with the planner's throughput plan (sla), its load rule (load) or "
        "both; without it the fleet is static",
    )
    add_settings(planner, PlannerConfig(), only=PLANNER_SETTINGS)


def _add_fleet_args(replay: argparse.ArgumentParser) -> None:
    """The simulated workers and the router; the defaults are ReplayConfig's."""
    replay.add_argument(
        "--workers",
        type=arg_type(positive_int),
        default=DEFAULTS.num_workers,
        help="mocker workers",
    )
    replay.add_argument(
        "--router", choices=list(REPLAY_POLICIES), default=DEFAULTS.router, help="routing policy"
    )
    replay.add_argument(
        "--block-size",
        type=arg_type(positive_int),
        default=DEFAULTS.block_size,
        help="tokens per block",
    )
    replay.add_argument(
        "--num-kv-blocks",
        type=arg_type(kv_blocks),
        default=DEFAULTS.num_kv_blocks,
        help="KV blocks per worker",
    )
    replay.add_argument(
        "--max-num-batched-tokens",
        type=arg_type(positive_int),
        default=DEFAULTS.max_num_batched_tokens,
        help="tokens per engine step",
    )
    replay.add_argument(
        "--max-num-seqs",
        type=arg_type(positive_int),
        default=DEFAULTS.max_num_seqs,
        help="requests running at once per worker",
    )
    replay.add_argument(
        "--speedup",
        type=arg_type(float_at_least(1e-3)),  # slower steps: a replay simulating years
        default=DEFAULTS.speedup_ratio,
        help="divide every simulated step time by this",
    )
    replay.add_argument(
        "--timing-profile",
        default=None,
        help="step times from this profile of a real engine (armature profile --output) "
        "instead of the default H100-class model",
    )
    replay.add_argument(
        "--prefill-timing-profile",
        default=None,
        help="disaggregated: the prefill workers' step times from this profile (default: "
        "--timing-profile's, or the default model)",
    )


def _add_disagg_args(replay: argparse.ArgumentParser) -> None:
    replay.add_argument(
        "--prefill-workers",
        type=arg_type(non_negative_int),
        default=DEFAULTS.num_prefill_workers,
        help="disaggregated: how many of --workers are prefill workers (the rest decode)",
    )
    replay.add_argument(
        "--max-local-prefill-tokens",
        type=arg_type(non_negative_int),
        default=DEFAULTS.max_local_prefill_tokens,
        help="disaggregated: prefill on the decode worker when fewer tokens are uncached",
    )
    replay.add_argument(
        "--transfer-bandwidth-gbs",
        type=arg_type(positive_float),
        default=gbs_from_bytes_s(DEFAULTS.transfer_bandwidth_bytes_s),
        help="disaggregated: KV transfer bandwidth between workers, GB/s",
    )
    replay.add_argument(
        "--kv-bytes-per-block",
        type=arg_type(positive_int),
        default=DEFAULTS.kv_bytes_per_block,
        help="bytes of one KV block, for KV transfers and lower-tier loads and sizes "
        "(default: an 8B model, bf16, 16 tokens)",
    )


def _add_goodput_args(replay: argparse.ArgumentParser) -> None:
    replay.add_argument(
        "--slo-ttft-ms", type=arg_type(positive_float), default=None, help="goodput: TTFT bound"
    )
    replay.add_argument(
        "--slo-itl-ms",
        type=arg_type(positive_float),
        default=None,
        help="goodput: bound on a request's mean inter-token latency",
    )
    replay.add_argument(
        "--slo-itl-quantile",
        type=arg_type(fraction),
        default=None,
        help="goodput: apply --slo-itl-ms to this quantile of each request's ITLs (e.g. "
        "0.99) instead of their mean",
    )


def run(args: argparse.Namespace) -> int:
    setup_logging("info")
    import dataclasses
    import json
    from pathlib import Path

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
        Path(args.report).write_text(json.dumps(report, indent=2) + "\n")
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
        slos=(Slo("sla", args.slo_ttft_ms, args.slo_itl_ms, args.slo_itl_quantile),),
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
    if args.planner is not None and not args.prefill_workers:
        low, high = config.planner.min_workers, config.planner.max_workers
        if not low <= args.workers <= high:
            print(
                f"armature: note: the planner starts the fleet within --min-workers {low} and "
                f"--max-workers {high}, not at --workers {args.workers}",
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
        summary[key] = report[key]["sla"]
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
            + " (held by --max-workers / --max-total-workers)"
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
    for needs, config_type, names in cases:
        defaults = config_type()
        ignored = [
            f"--{flag_name(field.name, setting)}"
            for _, field, setting in iter_settings(config_type)
            if field.name in names and getattr(args, field.name) != getattr(defaults, field.name)
        ]
        if ignored:
            print(
                f"armature: note: {', '.join(ignored)} "
                f"{'takes' if len(ignored) == 1 else 'take'} effect with {needs} only",
                file=sys.stderr,
            )


def _planner_config(args: argparse.Namespace) -> PlannerConfig:
    mode = "disagg" if args.prefill_workers else "agg"
    try:
        return PlannerConfig(mode=mode, **{name: getattr(args, name) for name in PLANNER_SETTINGS})
    except ConfigError as exc:
        raise CliError(str(exc)) from None
