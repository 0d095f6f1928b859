"""`armature replay`: offline discrete-event replay of a trace or a synthetic workload."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from armature.cli.options import CliError, add_settings, arg_type, setup_logging
from armature.config import (
    KvTierConfig,
    RouterConfig,
    fraction,
    non_negative_int,
    positive_float,
    positive_int,
)
from armature.sim.replay_config import REPLAY_POLICIES, ReplayConfig

if TYPE_CHECKING:
    from armature.workload.traces import TraceRequest

__all__ = ["add_parser", "run"]

DEFAULTS = ReplayConfig()
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
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    _add_workload_args(replay)
    _add_fleet_args(replay)
    add_settings(replay, RouterConfig(), only=("overlap_weight", "decode_weight", "temperature"))
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
    replay.add_argument(
        "--seed", type=int, default=DEFAULTS.seed, help="seed for prompts and tokens"
    )
    replay.add_argument("--report", default=None, help="write the report as JSON here")


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
        type=arg_type(positive_int),
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
        type=arg_type(positive_float),
        default=DEFAULTS.speedup_ratio,
        help="divide every simulated step time by this",
    )
    replay.add_argument(
        "--timing-profile",
        default=None,
        help="step times from this profile of a real engine (armature profile --output) "
        "instead of the default H100-class model",
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
        default=DEFAULTS.transfer_bandwidth_bytes_s / 1e9,
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

    from armature.sim.profile_timing import load_profile_timing
    from armature.sim.replay import replay
    from armature.workload.measure import Slo
    from armature.workload.traces import TraceFormatError, read_mooncake_trace

    timing = None
    if args.timing_profile is not None:  # before the trace: a bad profile fails at once
        timing = load_profile_timing(Path(args.timing_profile), args.speedup)
    if args.synthetic:
        requests = _synthetic_workload(args)
    else:
        path = Path(args.trace)
        if not path.is_file():
            raise CliError(f"trace file {path} does not exist")
        try:
            requests = read_mooncake_trace(path, limit=args.limit, time_scale=args.time_scale)
        except TraceFormatError as exc:
            raise CliError(str(exc)) from None
    config = ReplayConfig(
        num_workers=args.workers,
        router=args.router,
        block_size=args.block_size,
        num_kv_blocks=args.num_kv_blocks,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        speedup_ratio=args.speedup,
        overlap_weight=args.overlap_weight,
        decode_weight=args.decode_weight,
        router_temperature=args.temperature,
        seed=args.seed,
        num_prefill_workers=args.prefill_workers,
        max_local_prefill_tokens=args.max_local_prefill_tokens,
        transfer_bandwidth_bytes_s=args.transfer_bandwidth_gbs * 1e9,
        kv_bytes_per_block=args.kv_bytes_per_block,
        tiers=KvTierConfig(**{name: getattr(args, name) for name in TIER_SETTINGS}),
        tier_aware=args.tier_aware,
        slos=(Slo("sla", args.slo_ttft_ms, args.slo_itl_ms, args.slo_itl_quantile),),
    )
    if args.prefill_workers >= args.workers:
        raise CliError("--prefill-workers must leave at least one of --workers for decode")
    report = dataclasses.asdict(replay(requests, config, timing))
    summary = {
        k: report[k]
        for k in (
            "num_requests",
            "num_rejected",
            "prefix_hit_ratio",
            "throughput_tokens_s",
            "load_skew",
            "num_remote_prefills",
            "goodput_requests_s",
            "goodput_tokens_s",
            "simulated_time_s",
            "wall_time_s",
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
    for key, value in summary.items():
        print(f"{key:>24}: {value:.4g}" if isinstance(value, float) else f"{key:>24}: {value}")
    if args.report:
        Path(args.report).write_text(json.dumps(report, indent=2) + "\n")
        print(f"{'report':>24}: {args.report}")
    return 0


def _synthetic_workload(args: argparse.Namespace) -> list[TraceRequest]:
    """Prefix groups: 8 groups sharing 2,048-token prefixes + 512 unique tokens. Multi-turn:
    4-turn sessions on a shared 1,024-token system prompt, 256 tokens per turn."""
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
    return synthetic_multi_turn(
        num_sessions=max(1, args.num_requests // 4),
        turns_per_session=4,
        system_prompt_tokens=1024,
        turn_tokens=256,
        output_length=128,
        rate_rps=args.rate_rps / 4,
        think_time_ms=5000.0,
        seed=args.seed,
    )
