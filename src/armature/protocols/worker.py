"""What workers publish about themselves and send to frontends (msgspec, on the wire).

A worker registers a `WorkerCard` in discovery under `worker_key(namespace, instance_id)`; a
frontend watching `worker_prefix(namespace)` learns its model, capacity and request-plane
address. Its `events` endpoint streams `WorkerUpdate`s: KV events in order, its load, and the
engine's step records since the previous update (for a planner).
"""

from __future__ import annotations

import enum

import msgspec

from armature.protocols.address import EndpointAddress
from armature.protocols.embedding import EmbeddingShape, WorkerTask
from armature.protocols.engine import EngineLoad, StepRecord
from armature.protocols.kv_events import KvEvent
from armature.protocols.lora import LoraAdapter, LoraState

__all__ = ["WorkerCard", "WorkerRole", "WorkerUpdate", "worker_key", "worker_prefix"]


class WorkerRole(enum.StrEnum):
    """What part a worker plays: whole requests, or one side of disaggregated serving."""

    AGG = "agg"  # prefill and decode
    PREFILL = "prefill"  # prompts for decode workers (pins their KV blocks)
    DECODE = "decode"  # continues from a prefill worker's KV (or prefills itself)


class WorkerCard(msgspec.Struct, frozen=True, kw_only=True):
    instance_id: int
    namespace: str
    model_name: str
    model_path: str  # tokenizer and chat template source (a local directory)
    block_size: int
    num_kv_blocks: int
    max_model_len: int
    vocab_size: int
    request_url: str  # tcp://host:port or nats:<subject>
    events_url: str  # where the worker's event-plane publisher is (zmq or nats url)
    metrics_url: str = ""  # the worker's Prometheus endpoint ("" when it has none)
    role: WorkerRole = WorkerRole.AGG
    task: WorkerTask = WorkerTask.GENERATE  # embed: its `embed` endpoint answers, not generate
    engine: str = ""  # the engine kind (torch, mocker, vllm); "" from older workers
    embedding: EmbeddingShape | None = None  # with task embed: the vectors it returns
    # whether its engine enforces guides (structured output, forced tool calls); cards of
    # older workers lack it, and their engines decide for themselves
    structured_output: bool = True
    # the LoRA adapters it served at registration (version 0 of its LoraState)
    lora_adapters: list[LoraAdapter] = msgspec.field(default_factory=list)

    @property
    def worker_id(self) -> str:
        return f"worker-{self.instance_id:x}"


class WorkerUpdate(msgspec.Struct, frozen=True, kw_only=True):
    kv_events: list[KvEvent]
    load: EngineLoad
    # oldest first; absent in updates from workers that predate step records
    step_records: list[StepRecord] = msgspec.field(default_factory=list)
    # the LoRA adapters it serves now; absent from workers that predate adapters
    lora: LoraState | None = None


WORKER_COMPONENT = "worker"
GENERATE_ENDPOINT = "generate"


def worker_prefix(namespace: str) -> str:
    """Discovery prefix of every worker in `namespace` (AddressError for a bad namespace)."""
    return f"instances/{EndpointAddress(namespace, WORKER_COMPONENT, GENERATE_ENDPOINT)}/"


def worker_key(namespace: str, instance_id: int) -> str:
    """Discovery key of one worker: `instances/<namespace>/worker/generate/<instance hex>`."""
    address = EndpointAddress(namespace, WORKER_COMPONENT, GENERATE_ENDPOINT, instance_id)
    return f"instances/{address}"
