"""A mocker `EngineCore` on a virtual clock (the simulator's engine), for the decode fast
path's tests: its runner's step times read the pool's use as `build_mocker_core` wires them."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

from armature.engines.native.config import NativeEngineConfig
from armature.engines.native.core import EngineCore
from armature.protocols.engine import EngineRequest, SamplingParams
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


def run_mixed_load(
    core: EngineCore,
    rng: random.Random,
    num_requests: int,
    after_step: Callable[[], None] | None = None,
) -> None:
    """Requests on four shared prefixes (10-40 tokens) with random tails and 1-15 greedy
    output tokens, a few added before each step, stepped until idle (`after_step` called
    after each step). Token ids below 1000 (ARCH's vocabulary)."""
    prefixes = [[200 * g + t for t in range(rng.randrange(10, 40))] for g in range(4)]
    added = 0
    for _ in range(5000):
        for _ in range(rng.randrange(0, 3)):
            if added < num_requests:
                tail = [rng.randrange(800, 1000) for _ in range(rng.randrange(1, 12))]
                sampling = SamplingParams(
                    max_tokens=rng.randrange(1, 16), temperature=0.0, ignore_eos=True
                )
                prompt = prefixes[rng.randrange(4)] + tail
                req = EngineRequest(
                    request_id=f"r{added}", prompt_token_ids=prompt, sampling=sampling
                )
                core.add_request(req)
                added += 1
        if added == num_requests and not core.has_work():
            return
        core.step()
        if after_step is not None:
            after_step()
    raise AssertionError(f"still working: {core.get_load()}")
