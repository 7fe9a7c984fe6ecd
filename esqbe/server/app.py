"""`esqbe serve`: the Python API (esqbe.index.api) as a JSON HTTP service and a page, on any backend.

A thin layer: request and response models, limits, auth and error statuses live here; every
answer comes from `esqbe.index.api.Index`. The model and the index are opened once and kept warm.

Concurrency: each `Index` lives in one thread of its own (the embedded backend's SQLite handle
must stay on the thread that opened it), so the server keeps

- one *writer* (`POST /papers`, `DELETE /papers/{id}`): one thread, and a lock, so there is a
  single writer at a time; further writes wait in a short queue (503 with Retry-After past it);
- one or more *readers* (queries, papers, search, stats), each with its own thread, index handle
  and encoder, which never wait for the writer: a write becomes visible to them when it commits.

Embed it with the app factory, saying who can reach it (the app cannot see where its host listens):

    from esqbe.server import ServeOptions, create_app
    app = create_app(path="esqbe-index", options=ServeOptions(host="127.0.0.1"))   # only this machine reaches it
    app = create_app(path="esqbe-index", options=ServeOptions(host="0.0.0.0", token=TOKEN))  # others do
    parent_app.mount("/esqbe", app)                  # inside an existing FastAPI / Starlette app

`create_app` refuses options that name neither a host nor a token: a parent app listening on all
interfaces would otherwise serve the write endpoints without a token.

The perimeter (`_Perimeter`, before any body byte is read): the Host header (loopback names only on a
loopback connection, `allowed_hosts` otherwise), the Origin of writes (own origin or a CORS origin), the
bearer token (writes; reads too when `private`), and JSON / JSON Lines bodies only for writes.
Clients get error messages without filesystem paths or engine URLs; the log has them, by request id.
"""
from __future__ import annotations

import asyncio
import hmac
import io
import ipaddress
import json
import logging
import os
import re
import secrets
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Annotated, Any, Callable, Literal

import numpy as np
from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
    model_validator,
)
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..backends.base import WriteLockBusy
from ..backends.engines.filters import check_safe_clause
from ..core.deadline import Cancelled, Deadline
from ..core.filters import FilterError
from ..core.limits import MAX_REQUEST_TIMEOUT_S, REQUEST_TIMEOUT_S
from ..domain import QUERY_FACETS, FirstStageRequest
from ..errors import BackendError, ModelMismatchError
from ..index.api import Index
from ..ingest.readers import ReadReport, read_papers
from ..query.search import QueryError, QueryTooLargeError, query_sentences
from ..rescore.rescorers import available_rescorers, rescorer_params
from ..settings.config import ConfigError, Settings, load_settings

log = logging.getLogger("esqbe.server")

STATIC_DIR = Path(__file__).resolve().parent / "static"
MAX_K = 1000
#: a name for word vectors the operator configured (`esqbe serve --words NAME=DIR`): no path separators
WORDS_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
RESCORERS = ("summax", "ts", "ot", "asym", "asym_token", "none")
#: what a hit's `similarity` is, per rescorer (comparable across queries of one rescorer)
SIMILARITY = {
    "ts": "best cosine of any query sentence with any candidate sentence (-1..1)",
    "summax": "mean over query sentences of the best cosine with a candidate sentence (-1..1)",
    "ot": "minus the optimal-transport cost between query and candidate sentences (L2 distances; 0 is identical)",
    "asym": "weighted mean over query sentences of the best max(cos, 0)^d (0..1)",
    "asym_token": "mean over query sentences of token-level coverage by a candidate sentence (0..1)",
    "none": "no rescorer: null (first-stage order; see knn and bm25)",
}
#: what the weight of a matched sentence pair is, per rescorer
MATCH_WEIGHT = {
    "ts": "cosine", "summax": "cosine", "ot": "transport plan mass", "asym": "max(cos, 0)^d",
    "asym_token": "token coverage", "none": "cosine",
}


class ServeOptions(BaseModel):
    """How the server runs (not what it searches: that is `Settings`)."""

    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"
    port: int = 8000
    #: bearer token for the write endpoints; required whenever `host` is not a loopback address
    token: str | None = None
    #: reader threads, each with its own index handle and encoder (default: 1 embedded, 4 engines)
    readers: int | None = Field(None, ge=1, le=64)
    max_body_bytes: int = Field(16 * 1024 * 1024, ge=1024)
    max_query_sentences: int = Field(64, ge=1)
    max_batch_records: int = Field(1000, ge=1)
    max_queued_writes: int = Field(8, ge=1)
    #: origins allowed to call the API from a browser page of their own (CORS); none = CORS off
    cors_origins: list[str] = Field(default_factory=list)
    #: load the model and the kNN structures before answering (health says "warming" until then)
    warm: bool = True
    #: Host header names answered (besides loopback names on loopback connections); empty: any when exposed
    allowed_hosts: list[str] = Field(default_factory=list)
    #: reads need the token too (a private library), not only writes
    private: bool = False
    #: a request carrying the token may send any engine_filter (raw query DSL); otherwise only SAFE_CLAUSES
    allow_raw_engine_filter: bool = False
    #: seconds a write waits for another writer's lock on the embedded index before answering 503
    write_lock_timeout: float = Field(30.0, gt=0, le=3600)
    #: show the index path and engine URL in /stats and error messages (only for an operator's own use)
    show_paths: bool = False
    #: word vectors a query may use by name (`rescorer_params: {"words": NAME}` for asym_token): NAME -> the
    #: directory from `esqbe train-words`. Only these: a client never names a directory (a pickle is loaded from it)
    words: dict[Annotated[str, Field(pattern=WORDS_NAME)], str] = Field(default_factory=dict)
    #: seconds a query may take, its wait for a reader included, before it is abandoned with 504
    request_timeout: float = Field(REQUEST_TIMEOUT_S, gt=0, le=MAX_REQUEST_TIMEOUT_S)


def is_loopback(host: str) -> bool:
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


MIN_TOKEN_LENGTH = 16
#: request bodies a write accepts: JSON and JSON Lines (never text/plain or forms, which any page may send cross-site)
JSON_LINES_TYPES = ("application/x-ndjson", "application/jsonl", "application/json-lines", "application/x-jsonlines")
WRITE_TYPES = ("application/json", *JSON_LINES_TYPES)


