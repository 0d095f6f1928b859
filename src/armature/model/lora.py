"""LoRA adapters in PEFT's layout, read and checked against the base model they adapt.

A directory holds `adapter_config.json` (r, lora_alpha, target_modules, use_rslora) and
`adapter_model.safetensors`, whose tensors are named as PEFT saves them:

    base_model.model.model.layers.{i}.self_attn.{q,k,v,o}_proj.lora_{A,B}.weight
    base_model.model.model.layers.{i}.mlp.{gate,up,down}_proj.lora_{A,B}.weight

A is [r, in_features] and B is [out_features, r]; a targeted projection's output gains
`B(A(x)) * scaling` with scaling = lora_alpha / r (lora_alpha / sqrt(r) with rslora), as
PEFT computes it. Anything else (DoRA, biases, other modules, per-module ranks) is refused
with a `LoraError` naming it: serving it without its effect would be silently wrong.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import xxhash
from safetensors import SafetensorError, safe_open

from armature.model.arch import ModelArch
from armature.model.lora_names import LoraError

__all__ = [
    "LORA_CONFIG_FILE",
    "LORA_MODULES",
    "LORA_WEIGHTS_FILE",
    "PROJECTIONS",
    "LoraError",
    "LoraModule",
    "LoraWeights",
    "load_lora",
    "lora_module_shapes",
]

LORA_CONFIG_FILE = "adapter_config.json"
# the largest |lora_alpha / r| taken: real adapters' are below 100; far above it, the delta
# swamps the model's activations (and past float32's range, becomes inf and NaN)
MAX_SCALING = 1e6
LORA_WEIGHTS_FILE = "adapter_model.safetensors"
# the projections of a Llama-family layer an adapter may target, with their sublayer
LORA_MODULES = {
    "q_proj": "self_attn",
    "k_proj": "self_attn",
    "v_proj": "self_attn",
    "o_proj": "self_attn",
    "gate_proj": "mlp",
    "up_proj": "mlp",
    "down_proj": "mlp",
}
# the engine's fused projections (model/weights.py), each with the modules whose outputs it
# concatenates, in order
PROJECTIONS = {
    "qkv": ("q_proj", "k_proj", "v_proj"),
    "o": ("o_proj",),
    "gate_up": ("gate_proj", "up_proj"),
    "down": ("down_proj",),
}
_KEY = re.compile(
    r"base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])\.weight"
)
# PEFT features that change the output in ways these weights alone do not carry
_REFUSED_FIELDS = (
    "use_dora",
    "lora_bias",
    "modules_to_save",
    "rank_pattern",
    "alpha_pattern",
    "fan_in_fan_out",
    "use_qalora",
    "alora_invocation_tokens",
    "trainable_token_indices",
    "layer_replication",
    "target_parameters",
)


@dataclass(frozen=True)
class LoraModule:
    """One targeted projection of one layer."""

    a: torch.Tensor  # [rank, in_features]
    b: torch.Tensor  # [out_features, rank]


@dataclass(frozen=True)
class LoraWeights:
    """A loaded adapter: per layer, its targeted projections by name (q_proj...), and the same
    weights fused per engine projection (`PROJECTIONS`: qkv, o, gate_up, down): A stacked,
    B block-diagonal over the fused outputs (zero rows for a module not targeted), so that one
    pair of matmuls updates a fused projection."""

    rank: int
    scaling: float
    layers: list[dict[str, LoraModule]]
    digest: str  # of its config and weights files: equal digests, equal adapters
    fused: list[dict[str, LoraModule]]


def lora_module_shapes(arch: ModelArch) -> dict[str, tuple[int, int]]:
    """(out_features, in_features) of each projection an adapter may target."""
    hidden, inter = arch.hidden_size, arch.intermediate_size
    q_dim, kv_dim = arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
    return {
        "q_proj": (q_dim, hidden),
        "k_proj": (kv_dim, hidden),
        "v_proj": (kv_dim, hidden),
        "o_proj": (hidden, q_dim),
        "gate_proj": (inter, hidden),
        "up_proj": (inter, hidden),
        "down_proj": (hidden, inter),
    }


def _read_config(path: Path) -> dict[str, Any]:
    config_file = path / LORA_CONFIG_FILE
    if not path.is_dir():
        raise LoraError(f"{path} is not a directory")
    if not config_file.is_file() or not (path / LORA_WEIGHTS_FILE).is_file():
        raise LoraError(f"{path} needs {LORA_CONFIG_FILE} and {LORA_WEIGHTS_FILE} (PEFT layout)")
    try:
        config = json.loads(config_file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LoraError(f"{config_file} is not readable JSON: {exc}") from None
    if not isinstance(config, dict):
        raise LoraError(f"{config_file} must hold a JSON object")
    return config


def _check_config(
    config: dict[str, Any], num_layers: int, where: Path
) -> tuple[int, float, list[set[str]]]:
    """(rank, scaling, target modules per layer) of a PEFT LoRA config for a model of
    `num_layers` layers; LoraError for anything else."""
    if config.get("peft_type", "LORA") != "LORA":
        raise LoraError(f"{where}: peft_type {config.get('peft_type')!r} is not LORA")
    for name in _REFUSED_FIELDS:
        if config.get(name):
            raise LoraError(f"{where}: {name} is not supported")
    if config.get("bias", "none") != "none":
        raise LoraError(f"{where}: bias {config['bias']!r} is not supported (only 'none')")
    rank, alpha = config.get("r"), config.get("lora_alpha")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise LoraError(f"{where}: r must be a positive integer, got {rank!r}")
    if not isinstance(alpha, int | float) or isinstance(alpha, bool):
        raise LoraError(f"{where}: lora_alpha must be a number, got {alpha!r}")
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    # JSON's NaN and Infinity read as floats; a scaling past float32's range turns every
    # logit of the adapter's requests into NaN
    if not abs(scaling) <= MAX_SCALING:
        raise LoraError(
            f"{where}: lora_alpha {alpha!r} gives a scaling of {scaling!r}; it must be finite "
            f"and at most {MAX_SCALING:g} in size"
        )
    return rank, scaling, _target_modules(config.get("target_modules"), num_layers, where)


def _target_modules(targets: Any, num_layers: int, where: Path) -> list[set[str]]:
    """The modules targeted in each of the model's layers."""
    if targets == "all-linear":
        return [set(LORA_MODULES) for _ in range(num_layers)]
    if isinstance(targets, str):  # PEFT: a regex that must match a module's full name
        try:
            pattern = re.compile(targets)
        except re.error as exc:
            raise LoraError(f"{where}: target_modules {targets!r} is not a regex: {exc}") from None
        # matched layer by layer: the name holds the layer, which a regex may select
        per_layer = [
            {
                m
                for m, sub in LORA_MODULES.items()
                if pattern.fullmatch(f"model.layers.{i}.{sub}.{m}")
            }
            for i in range(num_layers)
        ]
        if not any(per_layer):
            raise LoraError(f"{where}: target_modules {targets!r} matches no module of the model")
        return per_layer
    if not isinstance(targets, list) or not targets or not all(isinstance(t, str) for t in targets):
        raise LoraError(f"{where}: target_modules must be a non-empty list or a regex")
    # PEFT: an entry names the modules whose name ends with it (`q_proj`, or a full name
    # such as `model.layers.1.mlp.up_proj`, as PEFT writes `all-linear` out for some models)
    names = {t.rsplit(".", 1)[-1] for t in targets}
    unknown = [t for t in targets if t.rsplit(".", 1)[-1] not in LORA_MODULES]
    if unknown:
        raise LoraError(
            f"{where}: target module {unknown[0]!r} is not in the model (targets: "
            f"{', '.join(LORA_MODULES)})"
        )
    return [names for _ in range(num_layers)]


