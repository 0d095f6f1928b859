"""Waiting for a state instead of for a time: the tests' one async poll."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

DEADLINE_S = 60.0  # a bound for a hung test, not a timing assertion: a loaded machine is slow


async def wait_until(
    condition: Callable[[], bool], what: str, deadline_s: float = DEADLINE_S
) -> None:
    """Return once `condition()` holds, polling every 5 ms; fail naming `what` after the
    deadline."""
    give_up_s = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() > give_up_s:
            raise AssertionError(f"not {what} after {deadline_s:g} s")
        await asyncio.sleep(0.005)
