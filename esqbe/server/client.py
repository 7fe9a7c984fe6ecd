"""A query answered by a running `esqbe serve` (what `esqbe query` does when one serves its index, or with
`--server URL`): the command line's query as the HTTP API's own request (`models.QueryRequest`, validated here
before it is sent), POST /query, and the result in the one JSON shape (esqbe.query.results) back.

The server's answer is as hostile as any input. Standard library HTTP (http.client, one connection per command):
- it never follows a redirect (http.client has none to follow): a 3xx is an error that names it, so the bearer
  token goes nowhere but the URL given;
- the answer is read in bounded pieces up to `answer_cap(k)` (what k hits can take; a declared Content-Length
  past it is refused before a byte of the body is read), an error body up to 64 KiB;
- one deadline covers the whole exchange, connecting, the proof, sending and reading: a watchdog shuts the
  connection when it passes, so a server dripping a byte at a time cannot stretch it read by read;
- the answer must be the API's own response model (`models.QueryResponse`, finite numbers): anything else, like
  any of the above, is the server's fault (ServerUnavailableError, exit 4), never a crash.

A server found by its discovery record first proves it wrote that record (`GET /proof`, esqbe.server.discovery);
the query goes over the same connection only after the proof holds. Loopback URLs are asked directly; another
`--server` URL goes through the environment's proxy (`http_proxy`, `https_proxy`, `no_proxy`) as urllib would."""
from __future__ import annotations

import base64
import http.client
import json
import socket
import ssl
import threading
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..errors import EXIT_ERROR, EXIT_SERVER, EsqbeError, UserError
from ..settings.config import Settings
from ..settings.table import BY_NAME, SETTINGS
from .discovery import INDEX_HEADER, PROOF_PATH, Server, find_servers, forget, is_loopback_url, new_nonce, proof_holds

#: seconds a query waits for a server's answer by default (the server gives up on its own after its
#: request_timeout, 30 s by default, and answers 504)
DEFAULT_TIMEOUT_S = 60.0
#: the bytes an answer of k hits may take: a base (the query's own sentences, up to 100,000 characters) and per hit
#: (its metadata is at most 1 MB, esqbe.domain.LIMITS; its title and matched sentences), and at most MAX_ANSWER_BYTES
ANSWER_BASE_BYTES = 16 << 20
ANSWER_HIT_BYTES = 2 << 20
MAX_ANSWER_BYTES = 256 << 20
#: the bytes read of an error's body or of a proof
SMALL_ANSWER_BYTES = 64 << 10
_CHUNK = 64 << 10


def answer_cap(k: object) -> int:
    """The most bytes the answer to a query for `k` hits may have (k not given: the API's largest)."""
    hits = k if isinstance(k, int) and not isinstance(k, bool) and 0 < k <= 1000 else 1000
    return min(MAX_ANSWER_BYTES, ANSWER_BASE_BYTES + ANSWER_HIT_BYTES * hits)


class ServerUnavailableError(EsqbeError):
    """A server named with `esqbe query --server URL` did not answer: unreachable, timed out, failed (5xx),
    redirected, or answered something that is not a query result (too large, not the API's response model)."""

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


class NotProven(Exception):
    """A listener at a discovery record's URL that did not prove it holds the record's secret (why: the message)."""


def _shown(text: object, n: int = 200) -> str:
    """A value from a server's answer as one short printable line (it goes to a terminal)."""
    out = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))
    return out if len(out) <= n else out[: n - 1] + "…"


def _proxy(parts: urllib.parse.SplitResult) -> urllib.parse.SplitResult | None:
    """The environment's proxy for a URL that is not on loopback, as urllib would choose it (None: direct)."""
    if is_loopback_url(urllib.parse.urlunsplit(("http", parts.netloc, "", "", ""))):  # (https too)
        return None
    found = urllib.request.getproxies().get(parts.scheme)
    if not found or urllib.request.proxy_bypass(parts.netloc.rpartition("@")[2]):
        return None
    proxy = urllib.parse.urlsplit(found if "://" in found else f"http://{found}")
    return proxy if proxy.hostname else None


