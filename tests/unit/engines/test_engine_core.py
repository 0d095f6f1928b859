"""EngineCore with a deterministic fake runner: exact scheduling, preemption, prefix caching,
finishing and block accounting."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from fakes import EOS, CountingRunner

from armature.engines.api import InvalidRequestError
from armature.engines.native.config import NativeEngineConfig
from armature.engines.native.core import EngineCore
from armature.kv.eviction import EvictedBlock
from armature.kv.hashing import compute_block_hashes
from armature.protocols.engine import (
    EngineOutput,
    EngineRequest,
    FinishReason,
    SamplingParams,
    StepRecord,
)
from armature.protocols.kv_events import KvRemoved, KvStored


def make_core(num_blocks: int = 64, block_size: int = 4, **overrides: object) -> EngineCore:
    config = NativeEngineConfig(model_dir=Path("/unused"), block_size=block_size, **overrides)  # type: ignore[arg-type]
    return EngineCore(config, CountingRunner(), num_blocks=num_blocks)


def request(rid: str, prompt: list[int], max_tokens: int = 4, **kw: object) -> EngineRequest:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, **kw)  # type: ignore[arg-type]
    return EngineRequest(request_id=rid, prompt_token_ids=prompt, sampling=params)


def run_all(core: EngineCore, max_steps: int = 1000) -> dict[str, list[EngineOutput]]:
    outputs: dict[str, list[EngineOutput]] = {}
    for _ in range(max_steps):
        if not core.has_work():
            break
        for out in core.step():
            outputs.setdefault(out.request_id, []).append(out)
    assert not core.has_work()
    return outputs


def tokens(outs: list[EngineOutput]) -> list[int]:
    return [t for o in outs for t in o.new_token_ids]


def runner(core: EngineCore) -> CountingRunner:
    assert isinstance(core.runner, CountingRunner)
    return core.runner


def test_single_request_generates_and_frees_everything() -> None:
    core = make_core()
    core.add_request(request("a", [1, 2, 3, 4, 5], max_tokens=3))
    outs = run_all(core)["a"]
    assert tokens(outs) == [6, 7, 8]
    assert [o.finish_reason for o in outs] == [None, None, FinishReason.LENGTH]
    assert outs[0].num_prompt_tokens == 5 and outs[1].num_prompt_tokens == 0
    assert runner(core).steps == [[("a", 0, 5)], [("a", 5, 1)], [("a", 6, 1)]]
    assert core.pool.get_num_active_blocks() == 0
    core.pool.check_integrity()


def test_eos_stops_unless_ignored_and_min_tokens_blocks_it() -> None:
    core = make_core()
    core.add_request(request("eos", [97], max_tokens=10))
    core.add_request(request("ign", [97], max_tokens=4, ignore_eos=True))
    core.add_request(request("min", [97], max_tokens=4, min_tokens=3))
    outs = run_all(core)
    assert tokens(outs["eos"]) == [98, EOS]
    assert outs["eos"][-1].finish_reason is FinishReason.STOP
    assert tokens(outs["ign"]) == [98, EOS, 0, 1]
    assert outs["ign"][-1].finish_reason is FinishReason.LENGTH
    # EOS is masked for the first 3 tokens: the fake's only other candidates tie at -10,
    # so argmax picks token 0 instead of EOS at step 2
    assert tokens(outs["min"])[:2] == [98, 0]
    assert core.pool.get_num_active_blocks() == 0


def test_stop_token_ids_finish_with_stop() -> None:
    core = make_core()
    core.add_request(request("s", [10], max_tokens=10, stop_token_ids=(13,)))
    outs = run_all(core)["s"]
    assert tokens(outs) == [11, 12, 13]
    assert outs[-1].finish_reason is FinishReason.STOP


def test_chunked_prefill_respects_token_budget() -> None:
    core = make_core(max_num_batched_tokens=4)
    core.add_request(request("long", list(range(10)), max_tokens=2))
    core.add_request(request("short", [50, 51], max_tokens=2))
    outs = run_all(core)
    assert runner(core).steps == [
        [("long", 0, 4)],
        [("long", 4, 4)],
        [("long", 8, 2), ("short", 0, 2)],
        [("long", 10, 1), ("short", 2, 1)],
    ]
    assert tokens(outs["long"]) == [10, 11]
    assert tokens(outs["short"]) == [52, 53]


def test_prefix_cache_hit_reuses_blocks_and_reports_cached_tokens() -> None:
    core = make_core(block_size=4)
    prompt = list(range(20, 30))  # 10 tokens: 2 full blocks
    core.add_request(request("first", prompt, max_tokens=1))
    first = run_all(core)["first"]
    assert first[0].num_cached_tokens == 0
    core.add_request(request("second", prompt, max_tokens=1))
    second = run_all(core)["second"]
    assert second[0].num_cached_tokens == 8
    assert runner(core).steps[-1] == [("second", 8, 2)]
    assert tokens(second) == tokens(first)


def test_fully_cached_prompt_still_computes_its_last_token() -> None:
    core = make_core(block_size=4)
    prompt = list(range(8))  # exactly 2 blocks
    core.add_request(request("a", prompt, max_tokens=1))
    run_all(core)
    core.add_request(request("b", prompt, max_tokens=1))
    outs = run_all(core)["b"]
    # only the first block may be reused: the last token's logits must be computed
    assert outs[0].num_cached_tokens == 4
    assert runner(core).steps[-1] == [("b", 4, 4)]


def test_kv_events_follow_block_lifecycle() -> None:
    core = make_core(num_blocks=3, block_size=4)
    core.add_request(request("a", list(range(8)), max_tokens=1))
    run_all(core)
    events = core.take_kv_events()
    assert [type(e) for e in events] == [KvStored]
    assert isinstance(events[0], KvStored)
    assert [e.event_id for e in events] == [0]
    assert len(events[0].blocks) == 2 and events[0].parent_hash is None
    stored_hashes = [b.seq_hash for b in events[0].blocks]
    # a different prompt needing all 3 blocks evicts the cached ones
    core.add_request(request("b", list(range(50, 61)), max_tokens=1))
    run_all(core)
    events = core.take_kv_events()
    removed = [e for e in events if isinstance(e, KvRemoved)]
    assert sorted(h for e in removed for h in e.seq_hashes) == sorted(stored_hashes)
    assert [e.event_id for e in events] == list(range(1, 1 + len(events)))


def test_eviction_observer_is_given_to_the_block_pool() -> None:
    calls: list[list[EvictedBlock]] = []

    class Recorder:
        def on_evict(self, blocks: Sequence[EvictedBlock]) -> None:
            calls.append(list(blocks))

    config = NativeEngineConfig(model_dir=Path("/unused"), block_size=4)
    core = EngineCore(config, CountingRunner(), num_blocks=3, eviction_observer=Recorder())
    core.add_request(request("a", list(range(8)), max_tokens=1))
    run_all(core)
    assert calls == []
    # "a" freed its blocks tail first: [2, 1, 0]; "b" needs all 3, evicting block 1 then 0.
    assert core.pool.get_free_block_ids() == [2, 1, 0]
    core.add_request(request("b", list(range(50, 61)), max_tokens=1))
    run_all(core)
    (s0, l0), (s1, l1) = compute_block_hashes(list(range(8)), 4)
    assert calls == [[EvictedBlock(1, s1, l1, s0), EvictedBlock(0, s0, l0, None)]]


def test_preemption_recomputes_and_loses_nothing() -> None:
    # 5 blocks of 4 tokens; two requests each growing to 12 tokens (3 blocks) cannot both fit
    core = make_core(num_blocks=5, block_size=4)
    core.add_request(request("a", list(range(0, 7)), max_tokens=5))
    core.add_request(request("b", list(range(30, 37)), max_tokens=5))
    outs = run_all(core)
    assert tokens(outs["a"]) == [7, 8, 9, 10, 11]
    assert tokens(outs["b"]) == [37, 38, 39, 40, 41]
    # step 3: a takes the last free block; b needs one too and, being the most recently
    # admitted, is preempted. It resumes once a finishes, from prompt + its 2 output tokens:
    # its 2 full blocks hit the prefix cache, so only token 8 is recomputed.
    assert runner(core).steps == [
        [("a", 0, 7), ("b", 0, 7)],
        [("a", 7, 1), ("b", 7, 1)],
        [("a", 8, 1)],
        [("a", 9, 1)],
        [("a", 10, 1)],
        [("b", 8, 1)],
        [("b", 9, 1)],
        [("b", 10, 1)],
    ]
    assert core.pool.get_num_active_blocks() == 0
    core.pool.check_integrity()


def test_abort_frees_blocks_and_unknown_abort_is_false() -> None:
    core = make_core()
    core.add_request(request("a", list(range(9)), max_tokens=50))
    core.step()
    assert core.pool.get_num_active_blocks() == 3
    assert core.abort_request("a") is True
    assert core.abort_request("a") is False
    assert core.pool.get_num_active_blocks() == 0
    assert not core.has_work()


def test_runner_failure_fails_the_batch_and_frees_blocks() -> None:
    core = make_core()
    core.add_request(request("a", [1, 2, 3], max_tokens=5))
    runner(core).fail_next = True
    outs = core.step()
    assert [(o.request_id, o.finish_reason) for o in outs] == [("a", FinishReason.ERROR)]
    assert outs[0].error == "simulated device failure"
    assert core.pool.get_num_active_blocks() == 0
    assert core.take_step_records() == []  # a failed batch says nothing about timing
    core.add_request(request("b", [1, 2, 3], max_tokens=1))
    assert tokens(run_all(core)["b"]) == [4]
    assert [r.num_scheduled_prefill_tokens for r in core.take_step_records()] == [3]


def test_max_num_seqs_limits_running_requests() -> None:
    core = make_core(max_num_seqs=2)
    for i in range(3):
        core.add_request(request(str(i), [i + 1], max_tokens=2))
    core.step()
    assert runner(core).steps[0] == [("0", 0, 1), ("1", 0, 1)]
    run_all(core)


def test_resumed_request_continues_after_carried_output() -> None:
    core = make_core()
    carried = EngineRequest(
        request_id="m",
        prompt_token_ids=[1, 2, 3],
        output_token_ids=[4, 5],
        sampling=SamplingParams(max_tokens=2, temperature=0.0),
    )
    core.add_request(carried)
    outs = run_all(core)["m"]
    assert tokens(outs) == [6, 7]
    assert runner(core).steps[0] == [("m", 0, 5)]


@pytest.mark.parametrize(
    ("prompt", "max_tokens", "fragment"),
    [
        ([], 1, "empty"),
        ([100], 1, "token ids"),
        ([1] * 500, 20, "context length"),
        ([1], 0, "max_tokens"),
    ],
)
def test_invalid_requests_are_refused(prompt: list[int], max_tokens: int, fragment: str) -> None:
    core = make_core()
    with pytest.raises(InvalidRequestError, match=fragment):
        core.add_request(request("x", prompt, max_tokens=max_tokens))
    assert not core.has_work()


def test_stop_token_ids_outside_the_vocabulary_are_refused_naming_the_field() -> None:
    core = make_core()
    vocab_size = core.runner.arch.vocab_size
    with pytest.raises(InvalidRequestError, match="stop token ids") as caught:
        core.add_request(request("x", [1, 2], stop_token_ids=[vocab_size]))
    assert caught.value.param == "stop_token_ids"
    assert not core.has_work()


def test_request_larger_than_the_cache_is_refused() -> None:
    core = make_core(num_blocks=2, block_size=4)
    with pytest.raises(InvalidRequestError, match="KV cache"):
        core.add_request(request("x", list(range(8)), max_tokens=4))


def _fields(record: StepRecord) -> tuple[int, ...]:
    return (
        record.num_scheduled_prefill_requests,
        record.num_scheduled_prefill_tokens,
        record.num_queued_prefill_requests,
        record.num_queued_prefill_tokens,
        record.num_decode_requests,
        record.num_decode_kv_tokens,
        record.num_kv_tokens_used,
    )


def test_step_records_describe_each_step() -> None:
    core = make_core(block_size=4, max_num_batched_tokens=4)
    core.add_request(request("a", list(range(6)), max_tokens=2))
    core.add_request(request("b", [7], max_tokens=1))
    run_all(core)
    records = core.take_step_records()
    # step 1: a's first 4-token chunk (b waits); step 2: a's last 2 + b's 1 (3 blocks in
    # use; b finishes); step 3: a's decode over 7 tokens (2 blocks); a then finishes
    assert [_fields(r) for r in records] == [
        (1, 4, 2, 3, 0, 0, 4),
        (2, 3, 0, 0, 0, 0, 12),
        (0, 0, 0, 0, 1, 7, 8),
    ]
    assert all(r.step_wall_s >= 0 for r in records)
    assert core.take_step_records() == []  # drained


def test_step_records_of_a_mixed_batch_with_a_queue() -> None:
    """Prefill chunks, decodes and a request held back by max_num_seqs: one record per step
    that ran a batch, none for a step with nothing scheduled."""
    core = make_core(block_size=4, max_num_batched_tokens=8, max_num_seqs=2)
    assert core.step() == []  # nothing scheduled: no record
    core.add_request(request("a", [10, 11, 12, 13, 14], max_tokens=3))
    core.add_request(request("b", [20, 21, 22, 23, 24, 25], max_tokens=2))
    core.add_request(request("c", [30, 31, 32], max_tokens=1))
    steps = []
    while core.has_work():
        core.step()
        steps.append(runner(core).steps[-1])
    assert steps == [
        [("a", 0, 5), ("b", 0, 3)],
        [("a", 5, 1), ("b", 3, 3)],
        [("a", 6, 1), ("b", 6, 1)],
        [("c", 0, 3)],
    ]
    assert [_fields(r) for r in core.take_step_records()] == [
        (2, 8, 2, 6, 0, 0, 12),  # b's chunk left 3 to prefill; c waits (3)
        (1, 3, 1, 3, 1, 6, 16),  # a decodes over 6 tokens; c still waits
        (0, 0, 1, 3, 2, 14, 16),  # two decodes over 7 tokens each; both finish
        (1, 3, 0, 0, 0, 0, 4),
    ]
