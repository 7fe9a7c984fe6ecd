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
from typing import Any

from ..core.limits import MAX_QUERY_SENTENCES
from ..core.redact import mask_url, mask_urls
from ..domain import QUERY_FACETS
from ..query.results import QueryError, QueryTooLargeError
from ..query.search import query_sentences

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
    #: a key of FALLBACKS where the query was answered another way than asked; None: as asked
    fallback: str | None = None


def parse_rerank_query(query: str, *, max_chars: int = MAX_RERANK_QUERY_CHARS,
                       max_sentences: int | None = None) -> RerankQuery:
    """The grammar, strictly:

        paper:ID                       every sentence of an indexed paper
        paper:ID facet:NAME            its sentences of one facet (background, method, result)
        paper:ID sentences:0,2         chosen sentences, by index
        facet:NAME TEXT...             a pasted text, tagged; its sentences of that facet
        TEXT...                        a pasted text, every sentence (anything not starting with paper: or facet:)

    Unknown keys, repeated keys, both facet and sentences, an empty id or text, control characters: refused
    (RerankQueryError), as is a query longer than `max_chars`, and a text is split and counted here as every query's
    free text is (`esqbe.query.search.query_texts`: past `max_sentences`, default MAX_QUERY_SENTENCES, 413), before
    any tagging or encoding."""
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
        query_sentences(text, max_sentences=max_sentences)
        return RerankQuery(facet=facet, text=text)
    if not head.startswith("paper:"):
        query_sentences(q, max_sentences=max_sentences)
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


#: why a well-formed rerank query was answered another way than asked (RerankResult.fallback; the server's
#: X-Esqbe-Rerank-Fallback header and GET /stats count them): a cluster's search must not fail on what the index holds
FALLBACKS = {
    "facet_all_sentences": "the query has no sentence of the facet (and no tagger probabilities): all its sentences",
    "facet_most_probable": "the query text has no sentence of the facet: its sentence most probably of the facet",
    "sentences_out_of_range": "some chosen sentence indices are past the query paper's sentences: the others "
                              "(all sentences if none is left)",
    "query_paper_missing": "the query paper is not in the index: every document scored the same (the engine's "
                           "order is kept)",
    "no_query_sentences": "the query paper has no sentences: every document scored the same",
}


def rerank(index, query: RerankQuery | str, documents: Sequence, **overrides) -> RerankResult:
    """Score `documents` (paper ids) against `query` as `index.query(..., restrict_to=documents)` ranks them:
    each known id gets its hit's `score`, which is the score any query of `query` gives that paper, whatever the
    other documents are (a function of the query and the paper alone: esqbe.query.results.ScoreFormula); unknown
    ids, and known ones the query cannot rank (the query paper itself, which a query never returns), get one score
    below all of those. Scores are in input order; an id given twice gets the same score twice. `overrides` are
    Settings fields, as for `Index.query`.

    A well-formed query is never refused for what the index holds (FALLBACKS, named in `fallback`): a facet with
    no sentence in the query falls back to the facet's most probable sentence (a text the tagger labelled) or to
    every sentence; chosen indices past the paper's sentences are dropped; a query paper not in the index (or
    without sentences) gives every document the same score."""
    import time

    from ..query.results import FacetNotFoundError, PaperNotFoundError

    t0 = time.perf_counter()
    q = query if isinstance(query, RerankQuery) else parse_rerank_query(query)
    ids = check_documents(documents)
    distinct = list(dict.fromkeys(ids))
    known = set(index.get(distinct)) if distinct else set()
    pool = [i for i in distinct if i in known]
    scored: dict[str, float] = {}
    timings: dict = {}
    fallback: str | None = None
    if pool and q.paper_id is not None:
        q, fallback = _paper_fallback(index, q)
    if pool and fallback not in ("query_paper_missing", "no_query_sentences"):
        def run(qq: RerankQuery):
            return index.query(qq.paper_id, facet=qq.facet, sentences=qq.sentences, text=qq.text, restrict_to=pool,
                               place_hits=False, **{"k": len(pool), **overrides})
        try:
            result = run(q)
        except FacetNotFoundError:
            q, fallback = _facet_fallback(index, q)
            result = run(q)
        except PaperNotFoundError:  # deleted between the look-up and the query
            result, fallback = None, "query_paper_missing"
        if result is not None:
            scored = {h.paper_id: float(h.score) for h in result.hits if math.isfinite(h.score)}
            timings = dict(result.timings)
    if fallback in ("query_paper_missing", "no_query_sentences"):
        scored = dict.fromkeys(pool, 0.0)
    floor = (min(scored.values()) - 1.0) if scored else 0.0
    scores = [scored.get(i, floor) for i in ids]
    timings["total"] = round(1000 * (time.perf_counter() - t0), 2)
    unranked = [] if fallback in ("query_paper_missing", "no_query_sentences") else [i for i in pool if i not in scored]
    return RerankResult(scores=scores, unknown=[i for i in distinct if i not in known], unranked=unranked,
                        timings_ms=timings, fallback=fallback)


