"""vLLM's RequestOutput (delta mode) -> our EngineOutput. Pure: the shapes vLLM hands us are
described by Protocols, so tests pass plain fakes and vLLM need not be installed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from armature.protocols.engine import EngineOutput, FinishReason, TokenLogprob

__all__ = ["PromptLogprobs", "to_engine_output", "to_finish_reason"]

# vLLM's finish reasons (vllm.v1.engine.FINISH_REASON_STRINGS). "repetition" is its
# repetition detector, which this adapter never enables; it would end the text like a stop.
_FINISH_REASONS = {
    "stop": FinishReason.STOP,
    "length": FinishReason.LENGTH,
    "abort": FinishReason.ABORT,
    "error": FinishReason.ERROR,
    "repetition": FinishReason.STOP,
}


class LogprobLike(Protocol):
    @property
    def logprob(self) -> float: ...

    @property
    def rank(self) -> int | None: ...


class CompletionLike(Protocol):
    @property
    def token_ids(self) -> Sequence[int]: ...

    @property
    def logprobs(self) -> Sequence[Mapping[int, LogprobLike]] | None: ...

    @property
    def finish_reason(self) -> str | None: ...


class RequestOutputLike(Protocol):
    @property
    def outputs(self) -> Sequence[CompletionLike]: ...

    @property
    def prompt_logprobs(self) -> Sequence[Mapping[int, LogprobLike] | None] | None: ...

    @property
    def num_cached_tokens(self) -> int | None: ...


def to_finish_reason(reason: str | None) -> FinishReason | None:
    if reason is None:
        return None
    try:
        return _FINISH_REASONS[reason]
    except KeyError:
        raise ValueError(f"unknown vLLM finish reason {reason!r}") from None


def _to_logprob(token_id: int, entries: Mapping[int, LogprobLike], num_top: int) -> TokenLogprob:
    """vLLM gives the top `num_top` tokens by rank plus the sampled one (if not among them)."""
    ranked = sorted(
        ((e.rank, t, e.logprob) for t, e in entries.items() if e.rank is not None),
        key=lambda item: item[0],
    )
    top = [(t, lp) for rank, t, lp in ranked if rank <= num_top]
    return TokenLogprob(token_id, entries[token_id].logprob, top[:num_top])


class PromptLogprobs:
    """A request's prompt logprobs as vLLM's deltas bring them (the first position's entry
    None, then one per prompt token; over one delta or several chunks), into ours: prompt
    tokens 1.. with their `num_top` alternatives."""

    def __init__(self, prompt_token_ids: Sequence[int], num_top: int):
        self.prompt_token_ids = prompt_token_ids
        self.num_top = num_top
        self.num_positions = 0  # of the prompt, the first included
        self.items: list[TokenLogprob] = []

    def add(self, entries: Sequence[Mapping[int, LogprobLike] | None] | None) -> None:
        for entry in entries or ():
            position = self.num_positions
            self.num_positions += 1
            if entry is None:  # the first token: nothing before it to predict it
                continue
            token = self.prompt_token_ids[position]
            self.items.append(_to_logprob(token, entry, self.num_top))


def to_engine_output(
    request_id: str,
    output: RequestOutputLike,
    *,
    num_logprobs: int | None,
    num_prompt_tokens: int,
    first: bool,
) -> EngineOutput:
    """One delta of one request. `first`: it is the request's first output, which carries
    the prompt and cached-token counts (later outputs carry 0, as the native engine's do)."""
    (completion,) = output.outputs  # n = 1: one completion per request
    token_ids = list(completion.token_ids)
    logprobs = None
    if num_logprobs is not None and completion.logprobs is not None:
        logprobs = [
            _to_logprob(t, entries, num_logprobs)
            for t, entries in zip(token_ids, completion.logprobs, strict=True)
        ]
    cached = min(output.num_cached_tokens or 0, num_prompt_tokens)
    return EngineOutput(
        request_id=request_id,
        new_token_ids=token_ids,
        logprobs=logprobs,
        finish_reason=to_finish_reason(completion.finish_reason),
        num_prompt_tokens=num_prompt_tokens if first else 0,
        num_cached_tokens=cached if first else 0,
    )
