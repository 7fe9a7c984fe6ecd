"""A query answered by a running `esqbe serve` (what `esqbe query` does when one serves its index, or with
`--server URL`): the command line's query as the HTTP API's own request (`models.QueryRequest`, validated here
before it is sent), POST /query, and the result in the one JSON shape (esqbe.query.result_json) back.

Standard library HTTP (urllib): one request per command, no connection pool to keep. Loopback URLs are asked
directly, never through a proxy from the environment."""
from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..errors import EXIT_ERROR, EXIT_SERVER, EsqbeError, UserError
from ..settings.config import Settings
from ..settings.table import BY_NAME
from .discovery import INDEX_HEADER, find_servers, forget, is_loopback_url

#: seconds a query waits for a server's answer by default (the server gives up on its own after its
#: request_timeout, 30 s by default, and answers 504)
DEFAULT_TIMEOUT_S = 60.0


class ServerUnavailableError(EsqbeError):
    """A server named with `esqbe query --server URL` did not answer: unreachable, timed out, or failed (5xx)."""

    exit_status: ClassVar[int] = EXIT_SERVER
    http_status: ClassVar[int] = 502

    def __init__(self, message: str, *, status: int | None = None, connection_refused: bool = False):
        super().__init__(message)
        self.status = status
        self.connection_refused = connection_refused


class ServerRefusedError(UserError):
    """A server refused the query as asked (a 4xx answer): its message, as a local query would fail."""

    exit_status: ClassVar[int] = EXIT_ERROR

    def __init__(self, message: str, *, status: int):
        super().__init__(message)
        self.status = status


class NotSendable(Exception):
    """The query has something the HTTP API does not carry (a setting that is not an HTTP field, a value past the
    HTTP bounds, word vectors by directory): it is answered here."""


def request_body(*, paper_id: str | None, facet: str | None, sentences: list[int] | None, text: str | None,
                 title: str, filters: list[str], engine_filter: dict | None, overrides: dict) -> dict[str, Any]:
    """The POST /query body for a command-line query: `overrides` are the query settings given (Settings field ->
    value), placed at their HTTP fields (esqbe.settings.table); checked by the server's own model."""
    from pydantic import ValidationError

    from .models import QueryRequest

    body: dict[str, Any] = {"paper_id": paper_id, "text": text, "title": title or "", "facet": facet,
                            "sentences": sentences, "filters": filters or None, "engine_filter": engine_filter}
    body = {k: v for k, v in body.items() if v is not None}
    for name, value in overrides.items():
        setting = BY_NAME[name]
        if name == "rescorer_params":
            if "words" in value:
                raise NotSendable("--param words names a directory here; a server offers word vectors by name")
            body["rescorer_params"] = value
        elif setting.http:
            *parents, leaf = setting.http.split(".")
            slot = body
            for part in parents:
                slot = slot.setdefault(part, {})
            slot[leaf] = value
        else:
            raise NotSendable(f"{setting.flag or name} is not a setting a server takes over HTTP")
    try:
        QueryRequest.model_validate(body)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first.get("loc", ())) or "body"
        raise NotSendable(f"{where}: {first.get('msg')}") from None
    return body


def post_query(url: str, body: dict, *, timeout: float = DEFAULT_TIMEOUT_S,
               token: str | None = None) -> tuple[dict, dict[str, str]]:
    """POST /query to the server at `url`: (the result, the response's headers, names in lower case)."""
    data = json.dumps(body, ensure_ascii=False).encode("utf-8")
    request = urllib.request.Request(url.rstrip("/") + "/query", data=data, method="POST",
                                     headers={"Content-Type": "application/json", "Accept": "application/json"})
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    handlers = [urllib.request.ProxyHandler({})] if is_loopback_url(url) else []
    opener = urllib.request.build_opener(*handlers)
    try:
        with opener.open(request, timeout=timeout) as answer:
            payload = answer.read()
            headers = {k.lower(): v for k, v in answer.headers.items()}
    except urllib.error.HTTPError as e:
        message = _error_message(e)
        if 400 <= e.code < 500:
            raise ServerRefusedError(f"the server at {url} refused the query ({e.code}): {message}",
                                     status=e.code) from None
        raise ServerUnavailableError(f"the server at {url} failed ({e.code}): {message}", status=e.code) from None
    except TimeoutError:
        raise ServerUnavailableError(f"the server at {url} did not answer within {timeout:g} s") from None
    except urllib.error.URLError as e:
        reason = e.reason
        if isinstance(reason, TimeoutError):
            raise ServerUnavailableError(f"the server at {url} did not answer within {timeout:g} s") from None
        raise ServerUnavailableError(f"the server at {url} cannot be reached: {reason}",
                                     connection_refused=isinstance(reason, ConnectionRefusedError)) from None
    except (OSError, ValueError) as e:  # a connection reset midway, a malformed URL
        raise ServerUnavailableError(f"the server at {url} cannot be reached: {e}") from None
    try:
        result = json.loads(payload)
    except ValueError:
        raise ServerUnavailableError(f"the server at {url} answered something that is not JSON") from None
    if not isinstance(result, dict) or "hits" not in result or "query" not in result:
        raise ServerUnavailableError(f"the server at {url} answered something that is not a query result") from None
    return result, headers


