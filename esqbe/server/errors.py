"""Errors as JSON with the right status: `ApiError`, the error body (messages without paths or URLs; the
log has them under a request id), esqbe's errors at the status each class declares (`http_status`, with
Retry-After on a 503), and the OpenAPI error responses. Any other exception is a bug: 500, logged with
its traceback."""
from __future__ import annotations

import os
import re
import secrets
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..core.redact import guard_logger, mask_urls
from ..errors import EsqbeError
from .models import ErrorResponse

log = guard_logger("esqbe.server")  # its messages and tracebacks with URL credentials masked (esqbe.core.redact)


def _errors(*codes: int) -> dict:
    text = {400: "the request cannot be answered as asked", 401: "missing or wrong bearer token",
            404: "no such paper", 409: "conflicts with the index (empty index, another model)",
            413: "too large (body bytes, sentences, records)", 415: "unsupported content type",
            422: "invalid request", 503: "not ready, backend unavailable, or writer busy",
            504: "the request took longer than the server's request timeout and was abandoned"}
    return {c: {"model": ErrorResponse, "description": text[c]} for c in codes}


class ApiError(Exception):
    def __init__(self, status: int, message: str, details: list | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.details, self.headers = status, message, details, headers


def _error_response(status: int, message: str, details: list | None = None, headers: dict | None = None) -> JSONResponse:
    body: dict[str, Any] = {"status": status, "message": _public(status, message)}
    if details is not None:
        body["details"] = details
    return JSONResponse({"error": body}, status_code=status, headers=headers)


#: an absolute path (its first component a directory of this machine's root decides: /papers/x is a route, not a path)
_ABS_PATH = re.compile(r"(?<![\w/:.<])/(?:[\w.@~+%-]+/)*[\w.@~+%-]+")


_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s'\"<>]+", re.IGNORECASE)


def _redact(message: str) -> str:
    """The message without filesystem paths and URLs (engine addresses, maybe with credentials)."""
    def path(m: re.Match) -> str:
        first = m.group().lstrip("/").split("/", 1)[0]
        return "<path>" if first and os.path.isdir("/" + first) else m.group()

    return _ABS_PATH.sub(path, _URL.sub("<url>", message))


def _public(status: int, message: str) -> str:
    """What a client is told: the message minus internals; when something was taken out, the full message
    goes to the log under a request id that the client gets instead."""
    clean = _redact(message)
    if clean == message:
        return message
    rid = secrets.token_hex(4)
    log.warning("request %s answered %s: %s", rid, status, mask_urls(message))  # the log keeps URLs, not credentials
    return f"{clean} (request {rid}: the server log has the details)"


def _status_of(exc: BaseException) -> int:
    """The HTTP status of an error: an esqbe error's own (`http_status`), anything else 500 (a bug)."""
    return exc.http_status if isinstance(exc, EsqbeError) else 500


def api_error(exc: EsqbeError) -> ApiError:
    """An esqbe error as the service's answer: its status, message, details and (a 503) Retry-After."""
    headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after is not None and exc.http_status == 503 else None
    return ApiError(exc.http_status, str(exc), exc.details, headers)


def _clean_validation(errors: Sequence) -> list[dict]:
    out = []
    for e in errors:
        item = {"loc": [str(x) for x in e.get("loc", ())], "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
        out.append(item)
    return out


def install_error_handlers(app: FastAPI) -> None:
    """Every error as `{"error": {status, message, details?}}` with its status: the service's own
    (`ApiError`), invalid requests (400 bad JSON, 422), HTTP errors, and the library's errors."""

    @app.exception_handler(ApiError)
    async def _api_error(request, exc: ApiError):
        return _error_response(exc.status, exc.message, exc.details, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request, exc: RequestValidationError):
        errors = exc.errors()
        if any(e.get("type") == "json_invalid" for e in errors):
            return _error_response(400, "the request body is not valid JSON", _clean_validation(errors))
        return _error_response(422, "invalid request: " + "; ".join(
            f"{'.'.join(str(x) for x in e.get('loc', ())[1:]) or 'body'}: {e.get('msg')}" for e in errors),
            _clean_validation(errors))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request, exc: StarletteHTTPException):
        return _error_response(exc.status_code, str(exc.detail), headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(request, exc: Exception):
        if isinstance(exc, EsqbeError):
            e = api_error(exc)
            return _error_response(e.status, e.message, e.details, e.headers)
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return _error_response(500, f"internal error ({type(exc).__name__}); the server log has the details")
