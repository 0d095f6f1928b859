"""A stream's last write comes before its engine stream is closed: the client gets the last
token, its finish reason, the usage and [DONE] without waiting for the teardown (the
router's bookkeeping, a remote worker's Cancel)."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import pytest
from frontend_fakes import IdleEngine
from tokenizers import Tokenizer

from armature.frontend.detokenizer import IncrementalDetokenizer
from armature.frontend.jobs import Candidate, Job
from armature.frontend.metrics import FrontendMetrics
from armature.frontend.service import OpenAIService
from armature.protocols.engine import EngineOutput, EngineRequest, FinishReason, SamplingParams

pytestmark = pytest.mark.slow  # loads the default model's tokenizer

HELLO_IDS = [19556, 905, 17, 1073, 359, 346, 47]  # 'Hello' ' world' '!' ' How' ' are' ' you' '?'


class Router:
    def __init__(self, log: list[str]):
        self.log = log

    async def generate(self, request: EngineRequest, *_: Any) -> AsyncGenerator[EngineOutput]:
        try:
            for i, tokens in enumerate((HELLO_IDS[:3], HELLO_IDS[3:])):
                last = i == 1
                yield EngineOutput(
                    request_id=request.request_id,
                    new_token_ids=tokens,
                    finish_reason=FinishReason.LENGTH if last else None,
                    num_prompt_tokens=3 if i == 0 else 0,
                )
        finally:
            self.log.append("engine stream closed")


@pytest.mark.parametrize("include_usage", [False, True])
async def test_the_last_write_comes_before_the_engine_stream_closes(
    default_model_dir: Path, include_usage: bool
) -> None:
    tokenizer = Tokenizer.from_file(str(default_model_dir / "tokenizer.json"))
    log: list[str] = []
    service = OpenAIService(Router(log), None, FrontendMetrics("m", IdleEngine().get_load))  # type: ignore[arg-type]
    request = EngineRequest(
        request_id="r", prompt_token_ids=[1, 2, 3], sampling=SamplingParams(max_tokens=7)
    )
    candidate = Candidate(request, IncrementalDetokenizer(tokenizer, [1, 2, 3]))
    job = Job("completion", "cmpl-r", [candidate], True, include_usage, False, model_name="m")
    chunks = []
    async for chunk in service.stream(job):
        chunks.append(chunk)
        log.append(f"chunk {len(chunks)}")
    assert log == ["chunk 1", "chunk 2", "engine stream closed"]
    assert chunks[-1].endswith(b"data: [DONE]\n\n")
    assert b'"text":" you","logprobs":null,"finish_reason":null' in chunks[-1]
    assert b'"finish_reason":"length"' in chunks[-1]
    assert (b'"completion_tokens":7' in chunks[-1]) is include_usage
