"""Arbitrary Unicode text, lone UTF-16 surrogates included, in every text field the
generation endpoints read: the server answers 200 or a 4xx, never a 5xx, and logs no
traceback (`running_server` checks its stderr when it stops). A text holding a lone surrogate
is always a 400 in OpenAI's error format.

The bodies are raw JSON written with ensure_ascii: a Python str holding a surrogate cannot be
encoded as UTF-8, but JSON can escape it (`"\\ud800"`), which is how a client sends one."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from serve_process import running_server

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SERVED = "unicode-model"
MAX_TOKENS = 2
LONE_SURROGATE = re.compile("[\ud800-\udfff]")

# Any code point, surrogates too: hypothesis's characters() leaves category Cs out.
CHARACTERS = st.one_of(st.characters(), st.integers(0xD800, 0xDFFF).map(chr))
TEXTS = st.text(CHARACTERS, max_size=40)


@pytest.fixture(scope="module")
def server(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    args = ["--engine", "mocker", "--speedup-ratio", "100", "--served-model-name", SERVED]
    args += ["--max-model-len", "2048", "--num-kv-blocks", "1024"]
    with running_server(default_model_dir, tmp_path_factory.mktemp("unicode"), args) as url:
        yield url


def completion(text: str, where: str) -> dict[str, Any]:
    body: dict[str, Any] = {"model": SERVED, "prompt": "Hi", "max_tokens": MAX_TOKENS}
    if where == "prompt":
        body["prompt"] = text
    elif where == "prompt list":
        body["prompt"] = [text]
    else:
        body["stop"] = [text]
    return body


def chat(text: str, where: str) -> dict[str, Any]:
    content: Any = text if where == "content" else [{"type": "text", "text": text}]
    messages = [{"role": "user", "content": content}]
    return {"model": SERVED, "messages": messages, "max_tokens": MAX_TOKENS}


BODIES = st.one_of(
    st.tuples(
        st.just("/v1/completions"), TEXTS, st.sampled_from(["prompt", "prompt list", "stop"])
    ).map(lambda t: (t[0], t[1], completion(t[1], t[2]))),
    st.tuples(
        st.just("/v1/chat/completions"), TEXTS, st.sampled_from(["content", "content part"])
    ).map(lambda t: (t[0], t[1], chat(t[1], t[2]))),
)


@pytest.mark.timeout(300)
def test_any_unicode_text_is_answered_200_or_4xx(server: str) -> None:
    answered: list[int] = []
    with httpx.Client(base_url=server, timeout=30) as client:

        @settings(
            max_examples=50,
            derandomize=True,  # the same examples on every run
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow],
        )
        @given(case=BODIES)
        def post(case: tuple[str, str, dict[str, Any]]) -> None:
            path, text, body = case
            raw = json.dumps(body, ensure_ascii=True)  # "\ud800" stays an escape
            response = client.post(path, content=raw, headers={"content-type": "application/json"})
            answered.append(response.status_code)
            assert response.status_code == 200 or 400 <= response.status_code < 500, (
                raw,
                response.text,
            )
            # a high then a low surrogate, escaped side by side, are one valid pair in JSON
            if LONE_SURROGATE.search(json.loads(json.dumps(text))):
                assert response.status_code == 400, (raw, response.text)
                error = response.json()["error"]
                assert error["type"] == "invalid_request_error"
                assert "lone UTF-16 surrogate" in error["message"]

        post()
    assert 200 in answered and 400 in answered, answered  # both kinds were exercised
    alive = {"model": SERVED, "prompt": "still alive?", "max_tokens": MAX_TOKENS}
    assert httpx.post(f"{server}/v1/completions", json=alive, timeout=30).status_code == 200
