"""LoRA in a batched forward pass: the rows of one step grouped by adapter.

A step's rows may run with different adapters (or none). Per layer and targeted projection,
each adapter's rows take one pair of small matmuls, and the result is added into the base
projection's output columns for those rows only:

    out[rows] += B(A(x[rows])) * scaling        (PEFT's arithmetic, in its order)

over the engine's fused projections (q/k/v as one, gate/up as one): A stacked, B
block-diagonal, so one pair of matmuls serves a fused projection (the zero blocks add exact
zeros). Rows of no adapter are left as the base model computed them. The groups are built
once per step and shared by every layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from armature.model.lora import LoraWeights

__all__ = ["LoraBatch", "LoraGroup", "add_lora", "group_lora_rows"]


@dataclass(frozen=True)
class LoraGroup:
    weights: LoraWeights
    rows: torch.Tensor | None  # [n] row indices; None: every row of the step


@dataclass(frozen=True)
class LoraBatch:
    groups: list[LoraGroup]


def group_lora_rows(
    row_adapters: Sequence[LoraWeights | None], device: torch.device
) -> LoraBatch | None:
    """The groups of a step whose row `i` runs with `row_adapters[i]` (None: the base model);
    None when no row has an adapter."""
    rows_of: dict[int, list[int]] = {}
    weights_of: dict[int, LoraWeights] = {}
    for row, weights in enumerate(row_adapters):
        if weights is not None:
            rows_of.setdefault(id(weights), []).append(row)
            weights_of[id(weights)] = weights
    if not rows_of:
        return None
    groups = []
    for key, rows in rows_of.items():
        every_row = len(rows) == len(row_adapters)
        index = None if every_row else torch.tensor(rows, dtype=torch.long, device=device)
        groups.append(LoraGroup(weights_of[key], index))
    return LoraBatch(groups)


def add_lora(
    out: torch.Tensor, x: torch.Tensor, layer: int, projection: str, lora: LoraBatch
) -> None:
    """Add each group's LoRA update of layer `layer`'s fused `projection` (qkv, o, gate_up,
    down: see `armature.model.lora.PROJECTIONS`) into its output `out` [rows, features] in
    place; `x` [rows, in_features] is the projection's input."""
    for group in lora.groups:
        module = group.weights.fused[layer].get(projection)
        if module is None:
            continue
        selected = x if group.rows is None else x.index_select(0, group.rows)
        delta = F.linear(F.linear(selected, module.a), module.b) * group.weights.scaling
        if group.rows is None:
            out += delta
        else:
            out.index_add_(0, group.rows, delta)
