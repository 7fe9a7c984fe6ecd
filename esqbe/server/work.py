"""What the handlers do, run on a slot's thread with that slot's `Index`: queries, searches, reading
and writing records, deletes, stats and health, as JSON-ready dicts."""
from __future__ import annotations

import io
import json
import time
from dataclasses import asdict

from pydantic import ValidationError

from ..core.deadline import check
from ..index.api import Index
from ..index.merge import Merger
from ..index.reports import IndexReport
from ..ingest.library import sniff_format
from ..ingest.readers import ReadReport, read_papers
from ..query.results import PATH_KEYS, file_names_only, without_record_hashes
from ..query.results import finite as _finite
from ..query.results import jsonable as _jsonable
from ..query.results import sentences_json as _sentences
from ..query.search import facet_selections
from .errors import ApiError, _clean_validation
from .middleware import JSON_LINES_TYPES
from .models import PapersRequest, QueryRequest


def _paper_out(paper, show_paths: bool = False) -> dict:
    """A paper as the server answers it: attachment paths as file names unless the operator shows paths."""
    metadata = without_record_hashes(dict(paper.metadata) if show_paths else file_names_only(paper.metadata))
    predicted = bool(metadata.pop("facets_predicted", False))
    return {"paper_id": paper.paper_id, "title": paper.title, "sentences": _sentences(paper),
            "facets_predicted": predicted, "metadata": _jsonable(metadata)}


def _paper_page(index: Index, paper_id: str, show_paths: bool = False) -> dict | None:
    """A stored paper as GET /papers answers it, with the sentences each facet query of it would use (and why);
    its attachments' paths as file names unless `show_paths`."""
    found = index.get([paper_id])
    if paper_id not in found:
        return None
    out = _paper_out(found[paper_id], show_paths)
    out["facet_queries"] = {facet: asdict(sel) for facet, sel in facet_selections(found[paper_id], index.settings).items()}
    return out


def _run_query(index: Index, req: QueryRequest, text, overrides: dict, show_paths: bool = False) -> dict:
    """The query's result in the one JSON shape (esqbe.query.results), as the client named its word vectors,
    with the total time; the hits' attachment paths as file names unless `show_paths`."""
    t0 = time.perf_counter()
    result = index.query(**_query_arguments(req, text), **overrides)
    exporting = req.format != "json"  # an export carries each hit's abstract
    papers = index.get([h.paper_id for h in result.hits]) if req.with_sentences or exporting else None
    out = result.to_dict(papers)
    if not show_paths:
        for hit in out["hits"]:
            hit["metadata"] = file_names_only(hit["metadata"])
    out["rescorer_params"] = _named_words(out["rescorer_params"], req)
    out["timings_ms"]["total"] = round(1000 * (time.perf_counter() - t0), 2)
    return out


def _query_arguments(req, text) -> dict:
    """The arguments of `Index.query` (and `Index.graph`) for a POST /query (/graph, /watches) body; `text`: its text's
    sentences, or its examples with their texts split (the route's `checked_query`)."""
    filters = [f if isinstance(f, str) else f.model_dump(exclude_none=True) for f in req.filters or []]
    if req.examples is not None or req.avoid:  # a query of several examples (texts already split: `text`)
        examples = text if req.examples is not None else [
            {"paper_id": req.paper_id, "facet": req.facet, "sentences": req.sentences}
            if req.paper_id is not None else {"text": text, "title": req.title, "facet": req.facet, "sentences": req.sentences}]
        return {"examples": [{k: v for k, v in e.items() if v is not None} for e in examples],
                "avoid": [a.model_dump(exclude_none=True) for a in req.avoid or []], "facet": req.facet,
                "filters": filters or None, "engine_filter": req.engine_filter}
    return {"paper_id": req.paper_id, "facet": req.facet, "sentences": req.sentences, "text": text, "title": req.title,
            "filters": filters or None, "engine_filter": req.engine_filter}


def _graph(index: Index, req, text, overrides: dict, show_paths: bool = False) -> dict | str:
    """POST /graph's answer: the query's hits as a graph (esqbe.query.graph), in its JSON shape, or as the GraphML or
    SVG file `req.format` asks for (made here, off the event loop); paths as file names unless `show_paths`."""
    from ..query.graph_formats import render

    t0 = time.perf_counter()
    graph = index.graph(**_query_arguments(req, text), **overrides)
    papers = index.get([h.paper_id for h in graph.result.hits]) if req.with_sentences else None
    out = graph.to_dict(papers)
    if not show_paths:
        for item in (*out["result"]["hits"], *out["nodes"]):
            item["metadata"] = file_names_only(item["metadata"])
    out["result"]["rescorer_params"] = _named_words(out["result"]["rescorer_params"], req)
    out["result"]["timings_ms"]["total"] = out["timings_ms"]["query"]  # the query's own part, as POST /query says it
    out["timings_ms"]["total"] = round(1000 * (time.perf_counter() - t0), 2)
    return out if req.format == "json" else render(out, req.format)


