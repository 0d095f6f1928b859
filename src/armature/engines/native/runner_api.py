"""The seam between the engine core and what computes a step: `ModelRunner`.

The native engine's runner (`model_runner.TorchModelRunner`) runs the model; the mocker's
(`sim.mocker.MockerRunner`) runs a timing model instead (DESIGN §2: the simulator runs the real
scheduler and block pool). This module stays free of torch, so that the mocker never loads it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeAlias

from armature.engines.native.lora_set import ServedLora
from armature.engines.native.scheduler import ScheduledChunk
from armature.model.arch import ModelArch
from armature.transfer.blocks import KvBlockStore

if TYPE_CHECKING:
    import torch

__all__ = ["ModelRunner", "RunnerOutput"]

# float32 logits [n, vocab] to sample from, or (the mocker) the token ids themselves
RunnerOutput: TypeAlias = "torch.Tensor | list[int]"


class ModelRunner(Protocol):
    arch: ModelArch
    kv_store: KvBlockStore  # reads and writes whole blocks (KV transfer)

    def execute(self, chunks: list[ScheduledChunk]) -> RunnerOutput:
        """Compute `chunks`; for the chunks that complete their sequence, in chunk order:
        float32 logits [n, vocab] to sample from, or (the mocker) the token ids themselves."""
        ...

    def read_lora(self, name: str, path: Path) -> ServedLora:
        """The adapter in `path`, ready to serve as `name` (LoraError if it cannot be): its
        weights checked against the model (the mocker: its name only). Safe from any thread."""
        ...
