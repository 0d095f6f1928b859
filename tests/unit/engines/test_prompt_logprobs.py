"""Prompt logprobs (`SamplingParams.prompt_logprobs`): in float32 the native engine gives
each prompt token's logprob (after the first) and the top alternatives as transformers'
log-softmax of the same prompt, whatever the chunking, the prefix cache or a preemption;
they come once, with the first output. The mocker computes none but runs the whole prompt."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest
import torch
from hf_reference import HfReference
from mocker_cores import mocker_core

from armature.engines.native import model_runner
from armature.engines.native.config import NativeEngineConfig
from armature.engines.native.core import EngineCore
from armature.engines.native.model_runner import _add_prompt_logprobs
from armature.engines.native.request import RequestState
from armature.engines.native.scheduler import ScheduledChunk
from armature.model.weights import ModelWeights
from armature.protocols.engine import EngineOutput, EngineRequest, SamplingParams, TokenLogprob

TOP = 3
ATOL = 2e-4  # float32 rounding between batched and single forwards


def engine(model_dir: Path, **overrides: object) -> EngineCore:
    settings: dict[str, object] = {"num_kv_blocks": 256, "max_num_batched_tokens": 2048}
    settings.update(overrides)
    config = NativeEngineConfig(model_dir=model_dir, dtype="float32", **settings)  # type: ignore[arg-type]
    return EngineCore(config)


def request(rid: str, prompt: list[int], prompt_logprobs: int | None = TOP) -> EngineRequest:
    params = SamplingParams(
        max_tokens=3, temperature=0.0, min_tokens=3, prompt_logprobs=prompt_logprobs
    )
    return EngineRequest(request_id=rid, prompt_token_ids=prompt, sampling=params)


def run(core: EngineCore, requests: list[EngineRequest]) -> dict[str, list[EngineOutput]]:
    for r in requests:
        core.add_request(r)
    outputs: dict[str, list[EngineOutput]] = {r.request_id: [] for r in requests}
    while core.has_work():
        for out in core.step():
            outputs[out.request_id].append(out)
    core.pool.check_integrity()
    return outputs


def reference(ref: HfReference, prompt: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = ref.model(torch.tensor([prompt])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)


def assert_equal_to_transformers(
    ref: HfReference, prompt: list[int], got: list[TokenLogprob]
) -> None:
    expected = reference(ref, prompt)
    assert [g.token_id for g in got] == prompt[1:]
    for position, item in enumerate(got):  # the logits at position give token position + 1
        row = expected[position]
        assert item.logprob == pytest.approx(float(row[prompt[position + 1]]), abs=ATOL)
        values = torch.topk(row, TOP).values
        assert [v for _, v in item.top] == pytest.approx(values.tolist(), abs=ATOL)
        for token, value in item.top:  # a near-tie may swap two ids: each at its own value
            assert value == pytest.approx(float(row[token]), abs=ATOL)


def prompts_of(lengths: list[int], seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 512) for _ in range(n)] for n in lengths]


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir: Path) -> tuple[Path, HfReference]:
    return tiny_llama_dir, HfReference(tiny_llama_dir)


def test_they_equal_transformers_and_come_once_with_the_first_output(
    tiny: tuple[Path, HfReference],
) -> None:
    model_dir, ref = tiny
    prompts = prompts_of([1, 2, 17, 70, 150], seed=1)
    outputs = run(engine(model_dir), [request(str(i), p) for i, p in enumerate(prompts)])
    for i, prompt in enumerate(prompts):
        first, *rest = outputs[str(i)]
        assert first.prompt_logprobs is not None and len(first.prompt_logprobs) == len(prompt) - 1
        assert_equal_to_transformers(ref, prompt, first.prompt_logprobs)
        assert all(o.prompt_logprobs is None for o in rest)
        assert first.logprobs is None  # output logprobs are their own field


@pytest.mark.parametrize("max_num_batched_tokens", [7, 16, 33])
def test_chunked_prefill_gives_the_same(
    tiny: tuple[Path, HfReference], max_num_batched_tokens: int
) -> None:
    """Chunks of any size, batched with a request that wants none and one that decodes."""
    model_dir, ref = tiny
    long, other = prompts_of([100, 40], seed=2)
    core = engine(model_dir, max_num_batched_tokens=max_num_batched_tokens)
    outputs = run(core, [request("other", other, None), request("long", long)])
    assert outputs["other"][0].prompt_logprobs is None
    logprobs = outputs["long"][0].prompt_logprobs
    assert logprobs is not None
    assert_equal_to_transformers(ref, long, logprobs)


def test_a_chunk_s_logits_are_made_a_slice_at_a_time(
    tiny: tuple[Path, HfReference], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chunk's prompt rows are projected to logits PROMPT_LOGITS_ROWS at a time (a whole
    chunk's logits at once took chunk x vocab x 4 bytes): the same logprobs, and no
    projection of more rows than the slice."""
    model_dir, ref = tiny
    monkeypatch.setattr(model_runner, "PROMPT_LOGITS_ROWS", 5)
    projected: list[int] = []
    project = model_runner.project_logits

    def recording(hidden: torch.Tensor, weights: ModelWeights) -> torch.Tensor:
        projected.append(hidden.shape[0])
        return project(hidden, weights)

    monkeypatch.setattr(model_runner, "project_logits", recording)
    long, other = prompts_of([100, 40], seed=2)
    core = engine(model_dir, max_num_batched_tokens=33)
    outputs = run(core, [request("other", other, None), request("long", long)])
    logprobs = outputs["long"][0].prompt_logprobs
    assert logprobs is not None
    assert_equal_to_transformers(ref, long, logprobs)
    assert max(projected) == 5  # 2 at most where a step samples (other, long)
    assert sum(n for n in projected if n) >= 99


