"""LoRA adapters end to end: `armature serve --workers 2 --router kv --lora a1=DIR` with the
official openai client. Each worker process advertises its adapters; the frontend routes by
adapter, lists adapters in /v1/models, and loads and unloads them at runtime on every worker
(behind the API key). In float32 the output with an adapter equals transformers + PEFT."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from serve_process import running_server

from lora_adapters import make_adapter, peft_greedy, peft_model

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BASE = "smol-lora"
KEY = "lora-test-key"
NEW_TOKENS = 8
PROMPT = "The three primary colors are red, yellow and blue. The three secondary colors are"


@pytest.fixture(scope="module")
def adapters(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lora_adapters")
    return {
        "a1": make_adapter(default_model_dir, root / "a1", seed=11),
        "a2": make_adapter(
            default_model_dir, root / "a2", seed=12, rank=8, targets="all-linear", rslora=True
        ),
    }


@pytest.fixture(scope="module")
def url(
    default_model_dir: Path, adapters: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    args = [
        "--served-model-name",
        BASE,
        "--device",
        "cpu",
        "--dtype",
        "float32",
        "--num-kv-blocks",
        "256",
        "--max-model-len",
        "1024",
        "--workers",
        "2",
        "--router",
        "kv",
        "--api-key",
        KEY,
        "--lora",
        f"a1={adapters['a1']}",
    ]
    with running_server(default_model_dir, tmp_path_factory.mktemp("lora_server"), args) as url:
        yield url


@pytest.fixture
def client(url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=120.0) as c:
        yield c


@pytest.fixture
def http(url: str) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=url, timeout=120.0, headers=headers) as c:
        yield c


@pytest.fixture(scope="module")
def prompt_ids(default_model_dir: Path) -> list[int]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(default_model_dir))
    return list(tokenizer.encode(PROMPT, add_special_tokens=False))


def _complete(client: openai.OpenAI, model: str, prompt: list[int], stream: bool) -> Any:
    return client.completions.create(
        model=model,
        prompt=prompt,
        max_tokens=NEW_TOKENS,
        temperature=0,
        logprobs=0,
        stream=stream,
        extra_body={"min_tokens": NEW_TOKENS},  # EOS suppressed, as in the reference
    )


def _token_ids(default_model_dir: Path, tokens: list[str]) -> list[int]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(default_model_dir))
    return [int(tokenizer.convert_tokens_to_ids(t)) for t in tokens]


def _check_equals_peft(
    client: openai.OpenAI,
    name: str,
    adapter_dir: Path,
    prompt: list[int],
    default_model_dir: Path,
) -> str:
    """The adapter's greedy completion, whole and streamed, equals PEFT's; returns its text."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(default_model_dir))
    reference = peft_greedy(peft_model(default_model_dir, adapter_dir), prompt, NEW_TOKENS)
    whole = _complete(client, name, prompt, stream=False)
    assert whole.model == name
    assert whole.choices[0].text == tokenizer.decode(reference)
    chunks = list(_complete(client, name, prompt, stream=True))
    assert {c.model for c in chunks} == {name}
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    return str(whole.choices[0].text)


def test_models_lists_the_adapters_with_their_parent(http: httpx.Client) -> None:
    data = http.get("/v1/models").json()["data"]
    assert [(m["id"], m["parent"]) for m in data] == [(BASE, None), ("a1", BASE)]


def test_adapter_output_equals_peft_and_differs_from_base(
    client: openai.OpenAI, adapters: dict[str, Path], prompt_ids: list[int], default_model_dir: Path
) -> None:
    text = _check_equals_peft(client, "a1", adapters["a1"], prompt_ids, default_model_dir)
    base = _complete(client, BASE, prompt_ids, stream=False).choices[0].text
    assert text != base
    chat = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 6, "temperature": 0}
    whole = client.chat.completions.create(model="a1", **chat)
    assert whole.model == "a1"
    streamed = list(client.chat.completions.create(model="a1", stream=True, **chat))
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == (
        whole.choices[0].message.content
    )


def test_unknown_adapter_is_a_404_naming_the_model(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        client.completions.create(model="nope", prompt="hi", max_tokens=2)
    assert missing.value.status_code == 404
    body: Any = missing.value.body
    assert "'nope'" in body["message"] and body["code"] == "model_not_found"
    assert body["param"] == "model"


def test_adapters_load_and_unload_at_runtime(
    client: openai.OpenAI,
    http: httpx.Client,
    url: str,
    adapters: dict[str, Path],
    prompt_ids: list[int],
    default_model_dir: Path,
    tmp_path: Path,
) -> None:
    load = {"lora_name": "a2", "lora_path": str(adapters["a2"])}
    assert httpx.post(f"{url}/v1/load_lora_adapter", json=load).status_code == 401  # no key
    bad = http.post("/v1/load_lora_adapter", json={"lora_name": "a3", "lora_path": str(tmp_path)})
    assert bad.status_code == 400
    assert "needs adapter_config.json" in bad.json()["error"]["message"]
    assert bad.json()["error"]["param"] == "lora_path"
    bad = http.post("/v1/load_lora_adapter", json={"lora_name": "a b", "lora_path": str(tmp_path)})
    assert (bad.status_code, bad.json()["error"]["param"]) == (400, "lora_name")
    assert [m["id"] for m in http.get("/v1/models").json()["data"]] == [BASE, "a1"]
    loaded = http.post("/v1/load_lora_adapter", json=load)
    assert loaded.status_code == 200, loaded.text
    assert loaded.json()["id"] == "a2"
    assert http.post("/v1/load_lora_adapter", json=load).status_code == 400  # already loaded
    models = http.get("/v1/models").json()["data"]
    assert [(m["id"], m["parent"]) for m in models] == [(BASE, None), ("a1", BASE), ("a2", BASE)]
    _check_equals_peft(client, "a2", adapters["a2"], prompt_ids, default_model_dir)
    # a prompt cached under a2 is found again under a2, never under a1 or the base model
    # (salted block hashes, salted routing)
    fresh = prompt_ids[::-1]
    _complete(client, "a2", fresh, stream=False)
    repeat = _complete(client, "a2", fresh, stream=False)
    assert repeat.usage.prompt_tokens_details.cached_tokens == (len(fresh) - 1) // 16 * 16
    for model in ("a1", BASE):
        other = _complete(client, model, fresh, stream=False)
        assert other.usage.prompt_tokens_details.cached_tokens == 0
    unloaded = http.post("/v1/unload_lora_adapter", json={"lora_name": "a2"})
    assert unloaded.status_code == 200, unloaded.text
    with pytest.raises(openai.NotFoundError):
        _complete(client, "a2", prompt_ids, stream=False)
    assert http.post("/v1/unload_lora_adapter", json={"lora_name": "a2"}).status_code == 404
    assert [m["id"] for m in http.get("/v1/models").json()["data"]] == [BASE, "a1"]
