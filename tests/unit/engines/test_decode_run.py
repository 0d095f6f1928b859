"""The decode fast path (`EngineCore.run_decodes`) against `EngineCore.step`, its reference:
twin mocker cores, one stepped and one run, end in exactly the same state."""

from __future__ import annotations

from pathlib import Path

from armature.engines.native.config import NativeEngineConfig
from armature.engines.native.core import EngineCore
from armature.protocols.engine import EngineOutput, EngineRequest, FinishReason, SamplingParams
from armature.sim.mocker import MockerRunner, VirtualClock, simulated_arch
from armature.sim.timing import PolynomialTiming

ARCH = simulated_arch(vocab_size=1000, max_model_len=4096)


def twin(num_kv_blocks: int = 64, **settings: object) -> tuple[EngineCore, MockerRunner]:
    config = NativeEngineConfig(
        model_dir=Path("/unused"),
        num_kv_blocks=num_kv_blocks,
        block_size=4,
        **settings,  # type: ignore[arg-type]
    )
    runner = MockerRunner(ARCH, PolynomialTiming(), VirtualClock())
    core = EngineCore(config, runner, num_blocks=num_kv_blocks, time_s=runner.clock.get_time_s)
    pool = core.pool
    runner.kv_utilization = lambda: pool.get_num_active_blocks() / pool.num_blocks
    return core, runner


def add(core: EngineCore, max_tokens: dict[str, int], prompt_len: int = 6) -> None:
    for i, (rid, n) in enumerate(max_tokens.items()):
        prompt = [10 + i * 50 + t for t in range(prompt_len)]
        sampling = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
        core.add_request(EngineRequest(request_id=rid, prompt_token_ids=prompt, sampling=sampling))


def prefilled(max_tokens: dict[str, int], **settings: object) -> tuple[EngineCore, MockerRunner]:
    """A `twin` core with these requests added and prefilled (their first step run)."""
    core, runner = twin(**settings)  # type: ignore[arg-type]
    add(core, max_tokens)
    core.step()
    return core, runner


def state(core: EngineCore) -> object:
    """Everything a step can change."""
    return (
        [
            (r.request_id, r.token_ids, r.num_computed_tokens, r.block_ids)
            for r in core.scheduler.running
        ],
        core.pool.get_free_block_ids(),
        sorted(core.pool.get_cached_hashes()),
        core.take_kv_events(),
        core.take_step_records(),
        core.get_load().num_steps,
    )


def step_until(core: EngineCore, runner: MockerRunner, end_ms: float) -> list[list[EngineOutput]]:
    """Reference: `step` until a step starts at or after `end_ms`; each step's outputs."""
    outputs, t_ms = [], 0.0
    while t_ms < end_ms and core.has_work():
        outputs.append(core.step())
        t_ms += runner.last_step_ms
    return outputs


def test_a_run_is_the_steps_it_replaces() -> None:
    fast, fast_runner = twin()
    slow, slow_runner = twin()
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
    assert state(fast) == state(slow)
    assert fast_runner.clock.now_s == slow_runner.clock.now_s


def test_a_suspended_run_goes_on_as_the_steps_do() -> None:
    fast, fast_runner = prefilled({"a": 30, "b": 45, "c": 40}, num_kv_blocks=40)
    slow, slow_runner = prefilled({"a": 30, "b": 45, "c": 40}, num_kv_blocks=40)
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
    assert state(fast) == state(slow)
    assert fast_runner.clock.now_s == slow_runner.clock.now_s
    assert fast.get_load().num_steps == slow.get_load().num_steps


def test_a_request_joining_ends_a_suspended_run() -> None:
    core, runner = prefilled({"a": 30, "b": 30}, max_num_seqs=2)
    run = core.run_decodes(runner, 0.0, 5.0)
    assert run is not None and run.can_extend()
    add(core, {"c": 30})  # waits (the batch is full), yet the next step's records change
    assert not run.can_extend()
    outputs = run.end()
    assert [o.request_id for o in outputs] == ["a", "b"] and not run.can_extend()


def test_a_request_leaving_the_batch_ends_a_suspended_run() -> None:
    core, runner = prefilled({"a": 30, "b": 30})
    run = core.run_decodes(runner, 0.0, 5.0)
    assert run is not None and run.can_extend()
    assert core.abort_request("b")
    assert not run.can_extend()


def test_a_suspended_run_whose_next_step_would_preempt_ends_where_it_was() -> None:
    whole_core, whole_runner = prefilled({"a": 40, "b": 40}, num_kv_blocks=12)
    whole = whole_core.run_decodes(whole_runner, 0.0, float("inf"))
    assert whole is not None and whole.is_done
    steps = whole.num_steps
    fast, fast_runner = prefilled({"a": 40, "b": 40}, num_kv_blocks=12)
    slow, _ = prefilled({"a": 40, "b": 40}, num_kv_blocks=12)
    run = fast.run_decodes(fast_runner, 0.0, 0.0)
    assert run is not None
    while not run.is_done:
        fast.extend_decodes(run, run.step_end_ms[-1])  # one step each time
    assert run.num_steps == steps  # the extension that would preempt ran no step
    reference = [slow.step() for _ in range(steps)]
    assert reference[-1] == run.outputs
    assert state(fast) == state(slow)


def test_a_run_ends_with_the_step_that_finishes_a_request() -> None:
    fast, fast_runner = twin()
    slow, _ = twin()
    for core in (fast, slow):
        add(core, {"a": 9, "b": 20})
        core.step()
    run = fast.run_decodes(fast_runner, 0.0, float("inf"))
    assert run is not None and run.num_steps == 8  # a's 2nd..9th tokens
    assert [o.finish_reason for o in run.outputs] == [FinishReason.LENGTH, None]
    reference = [slow.step() for _ in range(8)]
    assert reference[-1] == run.outputs
    assert state(fast) == state(slow)
    assert [r.request_id for r in fast.scheduler.running] == ["b"]


def test_a_run_stops_before_the_step_that_would_preempt() -> None:
    # 12 blocks of 4 tokens: two 6-token prompts grow until the pool is full
    fast, fast_runner = twin(num_kv_blocks=12)
    slow, _ = twin(num_kv_blocks=12)
    for core in (fast, slow):
        add(core, {"a": 40, "b": 40})
        core.step()
    run = fast.run_decodes(fast_runner, 0.0, float("inf"))
    assert run is not None
    assert fast.pool.get_num_free_blocks() == 0
    reference = [slow.step() for _ in range(run.num_steps)]
    assert reference[-1] == run.outputs
    assert state(fast) == state(slow)
    assert fast.run_decodes(fast_runner, 0.0, float("inf")) is None  # the next step preempts
    assert slow.step() and slow.scheduler.waiting  # as the reference does


def test_no_run_while_a_waiting_request_could_be_admitted() -> None:
    core, runner = twin()
    add(core, {"a": 30})
    core.step()
    add(core, {"b": 30})
    assert core.run_decodes(runner, 0.0, float("inf")) is None
