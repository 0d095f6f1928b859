"""Llama-family decoder forward over a flattened batch of sequences, on a paged KV cache.

One step's tokens are laid out flat, prefill spans first, then one token per decode sequence:

    rows: [ prefill seq A (n_A rows) | prefill seq B (n_B rows) | decode x1 | decode x2 | ... ]

Projections and MLPs run once over all rows; attention runs per prefill span (causal within
the span, over everything cached before it) and once per group of decodes, padded and masked
to the group's longest context (the runner groups decodes of similar context:
`decode_groups`).
The arithmetic mirrors Hugging Face transformers so float32 greedy output matches it.

`encode` runs the same layers over whole prompts without a KV cache (embeddings): each span
attends causally within itself, and the final-normed hidden states of every row come back.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from armature.model.arch import ModelArch
from armature.model.kv_cache import PagedKvCache
from armature.model.lora_batch import LoraBatch, add_lora
from armature.model.rope import RopeTables, apply_rope
from armature.model.weights import LayerWeights, ModelWeights

__all__ = [
    "DecodeBatch",
    "ForwardBatch",
    "PrefillSpan",
    "encode",
    "forward_hidden",
    "project_logits",
]


@dataclass(frozen=True)
class PrefillSpan:
    row_start: int
    num_tokens: int
    start_pos: int  # tokens of this sequence already in the cache before this span
    block_table: torch.Tensor  # [num_blocks covering start_pos + num_tokens]

    def causal_mask(self) -> torch.Tensor | None:
        """[num_tokens, start_pos + num_tokens] bool, or None when nothing is cached before
        the span (plain causal attention then)."""
        if self.start_pos == 0:
            return None
        total = self.start_pos + self.num_tokens
        device = self.block_table.device
        query_pos = torch.arange(self.start_pos, total, device=device)
        key_pos = torch.arange(total, device=device)
        return key_pos[None, :] <= query_pos[:, None]


@dataclass(frozen=True)
class DecodeBatch:
    """Decode rows [row_start, row_start + num_seqs), attended together."""

    row_start: int
    block_table: torch.Tensor  # [num_seqs, max_blocks], padded with any valid id
    context_lens: torch.Tensor  # [num_seqs], including the token being decoded
    max_context_len: int

    @property
    def num_seqs(self) -> int:
        return int(self.context_lens.shape[0])

    def padding_mask(self) -> torch.Tensor:
        """[num_seqs, 1, 1, max_context_len] bool: True where a key position is real."""
        key_pos = torch.arange(self.max_context_len, device=self.context_lens.device)
        return (key_pos[None, :] < self.context_lens[:, None]).view(-1, 1, 1, self.max_context_len)


@dataclass(frozen=True)
class ForwardBatch:
    input_ids: torch.Tensor  # [rows]
    positions: torch.Tensor  # [rows]
    slots: torch.Tensor  # [rows] flat cache slot of each row's K/V
    prefills: list[PrefillSpan]
    decodes: list[DecodeBatch]  # groups of decode rows, in row order (none: no decodes)
    logits_rows: torch.Tensor  # [num_outputs] rows whose next-token logits are wanted
    lora: LoraBatch | None = None  # the rows that run with LoRA adapters, by adapter


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return weight * h.to(dtype)


def _prefill_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    span: PrefillSpan,
    mask: torch.Tensor | None,
    cache: PagedKvCache | None,
    layer: int,
    scale: float,
) -> torch.Tensor:
    """q/k/v: this span's rows [n, heads, head_dim] -> output [n, heads, head_dim]."""
    n = span.num_tokens
    if mask is None:
        keys, values = k, v
    else:
        assert cache is not None, "a span that continues cached tokens needs the cache"
        total = span.start_pos + n
        keys, values = cache.gather(layer, span.block_table)
        keys, values = keys[:total], values[:total]
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0),
        keys.transpose(0, 1).unsqueeze(0),
        values.transpose(0, 1).unsqueeze(0),
        attn_mask=mask,
        is_causal=mask is None and n > 1,
        scale=scale,
        enable_gqa=True,
    )
    return out.squeeze(0).transpose(0, 1)


