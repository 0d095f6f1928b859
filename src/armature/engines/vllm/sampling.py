"""Our EngineRequest -> the arguments of one vLLM request. Pure: no vLLM import, so the mapping
is unit-tested without vLLM installed; the engine turns `VllmSampling` into vLLM's
`SamplingParams(**asdict(...))`.

Every field of our SamplingParams has a one-to-one vLLM field:

    ours            vLLM            note
    max_tokens      max_tokens
    temperature     temperature     0 = greedy in both
    top_p           top_p
    top_k           top_k           0 = disabled in both
    min_p           min_p           0 = disabled in both
    seed            seed
    min_tokens      min_tokens      minus the output tokens a resumed request carries
    ignore_eos      ignore_eos
    stop_token_ids  stop_token_ids
    logprobs        logprobs        at most the engine's max_logprobs (vLLM refuses more)
    prompt_logprobs prompt_logprobs the same bound
    presence_penalty    presence_penalty
    frequency_penalty   frequency_penalty
    repetition_penalty  repetition_penalty
    logit_bias      logit_bias      pairs -> {token id: bias}; None when empty
    guide           structured_outputs  StructuredOutputsParams' fields (VllmStructuredOutputs):
                    json_schema -> json, json_object -> json_object, regex -> regex,
                    choice -> choice, lark -> grammar (vLLM's auto backend hands Lark to
                    guidance, llguidance as ours); any whitespace off, as in ours

What vLLM cannot do through this adapter is refused with InvalidRequestError (a 4xx at the
frontend): more logprobs than the engine was started with. Disaggregated legs (a remote
prefill, a KV handle) are the engine's business: it adds `extra_args` for vLLM's connector.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from armature.engines.api import InvalidRequestError
from armature.protocols.engine import EngineRequest
from armature.protocols.guide import (
    ChoiceGuide,
    Guide,
    JsonObjectGuide,
    JsonSchemaGuide,
    LarkGuide,
    RegexGuide,
)

__all__ = [
    "VllmPrompt",
    "VllmSampling",
    "VllmStructuredOutputs",
    "to_vllm_prompt",
    "to_vllm_sampling",
    "to_vllm_structured_outputs",
]


@dataclass(frozen=True)
class VllmStructuredOutputs:
    """Keyword arguments of vLLM's StructuredOutputsParams (names are vLLM's): one of the
    first five is set."""

    json: str | None = None
    json_object: bool | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    # JSON as ours writes it: no free whitespace (a small model could pad forever)
    disable_any_whitespace: bool = True


@dataclass(frozen=True)
class VllmSampling:
    """Keyword arguments of vLLM's SamplingParams, field for field (names are vLLM's)."""

    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    min_tokens: int
    ignore_eos: bool
    stop_token_ids: list[int]
    logprobs: int | None
    prompt_logprobs: int | None = None
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    # we detokenize in the frontend; vLLM sends only the new tokens of each step
    detokenize: bool = False
    skip_special_tokens: bool = False
    extra_args: dict[str, Any] | None = None  # {"kv_transfer_params": ...} for disaggregation
    structured_outputs: VllmStructuredOutputs | None = None


@dataclass(frozen=True)
class VllmPrompt:
    """What vLLM computes: the prompt plus any output a resumed request already carries."""

    token_ids: list[int]
    num_prompt_tokens: int  # the caller's prompt only (usage counts these)


def to_vllm_sampling(request: EngineRequest, max_logprobs: int) -> VllmSampling:
    """The vLLM sampling arguments of `request`; InvalidRequestError for what vLLM lacks."""
    p = request.sampling
    if p.logprobs is not None and p.logprobs > max_logprobs:
        raise InvalidRequestError(
            f"at most {max_logprobs} logprobs per token with the vllm engine, got {p.logprobs}"
        )
    if p.prompt_logprobs is not None and p.prompt_logprobs > max_logprobs:
        raise InvalidRequestError(
            f"at most {max_logprobs} logprobs per prompt token with the vllm engine, got "
            f"{p.prompt_logprobs}"
        )
    if p.top_k < 0:
        raise InvalidRequestError(f"top_k must be at least 0 (0 disables it), got {p.top_k}")
    num_carried = len(request.output_token_ids)
    return VllmSampling(
        max_tokens=p.max_tokens,
        temperature=p.temperature,
        top_p=p.top_p,
        top_k=p.top_k,
        seed=p.seed,
        min_tokens=max(0, p.min_tokens - num_carried),
        min_p=p.min_p,
        ignore_eos=p.ignore_eos,
        stop_token_ids=list(p.stop_token_ids),
        logprobs=p.logprobs,
        # a resumed request gave them with its first output
        prompt_logprobs=None if num_carried else p.prompt_logprobs,
        presence_penalty=p.presence_penalty,
        frequency_penalty=p.frequency_penalty,
        repetition_penalty=p.repetition_penalty,
        logit_bias=dict(p.logit_bias) or None,
        structured_outputs=None if p.guide is None else to_vllm_structured_outputs(p.guide),
    )


def to_vllm_structured_outputs(guide: Guide) -> VllmStructuredOutputs:
    match guide:
        case JsonSchemaGuide(schema_json=schema):
            return VllmStructuredOutputs(json=schema)
        case JsonObjectGuide():
            return VllmStructuredOutputs(json_object=True)
        case RegexGuide(pattern=pattern):
            return VllmStructuredOutputs(regex=pattern)
        case ChoiceGuide(choices=choices):
            return VllmStructuredOutputs(choice=list(choices))
        case LarkGuide(grammar=grammar):
            return VllmStructuredOutputs(grammar=grammar)
    raise AssertionError(f"unknown guide {guide!r}")


def to_vllm_prompt(request: EngineRequest) -> VllmPrompt:
    """A resumed request (migration) continues after the tokens it already generated: vLLM
    sees them as part of the prompt; usage still counts only the caller's prompt."""
    return VllmPrompt(
        token_ids=list(request.prompt_token_ids) + list(request.output_token_ids),
        num_prompt_tokens=len(request.prompt_token_ids),
    )
