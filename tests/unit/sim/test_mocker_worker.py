"""The replay's worker factory: timing by role, the pool's utilization wired into the timing,
lower tiers modeled on the simulation's clock only when the replay has them."""

from __future__ import annotations

from dataclasses import replace

from armature.config import KvTierConfig
from armature.sim.clock import EventClock
from armature.sim.mocker_worker import MockerWorkerFactory
from armature.sim.modeled_tiers import ModeledTiers
from armature.sim.replay_config import ReplayConfig
from armature.sim.timing import PolynomialTiming

CONFIG = ReplayConfig(num_workers=2, block_size=16, num_kv_blocks=64, seed=1)
DECODE, PREFILL = PolynomialTiming(), PolynomialTiming(min_decode_ms=2.0)


def factory(config: ReplayConfig) -> MockerWorkerFactory:
    return MockerWorkerFactory(config, 512, DECODE, PREFILL, EventClock(lambda: 0.0))


def test_the_role_picks_the_timing_and_the_pool_is_the_engine_s() -> None:
    make = factory(CONFIG).make
    prefill, new_prefill, worker = make("prefill-0"), make("prefill-new-3"), make("worker-0")
    assert prefill.runner.timing is PREFILL and new_prefill.runner.timing is PREFILL
    assert worker.runner.timing is DECODE
    assert worker.core.pool.num_blocks == 64 and worker.core.max_model_len == 512
    assert worker.tiers is None and worker.core.tiers is None
    assert worker.runner.kv_utilization() == 0.0
    worker.core.pool.allocate(16)
    assert worker.runner.kv_utilization() == 0.25


def test_lower_tiers_are_modeled_when_the_replay_has_them() -> None:
    worker = factory(replace(CONFIG, tiers=KvTierConfig(kv_host_blocks=128))).make("worker-1")
    assert isinstance(worker.tiers, ModeledTiers)
    assert worker.core.tiers is worker.tiers  # the pool's eviction observer
