"""One request's output pipeline: engine token stream -> detokenizer (stop strings) -> text
deltas, with latency metrics. Leaving early (stop string, disconnect) closes the engine stream,
which aborts the request and frees its KV blocks."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

from armature.engines.api import EngineDeadError
from armature.errors import ArmatureError, InvalidRequestError
from armature.frontend.detokenizer import IncrementalDetokenizer
from armature.frontend.errors import error_body
from armature.frontend.metrics import FrontendMetrics
from armature.protocols.engine import EngineOutput, FinishReason, TokenLogprob
from armature.router.policies import RoutingError

__all__ = ["Delta", "GenerationError", "Usage", "delta_batches", "total_usage"]


class GenerationError(ArmatureError, RuntimeError):
    """The engine failed this request after it was accepted; with `param`, because of that
    field of the request (a guide it could not follow: a 400), else its own failure."""

    def __init__(
        self, message: str, param: str | None = None, *, is_invalid_request: bool = False
    ) -> None:
        super().__init__(message)
        self.param = param
        # the request's fault without a field to name (a worker refused it after the
        # frontend's own checks: an adapter unloaded meanwhile)
        self.is_invalid_request = is_invalid_request or param is not None

    @property
    def status_code(self) -> int:
        return 400 if self.is_invalid_request else 500

    def body(self) -> dict[str, dict[str, str | None]]:
        """OpenAI's error object: the request's (invalid_request_error, naming `param` when
        one is at fault) or the engine's (internal_error)."""
        if not self.is_invalid_request:
            return error_body(str(self), "internal_error")
        code = "invalid_value" if self.param is not None else "invalid_request"
        return error_body(str(self), "invalid_request_error", self.param, code)


@dataclass(slots=True)
class Delta:
    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprob]
    finish_reason: str | None = None
    # the first delta of a request that asked for them: prompt tokens 1..'s logprobs
    prompt_logprobs: list[TokenLogprob] | None = None


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int | None = None  # counted when a reasoning parser reads the output

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }
        if self.reasoning_tokens is not None:
            out["completion_tokens_details"] = {"reasoning_tokens": self.reasoning_tokens}
        return out


def total_usage(usages: list[Usage]) -> Usage:
    """The usage of several sequences for one prompt (n > 1, best_of): the prompt once (the
    first sequence's, cached tokens included), the completion and reasoning tokens of all of
    them."""
    first = usages[0]
    reasoning = [u.reasoning_tokens for u in usages if u.reasoning_tokens is not None]
    return Usage(
        prompt_tokens=first.prompt_tokens,
        completion_tokens=sum(u.completion_tokens for u in usages),
        cached_tokens=first.cached_tokens,
        reasoning_tokens=sum(reasoning) if reasoning else None,
    )


@dataclass
class _Clock:
    started_s: float
    first_token_s: float | None = None
    last_token_s: float | None = None
    num_tokens: int = 0
    latencies_s: list[float] = field(default_factory=list)

    def judge(self, metrics: FrontendMetrics) -> None:
        """Judge the finished request against the SLO targets: its TTFT and mean ITL (the
        gaps after the first token over their count)."""
        first_s, last_s = self.first_token_s, self.last_token_s
        ttft_s = None if first_s is None else first_s - self.started_s
        mean_itl_s = None
        if first_s is not None and last_s is not None and self.num_tokens > 1:
            mean_itl_s = (last_s - first_s) / (self.num_tokens - 1)
        metrics.judge(ttft_s, mean_itl_s)


async def delta_batches(
    stream: AsyncGenerator[EngineOutput, None],
    num_prompt_tokens: int,
    detokenizer: IncrementalDetokenizer,
    usage: Usage,
    metrics: FrontendMetrics,
    per_token: bool = True,
    started_s: float | None = None,
) -> AsyncGenerator[list[Delta], None]:
    """The text deltas of an engine stream, a list per engine output, until the request
    finishes (its delta is the last); fills `usage` as tokens arrive. With `per_token`, an
    output carrying several tokens (steps the consumer fell behind on, merged) gives one
    delta per token, else one delta. Its TTFT and latency count from `started_s`
    (perf_counter; None: now). Closing this generator closes `stream` (which cancels the
    request)."""
    clock = _Clock(time.perf_counter() if started_s is None else started_s)
    usage.prompt_tokens = num_prompt_tokens
    try:
        async for output in stream:
            if output.finish_reason is FinishReason.ERROR:
                message = output.error or "the engine failed this request"
                raise GenerationError(message, output.error_param)
            _observe(output.num_prompt_tokens, output.num_cached_tokens, usage, metrics)
            now_s = time.perf_counter()
            if output.new_token_ids:
                num = len(output.new_token_ids)
                if clock.last_token_s is None:
                    metrics.ttft_s.observe(now_s - clock.started_s)
                    clock.first_token_s = now_s
                else:  # tokens that arrive together share the interval
                    metrics.itl_s.observe((now_s - clock.last_token_s) / num, num)
                clock.last_token_s = now_s
                clock.num_tokens += num
            deltas = _split(output, detokenizer, per_token)
            # tokens past a stop string (an output that merged several steps) are not returned
            num_returned = sum(len(d.token_ids) for d in deltas)
            usage.completion_tokens += num_returned
            if num_returned:
                metrics.output_tokens.inc(num_returned)
            finished = deltas[-1].finish_reason is not None
            if finished:  # judged before the caller may stop reading
                clock.judge(metrics)
            yield deltas
            if finished:
                return
    except RoutingError as exc:  # every worker it could go to left after its admission
        raise EngineDeadError(f"no worker can serve it now: {exc}") from None
    except InvalidRequestError as exc:  # a worker refused what the frontend's checks passed
        raise GenerationError(str(exc), exc.param, is_invalid_request=True) from None
    finally:
        await stream.aclose()
        metrics.e2e_s.observe(time.perf_counter() - clock.started_s)
        if clock.num_tokens:  # a stream that failed before its first token sized nothing
            metrics.request_output_tokens.observe(clock.num_tokens)


def _split(
    output: EngineOutput, detokenizer: IncrementalDetokenizer, per_token: bool
) -> list[Delta]:
    """The deltas of one engine output (at least one), through `detokenizer`; the last one
    ends the request if the output (or a stop string) does. Tokens after a stop string give
    no delta."""
    tokens, logprobs = output.new_token_ids, output.logprobs or []
    if per_token and len(tokens) > 1:
        texts, stop = detokenizer.update_each(tokens)
        deltas = [
            Delta(text, [token], logprobs[i : i + 1])
            for i, (text, token) in enumerate(zip(texts, tokens, strict=False))
        ]
    else:
        update = detokenizer.update(tokens)
        stop = update.stop_reason
        deltas = [Delta(update.text_delta, tokens, logprobs)]
    deltas[0].prompt_logprobs = output.prompt_logprobs
    last = deltas[-1]
    if stop is not None:
        last.finish_reason = "stop"
    elif output.finish_reason is not None:
        last.text += detokenizer.flush()
        last.finish_reason = output.finish_reason.value
    return deltas


def _observe(num_prompt: int, num_cached: int, usage: Usage, metrics: FrontendMetrics) -> None:
    if num_prompt:
        usage.cached_tokens = num_cached
        metrics.observe_prompt(num_prompt, num_cached)
