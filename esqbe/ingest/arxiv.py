"""arXiv's new and changed papers, harvested from its OAI-PMH interface (`esqbe follow add NAME arxiv:cs.CL`).

The protocol (OAI-PMH 2.0, http://www.openarchives.org/OAI/openarchivesprotocol.html) is spoken by oaipmh-scythe:
`ListRecords` with `metadataPrefix=arXiv`, `set` the archive that holds the category (`cs` for cs.CL,
`physics:hep-th` for hep-th: arXiv's sets are its archives) and `from` a day, then a `resumptionToken` per page until
one comes empty; an OAI-PMH `<error>` is its exception (`noRecordsMatch`: nothing new). Under it sits
esqbe.ingest.web's transport: one connection, one request every `arxiv_interval` seconds (arXiv asks for 3), 503 with
Retry-After waited for, every answer bounded and parsed first by defusedxml (no DTD, no entity: refused with the
source and page named), so the parser the harvester uses only ever sees well-formed XML without them.

Each `<record>` becomes a record of the arXiv snapshot's JSON shape (esqbe.ingest.formats `arxiv`: the same paper id,
metadata and rules as `esqbe index arxiv-metadata.json`) from arXiv's own metadata format (namespace
http://arxiv.org/OAI/arXiv/): `<id>`, `<created>`, `<updated>`, `<authors><author><keyname><forenames><suffix>`,
`<title>`, `<categories>` (space-separated; records of the set outside the category are counted, not read),
`<comments>`, `<journal-ref>`, `<doi>`, `<license>`, `<abstract>`. A header with `status="deleted"` is a paper arXiv
withdrew from the interface: named, never read as a paper.

The state kept (esqbe.index.follow writes it only after the page's papers are committed): `mark`, the day the next
run asks `from` (the day the last complete harvest started, in the repository's own `responseDate`: OAI-PMH's `from`
includes its day, so the records of that day come again and are found unchanged), and, during a harvest, `run`: its
`from`, the day it started and the `resumptionToken` of the next page. A run that was stopped goes on from that token;
one the repository no longer knows (`badResumptionToken`) starts that harvest again from its `from`.
"""
from __future__ import annotations

import re
import time
from collections.abc import Iterator
from xml.etree import ElementTree

import defusedxml
import defusedxml.ElementTree
import httpx2
from oaipmh_scythe import Scythe
from oaipmh_scythe.config import HTTPConfig, RetryConfig
from oaipmh_scythe.exceptions import BadResumptionToken, NoRecordsMatch, OAIPMHException
from oaipmh_scythe.iterator import OAIResponseIterator

from .web import AnswerError, FetchError, Page, PoliteTransport, client, utc_day

#: arXiv's OAI-PMH base URL (`--source-url` points a source at a mirror)
DEFAULT_URL = "https://oaipmh.arxiv.org/oai"
METADATA_PREFIX = "arXiv"
OAI = "{http://www.openarchives.org/OAI/2.0/}"
ARXIV = "{http://arxiv.org/OAI/arXiv/}"
#: the archives whose set is `physics:ARCHIVE`; the others' set is the archive's own name
PHYSICS_ARCHIVES = ("astro-ph", "cond-mat", "gr-qc", "hep-ex", "hep-lat", "hep-ph", "hep-th", "math-ph", "nlin",
                    "nucl-ex", "nucl-th", "physics", "quant-ph")
OTHER_ARCHIVES = ("cs", "econ", "eess", "math", "q-bio", "q-fin", "stat")
_CATEGORY = re.compile(r"([a-z][a-z-]*)(?:\.([A-Za-z][A-Za-z-]*))?")
_DAY = re.compile(r"\d{4}-\d{2}-\d{2}")


def set_spec(category: str) -> tuple[str, bool]:
    """(the OAI-PMH set holding arXiv `category`, whether its records are filtered by the category): `cs.CL` ->
    (`cs`, True); `cs` -> (`cs`, False); `hep-th` -> (`physics:hep-th`, True). ValueError naming the archives for an
    archive arXiv does not have."""
    match = _CATEGORY.fullmatch(category or "")
    if not match:
        raise ValueError(f"{category[:80]!r} is not an arXiv category (e.g. cs.CL, hep-th, math.AG)")
    archive = match.group(1)
    if archive in PHYSICS_ARCHIVES:
        return f"physics:{archive}", True
    if archive in OTHER_ARCHIVES:
        return archive, match.group(2) is not None
    raise ValueError(f"arXiv has no archive {archive!r} (its archives: {', '.join(OTHER_ARCHIVES + PHYSICS_ARCHIVES)})")


