"""A waiting request's prefix lookup starts where its last one ended while nothing has left
the prefix cache since (`KvCacheManager.find_cached_prefix`, `FoundPrefix`): a queue's head
that does not fit is looked up again every step. Every lookup must equal a lookup from the
first block. Mocker cores on a virtual clock, small pools so that heads wait and blocks are
evicted while they do."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from armature.engines.native.core import EngineCore
from armature.engines.native.kv_manager import KvCacheManager
from armature.engines.native.request import RequestState
from armature.protocols.engine import EngineRequest, SamplingParams
from tests.unit.engines.mocker_cores import mocker_core, run_mixed_load

BLOCK = 4


def request(rid: str, prompt: list[int], max_tokens: int) -> EngineRequest:
    return EngineRequest(
        request_id=rid,
        prompt_token_ids=prompt,
        sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
    )


def checked_lookups(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Wrap every `find_cached_prefix`: its answer must be the lookup from the first block;
    counts the lookups that started past a prefix found before ("resumed") and the others."""
    counts: Counter[str] = Counter()
    lookup = KvCacheManager.find_cached_prefix

    def checked(self: KvCacheManager, req: RequestState) -> list[int]:
        last = req.found_prefix
        resumed = (
            last is not None
            and last.pool is self.pool
            and last.num_removals == self.pool.get_num_removals()
            and last.max_blocks == (req.num_tokens - 1) // self.block_size
        )
        found = lookup(self, req)
        fresh = self.pool.find_prefix_of_pairs(
            req.block_hashes, (req.num_tokens - 1) // self.block_size
        )
        assert found == fresh
        counts["resumed" if resumed and last is not None and last.block_ids else "fresh"] += 1
        return found

    monkeypatch.setattr(KvCacheManager, "find_cached_prefix", checked)
    return counts


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_every_lookup_equals_one_from_the_first_block(
    monkeypatch: pytest.MonkeyPatch, seed: int, native: bool
) -> None:
    if not native:
        monkeypatch.setenv("ARMATURE_POOL_BACKEND", "python")
    counts = checked_lookups(monkeypatch)
    core, _ = mocker_core(num_kv_blocks=40, block_size=BLOCK, native=native)
    assert type(core.pool).__name__ == ("NativeBlockPool" if native else "PyBlockPool")
    run_mixed_load(core, random.Random(seed), num_requests=80)
    assert core.pool.get_num_removals() > 0  # blocks were evicted while heads waited
    assert counts["resumed"] > 0 and counts["fresh"] > 0, counts
    assert core.pool.get_num_free_blocks() == 40


def run_to_idle(core: EngineCore) -> None:
    for _ in range(200):
        if not core.has_work():
            return
        core.step()
    raise AssertionError(f"still working: {core.get_load()}")


def test_a_waiting_request_finds_the_blocks_cached_since_its_last_lookup() -> None:
    """Nothing is evicted between the lookups: the second one resumes past the first's 3
    blocks and finds the 3 more that another request cached meanwhile."""
    core, _ = mocker_core(num_kv_blocks=40, block_size=BLOCK)
    shared = list(range(100, 124))  # 6 blocks
    core.add_request(request("short", [*shared[:12], 7], max_tokens=1))
    run_to_idle(core)
    core.add_request(request("waiting", [*shared, 8, 9], max_tokens=1))
    waiting = core.scheduler.waiting[0]
    kv = core.scheduler.kv
    removals = kv.pool.get_num_removals()
    first = kv.find_cached_prefix(waiting)
    assert len(first) == 3
    assert waiting.found_prefix is not None
    assert waiting.found_prefix.block_ids == tuple(first)
    assert waiting.found_prefix.num_removals == removals
    # out of the queue, so that only a request with the whole shared prefix runs meanwhile
    core.scheduler.waiting.popleft()
    core.add_request(request("long", [*shared, 5], max_tokens=1))
    run_to_idle(core)
    assert kv.pool.get_num_removals() == removals  # nothing left the cache
    second = kv.find_cached_prefix(waiting)
    assert second[:3] == first and len(second) == 6
    assert second == kv.pool.find_prefix_of_pairs(waiting.block_hashes, 6)


def test_a_reset_makes_the_next_lookup_start_over() -> None:
    core, _ = mocker_core(num_kv_blocks=40, block_size=BLOCK)
    shared = list(range(100, 124))
    core.add_request(request("first", [*shared, 7], max_tokens=1))
    run_to_idle(core)
    core.add_request(request("again", [*shared, 8], max_tokens=1))
    waiting = core.scheduler.waiting[0]
    kv = core.scheduler.kv
    assert len(kv.find_cached_prefix(waiting)) == 6
    assert len(kv.find_cached_prefix(waiting)) == 6  # resumed: the same blocks
    removals = kv.pool.get_num_removals()
    assert core.pool.reset_prefix_cache()
    assert kv.pool.get_num_removals() == removals + 1
    assert kv.find_cached_prefix(waiting) == []
