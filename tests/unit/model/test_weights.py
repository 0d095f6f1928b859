"""Loading a checkpoint's weights: a file that cannot be read, or that lacks a tensor the
model needs, is a one-line ConfigError naming it (tracebacks before)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from armature.errors import ConfigError
from armature.model.arch import read_arch
from armature.model.weights import load_weights


def copy_of(model_dir: Path, tmp_path: Path) -> tuple[Path, Path]:
    copy = tmp_path / "m"
    shutil.copytree(model_dir, copy)
    return copy, next(copy.glob("*.safetensors"))


def load(model_dir: Path) -> None:
    load_weights(model_dir, read_arch(model_dir), torch.float32, torch.device("cpu"))


def test_the_tiny_model_loads(tiny_llama_dir: Path) -> None:
    load(tiny_llama_dir)


def test_a_truncated_file_is_a_config_error(tiny_llama_dir: Path, tmp_path: Path) -> None:
    model_dir, weights = copy_of(tiny_llama_dir, tmp_path)
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(ConfigError, match=f"cannot read the weights in {weights}: "):
        load(model_dir)


def test_a_missing_tensor_is_a_config_error(tiny_llama_dir: Path, tmp_path: Path) -> None:
    model_dir, weights = copy_of(tiny_llama_dir, tmp_path)
    tensors = load_file(weights)
    del tensors["model.norm.weight"]
    save_file(tensors, weights)
    with pytest.raises(ConfigError) as caught:
        load(model_dir)
    assert str(caught.value) == f"the checkpoint in {model_dir} lacks tensor 'model.norm.weight'"
