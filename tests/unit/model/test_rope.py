"""RoPE tables: an unscaled RoPE is read from config.json without transformers, with the same
inverse frequencies as transformers' own reading; every other kind goes to transformers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from armature.model.rope import _default_rope, _inv_freq, _inv_freq_from_transformers


@pytest.mark.parametrize("fixture", ["default_model_dir", "tiny_llama_dir", "tiny_qwen2_dir"])
def test_unscaled_rope_from_config_json_equals_transformers(
    fixture: str, request: pytest.FixtureRequest
) -> None:
    model_dir: Path = request.getfixturevalue(fixture)
    assert _default_rope(model_dir) is not None  # read without transformers
    ours, scaling = _inv_freq(model_dir)
    theirs, their_scaling = _inv_freq_from_transformers(model_dir)
    assert torch.equal(ours, theirs) and scaling == their_scaling == 1.0


def test_scaled_rope_goes_to_transformers(tiny_llama3_rope_dir: Path) -> None:
    assert _default_rope(tiny_llama3_rope_dir) is None
    ours, scaling = _inv_freq(tiny_llama3_rope_dir)
    theirs, their_scaling = _inv_freq_from_transformers(tiny_llama3_rope_dir)
    assert torch.equal(ours, theirs) and scaling == their_scaling


def _with_config(tmp_path: Path, **fields: object) -> Path:
    config = {"hidden_size": 64, "num_attention_heads": 4, **fields}
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"rope_theta": 10000.0}, (10000.0, 16)),
        ({"rope_theta": 500000, "head_dim": 32}, (500000.0, 32)),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}, (1e6, 16)),
        ({"rope_theta": 1e4, "rope_scaling": {"type": "linear", "factor": 2.0}}, None),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}}, None),
        ({"rope_theta": 1e4, "partial_rotary_factor": 0.5}, None),
        ({}, None),  # the base is the model class's default: transformers knows it
        ({"rope_parameters": {"full_attention": {"rope_theta": 1e4}}}, None),
    ],
)
def test_what_is_read_without_transformers(
    tmp_path: Path, fields: dict[str, object], expected: tuple[float, int] | None
) -> None:
    assert _default_rope(_with_config(tmp_path, **fields)) == expected
