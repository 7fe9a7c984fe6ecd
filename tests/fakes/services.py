"""Loopback stand-ins for the services `esqbe follow` asks (no outside service is reachable here): a real HTTP server
on 127.0.0.1 in a thread, answering as each service's documentation shows, and keeping every request it got (so a
test can check what was sent: the User-Agent, the parameters, the time between requests).

- `OaiPmh`: arXiv's OAI-PMH 2.0 interface: `ListRecords` in the `arXiv` metadata format
  (http://arxiv.org/OAI/arXiv/), pages chained by `resumptionToken` (the last one empty, with `completeListSize` and
  `cursor`), `noRecordsMatch` for a `from` past every record, `badResumptionToken` for a token it does not know, a
  deleted record as a header with `status="deleted"`, 503 with Retry-After for flow control.
- `OpenAlex`: the works API: `GET /works?filter=...&per-page=N&cursor=*`, pages with `meta.next_cursor` (null on the
  last), works with `abstract_inverted_index`.
"""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit
from xml.sax.saxutils import escape

OAI_HEAD = ('<?xml version="1.0" encoding="UTF-8"?>\n<OAI-PMH xmlns="http://www.openarchives.org/OAI/2.0/" '
            'xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" xsi:schemaLocation="http://www.openarchives.org/OAI/2.0/ '
            'http://www.openarchives.org/OAI/2.0/OAI-PMH.xsd">\n')


class _Server:
    """A ThreadingHTTPServer on a free loopback port, in a daemon thread; `with Stand() as url:`."""

    def __init__(self):
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # connections kept alive, as the services keep them: `port` tells them apart

            def do_GET(self):  # noqa: N802 (http.server's name)
                parts = urlsplit(self.path)
                params = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
                with outer.lock:
                    outer.requests.append({"at": time.monotonic(), "path": parts.path, "params": params,
                                           "headers": dict(self.headers), "port": self.client_address[1]})
                status, headers, body = outer.answer(parts.path, params)
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.handle_error = lambda request, address: None  # a client killed mid-answer: nothing to say
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def answer(self, path: str, params: dict) -> tuple[int, dict, bytes]:
        raise NotImplementedError

    def __enter__(self) -> _Server:
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def arxiv_record(rec: dict) -> str:
    """One `<record>` as arXiv's OAI-PMH gives it (metadataPrefix=arXiv): `rec` has id, datestamp, and (unless
    deleted) title, abstract, categories, authors [(keyname, forenames[, suffix])], created, updated, doi."""
    status = ' status="deleted"' if rec.get("deleted") else ""
    header = (f'<header{status}><identifier>oai:arXiv.org:{rec["id"]}'
              f'</identifier><datestamp>{rec["datestamp"]}</datestamp><setSpec>{rec.get("set", "cs")}</setSpec></header>')
    if rec.get("deleted"):
        return f"<record>{header}</record>"
    authors = "".join("<author><keyname>{}</keyname><forenames>{}</forenames>{}</author>".format(
        escape(a[0]), escape(a[1]), f"<suffix>{escape(a[2])}</suffix>" if len(a) > 2 else "") for a in rec["authors"])
    extra = "".join(f"<{k}>{escape(rec[k])}</{k}>" for k in ("doi", "journal-ref", "comments") if rec.get(k))
    return (f'<record>{header}<metadata><arXiv xmlns="http://arxiv.org/OAI/arXiv/" '
            'xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" '
            'xsi:schemaLocation="http://arxiv.org/OAI/arXiv/ http://arxiv.org/OAI/arXiv.xsd">'
            f'<id>{rec["id"]}</id><created>{rec["created"]}</created>'
            + (f'<updated>{rec["updated"]}</updated>' if rec.get("updated") else "")
            + f'<authors>{authors}</authors><title>{escape(rec["title"])}</title>'
            f'<categories>{rec["categories"]}</categories>{extra}'
            '<license>http://arxiv.org/licenses/nonexclusive-distrib/1.0/</license>'
            f'<abstract>  {escape(rec["abstract"])}\n</abstract></arXiv></metadata></record>')


