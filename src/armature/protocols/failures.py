"""Why a request-plane stream failed: the code a worker puts in a Fail frame, and the one its
client acts on. On the wire it is the value string (msgspec encodes a StrEnum by value), and
a code this build does not know is refused at decode.
"""

from __future__ import annotations

import enum

__all__ = ["FailureCode"]


class FailureCode(enum.StrEnum):
    INVALID_REQUEST = "invalid_request"  # can never be served as sent: the edge answers 400
    NOT_FOUND = "not_found"  # the worker serves no such endpoint
    UNAVAILABLE = "unavailable"  # the worker cannot take it now (it is draining): try another
    INTERNAL = "internal"  # the handler failed