def check_path_filters(filters) -> None:
    """A filter on a key that holds paths (PATH_KEYS) refused (400) where the server hides paths: which papers match
    `attachments^=/home/alice/`, or the near values a filter's error suggests, would tell them."""
    from ..core.filters import FilterError, coerce_filters

    try:
        conditions = coerce_filters([f if isinstance(f, str) else f.model_dump(exclude_none=True) for f in filters or []])
    except FilterError:
        return  # said by the query itself, with its reason
    for c in conditions:
        if c.path.split(".", 1)[0] in PATH_KEYS:
            raise ApiError(400, f"filter {c}: {c.key} holds file paths, which this server does not show or search "
                                "(`esqbe serve --show-paths` for an operator's own server)")


def _named_words(params: dict, req) -> dict:
    """The parameters as the client gave them: a `words` name, not the server's directory behind it."""
    given: dict = req.rescorer_params.model_dump(exclude_unset=True) if req.rescorer_params is not None else {}
    return {**params, "words": given["words"]} if "words" in given and "words" in params else params


def _search(index: Index, q: str, k: int) -> dict:
    """`esqbe search`'s hits (esqbe.index.browse.search_papers): an id, an identifier, an author, then words."""
    from ..index.browse import search_papers

    hits = search_papers(index, q, k)
    for h in hits:
        h["score"] = _finite(h["score"]) or 0.0
    return {"query": q, "hits": hits}


def _parse_papers(ctype: str, body: bytes, fmt: str | None, mode: str | None, max_records: int) -> tuple[list, list, str | None]:
    """A POST /papers body as (papers with their record number, outcomes, facet mode), run off the event loop (under
    the request's deadline: checked between records). One record is one JSON object and gives at most one paper:
    its text is never sniffed for BibTeX (`@...`) or CSL-JSON (`[{...`), which would let one line carry a whole
    library past `--max-batch-records`; the records are counted before any is read, the papers again after."""
    if ctype in JSON_LINES_TYPES:
        lines: list[bytes | str] = [line for line in body.split(b"\n") if line.strip()]  # bytes or str: json reads both
        if not lines:
            raise ApiError(422, "the body has no records")
    else:
        try:
            req = PapersRequest.model_validate_json(body)
        except ValidationError as e:
            errors = e.errors()
            if any(x.get("type") == "json_invalid" for x in errors):
                raise ApiError(400, "the request body is not valid JSON") from None
            raise ApiError(422, "invalid request: " + "; ".join(
                f"{'.'.join(str(x) for x in err.get('loc', ())) or 'body'}: {err.get('msg')}" for err in errors),
                _clean_validation(errors)) from None
        if len(req.records) > max_records:
            raise ApiError(413, f"{len(req.records)} records; at most {max_records} per request")
        lines = [json.dumps(r, ensure_ascii=False) for r in req.records]
        fmt, mode = req.format or fmt, req.facets or mode
    if len(lines) > max_records:
        raise ApiError(413, f"{len(lines)} records; at most {max_records} per request")
    papers, outcomes = _read_records(lines, fmt)
    if len(papers) > max_records:  # one record is one paper: a reader that gave more must not widen the bound
        raise ApiError(413, f"{len(papers)} papers; at most {max_records} per request")
    return papers, outcomes, mode


def _read_records(lines: list, fmt: str | None) -> tuple[list, list[dict]]:
    """Each record read on its own, so each gets its own outcome: (papers with their record number, outcomes)."""
    papers, outcomes = [], []
    for n, line in enumerate(lines):
        check()  # past the request's deadline: the records left are not read
        report = ReadReport()
        stream = io.StringIO(line if isinstance(line, str) else line.decode("utf-8", errors="replace"))
        stream.name = f"record {n}"
        try:
            got = list(read_papers(stream, fmt, report=report, whole_files=False))
        except Exception as e:  # format detection failing is raised at once: this record's error
            field_name = getattr(e, "field", None)
            outcomes.append({"record": n, "paper_id": None, "status": "error", "field": field_name,
                             "reason": getattr(e, "reason", str(e))})
            continue
        if report.errors:
            first = report.errors[0]
            reason = first.reason
            if first.field == "json" and sniff_format(stream.getvalue()[:200]):
                reason += " (a record is one JSON object; BibTeX, RIS and CSL-JSON files are read by `esqbe index`)"
            outcomes.append({"record": n, "paper_id": None, "status": "error", "field": first.field,
                             "reason": reason})
        elif report.skipped:
            outcomes.append({"record": n, "paper_id": None, "status": "skipped", "reason": ", ".join(report.skipped)})
        for p in got:
            papers.append((n, p))
            outcomes.append({"record": n, "paper_id": p.paper_id, "status": "pending"})
    return papers, outcomes


