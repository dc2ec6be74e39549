"""Bearer-token auth of the /api routes (README, "HTTP API and metrics").

With ``Authorization: Bearer <PROCESSOR_HTTP_TOKEN>`` a request may do anything.
Without it, or with a wrong one: off loopback every /api route answers 401; on
loopback the GET routes stay open, showing resume tokens redacted (``reads.py``),
and the POST routes and ``GET /api/requests`` (made of resume tokens) answer 401.
"""

from __future__ import annotations

import hmac
import ipaddress

from fastapi import HTTPException, Request

from processor.web.context import WebContext

__all__ = ["authorized", "is_loopback", "require_token", "require_token_off_loopback"]


def is_loopback(host: str) -> bool:
    """Whether a bind address only accepts local connections."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def authorized(context: WebContext, request: Request) -> bool:
    """Whether the request carries the configured bearer token."""
    if context.token is None:
        return False
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    expected = context.token.get_secret_value()
    # As bytes: compare_digest refuses str with non-ASCII characters (a forged header).
    given_bytes = given.strip().encode("utf-8", "surrogateescape")
    return scheme.lower() == "bearer" and hmac.compare_digest(given_bytes, expected.encode())


def _refuse(context: WebContext, request: Request) -> HTTPException:
    if context.token is None:
        detail = "this route needs a bearer token, and none is configured (PROCESSOR_HTTP_TOKEN)"
    elif "authorization" in request.headers:
        detail = "wrong bearer token"
    else:
        detail = "missing bearer token (Authorization: Bearer <PROCESSOR_HTTP_TOKEN>)"
    return HTTPException(401, detail, headers={"WWW-Authenticate": "Bearer"})


def require_token(context: WebContext, request: Request) -> None:
    """Refuse (401) a request without the bearer token."""
    if not authorized(context, request):
        raise _refuse(context, request)


def require_token_off_loopback(context: WebContext, request: Request) -> None:
    """Refuse (401) a request without the bearer token when bound off loopback."""
    if not is_loopback(context.bind_host):
        require_token(context, request)
