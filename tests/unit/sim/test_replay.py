"""Offline replay: deterministic reports, routing quality on a prefix-heavy workload, rejects."""

from __future__ import annotations

import gc
from dataclasses import asdict, replace

import pytest

from armature.backends import Backend
from armature.config import KvTierConfig
from armature.kv.block_pool import POOL_BACKEND_ENV_VAR, has_native_pool
from armature.router.holder_store import BACKEND_ENV_VAR, has_native_index
from armature.router.routed_index import has_native_routed
from armature.sim.replay import (
    REPLAY_GC_THRESHOLD,
    ReplayConfig,
    _young_collections_every,
    replay,
)
from armature.sim.timing import PolynomialTiming, StepWork
from armature.workload.measure import Slo
from armature.workload.traces import TraceRequest, synthetic_multi_turn, synthetic_prefix_groups

WORKLOAD = synthetic_prefix_groups(
    num_requests=120,
    num_groups=6,
    shared_prefix_tokens=2048,
    unique_tokens=256,
    output_length=16,
    rate_rps=40.0,
    seed=5,
)
CONFIG = ReplayConfig(num_workers=4, block_size=16, num_kv_blocks=2048, seed=1)


def without_wall_time(report: object) -> dict[str, object]:
    data = asdict(report)  # type: ignore[call-overload]
    data.pop("wall_time_s")
    return data


def test_same_seed_same_report() -> None:
    a = replay(WORKLOAD, CONFIG)
    b = replay(WORKLOAD, CONFIG)
    assert without_wall_time(a) == without_wall_time(b)
    assert a.num_requests == 120 and a.num_rejected == 0
    assert sum(a.requests_per_worker.values()) == 120


def test_kv_routing_beats_round_robin_on_shared_prefixes() -> None:
    # 6 groups' prefixes (128 blocks each) do not fit in one worker's 400 blocks: round-robin
    # spreads every group over every worker and evicts; kv keeps each group on few workers
    tight = replace(CONFIG, num_kv_blocks=400)
    kv = replay(WORKLOAD, tight)
    rr = replay(WORKLOAD, replace(tight, router="round-robin"))
    assert kv.prefix_hit_ratio > rr.prefix_hit_ratio + 0.05
    assert kv.ttft_ms.p50 < rr.ttft_ms.p50
    assert rr.load_skew == 1.0  # 120 requests / 4 workers exactly


def test_requests_larger_than_a_worker_are_rejected_not_lost() -> None:
    huge = TraceRequest(
        arrival_ms=0.0, input_length=5000, output_length=4, hash_ids=tuple(range(10))
    )
    small = TraceRequest(arrival_ms=1.0, input_length=100, output_length=4, hash_ids=(99,))
    report = replay([huge, small], replace(CONFIG, num_kv_blocks=64))
    assert (report.num_requests, report.num_rejected) == (1, 1)


def test_a_replay_restores_the_collector_thresholds() -> None:
    before = gc.get_threshold()
    seen: list[tuple[int, int, int]] = []

    class Watched(PolynomialTiming):
        def step_ms(self, work: StepWork) -> float:
            seen.append(gc.get_threshold())
            return super().step_ms(work)

    replay(WORKLOAD[:5], CONFIG, Watched())
    assert seen and all(t[0] == REPLAY_GC_THRESHOLD and t[1:] == before[1:] for t in seen)
    assert gc.get_threshold() == before
    # overlapping replays (threads), ending in either order, leave the first one's thresholds
    for first_to_end in (0, 1):
        outer, inner = (
            _young_collections_every(REPLAY_GC_THRESHOLD),
            _young_collections_every(REPLAY_GC_THRESHOLD),
        )
        outer.__enter__()
        inner.__enter__()
        ending = [outer, inner] if first_to_end == 0 else [inner, outer]
        for manager in ending:
            manager.__exit__(None, None, None)
        assert gc.get_threshold() == before


def test_engine_steps_count_every_batch() -> None:
    """One request alone on one worker: a 100-token prompt in one prefill step (which gives
    the first token), then one decode step per other output token."""
    request = TraceRequest(arrival_ms=0.0, input_length=100, output_length=7, hash_ids=(1,))
    report = replay([request], replace(CONFIG, num_workers=1))
    assert report.num_engine_steps == 1 + 6
    two = TraceRequest(arrival_ms=0.0, input_length=100, output_length=7, hash_ids=(2,))
    # the second arrives as the first's prefill has started: its prefill joins the first's
    # first decode step, and its own 6 decodes end one step after the first's
    both = replay([request, two], replace(CONFIG, num_workers=1))
    assert both.num_engine_steps == 1 + 6 + 1


