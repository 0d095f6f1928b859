"""The mocker's modeled KV tiers: the real tier policy, loads done at the modeled time on a
virtual clock (one FIFO link), pins released, and a mocker engine onboarding through them."""

from __future__ import annotations

import math
from pathlib import Path

from armature.config import KvTierConfig
from armature.engines.native.config import NativeEngineConfig
from armature.engines.native.core import ONBOARD_WAIT_S
from armature.kv.block_key import BlockKey
from armature.kv.event_log import KvEventLog
from armature.kv.eviction import EvictedBlock
from armature.kv.tier_policy import DiskOffload, TierHit, TierPolicy, TierPolicyConfig
from armature.protocols.engine import EngineRequest, SamplingParams
from armature.protocols.kv_events import KvTier
from armature.sim.clock import VirtualClock
from armature.sim.mocker import build_mocker_core, simulated_arch
from armature.sim.modeled_tiers import ModeledTiers
from armature.sim.timing import PolynomialTiming
from armature.tiers.api import LoadResult

D, H, S = KvTier.DEVICE, KvTier.HOST, KvTier.DISK
BLOCK_BYTES = 1024
HOST_BLOCK_S = 1 / 1024  # 1 KiB blocks at 1 MiB/s; powers of two keep the sums exact
DISK_BLOCK_S = 1 / 64  # at 64 KiB/s


def key(i: int) -> BlockKey:
    return BlockKey(i, 1000 + i, i - 1 if i > 0 else None)


def evicted(i: int) -> EvictedBlock:
    return EvictedBlock(i, *key(i))


def make(
    clock: VirtualClock, *, max_inflight_bytes: int = 1 << 30, speedup_ratio: float = 1.0
) -> ModeledTiers:
    config = TierPolicyConfig(num_host_blocks=2, num_disk_blocks=4, disk_offload=DiskOffload.ALL)
    return ModeledTiers(
        TierPolicy(config, KvEventLog()),
        clock,
        bytes_per_block=BLOCK_BYTES,
        bandwidth_bytes_s={H: 1 << 20, S: 1 << 16, KvTier.EXTERNAL: 1 << 10},
        max_inflight_bytes=max_inflight_bytes,
        speedup_ratio=speedup_ratio,
    )


def test_a_load_is_done_at_blocks_times_bytes_over_bandwidth_and_releases_its_pins() -> None:
    clock = VirtualClock()
    tiers = make(clock)
    # host keeps 0 and 2; 1 goes to disk (block 0 is its prefix: a chain goes from its end)
    tiers.on_evict([evicted(0), evicted(1), evicted(2)])
    assert tiers.counters.blocks_offloaded == {(D, H): 3, (H, S): 1}
    hits = tiers.find([0, 1, 2, 3])
    assert hits == [TierHit(key(0), H, 0), TierHit(key(1), S, -1), TierHit(key(2), H, 1)]
    assert tiers.counters.num_lookup_blocks == 0  # counted once admitted, as onboarding does:
    tiers.count_lookup(4, hits)
    tiers.reserve(hits)
    assert tiers.policy.get_num_pinned_blocks() == 3
    job = tiers.submit(hits, [10, 11, 12])
    done_s = DISK_BLOCK_S + 2 * HOST_BLOCK_S
    assert tiers.get_next_done_s() == done_s
    clock.advance(done_s - HOST_BLOCK_S)
    assert tiers.take_finished() == []
    assert tiers.get_num_inflight() == 1
    clock.advance(HOST_BLOCK_S)
    assert tiers.take_finished() == [LoadResult(job, hits, [10, 11, 12], 3, None, done_s)]
    assert tiers.get_num_inflight() == 0
    assert tiers.policy.get_num_pinned_blocks() == 0
    assert tiers.counters.blocks_onboarded == {S: 1, H: 2}
    assert tiers.counters.num_lookup_blocks == 4
    assert tiers.counters.hit_blocks == {S: 1, H: 2}
    assert tiers.policy.get_num_hits(H, 2) == 1  # the policy counted the onboarding
    stats = tiers.get_stats()
    assert stats.blocks_onboarded == {"g3->g1": 1, "g2->g1": 2}
    assert stats.blocks_offloaded == {"g1->g2": 3, "g2->g3": 1}
    assert (stats.tier_blocks, stats.onboard_latency_sum_s) == ({"host": 2, "disk": 1}, done_s)
    tiers.policy.check_integrity()


