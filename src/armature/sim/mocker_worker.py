"""The replay's workers: a mocker engine (the native EngineCore on a MockerRunner, its step
times from the role's timing model), with lower KV tiers modeled on the simulation's clock
when the replay has them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from armature.engines.native.config import NativeEngineConfig
from armature.engines.native.core import EngineCore
from armature.kv.event_log import KvEventLog
from armature.protocols.worker import WorkerRole
from armature.sim.clock import EventClock
from armature.sim.mocker import MockerRunner, VirtualClock, simulated_arch
from armature.sim.modeled_tiers import ModeledTiers, build_modeled_tiers
from armature.sim.replay_config import ReplayConfig
from armature.sim.timing import TimingModel
from armature.tiers.api import KvTiers
from armature.transfer.blocks import KvBlockStore

__all__ = ["MockerWorker", "MockerWorkerFactory"]


@dataclass(frozen=True)
class MockerWorker:
    core: EngineCore
    runner: MockerRunner
    tiers: ModeledTiers | None  # with the replay's lower tiers


class MockerWorkerFactory:
    def __init__(
        self,
        config: ReplayConfig,
        max_model_len: int,
        timing: TimingModel,
        prefill_timing: TimingModel,
        clock: EventClock,
    ):
        """Workers for `config`'s replay of requests up to `max_model_len` tokens;
        `prefill_timing` times the prefill workers' steps, `timing` the others'; `clock`:
        the simulation's (the modeled tiers' transfers run on it)."""
        self._config = config
        self._arch = simulated_arch(config.vocab_size, max_model_len)
        self._timing = timing
        self._prefill_timing = prefill_timing
        self._clock = clock
        self._engine_config = NativeEngineConfig(
            model_dir=Path("mocker"),
            block_size=config.block_size,
            num_kv_blocks=config.num_kv_blocks,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            seed=config.seed,
        )

    def make(self, worker: str) -> MockerWorker:
        """Worker `worker`: prefill workers are named "prefill-<n>" (and "prefill-new-<n>"
        by a planned fleet)."""
        c = self._config
        is_prefill = worker.startswith(f"{WorkerRole.PREFILL.value}-")
        timing = self._prefill_timing if is_prefill else self._timing
        runner = MockerRunner(self._arch, timing, VirtualClock(), seed=c.seed)
        made: list[ModeledTiers] = []
        core = EngineCore(
            self._engine_config,
            runner,
            num_blocks=c.num_kv_blocks,
            tiers=self._build_tiers(made) if c.tiers.is_enabled else None,
            time_s=runner.clock.get_time_s,
        )
        runner.use_pool_utilization(core.pool)
        return MockerWorker(core, runner, made[0] if made else None)

    def _build_tiers(
        self, made: list[ModeledTiers]
    ) -> Callable[[KvEventLog, KvBlockStore], KvTiers]:
        def build(event_log: KvEventLog, kv_store: KvBlockStore) -> KvTiers:
            c = self._config
            tiers = build_modeled_tiers(
                c.tiers,
                event_log,
                self._clock,
                bytes_per_block=c.kv_bytes_per_block,
                speedup_ratio=c.speedup_ratio,
            )
            made.append(tiers)
            return tiers

        return build
