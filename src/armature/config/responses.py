"""The Responses API's store: how many responses `previous_response_id` can name, and for
how long (frontend/response_store.py)."""

from __future__ import annotations

from dataclasses import dataclass

from armature.config.settings import setting
from armature.config.values import positive_float, positive_int

__all__ = ["ResponsesConfig"]


@dataclass(frozen=True, kw_only=True)
class ResponsesConfig:
    """The frontend's in-memory store of /v1/responses results (lost on restart)."""

    max_stored_responses: int = setting(
        1024,
        "keep at most this many responses for previous_response_id and GET /v1/responses/ID "
        "(the oldest go first)",
        parse=positive_int,
    )
    stored_response_ttl_s: float = setting(
        3600.0,
        "forget a stored response this long after it was made",
        parse=positive_float,
    )
