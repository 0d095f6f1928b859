"""The mocker's lower KV tiers: the real `TierPolicy` decides which block sits in which tier
(STYLE: the simulator runs the real code); no bytes move, and a load takes the time the tier's
bandwidth gives it on the mocker's clock.

    submit(hits) at t ──▶ the load link (FIFO) ──▶ done at max(t, link free) + Σ bytes / bw
    take_finished()   ──▶ loads whose done time has come: policy.on_onboarded, pins released

- Loads run one at a time in submission order on one link (the real loaders share the PCIe
  link into the device): a load of n blocks from tier t occupies it for
  n x bytes_per_block / bandwidth(t) / speedup_ratio seconds. A load mixing tiers sums.
- Writes cost nothing: the policy's copies down a tier are counted and are readable at once
  (the real manager's writers run off the step loop and keep a pending write readable).
  Drops are ignored. Nothing fails: no refusals, no write failures.
- Disk and G4 hold no files: the policy alone tracks them.
- The clock is the mocker's: wall time when serving (`wait_for_loads` sleeps), virtual time in
  replay (`wait_for_loads` moves a `VirtualClock` forward; the replay simulation's clock does
  not move at all, and the simulation wakes the worker at `get_next_done_s`).
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Mapping, Sequence
from itertools import count
from typing import NamedTuple

from armature.config import KvTierConfig
from armature.kv.event_log import KvEventLog
from armature.kv.tier_policy import CopyOp, TierHit, TierOp, TierPolicy
from armature.protocols.kv_events import KvTier
from armature.sim.clock import Clock
from armature.tiers.api import LoadResult
from armature.tiers.policy_config import tier_policy_config
from armature.tiers.policy_shell import TierPolicyShell

__all__ = ["LOAD_TIME_TOLERANCE_S", "ModeledTiers", "build_modeled_tiers"]

log = logging.getLogger(__name__)

# a load is done when the clock reads its done time less this: a simulation converting
# between ms and s may land one rounding step short of it
LOAD_TIME_TOLERANCE_S = 1e-9


class _Load(NamedTuple):
    done_s: float
    job_id: int  # ties: submission order
    hits: list[TierHit]
    g1_ids: list[int]
    submitted_s: float


class ModeledTiers(TierPolicyShell):
    """`KvTiers` for the mocker (see the module docstring). Engine thread only."""

    def __init__(
        self,
        policy: TierPolicy,
        clock: Clock,
        *,
        bytes_per_block: int,
        bandwidth_bytes_s: Mapping[KvTier, float],
        max_inflight_bytes: int,
        speedup_ratio: float = 1.0,
    ):
        """`bandwidth_bytes_s` gives every tier `policy` has (HOST, DISK, EXTERNAL)."""
        missing = set(policy.get_tiers()) - set(bandwidth_bytes_s)
        assert not missing, f"no bandwidth for {missing}"
        assert bytes_per_block > 0 and speedup_ratio > 0
        super().__init__(
            policy, bytes_per_block=bytes_per_block, max_inflight_bytes=max_inflight_bytes
        )
        self.clock = clock
        self._block_load_s = {
            tier: bytes_per_block / bw / speedup_ratio for tier, bw in bandwidth_bytes_s.items()
        }
        self._loads: list[_Load] = []  # a heap by (done_s, job_id)
        self._link_free_s = float("-inf")
        self._job_ids = count()
        self._closed = False

    # ---- the policy's ops --------------------------------------------------------------
    def _run(self, ops: list[TierOp]) -> None:
        """The policy's copies happen at once, for free; only counted."""
        for op in ops:
            if isinstance(op, CopyOp):
                self.counters.blocks_offloaded[(op.src, op.dst)] += 1

    # ---- onboarding --------------------------------------------------------------------
    def get_load_s(self, hits: Sequence[TierHit]) -> float:
        """How long loading `hits` occupies the link."""
        return sum(self._block_load_s[hit.tier] for hit in hits)

    def submit(self, hits: list[TierHit], g1_ids: list[int]) -> int:
        """The load starts when the link is free (now, or when the previous load is done)."""
        assert len(hits) == len(g1_ids)
        job_id = next(self._job_ids)
        now_s = self.clock.get_time_s()
        done_s = max(now_s, self._link_free_s) + self.get_load_s(hits)
        self._link_free_s = done_s
        heapq.heappush(self._loads, _Load(done_s, job_id, hits, g1_ids, now_s))
        self._inflight_bytes += len(hits) * self.bytes_per_block
        return job_id

    def get_num_inflight(self) -> int:
        return len(self._loads)

    def get_next_done_s(self) -> float | None:
        """When the next load in flight is done (None: none is)."""
        return self._loads[0].done_s if self._loads else None

    def wait_for_loads(self, timeout_s: float) -> None:
        """Let the clock run to the next load's done time, at most `timeout_s`."""
        next_s = self.get_next_done_s()
        if next_s is not None:
            self.clock.advance(max(0.0, min(next_s - self.clock.get_time_s(), timeout_s)))

    def take_finished(self) -> list[LoadResult]:
        """Loads done by now (every load once `close` was called), in done order."""
        now_s = float("inf") if self._closed else self.clock.get_time_s()
        results: list[LoadResult] = []
        while self._loads and self._loads[0].done_s <= now_s + LOAD_TIME_TOLERANCE_S:
            load = heapq.heappop(self._loads)
            self._inflight_bytes -= len(load.hits) * self.bytes_per_block
            elapsed_s = load.done_s - load.submitted_s
            tier_load_s: dict[KvTier, float] = {}
            for hit in load.hits:
                tier_load_s[hit.tier] = (
                    tier_load_s.get(hit.tier, 0.0) + self._block_load_s[hit.tier]
                )
            self._run(self._onboarded(load.hits, elapsed_s, tier_load_s))
            results.append(
                LoadResult(load.job_id, load.hits, load.g1_ids, len(load.hits), None, elapsed_s)
            )
        return results

    # ---- observation and lifecycle -----------------------------------------------------
    def flush(self) -> None:
        """Writes land at once: nothing to wait for."""

    def finish_loads(self) -> None:
        """Loads in flight finish at once (`take_finished` reports them all from now on)."""
        self._closed = True

    def close(self) -> None:
        self.finish_loads()


def build_modeled_tiers(
    config: KvTierConfig,
    event_log: KvEventLog,
    clock: Clock,
    *,
    bytes_per_block: int,
    speedup_ratio: float = 1.0,
) -> ModeledTiers:
    """The mocker's tiers as `config` sizes them (bytes at `bytes_per_block`), loading at its
    `--kv-*-bandwidth-gbps`. A `--kv-disk-dir` is not used and `--kv-remote` not opened."""
    if config.kv_disk_dir is not None:
        log.info("the mocker's disk tier holds no files: --kv-disk-dir is not used")
    gbps = config.get_bandwidths_gbps()
    bandwidth_bytes_s = {
        KvTier.HOST: gbps["host"] * 1e9,
        KvTier.DISK: gbps["disk"] * 1e9,
        KvTier.EXTERNAL: gbps["remote"] * 1e9,
    }
    return ModeledTiers(
        TierPolicy(tier_policy_config(config, bytes_per_block), event_log),
        clock,
        bytes_per_block=bytes_per_block,
        bandwidth_bytes_s=bandwidth_bytes_s,
        max_inflight_bytes=config.kv_onboard_max_inflight_bytes,
        speedup_ratio=speedup_ratio,
    )
