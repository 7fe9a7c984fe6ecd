"""Deadlines and cancellation for one piece of work (a query), checked cooperatively.

The work runs `with Deadline(seconds):` (or `with token:` for a token made elsewhere, such as
`esqbe serve`'s, which also cancels it when the client goes away); the query path calls `check()`
between its stages and inside its long loops (Sinkhorn's blocks, the encoder's batches), which
raises `Cancelled` once the deadline has passed or the token was cancelled. Outside such a block
`check()` costs a context-variable read and does nothing.
"""
from __future__ import annotations

import contextvars
import threading
import time
from typing import ClassVar

from ..errors import EsqbeError

_CURRENT: contextvars.ContextVar[Deadline | None] = contextvars.ContextVar("esqbe_deadline", default=None)


class Cancelled(EsqbeError):
    """The work passed its deadline or was cancelled (its client went away); `reason` says which. Over HTTP
    a timeout is 504, a cancelled request (the client gone, a shutdown) 503."""

    http_status: ClassVar[int] = 504

    def __init__(self, reason: str, *, timed_out: bool):
        super().__init__(reason)
        self.timed_out = timed_out
        if not timed_out:
            self.http_status = 503  # type: ignore[misc]  # this one was cancelled, not too slow


class Deadline:
    """A cancellation token with an optional deadline `seconds` from now (None: none, only `cancel()`)."""

    def __init__(self, seconds: float | None = None):
        self.seconds = seconds
        self.expires = None if seconds is None else time.monotonic() + float(seconds)
        self._cancelled: str | None = None
        self._lock = threading.Lock()
        self._entered = threading.local()  # per thread: one token may be entered on several threads at once

    def cancel(self, reason: str = "cancelled") -> None:
        with self._lock:
            if self._cancelled is None:
                self._cancelled = reason

    @property
    def cancelled(self) -> str | None:
        return self._cancelled

    def remaining(self) -> float | None:
        return None if self.expires is None else self.expires - time.monotonic()

    def check(self) -> None:
        if self._cancelled is not None:
            raise Cancelled(self._cancelled, timed_out=False)
        if self.expires is not None and time.monotonic() >= self.expires:
            raise Cancelled(f"the request took longer than its {self.seconds:g} s deadline and was abandoned",
                            timed_out=True)

    def __enter__(self) -> Deadline:
        self.check()  # work that waited past its deadline (in a queue) does not start
        self._stack().append(_CURRENT.set(self))
        return self

    def __exit__(self, *exc) -> None:
        _CURRENT.reset(self._stack().pop())

    def _stack(self) -> list:
        stack = getattr(self._entered, "tokens", None)
        if stack is None:
            stack = self._entered.tokens = []
        return stack


def active() -> bool:
    """Whether the work this thread runs is under a deadline (a cancellation token)."""
    return _CURRENT.get() is not None


def check() -> None:
    """Raise `Cancelled` if the work this thread runs is past its deadline or cancelled."""
    current = _CURRENT.get()
    if current is not None:
        current.check()