def test_goodput_per_slo_over_simulated_time() -> None:
    """Replay's goodput and percentiles are workload.measure's: requests (and tokens) meeting
    each SLO per second of simulated time; the p50 of 120 TTFTs lies halfway between the 60th
    and 61st, so exactly 60 requests meet a TTFT bound at the p50."""
    ttft_p50_ms = replay(WORKLOAD, CONFIG).ttft_ms.p50
    slos = (Slo("any"), Slo("never", ttft_ms=0.0), Slo("p50", ttft_ms=ttft_p50_ms))
    report = replay(WORKLOAD, replace(CONFIG, slos=slos))
    span_s = report.simulated_time_s
    assert report.goodput_requests_s["any"] == 120 / span_s
    assert report.goodput_tokens_s["any"] == report.throughput_tokens_s
    assert report.goodput_requests_s["never"] == report.goodput_tokens_s["never"] == 0.0
    assert report.goodput_requests_s["p50"] == 60 / span_s
    assert report.goodput_tokens_s["p50"] == 60 * 16 / span_s


def test_the_span_ends_with_the_work_not_the_monitors_tick() -> None:
    """One request alone: the replay's span is from its arrival to its last token (its
    end-to-end latency), not to the fleet monitor's next 5 s sample after it; a static
    fleet's worker-seconds end there too. Its 7 steps take well under a load interval."""
    request = TraceRequest(arrival_ms=0.0, input_length=100, output_length=7, hash_ids=(1,))
    report = replay([request], replace(CONFIG, num_workers=1))
    assert report.e2e_ms.p50 < 1000.0 * CONFIG.planner.load_interval_s
    assert report.simulated_time_s * 1000.0 == pytest.approx(report.e2e_ms.p50)
    assert report.worker_seconds == pytest.approx(report.simulated_time_s)
    assert report.throughput_tokens_s == pytest.approx(7 / report.simulated_time_s)


MULTI_TURN = synthetic_multi_turn(
    num_sessions=16,
    turns_per_session=3,
    system_prompt_tokens=256,
    turn_tokens=128,
    output_length=8,
    rate_rps=2.0,
    think_time_ms=3000.0,
    seed=3,
)
TINY_G1 = ReplayConfig(num_workers=2, block_size=16, num_kv_blocks=100, seed=1)


def test_a_host_tier_brings_back_what_a_tiny_g1_evicts() -> None:
    """A session's next turn comes 3 s later; by then the tiny G1 (100 blocks, a prompt is
    up to 40) evicted its prefix, and the host tier (G2) gives it back. The hit ratio counts
    the onboarded blocks' tokens; every request completes either way. Tier-blind routing
    sees only G1, so a turn often lands on the worker without its session's blocks;
    tier-aware routing follows them into G2 and has 60% more hits."""
    alone = replay(MULTI_TURN, TINY_G1)
    tiered_config = replace(TINY_G1, tiers=KvTierConfig(kv_host_blocks=1024))
    blind = replay(MULTI_TURN, replace(tiered_config, tier_aware=False))
    aware = replay(MULTI_TURN, tiered_config)
    assert alone.num_requests == blind.num_requests == aware.num_requests == 48
    assert alone.num_rejected == blind.num_rejected == aware.num_rejected == 0
    assert (alone.prefix_hit_ratio, alone.onboarded_token_ratio) == (0.032552083333333336, 0.0)
    assert (alone.blocks_onboarded, alone.blocks_offloaded) == ({}, {})
    assert blind.prefix_hit_ratio == 0.20833333333333334
    assert blind.blocks_onboarded == {"g2->g1": 270}
    assert blind.blocks_offloaded == {"g1->g2": 1117}
    prompt_tokens = sum(r.input_length for r in MULTI_TURN)
    assert blind.onboarded_token_ratio == 270 * 16 / prompt_tokens
    assert aware.prefix_hit_ratio == 0.3333333333333333
    assert aware.blocks_onboarded == {"g2->g1": 450}
    assert aware.onboarded_token_ratio == 450 * 16 / prompt_tokens
    assert without_wall_time(replay(MULTI_TURN, tiered_config)) == without_wall_time(aware)


