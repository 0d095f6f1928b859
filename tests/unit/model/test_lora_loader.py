"""Reading PEFT adapters: what loads (rank, scaling, targets) and every refusal, each one line
naming the problem (missing files, rank or shape mismatch, a target the model lacks, a PEFT
feature not served)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from armature.model.arch import read_arch
from armature.model.lora import load_lora
from armature.model.lora_names import LoraError
from lora_adapters import make_adapter

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def adapter_dir(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_adapter(tiny_llama_dir, tmp_path_factory.mktemp("lora") / "a", seed=5)


def _copy(adapter_dir: Path, tmp_path: Path) -> Path:
    out = tmp_path / "copy"
    shutil.copytree(adapter_dir, out)
    return out


def _edit_config(path: Path, **changes: object) -> None:
    config_file = path / "adapter_config.json"
    config = json.loads(config_file.read_text())
    config.update(changes)
    config_file.write_text(json.dumps(config))


def _load(path: Path, model_dir: Path) -> object:
    return load_lora(path, read_arch(model_dir), torch.float32, CPU)


def test_loads_rank_scaling_and_targets(adapter_dir: Path, tiny_llama_dir: Path) -> None:
    weights = load_lora(adapter_dir, read_arch(tiny_llama_dir), torch.float32, CPU)
    assert (weights.rank, weights.scaling) == (4, 8 / 4)
    assert [sorted(layer) for layer in weights.layers] == [["down_proj", "q_proj", "v_proj"]] * 2
    q = weights.layers[0]["q_proj"]
    assert (q.a.shape, q.b.shape) == ((4, 64), (64, 4))
    assert weights.layers[1]["down_proj"].a.shape == (4, 128)  # intermediate -> hidden
    assert torch.count_nonzero(q.b) > 0
    assert len(weights.digest) == 16
    # fused per engine projection: q and v (k not targeted) stacked, B block-diagonal
    qkv, v = weights.fused[0]["qkv"], weights.layers[0]["v_proj"]
    assert torch.equal(qkv.a, torch.cat([q.a, v.a]))
    assert qkv.b.shape == (64 + 32 + 32, 8)
    assert torch.equal(qkv.b[:64, :4], q.b) and torch.equal(qkv.b[96:, 4:], v.b)
    assert not qkv.b[64:96].any() and not qkv.b[:64, 4:].any() and not qkv.b[96:, :4].any()
    assert sorted(weights.fused[0]) == ["down", "qkv"]
    assert weights.fused[0]["down"] is weights.layers[0]["down_proj"]


def test_rslora_scales_by_the_root_of_the_rank(tiny_llama_dir: Path, tmp_path: Path) -> None:
    path = make_adapter(tiny_llama_dir, tmp_path / "r", seed=6, rank=8, alpha=16, rslora=True)
    weights = load_lora(path, read_arch(tiny_llama_dir), torch.float32, CPU)
    assert weights.scaling == 16 / math.sqrt(8)


@pytest.mark.parametrize("missing", ["adapter_config.json", "adapter_model.safetensors"])
def test_missing_file(
    adapter_dir: Path, tiny_llama_dir: Path, tmp_path: Path, missing: str
) -> None:
    path = _copy(adapter_dir, tmp_path)
    (path / missing).unlink()
    with pytest.raises(LoraError, match=r"needs adapter_config\.json and adapter_model\."):
        _load(path, tiny_llama_dir)


def test_not_a_directory(tiny_llama_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(LoraError, match="is not a directory"):
        _load(tmp_path / "nowhere", tiny_llama_dir)


def test_rank_mismatch(adapter_dir: Path, tiny_llama_dir: Path, tmp_path: Path) -> None:
    path = _copy(adapter_dir, tmp_path)
    _edit_config(path, r=8)
    with pytest.raises(LoraError, match=r"lora_A.weight has shape \[4, \d+\], expected \[8, \d+\]"):
        _load(path, tiny_llama_dir)


def test_shape_mismatch_with_the_model(
    adapter_dir: Path, tiny_llama_dir: Path, tmp_path: Path
) -> None:
    path = _copy(adapter_dir, tmp_path)
    tensors = load_file(path / "adapter_model.safetensors")
    key = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"
    tensors[key] = torch.zeros(32, 4)
    save_file(tensors, path / "adapter_model.safetensors")
    with pytest.raises(
        LoraError, match=r"q_proj.lora_B.weight has shape \[32, 4\], expected \[64, 4\]"
    ):
        _load(path, tiny_llama_dir)


def test_target_module_not_in_the_model(
    adapter_dir: Path, tiny_llama_dir: Path, tmp_path: Path
) -> None:
    path = _copy(adapter_dir, tmp_path)
    _edit_config(path, target_modules=["q_proj", "lm_head"])
    with pytest.raises(LoraError, match="target module 'lm_head' is not in the model"):
        _load(path, tiny_llama_dir)


def test_weights_for_a_module_not_targeted(
    adapter_dir: Path, tiny_llama_dir: Path, tmp_path: Path
) -> None:
    path = _copy(adapter_dir, tmp_path)
    _edit_config(path, target_modules=["q_proj", "v_proj"])
    with pytest.raises(LoraError, match=r"down_proj\.lora_A\.weight' is for a module the config"):
        _load(path, tiny_llama_dir)


def test_a_without_b(adapter_dir: Path, tiny_llama_dir: Path, tmp_path: Path) -> None:
    path = _copy(adapter_dir, tmp_path)
    tensors = load_file(path / "adapter_model.safetensors")
    del tensors["base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"]
    save_file(tensors, path / "adapter_model.safetensors")
    with pytest.raises(LoraError, match="layer 1 v_proj lacks lora_A or lora_B"):
        _load(path, tiny_llama_dir)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("use_dora", True, "use_dora is not supported"),
        ("bias", "all", "bias 'all' is not supported"),
        ("rank_pattern", {"q_proj": 8}, "rank_pattern is not supported"),
        ("peft_type", "IA3", "peft_type 'IA3' is not LORA"),
        ("r", 0, "r must be a positive integer"),
        # JSON's NaN and Infinity, and a scaling that makes every logit NaN
        ("lora_alpha", math.nan, r"lora_alpha nan gives a scaling of nan; it must be finite"),
        ("lora_alpha", math.inf, r"lora_alpha inf gives a scaling of inf"),
        ("lora_alpha", 1e308, r"scaling of 2\.5e\+307; it must be finite and at most 1e\+06"),
        ("target_modules", "(q_proj", r"target_modules '\(q_proj' is not a regex: missing \)"),
        # a regex naming a layer the model (of two) lacks
        (
            "target_modules",
            "model.layers.2.self_attn.q_proj",
            r"target_modules 'model\.layers\.2\.self_attn\.q_proj' matches no module of the model",
        ),
    ],
)
def test_refused_config(
    adapter_dir: Path, tiny_llama_dir: Path, tmp_path: Path, field: str, value: object, message: str
) -> None:
    path = _copy(adapter_dir, tmp_path)
    _edit_config(path, **{field: value})
    with pytest.raises(LoraError, match=message):
        _load(path, tiny_llama_dir)


def test_unreadable_weights(adapter_dir: Path, tiny_llama_dir: Path, tmp_path: Path) -> None:
    path = _copy(adapter_dir, tmp_path)
    (path / "adapter_model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(LoraError, match="is not a readable safetensors file"):
        _load(path, tiny_llama_dir)


def test_targets_by_full_module_name(
    adapter_dir: Path, tiny_llama_dir: Path, tmp_path: Path
) -> None:
    """PEFT matches an entry against the end of a module's name (it writes `all-linear` out as
    full names for some models)."""
    path = _copy(adapter_dir, tmp_path)
    targets = ["model.layers.0.self_attn.q_proj", "model.layers.1.self_attn.q_proj"]
    _edit_config(path, target_modules=[*targets, "v_proj", "mlp.down_proj"])
    weights = _load(path, tiny_llama_dir)
    assert [sorted(layer) for layer in weights.layers] == [["down_proj", "q_proj", "v_proj"]] * 2  # type: ignore[attr-defined]


def test_regex_targets_only_the_layers_it_matches(tiny_llama_dir: Path, tmp_path: Path) -> None:
    """PEFT matches a regex against each module's full name, its layer's index included: the
    adapter adapts those modules of those layers only."""
    regex = r".*layers\.1\.self_attn\.(q|v)_proj|.*layers\.0\.mlp\.down_proj"
    path = make_adapter(tiny_llama_dir, tmp_path / "r", seed=9, targets=regex)
    weights = load_lora(path, read_arch(tiny_llama_dir), torch.float32, CPU)
    assert [sorted(layer) for layer in weights.layers] == [["down_proj"], ["q_proj", "v_proj"]]
    assert [sorted(layer) for layer in weights.fused] == [["down"], ["qkv"]]


def test_weights_for_a_layer_the_regex_does_not_match(
    adapter_dir: Path, tiny_llama_dir: Path, tmp_path: Path
) -> None:
    path = _copy(adapter_dir, tmp_path)  # q_proj, v_proj and down_proj of both layers
    _edit_config(path, target_modules=r".*layers\.0\.(self_attn\.(q|v)|mlp\.down)_proj")
    key = r"base_model\.model\.model\.layers\.1\.mlp\.down_proj\.lora_A\.weight"
    with pytest.raises(LoraError, match=rf"tensor '{key}' is for a module the config does not"):
        _load(path, tiny_llama_dir)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_weights(
    adapter_dir: Path, tiny_llama_dir: Path, tmp_path: Path, value: float
) -> None:
    """NaN or inf in a weight made every token of the adapter's requests <|endoftext|>."""
    path = _copy(adapter_dir, tmp_path)
    tensors = load_file(path / "adapter_model.safetensors")
    key = "base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"
    tensors[key][3, 1] = value
    save_file(tensors, path / "adapter_model.safetensors")
    with pytest.raises(LoraError, match=rf"/copy: {key} has non-finite values$"):
        _load(path, tiny_llama_dir)


def test_weights_past_the_range_of_the_dtype(
    adapter_dir: Path, tiny_llama_dir: Path, tmp_path: Path
) -> None:
    path = _copy(adapter_dir, tmp_path)
    tensors = load_file(path / "adapter_model.safetensors")
    key = "base_model.model.model.layers.0.mlp.down_proj.lora_A.weight"
    tensors[key][0, 0] = 1e5  # float16's largest is 65504
    save_file(tensors, path / "adapter_model.safetensors")
    load_lora(path, read_arch(tiny_llama_dir), torch.float32, CPU)
    with pytest.raises(
        LoraError, match=rf"{key} has non-finite values once cast to torch\.float16$"
    ):
        load_lora(path, read_arch(tiny_llama_dir), torch.float16, CPU)
