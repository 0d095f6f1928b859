"""In float32, greedy output with each penalty equals transformers' generation with the matching
logits processor: RepetitionPenaltyLogitsProcessor (repetition_penalty), a processor written
here with OpenAI's formula (presence and frequency penalties) and SequenceBiasLogitsProcessor
with one-token sequences (logit_bias). Requests with different penalties, and none, share
batches. A divergence is accepted only at a near-tie of transformers' processed scores."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from hf_reference import NEAR_TIE_LOGIT_MARGIN, HfReference
from transformers import (
    LogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
)

from armature.engines.native.config import NativeEngineConfig
from armature.engines.native.core import EngineCore
from armature.protocols.engine import EngineRequest, SamplingParams

NEW_TOKENS = 16


class OpenAiPenaltyProcessor(LogitsProcessor):
    """OpenAI's presence and frequency penalties over the tokens generated after the prompt:
    logits[t] -= frequency * count[t] + presence * (count[t] > 0)."""

    def __init__(self, num_prompt_tokens: int, presence: float, frequency: float):
        self.num_prompt_tokens = num_prompt_tokens
        self.presence = presence
        self.frequency = frequency

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        output = input_ids[:, self.num_prompt_tokens :]
        counts = torch.zeros_like(scores).scatter_add_(
            1, output, torch.ones_like(output, dtype=scores.dtype)
        )
        return scores - (self.frequency * counts + self.presence * (counts > 0))


def hf_processors(params: SamplingParams, num_prompt_tokens: int) -> list[LogitsProcessor]:
    """transformers' processors for `params`, in the order our sampler applies them."""
    out: list[LogitsProcessor] = []
    if params.logit_bias:
        out.append(SequenceBiasLogitsProcessor([[[t], b] for t, b in params.logit_bias]))
    if params.repetition_penalty != 1.0:
        out.append(RepetitionPenaltyLogitsProcessor(params.repetition_penalty))
    if params.presence_penalty or params.frequency_penalty:
        out.append(
            OpenAiPenaltyProcessor(
                num_prompt_tokens, params.presence_penalty, params.frequency_penalty
            )
        )
    return out


class PenalizedReference:
    def __init__(self, model_dir: Path):
        self.hf = HfReference(model_dir)

    def assert_matches(self, prompt: list[int], params: SamplingParams, ours: list[int]) -> bool:
        """Assert `ours` equals transformers' output up to a near-tie of its processed scores;
        True for an exact match."""
        processors = hf_processors(params, len(prompt))
        ref, scores = self.hf.greedy_processed(prompt, NEW_TOKENS, processors)
        assert len(ours) == len(ref) == NEW_TOKENS
        if ours == ref:
            return True
        d = next(i for i, (a, b) in enumerate(zip(ours, ref, strict=True)) if a != b)
        top = torch.topk(scores[d], 2)
        assert set(top.indices.tolist()) == {ours[d], ref[d]}, f"diverged at token {d}"
        margin = float(top.values[0] - top.values[1])
        assert margin < NEAR_TIE_LOGIT_MARGIN, f"diverged at token {d}, margin {margin:.2e}"
        return False


def greedy(**penalties: object) -> SamplingParams:
    return SamplingParams(
        max_tokens=NEW_TOKENS,
        temperature=0.0,
        min_tokens=NEW_TOKENS,
        **penalties,  # type: ignore[arg-type]
    )


def run_batch(core: EngineCore, work: list[tuple[list[int], SamplingParams]]) -> list[list[int]]:
    """Run every (prompt, params) concurrently; outputs in order."""
    outputs: dict[str, list[int]] = {}
    for i, (prompt, params) in enumerate(work):
        request = EngineRequest(request_id=str(i), prompt_token_ids=prompt, sampling=params)
        core.add_request(request)
        outputs[str(i)] = []
    while core.has_work():
        for out in core.step():
            outputs[out.request_id].extend(out.new_token_ids)
    return [outputs[str(i)] for i in range(len(work))]


def prompts_of(lengths: list[int], vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(n)] for n in lengths]


def penalty_cases(vocab: int, banned: int) -> dict[str, SamplingParams]:
    """Each penalty alone; the bias bans `banned` (a token greedy decoding picks) and favours
    two others."""
    bias = sorted({5: 8.0, vocab // 2: 6.5, banned: -100.0}.items())
    return {
        "presence": greedy(presence_penalty=1.5),
        "frequency": greedy(frequency_penalty=0.8),
        "negative-presence-frequency": greedy(presence_penalty=-0.5, frequency_penalty=-0.3),
        "repetition": greedy(repetition_penalty=1.6),
        "repetition-below-one": greedy(repetition_penalty=0.7),
        "logit-bias": greedy(logit_bias=tuple(bias)),
    }


def check_penalties(model_dir: Path, vocab: int, prompts: list[list[int]]) -> None:
    ref = PenalizedReference(model_dir)
    config = NativeEngineConfig(model_dir=model_dir, dtype="float32", num_kv_blocks=512)
    core = EngineCore(config)
    plain = run_batch(core, [(p, greedy()) for p in prompts])
    cases = penalty_cases(vocab, banned=plain[0][0])
    # every case's requests and unpenalized ones share one batch
    work = [(p, params) for params in cases.values() for p in prompts]
    work += [(p, greedy()) for p in prompts]
    outputs = run_batch(core, work)
    assert outputs[-len(prompts) :] == plain  # penalized neighbours change nothing
    for i, name in enumerate(cases):
        params = cases[name]
        ours = outputs[i * len(prompts) : (i + 1) * len(prompts)]
        exact = [ref.assert_matches(p, params, o) for p, o in zip(prompts, ours, strict=True)]
        assert sum(exact) >= len(exact) - 1, name
        assert ours != plain, f"{name} changed no output: the test shows nothing"
    assert core.pool.get_num_active_blocks() == 0


def test_tiny_llama_penalties_match_transformers(tiny_llama_dir: Path) -> None:
    check_penalties(tiny_llama_dir, 512, prompts_of([3, 17, 40, 90], 512, seed=11))


def test_tiny_qwen2_penalties_match_transformers(tiny_qwen2_dir: Path) -> None:
    check_penalties(tiny_qwen2_dir, 512, prompts_of([6, 33, 64], 512, seed=12))


@pytest.mark.slow
@pytest.mark.timeout(1800)  # 12 transformers generations of the 135M model on a shared CPU
def test_default_model_penalties_match_transformers(default_model_dir: Path) -> None:
    check_penalties(default_model_dir, 49152, prompts_of([9, 70], 49152, seed=13))
