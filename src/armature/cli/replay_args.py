"""`armature replay`'s flags: the workload, its rate shape, the simulated fleet and router,
disaggregation, the lower KV tiers, goodput bounds and the planner in the loop."""

from __future__ import annotations

import argparse

from armature.cli.options import HelpFormatter, add_settings, arg_type
from armature.config import (
    KvTierConfig,
    PlannerConfig,
    RouterConfig,
    at_least_one,
    fraction,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
)
from armature.config.values import float_at_least, int64, kv_blocks
from armature.sim.replay_config import (
    PLANNER_RULES,
    REPLAY_POLICIES,
    ReplayConfig,
    gbs_from_bytes_s,
)

__all__ = [
    "DEFAULT_NUM_REQUESTS",
    "DEFAULT_RATE_RPS",
    "DISAGG_DEFAULTS",
    "PLANNER_SETTINGS",
    "ROUTER_SETTINGS",
    "SHAPE_DEFAULTS",
    "TIER_SETTINGS",
    "add_parser",
]

DEFAULTS = ReplayConfig()
# the synthetic workload's and the rate shapes' defaults: a flag away from its default
# without the workload or shape it is for is refused (cli/replay_workload.py)
DEFAULT_NUM_REQUESTS = 1000
DEFAULT_RATE_RPS = 8.0
# the disaggregation flags' defaults: one away from its default without --prefill-workers
# is noted (cli/replay.py)
DISAGG_DEFAULTS: dict[str, float] = {
    "max_local_prefill_tokens": DEFAULTS.max_local_prefill_tokens,
    "transfer_bandwidth_gbs": gbs_from_bytes_s(DEFAULTS.transfer_bandwidth_bytes_s),
    "kv_bytes_per_block": DEFAULTS.kv_bytes_per_block,
}
SHAPE_DEFAULTS = {
    "shape_factor": 4.0,
    "step_at_s": 120.0,
    "step_for_s": 300.0,
    "shape_period_s": 1800.0,
}
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
        default=DEFAULT_NUM_REQUESTS,
        help="synthetic: requests to generate",
    )
    replay.add_argument(
        "--rate-rps",
        type=arg_type(positive_float),
        default=DEFAULT_RATE_RPS,
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
        default=SHAPE_DEFAULTS["shape_factor"],
        help="the peak's rate over the base rate",
    )
    shape.add_argument(
        "--step-at-s",
        type=arg_type(non_negative_float),
        default=SHAPE_DEFAULTS["step_at_s"],
        help="step: seconds from the first arrival to the step",
    )
    shape.add_argument(
        "--step-for-s",
        type=arg_type(positive_float),
        default=SHAPE_DEFAULTS["step_for_s"],
        help="step: its length",
    )
    shape.add_argument(
        "--shape-period-s",
        type=arg_type(positive_float),
        default=SHAPE_DEFAULTS["shape_period_s"],
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
        help="divide every simulated time (steps, KV transfers, lower-tier loads) by this",
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
        default=DISAGG_DEFAULTS["max_local_prefill_tokens"],
        help="disaggregated: prefill on the decode worker when fewer tokens are uncached",
    )
    replay.add_argument(
        "--transfer-bandwidth-gbs",
        type=arg_type(positive_float),
        default=DISAGG_DEFAULTS["transfer_bandwidth_gbs"],
        help="disaggregated: KV transfer bandwidth between workers, GB/s",
    )
    replay.add_argument(
        "--kv-bytes-per-block",
        type=arg_type(positive_int),
        default=DISAGG_DEFAULTS["kv_bytes_per_block"],
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
