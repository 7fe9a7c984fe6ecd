"""What the Elasticsearch and OpenSearch backends share: `EngineBackend`, the backend over an engine index
(info and version checks, meta/ensure, reads, bulk writes, stats). The first stage (one `_msearch`, metadata
filters, client fusion) is in `search`, the layout in `mapping`, documents in `documents`, request bodies in
`bodies`, version matters in `versions`, the client and its retries in `client`.

The two engine modules add only what differs: the client, the kNN clause, error classes.
"""
from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable, Sequence
from typing import Any

from ...core.redact import guard_logger, mask_url
from ...domain import (
    IndexedPaper,
    IndexMeta,
    UpsertResult,
    normalize_label,
    paper_problem,
)
from ...errors import BackendError, ModelMismatchError
from ..base import Backend
from .aliasstore import EngineAliasStoreMixin
from .bodies import BM25_MAX_CLAUSES, sample_body, stats_body
from .calibrate import CalibrationMixin
from .client import (
    ClientMixin,
    _describe,
    _error_type,
    _exc_reason,
    _reason,
)
from .documents import _merge_vectors, doc_to_paper, paper_to_doc
from .followstore import EngineFollowStoreMixin
from .mapping import (
    FACET_PATHS,
    LAYOUT,
    VECTOR_FIELDS,
    VECTOR_SOURCE_FIELDS,
    index_body,
    meta_from_mapping,
)
from .maxsim import MV_FIELDS, mv_field
from .maxsim import check_version as check_maxsim_version
from .maxsim import doc_fields as mv_fields
from .maxsim import mapping_properties as mv_mapping
from .names import check_index_name
from .search import FirstStageMixin
from .versions import (
    MIN_VERSIONS,
    UNKNOWN_VERSION_HINT,
    EngineInfo,
    version_from_created_setting,
)
from .watchstore import STAMP_FIELD, EngineWatchStoreMixin

log = guard_logger("esqbe.backends")  # URL credentials masked in what it logs (esqbe.core.redact)

# ---------------------------------------------------------------------------------------------
# The backend


