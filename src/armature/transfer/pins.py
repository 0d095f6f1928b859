"""Pinned prompt blocks on a prefill worker, shared between the engine thread (which pins and
frees) and the transfer server's threads (which read and release).

    engine thread:  add(handle, blocks, deadline)        take_freeable(now) -> blocks to free
    server threads: begin_read(handle) .. end_read(handle)   release(handle)

A handle's blocks are freed once it is released or its deadline passes, but never while a
read is in flight (the engine would otherwise reuse blocks that are being sent).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from armature.errors import ArmatureError

__all__ = ["PinTable", "UnknownHandleError"]


class UnknownHandleError(ArmatureError, KeyError):
    """The handle was never pinned here, or was already released or expired."""

    def __str__(self) -> str:
        return f"unknown or expired KV handle {self.args[0]!r}"


@dataclass
class _Pin:
    block_ids: list[int]
    deadline_s: float
    request_id: str
    readers: int = 0
    released: bool = False


class PinTable:
    def __init__(self) -> None:
        self._pins: dict[str, _Pin] = {}
        self._lock = threading.Lock()
        self.num_expired = 0

    def add(
        self, handle_id: str, block_ids: list[int], deadline_s: float, request_id: str = ""
    ) -> None:
        with self._lock:
            if handle_id in self._pins:
                raise ValueError(f"KV handle {handle_id!r} is already pinned")
            self._pins[handle_id] = _Pin(list(block_ids), deadline_s, request_id)

    def begin_read(self, handle_id: str) -> list[int]:
        """The pinned block ids; they stay allocated until the matching `end_read`."""
        with self._lock:
            pin = self._pins.get(handle_id)
            if pin is None or pin.released:
                raise UnknownHandleError(handle_id)
            pin.readers += 1
            return list(pin.block_ids)

    def end_read(self, handle_id: str) -> None:
        with self._lock:
            pin = self._pins.get(handle_id)
            if pin is not None:
                pin.readers -= 1

    def release(self, handle_id: str) -> bool:
        """The decode side is done with the blocks; False if the handle is unknown."""
        with self._lock:
            pin = self._pins.get(handle_id)
            if pin is None or pin.released:
                return False
            pin.released = True
        return True

    def release_request(self, request_id: str) -> bool:
        """Release the handles pinned for `request_id`: its caller left before the handle
        reached it, so no decode worker will ever release them. False if there were none."""
        with self._lock:
            pins = [p for p in self._pins.values() if p.request_id == request_id]
            pins = [p for p in pins if not p.released]
            for pin in pins:
                pin.released = True
        return bool(pins)

    def take_freeable(self, now_s: float) -> list[list[int]]:
        """Remove and return the block lists that may be freed now: released or expired
        handles with no read in flight."""
        out: list[list[int]] = []
        with self._lock:
            for handle_id, pin in list(self._pins.items()):
                if pin.readers > 0:
                    continue
                if pin.released or now_s >= pin.deadline_s:
                    if not pin.released:
                        self.num_expired += 1
                    out.append(pin.block_ids)
                    del self._pins[handle_id]
        return out

    def next_deadline_s(self) -> float | None:
        with self._lock:
            return min((p.deadline_s for p in self._pins.values()), default=None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._pins)

    def get_num_pinned_blocks(self) -> int:
        with self._lock:
            return sum(len(p.block_ids) for p in self._pins.values())