class OaiPmh(_Server):
    """arXiv's OAI-PMH. `pages`: lists of records (`arxiv_record`'s dicts), served from the first request on, each
    page's resumptionToken `t<N>` naming the next; `busy[key]`: how many times the request of `key` ("first" or a
    token) is answered 503 with `Retry-After: retry_after` first; `raw[key]`: bytes answered instead of the page;
    `hold`: a key whose request waits (`reached` is set) until `release` is set; `response_date`: the harvest's day."""

    def __init__(self, pages: list[list[dict]], *, response_date: str = "2024-05-03T10:20:30Z"):
        super().__init__()
        self.pages, self.response_date = pages, response_date
        self.busy: dict[str, int] = {}
        self.retry_after = "1"
        self.raw: dict[str, bytes] = {}
        self.hold: str | None = None
        self.reached, self.release = threading.Event(), threading.Event()
        self.known_tokens: set[str] | None = None  # None: every token it gave

    def _request_xml(self, params: dict) -> str:
        attrs = "".join(f' {k}="{escape(v)}"' for k, v in sorted(params.items()))
        return f"<responseDate>{self.response_date}</responseDate><request{attrs}>{self.url}/oai</request>"

    def answer(self, path, params):
        if path != "/oai" or params.get("verb") != "ListRecords":
            return 400, {"Content-Type": "text/plain"}, b"not an OAI-PMH request"
        token = params.get("resumptionToken")
        key = token or "first"
        if self.busy.get(key, 0) > 0:
            self.busy[key] -= 1
            return 503, {"Retry-After": self.retry_after, "Content-Type": "text/plain"}, b"Retry after specified interval"
        if key == self.hold:
            self.reached.set()
            self.release.wait(60)
        if key in self.raw:
            return 200, {"Content-Type": "text/xml"}, self.raw[key]
        if token is not None:
            if set(params) != {"verb", "resumptionToken"} or not token.startswith("t") or \
                    (self.known_tokens is not None and token not in self.known_tokens):
                return 200, {"Content-Type": "text/xml"}, self._error("badResumptionToken", "The value of the "
                                                                      "resumptionToken argument is invalid or expired.")
            n = int(token[1:])
        else:
            if params.get("metadataPrefix") != "arXiv" or "set" not in params:
                return 200, {"Content-Type": "text/xml"}, self._error("badArgument", "metadataPrefix and set needed")
            n = 0
        records = [r for r in self.pages[n] if token is not None or r["datestamp"] >= params.get("from", "")]
        if not any(r["datestamp"] >= params.get("from", "") for p in self.pages for r in p) or not self.pages:
            return 200, {"Content-Type": "text/xml"}, self._error("noRecordsMatch", "No records match.")
        total = sum(len(p) for p in self.pages)
        cursor = sum(len(p) for p in self.pages[:n])
        following = f"t{n + 1}" if n + 1 < len(self.pages) else ""
        body = (OAI_HEAD + self._request_xml(params) + "<ListRecords>" + "".join(arxiv_record(r) for r in records)
                + f'<resumptionToken cursor="{cursor}" completeListSize="{total}">{following}</resumptionToken>'
                + "</ListRecords></OAI-PMH>")
        return 200, {"Content-Type": "text/xml;charset=UTF-8"}, body.encode("utf-8")

    def _error(self, code: str, text: str) -> bytes:
        return (OAI_HEAD + f"<responseDate>{self.response_date}</responseDate><request>{self.url}/oai</request>"
                f'<error code="{code}">{escape(text)}</error></OAI-PMH>').encode("utf-8")

    def asked(self) -> list[dict]:
        """The ListRecords requests answered so far (not the 503s' retries told apart: each is one)."""
        return [r for r in self.requests if r["path"] == "/oai"]


def inverted(text: str) -> dict:
    """An abstract as OpenAlex gives it: word -> positions."""
    out: dict[str, list[int]] = {}
    for i, word in enumerate(text.split()):
        out.setdefault(word, []).append(i)
    return out


def openalex_work(wid: str, title: str, abstract: str, year: int = 2024, doi: str | None = None) -> dict:
    return {"id": f"https://openalex.org/{wid}", "doi": f"https://doi.org/{doi}" if doi else None, "title": title,
            "display_name": title, "publication_year": year, "publication_date": f"{year}-05-02",
            "ids": {"openalex": f"https://openalex.org/{wid}"},
            "primary_location": {"source": {"display_name": "A Venue"}},
            "authorships": [{"author": {"id": "https://openalex.org/A1", "display_name": "Ada Lovelace"}}],
            "open_access": {"is_oa": False, "oa_status": "closed", "oa_url": None}, "concepts": [],
            "abstract_inverted_index": inverted(abstract)}


class OpenAlex(_Server):
    """OpenAlex's works API: `pages` of works, the first for `cursor=*`, each page's `meta.next_cursor` naming the
    next (`c<N>`), null on the last; `raw[cursor]`: bytes answered instead."""

    def __init__(self, pages: list[list[dict]]):
        super().__init__()
        self.pages = pages
        self.raw: dict[str, bytes] = {}

    def answer(self, path, params):
        if path != "/works":
            return 404, {"Content-Type": "application/json"}, b'{"error": "not found"}'
        cursor = params.get("cursor")
        if cursor in self.raw:
            return 200, {"Content-Type": "application/json"}, self.raw[cursor]
        if cursor != "*" and not (cursor or "").startswith("c"):
            return 400, {"Content-Type": "application/json"}, json.dumps(
                {"error": "Invalid query parameters error.", "message": "cursor is not valid"}).encode()
        n = 0 if cursor == "*" else int(cursor[1:])
        works = self.pages[n] if n < len(self.pages) else []
        following = f"c{n + 1}" if n + 1 <= len(self.pages) and works else None
        body = {"meta": {"count": sum(len(p) for p in self.pages), "db_response_time_ms": 12, "page": None,
                         "per_page": int(params.get("per-page", 25)), "next_cursor": following, "groups_count": None},
                "results": works, "group_by": []}
        return 200, {"Content-Type": "application/json"}, json.dumps(body).encode()
