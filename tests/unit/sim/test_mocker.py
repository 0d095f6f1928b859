"""The mocker: the real scheduler and block pool, a timing model instead of a model."""

from __future__ import annotations

import array
import math
from dataclasses import replace
from pathlib import Path

import pytest

from armature.engines.native.config import NativeEngineConfig
from armature.engines.native.core import EngineCore
from armature.kv.hashing import compute_block_hashes
from armature.protocols.engine import EngineRequest, FinishReason, SamplingParams
from armature.protocols.kv_events import KvStored
from armature.sim.mocker import MockerRunner, VirtualClock, build_mocker_core, simulated_arch
from armature.sim.profile_timing import ProfileTiming
from armature.sim.timing import (
    AttendedTokensTiming,
    InterpolatedTiming,
    PolynomialTiming,
    StepWork,
    TimingModel,
)

ARCH = simulated_arch(vocab_size=1000, max_model_len=4096, eos_token_ids=(2,))


def mocker(
    clock: VirtualClock, seed: int = 0, timing: TimingModel | None = None, **overrides: object
) -> EngineCore:
    settings: dict[str, object] = {"num_kv_blocks": 64, "block_size": 4, "seed": seed}
    settings.update(overrides)
    config = NativeEngineConfig(model_dir=Path("/unused"), **settings)  # type: ignore[arg-type]
    return build_mocker_core(config, clock=clock, arch=ARCH, timing=timing)


def run(core: EngineCore, prompts: dict[str, list[int]], max_tokens: int) -> dict[str, list[int]]:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    out: dict[str, list[int]] = {}
    for rid, prompt in prompts.items():
        core.add_request(EngineRequest(request_id=rid, prompt_token_ids=prompt, sampling=params))
        out[rid] = []
    while core.has_work():
        for o in core.step():
            out[o.request_id].extend(o.new_token_ids)
            if o.finish_reason is not None:
                assert o.finish_reason is FinishReason.LENGTH
    return out


def test_polynomial_timing_matches_the_design_formula() -> None:
    timing = PolynomialTiming()
    assert timing.prefill_ms(1000) == pytest.approx(4.21e-7 * 1e6 + 15.18 + 16.5)
    assert timing.decode_ms(0.5) == pytest.approx(-25.74 * 0.25 + 54.01 * 0.5 + 5.74)
    assert timing.decode_ms(2.2) == 1.0  # clamped at 1 ms
    both = StepWork(num_prefill_tokens=100, num_decode_requests=3, kv_utilization=0.5)
    assert timing.step_ms(both) == pytest.approx(timing.prefill_ms(100) + timing.decode_ms(0.5))
    assert PolynomialTiming(speedup_ratio=10).step_ms(both) == pytest.approx(
        timing.step_ms(both) / 10
    )
    assert timing.step_ms(StepWork(0, 0, 0.0)) == 0.0


def test_attended_tokens_timing_prices_decode_by_context_not_pool_size() -> None:
    timing = AttendedTokensTiming(kv_capacity_tokens=1000)
    design = PolynomialTiming()
    # 3 decode requests over 500 tokens in all: u = 0.5 whatever the pool's utilization
    for pool_utilization in (0.1, 0.9):
        work = StepWork(100, 3, pool_utilization, num_decode_kv_tokens=500)
        assert timing.step_ms(work) == pytest.approx(design.prefill_ms(100) + design.decode_ms(0.5))
    assert timing.step_ms(StepWork(0, 2, 0.0, num_decode_kv_tokens=4000)) == pytest.approx(
        design.decode_ms(1.0)  # past the reference pool: u is capped at 1
    )
    fast = AttendedTokensTiming(1000, PolynomialTiming(speedup_ratio=4))
    assert fast.speedup_ratio == 4
    assert fast.step_ms(StepWork(0, 1, 0.0, 250)) == pytest.approx(design.decode_ms(0.25) / 4)
    assert timing.decode_uses_context and timing.step_ms(StepWork(0, 0, 0.5)) == 0.0
    with pytest.raises(ValueError, match="kv_capacity_tokens"):
        AttendedTokensTiming(0)


def test_interpolated_timing_is_piecewise_linear() -> None:
    timing = InterpolatedTiming((0, 100, 1000), (10, 20, 110), (0.0, 1.0), (5.0, 15.0))
    assert timing.step_ms(StepWork(50, 0, 0.0)) == pytest.approx(15.0)
    assert timing.step_ms(StepWork(550, 0, 0.0)) == pytest.approx(65.0)
    assert timing.step_ms(StepWork(0, 4, 0.25)) == pytest.approx(7.5)
    with pytest.raises(ValueError, match="increase"):
        InterpolatedTiming((0, 0), (1, 2), (0.0, 1.0), (1.0, 2.0))


