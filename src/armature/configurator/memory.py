"""The memory-fit rule: what one worker of `tp` GPUs holds, per GPU.

    weights / tp + activations(max_num_batched_tokens) + reserved + KV(batch)
        <= capacity * memory_utilization

    activations(T) = T * (4*h + 2*(hq + 2*hkv)/tp + 3*I_active/tp) * activation bytes
                     + max_num_seqs * vocab / tp * 4           (the step's float32 logits)

`I_active` is a dense layer's intermediate size, or a MoE layer's k experts and shared
experts together. KV(batch) is max_num_seqs requests of the workload's longest request
(prompt and output), `kv_bytes_per_token_per_gpu` each: the KV heads are split over the
ranks (replicated when there are fewer heads than ranks).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from armature.configurator.model_spec import ModelSpec
from armature.configurator.systems import SystemSpec

__all__ = ["MemoryFit", "get_kv_bytes_per_token_per_gpu", "get_memory_fit"]


@dataclass(frozen=True)
class MemoryFit:
    """One GPU of a worker, in bytes."""

    usable_bytes: float  # capacity * memory_utilization
    weight_bytes: float
    activation_bytes: float
    reserved_bytes: float
    kv_bytes_per_token: int  # this GPU's share of a token's KV
    batch_kv_bytes: float  # what the batch's KV needs

    @property
    def kv_capacity_bytes(self) -> float:
        """What is left for the KV cache (negative: the weights alone do not fit)."""
        return self.usable_bytes - self.weight_bytes - self.activation_bytes - self.reserved_bytes

    @property
    def kv_capacity_tokens(self) -> int:
        return max(0, int(self.kv_capacity_bytes // self.kv_bytes_per_token))

    @property
    def fits(self) -> bool:
        return self.batch_kv_bytes <= self.kv_capacity_bytes


def get_kv_bytes_per_token_per_gpu(model: ModelSpec, tp: int) -> int:
    kv_heads = math.ceil(model.num_kv_heads / tp)
    return model.num_layers * 2 * kv_heads * model.head_dim * model.dtype_bytes


def _activation_bytes(
    model: ModelSpec, tp: int, max_num_batched_tokens: int, max_num_seqs: int
) -> float:
    h = model.hidden_size
    if model.is_moe:
        inner = model.num_experts_per_token * model.expert_intermediate_size
        inner += model.shared_intermediate_size
        inner = max(inner, model.intermediate_size if model.num_dense_layers else 0)
    else:
        inner = model.intermediate_size
    width = 4 * h + 2 * (model.q_size + 2 * model.kv_size) / tp + 3 * inner / tp
    act = 4 if model.dtype == "float32" else 2
    return max_num_batched_tokens * width * act + max_num_seqs * model.vocab_size / tp * 4


def get_memory_fit(
    model: ModelSpec,
    system: SystemSpec,
    tp: int,
    *,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    request_tokens: int,
) -> MemoryFit:
    """The fit of a worker of `tp` GPUs running `max_num_seqs` requests of at most
    `request_tokens` tokens each (prompt and output)."""
    per_token = get_kv_bytes_per_token_per_gpu(model, tp)
    return MemoryFit(
        usable_bytes=system.memory_capacity_bytes.value * system.memory_utilization.value,
        weight_bytes=model.get_weight_bytes() / tp,
        activation_bytes=_activation_bytes(model, tp, max_num_batched_tokens, max_num_seqs),
        reserved_bytes=system.reserved_bytes.value,
        kv_bytes_per_token=per_token,
        batch_kv_bytes=float(max_num_seqs * request_tokens * per_token),
    )
