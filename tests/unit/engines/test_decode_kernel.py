"""The native decode kernel (`PoolCore.run_decodes`, kv/pool_decode.h) against its reference,
the Python stretch loop (`DecodeRun._run_python`): twin mocker cores, one running its decode
runs natively and one in Python, through the same runs and horizons, end in exactly the same
state: requests' tokens, blocks and hashes, the pool, every KV event, every step record, the
clock and the outputs."""

from __future__ import annotations

from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mocker_cores import ARCH, core_state, mocker_core

from armature.engines.native.core import EngineCore
from armature.engines.native.decode_run import NativeDecode
from armature.errors import InvalidRequestError
from armature.kv.eviction import EvictedBlock
from armature.kv.native_block_pool import NativeBlockPool
from armature.protocols.engine import EngineOutput, EngineRequest, SamplingParams
from armature.sim.clock import WallClock
from armature.sim.mocker import MockerRunner, VirtualClock, simulated_arch
from armature.sim.timing import InterpolatedTiming, PolynomialTiming, TimingModel


def drive(
    core: EngineCore,
    runner: MockerRunner,
    prompts: list[list[int]],
    max_tokens: list[int],
    as_arrays: bool,
    horizon_ms: float,
    id_prefix: str = "r",
) -> list[object]:
    """Add the requests, then until no work is left: a decode run when one can run (extended
    horizon by horizon), else a step; what each produced, and the state at the end."""
    seen: list[object] = []
    for i, (prompt, n) in enumerate(zip(prompts, max_tokens, strict=True)):
        sampling = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
        # as the simulator hands prompts over (array('I'), taken as they are), or as lists
        tokens = array("I", prompt) if as_arrays else prompt
        request = EngineRequest(
            request_id=f"{id_prefix}{i}",
            prompt_token_ids=tokens,  # type: ignore[arg-type]
            sampling=sampling,
        )
        try:
            core.add_request(request, take_prompt=as_arrays)
        except InvalidRequestError:  # larger than the KV cache: both twins refuse it
            seen.append(("refused", i))
    now_ms = 0.0
    for _ in range(2000):
        if not core.has_work():
            break
        run = core.run_decodes(runner, now_ms, now_ms + horizon_ms)
        if run is None:
            outputs: list[EngineOutput] = core.step()
            now_ms += runner.last_step_ms
            seen.append(("step", outputs))
            continue
        while not run.is_done and run.can_extend():
            before = run.num_steps
            core.extend_decodes(run, run.step_end_ms[-1] + horizon_ms)
            if run.num_steps == before:  # its next step would preempt: end it there
                break
        outputs = run.outputs if run.outputs is not None else run.end()
        now_ms = run.step_end_ms[-1]
        seen.append(("run", run.num_steps, list(run.step_end_ms), outputs))
    seen.append(core_state(core, runner))
    return seen


# the polynomial the kernel prices itself (default and odd coefficients, a floor that binds,
# a speedup), and a table it asks the runner for
TIMINGS = [
    PolynomialTiming(),
    PolynomialTiming(decode_coeffs=(3.3, -1.7, 0.9), min_decode_ms=0.95, speedup_ratio=2.5),
    InterpolatedTiming((1.0, 512.0), (5.0, 90.0), (0.0, 0.5, 1.0), (4.0, 7.5, 31.0)),
]