def check_exposure(options: ServeOptions) -> None:
    """Refuse to expose the write endpoints beyond this machine without a token, weak tokens, and options
    that need a token without one."""
    if not is_loopback(options.host) and not options.token:
        raise ConfigError(
            f"refusing to listen on {options.host}: the write endpoints (POST /papers, DELETE /papers/{{id}}) "
            "need a bearer token when the host is not loopback; set ESQBE_TOKEN or pass --token-file"
        )
    if options.token is not None and len(options.token) < MIN_TOKEN_LENGTH:
        raise ConfigError(f"the token has {len(options.token)} characters; use at least {MIN_TOKEN_LENGTH} "
                          "(e.g. `openssl rand -hex 16`)")
    for flag, wanted in (("--private", options.private), ("--allow-raw-engine-filter", options.allow_raw_engine_filter)):
        if wanted and not options.token:
            raise ConfigError(f"{flag} needs a token (ESQBE_TOKEN or --token-file)")


# ------------------------------------------------------------------------------------------------
# Request and response models


class FirstStageOptions(BaseModel):
    """The first stage (BM25 + sentence kNN, fused) before rescoring. Unset fields use the server's settings."""

    # optional fields default to None (unset) but accept no explicit null: what the schema says is what is accepted
    model_config = ConfigDict(extra="forbid")

    depth: int = Field(None, ge=1, le=MAX_K, description="first-stage candidates handed to the rescorer")
    knn_k: int = Field(None, ge=1, le=MAX_K, description="papers per query sentence from the kNN")
    bm25_k: int = Field(None, ge=1, le=MAX_K, description="papers from BM25")
    fusion: Literal["rrf", "linear", "bm25", "knn"] = Field(None, description="how BM25 and kNN are fused")
    bm25_weight: float = Field(None, ge=0, le=1, description="BM25's weight in linear fusion")
    candidate_facet: Literal["auto", "same", "all", "soft"] = Field(
        None, description="same: a facet query matches candidate sentences of that facet; all: every sentence; "
                          "soft: every sentence, other facets' sentences penalised; auto (default): soft for papers "
                          "whose labels were predicted, same for given labels")


class FilterCondition(BaseModel):
    """One metadata condition, the structured form of a filter string such as `year>=2019` (esqbe.core.filters)."""

    model_config = ConfigDict(extra="forbid")

    key: str = Field(..., min_length=1, max_length=200, description="a dotted metadata key: year, venue, authors.name, external_ids.doi")
    op: Literal["=", "!=", "<", "<=", ">", ">=", "in", "not in", "exists", "not exists"]
    value: str | float | int | list[str | float | int] = Field(
        None, description="the value (a list for in / not in; absent for exists / not exists)")


def _rescorer_params_model() -> type[BaseModel]:
    """The parameters a client may set, from the rescorers' declarations (esqbe.rescore.rescorers.Param): each with its
    type and bounds, so the schema shows them and anything else is refused (422). Which ones the chosen
    rescorer takes is checked when it is made (400 naming them). `words` is a name of the server's
    (`ServeOptions.words`), never a directory."""
    declared: dict[str, tuple] = {}
    for name in available_rescorers():
        for p in rescorer_params(name):
            if p.http:
                declared.setdefault(p.name, (p, []))[1].append(name)
    fields: dict[str, Any] = {}
    for key, (p, owners) in declared.items():
        help_text = f"{', '.join(owners)}: {p.help}"
        if p.type in (int, float):
            fields[key] = (p.type, Field(None, ge=p.low, le=p.high, strict=True, description=help_text))
        elif p.type is str and p.choices:
            fields[key] = (Literal[p.choices], Field(None, description=help_text))
        else:
            fields[key] = (p.type, Field(None, description=help_text))
    fields["words"] = (str, Field(None, pattern=WORDS_NAME, description=(
        "asym_token: word vectors by the name the server was started with (`esqbe serve --words NAME=DIR`); "
        "default: the encoder's token vectors")))
    return create_model("RescorerParams", __config__=ConfigDict(extra="forbid"), **fields)


RescorerParams = _rescorer_params_model()


