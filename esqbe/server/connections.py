"""What `esqbe serve` lets one client connection hold, bounded: a connection must send its request line and headers
within `header_timeout` seconds (of connecting, or of its previous response on a kept-alive connection), else it is
closed; at most `connection_limit` connections are open at once (never more than the open-file limit leaves room
for), the oldest of those still waiting for their headers closed to make room for a new one, a new one refused only
when every open connection has a request in hand; each kind of refusal is logged as one line, then counted and
summed up at most once a minute, never a traceback per connection.

uvicorn (0.54 here) times out neither a connection that sends nothing nor one that sends half its headers (its
`timeout_keep_alive` starts only after a response; its `limit_concurrency` answers 503 once a request's headers are
in, after the socket was accepted, so it bounds neither open files nor held connections): `guarded_protocol` is its
h11 protocol with the header timer and the limit, handed to `uvicorn.Config(http=...)`. The soft open-file limit
(RLIMIT_NOFILE) is raised to the hard one at start (`open_file_limit`): a default soft limit of 1,024 leaves a server
unreachable once a thousand idle sockets are held."""
from __future__ import annotations

import asyncio
import logging
import os
import resource
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("esqbe.server")

#: open files kept free for the server's own use past the connections: the index's files, the model's, each
#: reader's SQLite handle, logs (what is open at start is counted besides)
RESERVED_FILES = 256
#: a kind of refusal logged once, then counted and summed up at most this often (seconds)
NOTE_INTERVAL = 60.0
#: the most the soft open-file limit is raised to (an unlimited hard limit is not a number of files)
MAX_OPEN_FILES = 1 << 20

_WHAT = {
    "header_timeout": "closed {n} connection(s) that sent no complete request line and headers within {t:g} s "
                      "(header_timeout)",
    "evicted": "closed {n} connection(s) still waiting for their request headers to make room: {limit} connections "
               "were open (max_connections)",
    "refused": "refused {n} connection(s): {limit} connections were open, each with a request in hand "
               "(max_connections)",
    "accept": "could not accept {n} connection(s): {error} (open-file limit {files})",
}


def open_file_limit() -> tuple[int, int]:
    """The soft RLIMIT_NOFILE raised to the hard one (at most MAX_OPEN_FILES): (the soft limit now, the hard one)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    ceiling = MAX_OPEN_FILES if hard == resource.RLIM_INFINITY else min(hard, MAX_OPEN_FILES)
    if soft == resource.RLIM_INFINITY or soft >= ceiling:
        return soft, hard
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (ceiling, hard))
    except (ValueError, OSError):
        return soft, hard
    return ceiling, hard


def connection_limit(max_connections: int, soft_files: int) -> int:
    """Connections held at once: `max_connections`, or fewer where the open-file limit leaves less room (what is
    open now and RESERVED_FILES kept free), at least one."""
    try:
        in_use = len(os.listdir("/proc/self/fd"))
    except OSError:
        in_use = 64
    return max(1, min(max_connections, soft_files - in_use - RESERVED_FILES))


class ConnectionGuard:
    """What the connections of one server share: the header timeout, the limit, the open connections, those waiting
    for their request headers (oldest first) and the rate-limited notes."""

    def __init__(self, header_timeout: float, limit: int, files: int, clock: Callable[[], float] = time.monotonic):
        self.header_timeout, self.limit, self.files = float(header_timeout), int(limit), files
        self.open: set[Any] = set()
        self.waiting: dict[Any, None] = {}  # insertion order: the oldest first
        self._clock = clock
        self._counts: dict[str, int] = {}  # refusals of each kind not yet logged
        self._last: dict[str, float] = {}  # when each kind was last logged
        self._extra: dict[str, str] = {}
        self._flush: asyncio.TimerHandle | None = None

    def note(self, kind: str, **extra: str) -> None:
        """One refusal of `kind`: logged at once if its kind was not logged in the last NOTE_INTERVAL seconds, else
        counted and logged with the others when the interval is up (or at shutdown)."""
        self._counts[kind] = self._counts.get(kind, 0) + 1
        self._extra.update(extra)
        last = self._last.get(kind)
        if last is None or self._clock() - last >= NOTE_INTERVAL:
            self._log(kind)
        elif self._flush is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return
            self._flush = loop.call_later(max(0.0, last + NOTE_INTERVAL - self._clock()), self.flush)

    def flush(self) -> None:
        """Log what was counted and not yet logged (each kind one line)."""
        self._flush = None
        for kind in [k for k, n in self._counts.items() if n]:
            self._log(kind)

    def _log(self, kind: str) -> None:
        n = self._counts.pop(kind, 0)
        if not n:
            return
        first = kind not in self._last
        self._last[kind] = self._clock()
        line = _WHAT[kind].format(n=n, t=self.header_timeout, limit=self.limit, files=self.files,
                                  error=self._extra.get("error", "?"))
        log.warning("esqbe: %s%s", line, "; more are counted and logged at most once a minute" if first else
                    " since the last line about them")

    def opened(self, conn) -> bool:
        """A new connection: False where it must be closed at once (no room: every open one has a request in hand).
        At the limit, the oldest connection still waiting for its headers is closed instead."""
        self.open.add(conn)
        if len(self.open) <= self.limit:
            return True
        victim = next(iter(self.waiting), None)
        if victim is None:
            self.note("refused")
            self.closed(conn)
            return False
        self.note("evicted")
        victim.close_now()
        return True

    def closed(self, conn) -> None:
        self.open.discard(conn)
        self.waiting.pop(conn, None)

    def accept_failed(self, loop: asyncio.AbstractEventLoop, context: dict) -> None:
        """The loop's exception handler: a failed accept (out of open files) is a note, not a traceback a second;
        anything else goes to the loop's default handler."""
        exc = context.get("exception")
        source = f"{context.get('message', '')} {context.get('handle', '')}"
        if "socket.accept()" in source or "_start_serving" in source or "_accept_connection" in source:
            self.note("accept", error=str(exc) if exc is not None else context.get("message", "?"))
            return
        loop.default_exception_handler(context)


def guarded_protocol(guard: ConnectionGuard) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol with the header timeout and the connection limit of `guard`."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class GuardedH11Protocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            if guard.opened(self):
                self._await_request()
            else:
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            cycle = self.cycle
            if cycle is None or cycle.response_complete:  # between requests: these are a new request's first bytes
                self._await_request()
            super().data_received(data)
            if self.cycle is not cycle:  # its request line and headers are in
                self._request_arrived()

        def connection_lost(self, exc: Exception | None) -> None:
            self._request_arrived()
            guard.closed(self)
            super().connection_lost(exc)

        def _await_request(self) -> None:
            if self._header_timer is None:
                self._header_timer = self.loop.call_later(guard.header_timeout, self._headers_late)
                guard.waiting[self] = None

        def _request_arrived(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None
            guard.waiting.pop(self, None)

        def _headers_late(self) -> None:
            self._header_timer = None
            guard.note("header_timeout")
            self.close_now()

        def close_now(self) -> None:
            """Close the connection at once (it holds no request: nothing is answered)."""
            self._request_arrived()
            guard.closed(self)
            self.transport.close()

    return GuardedH11Protocol