def test_a_cached_prompt_is_computed_again_and_its_blocks_stay_cached(
    tiny: tuple[Path, HfReference],
) -> None:
    model_dir, ref = tiny
    [prompt] = prompts_of([70], seed=3)
    core = engine(model_dir)
    run(core, [request("warm", prompt, None)])
    again = run(core, [request("scored", prompt)])["scored"][0]
    assert again.num_cached_tokens == 0  # every position's logits were needed
    assert again.prompt_logprobs is not None
    assert_equal_to_transformers(ref, prompt, again.prompt_logprobs)
    after = run(core, [request("after", prompt, None)])["after"][0]
    assert after.num_cached_tokens == 64  # four full blocks, still hit


def test_a_preempted_prompt_starts_its_logprobs_over(tiny: tuple[Path, HfReference]) -> None:
    """24 blocks cannot hold 8 growing sequences: some are preempted and computed again."""
    model_dir, ref = tiny
    prompts = prompts_of([30 + 4 * i for i in range(8)], seed=5)
    core = engine(model_dir, num_kv_blocks=24, max_num_batched_tokens=48)
    requests = [
        EngineRequest(
            request_id=str(i),
            prompt_token_ids=p,
            sampling=SamplingParams(
                max_tokens=12, temperature=0.0, min_tokens=12, prompt_logprobs=TOP
            ),
        )
        for i, p in enumerate(prompts)
    ]
    for r in requests:
        core.add_request(r)
    states = list(core._requests.values())
    outputs: dict[str, list[EngineOutput]] = {r.request_id: [] for r in requests}
    while core.has_work():
        for out in core.step():
            outputs[out.request_id].append(out)
    assert sum(s.num_preemptions for s in states) > 0
    for i, prompt in enumerate(prompts):
        given = [o.prompt_logprobs for o in outputs[str(i)] if o.prompt_logprobs is not None]
        assert len(given) == 1
        assert_equal_to_transformers(ref, prompt, given[0])


def test_the_mocker_computes_none_but_runs_the_whole_prompt() -> None:
    core, _ = mocker_core(64, 16)
    prompt = list(range(3, 67))
    run(core, [request("warm", prompt, None)])
    scored = run(core, [request("scored", prompt)])["scored"][0]
    assert (scored.prompt_logprobs, scored.num_cached_tokens) == (None, 0)
    assert run(core, [request("after", prompt, None)])["after"][0].num_cached_tokens == 48


@pytest.mark.slow
def test_the_default_model_equals_transformers_chunked(default_model_dir: Path) -> None:
    ref = HfReference(default_model_dir)
    [prompt] = [[random.Random(9).randrange(3, 49152) for _ in range(90)]]
    core = engine(default_model_dir, num_kv_blocks=64, max_num_batched_tokens=32)
    first = run(core, [request("d", prompt)])["d"][0]
    assert first.prompt_logprobs is not None
    assert_equal_to_transformers(ref, prompt, first.prompt_logprobs)


def test_a_prompt_computed_again_restarts_its_logprobs() -> None:
    """After a preemption the prompt is computed from its first token again: the logprobs
    kept from before are dropped, not doubled (the preemption test above cannot make sure
    one came mid-prefill)."""
    prompt = [5, 6, 7, 8, 9]
    state = RequestState(
        request_id="r",
        token_ids=list(prompt),
        num_prompt_tokens=5,
        sampling=SamplingParams(max_tokens=1, prompt_logprobs=0),
        sampling_seed=None,
        arrival_index=0,
        prompt_logprobs=[],
    )
    hidden = torch.zeros(4, 8)
    weights = cast(ModelWeights, SimpleNamespace(lm_head=torch.zeros(16, 8), lm_head_t=None))
    _add_prompt_logprobs([ScheduledChunk(state, 0, 3)], hidden[:3], weights)  # positions 0-2
    assert [lp.token_id for lp in state.prompt_logprobs or []] == [6, 7, 8]
    _add_prompt_logprobs([ScheduledChunk(state, 0, 2)], hidden[:2], weights)  # preempted
    assert [lp.token_id for lp in state.prompt_logprobs or []] == [6, 7]
    _add_prompt_logprobs([ScheduledChunk(state, 2, 3)], hidden[:2], weights)  # the last chunk
    assert [lp.token_id for lp in state.prompt_logprobs or []] == [6, 7, 8, 9]
    assert [lp.logprob for lp in state.prompt_logprobs or []] == [
        pytest.approx(-2.7726, abs=1e-4)
    ] * 4