def test_virtual_clock_advances_by_the_timing_model() -> None:
    clock = VirtualClock()
    core = mocker(clock)
    run(core, {"a": list(range(10))}, max_tokens=3)
    timing = PolynomialTiming()
    # step 1: prefill of 10 tokens; steps 2-3: one decode each (3 then 3 blocks of 64 in use)
    expected_ms = timing.prefill_ms(10) + 2 * timing.decode_ms(3 / 64)
    assert math.isclose(clock.now_s * 1000, expected_ms, rel_tol=1e-9)


@pytest.mark.parametrize(
    ("start_s", "seconds", "num_steps"), [(0.0, 0.1, 40), (12.345, 0.7, 40), (5.0, 0.25, 0)]
)
def test_virtual_clock_steps_at_once_are_the_additions_one_by_one(
    start_s: float, seconds: float, num_steps: int
) -> None:
    """`advance_steps` ends where `advance` one step at a time ends, to the bit, and each
    step's duration is the difference of those rounded sums (not always `seconds`)."""
    one_by_one = VirtualClock(start_s)
    durations = []
    for _ in range(num_steps):
        before = one_by_one.now_s
        one_by_one.advance(seconds)
        durations.append(one_by_one.now_s - before)
    at_once = VirtualClock(start_s)
    steps = at_once.advance_steps(seconds, num_steps)
    assert at_once.now_s == one_by_one.now_s
    assert len(steps) == num_steps
    assert list(steps) == durations
    if num_steps:
        assert steps[-1] == durations[-1]
        assert steps[1:3] == durations[1:3]
    if num_steps:
        assert len(set(durations)) > 1  # rounding shows: the durations are not all `seconds`


def test_a_chunk_after_earlier_tokens_pays_for_their_context() -> None:
    """A prompt over the step budget in two chunks, then the same prompt hitting the prefix
    cache: each step's modeled time has the profile's cost per (new, earlier) token pair on
    what came before the chunk; the step records carry the same pairs."""
    timing = ProfileTiming(
        prefill_tokens=(0.0, 100.0),
        prefill_ms_table=(0.0, 10.0),  # 0.1 ms per new token
        decode_requests=(1.0,),
        decode_context_tokens=(1.0,),
        decode_ms_grid=((1.0,),),
        prefill_ms_per_context_pair=0.001,
    )
    clock = VirtualClock()
    core = mocker(clock, max_num_batched_tokens=24, timing=timing)
    run(core, {"a": list(range(40))}, max_tokens=1)
    assert clock.now_s * 1000 == pytest.approx(2.4 + (1.6 + 0.001 * 24 * 16))
    records = core.take_step_records()
    assert [(r.num_scheduled_prefill_tokens, r.num_prefill_context_pairs) for r in records] == [
        (24, 0),
        (16, 24 * 16),
    ]
    # the prompt again, with two tokens more: 40 of its tokens are cached (blocks of 4)
    started_s = clock.now_s
    run(core, {"b": list(range(42))}, max_tokens=1)
    assert (clock.now_s - started_s) * 1000 == pytest.approx(0.2 + 0.001 * 40 * 2)
    assert [r.num_prefill_context_pairs for r in core.take_step_records()] == [80]


def test_tokens_are_seeded_and_independent_of_batching() -> None:
    prompts = {f"r{i}": list(range(i, i + 5 + i)) for i in range(6)}
    together = run(mocker(VirtualClock()), prompts, max_tokens=5)
    alone = {rid: run(mocker(VirtualClock()), {rid: p}, 5)[rid] for rid, p in prompts.items()}
    assert together == alone
    other_seed = run(mocker(VirtualClock(), seed=1), prompts, max_tokens=5)
    assert other_seed != together
    assert all(2 not in tokens for tokens in together.values())  # never EOS


def test_mocker_uses_the_real_pool_events_and_prefix_cache() -> None:
    core = mocker(VirtualClock())
    run(core, {"a": list(range(12))}, max_tokens=1)
    events = core.take_kv_events()
    assert isinstance(events[0], KvStored) and len(events[0].blocks) == 3
    params = SamplingParams(max_tokens=1, temperature=0.0)
    core.add_request(
        EngineRequest(request_id="b", prompt_token_ids=list(range(12)), sampling=params)
    )
    first = core.step()
    assert first[0].num_cached_tokens == 8
    assert core.pool.get_num_active_blocks() == 0
    load = core.get_load()
    assert (load.num_running, load.num_waiting, load.num_total_blocks) == (0, 0, 64)


def test_mocker_sizes_its_cache_like_the_native_engine() -> None:
    # 1 layer x 2 x 1 kv head x 8 dims x 4 bytes (float32) x 4 tokens = 256 bytes per block
    config = NativeEngineConfig(
        model_dir=Path("/unused"), block_size=4, kv_cache_bytes=256 * 10, dtype="float32"
    )
    core = build_mocker_core(config, clock=VirtualClock(), arch=ARCH)
    assert core.pool.num_blocks == 10


