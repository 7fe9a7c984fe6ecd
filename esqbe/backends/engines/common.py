"""What the Elasticsearch and OpenSearch backends share: `EngineBackend`, the backend over an engine index
(info and version checks, meta/ensure, reads, bulk writes, metadata filters, the first stage in one
`_msearch`, stats). The layout is in `mapping`, documents in `documents`, request bodies in `bodies`, version
matters in `versions`, the client and its retries in `client`.

The two engine modules add only what differs: the client, the kNN clause, error classes.
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
from abc import abstractmethod
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ...core.fusion import fuse, top_k
from ...domain import (
    Candidate,
    FirstStageRequest,
    IndexedPaper,
    IndexMeta,
    UpsertResult,
    paper_problem,
)
from ...errors import BackendError, ModelMismatchError
from ..base import Backend
from .bodies import BM25_MAX_CLAUSES, bm25_body, facet_paths, sample_body, stats_body
from .calibrate import CalibrationMixin
from .client import (
    RETRY_STATUSES,
    ClientMixin,
    _describe,
    _error_type,
    _exc_reason,
    _ItemRetry,
    _reason,
)
from .documents import _merge_vectors, doc_to_paper, paper_to_doc
from .filters import (
    MAX_RESOLVED_IDS,
    add_to_bm25,
    add_to_knn,
    filter_clauses,
    ids_body,
    knn_needs_ids,
)
from .mapping import (
    FACET_PATHS,
    LAYOUT,
    VECTOR_FIELDS,
    VECTOR_SOURCE_FIELDS,
    index_body,
    meta_from_mapping,
)
from .versions import (
    MIN_VERSIONS,
    UNKNOWN_VERSION_HINT,
    EngineInfo,
    cosine_from_score,
    version_from_created_setting,
)

log = logging.getLogger("esqbe.backends")

# ---------------------------------------------------------------------------------------------
# The backend


class EngineBackend(ClientMixin, CalibrationMixin, Backend):
    """Backend on a search engine; subclasses supply the client and the engine-specific bits."""

    engine: str = ""
    #: candidates per shard for each kNN (x k); more = closer to exact search
    num_candidates_factor: int = 4
    max_chunk_bytes: int = 10 * 1024 * 1024
    chunk_size: int = 500
    #: tries per request (and per bulk item) on 429, 5xx and connection errors, waiting exponentially
    retry_attempts: int = 5
    retry_wait_initial: float = 0.5
    retry_wait_max: float = 30.0
    mget_batch: int = 1000
    #: leaf clauses the BM25 query may hold (raise it where the cluster's limit is higher)
    bm25_max_clauses: int = BM25_MAX_CLAUSES
    #: `preference` of every search in a first stage's `_msearch`; None: derived from the query (see `preference_for`)
    preference: str | None = None

    def __init__(
        self,
        url: str,
        index: str,
        *,
        api_key: str | None = None,
        username: str | None = None,
        password: str | None = None,
        ca_certs: str | None = None,
        verify_certs: bool = True,
        request_timeout: float = 30,
        client: Any = None,
        retry_attempts: int | None = None,
        retry_wait_initial: float | None = None,
        retry_wait_max: float | None = None,
    ):
        """`client`: an engine client already made (the connection options are then unused); the `retry_*`
        arguments override the class defaults for this instance."""
        if not index:
            raise BackendError(f"the {self.name} backend needs an index name")
        if api_key and username:
            # elasticsearch-py raises on both; opensearch-py would silently drop the API key (it lower-cases
            # custom headers, then http_auth overwrites `authorization`): refuse both the same way, up front
            raise BackendError(
                f"{self.name}: both an API key and a username were given (--api-key / ESQBE_API_KEY / api_key: and "
                "--username / ESQBE_USERNAME / username:); use one way to authenticate: the API key alone, "
                "or --username with --password"
            )
        self.url = url
        self.index = index
        self.client = client if client is not None else self._make_client(
            url,
            api_key=api_key,
            username=username,
            password=password,
            ca_certs=ca_certs,
            verify_certs=verify_certs,
            request_timeout=request_timeout,
        )
        self._info: EngineInfo | None = None
        self._mapping: dict | None = None
        self._settings: dict | None = None
        self._expected: IndexMeta | None = None
        if retry_attempts is not None:
            self.retry_attempts = retry_attempts
        if retry_wait_initial is not None:
            self.retry_wait_initial = retry_wait_initial
        if retry_wait_max is not None:
            self.retry_wait_max = retry_wait_max

    #: per-instance tunables (class attributes a caller may set on one backend) that `from_connection` carries over
    TUNABLES = ("num_candidates_factor", "max_chunk_bytes", "chunk_size", "mget_batch", "bm25_max_clauses", "preference")

    @classmethod
    def from_connection(cls, other: EngineBackend):
        """A backend of this class on `other`'s connection: the same client, url, index and retry settings,
        its tunables and what it already learnt of the engine (version, index settings, the model it expects);
        the mapping is read again."""
        new = cls(other.url, other.index, client=other.client, retry_attempts=other.retry_attempts,
                  retry_wait_initial=other.retry_wait_initial, retry_wait_max=other.retry_wait_max)
        for name in cls.TUNABLES:
            if name in vars(other):
                setattr(new, name, getattr(other, name))
        new._info, new._settings, new._expected = other._info, other._settings, other._expected
        return new

    # --- engine-specific hooks ---------------------------------------------------------------

    @abstractmethod
    def _knn_body(self, path: str, vector: list[float], k: int, num_candidates: int, restrict_to: list[str] | None) -> dict: ...

    def info(self) -> EngineInfo:
        """Which engine and version answers. `GET /` goes through the client's normal request path (stored
        credentials, request timeout) and is retried like every other request; a 403 (a least-privilege key
        without the `monitor` cluster privilege) is not fatal: see `_version_unknown`."""
        if self._info is None:
            try:
                info = self._retrying()(self._probe)
            except BackendError:
                raise
            except Exception as exc:
                status = self._status(exc)
                if status == 401:
                    raise BackendError(
                        f"{self.name} at {self.url}: authentication failed (401): check the API key or the "
                        f"username/password ({_exc_reason(exc)})"
                    ) from exc
                if status != 403:
                    raise self._error("connecting", exc) from exc
                info = self._version_unknown(exc)
            low = MIN_VERSIONS[info.engine]
            if info.exact and info.version[:2] < low:
                raise BackendError(
                    f"{info} is too old: esqbe needs {self.engine} {low[0]}.{low[1]}+ "
                    "(kNN over nested vectors with a parent filter)"
                )
            self._info = info
        return self._info

    def _version_unknown(self, exc: BaseException) -> EngineInfo:
        """`GET /` answered 403: take the index's creation version (readable with index privileges) as a
        lower bound of the cluster's version, else the oldest supported version, and say so once."""
        self._on_version_unknown()
        created = self._created_version()
        floor = MIN_VERSIONS[self.engine]
        version = max(created or (0, 0, 0), (*floor, 0))
        source = (f"version index {self.index!r} was created with" if created and created[:2] >= floor
                  else "oldest version esqbe supports")
        log.warning(
            "%s at %s: GET / answered 403 (%s); %s", self.name, self.url, _exc_reason(exc),
            UNKNOWN_VERSION_HINT.format(floor=".".join(map(str, version[:2])), source=source),
        )
        return EngineInfo(self.engine, version, f"version unknown (GET / refused: 403; at least {version[0]}.{version[1]})",
                          exact=False)

    def _on_version_unknown(self) -> None:
        """Engine hook: adapt the client when the server's version cannot be read."""

    def _index_settings(self) -> dict | None:
        """The index's `settings.index` (None when it does not exist or cannot be read); read once."""
        if self._settings is None:
            try:
                body = self._body(self._call(self.client.indices.get_settings, index=self.index))
            except Exception:  # missing index (404), no view_index_metadata (403), ...
                return None
            for entry in body.values() if isinstance(body, dict) else ():
                self._settings = (entry.get("settings") or {}).get("index") or {}
                break
        return self._settings

    def _created_version(self) -> tuple[int, int, int] | None:
        """`index.version.created` of the index (None when it does not exist or cannot be read)."""
        created = ((self._index_settings() or {}).get("version") or {}).get("created")
        return version_from_created_setting(self.engine, created) if created is not None else None

    def _get_mapping(self) -> dict | None:
        """The index's mapping, or None when it does not exist."""
        self.info()
        try:
            resp = self._call(self.client.indices.get_mapping, index=self.index)
        except Exception as exc:
            if self._status(exc) == 404:
                return None
            raise self._error("reading the mapping", exc) from exc
        body = self._body(resp)
        # the response is keyed by the concrete index name (differs when `index` is an alias)
        entry = next(iter(body.values())) if body else {}
        return entry.get("mappings", {})

    def _index_mapping(self) -> dict:
        if self._mapping is None:
            mapping = self._get_mapping()
            if mapping is None:
                raise BackendError(f"index {self.index!r} does not exist at {self.url}: index some papers first")
            self._mapping = mapping
        return self._mapping

    def _index_meta(self) -> IndexMeta:
        meta = meta_from_mapping(self.index, self._index_mapping())
        if self._expected is not None:
            meta.check(self._expected)
        return meta

    def _vector_space(self) -> tuple[str, str]:
        """(kNN library, similarity) behind the vector fields; decides the score conversion. Engine hook."""
        return ("lucene", "cosine")

    def _vector_mapping(self) -> dict:
        props = self._index_mapping().get("properties", {})
        return props.get(FACET_PATHS["method"], {}).get("properties", {}).get("vector", {})

    def _space_engine(self) -> str:
        return self._vector_space()[0]

    # --- Backend -------------------------------------------------------------------------------

    def meta(self) -> IndexMeta | None:
        mapping = self._get_mapping()
        if mapping is None:
            return None
        self._mapping = mapping
        return meta_from_mapping(self.index, mapping)

    def ensure(self, meta: IndexMeta) -> None:
        existing = self.meta()
        if existing is None:
            try:
                self._call(self.client.indices.create, index=self.index, body=index_body(self.engine, meta))
            except Exception as exc:
                if self._status(exc) != 400 or self.meta() is None:  # 400 + exists: created by a concurrent run
                    raise self._error("creating the index", exc) from exc
            existing = self.meta()
            if existing is None:
                raise BackendError(f"index {self.index!r} was created but cannot be read back")
        existing.check(meta)
        self._expected = meta

    def _mget_sources(self, ids: Sequence[str], **source_filter) -> dict[str, dict]:
        self.info()
        out: dict[str, dict] = {}
        for start in range(0, len(ids), self.mget_batch):
            batch = list(ids[start : start + self.mget_batch])
            try:
                resp = self._call(self.client.mget, index=self.index, body={"ids": batch}, **source_filter)
            except Exception as exc:
                if self._status(exc) == 404:  # no index: nothing stored
                    return {}
                raise self._error("fetching papers", exc) from exc
            for doc in self._body(resp).get("docs", []):
                if doc.get("found"):
                    out[doc["_id"]] = doc.get("_source") or {}
                elif "error" in doc:
                    # a missing index is not a 404 here: 200 with one index_not_found_exception per id
                    if _error_type(doc["error"]) == "index_not_found_exception":
                        return {}
                    raise BackendError(f"fetching paper {doc.get('_id')} from {self.index!r}: {_reason(doc['error'])}")
        return out

    def content_hashes(self, paper_ids: Iterable[str]) -> dict[str, str]:
        ids = list(dict.fromkeys(str(p) for p in paper_ids))
        if not ids:
            return {}
        sources = self._mget_sources(ids, _source_includes=["content_hash"])
        return {pid: src["content_hash"] for pid, src in sources.items() if "content_hash" in src}

    def get(self, paper_ids: Sequence[str]) -> dict[str, IndexedPaper]:
        ids = list(dict.fromkeys(str(p) for p in paper_ids))
        if not ids:
            return {}
        dim = self._index_meta().dim
        sources = self._mget_sources(ids, _source_excludes=list(VECTOR_FIELDS))
        foreign = [pid for pid, src in sources.items() if src.get("vectors_b64") is None]
        if foreign:  # written by another tool: read the indexed sentence vectors instead
            for pid, stored in self._indexed_vectors(foreign).items():
                _merge_vectors(sources[pid], stored)
        return {pid: doc_to_paper(src, dim) for pid, src in sources.items()}

    def _indexed_vectors(self, ids: Sequence[str]) -> dict[str, dict]:
        """The nested `idx` and `vector` values of documents without `vectors_b64` (engine hook: how to get
        vectors back into `_source` differs by engine and version)."""
        return self._mget_sources(list(ids), _source_includes=list(VECTOR_SOURCE_FIELDS))

    def _refresh(self) -> None:
        try:
            self._call(self.client.indices.refresh, index=self.index)
        except Exception as exc:
            raise self._error("refreshing", exc) from exc

    def upsert(self, papers: Sequence[IndexedPaper]) -> UpsertResult:
        result = UpsertResult()
        if not papers:
            return result
        meta = self._index_meta()
        by_id: dict[str, IndexedPaper] = {}
        for ip in papers:
            if ip.vectors.shape[0] and ip.vectors.shape[1] != meta.dim:
                raise ModelMismatchError(
                    f"paper {ip.paper_id} has {ip.vectors.shape[1]}-d vectors but index {self.index!r} holds "
                    f"{meta.dim}-d ({meta.model})"
                )
            by_id[ip.paper_id] = ip  # the last copy of a repeated id wins, as a re-run would
        for pid, ip in list(by_id.items()):  # NaN metadata, null sentences, sizes past LIMITS: not sent
            problem = paper_problem(ip.paper)
            if problem:
                result.errors.append(f"{pid}: {problem[0]}: {problem[1]} (not stored)")
                del by_id[pid]
        stored = self.content_hashes(list(by_id))
        actions = []
        for pid, ip in by_id.items():
            if stored.get(pid) == ip.paper.content_hash():
                result.unchanged += 1
            else:
                actions.append({"_op_type": "index", "_index": self.index, "_id": pid, "_source": paper_to_doc(ip)})
        for pid, (ok, info) in self._bulk(actions).items():
            if ok:
                if info.get("result") == "created" or info.get("status") == 201:
                    result.added += 1
                else:
                    result.replaced += 1
            else:
                result.errors.append(f"{pid}: {_describe(info)}")
        if actions:
            self._refresh()
        return result

    def delete(self, paper_ids: Iterable[str]) -> int:
        ids = list(dict.fromkeys(str(p) for p in paper_ids))
        if not ids:
            return 0
        self._index_mapping()
        actions = [{"_op_type": "delete", "_index": self.index, "_id": pid} for pid in ids]
        deleted, failed = 0, []
        for pid, (ok, info) in self._bulk(actions).items():
            if ok:
                deleted += 1
            elif info.get("status") != 404:  # not found: nothing to delete
                failed.append(f"{pid}: {_describe(info)}")
        self._refresh()
        if failed:
            raise BackendError(f"deleting from {self.index!r} failed for {len(failed)} papers: " + "; ".join(failed[:5]))
        return deleted

    # --- first stage ---------------------------------------------------------------------------

    def search_bodies(self, request: FirstStageRequest) -> list[tuple[str, int | None, dict]]:
        """The searches of one first stage: ("bm25", None, body) and ("knn", query sentence, body) per
        (query sentence, facet path). Sent together in one `_msearch`."""
        q = np.asarray(request.vectors, dtype=np.float32)
        if q.ndim == 1:
            q = q[None, :]
        restrict = sorted(request.restrict_to) if request.restrict_to is not None else None
        out: list[tuple[str, int | None, dict]] = []
        if request.text and request.text.strip() and request.bm25_k > 0:
            out.append(("bm25", None, bm25_body(request.text, min(request.bm25_k, 10_000), restrict, request.exclude,
                                                self.bm25_max_clauses)))
        if request.knn_k > 0 and q.shape[0] and q.shape[1]:
            # excluded ids are dropped on the client: a must_not inside a nested kNN filter is unreliable
            # before ES 8.13 / OpenSearch 3.5, so ask for as many more hits as there are exclusions
            k = min(10_000, request.knn_k + len(request.exclude))
            # num_candidates / k: calibrated for knn_recall_target per facet, unless fixed (esqbe.backends.engines.calibrate)
            num_candidates = min(10_000, max(k, self.candidates_factor(request.facet)[0] * k, 100))
            for i, vec in enumerate(q):
                values = [float(x) for x in vec]
                for path in facet_paths(request.facet):
                    out.append(("knn", i, self._knn_body(path, values, k, num_candidates, restrict)))
        return self._with_filter(out, request)

    # --- metadata filters (engine_filters): pre-filtered BM25 and kNN ----------------------------

    def _filter_resolver(self):
        """Where metadata keys live in this index's documents (None: esqbe's meta_kw / meta_num)."""
        return None

    def _with_filter(self, searches: list, request: FirstStageRequest) -> list:
        clauses = filter_clauses(request.filter, self._filter_resolver())
        if not clauses:
            return searches
        info = self.info()
        post = knn_needs_ids(info.engine, info.version, clauses)  # only when the ids could not be resolved first
        for kind, _qi, body in searches:
            if kind == "bm25":
                add_to_bm25(body, clauses)
            else:
                add_to_knn(info.engine, body, clauses, post=post)
        return searches

    def _resolve_filter(self, request: FirstStageRequest) -> FirstStageRequest:
        """OpenSearch < 3.5 with a filter its nested kNN cannot run: the ids it allows become a pool."""
        clauses = filter_clauses(request.filter, self._filter_resolver())
        info = self.info()
        if not knn_needs_ids(info.engine, info.version, clauses):
            return request
        try:
            body = self._body(self._call(self.client.search, index=self.index, body=ids_body(clauses)))
        except Exception as exc:
            raise self._error("resolving the filter", exc) from exc
        hits = body.get("hits", {})
        total = hits.get("total", {})
        total = total.get("value", 0) if isinstance(total, dict) else int(total or 0)
        if total > MAX_RESOLVED_IDS:
            return request  # too wide to list: the kNN gets it as a post-filter (docs/engines.md, Limits)
        ids = frozenset(str(h["_id"]) for h in hits.get("hits", []))
        restrict = ids if request.restrict_to is None else ids & request.restrict_to
        return dataclasses.replace(request, restrict_to=restrict, filter=None)

    def preference_for(self, request: FirstStageRequest) -> str:
        """A stable shard-copy `preference` for one query: with replicas, primary and replica hold different
        deleted-document counts after upserts, so BM25 statistics (and scores) depend on which copy answers.
        The same query (text, facet, vectors, pool) always goes to the same copies; different queries still
        spread over the replicas. Never starts with `_` (reserved for the engines' own preference values)."""
        if self.preference:
            return self.preference
        h = hashlib.sha1()
        h.update((request.text or "").encode("utf-8"))
        h.update(f"\x00{request.facet}\x00".encode())
        h.update(np.ascontiguousarray(np.asarray(request.vectors, dtype="<f4")).tobytes())
        if request.restrict_to is not None:
            h.update("\x00".join(sorted(request.restrict_to)).encode("utf-8"))
        if request.filter is not None:
            h.update(f"\x00{request.filter!r}".encode())
        return f"esqbe-{h.hexdigest()[:16]}"

    def _msearch_once(self, bodies: list[dict], preference: str | None = None) -> list[dict]:
        """One `_msearch`; a search inside it failing with 429/5xx raises so the whole request is retried."""
        header = {"preference": preference} if preference else {}
        lines: list[dict] = []
        for body in bodies:
            lines.extend((dict(header), body))
        resp = self.client.msearch(index=self.index, body=lines)
        responses = self._body(resp).get("responses", [])
        if len(responses) != len(bodies):
            raise BackendError(f"_msearch returned {len(responses)} responses for {len(bodies)} searches")
        for r in responses:
            if "error" in r:
                status = r.get("status")
                if status in RETRY_STATUSES:
                    raise _ItemRetry(status, r["error"])
                raise BackendError(f"{self.name} search failed ({status}): {_reason(r['error'])}")
        return responses

    def first_stage(self, request: FirstStageRequest) -> list[Candidate]:
        meta = self._index_meta()
        q = np.asarray(request.vectors, dtype=np.float32)
        if q.ndim == 1:
            q = q[None, :]
        if q.size and q.shape[1] != meta.dim:
            raise ModelMismatchError(
                f"query vectors are {q.shape[1]}-d but index {self.index!r} was built with {meta.model} ({meta.dim}-d)"
            )
        if request.filter:
            request = self._resolve_filter(request)
        if request.restrict_to is not None and not request.restrict_to:
            return []
        searches = self.search_bodies(request)
        if not searches:
            return []
        info = self.info()
        space = self._space_engine()
        try:
            responses = self._retrying()(self._msearch_once, [body for _, _, body in searches], self.preference_for(request))
        except BackendError:
            raise
        except Exception as exc:
            raise self._error("searching", exc) from exc
        bm25, knn = self.parse_first_stage(searches, responses, request, info, space)
        fused = fuse(bm25, knn, request.fusion, request.bm25_weight)
        best = top_k(fused, request.k)
        papers = self.get([pid for pid, _ in best]) if request.with_papers else {}
        return [
            Candidate(pid, float(score), bm25=bm25.get(pid, 0.0), knn=knn.get(pid, 0.0), paper=papers.get(pid))
            for pid, score in best
        ]

    def parse_first_stage(
        self,
        searches: list[tuple[str, int | None, dict]],
        responses: list[dict],
        request: FirstStageRequest,
        info: EngineInfo,
        space_engine: str = "lucene",
    ) -> tuple[dict[str, float], dict[str, float]]:
        """(bm25 score per paper, knn per paper) from the `_msearch` responses.

        knn = mean over query sentences of the best cosine of any of the paper's searched sentences
        (0 where a query sentence did not reach the paper), each query sentence keeping its best `knn_k` papers."""
        excluded = set(request.exclude)
        bm25: dict[str, float] = {}
        best: dict[int, dict[str, float]] = {}
        for (kind, qi, _), resp in zip(searches, responses):
            for hit in resp.get("hits", {}).get("hits", []):
                pid = str(hit["_id"])
                if pid in excluded or hit.get("_score") is None:
                    continue
                if kind == "bm25":
                    bm25[pid] = float(hit["_score"])
                else:
                    cos = cosine_from_score(hit["_score"], info.engine, space_engine, info.version)
                    assert qi is not None  # a kNN search is one query sentence's
                    row = best.setdefault(int(qi), {})
                    if cos > row.get(pid, -2.0):
                        row[pid] = cos
        q = np.asarray(request.vectors)
        m = 1 if q.ndim == 1 else q.shape[0]
        knn: dict[str, float] = {}
        for row in best.values():
            for pid, cos in sorted(row.items(), key=lambda kv: (-kv[1], kv[0]))[: request.knn_k]:
                knn[pid] = knn.get(pid, 0.0) + cos / m
        return bm25, knn

    def exact_knn(self, vectors: np.ndarray, k: int, *, facet: str | None = None,
                  exclude: frozenset[str] = frozenset()) -> dict[str, float]:
        """Exact kNN by a nested script_score over every document (esqbe.backends.engines.exact)."""
        from .exact import exact_knn_searches, parse_exact

        searches = exact_knn_searches(self.engine, vectors, k, facet, exclude)
        try:
            responses = self._retrying()(self._msearch_once, [body for _, body in searches])
        except BackendError:
            raise
        except Exception as exc:
            raise self._error("searching exactly", exc) from exc
        return parse_exact(searches, responses, len(np.atleast_2d(vectors)), k, exclude)

    # --- stats ---------------------------------------------------------------------------------

    def sample_papers(self, n: int, seed: int = 0) -> tuple[list[str], int]:
        try:
            body = self._body(self._call(self.client.search, index=self.index, body=sample_body(n, seed)))
        except Exception as exc:
            raise self._error("sampling papers", exc) from exc
        hits = body.get("hits", {})
        total = hits.get("total", {})
        ids = sorted(str(h["_id"]) for h in hits.get("hits", []))
        return ids, int(total.get("value", len(ids)) if isinstance(total, dict) else total)

    def stats(self) -> dict:
        info = self.info()
        meta = self._index_meta()
        try:
            body = self._body(self._call(self.client.search, index=self.index, body=stats_body()))
        except Exception as exc:
            raise self._error("counting", exc) from exc
        total = body.get("hits", {}).get("total", {})
        facets = {f: int(body.get("aggregations", {}).get(f, {}).get("doc_count", 0)) for f in FACET_PATHS}
        return {
            "backend": self.name,
            "engine": str(info),
            "url": self.url,
            "index": self.index,
            "layout": LAYOUT,
            "papers": int(total.get("value", 0) if isinstance(total, dict) else total),
            "sentences": sum(facets.values()),
            "sentences_by_facet": dict(sorted((f, n) for f, n in facets.items() if n)),
            "model": meta.model,
            "dim": meta.dim,
            "encoder_mode": meta.encoder_mode,
            "fusion": "client (esqbe.core.fusion, same as the embedded backend)",
            "engine_side_fusion": self._engine_fusion(),
            "knn": {f: self.knn_setting(f) for f in ("background", "method", "result") if facets.get(f)},
            "knn_calibration": self.knn_calibration(),
        }

    def _engine_fusion(self) -> str:
        """What the engine itself could fuse with (reported, not used: client fusion keeps rankings equal)."""
        return "unknown"

    def close(self) -> None:
        close = getattr(self.client, "close", None)
        if close is not None:
            close()