def _decode_attention(
    q: torch.Tensor,
    batch: DecodeBatch,
    mask: torch.Tensor,
    cache: PagedKvCache,
    layer: int,
    scale: float,
) -> torch.Tensor:
    """q: [seqs, heads, head_dim] -> [seqs, heads, head_dim]. Each KV head's query heads are
    packed as rows of one query matrix, so no K/V repeat is needed."""
    num_seqs, num_heads, head_dim = q.shape
    keys, values = cache.gather(layer, batch.block_table)  # [seqs, tokens, kv_heads, hd]
    keys = keys[:, : batch.max_context_len].transpose(1, 2)
    values = values[:, : batch.max_context_len].transpose(1, 2)
    num_kv_heads = keys.shape[1]
    packed_q = q.view(num_seqs, num_kv_heads, num_heads // num_kv_heads, head_dim)
    out = F.scaled_dot_product_attention(packed_q, keys, values, attn_mask=mask, scale=scale)
    return out.reshape(num_seqs, num_heads, head_dim)


@dataclass(frozen=True)
class _StepInputs:
    """Per-step tensors shared by every layer (computed once per forward)."""

    batch: ForwardBatch
    cos: torch.Tensor
    sin: torch.Tensor
    prefill_masks: list[torch.Tensor | None]
    decode_masks: list[torch.Tensor]  # one per decode group


def _layer(
    x: torch.Tensor,
    w: LayerWeights,
    layer: int,
    step: _StepInputs,
    arch: ModelArch,
    cache: PagedKvCache | None,
) -> torch.Tensor:
    """One decoder layer over every row; with no `cache` (encode) nothing is written and no
    span may attend to tokens before it."""
    rows = x.shape[0]
    nh, nkv, hd = arch.num_heads, arch.num_kv_heads, arch.head_dim
    h = _rms_norm(x, w.input_norm, arch.rms_norm_eps)
    qkv = F.linear(h, w.qkv, w.qkv_bias)
    lora = step.batch.lora
    if lora is not None:
        add_lora(qkv, h, layer, "qkv", lora)
    q, k, v = qkv.split([nh * hd, nkv * hd, nkv * hd], dim=-1)
    q = apply_rope(q.view(rows, nh, hd), step.cos, step.sin)
    k = apply_rope(k.view(rows, nkv, hd), step.cos, step.sin)
    v = v.view(rows, nkv, hd)
    batch = step.batch
    if cache is not None:
        cache.write(layer, batch.slots, k, v)
    scale = hd**-0.5
    attn = torch.empty_like(q)
    for span, mask in zip(batch.prefills, step.prefill_masks, strict=True):
        r = slice(span.row_start, span.row_start + span.num_tokens)
        attn[r] = _prefill_attention(q[r], k[r], v[r], span, mask, cache, layer, scale)
    for group, mask in zip(batch.decodes, step.decode_masks, strict=True):
        assert cache is not None
        r = slice(group.row_start, group.row_start + group.num_seqs)
        attn[r] = _decode_attention(q[r], group, mask, cache, layer, scale)
    attn_rows = attn.view(rows, nh * hd)
    o = F.linear(attn_rows, w.o_proj)
    if lora is not None:
        add_lora(o, attn_rows, layer, "o", lora)
    x = x + o
    h = _rms_norm(x, w.post_norm, arch.rms_norm_eps)
    gate_up = F.linear(h, w.gate_up)
    if lora is not None:
        add_lora(gate_up, h, layer, "gate_up", lora)
    gate, up = gate_up.chunk(2, dim=-1)
    act = F.silu(gate) * up
    down = F.linear(act, w.down)
    if lora is not None:
        add_lora(down, act, layer, "down", lora)
    return x + down


@torch.inference_mode()
def forward_hidden(
    batch: ForwardBatch,
    weights: ModelWeights,
    arch: ModelArch,
    rope: RopeTables,
    cache: PagedKvCache,
) -> torch.Tensor:
    """Run the decoder over `batch`, writing its K/V into `cache`; returns the final-normed
    hidden states [num_outputs, hidden] of `batch.logits_rows` (`project_logits` makes their
    logits, all at once or a slice at a time)."""
    x = F.embedding(batch.input_ids, weights.embed)
    step = _StepInputs(
        batch=batch,
        cos=rope.cos.index_select(0, batch.positions),
        sin=rope.sin.index_select(0, batch.positions),
        prefill_masks=[span.causal_mask() for span in batch.prefills],
        decode_masks=[group.padding_mask() for group in batch.decodes],
    )
    for i, layer_weights in enumerate(weights.layers):
        x = _layer(x, layer_weights, i, step, arch, cache)
    x = x.index_select(0, batch.logits_rows)
    return _rms_norm(x, weights.final_norm, arch.rms_norm_eps)


@torch.inference_mode()
def project_logits(hidden: torch.Tensor, weights: ModelWeights) -> torch.Tensor:
    """float32 logits [rows, vocab] of final hidden states [rows, hidden]."""
    if hidden.shape[0] == 1 and weights.lm_head_t is not None:
        return torch.mm(hidden, weights.lm_head_t).float()
    return F.linear(hidden, weights.lm_head).float()


@torch.inference_mode()
def encode(
    input_ids: torch.Tensor,
    spans: list[tuple[int, int]],
    weights: ModelWeights,
    arch: ModelArch,
    rope: RopeTables,
) -> torch.Tensor:
    """The final-normed last hidden states [rows, hidden] of whole prompts laid out flat:
    `spans` are (row_start, num_tokens) covering `input_ids` in order, each a prompt from
    position 0. No KV cache is read or written."""
    device = input_ids.device
    positions = torch.cat([torch.arange(n, device=device) for _, n in spans])
    none = torch.empty(0, dtype=torch.long, device=device)
    batch = ForwardBatch(
        input_ids=input_ids,
        positions=positions,
        slots=none,
        prefills=[PrefillSpan(start, n, 0, none) for start, n in spans],
        decodes=[],
        logits_rows=none,
    )
    x = F.embedding(input_ids, weights.embed)
    step = _StepInputs(
        batch=batch,
        cos=rope.cos.index_select(0, positions),
        sin=rope.sin.index_select(0, positions),
        prefill_masks=[None] * len(spans),
        decode_masks=[],
    )
    for i, layer_weights in enumerate(weights.layers):
        x = _layer(x, layer_weights, i, step, arch, None)
    return _rms_norm(x, weights.final_norm, arch.rms_norm_eps)
