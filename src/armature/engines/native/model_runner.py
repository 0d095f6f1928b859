"""The native engine's model runner: turns a step's scheduled chunks into one forward pass
over the paged cache (the `runner_api.ModelRunner` that the mocker replaces with a timing
model)."""

from __future__ import annotations

from pathlib import Path

import torch

from armature.engines.native.config import NativeEngineConfig
from armature.engines.native.kv_store import PagedCacheStore
from armature.engines.native.lora_set import ServedLora
from armature.engines.native.sampler import prompt_logprobs
from armature.engines.native.scheduler import ScheduledChunk
from armature.kv.hashing import hash_seed_for_salt
from armature.model.arch import ModelArch, read_arch
from armature.model.decode_groups import split_by_context
from armature.model.dtypes import torch_dtype
from armature.model.forward import (
    DecodeBatch,
    ForwardBatch,
    PrefillSpan,
    forward_hidden,
    project_logits,
)
from armature.model.kv_cache import PagedKvCache
from armature.model.lora import LoraWeights, load_lora
from armature.model.lora_batch import group_lora_rows
from armature.model.lora_names import check_lora_name
from armature.model.rope import build_rope_tables
from armature.model.weights import ModelWeights, load_weights
from armature.protocols.lora import LoraAdapter
from armature.transfer.blocks import KvBlockStore

__all__ = ["TorchModelRunner", "read_served_lora"]

# decodes are attended in groups of similar context (model.decode_groups): a cut is made where
# it saves more padded key positions than this, at most this many groups per step. A group
# costs a gather and an attention call per layer: an estimate of that cost in key positions,
# not tuned (bench/decode_groups.py measures a two-group batch against an equal one)
DECODE_GROUP_TOKENS = 64
MAX_DECODE_GROUPS = 4
# prompt rows projected to logits at once (a scored prompt): 256 x vocab x 4 bytes, 50 MB at a
# 49k vocabulary, where a whole chunk's took 200 MB at the default 1,024-token chunk
PROMPT_LOGITS_ROWS = 256


def read_served_lora(
    name: str, path: Path, arch: ModelArch, dtype: torch.dtype, device: torch.device
) -> ServedLora:
    """Read and check the adapter in `path` (LoraError when it cannot be served). Its salt is
    its name and its files' digest: the same files under the same name on any worker give the
    same block hashes, and a reload with other weights never meets the old KV blocks."""
    check_lora_name(name)
    weights = load_lora(path, arch, dtype, device)
    salt = f"{name}@{weights.digest}"
    return ServedLora(LoraAdapter(name, salt), hash_seed_for_salt(salt), weights)


