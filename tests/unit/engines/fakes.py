"""A deterministic model runner for scheduler/engine tests: the next token after t is
(t + 1) % vocab, so every output is predictable and checkable."""

from __future__ import annotations

import torch

from armature.engines.native.scheduler import ScheduledChunk
from armature.model.arch import ModelArch
from armature.sim.mocker import modeled_layout, simulated_arch
from armature.transfer.blocks import KvBlockStore, ModeledKvStore

VOCAB = 100
EOS = 99


def fake_arch() -> ModelArch:
    return simulated_arch(vocab_size=VOCAB, max_model_len=512, eos_token_ids=(EOS,))


class CountingRunner:
    """Records every step's chunks as (request_id, start_pos, num_tokens)."""

    def __init__(self) -> None:
        self.arch = fake_arch()
        self.kv_store: KvBlockStore = ModeledKvStore(modeled_layout(self.arch, 16), 1e12)
        self.steps: list[list[tuple[str, int, int]]] = []
        self.fail_next = False

    def execute(self, chunks: list[ScheduledChunk]) -> torch.Tensor:
        self.steps.append([(c.request.request_id, c.start_pos, c.num_tokens) for c in chunks])
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("simulated device failure")
        rows = []
        for c in chunks:
            if c.completes_sequence:
                last = c.request.token_ids[c.start_pos + c.num_tokens - 1]
                row = torch.full((VOCAB,), -10.0)
                row[(last + 1) % VOCAB] = 10.0
                rows.append(row)
        return torch.stack(rows) if rows else torch.empty(0, VOCAB)
