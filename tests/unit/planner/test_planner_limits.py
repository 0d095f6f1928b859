"""PlannerConfig's validation (one-line messages the CLI can show) and the limits."""

from __future__ import annotations

import pytest

from armature.config import PlannerConfig
from armature.config.planner import RoleLimits
from armature.errors import ConfigError
from armature.planner import LimitReason
from armature.planner.limits import apply_limits
from armature.protocols.worker import WorkerRole

P, D, A = WorkerRole.PREFILL, WorkerRole.DECODE, WorkerRole.AGG


def test_defaults_are_valid_and_name_the_roles() -> None:
    config = PlannerConfig()
    assert (config.ttft_ms, config.itl_ms, config.slo_attainment) == (500.0, 50.0, 0.95)
    assert config.get_roles() == (P, D)
    assert PlannerConfig(mode="agg").get_roles() == (A,)
    assert config.get_max_total_workers() is None


def test_role_limits_fall_back_to_the_common_ones() -> None:
    config = PlannerConfig(
        min_workers=2, max_workers=6, min_prefill_workers=0, max_decode_workers=10
    )
    assert config.get_role_limits(P) == RoleLimits(0, 6)
    assert config.get_role_limits(D) == RoleLimits(2, 10)
    assert config.get_role_limits(A) == RoleLimits(2, 6)


def test_total_is_the_tighter_of_workers_and_gpus() -> None:
    assert (
        PlannerConfig(
            max_total_workers=10, gpus_per_worker=2, gpu_budget=16
        ).get_max_total_workers()
        == 8
    )
    assert PlannerConfig(gpus_per_worker=4, gpu_budget=8).get_max_total_workers() == 2


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            {"min_workers": 5, "max_workers": 4},
            "prefill workers: the minimum (5) is above the maximum (4); check "
            "--min-workers/--max-workers",
        ),
        (
            {"min_decode_workers": 9},
            "decode workers: the minimum (9) is above the maximum (8); check "
            "--min-decode-workers/--max-workers",
        ),
        (
            {"min_prefill_workers": 4, "max_prefill_workers": 2},
            "prefill workers: the minimum (4) is above the maximum (2); check "
            "--min-prefill-workers/--max-prefill-workers",
        ),
        (
            {"min_workers": 2, "max_total_workers": 3},
            "--max-total-workers 3 is below the sum of the roles' minimum workers (4)",
        ),
        (
            {"min_workers": 2, "gpus_per_worker": 2, "gpu_budget": 7},
            "--gpu-budget 7 is below what the roles' minimum workers take (4 x 2 GPUs = 8)",
        ),
        (
            {"scale_up_cooldown_s": 30.0, "scale_down_cooldown_s": 10.0},
            "--scale-down-cooldown-s must be >= --scale-up-cooldown-s",
        ),
        (
            {"predictor": "arima"},
            "--predictor must be one of constant, moving-average, holt-winters",
        ),
    ],
)
def test_impossible_limits_are_one_line_value_errors(settings: dict, message: str) -> None:
    with pytest.raises(ValueError) as raised:
        PlannerConfig(**settings)
    assert isinstance(raised.value, ConfigError)
    assert str(raised.value) == message
    assert "\n" not in message


def test_agg_mode_counts_one_pool_against_the_total() -> None:
    PlannerConfig(mode="agg", min_workers=3, max_total_workers=3)  # 3 <= 3: fine


def test_each_role_is_clamped_to_its_min_and_max() -> None:
    config = PlannerConfig(min_workers=1, max_workers=4)
    assert apply_limits(config, {P: 0, D: 9}) == {
        P: (1, LimitReason.MIN_WORKERS),
        D: (4, LimitReason.MAX_WORKERS),
    }
    assert apply_limits(config, {P: 2, D: 3}) == {P: (2, None), D: (3, None)}


def test_over_the_total_roles_shrink_in_proportion() -> None:
    """Wanted 6 + 4 = 10 over a total of 8: shares 4.8 and 3.2 -> floors 4 and 3, the one
    left goes to the larger fraction (prefill's 0.8): 5 and 3."""
    config = PlannerConfig(max_total_workers=8)
    assert apply_limits(config, {P: 6, D: 4}) == {
        P: (5, LimitReason.TOTAL_WORKERS),
        D: (3, LimitReason.TOTAL_WORKERS),
    }


def test_over_the_total_the_mins_still_hold() -> None:
    """Mins 2 and 2, total 4, wanted 8 + 2: shares 3.2 and 0.8 -> 3 and max(2, 0) = 2,
    one over: prefill is furthest above its min, so 2 and 2."""
    config = PlannerConfig(min_workers=2, max_total_workers=4)
    assert apply_limits(config, {P: 8, D: 2}) == {
        P: (2, LimitReason.TOTAL_WORKERS),
        D: (2, None),
    }


def test_planner_settings_round_trip_through_their_flags() -> None:
    """Ready for the planner command: each setting is one flag (no clashes), and `to_argv`
    then parsing gives the configuration back."""
    from armature.cli.options import Parser, add_settings, read_settings
    from armature.config import to_argv

    config = PlannerConfig(
        ttft_ms=300.0,
        itl_ms=25.0,
        slo_attainment=0.99,
        mode="agg",
        interval_s=30.0,
        predictor="moving-average",
        season_intervals=24,
        queue_aware=False,
        min_prefill_workers=0,
        max_decode_workers=12,
        gpus_per_worker=2,
        gpu_budget=16,
        scale_down_cooldown_s=120.0,
        decode_kv_share=0.7,
    )
    parser = Parser(prog="armature plan")
    add_settings(parser, PlannerConfig(), environ={})
    argv = to_argv(config)
    assert "--planner-queue-blind" in argv and "--planner-interval-s" in argv
    assert read_settings(parser.parse_args(argv), PlannerConfig) == config
    with pytest.raises(SystemExit):
        parser.parse_args(["--slo-attainment", "1.0"])
    assert read_settings(parser.parse_args(["--planner-kv-share", "1"]), PlannerConfig) == (
        PlannerConfig(decode_kv_share=1.0)
    )
    for bad in ("0", "1.5", "half"):
        with pytest.raises(SystemExit):
            parser.parse_args(["--planner-kv-share", bad])