def test_runner_is_a_model_runner_without_weights() -> None:
    runner = MockerRunner(ARCH, PolynomialTiming(), VirtualClock(), seed=3)
    assert runner.token_for("x", 5) == runner.token_for("x", 5)
    assert 0 <= runner.token_for("x", 6) < ARCH.vocab_size


def test_a_negative_seed_is_its_twos_complement() -> None:
    """The CLI's seeds are signed 64-bit; the token hash takes an unsigned one."""
    no_eos = replace(ARCH, eos_token_ids=())
    negative = MockerRunner(no_eos, PolynomialTiming(), VirtualClock(), seed=-1)
    unsigned = MockerRunner(no_eos, PolynomialTiming(), VirtualClock(), seed=2**64 - 1)
    assert negative.seed == 2**64 - 1
    assert negative.get_tokens("req-1", 0, 20) == unsigned.get_tokens("req-1", 0, 20)
    assert negative.token_for("req-1", 3) == unsigned.token_for("req-1", 3)


def test_a_run_of_tokens_is_token_for_at_each_position() -> None:
    """`get_tokens` (one call per request and step: native where built, and in Python for ids
    too long for it) gives `token_for`'s token at every position."""
    no_eos = replace(ARCH, eos_token_ids=())
    runner = MockerRunner(no_eos, PolynomialTiming(), VirtualClock(), seed=3)
    for request_id in ("req-7", "r" * 2000):
        assert runner.get_tokens(request_id, 5, 40) == [
            runner.token_for(request_id, p) for p in range(5, 40)
        ]


def test_a_taken_prompt_becomes_the_engines_token_list() -> None:
    """With `take_prompt` the engine appends to the caller's list (no copy); without it the
    caller's list is left as it was. The request's tokens are the same either way."""
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    prompts, outputs = [], []
    for take_prompt in (False, True):
        core = mocker(VirtualClock())
        prompt = list(range(10, 20))
        request = EngineRequest(request_id="a", prompt_token_ids=prompt, sampling=params)
        core.add_request(request, take_prompt=take_prompt)
        out: list[int] = []
        while core.has_work():
            for o in core.step():
                out.extend(o.new_token_ids)
        prompts.append(prompt)
        outputs.append(out)
    assert len(outputs[0]) == 3
    assert outputs[0] == outputs[1]
    assert prompts == [list(range(10, 20)), [*range(10, 20), *outputs[1]]]
    # the simulator's prompts are array('I'): taken over and appended to the same way
    core = mocker(VirtualClock())
    ids = array.array("I", range(10, 20))
    request = EngineRequest(request_id="a", prompt_token_ids=ids, sampling=params)  # type: ignore[arg-type]
    core.add_request(request, take_prompt=True)
    out = []
    while core.has_work():
        for o in core.step():
            out.extend(o.new_token_ids)
    assert out == outputs[0]
    assert ids.tolist() == [*range(10, 20), *out]


def test_given_block_hashes_are_the_ones_the_engine_looks_up() -> None:
    """`block_hashes` from a caller that hashed the prompt already are what the prefix cache
    is searched by (the engine does not hash those blocks again): the hashes of a cached
    prompt make a request of other tokens hit it. A list of the wrong length is refused
    before anything is queued."""
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    cached_prompt = list(range(10, 26))  # 4 blocks of 4
    cached = [(s, loc) for s, loc in compute_block_hashes(cached_prompt, 4)]

    def first_output(core: EngineCore, request: EngineRequest, **given: object) -> int:
        core.add_request(request, **given)  # type: ignore[arg-type]
        num_cached = -1
        while core.has_work():
            for o in core.step():
                if o.request_id == request.request_id and num_cached < 0:
                    num_cached = o.num_cached_tokens
        return num_cached

    core = mocker(VirtualClock())
    first_output(
        core, EngineRequest(request_id="a", prompt_token_ids=cached_prompt, sampling=params)
    )
    other = list(range(50, 66))
    assert (
        first_output(
            core, EngineRequest(request_id="b", prompt_token_ids=list(other), sampling=params)
        )
        == 0
    )
    assert (
        first_output(
            core,
            EngineRequest(request_id="c", prompt_token_ids=list(other), sampling=params),
            block_hashes=list(cached),
        )
        == 12
    )  # three blocks: the last token is always computed
    with pytest.raises(ValueError, match="4 full blocks"):
        core.add_request(
            EngineRequest(request_id="d", prompt_token_ids=list(other), sampling=params),
            block_hashes=cached[:3],
        )
    assert not core.has_work()