@settings(max_examples=80, deadline=None)
@given(
    block_size=st.sampled_from([1, 2, 4, 16]),
    num_kv_blocks=st.integers(8, 96),
    shared=st.lists(st.integers(0, 999), min_size=0, max_size=40),
    tails=st.lists(st.lists(st.integers(0, 999), min_size=1, max_size=30), min_size=1, max_size=6),
    max_tokens=st.lists(st.integers(1, 60), min_size=6, max_size=6),
    as_arrays=st.booleans(),
    horizon_ms=st.sampled_from([0.0, 3.0, 20.0, 1e9]),
    timing=st.sampled_from(TIMINGS),
    caching=st.booleans(),
    id_prefix=st.sampled_from(["r", "x" * 1100]),  # past 1,024 bytes get_tokens uses xxhash
)
def test_the_kernel_leaves_what_the_python_loop_leaves(
    block_size: int,
    num_kv_blocks: int,
    shared: list[int],
    tails: list[list[int]],
    max_tokens: list[int],
    as_arrays: bool,
    horizon_ms: float,
    timing: TimingModel,
    caching: bool,
    id_prefix: str,
) -> None:
    prompts = [shared + tail for tail in tails]  # a shared prefix: cache hits and evictions
    limits = max_tokens[: len(prompts)]
    native_core, native_runner = mocker_core(num_kv_blocks, block_size, timing=timing)
    python_core, python_runner = mocker_core(num_kv_blocks, block_size, native=False, timing=timing)
    native = drive(native_core, native_runner, prompts, limits, as_arrays, horizon_ms)
    python = drive(python_core, python_runner, prompts, limits, as_arrays, horizon_ms)
    assert native == python


def test_the_kernel_runs_where_it_can() -> None:
    core, runner = mocker_core(64, 4)
    sampling = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    core.add_request(EngineRequest(request_id="a", prompt_token_ids=[1, 2, 3], sampling=sampling))
    core.step()
    run = core.run_decodes(runner, 0.0, float("inf"))
    assert run is not None and run._native is not None
    poly = (-25.74, 54.01, 5.74, 1.0, 1.0)  # PolynomialTiming's decode: priced in the kernel
    assert runner.get_native_decode() == NativeDecode(runner.clock, 0, 1000, poly, core.pool)
    assert run.num_steps == 29 and runner.num_batches == 30


def test_the_kernel_is_not_used_where_its_model_would_differ() -> None:
    assert MockerRunner(ARCH, PolynomialTiming(), WallClock()).get_native_decode() is None
    with_eos = simulated_arch(vocab_size=1000, max_model_len=4096, eos_token_ids=(7,))
    assert MockerRunner(with_eos, PolynomialTiming(), VirtualClock()).get_native_decode() is None
    off = MockerRunner(ARCH, PolynomialTiming(), VirtualClock(), native_decode=False)
    assert off.get_native_decode() is None

    class Watcher:
        def on_evict(self, blocks: list[EvictedBlock]) -> None:
            pass

    watched = NativeBlockPool(8, block_size=4, eviction_observer=Watcher())
    assert watched.get_decode_kernel() is None
    assert NativeBlockPool(8, block_size=4).get_decode_kernel() is not None


def test_steps_run_before_a_failing_call_are_recorded() -> None:
    # the runner's step time (asked per stretch where the kernel cannot price it) fails on
    # the third stretch: the two before it stand, and the clock and records say so
    table = InterpolatedTiming((1.0, 512.0), (5.0, 90.0), (0.0, 1.0), (4.0, 31.0))
    core, runner = mocker_core(64, 4, timing=table)
    sampling = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    core.add_request(EngineRequest(request_id="a", prompt_token_ids=[1, 2, 3], sampling=sampling))
    core.step()
    core.take_step_records()
    asked = runner.get_decode_step_ms
    calls = []

    def failing(num_requests: int, num_kv_tokens: int) -> float:
        calls.append(num_requests)
        if len(calls) == 3:
            raise RuntimeError("timing model failed")
        return asked(num_requests, num_kv_tokens)

    runner.get_decode_step_ms = failing  # type: ignore[method-assign]
    clock_s = runner.clock.now_s
    with pytest.raises(RuntimeError, match="timing model failed"):
        core.run_decodes(runner, 0.0, float("inf"))
    records = core.take_step_records()
    assert len(records) == runner.num_batches - 1 > 0  # the stretches before the failure
    assert runner.clock.now_s > clock_s
    assert runner.clock.now_s - clock_s == pytest.approx(sum(r.step_wall_s for r in records))
