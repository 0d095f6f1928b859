"""The operator model: how long one engine step takes on one tensor-parallel rank, composed
from the model's operators, each timed by the roofline.

    time(op) = max(flops / (peak * efficiency), bytes / (bandwidth * memory_efficiency))

A step of `t` new prefill tokens (one prompt, from its start or after c' cached tokens) and
`b` decoding requests over
`c` context tokens together runs, per layer, on T = t + b tokens:

    qkv        2*T*h*(hq + 2*hkv)/tp FLOPs; weights h*(hq + 2*hkv)/tp; in T*h, out T*(hq+2hkv)/tp
    o          2*T*hq*h/tp;               weights hq*h/tp;         in T*hq/tp, out T*h
    mlp        2*T*3*h*I/tp (gate, up, down); weights 3*h*I/tp;   in T*h, mid 3*T*I/tp, out T*h
               MoE: each token's k experts; the weights of the experts the batch touches
    attention  prefill 2*t^2*hq/tp (causal), reads q, k, v and writes o: t*(2*hq/tp + 2*kvr);
               after c cached tokens also 4*t*c*hq/tp, reading their cache c*2*kvr
               decode 4*c*hq/tp, reads the cache c*2*kvr and q, o: b*2*hq/tp
    all-reduce two per layer (tp > 1) of T*h activations: ring 2*(tp-1)/tp * bytes / link
               + 2*(tp-1) hops of latency

then the LM head on the rows that need logits (b, and one per prefill), and the step's fixed
overhead. `kvr` is a rank's KV width: ceil(kv_heads / tp) * head_dim (KV heads are
replicated when there are fewer than ranks). Weights are in the model's dtype, activations in
16 bits (32 for float32), the KV cache in the model's dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from armature.configurator.model_spec import ModelSpec
from armature.configurator.systems import SystemSpec

__all__ = [
    "OperatorCost",
    "StepBreakdown",
    "get_all_reduce_s",
    "get_kv_transfer_s",
    "get_layer_gemms",
    "get_step_breakdown",
]


@dataclass(frozen=True)
class OperatorCost:
    """One operator's work on one rank."""

    flops: float
    num_bytes: float


@dataclass(frozen=True)
class StepBreakdown:
    """One step's time on one rank, by part, in seconds."""

    gemm_s: float  # every layer's projections and MLP, and the LM head
    attention_s: float
    all_reduce_s: float
    overhead_s: float

    @property
    def total_s(self) -> float:
        return self.gemm_s + self.attention_s + self.all_reduce_s + self.overhead_s


def _activation_bytes(model: ModelSpec) -> int:
    return 4 if model.dtype == "float32" else 2


def _roofline_s(op: OperatorCost, flops_per_s: float, bytes_per_s: float) -> float:
    return max(op.flops / flops_per_s, op.num_bytes / bytes_per_s)


def _kv_width_per_rank(model: ModelSpec, tp: int) -> int:
    return math.ceil(model.num_kv_heads / tp) * model.head_dim


def _mlp(model: ModelSpec, num_tokens: int, tp: int, *, moe: bool) -> OperatorCost:
    h, w, a = model.hidden_size, model.dtype_bytes, _activation_bytes(model)
    if not moe:
        inner = model.intermediate_size / tp
        flops = 2 * num_tokens * 3 * h * inner
        return OperatorCost(flops, 3 * h * inner * w + num_tokens * (2 * h + 3 * inner) * a)
    experts, k = model.num_experts, model.num_experts_per_token
    inner = model.expert_intermediate_size / tp
    shared = model.shared_intermediate_size / tp
    # the experts a batch of T tokens touches, each token choosing k of E at random
    touched = experts * (1 - (1 - k / experts) ** num_tokens)
    flops = 2 * num_tokens * (3 * h * (k * inner + shared) + h * experts)
    weights = (touched * 3 * h * inner + 3 * h * shared + h * experts) * w
    return OperatorCost(flops, weights + num_tokens * (2 * h + 3 * (k * inner + shared)) * a)


def get_layer_gemms(
    model: ModelSpec, num_tokens: int, tp: int, *, moe: bool = False
) -> dict[str, OperatorCost]:
    """One layer's GEMMs on `num_tokens` tokens on one of `tp` ranks (a MoE layer's MLP with
    `moe`)."""
    h, w, a = model.hidden_size, model.dtype_bytes, _activation_bytes(model)
    qkv_out = (model.q_size + 2 * model.kv_size) / tp
    q_in = model.q_size / tp
    return {
        "qkv": OperatorCost(
            2 * num_tokens * h * qkv_out, h * qkv_out * w + num_tokens * (h + qkv_out) * a
        ),
        "o": OperatorCost(2 * num_tokens * q_in * h, q_in * h * w + num_tokens * (q_in + h) * a),
        "mlp": _mlp(model, num_tokens, tp, moe=moe),
    }


