"""A mocker `EngineCore` on a virtual clock (the simulator's engine), for the decode fast
path's tests: its runner's step times read the pool's use as `build_mocker_core` wires them."""

from __future__ import annotations

from pathlib import Path

from armature.engines.native.config import NativeEngineConfig
from armature.engines.native.core import EngineCore
from armature.sim.mocker import MockerRunner, VirtualClock, simulated_arch
from armature.sim.timing import PolynomialTiming, TimingModel

ARCH = simulated_arch(vocab_size=1000, max_model_len=4096)


def mocker_core(
    num_kv_blocks: int,
    block_size: int,
    *,
    native: bool = True,
    timing: TimingModel | None = None,
    **settings: object,
) -> tuple[EngineCore, MockerRunner]:
    """A core of `num_kv_blocks` blocks of `block_size` tokens and its runner (its step times
    `timing`'s, PolynomialTiming by default); `native`: its decode runs' stretches run in the
    pool's core (else in the Python loop)."""
    config = NativeEngineConfig(
        model_dir=Path("/unused"),
        num_kv_blocks=num_kv_blocks,
        block_size=block_size,
        **settings,  # type: ignore[arg-type]
    )
    runner = MockerRunner(ARCH, timing or PolynomialTiming(), VirtualClock(), native_decode=native)
    core = EngineCore(config, runner, num_blocks=num_kv_blocks, time_s=runner.clock.get_time_s)
    runner.use_pool_utilization(core.pool)
    return core, runner


def core_state(core: EngineCore, runner: MockerRunner) -> object:
    """Everything a step or a decode run can change: the running requests' tokens, blocks
    and hashes, the pool, the KV events and step records (taken), the clock and the runner's
    counts."""
    return (
        [
            (
                r.request_id,
                list(r.token_ids),
                r.num_computed_tokens,
                r.block_ids,
                r.block_hashes,
                r.num_registered_blocks,
            )
            for r in core.scheduler.running
        ],
        core.pool.get_free_block_ids(),
        sorted(core.pool.get_cached_hashes()),
        core.take_kv_events(),
        core.take_step_records(),
        core.get_load().num_steps,
        runner.clock.now_s,
        runner.last_step_ms,
        runner.num_batches,
    )
