"""The HTTP routes: `make_router(service, options)` answers `/`, `/health`, `/proof`, `/stats`, `/query`, `/graph`,
`/papers/{id}`, `/search`, `POST /rerank`, `POST /papers` and `DELETE /papers/{id}` by handing the work
(esqbe.server.work) to the service's threads; `create_app` includes the router."""
from __future__ import annotations

import asyncio
import time
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Query, Request
from fastapi.responses import FileResponse, JSONResponse, Response

from ..backends.engines.filters import check_safe_clause
from ..core.deadline import Deadline
from ..core.filters import FilterError
from ..errors import EsqbeError
from ..index.rerank import FALLBACKS, rerank_bounds
from ..query.export import EXPORT_FORMATS, export_hits, file_name, media_type
from ..query.graph_formats import MEDIA_TYPES as GRAPH_MEDIA
from ..query.search import query_texts
from .discovery import INDEX_HEADER, NONCE_PATTERN, PROOF_PATH, proof
from .errors import ApiError, _errors, _public, api_error, log
from .feeds import FEED_ENTRIES, MAX_FEED_ENTRIES, add_watch_work, atom_feed, feed_data, watch_list
from .middleware import _PAGE_HEADERS, JSON_LINES_TYPES, _token_ok, _type_message
from .models import (
    DeleteResponse,
    FacetMode,
    GraphRequest,
    GraphResponse,
    Health,
    InputFormat,
    Paper,
    PapersRequest,
    PapersResponse,
    QueryRequest,
    QueryResponse,
    RerankRequest,
    RerankResponse,
    SearchResponse,
    WatchRequest,
)
from .options import ServeOptions, is_loopback
from .schedule import FollowSchedule
from .service import Service
from .work import (
    _delete,
    _graph,
    _health,
    _paper_page,
    _parse_papers,
    _rerank,
    _run_query,
    _search,
    _stats,
    _write_papers,
    check_path_filters,
    hide_source_paths,
)

STATIC_DIR = Path(__file__).resolve().parent / "static"