def test_disaggregated_replay_runs_the_tiers_on_every_worker() -> None:
    config = replace(TINY_G1, num_workers=3, num_prefill_workers=1)
    tiered = replay(MULTI_TURN, replace(config, tiers=KvTierConfig(kv_host_blocks=1024)))
    assert (tiered.num_requests, tiered.num_remote_prefills) == (48, 48)
    assert tiered.prefix_hit_ratio > replay(MULTI_TURN, config).prefix_hit_ratio


def test_disaggregated_replay_runs_prefill_workers_on_their_own_step_times() -> None:
    """Prefill workers 10x slower than the decode worker: TTFT (the prefill's first token)
    grows 10x; the decode worker's steps, the ITLs after the first, are the same."""
    requests = [TraceRequest(i * 1000.0, 512, 8, (3 * i,)) for i in range(5)]
    config = ReplayConfig(num_workers=2, num_prefill_workers=1, num_kv_blocks=512)
    fast = PolynomialTiming(speedup_ratio=10.0)
    same = replay(requests, config, fast)
    slow = replay(requests, config, fast, PolynomialTiming(speedup_ratio=1.0))
    assert slow.num_remote_prefills == same.num_remote_prefills == 5
    assert slow.ttft_ms.p50 == pytest.approx(10 * same.ttft_ms.p50)
    assert slow.itl_ms.p50 == pytest.approx(same.itl_ms.p50)


def test_disaggregated_load_skew_is_the_decode_workers_own() -> None:
    """Requests of one output token end on their prefill worker: they are counted there,
    but the skew is over the decode workers, which the router balances."""
    requests = [TraceRequest(i * 200.0, 256, 1 if i % 4 == 0 else 8, (i,)) for i in range(40)]
    config = ReplayConfig(
        num_workers=4, num_prefill_workers=2, num_kv_blocks=512, router="round-robin"
    )
    report = replay(requests, config)
    per_worker = report.requests_per_worker
    assert sum(per_worker.values()) == 40
    decode = [n for w, n in per_worker.items() if not w.startswith("prefill-")]
    assert sum(decode) == 30 and len(decode) == 2  # the 10 one-token requests are not theirs
    assert report.load_skew == pytest.approx(max(decode) / (sum(decode) / 2))


def test_prefix_hit_ceiling_is_reached_by_one_worker_with_room_for_everything() -> None:
    """One worker whose cache holds every block, requests far apart (each prefilled before
    the next arrives): the engine finds exactly what an infinite shared cache would, so the
    hit ratio is the ceiling. Spread round-robin over 4 workers it falls below it; the
    ceiling, a property of the requests, stays."""
    spaced = [replace(r, arrival_ms=i * 10_000.0) for i, r in enumerate(WORKLOAD[:40])]
    alone = replay(spaced, replace(CONFIG, num_workers=1, num_kv_blocks=8192))
    assert alone.prefix_hit_ceiling > 0.5
    assert alone.prefix_hit_ratio == alone.prefix_hit_ceiling
    spread = replay(spaced, replace(CONFIG, router="round-robin", num_kv_blocks=8192))
    assert spread.prefix_hit_ceiling == alone.prefix_hit_ceiling
    assert spread.prefix_hit_ratio < spread.prefix_hit_ceiling


@pytest.mark.parametrize(
    ("env_var", "built"),
    [
        pytest.param(BACKEND_ENV_VAR, has_native_index() and has_native_routed(), id="router"),
        pytest.param(POOL_BACKEND_ENV_VAR, has_native_pool(), id="block-pool"),
    ],
)
def test_the_native_and_python_backends_give_the_same_replay(
    monkeypatch: pytest.MonkeyPatch, env_var: str, built: bool
) -> None:
    """The router's indexes, or the workers' block pools, in C or in Python: the same report,
    every field (kv router on shared prefixes with evictions, so blocks are cached, hit,
    evicted and reused, and come and go from the index)."""
    if not built:
        pytest.skip("the extension was not built (no C compiler at install)")
    tight = replace(CONFIG, num_kv_blocks=400)
    reports = []
    for backend in Backend:
        monkeypatch.setenv(env_var, backend.value)
        reports.append(without_wall_time(replay(WORKLOAD, tight)))
    assert reports[0] == reports[1]
    assert reports[0]["prefix_hit_ratio"] > 0
