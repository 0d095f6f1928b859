"""A step's outputs: what the model's result does to the requests whose sequences it completed.

Each such request gets its token (sampled from the logits, the guided rows masked first, or
the runner's own pick: the mocker), appends it and is checked for its end: EOS, a stop token
id, `max_tokens`, the context length, or its grammar (failed or complete). A remote prefill
that would go on ends with TRANSFER and a KV handle instead. `EngineCore.step` calls these once
a step, with its own `finish` (end a request) and `pin_prompt` (keep its prompt's blocks for a
decode worker); the decode fast path (`decode_run`) must have the same effects.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from armature.engines.native.request import RequestState
from armature.engines.native.runner_api import RunnerOutput
from armature.engines.native.scheduler import ScheduledChunk, SchedulerOutput
from armature.protocols.engine import EngineOutput, FinishReason, TokenLogprob
from armature.protocols.kv_transfer import KvHandle

if TYPE_CHECKING:
    import torch

    from armature.engines.native.grammar import PendingMasks

__all__ = ["fail_batch", "sample_and_finish"]


def sample_and_finish(
    completing: list[ScheduledChunk],
    result: RunnerOutput,
    masks: PendingMasks | None,
    *,
    eos_token_ids: tuple[int, ...],
    max_model_len: int,
    finish: Callable[[RequestState, FinishReason], None],
    pin_prompt: Callable[[RequestState], KvHandle],
) -> list[EngineOutput]:
    """Append each `completing` request's token from `result` (advancing its grammar), end
    those that are done (`finish`), and return one output each, in order."""
    tokens: list[int]
    logprobs: list[TokenLogprob | None]
    computes_logprobs = not isinstance(result, list)
    if isinstance(result, list):  # the runner chose the tokens (the mocker)
        assert masks is None, "a runner that picks tokens takes no guided requests"
        tokens, logprobs = result, [None] * len(result)
    else:
        tokens, logprobs = _sample(completing, result, masks, eos_token_ids)
    outputs: list[EngineOutput] = []
    for chunk, token, logprob in zip(completing, tokens, logprobs, strict=True):
        req: RequestState = chunk.request
        first = req.num_output_tokens == req.num_output_at_start
        # given once, with the first output (a runner that picks tokens computes none)
        prompt_logprobs, req.prompt_logprobs = req.prompt_logprobs, None
        req.token_ids.append(token)
        reason, error = _finish_reason(req, token, eos_token_ids, max_model_len), None
        error_param = None
        if req.grammar is not None and req.grammar.error is not None:
            # computing this step's mask failed: the matcher then allows only EOS, and the
            # EOS drawn is no end of a match (it read as a clean stop, output unmatched)
            reason, error, error_param = FinishReason.ERROR, req.grammar.error, req.grammar.param
        elif req.grammar is not None and reason is None:
            req.grammar.accept(token)
            error = req.grammar.error
            if error is not None:  # the guide's: past the library's limits
                reason, error_param = FinishReason.ERROR, req.grammar.param
            elif req.grammar.is_complete:
                reason = FinishReason.STOP
        handle = None
        if reason is None and req.remote_prefill:  # a decode worker continues it
            handle = pin_prompt(req)
            reason = FinishReason.TRANSFER
        if reason is not None:
            finish(req, reason)
        outputs.append(
            EngineOutput(
                request_id=req.request_id,
                new_token_ids=[token],
                logprobs=[logprob] if logprob is not None else None,
                prompt_logprobs=prompt_logprobs if computes_logprobs else None,
                finish_reason=reason,
                num_prompt_tokens=req.num_prompt_tokens if first else 0,
                num_cached_tokens=req.num_cached_tokens if first else 0,
                error=None if error is None else f"structured output failed: {error}",
                kv_handle=handle,
                error_param=error_param,
            )
        )
    return outputs


def _sample(
    completing: list[ScheduledChunk],
    logits: torch.Tensor,
    masks: PendingMasks | None,
    eos_token_ids: tuple[int, ...],
) -> tuple[list[int], list[TokenLogprob | None]]:
    # the sampler is torch's: loaded with the first logits, so the mocker never loads it
    from armature.engines.native.sampler import SampleInput, sample, seeded_for

    if masks is not None:
        masks.apply(logits)
    inputs: list[SampleInput] = []
    for chunk in completing:
        req: RequestState = chunk.request
        if req.sampling_seed is not None:
            req.generator = seeded_for(req.generator, req.sampling_seed, req.num_output_tokens)
        blocked = _blocked_token_ids(req, eos_token_ids)
        inputs.append(
            SampleInput(
                req.sampling,
                req.generator,
                req.num_output_tokens,
                blocked,
                req.token_ids,
                req.num_prompt_tokens,
            )
        )
    return sample(logits, inputs)


def _blocked_token_ids(req: RequestState, eos_token_ids: tuple[int, ...]) -> tuple[int, ...]:
    """The tokens `req` may not draw yet: EOS and its stop ids before `min_tokens` (a guided
    request's grammar alone decides where it may end)."""
    p = req.sampling
    if req.num_output_tokens < p.min_tokens and req.grammar is None:
        return p.stop_token_ids + (() if p.ignore_eos else eos_token_ids)
    return ()


def _finish_reason(
    req: RequestState, token: int, eos_token_ids: tuple[int, ...], max_model_len: int
) -> FinishReason | None:
    p = req.sampling
    if not p.ignore_eos and token in eos_token_ids:
        return FinishReason.STOP
    if token in p.stop_token_ids:
        return FinishReason.STOP
    if req.num_output_tokens >= p.max_tokens + req.num_output_at_start:
        return FinishReason.LENGTH
    if req.num_tokens >= max_model_len:
        return FinishReason.LENGTH
    return None


def fail_batch(
    scheduled: SchedulerOutput,
    exc: Exception,
    finish: Callable[[RequestState, FinishReason], None],
) -> list[EngineOutput]:
    """End every request of a batch whose model run raised `exc` with ERROR (`finish`); their
    outputs carry no token and say why."""
    outputs = []
    for chunk in scheduled.chunks:
        req = chunk.request
        finish(req, FinishReason.ERROR)
        outputs.append(
            EngineOutput(
                request_id=req.request_id,
                new_token_ids=[],
                finish_reason=FinishReason.ERROR,
                error=str(exc),
            )
        )
    return outputs
