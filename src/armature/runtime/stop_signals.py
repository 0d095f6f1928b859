"""A serving process's stop: SIGINT and SIGTERM set an event on the running loop, so that the
process stops through its clean-up (a signal's default action ended it on the spot)."""

from __future__ import annotations

import asyncio
import signal

__all__ = ["stop_on_signals"]


def stop_on_signals() -> asyncio.Event:
    """An event SIGINT and SIGTERM set from now on (call it on the running loop)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop
