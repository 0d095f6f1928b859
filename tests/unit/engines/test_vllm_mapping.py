"""Sampling, output and load mapping of the vLLM adapter, without vLLM."""

from __future__ import annotations

import msgspec
import pytest
from vllm_fakes import FakeCompletion, FakeLogprob, FakeOutput

from armature.engines.api import InvalidRequestError
from armature.engines.vllm.load import LoadTracker, SchedulerSnapshot
from armature.engines.vllm.outputs import to_engine_output, to_finish_reason
from armature.engines.vllm.sampling import (
    VllmSampling,
    VllmStructuredOutputs,
    to_vllm_prompt,
    to_vllm_sampling,
)
from armature.engines.vllm.steps import IterationSnapshot, read_iteration, to_step_record
from armature.protocols.engine import (
    EngineLoad,
    EngineOutput,
    EngineRequest,
    FinishReason,
    SamplingParams,
    StepRecord,
    TokenLogprob,
)
from armature.protocols.guide import (
    ChoiceGuide,
    JsonObjectGuide,
    JsonSchemaGuide,
    LarkGuide,
    RegexGuide,
)


def request(**sampling: object) -> EngineRequest:
    params = msgspec.convert({"max_tokens": 5, **sampling}, SamplingParams)
    return EngineRequest(request_id="r", prompt_token_ids=[1, 2, 3], sampling=params)


def test_every_sampling_field_maps_one_to_one() -> None:
    r = request(
        max_tokens=7,
        temperature=0.5,
        top_p=0.9,
        top_k=40,
        min_p=0.05,
        seed=3,
        min_tokens=2,
        ignore_eos=True,
        stop_token_ids=(5, 6),
        logprobs=4,
        presence_penalty=0.5,
        frequency_penalty=-0.25,
        repetition_penalty=1.3,
        logit_bias=((7, -100.0), (9, 2.5)),
    )
    assert to_vllm_sampling(r, max_logprobs=20) == VllmSampling(
        max_tokens=7,
        temperature=0.5,
        top_p=0.9,
        top_k=40,
        seed=3,
        min_tokens=2,
        min_p=0.05,
        ignore_eos=True,
        stop_token_ids=[5, 6],
        logprobs=4,
        presence_penalty=0.5,
        frequency_penalty=-0.25,
        repetition_penalty=1.3,
        logit_bias={7: -100.0, 9: 2.5},
        detokenize=False,
        skip_special_tokens=False,
    )


def test_defaults_mean_the_same_in_vllm() -> None:
    s = to_vllm_sampling(request(), max_logprobs=20)
    assert (s.temperature, s.top_p, s.top_k, s.seed, s.logprobs) == (1.0, 1.0, 0, None, None)
    assert s.min_p == 0.0
    penalties = (s.presence_penalty, s.frequency_penalty, s.repetition_penalty, s.logit_bias)
    assert penalties == (0.0, 0.0, 1.0, None)


def test_each_guide_maps_to_one_structured_outputs_field() -> None:
    schema = '{"type": "object", "properties": {"a": {"type": "integer"}}}'
    cases = [
        (
            JsonSchemaGuide(schema_json=schema, param="guided_json"),
            VllmStructuredOutputs(json=schema),
        ),
        (JsonObjectGuide(param="response_format"), VllmStructuredOutputs(json_object=True)),
        (RegexGuide(pattern="[a-z]+", param="guided_regex"), VllmStructuredOutputs(regex="[a-z]+")),
        (
            ChoiceGuide(choices=("yes", "no"), param="guided_choice"),
            VllmStructuredOutputs(choice=["yes", "no"]),
        ),
        (
            LarkGuide(grammar='start: "a"+', param="tool_choice"),
            VllmStructuredOutputs(grammar='start: "a"+'),
        ),
    ]
    for guide, expected in cases:
        mapped = to_vllm_sampling(request(guide=guide), max_logprobs=20)
        assert mapped.structured_outputs == expected
        assert mapped.structured_outputs.disable_any_whitespace is True
    assert to_vllm_sampling(request(), max_logprobs=20).structured_outputs is None


def test_a_resumed_request_continues_after_its_output() -> None:
    r = msgspec.structs.replace(request(min_tokens=4), output_token_ids=[9, 9, 9])
    assert to_vllm_prompt(r).token_ids == [1, 2, 3, 9, 9, 9]
    assert to_vllm_prompt(r).num_prompt_tokens == 3
    assert to_vllm_sampling(r, max_logprobs=20).min_tokens == 1


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"sampling": SamplingParams(max_tokens=5, logprobs=21)}, "at most 20 logprobs"),
        (
            {"sampling": SamplingParams(max_tokens=5, prompt_logprobs=21)},
            "at most 20 logprobs per prompt token",
        ),
    ],
)
def test_what_vllm_lacks_is_refused(change: dict[str, object], message: str) -> None:
    r = msgspec.structs.replace(request(), **change)
    with pytest.raises(InvalidRequestError, match=message):
        to_vllm_sampling(r, max_logprobs=20)


