"""What the server under test serves, asked before a run: its /v1/models listing, so that an
unreachable server or a model it does not serve is one clear error up front, not a run whose
every request fails.

    served = await get_served_models(client, "http://127.0.0.1:8000")
    model = choose_model("http://127.0.0.1:8000", list(served), requested=None)  # the first
"""

from __future__ import annotations

import httpx

from armature.errors import ArmatureError

__all__ = [
    "ModelListError",
    "ServerCheckError",
    "ServerUnreachableError",
    "choose_model",
    "get_served_models",
]

_MAX_SHOWN = 5  # model ids an error lists


class ServerCheckError(ArmatureError):
    """The server under test rules the run out (unreachable, or not serving the model)."""


class ServerUnreachableError(ServerCheckError):
    """No answer came from the server."""


class ModelListError(ServerCheckError):
    """The server answered, but not with a model listing (an error status, not JSON)."""


async def get_served_models(client: httpx.AsyncClient, url: str) -> dict[str, int | None]:
    """The model ids `url`/v1/models lists, in its order, each with the context length it
    lists (`max_model_len`, as vLLM and armature list it; None: none). Raises
    ServerUnreachableError when no answer came, ModelListError when the answer is no listing."""
    try:
        response = await client.get(f"{url}/v1/models")
    except (httpx.HTTPError, httpx.InvalidURL) as exc:  # InvalidURL is no HTTPError
        raise ServerUnreachableError(f"cannot reach {url}: {_one_line(exc)}") from None
    if response.status_code != 200:
        raise ModelListError(f"{url}/v1/models answered {response.status_code}")
    try:
        return {str(entry["id"]): _context(entry) for entry in response.json()["data"]}
    except (ValueError, KeyError, TypeError):
        raise ModelListError(f"{url}/v1/models answered no model list") from None


def _context(entry: dict[str, object]) -> int | None:
    length = entry.get("max_model_len")
    return (
        length if isinstance(length, int) and not isinstance(length, bool) and length > 0 else None
    )


def choose_model(url: str, served: list[str], requested: str | None) -> str:
    """`requested` when the server serves it, the first model it serves when None;
    ServerCheckError naming what it serves otherwise."""
    if requested is None:
        if not served:
            raise ServerCheckError(f"{url}/v1/models lists no model")
        return served[0]
    if requested not in served:
        shown = ", ".join(repr(m) for m in served[:_MAX_SHOWN])  # repr: one line, whatever ids
        more = f" and {len(served) - _MAX_SHOWN} more" if len(served) > _MAX_SHOWN else ""
        serves = f"serves {shown}{more}" if served else "lists no model"
        raise ServerCheckError(f"--model {requested!r}: {url} does not serve it ({serves})")
    return requested


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
