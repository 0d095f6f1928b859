"""Where a request's prompt is encoded: a short one on the event loop (a hop to a thread
would cost as much as the encoding), a long one on a thread (it would hold the loop up);
the ids are the same either way."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from frontend_fakes import ScriptedEngine

from armature.config import RouterConfig
from armature.frontend.compose import compose_frontend
from armature.frontend.jobs import INLINE_PROMPT_CHARS, ServedModel
from armature.frontend.preprocess import Preprocessor
from armature.frontend.protocol import ChatCompletionRequest, CompletionRequest

pytestmark = pytest.mark.slow  # loads the default model's tokenizer


class RecordingPreprocessor(Preprocessor):
    """Records the thread each encoding ran on."""

    threads: list[int]

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self.threads.append(threading.get_ident())
        return super().encode(text, add_special_tokens)


@pytest.fixture(scope="module")
def preprocessor(default_model_dir: Path) -> RecordingPreprocessor:
    return RecordingPreprocessor(default_model_dir)


def jobs(preprocessor: RecordingPreprocessor) -> Any:
    preprocessor.threads = []
    parts = compose_frontend(
        engines={"w0": ScriptedEngine(preprocessor)},  # type: ignore[dict-item]
        router_config=RouterConfig(),
        preprocessor=preprocessor,
        model=ServedModel("m", 4096, 0),
    )
    return parts.jobs


@pytest.mark.parametrize(
    ("prompt", "on_loop"),
    [("Say hi", True), ("word " * (INLINE_PROMPT_CHARS // 5), True), ("word " * 200, False)],
)
async def test_a_completion_prompt_is_encoded_on_the_loop_only_when_short(
    preprocessor: RecordingPreprocessor, prompt: str, on_loop: bool
) -> None:
    job = await jobs(preprocessor).completion_job(CompletionRequest(model="m", prompt=prompt))
    assert job.engine_request.prompt_token_ids == preprocessor.encode(prompt)
    assert (preprocessor.threads[0] == threading.get_ident()) is on_loop


@pytest.mark.parametrize(("content", "on_loop"), [("Hi there", True), ("word " * 200, False)])
async def test_a_chat_is_encoded_on_the_loop_only_when_short(
    preprocessor: RecordingPreprocessor, content: str, on_loop: bool
) -> None:
    messages = [{"role": "user", "content": content}]
    body = ChatCompletionRequest(model="m", messages=messages)  # type: ignore[arg-type]
    job = await jobs(preprocessor).chat_job(body)
    assert job.engine_request.prompt_token_ids == preprocessor.encode_chat(messages)
    assert (preprocessor.threads[0] == threading.get_ident()) is on_loop