def test_first_output_carries_usage_later_ones_do_not() -> None:
    out = FakeOutput([FakeCompletion([7])], num_cached_tokens=128)
    first = to_engine_output("r", out, num_logprobs=None, num_prompt_tokens=300, first=True)
    assert first == EngineOutput(
        request_id="r", new_token_ids=[7], num_prompt_tokens=300, num_cached_tokens=128
    )
    later = to_engine_output("r", out, num_logprobs=None, num_prompt_tokens=300, first=False)
    assert (later.num_prompt_tokens, later.num_cached_tokens) == (0, 0)


def test_logprobs_top_by_rank_and_the_sampled_token() -> None:
    # the sampled token (9) is rank 3: vLLM sends the top 2 and it
    entries = {4: FakeLogprob(-0.5, 1), 5: FakeLogprob(-1.0, 2), 9: FakeLogprob(-2.0, 3)}
    out = FakeOutput([FakeCompletion([9], "length", [entries])])
    result = to_engine_output("r", out, num_logprobs=2, num_prompt_tokens=3, first=True)
    assert result.logprobs == [TokenLogprob(9, -2.0, [(4, -0.5), (5, -1.0)])]
    assert result.finish_reason is FinishReason.LENGTH


def test_finish_reasons() -> None:
    assert to_finish_reason(None) is None
    assert to_finish_reason("stop") is FinishReason.STOP
    assert to_finish_reason("abort") is FinishReason.ABORT
    assert to_finish_reason("error") is FinishReason.ERROR
    with pytest.raises(ValueError, match="unknown vLLM finish reason"):
        to_finish_reason("exploded")


def test_load_from_scheduler_stats_and_queued_prompts() -> None:
    load = LoadTracker(num_total_blocks=45)
    assert load.get_load() == EngineLoad(
        num_active_blocks=0,
        num_total_blocks=45,
        num_waiting=0,
        num_running=0,
        num_prefill_tokens_queued=0,
    )
    load.add_request("a", 300)
    load.add_request("b", 20)
    load.record_step(SchedulerSnapshot(num_running=1, num_waiting=1, kv_cache_usage=0.2))
    assert load.get_load() == EngineLoad(
        num_active_blocks=9,
        num_total_blocks=45,
        num_waiting=1,
        num_running=1,
        num_prefill_tokens_queued=320,
        num_steps=1,
    )
    load.prefill_done("a")
    load.prefill_done("a")  # idempotent: first output, then the end of the request
    assert load.get_load().num_prefill_tokens_queued == 20
    load.prefill_done("b")  # e.g. cancelled before its first token
    assert load.get_load().num_prefill_tokens_queued == 0


def test_load_is_idle_once_nothing_is_in_flight() -> None:
    """vLLM's last stats (taken before an abort) must not keep the engine looking busy."""
    load = LoadTracker(num_total_blocks=10)
    load.add_request("a", 50)
    load.record_step(SchedulerSnapshot(num_running=1, num_waiting=2, kv_cache_usage=0.5))
    assert (load.get_load().num_running, load.get_load().num_waiting) == (1, 0)
    load.finish_request("a")
    load.finish_request("a")
    idle = load.get_load()
    assert (idle.num_running, idle.num_waiting, idle.num_active_blocks) == (0, 0, 0)
    assert idle.num_prefill_tokens_queued == 0


def test_step_record_from_vllm_numbers() -> None:
    load = EngineLoad(
        num_active_blocks=3,
        num_total_blocks=10,
        num_waiting=2,
        num_running=1,
        num_prefill_tokens_queued=90,
    )
    iteration = IterationSnapshot(
        num_first_tokens=1,
        num_first_token_prompt_tokens=20,
        num_prefix_hit_tokens=48,  # hits of a long prompt scheduled now, done in a later step
        num_decode_outputs=4,
        min_inter_token_latency_s=0.015,
    )
    assert to_step_record(iteration, load, block_size=16) == StepRecord(
        num_scheduled_prefill_requests=1,
        num_scheduled_prefill_tokens=0,  # never below 0
        num_queued_prefill_requests=2,
        num_queued_prefill_tokens=90,
        num_decode_requests=4,
        num_decode_kv_tokens=0,
        num_kv_tokens_used=48,
        step_wall_s=0.015,
    )


def test_stats_vllm_does_not_send_read_as_nothing_reported() -> None:
    assert read_iteration(None, None) == IterationSnapshot()
    assert read_iteration(object(), object()) == IterationSnapshot()


def test_prompt_logprobs_are_asked_for_once() -> None:
    """A resumed request (migrated after its first output) gave them already."""
    fresh = request(prompt_logprobs=2)
    assert to_vllm_sampling(fresh, max_logprobs=20).prompt_logprobs == 2
    resumed = msgspec.structs.replace(fresh, output_token_ids=[9])
    assert to_vllm_sampling(resumed, max_logprobs=20).prompt_logprobs is None
    assert to_vllm_sampling(request(), max_logprobs=20).prompt_logprobs is None
