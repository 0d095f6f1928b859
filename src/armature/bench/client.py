"""One streamed request to an OpenAI-compatible server, timed: when it was sent, when each
chunk with text arrived, the token counts (the server's usage when it reports one), and what
went wrong, if anything. Works against any server that streams SSE like OpenAI's."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import msgspec

from armature.bench.http import HttpError, HttpPool, Response

__all__ = ["BenchRequest", "RequestRecord", "count_chunk_tokens", "send"]


class _Delta(msgspec.Struct):
    content: str | None = None


class _Choice(msgspec.Struct):
    text: str | None = None  # completions
    delta: _Delta | None = None  # chat


class _Usage(msgspec.Struct):
    prompt_tokens: int = 0
    completion_tokens: int = 0


class _Event(msgspec.Struct):
    """The parts of a streamed chunk the bench reads; everything else is skipped unparsed."""

    choices: list[_Choice] = []
    usage: _Usage | None = None
    error: Any = None


_decoder = msgspec.json.Decoder(_Event)


@dataclass(frozen=True)
class BenchRequest:
    prompt: str
    max_tokens: int
    arrival_s: float = 0.0  # offset from the start, for open-loop and trace schedules
    num_prompt_tokens: int = 0  # as synthesized (0: unknown)
    history: tuple[tuple[str, str], ...] = ()  # earlier (user, assistant) turns to resend
    followups: tuple[str, ...] = ()  # a multi-turn session: the next user turns, in order


@dataclass
class RequestRecord:
    sent_s: float
    chunk_times_s: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)  # tokens per chunk (by tokenizer)
    chunk_texts: list[str] = field(default_factory=list)
    done_s: float = 0.0
    prompt_tokens: int = 0
    output_tokens: int = 0
    error: str | None = None  # error type, e.g. "http_429", "timeout", "malformed_sse"
    error_detail: str = ""
    text: str = ""  # the response text (a multi-turn session resends it)

    @property
    def ttft_s(self) -> float | None:
        return self.chunk_times_s[0] - self.sent_s if self.chunk_times_s else None

    @property
    def e2e_s(self) -> float:
        return self.done_s - self.sent_s

    def itl_s(self) -> list[float]:
        """Gaps between chunks, spread over the tokens each chunk carried."""
        gaps = []
        for i in range(1, len(self.chunk_times_s)):
            n = max(1, self.chunk_tokens[i]) if i < len(self.chunk_tokens) else 1
            gap = self.chunk_times_s[i] - self.chunk_times_s[i - 1]
            gaps.extend([gap / n] * n)
        return gaps


def _body(endpoint: str, model: str, request: BenchRequest, ignore_eos: bool) -> dict[str, object]:
    body: dict[str, object] = {
        "model": model,
        "max_tokens": request.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0,
    }
    if ignore_eos:
        body["ignore_eos"] = True
    if endpoint == "chat":
        messages = []
        for user, assistant in request.history:
            messages += [
                {"role": "user", "content": user},
                {"role": "assistant", "content": assistant},
            ]
        body["messages"] = [*messages, {"role": "user", "content": request.prompt}]
    else:
        body["prompt"] = "".join(u + a for u, a in request.history) + request.prompt
    return body


def _chunk_text(event: _Event, endpoint: str) -> str:
    if not event.choices:
        return ""
    choice = event.choices[0]
    if endpoint == "chat":
        return (choice.delta.content or "") if choice.delta is not None else ""
    return choice.text or ""


async def send(
    pool: HttpPool,
    endpoint: str,
    model: str,
    request: BenchRequest,
    *,
    ignore_eos: bool,
) -> RequestRecord:
    """Stream one request; never raises for server or network trouble (see `error`)."""
    path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
    body = msgspec.json.encode(_body(endpoint, model, request, ignore_eos))
    record = RequestRecord(sent_s=time.perf_counter())
    response: Response | None = None
    try:
        async with asyncio.timeout(pool.read_timeout_s):
            response = await pool.post(path, body)
            await _read_stream(response, endpoint, record)
    except (msgspec.DecodeError, ValueError, TypeError) as exc:
        record.error = "malformed_sse"
        record.error_detail = str(exc)[:300]
    except TimeoutError:
        record.error = "timeout"
    except HttpError as exc:
        record.error = "connection"
        record.error_detail = str(exc)[:300]
    finally:
        record.done_s = time.perf_counter()
        if not record.prompt_tokens:
            record.prompt_tokens = request.num_prompt_tokens
        if response is not None:
            response.release()
    return record


async def _read_stream(response: Response, endpoint: str, record: RequestRecord) -> None:
    if response.status != 200:
        text = (await response.read()).decode(errors="replace")
        record.error = f"http_{response.status}"
        record.error_detail = text[:300]
        return
    saw_done = False
    pending = b""
    async for raw in response.iter_raw():
        now = time.perf_counter()
        pending += raw
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                saw_done = True
                continue
            event = _decoder.decode(data)
            if event.error is not None:
                record.error = "stream_error"
                record.error_detail = str(event.error)[:300]
                return
            if event.usage is not None:
                record.prompt_tokens = event.usage.prompt_tokens
                record.output_tokens = event.usage.completion_tokens
            text = _chunk_text(event, endpoint)
            if text:
                record.text += text
                record.chunk_times_s.append(now)
                record.chunk_texts.append(text)
    if not saw_done:
        record.error = "truncated_stream"
        record.error_detail = "the stream ended without [DONE]"


def count_chunk_tokens(records: list[RequestRecord], count_tokens: Any) -> None:
    """After a run: tokens per chunk by the tokenizer (one batch call per request, outside the
    timed loop); the output count falls back to their sum where the server gave no usage."""
    for record in records:
        if record.chunk_texts:
            record.chunk_tokens = [max(1, n) for n in count_tokens(record.chunk_texts)]
        if not record.output_tokens:
            record.output_tokens = sum(record.chunk_tokens)
