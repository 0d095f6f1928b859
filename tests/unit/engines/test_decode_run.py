"""The decode fast path (`EngineCore.run_decodes`) against `EngineCore.step`, its reference:
twin mocker cores, one stepped and one run, end in exactly the same state."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mocker_cores import core_state, mocker_core

from armature.engines.native.core import EngineCore
from armature.engines.native.decode_run import DecodeRun
from armature.errors import InvalidRequestError
from armature.protocols.engine import EngineOutput, EngineRequest, FinishReason, SamplingParams
from armature.protocols.kv_events import KvRemoved
from armature.sim.mocker import MockerRunner
from armature.sim.timing import AttendedTokensTiming, PolynomialTiming


@pytest.fixture(params=[True, False], ids=["native", "python"])
def native(request: pytest.FixtureRequest) -> bool:
    """Each test twice: decode runs' stretches in the pool's core, then in the Python loop
    (`DecodeRun._run_python`, the kernel's reference)."""
    return bool(request.param)


def twin(
    num_kv_blocks: int = 64, *, native: bool = True, **settings: object
) -> tuple[EngineCore, MockerRunner]:
    return mocker_core(num_kv_blocks, 4, native=native, **settings)


def add(core: EngineCore, max_tokens: dict[str, int], prompt_len: int = 6) -> None:
    for i, (rid, n) in enumerate(max_tokens.items()):
        prompt = [10 + i * 50 + t for t in range(prompt_len)]
        sampling = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
        core.add_request(EngineRequest(request_id=rid, prompt_token_ids=prompt, sampling=sampling))


def prefilled(
    max_tokens: dict[str, int], *, native: bool = True, **settings: object
) -> tuple[EngineCore, MockerRunner]:
    """A `twin` core with these requests added and prefilled (their first step run)."""
    core, runner = twin(native=native, **settings)  # type: ignore[arg-type]
    add(core, max_tokens)
    core.step()
    return core, runner


def step_until(core: EngineCore, runner: MockerRunner, end_ms: float) -> list[list[EngineOutput]]:
    """Reference: `step` until a step starts at or after `end_ms`; each step's outputs."""
    outputs, t_ms = [], 0.0
    while t_ms < end_ms and core.has_work():
        outputs.append(core.step())
        t_ms += runner.last_step_ms
    return outputs


def test_a_run_is_the_steps_it_replaces(native: bool) -> None:
    fast, fast_runner = twin(native=native)
    slow, slow_runner = twin(native=native)
    for core in (fast, slow):
        add(core, {"a": 30, "b": 25, "c": 40})
        core.step()  # the prefills
    first = fast.run_decodes(fast_runner, 0.0, 0.0)  # one step, then the horizon
    assert first is not None and first.num_steps == 1 and not first.is_done
    assert first.end() == slow.step()
    run = fast.run_decodes(fast_runner, 0.0, 100.0)
    assert run is not None and not run.is_done  # suspended at the horizon
    assert run.request_ids == ["a", "b", "c"]
    assert run.step_end_ms[-2] < 100.0 <= run.step_end_ms[-1]
    reference = step_until(slow, slow_runner, run.step_end_ms[-1])
    assert len(reference) == run.num_steps
    assert reference[-1] == run.end()
    assert core_state(fast, fast_runner) == core_state(slow, slow_runner)
    assert fast_runner.clock.now_s == slow_runner.clock.now_s


def test_a_suspended_run_goes_on_as_the_steps_do(native: bool) -> None:
    fast, fast_runner = prefilled({"a": 30, "b": 45, "c": 40}, num_kv_blocks=40, native=native)
    slow, slow_runner = prefilled({"a": 30, "b": 45, "c": 40}, num_kv_blocks=40, native=native)
    run = fast.run_decodes(fast_runner, 0.0, 7.0)
    assert run is not None
    horizons = 1
    while not run.is_done:
        assert run.can_extend()
        fast.extend_decodes(run, run.step_end_ms[-1] + 7.0)
        horizons += 1
    assert horizons > 3  # several horizons, one run
    reference = [slow.step() for _ in range(run.num_steps)]
    assert [o.finish_reason for o in run.outputs or []] == [FinishReason.LENGTH, None, None]
    assert reference[-1] == run.outputs
    assert core_state(fast, fast_runner) == core_state(slow, slow_runner)
    assert fast_runner.clock.now_s == slow_runner.clock.now_s
    assert fast.get_load().num_steps == slow.get_load().num_steps


def test_a_request_joining_ends_a_suspended_run(native: bool) -> None:
    core, runner = prefilled({"a": 30, "b": 30}, max_num_seqs=2, native=native)
    run = core.run_decodes(runner, 0.0, 5.0)
    assert run is not None and run.can_extend()
    add(core, {"c": 30})  # waits (the batch is full), yet the next step's records change
    assert not run.can_extend()
    outputs = run.end()
    assert [o.request_id for o in outputs] == ["a", "b"] and not run.can_extend()


def test_a_request_leaving_the_batch_ends_a_suspended_run(native: bool) -> None:
    core, runner = prefilled({"a": 30, "b": 30}, native=native)
    run = core.run_decodes(runner, 0.0, 5.0)
    assert run is not None and run.can_extend()
    assert core.abort_request("b")
    assert not run.can_extend()


def test_a_suspended_run_whose_next_step_would_preempt_ends_where_it_was(native: bool) -> None:
    whole_core, whole_runner = prefilled({"a": 40, "b": 40}, num_kv_blocks=12, native=native)
    whole = whole_core.run_decodes(whole_runner, 0.0, float("inf"))
    assert whole is not None and whole.is_done
    steps = whole.num_steps
    fast, fast_runner = prefilled({"a": 40, "b": 40}, num_kv_blocks=12, native=native)
    slow, slow_runner = prefilled({"a": 40, "b": 40}, num_kv_blocks=12, native=native)
    run = fast.run_decodes(fast_runner, 0.0, 0.0)
    assert run is not None
    while not run.is_done:
        fast.extend_decodes(run, run.step_end_ms[-1])  # one step each time
    assert run.num_steps == steps  # the extension that would preempt ran no step
    reference = [slow.step() for _ in range(steps)]
    assert reference[-1] == run.outputs
    assert core_state(fast, fast_runner) == core_state(slow, slow_runner)


def test_a_run_ends_with_the_step_that_finishes_a_request(native: bool) -> None:
    fast, fast_runner = twin(native=native)
    slow, slow_runner = twin(native=native)
    for core in (fast, slow):
        add(core, {"a": 9, "b": 20})
        core.step()
    run = fast.run_decodes(fast_runner, 0.0, float("inf"))
    assert run is not None and run.num_steps == 8  # a's 2nd..9th tokens
    assert [o.finish_reason for o in run.outputs] == [FinishReason.LENGTH, None]
    reference = [slow.step() for _ in range(8)]
    assert reference[-1] == run.outputs
    assert core_state(fast, fast_runner) == core_state(slow, slow_runner)
    assert [r.request_id for r in fast.scheduler.running] == ["b"]


def test_a_run_stops_before_the_step_that_would_preempt(native: bool) -> None:
    # 12 blocks of 4 tokens: two 6-token prompts grow until the pool is full
    fast, fast_runner = twin(num_kv_blocks=12, native=native)
    slow, slow_runner = twin(num_kv_blocks=12, native=native)
    for core in (fast, slow):
        add(core, {"a": 40, "b": 40})
        core.step()
    run = fast.run_decodes(fast_runner, 0.0, float("inf"))
    assert run is not None
    assert fast.pool.get_num_free_blocks() == 0
    reference = [slow.step() for _ in range(run.num_steps)]
    assert reference[-1] == run.outputs
    assert core_state(fast, fast_runner) == core_state(slow, slow_runner)
    assert fast.run_decodes(fast_runner, 0.0, float("inf")) is None  # the next step preempts
    assert slow.step() and slow.scheduler.waiting  # as the reference does


def test_no_run_while_a_waiting_request_could_be_admitted(native: bool) -> None:
    core, runner = twin(native=native)
    add(core, {"a": 30})
    core.step()
    add(core, {"b": 30})
    assert core.run_decodes(runner, 0.0, float("inf")) is None


def first_step_seen(core: EngineCore, run: DecodeRun) -> tuple[str, float]:
    """Go on with suspended `run` one step at a time to its first step that others could
    see: (what it does, when it starts): "evicts" a cached block (a Removed event) or
    "finishes" a request."""
    core.take_kv_events()
    while not run.is_done:
        num_steps = run.num_steps
        core.extend_decodes(run, run.step_end_ms[-1])  # one step
        assert run.num_steps == num_steps + 1
        if any(isinstance(event, KvRemoved) for event in core.take_kv_events()):
            return "evicts", run.step_end_ms[-2]
    return "finishes", run.step_end_ms[-2]


def test_a_run_is_quiet_until_its_step_that_finishes() -> None:
    core, runner = prefilled({"a": 30, "b": 45})
    run = core.run_decodes(runner, 0.0, 7.0)
    assert run is not None and run.num_steps == 1
    suspended_ms = run.step_end_ms[-1]
    until_ms = run.get_quiet_until_ms()
    assert until_ms is not None
    # a's 30th token, 28 steps on: 252.42 ms at the use now; the steps grow with it
    assert first_step_seen(core, run) == ("finishes", pytest.approx(396.361, abs=1e-3))
    assert until_ms == pytest.approx(252.422, abs=1e-3)
    assert suspended_ms < until_ms < run.step_end_ms[-2]


def test_a_run_is_quiet_until_its_step_that_evicts() -> None:
    core, runner = twin(num_kv_blocks=20)
    add(core, {"x": 30})
    while core.has_work():
        core.step()
    # x's 9 blocks freed last first behind the 11 never taken: its partial last one uncached
    assert core.pool.count_allocations_before_eviction(20) == 12
    add(core, {"a": 60, "b": 60}, prompt_len=9)
    core.step()  # the prefills take 5 blocks (a's first one is x's, cached)
    assert core.pool.count_allocations_before_eviction(20) == 7
    run = core.run_decodes(runner, 0.0, 1.0)
    assert run is not None and run.num_steps == 1
    until_ms = run.get_quiet_until_ms()
    assert until_ms is not None
    # a's and b's blocks hold 12 tokens: they allocate at steps 3, 7, 11 and 15, where b's
    # is the 8th allocation; 14 steps on from the first's end at the use now
    assert until_ms == pytest.approx(19.6264 * 15, abs=1e-3)
    assert first_step_seen(core, run) == ("evicts", pytest.approx(372.54, abs=1e-3))
    assert until_ms < run.step_end_ms[14]  # step 15's start


def test_where_a_run_cannot_tell_when_it_is_seen() -> None:
    for native, timing in [
        (False, PolynomialTiming()),  # the Python loop
        (True, PolynomialTiming(decode_coeffs=(-60.0, 54.0, 5.0))),  # falls as the cache fills
        (True, AttendedTokensTiming(kv_capacity_tokens=256)),  # priced outside the core
    ]:
        core, runner = mocker_core(64, 4, native=native, timing=timing)
        add(core, {"a": 30, "b": 45})
        core.step()
        run = core.run_decodes(runner, 0.0, 7.0)
        assert run is not None and run.get_quiet_until_ms() is None


@settings(max_examples=80, deadline=None)
@given(
    num_blocks=st.integers(12, 96),
    finished=st.lists(st.tuples(st.integers(1, 40), st.integers(1, 60)), max_size=3),
    running=st.lists(st.tuples(st.integers(1, 40), st.integers(2, 120)), min_size=1, max_size=4),
    horizon_ms=st.floats(0.5, 80.0),
    floor=st.booleans(),
)
def test_no_step_others_could_see_starts_before_the_quiet_time(
    num_blocks: int,
    finished: list[tuple[int, int]],
    running: list[tuple[int, int]],
    horizon_ms: float,
    floor: bool,
) -> None:
    """Requests that finished first leave cached blocks in the free queue (prompts share
    prefixes two ways); the next ones run until their runs end. At every suspension, no step
    that evicts, finishes a request or would not fit starts before the run's quiet time.
    (By hand: ~470 checks in 80 examples, ~90 of them past the suspension, some within
    1e-12 ms of the step's start where a floor makes every step as long.)"""
    timing = PolynomialTiming(min_decode_ms=20.0) if floor else PolynomialTiming()
    core, runner = mocker_core(num_blocks, 4, timing=timing)
    for wave, requests in enumerate([finished, running]):
        for i, (prompt_len, max_tokens) in enumerate(requests):
            prompt = [(i % 2) * 100 + t for t in range(prompt_len)]
            sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
            request = EngineRequest(
                request_id=f"{wave}-{i}", prompt_token_ids=prompt, sampling=sampling
            )
            with contextlib.suppress(InvalidRequestError):  # larger than the KV cache
                core.add_request(request)
        if wave == 0:
            for _ in range(500):
                if not core.has_work():
                    break
                core.step()
    now_ms = 0.0
    for _ in range(500):
        if not core.has_work():
            break
        run = core.run_decodes(runner, now_ms, now_ms + horizon_ms)
        if run is None:
            core.step()
            now_ms += runner.last_step_ms
            continue
        while not run.is_done and run.can_extend():
            until_ms = run.get_quiet_until_ms()
            assert until_ms is not None and until_ms >= run.step_end_ms[-1]
            core.take_kv_events()
            horizon_end_ms = run.step_end_ms[-1] + horizon_ms
            while not run.is_done and run.step_end_ms[-1] < horizon_end_ms:
                start_ms, num_steps = run.step_end_ms[-1], run.num_steps
                core.extend_decodes(run, start_ms)  # one step, or none where it would not fit
                events = core.take_kv_events()
                seen = run.is_done or any(isinstance(e, KvRemoved) for e in events)
                if seen or run.num_steps == num_steps:
                    assert start_ms >= until_ms
                    break
            if run.is_done or not run.can_extend():
                break
        if not run.is_done:
            run.end()
        now_ms = run.step_end_ms[-1]