class _Scythe(Scythe):
    """oaipmh-scythe's harvester on esqbe's client (its transport keeps arXiv's rules; the harvester's own retries
    are off: the transport's honour Retry-After within esqbe's bounds)."""

    def __init__(self, endpoint: str, http: httpx2.Client):
        super().__init__(endpoint, http_config=HTTPConfig(timeout=http.timeout.read or 60),
                         retry_config=RetryConfig(max_retries=0), iterator=OAIResponseIterator)
        self._esqbe_client = http

    @property
    def client(self) -> httpx2.Client:
        return self._esqbe_client


class Harvest:
    """One run of one followed arXiv category: `pages()` yields a Page per OAI-PMH page (the next page is asked only
    once the caller comes back for it, after committing this one)."""

    def __init__(self, category: str, state: dict, *, source: str, url: str | None = None, since: str | None = None,
                 first_days: int = 7, interval: float = 3.0, timeout: float = 30.0, max_bytes: int = 64 << 20,
                 retries: int = 4, max_retry_after: float = 600.0, mailto: str | None = None, stop=None, sleep=None):
        self.category, self.source = category, source
        self.set, self.filtered = set_spec(category)
        self.url = url or DEFAULT_URL
        self.state, self.since, self.first_days = dict(state or {}), since, int(first_days)
        self.transport = PoliteTransport(f"{source} at {self.url}", interval=interval, timeout=timeout,
                                         max_bytes=max_bytes, retries=retries, max_retry_after=max_retry_after,
                                         check=self._check, stop=stop, sleep=sleep)
        self.mailto = mailto
        self.notes: list[str] = []
        self._tree: ElementTree.Element | None = None
        self._asking = 1  # the page being asked for (named in a refusal)

    # --- every answer, before the harvester parses it -------------------------------------------------
    def _where(self, page: int | None = None) -> str:
        return f"{self.source}: page {page or self._asking}"

    def _check(self, body: bytes) -> None:
        """The answer parsed by defusedxml (no DTD, no entity, no external reference): AnswerError otherwise."""
        self._tree = None
        try:
            self._tree = defusedxml.ElementTree.fromstring(body, forbid_dtd=True, forbid_entities=True,
                                                           forbid_external=True)
        except defusedxml.DefusedXmlException as e:
            raise AnswerError(f"{self._where()}: the answer declares a DTD, an XML entity or an external reference "
                              f"({type(e).__name__}): refused (esqbe never expands them)") from None
        except ElementTree.ParseError as e:
            raise AnswerError(f"{self._where()}: the answer is not well-formed XML ({e})") from None

    # --- the harvest ----------------------------------------------------------------------------------
    def pages(self) -> Iterator[Page]:
        run = dict(self.state.get("run") or {})
        if run.get("token"):
            try:
                yield from self._harvest(run, resumption_token=run["token"])
                return
            except BadResumptionToken:
                self.notes.append(f"{self.source}: the resumption token of the harvest that was stopped has expired: "
                                  f"asked again from {run.get('from')} (what was committed is found unchanged)")
                run.pop("token", None)
        start = run.get("from") or self.state.get("mark") or self.since or utc_day(time.time() - 86_400 * self.first_days)
        run = {"from": start, "started": run.get("started"), "page": int(run.get("page") or 0)}
        yield from self._harvest(run, from_=start)

    def _harvest(self, run: dict, **ask) -> Iterator[Page]:
        # a resumption token is the request's only argument (OAI-PMH 2.0, 3.5): no metadataPrefix beside it
        query = {"resumption_token": ask["resumption_token"], "metadata_prefix": None} if "resumption_token" in ask \
            else {"from_": ask["from_"], "set_": self.set, "metadata_prefix": METADATA_PREFIX}
        self._asking = run["page"] + 1
        yielded = False
        with client(self.transport, self.mailto, accept="text/xml, application/xml") as http, \
                _Scythe(self.url, http) as scythe:
            try:
                for _response in scythe.list_records(**query):
                    page = self._page(run)
                    yielded = True
                    yield page
                    self._asking = run["page"] + 1
            except NoRecordsMatch:  # nothing since `from`: the harvest is complete
                self._started(run)
                yield Page(f"page {self._asking} (no records since {run['from']})", "arxiv",
                           state={"mark": run["started"]})
            except BadResumptionToken as e:
                if "resumption_token" in ask and not yielded:  # the stored token: the caller starts again
                    raise
                raise FetchError(f"{self._where()}: the repository no longer knows the resumption token it gave "
                                 f"(badResumptionToken: {str(e)[:200]}); the next run goes on from the last page "
                                 "committed") from None
            except OAIPMHException as e:
                code = type(e).__name__[:1].lower() + type(e).__name__[1:]
                raise FetchError(f"{self._where()}: the repository answered the OAI-PMH error {code}: "
                                 f"{str(e)[:300]}") from None
            except httpx2.HTTPError as e:
                raise FetchError(f"{self._where()}: {type(e).__name__}: {e}") from None

    def _started(self, run: dict) -> None:
        """The day this harvest started, as the repository's `responseDate` says (the next run's `from`)."""
        if run.get("started"):
            return
        tree = self._tree
        said = _text(tree.find(f"{OAI}responseDate")) if tree is not None else ""
        if not _DAY.match(said):
            raise AnswerError(f"{self._where()}: an OAI-PMH answer without a responseDate (got {said[:40]!r})")
        run["started"] = said[:10]

    def _page(self, run: dict) -> Page:
        tree = self._tree
        where = self._where()
        if tree is None or tree.tag != f"{OAI}OAI-PMH":
            root = "nothing" if tree is None else f"<{str(tree.tag).rsplit('}', 1)[-1][:40]}>"
            raise AnswerError(f"{where}: not an OAI-PMH answer (its root is {root})")
        listing = tree.find(f"{OAI}ListRecords")
        if listing is None:
            raise AnswerError(f"{where}: an OAI-PMH answer without ListRecords or an error")
        self._started(run)
        run["page"] = int(run["page"]) + 1
        page = Page(f"page {run['page']}", "arxiv")
        for n, element in enumerate(listing.findall(f"{OAI}record"), 1):
            self._record(element, n, page, where)
        token = listing.find(f"{OAI}resumptionToken")
        following = _text(token) if token is not None else ""
        if following:
            page.state = {"mark": self.state.get("mark"), "run": {**run, "token": following}}
        else:
            page.state = {"mark": run["started"]}
        return page

    def _record(self, element, n: int, page: Page, where: str) -> None:
        header = element.find(f"{OAI}header")
        identifier = _text(header.find(f"{OAI}identifier")) if header is not None else ""
        if not identifier:
            page.errors.append(f"{where}: record {n}: no header identifier (not an OAI-PMH record)")
            return
        arxiv_id = identifier.rsplit(":", 1)[-1] if identifier.lower().startswith("oai:arxiv.org:") else identifier
        if header is not None and header.get("status") == "deleted":
            page.deleted.append({"id": arxiv_id, "when": _text(header.find(f"{OAI}datestamp"))})
            return
        meta = element.find(f"{OAI}metadata/{ARXIV}arXiv")
        if meta is None:
            page.errors.append(f"{where}: record {n} ({identifier[:80]}): no arXiv metadata (metadataPrefix=arXiv)")
            return
        categories = " ".join(_text(meta.find(f"{ARXIV}categories")).split())
        if self.filtered and self.category not in categories.split():
            page.filtered += 1
            return
        authors = [[_text(a.find(f"{ARXIV}keyname")), _text(a.find(f"{ARXIV}forenames")),
                    _text(a.find(f"{ARXIV}suffix"))] for a in meta.findall(f"{ARXIV}authors/{ARXIV}author")]
        record = {"id": _text(meta.find(f"{ARXIV}id")) or arxiv_id, "title": _text(meta.find(f"{ARXIV}title")),
                  "abstract": _text(meta.find(f"{ARXIV}abstract")) or None, "authors_parsed": authors,
                  "categories": categories, "doi": _text(meta.find(f"{ARXIV}doi")),
                  "journal-ref": _text(meta.find(f"{ARXIV}journal-ref")), "license": _text(meta.find(f"{ARXIV}license")),
                  "comments": _text(meta.find(f"{ARXIV}comments")), "created": _text(meta.find(f"{ARXIV}created")),
                  "updated": _text(meta.find(f"{ARXIV}updated"))}
        page.records.append({k: v for k, v in record.items() if v != ""})


def _text(element) -> str:
    """An element's text (its children's too), stripped; "" for none."""
    return "".join(element.itertext()).strip() if element is not None else ""
