"""The weights' fingerprint: the same for the same weights wherever they lie, another for a
checkpoint whose tensors changed under the same names and shapes, and a one-line error for a
weights file it cannot read."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from armature.errors import ConfigError
from armature.model.fingerprint import weights_fingerprint


def copy(model_dir: Path, to: Path) -> Path:
    shutil.copytree(model_dir, to)
    return to


def weights_file(model_dir: Path) -> Path:
    [path] = model_dir.glob("*.safetensors")
    return path


def test_the_same_weights_anywhere_give_one_fingerprint(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    fingerprint = weights_fingerprint(tiny_llama_dir)
    assert len(fingerprint) == 16 and int(fingerprint, 16) >= 0
    assert weights_fingerprint(copy(tiny_llama_dir, tmp_path / "elsewhere")) == fingerprint


@pytest.mark.parametrize("scale", [1.5, -1.0])
def test_a_tensor_changed_under_its_name_and_shape_changes_it(
    tiny_llama_dir: Path, tmp_path: Path, scale: float
) -> None:
    """The reported case: layer 0's k and v projections rescaled, all else alike."""
    changed = copy(tiny_llama_dir, tmp_path / "changed")
    tensors = load_file(weights_file(changed))
    for name in (
        "model.layers.0.self_attn.k_proj.weight",
        "model.layers.0.self_attn.v_proj.weight",
    ):
        tensors[name] = tensors[name] * scale
    save_file(tensors, weights_file(changed), metadata={"format": "pt"})
    assert weights_fingerprint(changed) != weights_fingerprint(tiny_llama_dir)


def test_a_one_element_change_at_a_tensors_end_changes_it(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    changed = copy(tiny_llama_dir, tmp_path / "changed")
    tensors = load_file(weights_file(changed))
    name = "lm_head.weight"
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[-1] += 1.0
    save_file(tensors, weights_file(changed), metadata={"format": "pt"})
    assert weights_fingerprint(changed) != weights_fingerprint(tiny_llama_dir)


def test_a_config_change_changes_it(tiny_llama_dir: Path, tmp_path: Path) -> None:
    changed = copy(tiny_llama_dir, tmp_path / "changed")
    config = changed / "config.json"
    config.write_text(config.read_text().replace('"rms_norm_eps"', '"rms_norm_eps_"'))
    assert weights_fingerprint(changed) != weights_fingerprint(tiny_llama_dir)


def test_an_unreadable_weights_file_is_one_line(tiny_llama_dir: Path, tmp_path: Path) -> None:
    broken = copy(tiny_llama_dir, tmp_path / "broken")
    weights_file(broken).write_bytes(b"\xff" * 16)
    with pytest.raises(ConfigError, match=r"^cannot read the weights file .*: a header of"):
        weights_fingerprint(broken)
    weights_file(broken).write_bytes((4).to_bytes(8, "little") + b"[1] ")
    with pytest.raises(ConfigError, match=r"^cannot read the weights file"):
        weights_fingerprint(broken)


def test_torch_is_the_weights_not_the_file_layout(tiny_llama_dir: Path) -> None:
    """The premise of sampling: the fixture's tensors are larger than three samples."""
    tensors = load_file(weights_file(tiny_llama_dir))
    largest = max(t.numel() * t.element_size() for t in tensors.values())
    assert largest > 3 * 4096 and all(t.dtype == torch.float32 for t in tensors.values())