class _Connection:
    """One HTTP connection to the server at `url`, under one deadline (`timeout` seconds from now) for everything
    said on it; requests go one after another over this same connection, never a new one."""

    def __init__(self, url: str, timeout: float):
        self.url, self.timeout = url, timeout
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ServerUnavailableError(f"{_shown(url)} is not an http:// or https:// URL")
        try:
            port = parts.port
        except ValueError:
            raise ServerUnavailableError(f"{_shown(url)} has no valid port") from None
        self.base = parts.path.rstrip("/")
        self.proxy_headers: dict[str, str] = {}
        proxy = _proxy(parts)
        https = parts.scheme == "https"
        kind: Any = http.client.HTTPSConnection if https else http.client.HTTPConnection
        extra: dict[str, Any] = {"context": ssl.create_default_context()} if https else {}
        if proxy is None:
            self.conn = kind(parts.hostname, port, timeout=timeout, **extra)
        else:
            auth = {}
            if proxy.username is not None:
                who = f"{urllib.parse.unquote(proxy.username)}:{urllib.parse.unquote(proxy.password or '')}"
                auth = {"Proxy-Authorization": "Basic " + base64.b64encode(who.encode()).decode()}
            self.conn = kind(proxy.hostname, proxy.port, timeout=timeout, **extra)
            if https:  # a CONNECT tunnel through the proxy, TLS to the server itself
                self.conn.set_tunnel(parts.hostname, port, headers=auth)
            else:  # the absolute URL to the proxy
                self.base = urllib.parse.urlunsplit((parts.scheme, parts.netloc, self.base, "", ""))
                self.proxy_headers = auth
        self.expired = False
        self._timer = threading.Timer(timeout, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def _expire(self) -> None:
        """The deadline passed: shut the socket, which ends a read or a send waiting on it at once."""
        self.expired = True
        sock = self.conn.sock
        if sock is not None:
            try:
                socket.socket.shutdown(sock, socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self._timer.cancel()
        self.conn.close()

    def __enter__(self) -> _Connection:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _late(self) -> ServerUnavailableError:
        return ServerUnavailableError(f"the server at {self.url} did not answer within {self.timeout:g} s")

    def exchange(self, method: str, path: str, *, body: bytes | None = None, headers: dict[str, str],
                 cap: int) -> tuple[int, dict[str, str], bytes | bytearray]:
        """One request and its whole answer: (status, headers with names in lower case, body), the body of a
        non-2xx answer cut at SMALL_ANSWER_BYTES; a 2xx body past `cap` bytes is the server's fault."""
        connecting = False
        try:
            if self.conn.sock is None and not self.conn.auto_open:
                raise ServerUnavailableError(f"the server at {self.url} closed the connection it proved itself on")
            if self.conn.sock is None:
                connecting = True  # (TLS included: a certificate refused is a server that cannot be reached)
                self.conn.connect()
                connecting = False
                self.conn.auto_open = 0  # every later request goes over this connection or fails
            if self.expired:
                raise self._late()
            self.conn.request(method, self.base + path, body=body, headers={**headers, **self.proxy_headers})
            answer = self.conn.getresponse()
            status = answer.status
            got = {k.lower(): v for k, v in answer.getheaders()}
            limit = cap if 200 <= status < 300 else SMALL_ANSWER_BYTES
            declared = got.get("content-length", "")
            if 200 <= status < 300 and declared.isdigit() and int(declared) > cap:
                raise ServerUnavailableError(f"the server at {self.url} announced an answer of {int(declared)} bytes, "
                                             f"more than a query's answer can be ({cap >> 20} MiB): not read")
            data = bytearray()
            while len(data) <= limit:
                piece = answer.read(min(_CHUNK, limit + 1 - len(data)))
                if self.expired:
                    raise self._late()
                if not piece:
                    break
                data += piece
            if len(data) > limit:
                if 200 <= status < 300:
                    raise ServerUnavailableError(f"the server at {self.url} answered more than a query's answer can be "
                                                 f"({cap >> 20} MiB): not read further")
                del data[limit:]
                self.conn.close()  # the rest is never read: this connection carries nothing more
            elif not answer.isclosed() or answer.length:  # cut short (a Content-Length not reached)
                raise http.client.IncompleteRead(b"")
            return status, got, data  # (not copied: it may be most of the cap)
        except ServerUnavailableError:
            raise
        except (TimeoutError, OSError, http.client.HTTPException, ValueError) as e:
            if self.expired or isinstance(e, TimeoutError):
                raise self._late() from None
            refused = isinstance(e, ConnectionRefusedError)
            why = "cannot be reached" if connecting else "broke off the exchange"
            raise ServerUnavailableError(f"the server at {self.url} {why}: {_shown(e) or type(e).__name__}",
                                         connection_refused=refused) from None

    def prove(self, server: Server) -> None:
        """The listener proves it holds `server`'s secret (GET /proof with a fresh nonce), else NotProven."""
        nonce = new_nonce()
        try:
            status, _, data = self.exchange("GET", f"{PROOF_PATH}?nonce={nonce}", headers={"Accept": "application/json"},
                                            cap=SMALL_ANSWER_BYTES)
        except ServerUnavailableError as e:
            if e.connection_refused:
                raise
            raise NotProven(str(e).removeprefix(f"the server at {self.url} ")) from None
        if status != 200:
            raise NotProven(f"it answered the challenge with {status}")
        try:
            answered = json.loads(data).get("proof")
        except (ValueError, AttributeError, RecursionError):
            answered = None
        if not proof_holds(server.secret, nonce, server.index_id, answered):
            raise NotProven("its answer to the challenge is not the record's proof")

    def query(self, body: dict, token: str | None) -> tuple[dict, dict[str, str]]:
        """POST /query: (the result, as the API's response model has it; the answer's headers)."""
        data = json.dumps(body, ensure_ascii=False).encode("utf-8")
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        status, got, payload = self.exchange("POST", "/query", body=data, headers=headers, cap=answer_cap(body.get("k")))
        if 300 <= status < 400:
            where = got.get("location")
            raise ServerUnavailableError(f"the server at {self.url} answered {status} "
                                         f"(a redirect{f' to {_shown(where)}' if where else ''}): not followed; "
                                         "name the server's own URL")
        if status >= 400:
            message = _error_message(payload) or http.client.responses.get(status, "")
            if 400 <= status < 500:
                raise ServerRefusedError(f"the server at {self.url} refused the query ({status}): {message}",
                                         status=status)
            raise ServerUnavailableError(f"the server at {self.url} failed ({status}): {message}", status=status)
        if status != 200:
            raise ServerUnavailableError(f"the server at {self.url} answered {status}, not a query result")
        return _result(self.url, payload), got


def post_query(url: str, body: dict, *, timeout: float = DEFAULT_TIMEOUT_S,
               token: str | None = None) -> tuple[dict, dict[str, str]]:
    """POST /query to the server at `url`: (the result, the response's headers, names in lower case)."""
    with _Connection(url, timeout) as conn:
        return conn.query(body, token)


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a finite number")


def _result(url: str, payload: bytes | bytearray) -> dict:
    """The answer as the API's response model (models.QueryResponse) has it, or the server's fault."""
    from pydantic import ValidationError

    from .models import QueryResponse

    try:
        data = json.loads(payload, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as e:
        raise ServerUnavailableError(f"the server at {url} answered something that is not JSON: {_shown(e, 80)}") from None
    if _deeper_than(data, _MAX_DEPTH):  # metadata is at most 16 deep (esqbe.domain.LIMITS); printing recurses
        raise ServerUnavailableError(f"the server at {url} answered something that is not a query result: "
                                     f"nested deeper than {_MAX_DEPTH} levels")
    try:
        return QueryResponse.model_validate(data).model_dump(mode="json")
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first.get("loc", ())) or "the answer"
        raise ServerUnavailableError(f"the server at {url} answered something that is not a query result: "
                                     f"{_shown(where, 80)}: {_shown(first.get('msg'), 120)}") from None


#: how deep a query result nests at most: its own levels (hits, matches) and a hit's metadata (16), with room
_MAX_DEPTH = 32


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether `value` (parsed JSON) nests lists and objects deeper than `limit` (without recursion)."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth >= limit:
                return True
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return False


def _error_message(payload: bytes | bytearray) -> str:
    """The message of an esqbe error body ({"error": {"message"}}), one short line; "" when there is none."""
    try:
        return _shown(json.loads(payload)["error"]["message"], 300)
    except Exception:  # noqa: BLE001  (not an esqbe server, or no body)
        return ""


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
            with _Connection(server.url, timeout) as conn:
                conn.prove(server)  # nothing of the query is sent before this holds
                result, headers = conn.query(body, None)
        except NotProven as e:
            gone = "its record is removed" if forget(server) else f"its record ({server.record}) could not be removed"
            answer.warnings.append(f"the process listening at {server.url} did not prove it is the esqbe serve that "
                                   f"wrote the discovery record ({e}): the query was not sent to it, {gone}; "
                                   "answering here")
            continue
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
    """The query's overrides, and for every other setting a query carries over HTTP the value a local run would use
    (this command's config, environment and the facet's own `facet_settings` entry): a found server's own values of
    those do not matter (esqbe.server.discovery.CARRIED), so a config's `k: 5` does not make the query load the model
    here. Sent only to a found server, never to one named by `--server` (its settings and your flags)."""
    from ..query.search import settings_for_facet

    here = settings_for_facet(settings, facet)
    out = {s.name: getattr(here, s.name) for s in SETTINGS if s.http}
    out["rescorer_params"] = dict(here.rescorer_params)  # kept with another rescorer, as a local run keeps them
    out.update(overrides)
    return out
