"""The engine client side both engines share: the retries around each call (429, 5xx and connection errors,
waiting exponentially), the engine-specific hooks the engine modules supply, and engine errors in words."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import Any

from ...errors import BackendError
from .versions import EngineInfo

#: HTTP statuses worth another try: too many requests, server errors, gateway/availability errors
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


class _RetryLater(Exception):
    """Some bulk items failed with a retryable status; the listed ids go again."""


class _ItemRetry(Exception):
    """One search inside `_msearch` failed with a retryable status."""

    def __init__(self, status: int, error: Any):
        super().__init__(f"{status}: {_reason(error)}")
        self.status_code = status


def _exc_reason(exc: BaseException) -> str:
    """A client exception's engine error, shortly: `type: reason` when the body holds one."""
    body = getattr(exc, "body", None)
    if body is None:
        body = getattr(exc, "info", None)  # opensearch-py
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return _reason(body["error"])
    return str(exc)[:300]


def _error_type(error: Any) -> str:
    return str(error.get("type", "")) if isinstance(error, dict) else ""


def _reason(error: Any) -> str:
    if isinstance(error, dict):
        cause = error.get("caused_by") or {}
        reason = f"{error.get('type', 'error')}: {error.get('reason', '')}"
        if isinstance(cause, dict) and cause.get("reason"):
            reason += f" (caused by {cause.get('type')}: {cause.get('reason')})"
        return reason
    return str(error)


def _describe(info: dict) -> str:
    status = info.get("status")
    text = _reason(info.get("error", info))
    return f"{status} {text}" if status not in (None, "N/A") else text


class ClientMixin(ABC):
    """The engine client, the retries around each of its calls and bulk requests with per-item retries (mixed
    into EngineBackend); the engine modules supply the client and read its errors."""

    name: str
    url: str
    index: str
    client: Any
    #: tries per request (and per bulk item), and the exponential wait between them (EngineBackend sets them)
    retry_attempts: int
    retry_wait_initial: float
    retry_wait_max: float

    # --- engine-specific hooks ---------------------------------------------------------------

    @abstractmethod
    def _make_client(self, url: str, *, api_key, username, password, ca_certs, verify_certs, request_timeout) -> Any: ...

    @abstractmethod
    def _probe(self) -> EngineInfo:
        """GET / : which engine and version answers (and adapt the client to it)."""

    @abstractmethod
    def _status(self, exc: BaseException) -> int | None:
        """HTTP status of a client exception (None for connection errors and non-client errors)."""

    @abstractmethod
    def _is_connection_error(self, exc: BaseException) -> bool: ...

    @abstractmethod
    def _streaming_bulk(self, actions: list[dict]) -> Iterable[tuple[bool, dict]]: ...

    # --- plumbing ------------------------------------------------------------------------------

    def _retryable(self, exc: BaseException) -> bool:
        if isinstance(exc, _ItemRetry):
            return True
        return self._is_connection_error(exc) or self._status(exc) in RETRY_STATUSES

    def _retrying(self):
        from tenacity import (
            Retrying,
            retry_if_exception,
            stop_after_attempt,
            wait_exponential,
        )

        return Retrying(
            retry=retry_if_exception(self._retryable),
            wait=wait_exponential(multiplier=self.retry_wait_initial, max=self.retry_wait_max),
            stop=stop_after_attempt(self.retry_attempts),
            reraise=True,
        )

    def _call(self, fn: Callable, *args, **kwargs):
        """One client call, retried on 429/5xx/connection errors with exponential backoff."""
        return self._retrying()(fn, *args, **kwargs)

    def _body(self, resp: Any) -> Any:
        return getattr(resp, "body", resp)

    def _error(self, what: str, exc: BaseException) -> BackendError:
        return BackendError(f"{self.name} at {self.url}, index {self.index!r}: {what} failed: {exc}")

    def _bulk(self, actions: list[dict]) -> dict[str, tuple[bool, dict]]:
        """Send bulk actions (each with `_id`); retry items failing with 429/5xx and whole chunks failing
        on connection errors, waiting exponentially. Returns id -> (ok, item info) for every action."""
        from tenacity import (
            RetryError,
            Retrying,
            retry_if_exception_type,
            stop_after_attempt,
            wait_exponential,
        )

        pending = {a["_id"]: a for a in actions}
        results: dict[str, tuple[bool, dict]] = {}
        last_error: dict[str, str] = {}

        def send_round() -> None:
            nonlocal pending
            retry: dict[str, dict] = {}
            seen: set[str] = set()
            try:
                for ok, item in self._streaming_bulk(list(pending.values())):
                    _op, info = next(iter(item.items()))
                    pid = str(info.get("_id"))
                    seen.add(pid)
                    exc = info.get("exception")
                    if not ok and (info.get("status") in RETRY_STATUSES or (exc is not None and self._retryable(exc))):
                        retry[pid] = pending[pid]
                        last_error[pid] = _describe(info)
                    else:
                        results[pid] = (ok, info)
            except Exception as exc:
                if not self._retryable(exc):
                    raise self._error("bulk indexing", exc) from exc
                for pid, action in pending.items():
                    if pid not in seen:
                        retry[pid] = action
                        last_error[pid] = str(exc)
            pending = retry
            if pending:
                raise _RetryLater()

        try:
            for attempt in Retrying(
                retry=retry_if_exception_type(_RetryLater),
                wait=wait_exponential(multiplier=self.retry_wait_initial, max=self.retry_wait_max),
                stop=stop_after_attempt(self.retry_attempts),
            ):
                with attempt:
                    send_round()
        except RetryError:
            for pid in pending:
                results[pid] = (False, {"_id": pid, "error": f"gave up after {self.retry_attempts} tries: {last_error.get(pid)}"})
        return results
