"""GET /v1/responses/{id}/input_items: the items a response ran on, as a list page. Pure.

A response's input items are the items of the responses before it (their inputs, then their
outputs, as `previous_response_id` chained them) followed by its own `input`; each carries an
id (the client's, or one given when it was stored) so that a page can start `after` one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel

from armature.frontend.errors import ApiError
from armature.frontend.responses_output import NewId

__all__ = ["MAX_PAGE_ITEMS", "get_page", "listed_items"]

MAX_PAGE_ITEMS = 100  # OpenAI's bound on `limit`
_ID_PREFIXES = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "reasoning": "rs",
}


def listed_items(
    items: Sequence[BaseModel], raw: str | Sequence[dict[str, Any]], new_id: NewId
) -> list[dict[str, Any]]:
    """`items` (read from `raw`, the request's `input`) as list items: their fields, the id
    the client gave (or a new one) and a status."""
    given = [{}] * len(items) if isinstance(raw, str) else list(raw)
    out = []
    for item, sent in zip(items, given, strict=True):
        fields = item.model_dump(exclude_none=True)
        kind = fields["type"]
        client_id = sent.get("id")
        fields["id"] = client_id if isinstance(client_id, str) else new_id(_ID_PREFIXES[kind])
        if kind != "reasoning":
            fields["status"] = "completed"
        out.append(fields)
    return out


def get_page(
    items: Sequence[dict[str, Any]],
    after: str | None,
    limit: int,
    order: Literal["asc", "desc"],
) -> dict[str, Any]:
    """OpenAI's list object of up to `limit` items in `order` (desc: the last item first),
    starting after the item with id `after`; ApiError (400 naming `after`) when no item has
    that id."""
    ordered = list(items) if order == "asc" else list(reversed(items))
    start = 0
    if after is not None:
        ids = [item.get("id") for item in ordered]
        if after not in ids:
            raise ApiError(f"no input item of this response has the id {after!r}", param="after")
        start = ids.index(after) + 1
    data = ordered[start : start + limit]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": start + limit < len(ordered),
    }
