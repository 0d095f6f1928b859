"""A shared store (G4) that stops answering reads: the first load from it fails as
`unavailable` and the prompt is computed; then the tier is not read for READS_OFF_S (each read
of a hung store cost a request the store's whole timeout), the pause doubling while its reads
keep failing, and loads from it resume once it answers. Same tokens throughout. The store is
a real shared directory; a wrapper at the store seam makes its reads fail while `down`."""

from __future__ import annotations

import logging
import random
import threading
from pathlib import Path

import pytest
from test_tier_onboarding import BLOCK, run, tiered_engine

from armature.config import KvTierConfig
from armature.engines.native.core import EngineCore
from armature.kv.hashing import DEFAULT_HASH_SEED, compute_block_hashes
from armature.protocols.engine import EngineRequest, SamplingParams
from armature.protocols.kv_events import KvTier
from armature.tiers.errors import StoreUnavailableError
from armature.tiers.manager import READS_OFF_S, KvTierManager
from armature.tiers.store import BlockStore


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


class FailingReads:
    """A store whose reads fail as unreachable while `down`; counts the reads tried."""

    def __init__(self, inner: BlockStore) -> None:
        self.inner = inner
        self.down = True
        self.failing: set[int] | None = None  # while down, the blocks that fail (None: all)
        self.num_gets = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def get(self, seq_hash: int) -> bytes:
        self.num_gets += 1
        if self.down and (self.failing is None or seq_hash in self.failing):
            raise StoreUnavailableError("s3://kv/fleet: read timeout")
        return self.inner.get(seq_hash)


def stored_prompts(
    model_dir: Path, url: str, seed: int, count: int
) -> tuple[list[list[int]], list[list[int]]]:
    """`count` prompts of 100 tokens (6 full blocks) a writer stored in the shared store at
    `url`, and the tokens it generated for each."""
    writer = tiered_engine(
        model_dir,
        KvTierConfig(kv_remote=url, kv_remote_offload="all", kv_offload="write-through"),
    )
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, 512) for _ in range(100)] for _ in range(count)]
    expected = [run(writer, p, f"w{i}")[0] for i, p in enumerate(prompts)]
    writer.close()
    return prompts, expected


def reader_of(
    model_dir: Path, url: str, clock: Clock | None = None
) -> tuple[EngineCore, KvTierManager, FailingReads]:
    """An engine reading the shared store at `url` through a FailingReads (down)."""
    reader = tiered_engine(model_dir, KvTierConfig(kv_remote=url))
    tiers = reader.tiers
    assert isinstance(tiers, KvTierManager)
    if clock is not None:
        tiers.clock = clock
    store = FailingReads(tiers.stores[KvTier.EXTERNAL])
    tiers.stores[KvTier.EXTERNAL] = store  # type: ignore[assignment]
    return reader, tiers, store


def test_a_store_that_fails_reads_is_not_read_for_a_while(
    tiny_llama_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="armature.tiers.manager")
    url = f"file://{tmp_path / 'shared'}"
    prompts, expected = stored_prompts(tiny_llama_dir, url, seed=5, count=4)
    clock = Clock()
    reader, tiers, store = reader_of(tiny_llama_dir, url, clock)

    assert run(reader, prompts[0], "a") == (expected[0], 0)  # tried, failed, computed
    assert tiers.counters.blocks_refused == {"unavailable": 1}
    tried = store.num_gets
    assert tried >= 1
    assert f"not read for {READS_OFF_S:g} s" in caplog.text
    assert run(reader, prompts[1], "b") == (expected[1], 0)  # not tried: no request waits
    assert store.num_gets == tried

    clock.now_s += READS_OFF_S  # the pause is over, the store still down: twice as long
    assert run(reader, prompts[2], "c") == (expected[2], 0)
    assert store.num_gets > tried
    assert f"not read for {2 * READS_OFF_S:g} s" in caplog.text
    assert tiers.counters.blocks_refused == {"unavailable": 2}

    store.down = False
    clock.now_s += 2 * READS_OFF_S
    assert run(reader, prompts[3], "d") == (expected[3], 6 * BLOCK)  # loaded again
    assert tiers.counters.blocks_onboarded == {KvTier.EXTERNAL: 6}
    assert caplog.records[-1].message == f"KV external tier: reading {store.describe()} again"
    reader.close()


def test_engine_load_counts_requests_waiting_for_their_blocks(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    """A request loading its blocks from a lower tier is neither running nor in the waiting
    queue: the engine's load said it had no work (routing and overload control read it)."""
    url = f"file://{tmp_path / 'shared'}"
    [prompt], _ = stored_prompts(tiny_llama_dir, url, seed=6, count=1)
    reader, _, store = reader_of(tiny_llama_dir, url)
    store.down = False
    gate = threading.Event()
    get = store.get

    def held_get(seq_hash: int) -> bytes:
        gate.wait(30)
        return get(seq_hash)

    store.get = held_get  # type: ignore[method-assign]
    params = SamplingParams(max_tokens=4, temperature=0.0)
    reader.add_request(EngineRequest(request_id="r", prompt_token_ids=prompt, sampling=params))
    reader.step()  # admitted: its blocks are loading
    load = reader.get_load()
    assert (load.num_waiting, load.num_running) == (1, 0)
    assert load.num_prefill_tokens_queued == 100 - 6 * BLOCK  # what it computes after
    reader.abort_request("r")  # its load goes on; it waits for nothing any more
    load = reader.get_load()
    assert (load.num_waiting, load.num_prefill_tokens_queued) == (0, 0)
    gate.set()
    while reader.has_work():
        reader.step()
    assert reader.get_load().num_waiting == 0
    reader.close()


def test_a_store_that_answers_some_reads_still_backs_off(
    tiny_llama_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Loads that read a few blocks and then hang on the next: the blocks read reset the
    pause to its first length each time, so a store failing half its reads was read at
    every pause's end; it doubles while loads keep failing."""
    url = f"file://{tmp_path / 'shared'}"
    prompts, expected = stored_prompts(tiny_llama_dir, url, seed=7, count=2)
    clock = Clock()
    reader, tiers, store = reader_of(tiny_llama_dir, url, clock)
    store.failing = {
        h for p in prompts for h, _ in compute_block_hashes(p, BLOCK, DEFAULT_HASH_SEED, None)[3:]
    }
    assert run(reader, prompts[0], "a") == (expected[0], 3 * BLOCK)  # 3 read, then a hang
    assert f"not read for {READS_OFF_S:g} s" in caplog.text
    clock.now_s += READS_OFF_S
    assert run(reader, prompts[1], "b") == (expected[1], 3 * BLOCK)
    assert f"not read for {2 * READS_OFF_S:g} s" in caplog.text
    assert tiers.counters.blocks_refused == {"unavailable": 2}
    reader.close()
