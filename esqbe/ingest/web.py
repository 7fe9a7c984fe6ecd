"""The HTTP a followed service is asked through (esqbe.ingest.arxiv, esqbe.ingest.openalex): an httpx2 transport that
keeps each service's rules whatever client sits on it.

- one connection, and one request at a time, at most one every `interval` seconds (arXiv: 3 s);
- a timeout on every request (connect, and again each read), a User-Agent naming esqbe and its version (and the
  `mailto` address where one is set), no redirect followed (a 3xx is an answer like any other: refused by its caller);
- an answer read up to `max_bytes` and refused past it before more is read (a huge page never fills the memory);
- 503 and 429 waited for as their Retry-After says (seconds or an HTTP date), at most `max_retry_after` seconds
  (a longer wait ends the source's run: FetchError), another 5xx or a failed connection tried again after 1, 2, 4...
  seconds; at most `retries` times, then FetchError naming the service and what it answered;
- `check(body)`, where given, sees every answer's body before the client does (arXiv's: defusedxml, so no XML
  with a DTD or an entity reaches a parser that would expand it).

Waits go through `stop` (an esqbe.core.deadline.Deadline, or None): a run that is cancelled stops waiting at once.
"""
from __future__ import annotations

import email.utils
import math
import threading
import time
import typing
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import httpx2

from ..errors import BackendError

#: the statuses a service answers for "not now": waited for as their Retry-After says
BUSY = (429, 503)
#: the first wait after another 5xx or a failed connection, doubled each time after
BACKOFF_START = 1.0


class FetchError(BackendError):
    """A followed service could not be asked, or kept failing (timeouts, 5xx, a Retry-After past the longest
    honoured), or refused the request (4xx): that source's run stops there (what it committed stays) and the next
    source runs. `status`: the HTTP status it answered last, where it answered."""

    def __init__(self, message: str = "", *args, status: int | None = None, **kw):
        super().__init__(message, *args, **kw)
        self.status = status


class AnswerError(FetchError):
    """A followed service answered something its protocol does not (not well-formed, an XML entity or DTD, a page
    past `follow_max_page_bytes`, an unknown shape): refused, naming the source and page."""


def user_agent(mailto: str | None = None) -> str:
    """`esqbe/VERSION`, with `(+mailto:ADDRESS)` where an address is set (the services ask for one to write to)."""
    try:
        from importlib.metadata import version

        ours = version("esqbe")
    except Exception:  # noqa: BLE001 (run from a source tree without the package installed)
        ours = "0"
    return f"esqbe/{ours}" + (f" (+mailto:{mailto})" if mailto else "")


def retry_after(value: str | None, now: float | None = None) -> float | None:
    """A Retry-After header's wait in seconds (delay-seconds, or an HTTP date), or None where it says neither."""
    if value is None:
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