def _error_message(e: urllib.error.HTTPError) -> str:
    """The message of an esqbe error body ({"error": {"message"}}), else the status's reason."""
    try:
        body = json.loads(e.read(65536))
        return str(body["error"]["message"])
    except Exception:  # noqa: BLE001  (not an esqbe server, or no body)
        return str(e.reason)


@dataclass
class Answer:
    """What asking a server came to: its `result` (None: answer the query here), `served` (the line saying which
    server answered), `warnings` (why a server that was there did not answer), `notes` (why none was asked)."""

    result: dict | None = None
    served: str | None = None
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


#: a found server's refusals that a local run would give as well (the query's own fault): reported, not retried
_QUERY_FAULTS = frozenset({400, 404, 409})


def ask_server(settings: Settings, *, url: str | None = None, timeout: float = DEFAULT_TIMEOUT_S, token: str | None = None,
               paper_id: str | None, facet: str | None, sentences: list[int] | None, text: str | None, title: str,
               filters: list[str], engine_filter: dict | None, overrides: dict) -> Answer:
    """A query for the index of `settings` answered by a server: `url` (named by the user: its failures are errors,
    NotSendable included), else one that serves this index with these settings (its discovery record,
    esqbe.server.discovery), whose failures leave the query to be answered here (`Answer.result` None). `token` goes
    to the server named by `url` (a private one asks for it), never to a found one.

    A found server answers with this command's settings: its own settings must equal them (the record's digests),
    and the result count the query would have here (`k`, a facet's own included) is sent with the query."""
    query: dict[str, Any] = dict(paper_id=paper_id, facet=facet, sentences=sentences, text=text, title=title, filters=filters,
                 engine_filter=engine_filter)
    if url is not None:
        result, _ = post_query(url, request_body(**query, overrides=overrides), timeout=timeout, token=token)
        return Answer(result, served=f"answered by the server at {url}")
    servers, notes = find_servers(settings)
    answer = Answer(notes=notes)
    if not servers:
        return answer
    try:
        body = request_body(**query, overrides=_as_here(settings, facet, overrides))
    except (NotSendable, EsqbeError) as e:
        answer.notes.append(f"the server at {servers[0].url} is not asked: {e}")
        return answer
    for server in servers:
        try:
            result, headers = post_query(server.url, body, timeout=timeout)
        except ServerRefusedError as e:
            if e.status in _QUERY_FAULTS:
                raise
            answer.warnings.append(f"{e}; answering here")
            return answer
        except ServerUnavailableError as e:
            if e.connection_refused:  # nothing listens there any more: a stale record
                forget(server)
                continue
            answer.warnings.append(f"{e}; answering here")
            return answer
        if headers.get(INDEX_HEADER.lower()) != server.index_id:
            answer.warnings.append(f"the server at {server.url} answers for another index than its record says; "
                                   "answering here")
            return answer
        answer.result = result
        answer.served = f"answered by the server at {server.url} (esqbe serve, pid {server.pid}; --no-server: here)"
        return answer
    return answer


def _as_here(settings: Settings, facet: str | None, overrides: dict) -> dict:
    """The query's overrides, with what a local run would use where the server's request model has another default:
    the result count `k` (the model's default is the table's; here a config or a facet's own may set it), and the
    settings' rescorer parameters with another rescorer (the server would reset them)."""
    from ..query.search import settings_for_facet

    here = settings_for_facet(settings, facet)
    out = dict(overrides)
    out.setdefault("k", here.k)
    if "rescorer" in out and "rescorer_params" not in out and here.rescorer_params:
        out["rescorer_params"] = dict(here.rescorer_params)
    return out