class QueryRequest(BaseModel):
    """A query: a paper from the index (`paper_id`) or a text, and which of its sentences form the query
    (a `facet`, chosen `sentences`, or all of them)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={
        # exactly one of paper_id / text; facet and sentences exclude each other
        "oneOf": [{"required": ["paper_id"]}, {"required": ["text"]}],
        "not": {"required": ["facet", "sentences"]},
        "examples": [
            {"paper_id": "csabstruct-train-0000", "facet": "method", "k": 10},
            {"paper_id": "csabstruct-train-0000", "sentences": [0, 2], "rescorer": "ot"},
            {"text": "We propose a parser. It is evaluated on treebanks.", "title": "A parser", "facet": "method"},
        ]})

    paper_id: str = Field(None, min_length=1, max_length=512, description="a paper in the index")
    text: str | list[str] = Field(
        None, description="a paper not in the index: its abstract, or its sentences as a list (encoded now; "
                          "facet labels predicted when a facet is asked for)")
    title: str = Field("", max_length=2000, description="title of the `text` paper (helps contextual vectors)")
    facet: Literal["background", "method", "result"] = Field(
        None, description="use the query paper's sentences labelled with this facet")
    sentences: list[Annotated[int, Field(ge=0)]] = Field(
        None, min_length=1, description="use these sentences of the query paper (0-based)")
    k: int = Field(10, ge=1, le=MAX_K, description="number of hits")
    rescorer: Literal["summax", "ts", "ot", "asym", "asym_token", "none"] = Field(
        None, description="default: the server's settings (summax)")
    rescorer_params: RescorerParams = Field(
        None, description='rescorer parameters, e.g. {"tau": 0.5} for ot or {"d": 4} for asym')
    bm25_weight: float = Field(None, ge=0, le=1, description="fuse the rescorer's similarity with BM25 into the "
                                                             "rank score (0 = similarity alone)")
    first_stage: FirstStageOptions = Field(None, description="first-stage options")
    with_sentences: bool = Field(False, description="include every sentence (and facet) of each hit")
    filters: list[Annotated[str, Field(min_length=1, max_length=1000)] | FilterCondition] = Field(
        None, max_length=64, description="metadata conditions the candidates must all satisfy, applied before ranking: "
                                         "grammar strings ('year>=2019', 'venue in (ACL, EMNLP)') or {key, op, value} objects")
    engine_filter: dict[str, Any] = Field(
        None, description='Elasticsearch/OpenSearch only: one query DSL clause the candidates must also match, e.g. {"term": {"lang": "en"}}')

    @model_validator(mode="after")
    def _one_query(self):
        if (self.paper_id is None) == (self.text is None):
            raise ValueError("give exactly one of paper_id or text")
        if self.facet is not None and self.sentences is not None:
            raise ValueError("give either facet or sentences, not both")
        return self

    def overrides(self, words: dict[str, str] | None = None) -> dict:
        """Settings fields this request changes (the Python API's `Index.query(**overrides)`); a `words`
        name becomes its directory in `words` (the server's), an unknown name is an error."""
        out: dict[str, Any] = {"k": self.k, "rescorer": self.rescorer, "final_bm25_weight": self.bm25_weight}
        if self.rescorer_params is not None:
            params = self.rescorer_params.model_dump(exclude_unset=True)
            if "words" in params:
                name, words = params["words"], words or {}
                if name not in words:
                    raise QueryError(f"no word vectors named {name!r} on this server; " + (
                        f"it offers {', '.join(sorted(words))}" if words else
                        "it offers none (the operator names them with esqbe serve --words NAME=DIR)"))
                params["words"] = words[name]
            out["rescorer_params"] = params
        elif self.rescorer is not None:
            out["rescorer_params"] = {}  # another rescorer than the configured one: not the configured one's params
        fs = self.first_stage
        if fs is not None:
            out.update(rescore_depth=fs.depth, knn_k=fs.knn_k, bm25_k=fs.bm25_k, fusion=fs.fusion,
                       fusion_bm25_weight=fs.bm25_weight, candidate_facet=fs.candidate_facet)
        return {key: value for key, value in out.items() if value is not None}


class Sentence(BaseModel):
    index: int
    text: str
    facet: str


class MatchedPair(BaseModel):
    query_index: int = Field(description="index of the query sentence in the query paper")
    query_sentence: str
    candidate_index: int = Field(description="index of the sentence in the hit's paper")
    candidate_sentence: str
    candidate_facet: str
    weight: float = Field(description="how strongly they match (see the response's match_weight)")


class Hit(BaseModel):
    rank: int
    paper_id: str
    title: str
    similarity: float | None = Field(description="the rescorer's own similarity: comparable across queries "
                                                 "(see the response's `similarity`)")
    score: float = Field(description="the rank score this query sorted by (similarity fused with BM25, "
                                     "min-max scaled within this query): compare only within one query")
    first_stage_score: float
    bm25: float
    knn: float = Field(description="first stage: mean over query sentences of the best cosine the kNN found")
    matches: list[MatchedPair]
    metadata: dict[str, Any] = Field(default_factory=dict, description="the paper's stored metadata (year, venue, authors, ids, ...)")
    sentences: list[Sentence] | None = None


class QueryInfo(BaseModel):
    paper_id: str | None
    title: str | None = None
    facet: str | None
    filters: list[dict[str, Any]] = Field(default_factory=list, description="the metadata conditions applied, as {key, op, value}")
    sentences: list[Sentence]


class QueryResponse(BaseModel):
    query: QueryInfo
    rescorer: str
    rescorer_params: dict[str, Any]
    similarity: str = Field(description="what a hit's similarity is for this rescorer")
    match_weight: str = Field(description="what a matched pair's weight is for this rescorer")
    hits: list[Hit]
    timings_ms: dict[str, float]


class Paper(BaseModel):
    paper_id: str
    title: str
    sentences: list[Sentence]
    facets_predicted: bool = Field(False, description="facet labels come from esqbe's tagger, not the input")
    metadata: dict[str, Any]


class SearchHit(BaseModel):
    paper_id: str
    title: str
    score: float = Field(description="BM25 over title and abstract")
    match: Literal["id", "words"]
    sentences: int
    first_sentence: str


class SearchResponse(BaseModel):
    query: str
    hits: list[SearchHit]


class PapersRequest(BaseModel):
    """Records in any input format `esqbe index` reads (detected per record unless `format` is given)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"records": [{"id": "p1", "title": "A parser", "abstract": "We propose a parser. It is fast."}]},
    ]})

    records: list[dict[str, Any]] = Field(min_length=1, description="one JSON object per paper")
    format: Literal["s2orc", "s2ag-abstracts", "s2ag-s2orc", "csfcube", "csabstruct", "jsonl"] = Field(None, description="input format (default: detected per record)")
    facets: Literal["keep", "predict", "none"] = Field(
        None, description="keep: given labels, tag papers without (default); predict: tag all; none: never tag")


class RecordOutcome(BaseModel):
    record: int = Field(description="0-based position in the request")
    paper_id: str | None
    status: Literal["indexed", "replaced", "unchanged", "superseded", "skipped", "error"]
    field: str | None = None
    reason: str | None = None


class PapersResponse(BaseModel):
    read: int
    indexed: int
    replaced: int
    unchanged: int
    skipped: int
    errors: int
    records: list[RecordOutcome]
    seconds: float


class DeleteResponse(BaseModel):
    deleted: str


class Health(BaseModel):
    status: Literal["ok", "warming", "unavailable"]
    backend: str
    detail: str | None = None


class ErrorBody(BaseModel):
    status: int
    message: str
    details: list[dict[str, Any]] | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody


def _errors(*codes: int) -> dict:
    text = {400: "the request cannot be answered as asked", 401: "missing or wrong bearer token",
            404: "no such paper", 409: "conflicts with the index (empty index, another model)",
            413: "too large (body bytes, sentences, records)", 415: "unsupported content type",
            422: "invalid request", 503: "not ready, backend unavailable, or writer busy",
            504: "the request took longer than the server's request timeout and was abandoned"}
    return {c: {"model": ErrorResponse, "description": text[c]} for c in codes}


# ------------------------------------------------------------------------------------------------
# Errors as JSON, with the right status


class ApiError(Exception):
    def __init__(self, status: int, message: str, details: list | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.details, self.headers = status, message, details, headers


def _error_response(status: int, message: str, details: list | None = None, headers: dict | None = None) -> JSONResponse:
    body: dict[str, Any] = {"status": status, "message": _public(status, message)}
    if details is not None:
        body["details"] = details
    return JSONResponse({"error": body}, status_code=status, headers=headers)


#: an absolute path (its first component a directory of this machine's root decides: /papers/x is a route, not a path)
_ABS_PATH = re.compile(r"(?<![\w/:.<])/(?:[\w.@~+%-]+/)*[\w.@~+%-]+")
_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s'\"<>]+", re.IGNORECASE)


def _redact(message: str) -> str:
    """The message without filesystem paths and URLs (engine addresses, maybe with credentials)."""
    def path(m: re.Match) -> str:
        first = m.group().lstrip("/").split("/", 1)[0]
        return "<path>" if first and os.path.isdir("/" + first) else m.group()

    return _ABS_PATH.sub(path, _URL.sub("<url>", message))


def _public(status: int, message: str) -> str:
    """What a client is told: the message minus internals; when something was taken out, the full message
    goes to the log under a request id that the client gets instead."""
    clean = _redact(message)
    if clean == message:
        return message
    rid = secrets.token_hex(4)
    log.warning("request %s answered %s: %s", rid, status, message)
    return f"{clean} (request {rid}: the server log has the details)"


def _status_of(exc: BaseException) -> int:
    from ..query.search import EmptyIndexError, PaperNotFoundError

    if isinstance(exc, PaperNotFoundError):
        return 404
    if isinstance(exc, (EmptyIndexError, ModelMismatchError)):
        return 409
    if isinstance(exc, BackendError):
        return 503
    return 400  # QueryError, ValueError: the request cannot be answered as asked


def _clean_validation(errors: list) -> list[dict]:
    out = []
    for e in errors:
        item = {"loc": [str(x) for x in e.get("loc", ())], "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
        out.append(item)
    return out


# ------------------------------------------------------------------------------------------------
# The service: a writer and readers, each an Index in a thread of its own


class _Slot:
    """One `Index` owned by one thread; everything done with it runs on that thread."""

    def __init__(self, name: str, opener: Callable[[], Index]):
        self.name = name
        self.pending = 0  # submitted and not finished
        self._count = threading.Lock()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"esqbe-{name}")
        self.index: Index = self._executor.submit(opener).result()

    def submit(self, fn: Callable, *args) -> Future:
        with self._count:
            self.pending += 1
        future = self._executor.submit(fn, self.index, *args)
        future.add_done_callback(lambda _: self._done())
        return future

    def _done(self):
        with self._count:
            self.pending -= 1

    def close(self) -> None:
        try:
            self._executor.submit(self.index.close).result(timeout=30)
        finally:
            self._executor.shutdown(wait=False, cancel_futures=True)


class Service:
    """What the HTTP layer talks to: opens the index once (a writer and `readers` readers) and keeps it warm."""

    def __init__(self, settings: Settings, options: ServeOptions, encoder=None):
        self.settings = settings
        self.options = options
        self._shared_encoder = encoder
        self._lock = threading.Lock()
        self.write_lock = threading.Lock()  # the single writer
        self.writer: _Slot | None = None
        self.readers: list[_Slot] = []
        self.ready = threading.Event()
        self.warm_error: str | None = None
        self.started_at = time.time()
        self.closed = False
        self.timed_out = 0  # queries given up at their deadline
        self.abandoned = 0  # queries given up because their client went away

    @property
    def n_readers(self) -> int:
        if self.options.readers:
            return self.options.readers
        return 1 if self.settings.backend == "embedded" else 4

    def _open(self, create: bool) -> Index:
        """An index handle with an encoder of its own (tokenizers are not safe to share across threads)."""
        from ..index.api import open_backend

        backend = open_backend(self.settings, create=create)
        encoder = self._shared_encoder
        if encoder is None:
            from ..encode.encoder import Encoder

            meta = backend.meta()
            model = self.settings.model or (meta.model if meta else None)
            encoder = Encoder.load(model, device=self.settings.device, batch_size=self.settings.batch_size)
        index = Index(backend, self.settings, encoder=encoder)
        index.check_model()
        return index

    def start(self) -> "Service":
        with self._lock:
            if self.writer is not None:
                return self
            if self.closed:
                raise BackendError("the service is shut down")
            self.writer = _Slot("writer", lambda: self._open(create=True))
            if self.writer.submit(_create_if_absent).result() is None:
                log.warning("the index (%s) is empty: POST /papers or `esqbe index` fills it", _where(self.settings))
            self.readers = [_Slot(f"reader-{i}", lambda: self._open(create=False)) for i in range(self.n_readers)]
            if self.options.warm:
                threading.Thread(target=self._warm_all, name="esqbe-warm", daemon=True).start()
            else:
                self.ready.set()
        return self

    def _warm_all(self) -> None:
        futures = [slot.submit(_warm) for slot in self.readers]
        futures.append(self.writer.submit(_warm_writer))
        for f in futures:
            try:
                f.result()
            except Exception as e:  # reported by /health; queries report their own errors
                self.warm_error = f"{type(e).__name__}: {e}"
                log.warning("warming up failed: %s", self.warm_error)
        self.ready.set()

    async def read(self, fn: Callable, *args, deadline: Deadline | None = None, request: Request | None = None):
        """`fn(index, *args)` on the least busy reader. With a `deadline`, the work runs under it (esqbe.core.deadline:
        checked between its stages and in its loops; not started at all past it) and is given up at it with
        `Cancelled`; with `request`, also as soon as that client goes away. Either way the reader is freed."""
        self.start()
        slot = min(self.readers, key=lambda s: s.pending)
        if deadline is None:
            return await asyncio.wrap_future(slot.submit(fn, *args))
        work = slot.submit(_under, deadline, fn, *args)
        waiting = asyncio.wrap_future(work)
        watch = asyncio.ensure_future(_client_gone(request)) if request is not None else None
        try:
            done, _ = await asyncio.wait([waiting, *([watch] if watch else [])], timeout=max(deadline.remaining(), 0.0),
                                         return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the server cancelled the handler (its client went away, a shutdown)
            deadline.cancel("the request was cancelled")
            work.cancel()
            self.abandoned += 1
            raise
        finally:
            if watch is not None:
                watch.cancel()
        if waiting in done:
            try:
                return waiting.result()
            except Cancelled as e:  # the work itself saw its deadline pass (at one of its checks)
                self.timed_out += e.timed_out
                raise
        gone = watch is not None and watch in done
        deadline.cancel("the client went away" if gone else "past its deadline")
        work.cancel()  # still queued: it never starts; running: it stops at its next check
        waiting.add_done_callback(lambda f: f.cancelled() or f.exception())  # its Cancelled is expected
        if gone:
            self.abandoned += 1
            raise Cancelled("the client went away", timed_out=False)
        self.timed_out += 1
        raise Cancelled(f"the query took longer than this server's {deadline.seconds:g} s request timeout "
                        "and was abandoned", timed_out=True)

    async def write(self, fn: Callable, *args):
        self.start()
        if self.writer.pending >= self.options.max_queued_writes:
            raise ApiError(503, f"the writer is busy ({self.writer.pending} writes queued); retry shortly",
                           headers={"Retry-After": "5"})

        def locked(index, *a):
            with self.write_lock:
                try:
                    begin = getattr(index.backend, "begin_write", None)  # another writer's lock: wait a bounded time
                    if begin is not None:
                        begin(self.options.write_lock_timeout)
                    return fn(index, *a)
                finally:
                    end = getattr(index.backend, "end_write", None)  # the embedded write lock is not held while idle
                    if end is not None:
                        end()

        try:
            return await asyncio.wrap_future(self.writer.submit(locked, *args))
        except WriteLockBusy as e:
            raise ApiError(503, f"another writer (pid {e.holder}) has held the index's write lock for over "
                                f"{self.options.write_lock_timeout:g}s; retry later",
                           headers={"Retry-After": str(max(1, round(self.options.write_lock_timeout)))}) from None

    def close(self) -> None:
        with self._lock:
            self.closed = True
            for slot in [*self.readers, *([self.writer] if self.writer else [])]:
                try:
                    slot.close()
                except Exception as e:  # closing must not fail the shutdown
                    log.warning("closing %s: %s", slot.name, e)
            self.readers, self.writer = [], None


def _where(settings: Settings) -> str:
    return settings.path if settings.backend == "embedded" else f"{settings.backend} {settings.url} {settings.index}"


def _create_if_absent(index: Index):
    """The server owns its index: an embedded index that does not exist yet is created (empty) at start,
    so the reader handles can open it; returns the index's meta (None while it is empty)."""
    from ..index.api import _DeferredBackend

    if isinstance(index.backend, _DeferredBackend):
        index.backend.stats()  # the first real call creates the index directory
        end = getattr(index.backend, "end_write", None)  # and gives the write lock back until a write comes
        if end is not None:
            end()
    return index.backend.meta()


def _warm(index: Index) -> None:
    """Load the tagger and build each facet's kNN structure before the first query needs them."""
    _ = index.tagger
    meta = index.backend.meta()
    if meta is None:
        return
    probe = np.zeros((1, meta.dim), dtype=np.float32)
    probe[0, 0] = 1.0
    for facet in (*QUERY_FACETS, None):
        index.backend.first_stage(FirstStageRequest(text="warm", vectors=probe, facet=facet, k=1, knn_k=1, bm25_k=1,
                                                    with_papers=False))


def _warm_writer(index: Index) -> None:
    _ = index.tagger


# ------------------------------------------------------------------------------------------------
# Handlers' work, run on a slot's thread


def _sentences(paper) -> list[dict]:
    return [{"index": i, "text": s, "facet": f} for i, (s, f) in enumerate(zip(paper.sentences, paper.facets))]


def _paper_out(paper) -> dict:
    metadata = dict(paper.metadata)
    predicted = bool(metadata.pop("facets_predicted", False))
    return {"paper_id": paper.paper_id, "title": paper.title, "sentences": _sentences(paper),
            "facets_predicted": predicted, "metadata": _jsonable(metadata)}


def _under(index: Index, deadline: Deadline, fn: Callable, *args):
    with deadline:
        return fn(index, *args)


async def _client_gone(request: Request, every: float = 0.1) -> None:
    """Returns once the client of `request` has disconnected."""
    while not await request.is_disconnected():
        await asyncio.sleep(every)


def _jsonable(value):
    try:
        return json.loads(json.dumps(value, allow_nan=False, default=str))
    except ValueError:
        return {}


def _run_query(index: Index, req: QueryRequest, text, overrides: dict) -> dict:
    t0 = time.perf_counter()
    filters = [f if isinstance(f, str) else f.model_dump(exclude_none=True) for f in req.filters or []]
    result = index.query(req.paper_id, facet=req.facet, sentences=req.sentences, text=text, title=req.title,
                         filters=filters or None, engine_filter=req.engine_filter, **overrides)
    papers = index.get([h.paper_id for h in result.hits]) if req.with_sentences else {}
    query_paper = index.get([req.paper_id])[req.paper_id] if req.paper_id is not None else None
    rescorer = result.rescorer
    settings = index.settings.replace(**overrides)
    hits = []
    for h in result.hits:
        hit = {
            "rank": h.rank, "paper_id": h.paper_id, "title": h.title, "similarity": _finite(h.similarity),
            "score": _finite(h.score) or 0.0, "first_stage_score": _finite(h.first_stage_score) or 0.0,
            "bm25": _finite(h.bm25) or 0.0, "knn": _finite(h.knn) or 0.0,
            "matches": [dict(query_index=m.query_index, query_sentence=m.query_sentence,
                             candidate_index=m.candidate_index, candidate_sentence=m.candidate_sentence,
                             candidate_facet=m.candidate_facet, weight=_finite(m.weight) or 0.0) for m in h.matches],
            "metadata": _jsonable(h.metadata or {}),
        }
        if req.with_sentences and h.paper_id in papers:
            hit["sentences"] = _sentences(papers[h.paper_id])
        hits.append(hit)
    facets = result.query_facets or ["unlabeled"] * len(result.query_sentences)
    timings = dict(result.timings)
    timings["total"] = round(1000 * (time.perf_counter() - t0), 2)
    return {
        "query": {"paper_id": result.query_paper_id,
                  "title": query_paper.title if query_paper is not None else req.title,
                  "facet": result.facet,
                  "filters": list(result.filters),
                  "sentences": [{"index": i, "text": t, "facet": f}
                                for (i, t), f in zip(result.query_sentences, facets)]},
        "rescorer": rescorer,
        "rescorer_params": _jsonable(_named_words(settings.rescorer_params or {}, req)) if rescorer != "none" else {},
        "similarity": SIMILARITY.get(rescorer, "the rescorer's score"),
        "match_weight": MATCH_WEIGHT.get(rescorer, "weight"),
        "hits": hits,
        "timings_ms": timings,
    }


def _named_words(params: dict, req: QueryRequest) -> dict:
    """The parameters as the client gave them: a `words` name, not the server's directory behind it."""
    given = req.rescorer_params.model_dump(exclude_unset=True) if req.rescorer_params is not None else {}
    return {**params, "words": given["words"]} if "words" in given and "words" in params else params


def _finite(x):
    if x is None:
        return None
    x = float(x)
    return x if np.isfinite(x) else None


def _search(index: Index, q: str, k: int) -> dict:
    hits = []
    exact = index.get([q.strip()]) if q.strip() else {}
    for paper in exact.values():
        hits.append({"paper_id": paper.paper_id, "title": paper.title, "score": 0.0, "match": "id",
                     "sentences": len(paper.sentences), "first_sentence": paper.sentences[0] if paper.sentences else ""})
    for paper, score in index.search(q, k):
        if paper.paper_id in exact:
            continue
        hits.append({"paper_id": paper.paper_id, "title": paper.title, "score": _finite(score) or 0.0,
                     "match": "words", "sentences": len(paper.sentences),
                     "first_sentence": paper.sentences[0] if paper.sentences else ""})
    return {"query": q, "hits": hits[:k]}


def _read_records(lines: list, fmt: str | None) -> tuple[list, list[dict]]:
    """Each record read on its own, so each gets its own outcome: (papers with their record number, outcomes)."""
    papers, outcomes = [], []
    for n, line in enumerate(lines):
        report = ReadReport()
        stream = io.StringIO(line if isinstance(line, str) else line.decode("utf-8", errors="replace"))
        stream.name = f"record {n}"
        try:
            got = list(read_papers(stream, fmt, report=report))
        except Exception as e:  # format detection failing is raised at once: this record's error
            field_name = getattr(e, "field", None)
            outcomes.append({"record": n, "paper_id": None, "status": "error", "field": field_name,
                             "reason": getattr(e, "reason", str(e))})
            continue
        if report.errors:
            e = report.errors[0]
            outcomes.append({"record": n, "paper_id": None, "status": "error", "field": e.field, "reason": e.reason})
        elif report.skipped:
            outcomes.append({"record": n, "paper_id": None, "status": "skipped", "reason": ", ".join(report.skipped)})
        for p in got:
            papers.append((n, p))
            outcomes.append({"record": n, "paper_id": p.paper_id, "status": "pending"})
    return papers, outcomes


def _write_papers(index: Index, papers: list, outcomes: list[dict], facets: str | None) -> dict:
    t0 = time.perf_counter()
    ids = [p.paper_id for _, p in papers]
    before = index.backend.content_hashes(ids)
    report = index.add_papers([p for _, p in papers], facets=facets) if papers else None
    after = index.backend.content_hashes(ids)
    last = {p.paper_id: n for n, p in papers}
    errors = list(report.errors) if report else []
    for o in outcomes:
        if o["status"] != "pending":
            continue
        pid = o["paper_id"]
        if last[pid] != o["record"]:
            o.update(status="superseded", reason=f"record {last[pid]} has the same paper id")
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


def _stats(index: Index) -> dict:
    return _jsonable(index.stats())


def _health(index: Index) -> str:
    meta = index.backend.meta()
    return "empty index" if meta is None else f"{meta.model}, {meta.dim}-d"


# ------------------------------------------------------------------------------------------------
# The app


_OPEN_PATHS = frozenset({"/", "/health", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})


def _token_ok(authorization: str | None, token: str) -> bool:
    scheme, _, given = (authorization or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


def _split_host(value: str) -> tuple[str, int | None]:
    """A Host header (or an Origin's netloc) as (lower-case name, port or None); [::1]:8000 -> ("::1", 8000)."""
    value = value.strip().lower()
    if value.startswith("["):
        name, _, rest = value[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif value.count(":") == 1:
        name, _, port = value.partition(":")
    else:
        name, port = value, ""
    return name.rstrip("."), int(port) if port.isdigit() else None


class _Perimeter:
    """Pure ASGI middleware, outside the body limit, so nothing here reads a body byte:

    - Host: a connection to a loopback address must name a loopback host (localhost, 127.0.0.1, [::1]) or
      one of `allowed_hosts`: a page whose DNS name was rebound to 127.0.0.1 is refused (400); with
      `allowed_hosts` every connection must name one of them (or a loopback host over loopback).
    - writes (every method but GET/HEAD/OPTIONS, except POST /query): an `Origin` header must be the
      server's own (its host and port as the Host header says) or a CORS origin (403), the bearer token
      when the server has one (401), and a body only as JSON or JSON Lines (415: not text/plain or forms,
      which a page on another site may send without asking first).
    - reads when `private`: the token too (the page, /health and the API docs stay open).
    """

    def __init__(self, app, options: ServeOptions):
        self.app, self.options = app, options
        self.allowed_hosts = {_split_host(h)[0] for h in options.allowed_hosts}
        self.cors = {o.strip().rstrip("/").lower() for o in options.cors_origins}

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers: dict[str, str] = {}
        for key, value in scope.get("headers") or []:
            headers.setdefault(key.decode("latin-1").lower(), value.decode("latin-1"))
        refused = self._refusal(scope, headers)
        if refused is not None:
            return await refused(scope, receive, send)
        return await self.app(scope, receive, send)

    def _refusal(self, scope, headers: dict[str, str]) -> JSONResponse | None:
        from starlette._utils import get_route_path

        host = headers.get("host", "")
        if not self._host_ok(scope, _split_host(host)[0]):
            return _error_response(400, f"this server does not answer to the host name {host!r} (allowed: loopback "
                                        "names, and the server's --allowed-host names)")
        method, path = scope["method"], get_route_path(scope)
        write = method not in ("GET", "HEAD", "OPTIONS") and not (method == "POST" and path == "/query")
        origin = headers.get("origin")
        if write and origin is not None and not self._origin_ok(origin, host):
            shown = _split_host(origin.partition("://")[2])[0] or "null"  # the name alone: URLs are kept from clients
            return _error_response(403, f"writes from another site's page (Origin {shown}) are not allowed: not this "
                                        "server's origin nor a --cors-origin")
        token = self.options.token
        private = self.options.private and method != "OPTIONS" and path not in _OPEN_PATHS and not path.startswith("/static/")
        if token and (write or private) and not _token_ok(headers.get("authorization"), token):
            return _error_response(401, "this endpoint needs Authorization: Bearer <token>" if "authorization" not in headers
                                   else "wrong bearer token", headers={"WWW-Authenticate": 'Bearer realm="esqbe"'})
        if write and method in ("POST", "PUT", "PATCH"):
            ctype = headers.get("content-type", "").split(";")[0].strip().lower()
            if ctype not in WRITE_TYPES:
                return _error_response(415, _type_message(ctype))
        return None

    def _host_ok(self, scope, name: str) -> bool:
        if name in self.allowed_hosts or "*" in self.allowed_hosts:
            return True
        server = scope.get("server")
        on_loopback = is_loopback(server[0]) if server and server[0] else is_loopback(self.options.host)
        if on_loopback and is_loopback(name):
            return True
        checked = bool(self.allowed_hosts) or (on_loopback and is_loopback(self.options.host))
        return not checked

    def _origin_ok(self, origin: str, host: str) -> bool:
        from urllib.parse import urlsplit

        origin = origin.strip().rstrip("/").lower()
        if origin in self.cors or "*" in self.cors:
            return True
        try:
            parts = urlsplit(origin)
            given = (parts.hostname or "", parts.port or {"http": 80, "https": 443}.get(parts.scheme))
        except ValueError:
            return False
        name, port = _split_host(host)
        return bool(name) and given == (name, port or {"http": 80, "https": 443}.get(parts.scheme))


def _type_message(ctype: str) -> str:
    return f"send application/json or application/x-ndjson (JSON Lines), not {ctype or 'a body without Content-Type'}"


class _BodyLimit:
    """Pure ASGI middleware: refuse request bodies over `limit` bytes (413) before the app reads them."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        too_big = _error_response(413, f"request body over the limit of {self.limit} bytes")
        if length is not None:
            try:
                if int(length) > self.limit:
                    return await too_big(scope, receive, send)
            except ValueError:
                return await _error_response(400, "bad Content-Length header")(scope, receive, send)
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                return await too_big(scope, receive, send)
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)


def create_app(path: str | None = None, *, settings: Settings | None = None, config: str | None = None,
               options: ServeOptions | None = None, encoder=None, **overrides) -> FastAPI:
    """The esqbe HTTP app (FastAPI), ready to run with uvicorn or to mount inside another ASGI app.

    `path`, `config`, `settings` and `overrides` choose the index as `esqbe.open_index` does;
    `options` set host (for the token rule), token, limits, CORS and readers. `encoder` shares one
    already loaded encoder across all threads (tests; otherwise each thread loads its own).
    The index is opened when the app starts (or on its first request when mounted without lifespan).

    `options` must say who can reach the app: `ServeOptions(host="127.0.0.1")` (only this machine: writes
    need no token) or a token. The app cannot see where the server that runs it listens, so it does not guess.
    """
    if options is None or not (options.token or "host" in options.model_fields_set):
        raise ConfigError(
            "create_app needs to know who can reach the app: options=ServeOptions(host=\"127.0.0.1\") when only "
            "this machine can (writes need no token), or ServeOptions(host=..., token=...) when others can "
            "(mounted in another app, the host is where that app listens)")
    check_exposure(options)
    settings = (settings or load_settings(config)).replace(path=path, **overrides)
    service = Service(settings, options, encoder=encoder)

    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app):
        await asyncio.get_running_loop().run_in_executor(None, service.start)
        try:
            yield
        finally:
            await asyncio.get_running_loop().run_in_executor(None, service.close)

    app = FastAPI(
        title="esqbe",
        summary="Faceted query-by-example search for scientific papers",
        description="Pick a paper and an aspect of it (background, method, result, or chosen sentences) and get "
                    "the papers most similar in that aspect, with the sentences that matched. Write endpoints need "
                    "`Authorization: Bearer <token>` when the server has a token.",
        version=_version(),
        lifespan=lifespan,
    )
    app.state.service = service

    @app.exception_handler(ApiError)
    async def _api_error(request, exc: ApiError):
        return _error_response(exc.status, exc.message, exc.details, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request, exc: RequestValidationError):
        errors = exc.errors()
        if any(e.get("type") == "json_invalid" for e in errors):
            return _error_response(400, "the request body is not valid JSON", _clean_validation(errors))
        return _error_response(422, "invalid request: " + "; ".join(
            f"{'.'.join(str(x) for x in e.get('loc', ())[1:]) or 'body'}: {e.get('msg')}" for e in errors),
            _clean_validation(errors))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request, exc: StarletteHTTPException):
        return _error_response(exc.status_code, str(exc.detail), headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(request, exc: Exception):
        if isinstance(exc, (QueryError, ValueError, BackendError)):
            return _error_response(_status_of(exc), str(exc))
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return _error_response(500, f"internal error ({type(exc).__name__}); the server log has the details")

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
        if settings.backend == "embedded":
            raise ApiError(400, "engine_filter needs the elasticsearch or opensearch backend; this index is "
                                "embedded: use filters")

    async def reads(fn, *args):
        try:
            return await service.read(fn, *args)
        except (QueryError, ValueError, BackendError) as e:
            raise ApiError(_status_of(e), str(e)) from None

    async def writes(fn, *args):
        try:
            return await service.write(fn, *args)
        except (QueryError, ValueError, BackendError) as e:
            raise ApiError(_status_of(e), str(e)) from None

    # --- the page ---------------------------------------------------------------------------
    @app.get("/", include_in_schema=False)
    async def page():
        return FileResponse(STATIC_DIR / "index.html", headers=_PAGE_HEADERS)

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    # --- the API ------------------------------------------------------------------------------
    @app.get("/health", response_model=Health, responses=_errors(503), tags=["service"])
    async def health():
        """200 when the index answers and the model is loaded; 503 while warming up or when the backend is down."""
        backend = settings.backend
        if not service.ready.is_set():
            return JSONResponse({"status": "warming", "backend": backend, "detail": "loading the model and index"},
                                status_code=503)
        try:
            detail = await asyncio.wait_for(service.read(_health), timeout=10)
        except asyncio.TimeoutError:
            return JSONResponse({"status": "unavailable", "backend": backend, "detail": "the readers are busy"},
                                status_code=503)
        except Exception as e:
            return JSONResponse({"status": "unavailable", "backend": backend, "detail": _public(503, str(e))},
                                status_code=503)
        if service.warm_error:
            detail = f"{detail}; warming up failed: {_public(200, service.warm_error)}"
        return {"status": "ok", "backend": backend, "detail": detail}

    @app.get("/stats", responses=_errors(503), tags=["service"])
    async def stats() -> dict[str, Any]:
        """Papers, sentences per facet, model and size of the index, and the server's own state."""
        out = await reads(_stats)
        if not options.show_paths:  # the index's name, not where it lives
            if "path" in out:
                out["path"] = Path(str(out["path"])).name
            out.pop("url", None)
        out["server"] = {"readers": len(service.readers), "writes_queued": service.writer.pending if service.writer else 0,
                         "uptime_s": round(time.time() - service.started_at, 1), "ready": service.ready.is_set()}
        return out

    @app.post("/query", response_model=QueryResponse, responses=_errors(400, 404, 409, 413, 422, 503, 504),
              tags=["search"])
    async def query(req: QueryRequest, request: Request):
        """Papers most similar to a paper's facet, to chosen sentences, or to a text, with the sentences that matched."""
        check_engine_filter(request, req.engine_filter)
        deadline = Deadline(options.request_timeout)  # from now: a wait for a reader counts
        limit = options.max_query_sentences
        text = req.text
        try:
            if text is not None:
                text = query_sentences(text)  # past esqbe.core.limits' character caps: refused before any tokenizing
            overrides = req.overrides(options.words)
        except QueryTooLargeError as e:
            raise ApiError(413, str(e)) from None
        except QueryError as e:
            raise ApiError(400, str(e)) from None
        if text is not None:
            if not text:
                raise ApiError(400, "the query text has no sentences")
            if len(text) > limit:
                raise ApiError(413, f"the query text has {len(text)} sentences; at most {limit} per query")
        if req.sentences is not None and len(set(req.sentences)) > limit:
            raise ApiError(413, f"{len(set(req.sentences))} sentences chosen; at most {limit} per query")
        try:
            return await service.read(_run_query, req, text, overrides, deadline=deadline, request=request)
        except Cancelled as e:
            if e.timed_out:
                raise ApiError(504, str(e)) from None
            raise ApiError(503, str(e)) from None
        except (QueryError, ValueError, BackendError) as e:
            raise ApiError(_status_of(e), str(e)) from None

    @app.get("/papers/{paper_id:path}", response_model=Paper, responses=_errors(404, 503), tags=["papers"])
    async def get_paper(paper_id: str):
        """A stored paper: title, sentences with their facet labels, metadata."""
        found = await reads(lambda index: index.get([paper_id]))
        if paper_id not in found:
            raise ApiError(404, f"paper {paper_id} is not in the index")
        return _paper_out(found[paper_id])

    @app.get("/search", response_model=SearchResponse, responses=_errors(422, 503), tags=["search"])
    async def search(q: str = Query(min_length=1, max_length=1000, description="a paper id, or title/abstract words"),
                     k: int = Query(10, ge=1, le=100)):
        """Find a paper to query by: an exact paper id first, then BM25 over title and abstract words."""
        return await reads(_search, q, k)

    @app.post("/papers", response_model=PapersResponse,
              responses=_errors(400, 401, 409, 413, 415, 422, 503), tags=["papers"],
              openapi_extra={"requestBody": {"required": True, "content": {
                  "application/json": {"schema": PapersRequest.model_json_schema()},
                  "application/x-ndjson": {"schema": {"type": "string", "description": "JSON Lines, any format esqbe reads"}},
              }}})
    async def add_papers(request: Request,
                         format: Literal["s2orc", "s2ag-abstracts", "s2ag-s2orc", "csfcube", "csabstruct", "jsonl"] | None
                         = Query(None, description="input format (default: detected per record)"),
                         facets: Literal["keep", "predict", "none"] | None
                         = Query(None, description="keep (default) | predict | none: what happens to facet labels")):
        """Upsert a batch of papers by id (any input format esqbe reads); each record gets its own outcome.

        Body: `{"records": [...], "format"?, "facets"?}` as JSON, or JSON Lines
        (`Content-Type: application/x-ndjson`, format and facets as query parameters)."""
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        body = await request.body()
        if ctype in JSON_LINES_TYPES:
            lines = [line for line in body.split(b"\n") if line.strip()]
            if not lines:
                raise ApiError(422, "the body has no records")
            fmt, mode = format, facets
        elif ctype == "application/json":
            try:
                req = PapersRequest.model_validate_json(body)
            except ValidationError as e:
                errors = e.errors()
                if any(x.get("type") == "json_invalid" for x in errors):
                    raise ApiError(400, "the request body is not valid JSON") from None
                raise ApiError(422, "invalid request: " + "; ".join(
                    f"{'.'.join(str(x) for x in err.get('loc', ())) or 'body'}: {err.get('msg')}" for err in errors),
                    _clean_validation(errors)) from None
            lines = [json.dumps(r, ensure_ascii=False) for r in req.records]
            fmt, mode = req.format or format, req.facets or facets
        else:  # the perimeter refuses other types before the body is read
            raise ApiError(415, _type_message(ctype))
        if len(lines) > options.max_batch_records:
            raise ApiError(413, f"{len(lines)} records; at most {options.max_batch_records} per request")
        papers, outcomes = _read_records(lines, fmt)
        return await writes(_write_papers, papers, outcomes, mode)

    @app.delete("/papers/{paper_id:path}", response_model=DeleteResponse,
                responses=_errors(401, 404, 503), tags=["papers"])
    async def delete_paper(paper_id: str):
        """Delete a paper by id."""
        if not await writes(_delete, paper_id):
            raise ApiError(404, f"paper {paper_id} is not in the index")
        return {"deleted": paper_id}

    # outermost last: CORS (its headers on every answer, refusals too), the perimeter, then the body limit
    app.add_middleware(_BodyLimit, limit=options.max_body_bytes)
    app.add_middleware(_Perimeter, options=options)
    if options.cors_origins:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(options.cors_origins), allow_methods=["GET", "POST", "DELETE"],
                           allow_headers=["Authorization", "Content-Type"])
    return app


_PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
                               "connect-src 'self'; frame-ancestors 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("esqbe")
    except Exception:
        return "0"


def serve(settings: Settings, options: ServeOptions, *, log_level: str = "info") -> None:
    """Run the app with uvicorn until interrupted (what `esqbe serve` does)."""
    import uvicorn

    check_exposure(options)
    app = create_app(settings=settings, options=options)
    for line in exposure_notes(options):
        print(f"esqbe: {line}", file=sys.stderr, flush=True)
    app.state.service.start()  # open the index and load the model now: a failure is one clear error, not a traceback
    uvicorn.run(app, host=options.host, port=options.port, log_level=log_level, proxy_headers=False,
                server_header=False, timeout_graceful_shutdown=10)


def exposure_notes(options: ServeOptions) -> list[str]:
    """What the startup banner says about who can do what (warnings for what an operator may not mean)."""
    where = f"{options.host}:{options.port}"
    if is_loopback(options.host):
        notes = [f"listening on {where}: only this machine can connect; loopback host names only"
                 + (f" and {', '.join(options.allowed_hosts)}" if options.allowed_hosts else "")]
    else:
        notes = [f"listening on {where}: reachable from other machines; writes need the token"]
        if not options.allowed_hosts:
            notes.append("warning: any Host name is answered; --allowed-host NAME (repeatable) answers only the "
                         "names clients use (a DNS-rebinding page cannot then reach it)")
    notes.append("reads need the token too (--private)" if options.private else
                 "reads (queries, papers, search, stats) are open to anyone who can connect; --private needs the token for them")
    if options.allow_raw_engine_filter:
        notes.append("raw engine_filter query DSL is allowed for requests with the token")
    return notes


def options_from_env(*, token_file: str | None = None, **given) -> ServeOptions:
    """ServeOptions from flags, the token from --token, --token-file or ESQBE_TOKEN (in that order).
    A token on the command line is visible to other users of the machine (ps): a warning says so."""
    clean = {k: v for k, v in given.items() if v is not None}
    if clean.get("token") and token_file:
        raise ConfigError("give the token once: --token or --token-file")
    if clean.get("token"):
        print("esqbe: warning: --token is visible to other users of this machine (ps); prefer ESQBE_TOKEN or "
              "--token-file", file=sys.stderr, flush=True)
    elif token_file:
        try:
            clean["token"] = Path(token_file).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"cannot read the token file {token_file}: {getattr(e, 'strerror', None) or e}") from None
        if not clean["token"]:
            raise ConfigError(f"the token file {token_file} is empty")
    elif os.environ.get("ESQBE_TOKEN"):
        clean["token"] = os.environ["ESQBE_TOKEN"]
    return ServeOptions(**clean)


__all__ = ["create_app", "serve", "ServeOptions", "Service", "check_exposure", "exposure_notes", "is_loopback",
           "options_from_env"]