class TorchModelRunner:
    """Our native PyTorch runner for Llama-family models."""

    def __init__(self, config: NativeEngineConfig, max_model_len: int):
        self.device = torch.device(config.device)
        self.dtype = torch_dtype(config.dtype)
        self.arch = read_arch(config.model_dir)
        self.weights = load_weights(config.model_dir, self.arch, self.dtype, self.device)
        self.rope = build_rope_tables(config.model_dir, max_model_len, self.dtype, self.device)
        self.num_blocks = config.get_num_kv_blocks(self.arch)
        self.cache = PagedKvCache(
            self.arch,
            self.num_blocks,
            config.block_size,
            self.dtype,
            self.device,
            shared=config.shared_kv_cache,
        )
        self.kv_store: KvBlockStore = PagedCacheStore(self.cache)
        self.block_size = config.block_size

    def read_lora(self, name: str, path: Path) -> ServedLora:
        return read_served_lora(name, path, self.arch, self.dtype, self.device)

    def build_batch(self, ordered: list[ScheduledChunk]) -> ForwardBatch:
        """The forward batch of `ordered`, chunks in `_batch_order`."""
        decode = [c for c in ordered if c.is_decode]
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        spans: list[PrefillSpan] = []
        logits_rows: list[int] = []
        prompt_rows: list[int] = []  # after the sampling rows (see `execute`)
        row_adapters: list[LoraWeights | None] = []
        for chunk in ordered:
            req = chunk.request
            row_start = len(input_ids)
            end = chunk.start_pos + chunk.num_tokens
            input_ids.extend(req.token_ids[chunk.start_pos : end])
            row_adapters += [None if req.lora is None else req.lora.weights] * chunk.num_tokens
            for pos in range(chunk.start_pos, end):
                positions.append(pos)
                slots.append(req.block_ids[pos // bs] * bs + pos % bs)
            if not chunk.is_decode:
                num_blocks = -(-end // bs)
                table = torch.tensor(req.block_ids[:num_blocks], dtype=torch.long)
                spans.append(PrefillSpan(row_start, chunk.num_tokens, chunk.start_pos, table))
            if chunk.completes_sequence:
                logits_rows.append(len(input_ids) - 1)
            prompt_rows += [row_start + p - chunk.start_pos for p in _prompt_positions(chunk)]
        decode_groups = []
        first_decode_row = len(input_ids) - len(decode)
        context_lens = [c.start_pos + 1 for c in decode]
        for start, end in split_by_context(context_lens, DECODE_GROUP_TOKENS, MAX_DECODE_GROUPS):
            lens = context_lens[start:end]
            max_blocks = -(-lens[-1] // bs)
            table_rows = [_padded(c.request.block_ids, max_blocks) for c in decode[start:end]]
            decode_groups.append(
                DecodeBatch(
                    row_start=first_decode_row + start,
                    block_table=torch.tensor(table_rows, dtype=torch.long, device=self.device),
                    context_lens=torch.tensor(lens, dtype=torch.long, device=self.device),
                    max_context_len=lens[-1],
                )
            )
        dev = self.device
        return ForwardBatch(
            input_ids=torch.tensor(input_ids, dtype=torch.long, device=dev),
            positions=torch.tensor(positions, dtype=torch.long, device=dev),
            slots=torch.tensor(slots, dtype=torch.long, device=dev),
            prefills=[
                PrefillSpan(s.row_start, s.num_tokens, s.start_pos, s.block_table.to(dev))
                for s in spans
            ],
            decodes=decode_groups,
            logits_rows=torch.tensor(logits_rows + prompt_rows, dtype=torch.long, device=dev),
            lora=group_lora_rows(row_adapters, dev),
        )

    def execute(self, chunks: list[ScheduledChunk]) -> torch.Tensor:
        """The logits to sample from, one row per chunk that completes its sequence, in
        chunk order. Requests that want their prompt's logprobs get those of the tokens
        after each of their chunk's positions appended (`RequestState.prompt_logprobs`)."""
        ordered = _batch_order(chunks)
        batch = self.build_batch(ordered)
        hidden = forward_hidden(batch, self.weights, self.arch, self.rope, self.cache)
        # the batch holds prefills, then decodes by context length; give the rows back in
        # chunk order
        completing = [c for c in chunks if c.completes_sequence]
        in_batch = [c for c in ordered if c.completes_sequence]
        position = {id(c): i for i, c in enumerate(in_batch)}
        index = torch.tensor([position[id(c)] for c in completing], dtype=torch.long)
        if hidden.shape[0] > len(in_batch):  # prompt rows: their logits a slice at a time
            _add_prompt_logprobs(ordered, hidden[len(in_batch) :], self.weights)
            hidden = hidden[: len(in_batch)]
        logits = project_logits(hidden, self.weights)
        return logits[index.to(logits.device)].cpu()


def _prompt_positions(chunk: ScheduledChunk) -> range:
    """The positions of `chunk` whose logits give a prompt token's logprob (the token after
    each), for a request that wants them."""
    req = chunk.request
    if req.prompt_logprobs is None:
        return range(0)
    end = min(chunk.start_pos + chunk.num_tokens, req.num_prompt_tokens - 1)
    return range(chunk.start_pos, end)


def _add_prompt_logprobs(
    ordered: list[ScheduledChunk], hidden: torch.Tensor, weights: ModelWeights
) -> None:
    """Extend each request's prompt logprobs from its rows of `hidden` (the final hidden
    states of the prompt rows of `build_batch`, in batch order), projected to logits
    PROMPT_LOGITS_ROWS at a time: a whole chunk's logits at once took chunk x vocab x 4 bytes
    (and as much again for their log-softmax). A prompt computed again (preempted) starts
    over."""
    first_row = 0
    for chunk in ordered:
        positions = _prompt_positions(chunk)
        if not positions:
            continue
        req = chunk.request
        assert req.prompt_logprobs is not None
        del req.prompt_logprobs[chunk.start_pos :]
        assert len(req.prompt_logprobs) == chunk.start_pos, "a prompt is computed in order"
        num_top = req.sampling.prompt_logprobs or 0
        for start in range(0, len(positions), PROMPT_LOGITS_ROWS):
            part = positions[start : start + PROMPT_LOGITS_ROWS]
            rows = hidden[first_row + start : first_row + start + len(part)]
            targets = [req.token_ids[p + 1] for p in part]
            req.prompt_logprobs += prompt_logprobs(project_logits(rows, weights), targets, num_top)
        first_row += len(positions)


def _padded(block_ids: list[int], length: int) -> list[int]:
    row = block_ids[:length]
    return row + [0] * (length - len(row))


def _batch_order(chunks: list[ScheduledChunk]) -> list[ScheduledChunk]:
    """The batch's row order: prefill chunks as scheduled, then decodes by context length
    (ascending; stable), so that decodes of similar context are adjacent rows."""
    decode = sorted((c for c in chunks if c.is_decode), key=lambda c: c.start_pos)
    return [c for c in chunks if not c.is_decode] + decode
