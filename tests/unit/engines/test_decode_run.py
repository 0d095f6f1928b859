"""The decode fast path (`EngineCore.run_decodes`) against `EngineCore.step`, its reference:
twin mocker cores, one stepped and one run, end in exactly the same state."""

from __future__ import annotations

import pytest
from mocker_cores import core_state, mocker_core

from armature.engines.native.core import EngineCore
from armature.protocols.engine import EngineOutput, EngineRequest, FinishReason, SamplingParams
from armature.sim.mocker import MockerRunner


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
