"""OpenAlex works that match a filter, new since a day (`esqbe follow add NAME openalex:FILTER`).

The works API as its documentation gives it: `GET /works?filter=FILTER,<date filter>:DAY&per-page=N&cursor=*`,
then `cursor=` each answer's `meta.next_cursor` until it is null (or a page comes empty); `select` asks only for the
fields esqbe reads; `mailto` (the follow_mailto setting) puts the requests in OpenAlex's polite pool, `api_key` is
sent where one is set. FILTER is OpenAlex's own filter syntax (`concepts.id:C41008148,type:article`,
`primary_location.source.id:S4306400194`); the date filter a run adds is the openalex_date_filter setting's
(`from_publication_date`, free; `from_created_date` / `from_updated_date`, which OpenAlex gives premium keys: works
new to it, or also corrected ones). Requests go through esqbe.ingest.web's transport (one connection, at most one per
`openalex_interval`, Retry-After honoured, every answer bounded); an answer that is not the documented JSON shape is
refused, naming the source and page. Each work is read by the `openalex` format (esqbe.ingest.formats: the same paper
id and metadata as `esqbe index works.jsonl`).

State (esqbe.index.follow writes it only after the page's papers are committed): `mark`, the day the next run asks
from (the day the last complete run started, by OpenAlex's `Date` header); during a run, `run`: its `from`, its day
and the cursor of the next page, where a stopped run goes on (a cursor OpenAlex no longer takes: from `from` again).
"""
from __future__ import annotations

import email.utils
import json
import time
from collections.abc import Iterator

import httpx2

from .web import AnswerError, FetchError, Page, PoliteTransport, client, utc_day

DEFAULT_URL = "https://api.openalex.org"
#: the fields the `openalex` reader uses (esqbe.ingest.formats._from_openalex)
SELECT = ("id,doi,title,display_name,publication_year,publication_date,ids,primary_location,authorships,open_access,"
          "concepts,abstract_inverted_index")
MAX_FILTER_CHARS = 2000


def check_filter(text: str) -> str:
    """FILTER as given, if it can be sent as OpenAlex's `filter` (key:value pairs, comma-separated), else ValueError."""
    text = (text or "").strip()
    if not text:
        raise ValueError("an OpenAlex filter is needed (e.g. openalex:concepts.id:C41008148,type:article): without "
                         "one every work OpenAlex holds would arrive")
    if len(text) > MAX_FILTER_CHARS:
        raise ValueError(f"the OpenAlex filter has {len(text)} characters; at most {MAX_FILTER_CHARS}")
    bad = [part for part in text.split(",") if ":" not in part.strip()[1:]]
    if bad or any(c.isspace() and c != " " or ord(c) < 32 for c in text):
        raise ValueError(f"{text[:80]!r} is not OpenAlex's filter syntax: KEY:VALUE pairs separated by commas")
    return text


class Harvest:
    """One run of one followed OpenAlex filter: `pages()` yields a Page per works page (the next asked only once the
    caller comes back for it, after committing this one)."""

    def __init__(self, filter: str, state: dict, *, source: str, url: str | None = None, since: str | None = None,
                 first_days: int = 7, interval: float = 0.1, timeout: float = 30.0, max_bytes: int = 64 << 20,
                 retries: int = 4, max_retry_after: float = 600.0, mailto: str | None = None, api_key: str | None = None,
                 per_page: int = 200, date_filter: str = "from_publication_date", stop=None, sleep=None):
        self.filter, self.source = check_filter(filter), source
        self.url = (url or DEFAULT_URL).rstrip("/")
        self.state, self.since, self.first_days = dict(state or {}), since, int(first_days)
        self.mailto, self.api_key, self.per_page, self.date_filter = mailto, api_key, int(per_page), date_filter
        self.transport = PoliteTransport(f"{source} at {self.url}", interval=interval, timeout=timeout,
                                         max_bytes=max_bytes, retries=retries, max_retry_after=max_retry_after,
                                         stop=stop, sleep=sleep)
        self.notes: list[str] = []

    def pages(self) -> Iterator[Page]:
        run = dict(self.state.get("run") or {})
        start = run.get("from") or self.state.get("mark") or self.since or utc_day(time.time() - 86_400 * self.first_days)
        run = {"from": start, "started": run.get("started"), "page": int(run.get("page") or 0),
               "cursor": run.get("cursor") or "*"}
        resumed = run["cursor"] != "*"  # a stopped run's cursor, asked first
        with client(self.transport, self.mailto, accept="application/json") as http:
            while True:
                try:
                    answer = self._ask(http, run)
                except FetchError as e:
                    if resumed and e.status == 400:  # a cursor OpenAlex no longer takes: from `from` again
                        self.notes.append(f"{self.source}: the cursor of the run that was stopped is no longer taken: "
                                          f"asked again from {start} (what was committed is found unchanged)")
                        run["cursor"], resumed = "*", False
                        continue
                    raise
                resumed = False
                page, following = self._page(answer, run)
                if following:
                    page.state = {"mark": self.state.get("mark"), "run": {**run, "cursor": following}}
                    yield page
                    run["cursor"] = following
                    continue
                page.state = {"mark": run["started"]}
                yield page
                return

    def _ask(self, http: httpx2.Client, run: dict) -> httpx2.Response:
        params = {"filter": f"{self.filter},{self.date_filter}:{run['from']}", "per-page": str(self.per_page),
                  "cursor": run["cursor"], "select": SELECT}
        if self.mailto:
            params["mailto"] = self.mailto
        if self.api_key:
            params["api_key"] = self.api_key
        try:
            return http.get(f"{self.url}/works", params=params)
        except httpx2.HTTPError as e:
            raise FetchError(f"{self.source}: page {run['page'] + 1}: {type(e).__name__}: {e}") from None

    def _page(self, response: httpx2.Response, run: dict) -> tuple[Page, str | None]:
        """The page's works, and the cursor of the next page (None: this is the last)."""
        where = f"{self.source}: page {run['page'] + 1}"
        if not run.get("started"):
            said = response.headers.get("date")
            try:
                when = email.utils.parsedate_to_datetime(said).timestamp() if said else None
            except (TypeError, ValueError):
                when = None
            run["started"] = utc_day(when)
        try:
            body = json.loads(response.content, parse_constant=_no_constant)
        except (ValueError, RecursionError) as e:
            raise AnswerError(f"{where}: not the works API's JSON ({str(e)[:200]})") from None
        meta = body.get("meta") if isinstance(body, dict) else None
        results = body.get("results") if isinstance(body, dict) else None
        if not isinstance(meta, dict) or not isinstance(results, list):
            raise AnswerError(f"{where}: not a works page (an object with `meta` and `results` is what the API answers)")
        following = meta.get("next_cursor")
        if following is not None and (not isinstance(following, str) or not following or len(following) > 4096):
            raise AnswerError(f"{where}: meta.next_cursor is not a cursor ({str(following)[:60]!r})")
        run["page"] = int(run["page"]) + 1
        page = Page(f"page {run['page']}", "openalex")
        for n, work in enumerate(results, 1):
            if not isinstance(work, dict) or not isinstance(work.get("id"), str) \
                    or not work["id"].startswith(("https://openalex.org/W", "W")):
                page.errors.append(f"{where}: result {n}: not a work (no https://openalex.org/W... id)")
                continue
            page.records.append(work)
        return page, (following if following and results else None)


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")