class EngineBackend(ClientMixin, CalibrationMixin, FirstStageMixin, EngineWatchStoreMixin, EngineAliasStoreMixin,
                    EngineFollowStoreMixin, Backend):
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
    #: write per-facet multi-vector fields (esqbe.backends.engines.maxsim; the `engine_facet_vectors` setting)
    facet_vectors: bool = False

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
        check_index_name(index)  # the engines' naming rules, before any request (`*`, `_all`, `a,b` are not names)
        if api_key and username:
            # elasticsearch-py raises on both; opensearch-py would silently drop the API key (it lower-cases
            # custom headers, then http_auth overwrites `authorization`): refuse both the same way, up front
            raise BackendError(
                f"{self.name}: both an API key and a username were given (--api-key / ESQBE_API_KEY / api_key: and "
                "--username / ESQBE_USERNAME / username:); use one way to authenticate: the API key alone, "
                "or --username with --password"
            )
        self.url = mask_url(url) or ""  # for messages, stats and logs: its credentials masked (esqbe.core.redact)
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
    TUNABLES = ("num_candidates_factor", "max_chunk_bytes", "chunk_size", "mget_batch", "bm25_max_clauses", "preference",
                "facet_vectors")

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
            check_index_name(self.index, creating=True, companions=True)  # its watches' and aliases' indexes too
            body = index_body(self.engine, meta)
            if self.facet_vectors:  # the version that has the MaxSim function, named where it is missing
                check_maxsim_version(self.engine, self.info().number)
                body["mappings"]["properties"].update(mv_mapping(self.engine, meta.dim))
            try:
                self._call(self.client.indices.create, index=self.index, body=body)
            except Exception as exc:
                if self._status(exc) != 400 or self.meta() is None:  # 400 + exists: created by a concurrent run
                    raise self._error("creating the index", exc) from exc
            else:
                self._clear_aliases()  # keys left by an earlier index of this name name none of the new one's papers
            existing = self.meta()
            if existing is None:
                raise BackendError(f"index {self.index!r} was created but cannot be read back")
        existing.check(meta)
        self._expected = meta
        if self.facet_vectors and not self._has_facet_vectors():
            check_maxsim_version(self.engine, self.info().number)
            props = mv_mapping(self.engine, meta.dim)
            try:
                self._call(self.client.indices.put_mapping, index=self.index, body={"properties": props})
            except Exception as exc:
                raise self._error("adding the per-facet multi-vector fields (engine_facet_vectors)", exc) from exc
            if self._mapping is not None:
                self._mapping.setdefault("properties", {}).update(props)
        self._add_stamp_field()  # an index made before papers carried `indexed_at` (watches): mapped now

    def _has_facet_vectors(self) -> bool:
        """Whether the index maps the per-facet multi-vector fields."""
        return mv_field(None) in (self._index_mapping().get("properties") or {})

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
        """The papers stored under these ids; an id merged into another paper (esqbe.index.merge) or a DOI, arXiv or
        PubMed id of one (the alias index, esqbe.backends.engines.aliasstore) gives that paper, under the id asked for."""
        ids = list(dict.fromkeys(str(p) for p in paper_ids))
        out = self._get_stored(ids)
        merged = self.resolve_ids([pid for pid in ids if pid not in out]) if len(out) < len(ids) else {}
        if merged:
            got = self._get_stored(sorted(set(merged.values())))
            out.update({asked: got[pid] for asked, pid in merged.items() if pid in got})
        return out

    def _get_stored(self, ids: Sequence[str]) -> dict[str, IndexedPaper]:
        if not ids:
            return {}
        dim = self._index_meta().dim
        sources = self._mget_sources(ids, _source_excludes=[*VECTOR_FIELDS, *MV_FIELDS])  # vectors: vectors_b64
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
        mv = self.facet_vectors and self._has_facet_vectors()
        stamps = self._stamps()  # each paper written now: a stamp past every earlier one (watches' new papers)
        actions = []
        for pid, ip in by_id.items():
            if stored.get(pid) == ip.paper.content_hash():
                result.unchanged += 1
            else:
                doc = paper_to_doc(ip)
                if mv:
                    doc.update(mv_fields([normalize_label(f) for f in ip.paper.facets], ip.vectors))
                if stamps:
                    doc[STAMP_FIELD] = self._next_stamp()
                actions.append({"_op_type": "index", "_index": self.index, "_id": pid, "_source": doc})
        if actions and self.keeps_aliases:  # an index made before the alias index: its papers' keys first
            self._aliases_ready()
        written = []
        for pid, (ok, info) in self._bulk(actions).items():
            if ok:
                if pid in by_id:
                    written.append(by_id[pid])
                if info.get("result") == "created" or info.get("status") == 201:
                    result.added += 1
                else:
                    result.replaced += 1
            else:
                result.errors.append(f"{pid}: {_describe(info)}")
        if actions:
            self._refresh()
        self._remember_keys(written)  # its DOI / arXiv / PubMed id and title name it (esqbe.index.merge)
        return result

    def update_sources(self, sources: dict[str, list[dict]]) -> int:
        """Each paper's `metadata.sources` by a partial update (bulk `update` with `doc`: the engine merges objects,
        replaces arrays, and answers `noop` where nothing changed); `metadata` is stored, not indexed, so no filter
        field moves."""
        if not sources:
            return 0
        self._index_mapping()
        actions = [{"_op_type": "update", "_index": self.index, "_id": pid, "doc": {"metadata": {"sources": value}}}
                   for pid, value in sources.items()]
        changed = 0
        for _pid, (ok, info) in self._bulk(actions).items():
            changed += bool(ok and info.get("result") == "updated")
        self._refresh()
        return changed

    def delete(self, paper_ids: Iterable[str]) -> int:
        ids = list(dict.fromkeys(str(p) for p in paper_ids))
        if not ids:
            return 0
        self._index_mapping()
        actions = [{"_op_type": "delete", "_index": self.index, "_id": pid} for pid in ids]
        deleted, failed, gone = 0, [], []
        for pid, (ok, info) in self._bulk(actions).items():
            if ok:
                deleted += 1
                gone.append(pid)
            elif info.get("status") != 404:  # not found: nothing to delete
                failed.append(f"{pid}: {_describe(info)}")
        self._refresh()
        self._forget_keys(gone)  # the paper goes with its identifiers: a record of it indexed later is a new paper
        if failed:
            raise BackendError(f"deleting from {self.index!r} failed for {len(failed)} papers: " + "; ".join(failed[:5]))
        return deleted

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

