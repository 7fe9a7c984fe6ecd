"""The perimeter, as pure ASGI middleware that runs before any body byte is read: Host, Origin, the bearer
token and the body type (`_Perimeter`), the body size limit (`_BodyLimit`), and the page's security headers."""
from __future__ import annotations

import asyncio
import hmac
import re

from fastapi.responses import JSONResponse

from .errors import _error_response
from .options import ServeOptions, is_loopback

#: request bodies a write accepts: JSON and JSON Lines (never text/plain or forms, which any page may send cross-site)
JSON_LINES_TYPES = ("application/x-ndjson", "application/jsonl", "application/json-lines", "application/x-jsonlines")


WRITE_TYPES = ("application/json", *JSON_LINES_TYPES)


_OPEN_PATHS = frozenset({"/", "/health", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})
#: a watch's Atom feed: a feed reader cannot send a bearer token, so on a private server the route checks the feed's
#: own secret (`?key=`, esqbe.server.feeds) instead
_FEED_PATH = re.compile(r"/watches/[^/]+\.atom")


def is_write(method: str, path: str) -> bool:
    """Whether a request is a write (the token where the server has one): every method but GET/HEAD/OPTIONS, except
    POST /query and POST /graph (reads sent as a body)."""
    return method not in ("GET", "HEAD", "OPTIONS") and not (method == "POST" and path in ("/query", "/graph"))


def _token_ok(authorization: str | None, token: str) -> bool:
    scheme, _, given = (authorization or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


def _split_host(value: str) -> tuple[str, int | None]:
    """A Host header (or an Origin's netloc) as (lower-case name, port or None); [::1]:8000 -> ("::1", 8000)."""
    value = value.strip().lower()
    if value.startswith("["):
        name, _, rest = value[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif value.count(":") == 1:
        name, _, port = value.partition(":")
    else:
        name, port = value, ""
    return name.rstrip("."), int(port) if port.isdigit() else None


class _Perimeter:
    """Pure ASGI middleware, outside the body limit, so nothing here reads a body byte:

    - Host: a connection to a loopback address must name a loopback host (localhost, 127.0.0.1, [::1]) or
      one of `allowed_hosts`: a page whose DNS name was rebound to 127.0.0.1 is refused (400); with
      `allowed_hosts` every connection must name one of them (or a loopback host over loopback).
    - writes (every method but GET/HEAD/OPTIONS, except POST /query): an `Origin` header must be the
      server's own (its host and port as the Host header says) or a CORS origin (403), the bearer token
      when the server has one (401), and a body only as JSON or JSON Lines (415: not text/plain or forms,
      which a page on another site may send without asking first).
    - reads when `private`: the token too (the page, /health and the API docs stay open).
    """

    def __init__(self, app, options: ServeOptions):
        self.app, self.options = app, options
        self.allowed_hosts = {_split_host(h)[0] for h in options.allowed_hosts}
        self.cors = {o.strip().rstrip("/").lower() for o in options.cors_origins}

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers: dict[str, str] = {}
        for key, value in scope.get("headers") or []:
            headers.setdefault(key.decode("latin-1").lower(), value.decode("latin-1"))
        refused = self._refusal(scope, headers)
        if refused is not None:
            return await refused(scope, receive, send)
        return await self.app(scope, receive, send)

    def _refusal(self, scope, headers: dict[str, str]) -> JSONResponse | None:
        from starlette._utils import get_route_path

        host = headers.get("host", "")
        if not self._host_ok(scope, _split_host(host)[0]):
            return _error_response(400, f"this server does not answer to the host name {host!r} (allowed: loopback "
                                        "names, and the server's --allowed-host names)")
        method, path = scope["method"], get_route_path(scope)
        write = is_write(method, path)
        origin = headers.get("origin")
        if write and origin is not None and not self._origin_ok(origin, host):
            shown = _split_host(origin.partition("://")[2])[0] or "null"  # the name alone: URLs are kept from clients
            return _error_response(403, f"writes from another site's page (Origin {shown}) are not allowed: not this "
                                        "server's origin nor a --cors-origin")
        token = self.options.token
        private = self.options.private and method != "OPTIONS" and path not in _OPEN_PATHS and not path.startswith("/static/")
        private = private and not (method in ("GET", "HEAD") and _FEED_PATH.fullmatch(path))
        if token and (write or private) and not _token_ok(headers.get("authorization"), token):
            return _error_response(401, "this endpoint needs Authorization: Bearer <token>" if "authorization" not in headers
                                   else "wrong bearer token", headers={"WWW-Authenticate": 'Bearer realm="esqbe"'})
        if write and method in ("POST", "PUT", "PATCH"):
            ctype = headers.get("content-type", "").split(";")[0].strip().lower()
            if ctype not in WRITE_TYPES:
                return _error_response(415, _type_message(ctype))
        return None

    def _host_ok(self, scope, name: str) -> bool:
        if name in self.allowed_hosts or "*" in self.allowed_hosts:
            return True
        server = scope.get("server")
        on_loopback = is_loopback(server[0]) if server and server[0] else is_loopback(self.options.host)
        if on_loopback and is_loopback(name):
            return True
        checked = bool(self.allowed_hosts) or (on_loopback and is_loopback(self.options.host))
        return not checked

    def _origin_ok(self, origin: str, host: str) -> bool:
        from urllib.parse import urlsplit

        origin = origin.strip().rstrip("/").lower()
        if origin in self.cors or "*" in self.cors:
            return True
        try:
            parts = urlsplit(origin)
            given = (parts.hostname or "", parts.port or {"http": 80, "https": 443}.get(parts.scheme))
        except ValueError:
            return False
        name, port = _split_host(host)
        return bool(name) and given == (name, port or {"http": 80, "https": 443}.get(parts.scheme))


def _type_message(ctype: str) -> str:
    return f"send application/json or application/x-ndjson (JSON Lines), not {ctype or 'a body without Content-Type'}"


class _BodyLimit:
    """Pure ASGI middleware: refuse request bodies over `limit` bytes (413) before the app reads them, and one whose
    next bytes do not come within `stall` seconds (408: the client announced a body it does not send)."""

    def __init__(self, app, limit: int, stall: float | None = None):
        self.app, self.limit, self.stall = app, limit, stall

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        too_big = _error_response(413, f"request body over the limit of {self.limit} bytes")
        if length is not None:
            try:
                if int(length) > self.limit:
                    return await too_big(scope, receive, send)
            except ValueError:
                return await _error_response(400, "bad Content-Length header")(scope, receive, send)
        chunks, size, more = [], 0, True
        while more:
            try:
                message = await asyncio.wait_for(receive(), self.stall)
            except TimeoutError:
                return await _error_response(408, f"the request body stalled: no bytes for {self.stall:g} s "
                                                  "(header_timeout)", headers={"Connection": "close"})(scope, receive, send)
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                return await too_big(scope, receive, send)
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)


_PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
                               "connect-src 'self'; frame-ancestors 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