def test_loads_take_the_link_one_after_another_and_waits_move_a_virtual_clock() -> None:
    clock = VirtualClock()
    tiers = make(clock, speedup_ratio=2.0)  # every load takes half as long
    half_s = HOST_BLOCK_S / 2
    tiers.on_evict([evicted(0), evicted(1)])
    a, b = ([hit] for hit in tiers.find([0, 1]))
    tiers.reserve(a + b)
    first, second = tiers.submit(a, [5]), tiers.submit(b, [6])
    assert tiers.get_next_done_s() == half_s
    tiers.wait_for_loads(timeout_s=1.0)  # to the first load's done time, not the timeout
    assert clock.now_s == half_s
    assert [r.job_id for r in tiers.take_finished()] == [first]
    tiers.wait_for_loads(timeout_s=half_s / 4)  # the timeout comes first
    assert clock.now_s == half_s + half_s / 4
    tiers.wait_for_loads(timeout_s=1.0)
    assert clock.now_s == 2 * half_s  # queued behind the first load
    [result] = tiers.take_finished()
    assert (result.job_id, result.elapsed_s) == (second, 2 * half_s)
    # an idle link: a load submitted later starts when it is submitted
    clock.advance(10 * half_s)
    tiers.reserve(a)
    tiers.submit(a, [7])
    assert tiers.get_next_done_s() == 13 * half_s
    tiers.close()  # loads in flight finish at once
    assert len(tiers.take_finished()) == 1
    tiers.wait_for_loads(timeout_s=1.0)  # nothing in flight: the clock stays
    assert clock.now_s == 12 * half_s
    assert tiers.policy.get_num_pinned_blocks() == 0


def test_the_inflight_bound_holds_back_all_but_one_load() -> None:
    tiers = make(VirtualClock(), max_inflight_bytes=2 * BLOCK_BYTES)
    assert tiers.can_load(5)  # one load always may
    tiers.on_evict([evicted(0), evicted(1)])
    hits = tiers.find([0, 1])
    tiers.reserve(hits)
    tiers.submit(hits, [1, 2])
    assert not tiers.can_load(1)
    tiers.close()
    tiers.take_finished()
    assert tiers.can_load(2)


ARCH = simulated_arch(vocab_size=1000, max_model_len=4096)
# ARCH's KV block in bfloat16: 1 layer x (k, v) x 1 head x 8 dims x 2 bytes x 4 tokens
MOCKER_BLOCK_BYTES = 128
MOCKER_BLOCK_S = 1 / 256  # at the bandwidth below


def test_a_mocker_onboards_an_evicted_prompt_from_host_in_the_modeled_time() -> None:
    clock = VirtualClock()
    config = NativeEngineConfig(model_dir=Path("/unused"), num_kv_blocks=8, block_size=4)
    gbps = MOCKER_BLOCK_BYTES / MOCKER_BLOCK_S / 1e9
    tiers = KvTierConfig(kv_host_blocks=16, kv_host_bandwidth_gbps=gbps)
    core = build_mocker_core(config, clock=clock, arch=ARCH, tiers=tiers)
    params = SamplingParams(max_tokens=1, temperature=0.0)

    def run(request_id: str, prompt: list[int]) -> int:
        """The prompt tokens reported cached."""
        request = EngineRequest(request_id=request_id, prompt_token_ids=prompt, sampling=params)
        core.add_request(request)
        outputs = []
        while core.has_work():
            outputs += core.step()
        assert core.pool.get_num_active_blocks() == 0
        return outputs[0].num_cached_tokens

    a, b, c = ([100 * i + t for t in range(15)] for i in (1, 2, 3))  # 3 full blocks + 3
    assert [run("a1", a), run("b", b), run("c", c)] == [0, 0, 0]  # c evicted a's blocks
    assert core.tiers is not None
    assert core.tiers.counters.blocks_offloaded == {(D, H): 3}
    started_s = clock.now_s
    assert run("a2", a) == 12
    # steps with nothing to run wait for the load in ONBOARD_WAIT_S slices (5 + 5 + 1.7 ms),
    # then one computes a's last 3 tokens
    load_s = 3 * MOCKER_BLOCK_S
    assert 2 * ONBOARD_WAIT_S < load_s < 3 * ONBOARD_WAIT_S
    prefill_s = PolynomialTiming().prefill_ms(3) / 1000
    assert math.isclose(clock.now_s - started_s, load_s + prefill_s, rel_tol=1e-12)
    assert core.tiers.counters.blocks_onboarded == {H: 3}
    assert core.tiers.policy.get_num_pinned_blocks() == 0
    # the load report tier-aware routing weighs: the modeled costs, on the mocker's clock
    # (a prefill-only step of 15 tokens each for a, b and c, then 3 for a2)
    load = core.get_load()
    assert load.onboard_s_per_block == {H: MOCKER_BLOCK_S}
    prefill_steps_s = 3 * PolynomialTiming().prefill_ms(15) / 1000 + prefill_s
    assert load.prefill_s_per_block is not None
    assert math.isclose(load.prefill_s_per_block, prefill_steps_s / (48 / 4), rel_tol=1e-12)
    assert load.num_tier_total_blocks == {H: 16}
    core.tiers.policy.check_integrity()
    core.pool.check_integrity()