def make_router(service: Service, options: ServeOptions, schedule: FollowSchedule | None = None) -> APIRouter:
    #: POST /rerank answers given another way than asked, by FALLBACKS key (GET /stats: server.rerank.fallbacks)
    rerank_fallbacks: dict[str, int] = {}
    """The page and the API over `service`, under `options` (limits, words, engine_filter rules)."""
    router = APIRouter()

    def check_engine_filter(request: Request, clause) -> None:
        """An engine_filter over HTTP: the safe clause types only, unless the operator allows raw query DSL
        and the request carries the token; never on the embedded backend (400, the request's fault)."""
        if clause is None:
            return
        if not (options.allow_raw_engine_filter and _token_ok(request.headers.get("authorization"), options.token or "")):
            try:
                check_safe_clause(clause)
            except FilterError as e:
                raise ApiError(400, f"{e}" + (" (raw query DSL needs the bearer token)" if options.allow_raw_engine_filter
                                              else "")) from None
        if service.settings.backend == "embedded":
            raise ApiError(400, "engine_filter needs the elasticsearch or opensearch backend; this index is "
                                "embedded: use filters")

    async def reads(fn, *args):
        try:
            return await service.read(fn, *args)
        except EsqbeError as e:
            raise api_error(e) from None

    async def writes(fn, *args, deadline: Deadline):
        """`fn(index, *args)` on the writer's thread under the request's `deadline`, as reads are (504 past it)."""
        try:
            return await service.write(fn, *args, deadline=deadline)
        except EsqbeError as e:
            raise api_error(e) from None

    # --- the page ---------------------------------------------------------------------------
    @router.get("/", include_in_schema=False)
    async def page():
        return FileResponse(STATIC_DIR / "index.html", headers=_PAGE_HEADERS)

    # --- the API ------------------------------------------------------------------------------
    @router.get("/health", response_model=Health, responses=_errors(503), tags=["service"])
    async def health():
        """200 when the index answers and the model is loaded; 503 while warming up or when the backend is down."""
        backend = service.settings.backend
        if not service.ready.is_set():
            return JSONResponse({"status": "warming", "backend": backend, "detail": "loading the model and index"},
                                status_code=503)
        try:
            detail = await asyncio.wait_for(service.read(_health), timeout=10)
        except TimeoutError:
            return JSONResponse({"status": "unavailable", "backend": backend, "detail": "the readers are busy"},
                                status_code=503)
        except Exception as e:
            return JSONResponse({"status": "unavailable", "backend": backend, "detail": _public(503, str(e))},
                                status_code=503)
        if service.warm_error:
            detail = f"{detail}; warming up failed: {_public(200, service.warm_error)}"
        return {"status": "ok", "backend": backend, "detail": detail}

    @router.get(PROOF_PATH, include_in_schema=False)
    async def prove(request: Request, nonce: str = Query(..., pattern=NONCE_PATTERN)):
        """`esqbe query`'s challenge before it sends a query to a server it found by a discovery record: the proof
        that this process holds the record's secret (esqbe.server.discovery). 404 where this server left none."""
        secret = getattr(request.app.state, "record_secret", None)
        if not secret or not service.index_id:
            raise ApiError(404, "this server left no discovery record")
        return JSONResponse({"proof": proof(secret, nonce, service.index_id)}, headers={INDEX_HEADER: service.index_id})

    @router.get("/stats", responses=_errors(503), tags=["service"])
    async def stats() -> dict[str, Any]:
        """Papers, sentences per facet, model and size of the index, and the server's own state."""
        out = await reads(_stats)
        if not options.show_paths:  # the index's and the model's names, not where they live
            if "path" in out:
                out["path"] = Path(str(out["path"])).name
            if isinstance(out.get("model_source"), str):  # a directory the model was loaded from; a package, hub name kept
                out["model_source"] = location_name(out["model_source"])
            out.pop("url", None)
            reranker = out.get("reranker")
            if isinstance(reranker, dict):  # where the cluster reaches this server; why the cluster would not say
                reranker.pop("calls", None)
                if "unknown" in reranker:
                    reranker["unknown"] = _public(200, reranker["unknown"])
            for source in out.get("follow") or []:  # a library's or folder's name, not where it lives
                hide_source_paths(source)
        out["server"] = {"readers": len(service.readers), "writes_queued": service.writer.pending if service.writer else 0,
                         "uptime_s": round(time.time() - service.started_at, 1), "ready": service.ready.is_set(),
                         # POST /rerank: always answered, behind the write perimeter; its bounds
                         "rerank": {"enabled": True, "token_required": bool(options.token),
                                    "request_timeout_s": options.request_timeout, **rerank_bounds(),
                                    "fallbacks": dict(rerank_fallbacks),
                                    "max_text_sentences": options.max_query_sentences},
                         # `--follow-every`: the schedule of `esqbe follow run` (each source's own state: `follow`)
                         "follow": schedule.status() if schedule is not None else None}
        return out

    async def read_query(run, req: QueryRequest | GraphRequest, request: Request):
        """What POST /query and POST /graph share: the request's filters checked, its query parts checked, then `run`
        on a reader within the request's deadline (from now: a wait for a reader counts)."""
        check_engine_filter(request, req.engine_filter)
        if not options.show_paths:
            check_path_filters(req.filters)
        deadline = Deadline(options.request_timeout)
        text, examples, overrides = checked_query(req)
        try:
            return await service.read(run, req, examples if examples is not None else text, overrides,
                                      options.show_paths, deadline=deadline, request=request)
        except EsqbeError as e:
            raise api_error(e) from None

    @router.post("/query", response_model=QueryResponse, tags=["search"],
                 responses={**_errors(400, 404, 409, 413, 422, 503, 504),
                            200: {"content": {media_type(f).split(";")[0]: {"schema": {"type": "string"}}
                                              for f in EXPORT_FORMATS}}})
    async def query(req: QueryRequest, request: Request, response: Response):
        """Papers most similar to a paper's facet, to chosen sentences, or to a text, with the sentences that matched."""
        out = await read_query(_run_query, req, request)
        # which index answered: `esqbe query` checks it against the index a discovery record promised
        which = {INDEX_HEADER: service.index_id} if service.index_id else {}
        if req.format in EXPORT_FORMATS:  # the hits as a file (the page's download button)
            return Response(export_hits(out, req.format, with_scores=req.with_scores), media_type=media_type(req.format),
                            headers={"Content-Disposition": f'attachment; filename="{file_name(req.format)}"', **which})
        response.headers.update(which)
        return out

    @router.post("/graph", response_model=GraphResponse, tags=["search"],
                 responses={**_errors(400, 404, 409, 413, 422, 503, 504),
                            200: {"content": {GRAPH_MEDIA[f]: {"schema": {"type": "string"}} for f in ("graphml", "svg")}}})
    async def graph(req: GraphRequest, request: Request, response: Response):
        """The hits of a query (what POST /query takes; k at most 100) as a graph: edges by the rescorer's similarity
        between each two hits in the query's facet, groups where the hits split, a seeded layout; JSON, or GraphML
        (Gephi, Cytoscape) or SVG as a file (`format`)."""
        out = await read_query(_graph, req, request)
        if isinstance(out, str):
            return Response(out, media_type=GRAPH_MEDIA[req.format], headers={
                "Content-Disposition": f'attachment; filename="esqbe-graph.{req.format}"'})
        return out

    def checked_query(req):
        """A query's (or a watch's) free texts split and counted before any work, all together at most the server's
        `max_query_sentences`, each text whole whichever sentences it chooses (esqbe.query.search.query_texts; 413),
        the sentences chosen bounded too: (the text's sentences, the examples with theirs, the settings overrides).
        Splitting at most MAX_QUERY_CHARS (refused before anything is split) costs a few milliseconds."""
        limit = options.max_query_sentences
        texts = [req.text] if req.text is not None else [e.text for e in req.examples or [] if e.text is not None]
        try:
            split = query_texts(texts, max_sentences=limit)
            overrides = req.overrides(options.words)
        except EsqbeError as err:  # a text past the caps: 413 (QueryTooLargeError); bad overrides: 400
            raise api_error(err) from None
        if any(not sents for sents in split):
            raise ApiError(400, "the query text has no sentences" if req.text is not None
                           else "an example's text has no sentences")
        if req.sentences is not None and len(set(req.sentences)) > limit:
            raise ApiError(413, f"{len(set(req.sentences))} sentences chosen; at most {limit} per query")
        if req.examples is None:
            return (split[0] if req.text is not None else None), None, overrides
        out, known, texts_left = [], sum(map(len, split)), iter(split)
        for e in req.examples:
            item = e.model_dump(exclude_none=True)
            if e.text is not None:
                item["text"] = next(texts_left)
            else:
                known += len(set(e.sentences or []))
            out.append(item)
        if known > limit:
            raise ApiError(413, f"the examples have {known} query sentences together; at most {limit} per query")
        return None, out, overrides

    @router.get("/papers/{paper_id:path}", response_model=Paper, responses=_errors(404, 503), tags=["papers"])
    async def get_paper(paper_id: str):
        """A stored paper: title, sentences with their facet labels, metadata."""
        found = await reads(_paper_page, paper_id, options.show_paths)
        if found is None:
            raise ApiError(404, f"paper {paper_id} is not in the index")
        return found

    @router.get("/search", response_model=SearchResponse, responses=_errors(422, 503), tags=["search"])
    async def search(q: str = Query(min_length=1, max_length=1000, description="a paper id, or title/abstract words"),
                     k: int = Query(10, ge=1, le=100)):
        """Find a paper to query by: an exact paper id first, then BM25 over title and abstract words."""
        return await reads(_search, q, k)

    @router.post("/papers", response_model=PapersResponse,
              responses=_errors(400, 401, 409, 413, 415, 422, 503, 504), tags=["papers"],
              openapi_extra={"requestBody": {"required": True, "content": {
                  "application/json": {"schema": PapersRequest.model_json_schema()},
                  "application/x-ndjson": {"schema": {"type": "string", "description": "JSON Lines, any format esqbe reads"}},
              }}})
    async def add_papers(request: Request,
                         format: InputFormat | None
                         = Query(None, description="input format (default: detected per record)"),
                         facets: FacetMode | None
                         = Query(None, description="keep (default) | predict | none: what happens to facet labels")):
        """Upsert a batch of papers by id (any input format esqbe reads); each record gets its own outcome.

        Body: `{"records": [...], "format"?, "facets"?}` as JSON, or JSON Lines
        (`Content-Type: application/x-ndjson`, format and facets as query parameters)."""
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype not in (*JSON_LINES_TYPES, "application/json"):  # the perimeter refuses them before the body is read
            raise ApiError(415, _type_message(ctype))
        body = await request.body()
        deadline = Deadline(options.request_timeout)
        try:  # parsed off the event loop, under the request's deadline: /health and queries answer meanwhile
            papers, outcomes, mode = await service.parse(_parse_papers, ctype, body, format, facets,
                                                         options.max_batch_records, deadline=deadline)
        except EsqbeError as e:
            raise api_error(e) from None
        # written under the same deadline: past it no further batch is encoded (what was committed stays: sent
        # again, its papers are unchanged and skipped)
        return await writes(_write_papers, papers, outcomes, mode, deadline, deadline=deadline)

    @router.get("/watches", responses=_errors(503), tags=["watches"])
    async def watches(latest: int = Query(5, ge=0, le=50)) -> list[dict[str, Any]]:
        """The index's watches (`esqbe watch add`), each with its `latest` matches and its feed's path (never its
        secret); an empty list on a backend that keeps none."""
        return await reads(watch_list, latest)

    @router.post("/watches", responses=_errors(400, 404, 409, 413, 422, 503, 504), tags=["watches"])
    async def add_watch(req: WatchRequest) -> dict[str, Any]:
        """Save a query (what POST /query takes) as a watch named `name` with the threshold `min_score` (default: the
        index's strong matches); answers the watch and its feed's path with its secret. A write: the token where the
        server has one. Its texts are split and counted as a query's, here, before the writer's thread sees them; the
        write runs under the request deadline."""
        if not options.show_paths:
            check_path_filters(req.filters)
        deadline = Deadline(options.request_timeout)
        text, examples, overrides = checked_query(req)
        return await writes(add_watch_work, req, examples if examples is not None else text, overrides,
                            deadline=deadline)

    @router.get("/watches/{name}.atom", response_class=Response, tags=["watches"],
                responses={**_errors(400, 401, 404, 422, 503),
                           200: {"content": {"application/atom+xml": {"schema": {"type": "string"}}}}})
    async def watch_feed(name: str, request: Request, key: str | None = Query(None, max_length=200),
                         limit: int = Query(FEED_ENTRIES, ge=1, le=MAX_FEED_ENTRIES)):
        """A watch's matches as an Atom 1.0 feed, newest first (`esqbe watch run` finds them). On a private server
        the feed's secret URL (`?key=`, from `esqbe watch show NAME`) or the bearer token; an unknown watch is
        refused alike."""
        from ..index.watches import WatchNotFoundError, feed_key_ok

        try:
            watch, matches = await service.read(feed_data, name, limit)
        except WatchNotFoundError:
            if options.private:
                raise ApiError(401, "this feed needs its secret URL or the bearer token") from None
            raise ApiError(404, f"no watch named {name}") from None
        except EsqbeError as e:
            raise api_error(e) from None
        if options.private and not (feed_key_ok(watch, key) or _token_ok(request.headers.get("authorization"),
                                                                          options.token or "")):
            raise ApiError(401, "this feed needs its secret URL or the bearer token")
        # the public base URL (--public-url); else, on loopback, the address this request came to (its Host is a
        # loopback name: the perimeter checked it), so that the links work where the server is mounted
        base = options.public_url or (str(request.base_url).rstrip("/") + "/" if is_loopback(options.host)
                                      else options.base_url())
        self_url = base + f"watches/{quote(name, safe='')}.atom" + (f"?key={quote(key, safe='')}" if key else "")
        return Response(atom_feed(watch, matches, self_url=self_url, base_url=base),
                        media_type="application/atom+xml; charset=utf-8")

    @router.delete("/papers/{paper_id:path}", response_model=DeleteResponse,
                responses=_errors(401, 404, 503, 504), tags=["papers"])
    async def delete_paper(paper_id: str):
        """Delete a paper by id."""
        if not await writes(_delete, paper_id, deadline=Deadline(options.request_timeout)):
            raise ApiError(404, f"paper {paper_id} is not in the index")
        return {"deleted": paper_id}

    @router.post("/rerank", response_model=RerankResponse, responses=_errors(400, 401, 413, 415, 422, 503, 504),
                 tags=["search"])
    async def rerank(req: RerankRequest, request: Request, response: Response):
        """Score a search engine's candidates (esqbe paper ids) against a query in esqbe's rerank grammar; scores in
        input order, the Cohere rerank shape Elasticsearch's `custom` inference service and OpenSearch's ML connectors
        parse (`esqbe engine install-reranker`). Unknown ids score lowest and are counted in X-Esqbe-Rerank-Unknown.
        A well-formed query is answered whatever the index holds: a facet the query lacks, sentence indices past the
        paper's or a query paper not in the index fall back (X-Esqbe-Rerank-Fallback names how; GET /stats counts
        them); only malformed requests are refused."""
        from ..index.rerank import check_documents, parse_rerank_query

        deadline = Deadline(options.request_timeout)
        try:  # the grammar and the bounds before any work
            query = parse_rerank_query(req.query, max_sentences=options.max_query_sentences)
            documents = check_documents(req.documents)
        except EsqbeError as e:
            raise api_error(e) from None
        try:
            out = await service.read(_rerank, query, documents, deadline=deadline, request=request)
        except EsqbeError as e:
            raise api_error(e) from None
        if out["unknown"]:
            log.warning("rerank: %d of %d documents are not in the index (first: %s)", out["unknown"], len(documents),
                        ", ".join(repr(i[:80]) for i in out["unknown_ids"][:3]))
        response.headers["X-Esqbe-Rerank-Unknown"] = str(out["unknown"])
        response.headers["X-Esqbe-Rerank-Unranked"] = str(out["unranked"])
        if out["fallback"]:  # answered, another way than asked (esqbe.index.rerank.FALLBACKS): said so, and counted
            response.headers["X-Esqbe-Rerank-Fallback"] = out["fallback"]
            rerank_fallbacks[out["fallback"]] = rerank_fallbacks.get(out["fallback"], 0) + 1
            log.info("rerank: %s", FALLBACKS[out["fallback"]])
        return {"results": out["results"], "unknown": out["unknown"]}

    return router


def location_name(location: str) -> str:
    """A model's location as a client of a server that hides paths sees it: a directory (absolute, on this system or
    a Windows one) by its own name; an installed package's or a hub model's name as it is."""
    if PurePosixPath(location).is_absolute() or PureWindowsPath(location).is_absolute():
        return PureWindowsPath(location).name if "\\" in location else PurePosixPath(location).name
    return location


def write_endpoints() -> list[str]:
    """`METHOD /path` of every write endpoint of the route table (what the token guards: middleware.is_write), for
    `esqbe serve --help` and the refusal to listen beyond loopback without a token, so that neither can drift."""
    from .middleware import is_write

    router = make_router(None, ServeOptions(host="127.0.0.1"))  # type: ignore[arg-type]  # the table, no service
    found = {(m, str(getattr(r, "path", "")).replace(":path}", "}")) for r in router.routes
             for m in sorted(getattr(r, "methods", None) or ()) if is_write(m, str(getattr(r, "path", "")))}
    return [f"{m} {p}" for m, p in sorted(found, key=lambda x: (x[1], x[0]))]