def _merge(index: Index, papers: list, outcomes: list[dict]) -> None:
    """One paper per paper, as `esqbe index` does (esqbe.index.merge): a record naming the same work as an earlier
    record of the request, or as a paper in the index (where the backend keeps an alias table), by DOI, arXiv id or
    PubMed id, takes that paper's id; its outcome says which paper and by what (`merged_into`, `reason`)."""
    report, where = IndexReport(), ReadReport()

    def named():
        for n, p in papers:
            where.source = f"record {n}"
            yield p

    for _ in Merger(lambda: index.backend, report).papers(named(), where):
        pass  # each paper renamed in place
    merged = {int(m["file"].split()[1]): m for m in report.merged}
    for o in outcomes:
        m = merged.get(o["record"])
        if o["status"] == "pending" and m is not None and m["id"] == o["paper_id"]:
            first = f" as {m['into_record']}" if m["into_record"] else ""
            o.update(merged_into=m["into"], reason=f"the same work{first} ({m['by']}): merged into paper {m['into']}")


def _write_papers(index: Index, papers: list, outcomes: list[dict], facets: str | None, stop=None) -> dict:
    """POST /papers on the writer's thread; `stop`: the request's deadline (once it is cancelled no further batch is
    encoded; the batches committed before it stay)."""
    t0 = time.perf_counter()
    if papers:
        _merge(index, papers, outcomes)
    ids = list(dict.fromkeys(p.paper_id for _, p in papers))
    before = index.backend.content_hashes(ids)
    report = index.add_papers([p for _, p in papers], facets=facets, stop=stop) if papers else None
    after = index.backend.content_hashes(ids)
    last = {p.paper_id: n for n, p in papers}
    errors = list(report.errors) if report else []
    for o in outcomes:
        if o["status"] != "pending":
            continue
        pid = o.get("merged_into") or o["paper_id"]
        if last[pid] != o["record"]:
            o.update(status="superseded", reason=f"record {last[pid]} has the same paper id" + (
                f" ({o['reason']})" if o.get("reason") else ""))
        elif pid not in after:
            o.update(status="error", field="paper", reason=next((e for e in errors if pid in e), "not stored"))
        elif pid not in before:
            o["status"] = "indexed"
        else:
            o["status"] = "replaced" if before[pid] != after[pid] else "unchanged"
    count = lambda s: sum(o["status"] == s for o in outcomes)  # noqa: E731
    return {"read": len(outcomes), "indexed": count("indexed"), "replaced": count("replaced"),
            "unchanged": count("unchanged"), "skipped": count("skipped"), "errors": count("error"),
            "records": outcomes, "seconds": round(time.perf_counter() - t0, 3)}


def _delete(index: Index, paper_id: str) -> int:
    return index.delete([paper_id])


def _rerank(index: Index, query, documents: list[str]) -> dict:
    """POST /rerank's answer: every document's score in input order, the unknown ids (esqbe.index.rerank)."""
    result = index.rerank(query, documents)
    return {"results": [{"index": i, "relevance_score": s} for i, s in enumerate(result.scores)],
            "unknown": len(result.unknown), "unknown_ids": result.unknown, "unranked": len(result.unranked),
            "fallback": result.fallback}


def _stats(index: Index) -> dict:
    """The index's stats and, on an engine, what of esqbe's reranker the cluster has (as `esqbe stats` reports)."""
    from ..index.rerank import engine_reranker_status

    out = _jsonable(index.stats())
    reranker = engine_reranker_status(index)
    if reranker is not None:
        out["reranker"] = reranker
    out["follow"] = _followed(index)
    return out


def _followed(index: Index) -> list[dict]:
    """The followed sources (`esqbe follow`) with their mark and their last run's counts and error, as the index keeps
    them (whoever ran them: this server's schedule, or `esqbe follow run`); [] where the backend keeps none."""
    from ..errors import BackendError
    from ..index.follow import FollowsUnsupportedError, list_sources

    try:
        sources = list_sources(index)
    except FollowsUnsupportedError:
        return []
    except BackendError as e:  # the sources' store cannot be read now: said here, the index's counts still answered
        return [{"error": f"the followed sources cannot be read: {e}"}]
    return [_jsonable({k: v for k, v in s.to_dict().items() if k != "state"}) for s in sources]


def hide_source_paths(source: dict) -> None:
    """A followed source as a client of a server that hides paths sees it: a Zotero database's or a folder's name, not
    where it lives; the last error without paths or URLs (esqbe.server.errors)."""
    from pathlib import Path

    from .errors import _redact

    if source.get("kind") in ("zotero", "dir"):
        source["target"] = Path(str(source.get("target") or "")).name
        source["spec"] = f"{source['kind']}:{source['target']}"
    last = source.get("last")
    if isinstance(last, dict) and last.get("error"):
        last["error"] = _redact(str(last["error"]))
    if source.get("error"):
        source["error"] = _redact(str(source["error"]))


def _health(index: Index) -> str:
    meta = index.backend.meta()
    return "empty index" if meta is None else f"{meta.model}, {meta.dim}-d"
