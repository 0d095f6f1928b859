"""TCP keepalive for the request plane's long-lived connections.

A peer host that dies without a reset (power lost, a partition) leaves its connections open
for the kernel's defaults: two hours of silence before the first keepalive probe, and ~15
minutes of retransmissions for data sent and never acknowledged. A worker would hold the
engine slots of a dead frontend's streams that long. With these options a connection to a
dead peer ends ~30 s after its last acknowledgement, idle (probes from 10 s of silence on,
unanswered) or with data in flight (TCP_USER_TIMEOUT, which on Linux also bounds the probes).
Options the platform lacks, or refuses for this socket, are skipped (they are Linux's names).
"""

from __future__ import annotations

import contextlib
import socket

__all__ = [
    "KEEPALIVE_IDLE_S",
    "KEEPALIVE_INTERVAL_S",
    "KEEPALIVE_PROBES",
    "USER_TIMEOUT_MS",
    "set_keepalive",
]

KEEPALIVE_IDLE_S = 10  # silence before the first probe
KEEPALIVE_INTERVAL_S = 5  # between unanswered probes
KEEPALIVE_PROBES = 3  # unanswered probes that end the connection
USER_TIMEOUT_MS = 30_000  # data unacknowledged this long ends the connection


def set_keepalive(sock: socket.socket | None) -> None:
    """Turn keepalive on for a connected TCP socket (None, or not TCP: nothing to do)."""
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    with contextlib.suppress(OSError):  # a connection already reset, a sandbox's refusal
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in (
            ("TCP_KEEPIDLE", KEEPALIVE_IDLE_S),
            ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL_S),
            ("TCP_KEEPCNT", KEEPALIVE_PROBES),
            ("TCP_USER_TIMEOUT", USER_TIMEOUT_MS),
        ):
            option = getattr(socket, name, None)
            if option is not None:
                sock.setsockopt(socket.IPPROTO_TCP, option, value)
