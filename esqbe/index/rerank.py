"""esqbe as a search engine's reranker: the short query grammar a search request carries (`paper:ID facet:method`,
`paper:ID sentences:0,2`, `facet:method free text`, or free text), and the scores of given candidate papers
against it, in their input order, as `Index.query(..., restrict_to=candidates)` ranks them. Unknown ids get a
score below every known one and are counted, never an error: a cluster's search must not fail on one stale id.
The HTTP skin (POST /rerank, esqbe.server) and `esqbe engine install-reranker` sit on this."""
from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..domain import QUERY_FACETS
from ..query.results import QueryError, QueryTooLargeError

#: the most candidate papers one call may score (a cluster sends its rank window: ES `rank_window_size`,
#: OpenSearch the hits of the page); the server may lower it (`--max-batch-records` does not apply here)
MAX_RERANK_DOCUMENTS = 1000
#: the longest query string: a grammar query is short; free text is capped as a pasted abstract is
MAX_RERANK_QUERY_CHARS = 20_000
#: the longest paper id accepted in the grammar and as a document
MAX_PAPER_ID_CHARS = 512
#: the most sentence indices `sentences:` may name
MAX_RERANK_SENTENCES = 64

_ID = re.compile(r"[^\s\x00-\x1f\x7f]+")  # printable, no whitespace
_INDICES = re.compile(r"\d{1,5}(,\d{1,5})*")


#: a rerank query or document list that does not follow the grammar (HTTP 400); past a bound: QueryTooLargeError (413)
RerankQueryError = QueryError


@dataclass(frozen=True)
class RerankQuery:
    """A parsed rerank query: a paper of the index (`paper_id`, with a facet or chosen sentences) or a text."""

    paper_id: str | None = None
    facet: str | None = None
    sentences: tuple[int, ...] | None = None
    text: str | None = None


@dataclass
class RerankResult:
    """Scores in the documents' input order; `unknown`: the ids not in the index (scored lowest);
    `unranked`: ids in the index that the query could not rank (the query paper itself), also scored lowest."""

    scores: list[float]
    unknown: list[str] = field(default_factory=list)
    unranked: list[str] = field(default_factory=list)
    timings_ms: dict = field(default_factory=dict)


def parse_rerank_query(query: str, *, max_chars: int = MAX_RERANK_QUERY_CHARS) -> RerankQuery:
    """The grammar, strictly:

        paper:ID                       every sentence of an indexed paper
        paper:ID facet:NAME            its sentences of one facet (background, method, result)
        paper:ID sentences:0,2         chosen sentences, by index
        facet:NAME TEXT...             a pasted text, tagged; its sentences of that facet
        TEXT...                        a pasted text, every sentence (anything not starting with paper: or facet:)

    Unknown keys, repeated keys, both facet and sentences, an empty id or text, control characters: refused
    (RerankQueryError), as is a query longer than `max_chars`."""
    if not isinstance(query, str):
        raise RerankQueryError("the query must be a string")
    if len(query) > max_chars:
        raise QueryTooLargeError(f"the query has {len(query)} characters; at most {max_chars}")
    if any(ord(c) < 32 and c not in "\t\n\r" or ord(c) == 127 for c in query):
        raise RerankQueryError("the query contains control characters")
    q = query.strip()
    if not q:
        raise RerankQueryError("the query is empty")
    head = q.split(None, 1)[0].lower()
    if head.startswith("facet:"):
        parts = q.split(None, 1)
        facet = _facet(parts[0][len("facet:"):])
        text = parts[1].strip() if len(parts) > 1 else ""
        if not text:
            raise RerankQueryError("facet:NAME needs a text after it (or use paper:ID facet:NAME)")
        return RerankQuery(facet=facet, text=text)
    if not head.startswith("paper:"):
        return RerankQuery(text=q)
    tokens = q.split()
    seen: dict[str, str] = {}
    for tok in tokens:
        key, sep, value = tok.partition(":")
        key = key.lower()
        if not sep or key not in ("paper", "facet", "sentences"):
            raise RerankQueryError(f"unknown term {tok[:40]!r}: a paper query is paper:ID with facet:NAME or "
                                   "sentences:I,J")
        if key in seen:
            raise RerankQueryError(f"{key}: given twice")
        if not value:
            raise RerankQueryError(f"{key}: has no value")
        seen[key] = value
    if "facet" in seen and "sentences" in seen:
        raise RerankQueryError("give facet: or sentences:, not both")
    pid = seen["paper"]
    if len(pid) > MAX_PAPER_ID_CHARS or not _ID.fullmatch(pid):
        raise RerankQueryError(f"paper: the id must be 1 to {MAX_PAPER_ID_CHARS} printable characters")
    sentences = None
    if "sentences" in seen:
        if not _INDICES.fullmatch(seen["sentences"]):
            raise RerankQueryError("sentences: expected indices like 0,2 (non-negative integers, comma separated)")
        idx = [int(x) for x in seen["sentences"].split(",")]
        if len(idx) != len(set(idx)):
            raise RerankQueryError("sentences: an index is given twice")
        if len(idx) > MAX_RERANK_SENTENCES:
            raise QueryTooLargeError(f"sentences: {len(idx)} indices; at most {MAX_RERANK_SENTENCES}")
        sentences = tuple(idx)
    return RerankQuery(paper_id=pid, facet=_facet(seen["facet"]) if "facet" in seen else None, sentences=sentences)


