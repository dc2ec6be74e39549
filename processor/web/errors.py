"""Every error answer is ``{"error": <short code>, "detail": <sentence>}``, never a trace."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

__all__ = ["ApiError", "install_error_handlers"]

logger = logging.getLogger(__name__)

# Starlette's own errors (no route, wrong method) by status.
_CODES = {
    400: "bad_request",
    401: "unauthorized",
    404: "not_found",
    405: "method_not_allowed",
    413: "too_large",
    415: "unsupported_media_type",
}


class ApiError(Exception):
    """An error answer: HTTP ``status`` with a short ``error`` code and a ``detail``."""

    def __init__(
        self, status: int, error: str, detail: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(detail)
        self.status, self.error, self.detail, self.headers = status, error, detail, headers


def error_body(error: str, detail: str) -> dict[str, str]:
    return {"error": error, "detail": detail}


def install_error_handlers(app: FastAPI) -> None:
    """Reshape every error, FastAPI's validation errors included, to the one body."""
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(Exception, _unexpected)


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return JSONResponse(error_body(exc.error, exc.detail), exc.status, headers=exc.headers)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = _CODES.get(exc.status_code, "http_error")
    detail = exc.detail if isinstance(exc.detail, str) else code.replace("_", " ")
    if exc.status_code == 404 and detail == "Not Found":
        detail = f"no route {request.method} {request.url.path}"
    return JSONResponse(error_body(code, detail), exc.status_code, headers=exc.headers)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors: list[dict[str, Any]] = list(exc.errors())
    if any(e.get("type") == "json_invalid" for e in errors):
        return JSONResponse(error_body("malformed_json", "the body is not valid JSON"), 400)
    media = request.headers.get("content-type", "")
    if request.method == "POST" and "json" not in media and _body_refused(errors):
        detail = "send the body as JSON (Content-Type: application/json)"
        return JSONResponse(error_body("unsupported_media_type", detail), 415)
    parts = [f"{_where(e.get('loc', ()))}: {e.get('msg', 'invalid')}" for e in errors[:5]]
    return JSONResponse(error_body("invalid_request", "; ".join(parts)), 422)


def _body_refused(errors: list[dict[str, Any]]) -> bool:
    """Whether the body as a whole was refused (what FastAPI says of a non-JSON body)."""
    return any(tuple(e.get("loc", ())) == ("body",) for e in errors)


def _where(loc: Any) -> str:
    """``("query", "limit")`` -> ``query limit``; a body field without the ``body`` prefix."""
    names = [str(part) for part in loc]
    if names and names[0] == "body" and len(names) > 1:
        names = names[1:]
    return ".".join(names) or "request"


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    logger.exception("%s %s raised", request.method, request.url.path)
    detail = f"the server failed on this request ({type(exc).__name__}); see its log"
    return JSONResponse(error_body("internal_error", detail), 500)
