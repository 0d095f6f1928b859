"""Receives a vLLM engine's KV events on zmq (a thread) and keeps them, translated, until the
worker drains them.

    vLLM engine core --PUB ipc://...--> [thread: decode, check seq, translate] --> buffer
    worker pump --take_events()--> buffer;  router gap --dump()--> translator's block map

A lost batch (a gap in vLLM's sequence numbers), an undecodable payload or an event that
breaks the hash chain makes the subscriber forget every block and publish one Cleared: the
router then holds none of this worker's blocks until new events arrive, never wrong ones.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from pathlib import Path

import zmq

from armature.engines.vllm.events import KvEventTranslator, VllmEventError, decode_batch
from armature.protocols.kv_events import KvDump, KvEvent

__all__ = ["KvEventSubscriber"]

log = logging.getLogger(__name__)

MAX_BUFFERED_KV_EVENTS = 65536  # as the native engine: with no consumer, old events drop
_POLL_MS = 100


class KvEventSubscriber:
    """Subscribes to `endpoint` on construction (before vLLM binds it, so no early event is
    missed); `start` runs the receiving thread, `stop` ends it and closes the socket."""

    def __init__(self, endpoint: str, translator: KvEventTranslator):
        self.endpoint = endpoint
        self.translator = translator
        self.num_batches = 0
        self.num_resets = 0
        self._socket: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.SUB)
        self._socket.setsockopt(zmq.SUBSCRIBE, b"")
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.connect(endpoint)
        self._lock = threading.Lock()  # guards translator and _events
        self._events: deque[KvEvent] = deque(maxlen=MAX_BUFFERED_KV_EVENTS)
        self._next_seq = 0
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="vllm-kv-events", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the thread and close the socket; an ipc endpoint's socket file (left by vLLM's
        publisher, which dies with its engine) is removed: call after vLLM has stopped."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._socket.close()
        if self.endpoint.startswith("ipc://"):
            Path(self.endpoint.removeprefix("ipc://")).unlink(missing_ok=True)

    def take_events(self) -> list[KvEvent]:
        with self._lock:
            events = list(self._events)
            self._events.clear()
        return events

    def dump(self) -> KvDump:
        with self._lock:
            return self.translator.dump()

    def _run(self) -> None:
        while not self._stopping.is_set():
            if not self._socket.poll(_POLL_MS):
                continue
            frames = self._socket.recv_multipart()
            with self._lock:
                self._events.extend(self.handle(frames))

    def handle(self, frames: list[bytes]) -> list[KvEvent]:
        """Our events for one zmq message `(topic, seq, payload)`. Holds the lock's state:
        called by the thread (or a test) with the lock held or no thread running."""
        if len(frames) != 3:
            return self._reset(f"a KV event message has {len(frames)} frames, expected 3")
        _, seq_bytes, payload = frames
        seq = int.from_bytes(seq_bytes, "big")
        self.num_batches += 1
        out: list[KvEvent] = []
        if seq != self._next_seq:
            out += self._reset(f"KV event batches {self._next_seq}..{seq - 1} were lost")
        self._next_seq = seq + 1
        try:
            batch = decode_batch(payload)
            for event in batch.events:
                out += self.translator.translate(event)
        except VllmEventError as exc:
            out += self._reset(str(exc))
        return out

    def _reset(self, reason: str) -> list[KvEvent]:
        self.num_resets += 1
        log.warning("vLLM KV events: %s; forgetting this worker's cached blocks", reason)
        return self.translator.reset()
