"""OpenAI-style errors: every user mistake becomes `{"error": {message, type, param, code}}`
with a 4xx status; nothing a client sends produces a traceback."""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from armature.errors import ArmatureError
from armature.frontend.text_check import LONE_SURROGATE

__all__ = [
    "NO_WORKER_RETRY_AFTER_S",
    "ApiError",
    "ErrorResponse",
    "error_body",
    "error_responses",
    "install_error_handlers",
]

# a 503 for want of a live worker: clients retry after this (workers come back: a planner's
# replacement, a restart), as an overloaded fleet's 503 tells them when
NO_WORKER_RETRY_AFTER_S = 1

log = logging.getLogger(__name__)


class ApiError(ArmatureError):
    """An error to return to the client as OpenAI's error object."""

    def __init__(
        self,
        message: str,
        *,
        status_code: int = 400,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.headers = headers
        self.message = message
        self.status_code = status_code
        self.type = type
        self.param = param
        self.code = code


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error object: the body of every 4xx and 5xx answer."""

    error: ErrorDetail


_ERROR_MEANINGS = {
    400: "invalid request (schema, ranges, context length, limits)",
    401: "missing or wrong API key (when the server requires one)",
    404: "unknown model, or unknown or expired response id",
    413: "request body over --max-request-bytes",
    500: "internal error",
    503: "overloaded (with Retry-After) or no worker is serving",
}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` entries documenting these error statuses with OpenAI's body."""
    return {
        status: {"model": ErrorResponse, "description": _ERROR_MEANINGS[status]}
        for status in statuses
    }


def error_body(
    message: str, type: str, param: str | None = None, code: str | None = None
) -> dict[str, dict[str, str | None]]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def _api_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return JSONResponse(
        error_body(exc.message, exc.type, exc.param, exc.code),
        status_code=exc.status_code,
        headers=exc.headers,
    )


# what pydantic names a union's member by in an error's location: its type (`str`,
# `list[str]`, `dict[str,any]`, `constrained-int`, `function-after[...]`) or model class
_MEMBER_TYPE = re.compile(
    r"(?:str|int|float|bool|bytes|none|any|[A-Z]\w*|[a-z]+(?:-[a-z]+)+|[\w-]+\[.*\])\Z"
)


# tagged unions whose members are flat (their fields beside `type`): pydantic puts the
# member's tag in an error's location, the client's object has no such level
_FLAT_TAGGED = {("text", "format"): frozenset({"text", "json_object", "json_schema"})}


def field_path(loc: Sequence[object]) -> list[str]:
    """The request field an error's location names, as the client wrote it: without the
    body's root, the union members' types pydantic adds (`messages.0.content.str`), a
    tagged member's tag before its field of the same name, as OpenAI's objects name theirs
    (`response_format.json_schema.json_schema.schema`), or a flat member's tag
    (`text.format.json_schema.name`: Responses' `text.format.name`)."""
    items = list(loc)[1:] if loc and loc[0] == "body" else list(loc)
    kept: list[str] = []
    for i, item in enumerate(items):
        if isinstance(item, str) and (_MEMBER_TYPE.match(item) or items[i + 1 : i + 2] == [item]):
            continue
        if item in _FLAT_TAGGED.get((kept[-2], kept[-1]) if len(kept) >= 2 else ("", ""), ()):
            continue
        kept.append(str(item))
    return kept


def most_telling(errors: Sequence[Any]) -> Any:
    """Of a body's validation errors, the one to report: pydantic lists one per member of a
    union the value failed (`str | list[...]`), the members' type mismatches first; the
    member that took the value's type and failed inside it tells the client more."""
    first = errors[0]
    path = field_path(first.get("loc", ()))

    def telling(error: Any) -> tuple[bool, int]:
        mismatch = str(error.get("type", "")).endswith("_type")
        return (not mismatch, len(field_path(error.get("loc", ()))))

    same_field = [e for e in errors if field_path(e.get("loc", ()))[: len(path)] == path]
    return max(same_field, key=telling)  # the first of the most telling


def _validation_error(_: Request, exc: Exception) -> JSONResponse:
    """400 for a body that fails the schema (malformed JSON, wrong types, bad ranges)."""
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    first = most_telling(errors) if errors else {"msg": "invalid request", "loc": ()}
    loc = field_path(first.get("loc", ()))
    if first.get("type") == "json_invalid":
        ctx = first.get("ctx")
        detail = ctx.get("error", first["msg"]) if isinstance(ctx, dict) else first["msg"]
        message = f"malformed JSON body: {detail}"
        return JSONResponse(error_body(message, "invalid_request_error"), status_code=400)
    if first.get("type") == LONE_SURROGATE:  # the body as a whole: name the field, not it
        ctx = first.get("ctx")
        param = str(ctx["param"]) if isinstance(ctx, dict) else None
        body = error_body(str(first["msg"]), "invalid_request_error", param)
        return JSONResponse(body, status_code=400)
    if first.get("type") == "missing" and not loc:
        message = "the request body must be a JSON object"
    elif not loc and isinstance(first.get("input"), bytes):  # not read as JSON
        message = "the request body must be a JSON object sent as content-type application/json"
    else:
        where = ".".join(loc) or "body"
        message = f"{where}: {first['msg']}"
        if "input" in first and first.get("type") != "missing":
            message += f" (got {_shortened(json.dumps(first['input'], default=str))})"
    param = ".".join(loc) or None
    return JSONResponse(error_body(message, "invalid_request_error", param), status_code=400)


def _shortened(text: str, max_chars: int = 100) -> str:
    """`text`, or its start and a note of how much was left out (a cut value read as whole)."""
    if len(text) <= max_chars:
        return text
    return f"{text[:max_chars]}... ({len(text) - max_chars:,} more characters)"


def body_parse_detail(cause: BaseException | None) -> str | None:
    """What is wrong with a JSON body the decoder gave up on without a decode error (FastAPI
    answers those "There was an error parsing the body"), or None for any other cause."""
    if isinstance(cause, UnicodeDecodeError):
        return f"the request body is not UTF-8 text (invalid byte at offset {cause.start})"
    if isinstance(cause, RecursionError):
        return "malformed JSON body: nested too deeply"
    if isinstance(cause, ValueError) and "integer string conversion" in str(cause):
        return f"malformed JSON body: a number with more than {sys.get_int_max_str_digits()} digits"
    return None


def _http_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    detail = str(exc.detail)
    if exc.status_code == 400:
        detail = body_parse_detail(exc.__cause__) or detail
    return JSONResponse(error_body(detail, kind), status_code=exc.status_code)


def _internal_error(_: Request, exc: Exception) -> JSONResponse:
    log.exception("internal error", exc_info=exc)
    return JSONResponse(error_body("internal server error", "internal_error"), status_code=500)


ErrorObserver = Callable[[Request, int], None]


def install_error_handlers(app: FastAPI, observe: ErrorObserver | None = None) -> None:
    """Route every error to OpenAI's error object; `observe(request, status)` sees each one
    that never reached a route's own accounting (schema failures, unknown routes)."""

    def observed(
        handler: Callable[[Request, Exception], JSONResponse],
    ) -> Callable[[Request, Exception], JSONResponse]:
        def wrapper(request: Request, exc: Exception) -> JSONResponse:
            response = handler(request, exc)
            if observe is not None:
                observe(request, response.status_code)
            return response

        return wrapper

    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(RequestValidationError, observed(_validation_error))
    app.add_exception_handler(StarletteHTTPException, observed(_http_error))
    app.add_exception_handler(Exception, _internal_error)