def _paper_fallback(index, q: RerankQuery) -> tuple[RerankQuery, str | None]:
    """A paper query checked against what the index holds: missing paper, no sentences, indices out of range."""
    from dataclasses import replace

    found = index.get([q.paper_id])
    paper = found.get(q.paper_id)
    if paper is None:
        return q, "query_paper_missing"
    n = len(paper.sentences)
    if n == 0:
        return q, "no_query_sentences"
    if q.sentences is not None and any(i >= n for i in q.sentences):
        kept = tuple(i for i in q.sentences if i < n)
        return replace(q, sentences=kept or None), "sentences_out_of_range"
    return q, None


def _facet_fallback(index, q: RerankQuery) -> tuple[RerankQuery, str]:
    """The query without its facet: a text's sentence the tagger finds most probably of the facet (where a tagger
    labels it), else every sentence."""
    from dataclasses import replace

    import numpy as np

    from ..domain import Paper
    from ..query.search import facet_probability, query_sentences

    if q.text is not None and getattr(index, "tagger", None) is not None and q.facet is not None:
        sents = query_sentences(q.text)
        paper = Paper("query", "", sents)
        _labels, probs = index.tagger.tag_with_probabilities([paper])
        paper.metadata = {**(paper.metadata or {}), "facet_probs": probs[0]}
        p = facet_probability(paper, q.facet)
        if len(p):
            return replace(q, facet=None, sentences=(int(np.argmax(p)),)), "facet_most_probable"
    return replace(q, facet=None, sentences=None), "facet_all_sentences"


def rerank_bounds() -> dict:
    """The bounds of a rerank call, as GET /stats reports them (the route and RerankRequest enforce them)."""
    return {"max_documents": MAX_RERANK_DOCUMENTS, "max_query_chars": MAX_RERANK_QUERY_CHARS,
            "max_sentences": MAX_RERANK_SENTENCES, "max_text_sentences": MAX_QUERY_SENTENCES,
            "max_id_chars": MAX_PAPER_ID_CHARS}


#: seconds `esqbe engine install-reranker` waits for the cluster to accept a connection (--connect-timeout)
CONNECT_TIMEOUT = 5.0


def install_engine_reranker(settings, server_url: str, *, token: str | None = None, name: str = "esqbe-rerank",
                            id_field: str = "paper_id", remove: bool = False, dry_run: bool = False,
                            connect_timeout: float = CONNECT_TIMEOUT) -> dict:
    """`esqbe engine install-reranker` / `uninstall-reranker`: esqbe's POST /rerank made (or unmade) the reranker of
    the Elasticsearch or OpenSearch cluster the settings name (their URL and credentials), idempotently
    (esqbe.backends.engines.reranker). Checked before anything is sent: the engine, the name (the engine's rule),
    --server-url. Then the cluster must accept a connection within `connect_timeout` seconds, and (installing) the
    index must exist and be esqbe's (written by `esqbe index` or `esqbe attach`ed), with `id_field` in its mapping
    on OpenSearch. `dry_run`: nothing is sent at all; `{"dry_run": True, "requests": [...]}` lists every request
    in order, each with when it is sent, the server token redacted.
    Returns {"engine", "url" (credentials masked), "index", "name", "calls", "parts" (what was done, per part)}."""
    from ..backends.engines.names import check_reranker_name
    from ..backends.engines.reranker import DryRun, install_reranker, redact, rerank_url, uninstall_reranker
    from ..errors import BackendError, ParameterError
    from .open import open_backend

    if settings.backend not in ("elasticsearch", "opensearch"):
        raise ParameterError("the reranker is installed in a cluster: give --backend elasticsearch or opensearch and --url")
    check_reranker_name(settings.backend, name)  # `*` or `../..` refused before the cluster is touched
    calls = None if remove else rerank_url(server_url)  # as is a bad --server-url
    if not settings.url:
        raise ParameterError(f"the {settings.backend} backend needs --url (or ESQBE_URL, or `url:` in the config file)")
    if not 0 < float(connect_timeout) <= 120:
        raise ParameterError(f"--connect-timeout: expected 0 < seconds <= 120 (got {connect_timeout})")
    out = {"engine": settings.backend, "url": mask_url(settings.url), "index": settings.index, "name": name,
           "calls": calls}
    if dry_run:
        plan = DryRun(settings.backend, settings.url)
        (uninstall_reranker(plan, name=name) if remove else
         install_reranker(plan, server_url, token=token, name=name, id_field=id_field))
        return {**out, "dry_run": True, "requests": redact(plan.requests, [token] if token else [])}
    reachable(settings.url, float(connect_timeout))
    backend: Any = open_backend(settings, create=False)  # an EngineBackend (the engine checked above)
    try:
        backend.retry_attempts = min(backend.retry_attempts, 2)  # an operator's command: answer, do not linger
        if remove:
            return {**out, "parts": uninstall_reranker(backend, name=name)}
        mapping = backend._get_mapping()  # an unreachable or refusing cluster: its own error
        meta = None
        if mapping is not None:
            try:
                meta = backend.meta()
            except BackendError as e:
                raise BackendError(f"install-reranker: {e}; the reranker scores the papers of an esqbe index "
                                   "(written by `esqbe index`, or `esqbe attach`ed)") from e
        if meta is None:
            raise BackendError(f"install-reranker: index {settings.index!r} does not exist at {mask_url(settings.url)} "
                               "(its mapping answers 404): index papers first (`esqbe index`), or give --index")
        if settings.backend == "opensearch":
            fields = _mapped_fields(backend._get_mapping() or {})
            if id_field not in fields:
                top = sorted(f for f in fields if "." not in f)
                raise ParameterError(f"--id-field: {id_field!r} is not a field of index {settings.index!r} (its fields: "
                                     f"{', '.join(top[:20])}{', ...' if len(top) > 20 else ''}); the cluster sends "
                                     "this field of each hit to esqbe as the paper id")
        return {**out, "parts": install_reranker(backend, server_url, token=token, name=name, id_field=id_field)}
    finally:
        backend.close()