def get_attention(
    model: ModelSpec,
    num_prefill_tokens: int,
    num_decode_requests: int,
    num_kv_tokens: int,
    tp: int,
    num_prefill_context_tokens: int = 0,
) -> tuple[OperatorCost, OperatorCost]:
    """(prefill, decode) attention of one layer on one rank; the prefill's prompt may start
    after `num_prefill_context_tokens` cached ones, which its tokens attend over too."""
    a, kv = _activation_bytes(model), model.dtype_bytes
    q_width, kv_width = model.q_size / tp, _kv_width_per_rank(model, tp)
    t, c = num_prefill_tokens, num_prefill_context_tokens
    prefill = OperatorCost(
        2 * t * t * q_width + 4 * t * c * q_width,
        t * (2 * q_width + 2 * kv_width) * a + c * 2 * kv_width * kv,
    )
    decode = OperatorCost(
        4 * num_kv_tokens * q_width,
        num_kv_tokens * 2 * kv_width * kv + num_decode_requests * 2 * q_width * a,
    )
    return prefill, decode


def get_all_reduce_s(system: SystemSpec, message_bytes: float, tp: int) -> float:
    """A ring all-reduce of `message_bytes` over `tp` ranks of one node."""
    if tp <= 1:
        return 0.0
    link = system.intra_node_bandwidth_bytes_s.value * system.link_efficiency.value
    hops = 2 * (tp - 1)
    return hops / tp * message_bytes / link + hops * system.link_latency_s.value


def get_kv_transfer_s(num_bytes: float, bandwidth_bytes_s: float, efficiency: float) -> float:
    """Moving `num_bytes` of KV cache over a link of `bandwidth_bytes_s` at `efficiency`."""
    return num_bytes / (bandwidth_bytes_s * efficiency)


def _lm_head(model: ModelSpec, num_rows: int, tp: int) -> OperatorCost:
    h, vocab = model.hidden_size, model.vocab_size / tp
    flops = 2 * num_rows * h * vocab
    return OperatorCost(
        flops, h * vocab * model.dtype_bytes + num_rows * (h * _activation_bytes(model) + vocab * 4)
    )


def get_step_breakdown(
    model: ModelSpec,
    system: SystemSpec,
    tp: int,
    *,
    num_prefill_tokens: int,
    num_decode_requests: int,
    num_kv_tokens: int,
    num_prefill_context_tokens: int = 0,
) -> StepBreakdown:
    """One step's time on one of `tp` ranks (the module docstring's composition)."""
    peak = system.get_peak_flops(model.dtype)
    gemm_flops_s = peak * system.gemm_efficiency.value
    attention_flops_s = peak * system.attention_efficiency.value
    bytes_s = system.memory_bandwidth_bytes_s.value * system.memory_efficiency.value
    num_tokens = num_prefill_tokens + num_decode_requests
    gemm_s = 0.0
    for moe, num_layers in (
        (False, model.num_layers - model.num_moe_layers),
        (True, model.num_moe_layers),
    ):
        if num_layers:
            layer = get_layer_gemms(model, num_tokens, tp, moe=moe)
            gemm_s += num_layers * sum(
                _roofline_s(op, gemm_flops_s, bytes_s) for op in layer.values()
            )
    num_rows = num_decode_requests + (1 if num_prefill_tokens else 0)
    gemm_s += _roofline_s(_lm_head(model, num_rows, tp), gemm_flops_s, bytes_s)
    prefill, decode = get_attention(
        model,
        num_prefill_tokens,
        num_decode_requests,
        num_kv_tokens,
        tp,
        num_prefill_context_tokens,
    )
    attention_s = model.num_layers * (
        (_roofline_s(prefill, attention_flops_s, bytes_s) if num_prefill_tokens else 0.0)
        + (_roofline_s(decode, attention_flops_s, bytes_s) if num_decode_requests else 0.0)
    )
    message = num_tokens * model.hidden_size * _activation_bytes(model)
    all_reduce_s = 2 * model.num_layers * get_all_reduce_s(system, message, tp)
    return StepBreakdown(gemm_s, attention_s, all_reduce_s, system.step_overhead_s.value)