def _facet(name: str) -> str:
    n = name.strip().lower()
    if n not in QUERY_FACETS:
        raise RerankQueryError(f"facet: {name[:40]!r} is not a facet; facets: {', '.join(QUERY_FACETS)}")
    return n


def check_documents(documents: Sequence, *, max_documents: int = MAX_RERANK_DOCUMENTS) -> list[str]:
    """The candidate ids as strings, bounded: a list of 1..max_documents non-empty printable ids of at most
    MAX_PAPER_ID_CHARS (surrounding whitespace dropped). Anything else is refused whole (RerankQueryError)."""
    if not isinstance(documents, (list, tuple)):
        raise RerankQueryError("the documents must be a list of paper ids")
    if not documents:
        raise RerankQueryError("no documents to rerank")
    if len(documents) > max_documents:
        raise QueryTooLargeError(f"{len(documents)} documents; at most {max_documents} per call")
    out = []
    for i, d in enumerate(documents):
        if isinstance(d, bool) or not isinstance(d, (str, int)):
            raise RerankQueryError(f"documents[{i}]: expected a paper id (a string), got {type(d).__name__}")
        s = str(d).strip()
        if not s or len(s) > MAX_PAPER_ID_CHARS or not _ID.fullmatch(s):
            raise RerankQueryError(f"documents[{i}]: a paper id must be 1 to {MAX_PAPER_ID_CHARS} printable "
                                   "characters without spaces")
        out.append(s)
    return out


def rerank(index, query: RerankQuery | str, documents: Sequence, **overrides) -> RerankResult:
    """Score `documents` (paper ids) against `query` as `index.query(..., restrict_to=documents)` ranks them:
    each known id gets its hit's `score`, which is the score any query of `query` gives that paper, whatever the
    other documents are (a function of the query and the paper alone: esqbe.query.results.ScoreFormula); unknown
    ids, and known ones the query cannot rank (the query paper itself, which a query never returns), get one score
    below all of those. Scores are in input order; an id
    given twice gets the same score twice. `overrides` are Settings fields, as for `Index.query`."""
    import time

    t0 = time.perf_counter()
    q = query if isinstance(query, RerankQuery) else parse_rerank_query(query)
    ids = check_documents(documents)
    distinct = list(dict.fromkeys(ids))
    known = set(index.get(distinct)) if distinct else set()
    pool = [i for i in distinct if i in known]
    scored: dict[str, float] = {}
    timings: dict = {}
    if pool:
        result = index.query(q.paper_id, facet=q.facet, sentences=q.sentences, text=q.text, restrict_to=pool,
                             place_hits=False, **{"k": len(pool), **overrides})
        scored = {h.paper_id: float(h.score) for h in result.hits if math.isfinite(h.score)}
        timings = dict(result.timings)
    floor = (min(scored.values()) - 1.0) if scored else 0.0
    scores = [scored.get(i, floor) for i in ids]
    timings["total"] = round(1000 * (time.perf_counter() - t0), 2)
    return RerankResult(scores=scores, unknown=[i for i in distinct if i not in known],
                        unranked=[i for i in pool if i not in scored], timings_ms=timings)


def rerank_bounds() -> dict:
    """The bounds of a rerank call, as GET /stats reports them (the route and RerankRequest enforce them)."""
    return {"max_documents": MAX_RERANK_DOCUMENTS, "max_query_chars": MAX_RERANK_QUERY_CHARS,
            "max_sentences": MAX_RERANK_SENTENCES, "max_id_chars": MAX_PAPER_ID_CHARS}


def install_engine_reranker(settings, server_url: str, *, token: str | None = None, name: str = "esqbe-rerank",
                            id_field: str = "paper_id", remove: bool = False) -> dict:
    """`esqbe engine install-reranker` / `uninstall-reranker`: esqbe's POST /rerank made (or unmade) the reranker of
    the Elasticsearch or OpenSearch cluster the settings name (their URL and credentials), idempotently
    (esqbe.backends.engines.reranker)."""
    from ..backends.engines.reranker import install_reranker, rerank_url, uninstall_reranker
    from ..errors import ParameterError
    from .open import open_backend

    if settings.backend not in ("elasticsearch", "opensearch"):
        raise ParameterError("the reranker is installed in a cluster: give --backend elasticsearch or opensearch and --url")
    if not remove:
        rerank_url(server_url)  # a bad --server-url refused before the cluster is touched
    backend = open_backend(settings, create=False)
    try:
        if remove:
            return uninstall_reranker(backend, name=name)
        return install_reranker(backend, server_url, token=token, name=name, id_field=id_field)
    finally:
        backend.close()


def engine_reranker_status(index, name: str = "esqbe-rerank") -> dict | None:
    """For `esqbe stats` on an engine backend: what of esqbe's reranker the cluster has under `name` (None on the
    embedded backend; a reason instead where the cluster will not say, e.g. a key without `monitor_inference`)."""
    from ..backends.engines.reranker import reranker_status
    from ..errors import BackendError

    if index.settings.backend not in ("elasticsearch", "opensearch"):
        return None
    try:
        return reranker_status(index.backend, name=name)
    except BackendError as e:
        return {"unknown": str(e)[:300]}