class PoliteTransport(httpx2.BaseTransport):
    """One service's transport (see the module's notes). `name` names the service in errors; `sleep(seconds)` is
    how it waits (a test may count the waits); `stop` a Deadline whose cancellation ends a wait."""

    def __init__(self, name: str, *, interval: float, timeout: float, max_bytes: int, retries: int,
                 max_retry_after: float, check: Callable[[bytes], None] | None = None, stop=None,
                 sleep: Callable[[float], None] | None = None):
        self.name, self.interval, self.max_bytes = name, float(interval), int(max_bytes)
        self.retries, self.max_retry_after, self.check, self.stop = int(retries), float(max_retry_after), check, stop
        self.timeout = float(timeout)
        self._sleep = sleep or self._wait
        self._inner = httpx2.HTTPTransport(limits=httpx2.Limits(max_connections=1, max_keepalive_connections=1))
        self._one = threading.Lock()  # one request at a time, whoever asks
        self._last = -math.inf  # when the last request ended (monotonic)
        #: the waits a service asked for (Retry-After, seconds), in order: the run's summary reports them
        self.waited: list[float] = []
        #: requests sent, answers refused
        self.requests = 0

    def _wait(self, seconds: float) -> None:
        if seconds <= 0:
            return
        if self.stop is None:
            time.sleep(seconds)
            return
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            self.stop.check()  # Cancelled once the run is cancelled
            time.sleep(min(left, 0.2))
        self.stop.check()

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        with self._one:
            attempt = 0
            while True:
                self._sleep(self._last + self.interval - time.monotonic())
                try:
                    status, headers, body = self._send(request)
                except AnswerError:
                    raise
                except (httpx2.TransportError, OSError) as e:
                    if attempt >= self.retries:
                        raise FetchError(f"{self.name} could not be reached after {attempt + 1} tries: "
                                         f"{type(e).__name__}: {e}") from None
                    self._sleep(BACKOFF_START * 2 ** attempt)
                    attempt += 1
                    continue
                finally:
                    self._last = time.monotonic()
                if status in BUSY or 500 <= status < 600:
                    wait = retry_after(headers.get("retry-after")) if status in BUSY else None
                    if wait is not None and wait > self.max_retry_after:
                        raise FetchError(f"{self.name} answered {status} asking to wait {wait:g} s, longer than the "
                                         f"{self.max_retry_after:g} s honoured (follow_max_retry_after): this source's "
                                         "run stops here and goes on at the next")
                    if attempt >= self.retries:
                        raise FetchError(f"{self.name} answered {status} {attempt + 1} times (follow_retries "
                                         f"{self.retries}): this source's run stops here and goes on at the next",
                                         status=status)
                    if wait is not None:
                        self.waited.append(wait)
                    self._sleep(wait if wait is not None else BACKOFF_START * 2 ** attempt)
                    attempt += 1
                    continue
                if not 200 <= status < 300:  # a redirect is not followed; a 4xx is the request's fault, said as is
                    said = " ".join(body[:300].decode("utf-8", "replace").split())
                    where = f" to {headers['location'][:200]} (not followed: give the new address with --source-url)" \
                        if 300 <= status < 400 and "location" in headers else f": {said}" if said else ""
                    raise FetchError(f"{self.name} answered HTTP {status}{where}", status=status)
                if self.check is not None:
                    self.check(body)
                return httpx2.Response(status, headers=headers, content=body, request=request)

    def _send(self, request: httpx2.Request) -> tuple[int, httpx2.Headers, bytes]:
        """One request; the answer read whole up to `max_bytes` (AnswerError past it, the rest not read), a gzip or
        deflate body decoded here, bounded the same way (a small compressed page cannot unpack into gigabytes)."""
        request.extensions["timeout"] = httpx2.Timeout(self.timeout).as_dict()
        request.headers["Accept-Encoding"] = "gzip, deflate"
        self.requests += 1
        response = self._inner.handle_request(request)
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("identity", "gzip", "x-gzip", "deflate", ""):
            response.close()
            raise AnswerError(f"{self.name} sent its answer in the {encoding[:40]!r} encoding, which esqbe did not ask "
                              "for (gzip, deflate)")
        unpack = zlib.decompressobj(zlib.MAX_WBITS | 32) if encoding not in ("identity", "") else None
        parts, size = [], 0
        try:
            declared = response.headers.get("content-length")
            if unpack is None and declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
                raise self._too_large(int(declared))
            for chunk in typing.cast(httpx2.SyncByteStream, response.stream):
                if unpack is not None:
                    try:
                        chunk = unpack.decompress(chunk, self.max_bytes + 1 - size)
                    except zlib.error as e:
                        raise AnswerError(f"{self.name} sent a {encoding} answer that does not decode: {e}") from None
                size += len(chunk)
                if size > self.max_bytes or (unpack is not None and unpack.unconsumed_tail):
                    raise self._too_large(None)
                parts.append(chunk)
        finally:
            response.close()
        headers = httpx2.Headers([(k, v) for k, v in response.headers.items()
                                  if k.lower() not in ("content-encoding", "transfer-encoding", "content-length")])
        return response.status_code, headers, b"".join(parts)

    def _too_large(self, declared: int | None) -> AnswerError:
        said = f"{declared:,} bytes" if declared is not None else f"over {self.max_bytes:,} bytes"
        return AnswerError(f"{self.name} sent an answer of {said}; at most {self.max_bytes:,} are read "
                           "(follow_max_page_bytes)")

    def close(self) -> None:
        self._inner.close()


def client(transport: PoliteTransport, mailto: str | None = None, accept: str = "*/*") -> httpx2.Client:
    """An httpx2 client over `transport`: esqbe's User-Agent, no redirects followed, the transport's timeout."""
    return httpx2.Client(transport=transport, headers={"User-Agent": user_agent(mailto), "Accept": accept},
                         timeout=transport.timeout, follow_redirects=False)


def utc_day(seconds: float | None = None) -> str:
    """The UTC date of `seconds` (now, when None) as YYYY-MM-DD: the day granularity OAI-PMH and OpenAlex take."""
    return datetime.fromtimestamp(time.time() if seconds is None else seconds, UTC).date().isoformat()


@dataclass
class Page:
    """One page a followed service answered: its records in one of the readers' formats (esqbe.ingest.formats: what
    `esqbe index` reads), the papers its source says are gone (`{"id", "when"}`), the records refused before they
    could be read (off the protocol: named with the page), those of another category, and the source's state to keep
    once this page's papers are committed (where the next run goes on)."""

    label: str
    fmt: str
    records: list[dict] = field(default_factory=list)
    deleted: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    filtered: int = 0
    state: dict = field(default_factory=dict)