def _read_tensors(file: Path) -> dict[str, torch.Tensor]:
    try:
        with safe_open(str(file), framework="pt") as f:
            return {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118
    except (OSError, SafetensorError) as exc:
        raise LoraError(f"{file} is not a readable safetensors file: {exc}") from None


def load_lora(path: Path, arch: ModelArch, dtype: torch.dtype, device: torch.device) -> LoraWeights:
    """The adapter in `path`, checked against `arch` (every tensor's shape, the rank, the
    targets), on `device` in `dtype`. LoraError (one line) for a directory that cannot be
    served."""
    config = _read_config(path)
    rank, scaling, targets = _check_config(config, arch.num_layers, path)
    shapes = lora_module_shapes(arch)
    raw = _read_tensors(path / LORA_WEIGHTS_FILE)
    layers: list[dict[str, dict[str, torch.Tensor]]] = [{} for _ in range(arch.num_layers)]
    for key, tensor in raw.items():
        match = _KEY.fullmatch(key)
        if match is None:
            raise LoraError(f"{path}: tensor {key!r} is not a LoRA weight of a target module")
        layer, sublayer, module, which = int(match[1]), match[2], match[3], match[4]
        if layer >= arch.num_layers:
            raise LoraError(
                f"{path}: tensor {key!r} names layer {layer}; the model has {arch.num_layers}"
            )
        if LORA_MODULES.get(module) != sublayer or module not in targets[layer]:
            raise LoraError(f"{path}: tensor {key!r} is for a module the config does not target")
        out_features, in_features = shapes[module]
        want = (rank, in_features) if which == "A" else (out_features, rank)
        if tuple(tensor.shape) != want:
            raise LoraError(
                f"{path}: {key} has shape {list(tensor.shape)}, expected {list(want)} "
                f"(r={rank}, the model's {module} is {in_features} -> {out_features})"
            )
        served = tensor.to(device=device, dtype=dtype)
        # NaN or inf in a delta makes every logit of the adapter's requests NaN (every token
        # <|endoftext|>); finite values can also overflow in float16
        if not torch.isfinite(served).all():
            cast = f" once cast to {dtype}" if torch.isfinite(tensor).all() else ""
            raise LoraError(f"{path}: {key} has non-finite values{cast}")
        layers[layer].setdefault(module, {})[which] = served
    if not any(layers):
        raise LoraError(f"{path}: {LORA_WEIGHTS_FILE} holds no LoRA weights")
    modules: list[dict[str, LoraModule]] = []
    for i, found in enumerate(layers):
        for module, pair in found.items():
            if set(pair) != {"A", "B"}:
                raise LoraError(f"{path}: layer {i} {module} lacks lora_A or lora_B")
        modules.append(
            {m: LoraModule(p["A"].contiguous(), p["B"].contiguous()) for m, p in found.items()}
        )
    fused = [_fuse(layer, shapes) for layer in modules]
    return LoraWeights(rank, scaling, modules, _digest(path), fused)


def _fuse(
    modules: dict[str, LoraModule], shapes: dict[str, tuple[int, int]]
) -> dict[str, LoraModule]:
    """One layer's modules fused per engine projection (see `LoraWeights`)."""
    fused = {}
    for projection, names in PROJECTIONS.items():
        present = [n for n in names if n in modules]
        if not present:
            continue
        if len(names) == 1:
            fused[projection] = modules[names[0]]
            continue
        first = modules[present[0]]
        a = torch.cat([modules[n].a for n in present])
        b = first.b.new_zeros(sum(shapes[n][0] for n in names), a.shape[0])
        row, col = 0, 0
        for name in names:
            out_features = shapes[name][0]
            if name in modules:
                rank = modules[name].a.shape[0]
                b[row : row + out_features, col : col + rank] = modules[name].b
                col += rank
            row += out_features
        fused[projection] = LoraModule(a.contiguous(), b)
    return fused


def _digest(path: Path) -> str:
    """16 hex digits over the config and weights files' bytes."""
    digest = xxhash.xxh3_64()
    for name in (LORA_CONFIG_FILE, LORA_WEIGHTS_FILE):
        with open(path / name, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()