def _mapped_fields(mapping: dict, prefix: str = "") -> set[str]:
    """Every field path of a mapping's properties (objects followed, nested ones too)."""
    out: set[str] = set()
    for key, spec in (mapping.get("properties") or {}).items():
        if isinstance(spec, dict):
            out.add(prefix + key)
            out |= _mapped_fields(spec, prefix + key + ".")
    return out


def reachable(url: str, timeout: float) -> None:
    """A TCP connection to the engine URL's host and port within `timeout` seconds, or a BackendError saying so
    (before the client's own retries, which would take many seconds to report a refused or silent address)."""
    import socket
    from urllib.parse import urlsplit

    from ..errors import BackendError, ParameterError

    parts = urlsplit(url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 9200)
    except ValueError as e:
        raise ParameterError(f"--url: {mask_url(url)!r}: {e}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ParameterError(f"--url: expected http(s)://HOST[:PORT] (got {mask_url(url)!r})")
    try:
        socket.create_connection((parts.hostname, port), timeout=timeout).close()
    except OSError as e:
        reason = "no answer" if isinstance(e, TimeoutError) else (e.strerror or str(e))
        raise BackendError(f"cannot connect to {mask_url(url)} within {timeout:g} s ({reason}); "
                           "is the cluster up, and the URL right? (--connect-timeout to wait longer)") from None


def reranker_summary(out: dict) -> str:
    """What `install_engine_reranker` returned, as lines for a person."""
    head = f"{out['engine']} at {out['url']}"
    if out.get("dry_run"):
        lines = [f"Dry run: nothing sent. The requests to {head}, in order:"]
        for n, r in enumerate(out["requests"], 1):
            lines.append(f"{n:>2}. {r['method']} {r['path']}    ({r['when']})")
            if r["body"] is not None:
                import json

                lines += ["      " + x for x in json.dumps(r["body"], indent=2, ensure_ascii=False).splitlines()]
        return "\n".join(lines)
    parts = out["parts"]
    if out.get("calls") is None:  # removed
        gone = [k.replace("_", " ") for k, v in parts.items() if v]
        kept = [k.replace("_", " ") for k, v in parts.items() if not v]
        return (f"{head}: removed {', '.join(gone) or 'nothing'} named {out['name']!r}"
                + (f" ({', '.join(kept)} not there)" if kept and gone else " (none was there)" if not gone else ""))
    lines = [f"esqbe's reranker in {head}, index {out['index']!r}, calling {out['calls']}:"]
    for part, info in parts.items():
        lines.append(f"  {part.replace('_', ' '):<19} {info['id']:<28} {info['status']}")
    if out["engine"] == "elasticsearch":
        lines.append(f"Search with a text_similarity_reranker retriever, \"inference_id\": \"{out['name']}\", "
                     "\"field\": \"paper_id\", \"inference_text\": \"paper:ID facet:method\" (docs/engines.md).")
    else:
        lines.append(f"Search with POST {out['index']}/_search?search_pipeline={out['name']} and "
                     "\"ext\": {\"rerank\": {\"query_context\": {\"query_text\": \"paper:ID facet:method\"}}} "
                     "(docs/engines.md).")
    return "\n".join(lines)


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
        return {"unknown": mask_urls(e)[:300]}
