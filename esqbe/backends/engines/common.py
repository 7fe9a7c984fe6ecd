"""What the Elasticsearch and OpenSearch backends share: index layout, documents, request bodies,
score conversion, retries, bulk indexing and the first stage.

Layout (`facet-nested/1`, see mappings/*.json and docs/engines.md): one document per paper, id = paper id,
with one `nested` path per facet label (`background_sentences`, `method_sentences`, ...). Each nested
object holds `idx` (position in the abstract), `facet`, `text` and the sentence `vector`. A facet filter is
then the choice of path, which works on every supported version (a kNN filter on a nested field needs
ES 9.2+ and changed syntax in OpenSearch 3.5); an unfiltered kNN searches every path and keeps the best
score per paper. BM25 runs on the parent's `title` and `abstract`.

Vectors for the rescorers come from `vectors_b64` (float32 little-endian, base64, one row per sentence, in
`idx` order) in `_source`, never from the indexed vector fields: ES 9.2+ leaves those out of `_source` by
default and older versions cannot be asked to put them back, while a `binary` field is returned as is
by every version, bit for bit.

The two engine modules add only what differs: the client, the kNN clause, error classes.
"""
from __future__ import annotations

import base64
import copy
import dataclasses
import hashlib
import json
import logging
import re
from abc import abstractmethod
from collections import Counter
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np

from ...core.fusion import fuse, top_k
from ...domain import (
    FACET_LABELS,
    Candidate,
    FirstStageRequest,
    IndexedPaper,
    IndexMeta,
    Paper,
    UpsertResult,
    normalize_label,
    paper_problem,
)
from ...errors import BackendError, ModelMismatchError
from ..base import Backend
from .filters import (
    MAX_RESOLVED_IDS,
    add_filter_mapping,
    add_to_bm25,
    add_to_knn,
    filter_clauses,
    filter_fields,
    ids_body,
    knn_needs_ids,
)

log = logging.getLogger("esqbe.backends")

LAYOUT = "facet-nested/1"
#: facet label -> nested path holding that facet's sentences
FACET_PATHS: dict[str, str] = {facet: f"{facet}_sentences" for facet in FACET_LABELS}
#: the indexed vector fields; left out of fetched `_source` (the rescorers read `vectors_b64`)
VECTOR_FIELDS: tuple[str, ...] = tuple(f"{path}.vector" for path in FACET_PATHS.values())
BM25_FIELDS: tuple[str, ...] = ("title", "abstract")
#: what the fallback to indexed vectors reads: each sentence's position and vector
VECTOR_SOURCE_FIELDS: tuple[str, ...] = tuple(f"{path}.{leaf}" for path in FACET_PATHS.values() for leaf in ("idx", "vector"))

#: HTTP statuses worth another try: too many requests, server errors, gateway/availability errors
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
#: oldest engine versions with kNN over nested vectors filtered on a parent field
MIN_VERSIONS = {"elasticsearch": (8, 11), "opensearch": (2, 12)}

# ---------------------------------------------------------------------------------------------
# Mappings


def mappings_dir() -> Path:
    """Where the index definitions are: `esqbe/mappings/` when the package ships them, else the repo's `mappings/`."""
    try:
        packaged = resources.files("esqbe") / "mappings"
        if packaged.is_dir() and (packaged / "elasticsearch.json").is_file():
            return Path(str(packaged))
    except (ModuleNotFoundError, TypeError):  # pragma: no cover - odd importers
        pass
    repo = Path(__file__).resolve().parents[3] / "mappings"
    if repo.is_dir():
        return repo
    raise BackendError("index definitions not found: expected esqbe/mappings/ or mappings/ beside the package")


def load_index_template(engine: str) -> dict:
    """The index definition of `engine` as shipped (`mappings/<engine>.json`), unfilled."""
    path = mappings_dir() / f"{engine}.json"
    with open(path, encoding="utf-8") as fp:
        return json.load(fp)


def index_body(engine: str, meta: IndexMeta) -> dict:
    """`PUT /<index>` body for `meta`: the shipped definition with the model's dimension and name filled in."""
    body = copy.deepcopy(load_index_template(engine))
    mapping = body["mappings"]
    mapping["_meta"] = {"esqbe_layout": LAYOUT, **meta.to_dict()}
    dim_key = "dims" if engine == "elasticsearch" else "dimension"
    for path in FACET_PATHS.values():
        mapping["properties"][path]["properties"]["vector"][dim_key] = int(meta.dim)
    add_filter_mapping(mapping)  # meta_kw / meta_num: filterable metadata (engine_filters)
    return body


def meta_from_mapping(index: str, mapping: dict) -> IndexMeta:
    """IndexMeta from an index's `_meta`; a BackendError when the index was not made by esqbe."""
    m = mapping.get("_meta") or {}
    if "model" not in m or "dim" not in m:
        raise BackendError(f"index {index!r} exists but has no esqbe metadata (_meta.model/_meta.dim): not an esqbe index")
    if m.get("esqbe_layout", LAYOUT) != LAYOUT:
        raise BackendError(f"index {index!r} has layout {m.get('esqbe_layout')!r}; this esqbe reads {LAYOUT!r}: rebuild it")
    return IndexMeta.from_dict(m)


# ---------------------------------------------------------------------------------------------
# Engine versions and what they can do


def parse_version(number: str) -> tuple[int, int, int]:
    parts = [int(x) for x in re.findall(r"\d+", str(number).split("-")[0])[:3]]
    while len(parts) < 3:
        parts.append(0)
    return tuple(parts)  # type: ignore[return-value]


#: (engine, feature) -> first version that has it; the source of docs/engines.md's matrix
FEATURE_SINCE: dict[tuple[str, str], tuple[int, int]] = {
    ("elasticsearch", "nested_knn"): (8, 11),  # top-level knn on a nested dense_vector, one hit per parent
    ("elasticsearch", "knn_parent_filter"): (8, 11),  # knn.filter over parent fields (paper_id)
    ("elasticsearch", "knn_query_dsl"): (8, 12),  # `knn` as a query clause (nested{knn})
    ("elasticsearch", "knn_inner_hits"): (8, 13),
    ("elasticsearch", "source_exclude_vectors_param"): (9, 1),  # also 8.19
    ("elasticsearch", "vectors_out_of_source_by_default"): (9, 2),
    ("elasticsearch", "knn_nested_filter"): (9, 2),
    ("opensearch", "nested_knn"): (2, 12),
    ("opensearch", "knn_parent_filter"): (2, 12),  # term/terms on a parent field inside a nested knn filter
    ("opensearch", "hybrid_query"): (2, 10),
    ("opensearch", "expand_nested_docs"): (2, 19),
    ("opensearch", "rrf_processor"): (2, 19),
    ("opensearch", "unified_cosine_score"): (2, 19),  # (1 + cos) / 2 for every engine, not only lucene
    ("opensearch", "knn_nested_filter_wrapped"): (3, 5),  # nested-field filters must be wrapped in nested{}
    ("opensearch", "knn_method_parameters"): (2, 16),  # `method_parameters.ef_search` in the knn query (k-NN #1783)
}

#: the features the request bodies of this module use (the contract tests check bodies against this)
FEATURES_USED = {
    "elasticsearch": frozenset({"nested_knn", "knn_parent_filter"}),
    "opensearch": frozenset({"nested_knn", "knn_parent_filter"}),
}
#: features the bodies use only on versions that have them (with a fallback elsewhere)
FEATURES_WHERE_SUPPORTED = {
    "elasticsearch": frozenset(),
    "opensearch": frozenset({"knn_method_parameters"}),
}


def version_from_created_setting(engine: str, created: Any) -> tuple[int, int, int] | None:
    """The engine version an index was created with, from its `index.version.created` setting: a lower
    bound of the cluster's version when `GET /` is not allowed (a key without the `monitor` privilege).

    OpenSearch ids are `major*1e6 + minor*1e4 + revision*100 + build` xor 0x08000000 (2.11.0 -> 136327827).
    Elasticsearch ids follow the same pattern up to 8.10; from 8.11 they count independently of releases
    (8.11+ indexes: 8_500_000 and up; 9.x: 9_000_000 and up), so only the major (and "8.11 or newer") is read."""
    try:
        vid = int(str(created))
    except (TypeError, ValueError):
        return None
    if engine == "opensearch":
        vid ^= 0x08000000
        return (vid // 1_000_000, vid // 10_000 % 100, vid // 100 % 100)
    major = vid // 1_000_000
    if major >= 9:
        return (major, 0, 0)
    if major == 8 and vid % 1_000_000 >= 500_000:
        return (8, 11, 0)
    return (major, vid // 10_000 % 100, vid // 100 % 100)


@dataclass(frozen=True)
class EngineInfo:
    engine: str  # "elasticsearch" | "opensearch"
    version: tuple[int, int, int]
    number: str
    #: False when `GET /` was refused (403: no `monitor` privilege): `version` is then a lower bound (the
    #: index's creation version, or the oldest supported one) and features are used only if it has them
    exact: bool = True

    def has(self, feature: str) -> bool:
        since = FEATURE_SINCE.get((self.engine, feature))
        if since is None:
            raise KeyError(f"unknown {self.engine} feature {feature!r}")
        if self.engine == "elasticsearch" and feature == "source_exclude_vectors_param" and self.version[:2] == (8, 19):
            return True
        return self.version[:2] >= since

    def __str__(self) -> str:
        return f"{self.engine} {self.number}"


UNKNOWN_VERSION_HINT = (
    "the credentials may not read the cluster version (GET / needs the `monitor` cluster privilege); "
    "esqbe goes on without the version check, assuming at least {floor} (the {source})"
)


def cosine_from_score(score: float, engine: str, space_engine: str = "lucene", version: tuple[int, ...] = (99,)) -> float:
    """Cosine similarity back from a kNN hit's score (vectors indexed with a cosine similarity).

    - Elasticsearch `dense_vector`, `similarity: cosine`: score = (1 + cos) / 2.
    - OpenSearch `cosinesimil`, by the engine behind the field (read from the mapping, `_vector_space`) and
      the version answering the query:
      - lucene (what esqbe creates): Lucene's own (1 + cos) / 2, on every version;
      - nmslib: 1 / (1 + (1 - cos)) = 1 / (2 - cos) before 2.19 (SpaceType.COSINESIMIL.scoreTranslation was
        `1 / (1 + rawScore)` with rawScore = 1 - cos), (1 + cos) / 2 from 2.19 ("Use one formula to calculate
        cosine similarity", k-NN #2357);
      - faiss: `cosinesimil` exists only from 2.19 (k-NN #2376, earlier faiss had l2 and innerproduct only),
        and scores (1 + cos) / 2 there.
    """
    score = float(score)
    if engine == "opensearch" and space_engine == "nmslib" and tuple(version)[:2] < (2, 19):
        cos = 2.0 - 1.0 / score if score > 0 else -1.0
    else:
        cos = 2.0 * score - 1.0
    return min(1.0, max(-1.0, cos))


def _setting(settings: dict, dotted: str) -> Any:
    """A setting from a `settings.index` object however it is nested (`index.knn: true` beside
    `index.knn.space_type` is rendered as a `knn.space_type` key next to `knn`)."""
    node: Any = settings
    parts = dotted.split(".")
    for i in range(len(parts)):
        if not isinstance(node, dict):
            return None
        rest = ".".join(parts[i:])
        if rest in node and not isinstance(node[rest], dict):
            return node[rest]
        node = node.get(parts[i])
    return node if not isinstance(node, dict) else None


def opensearch_vector_space(vector: dict, created: tuple[int, int, int] | None, settings: dict | None = None) -> tuple[str, str]:
    """(engine, space type) of an OpenSearch `knn_vector` mapping, as the k-NN plugin resolves them.

    The engine is `method.engine`, else the top-level `engine` (3.x); with neither it is the plugin's default
    when the index was created (EngineResolver): lucene for `compression_level: 4x`, faiss for `mode: on_disk`
    or other compressions, else faiss from 2.18 (k-NN #2221) and nmslib before. The space type is
    `method.space_type`, else the top-level `space_type`, else the legacy index setting `index.knn.space_type`,
    else l2."""
    method = vector.get("method") or {}
    engine = method.get("engine") or vector.get("engine")
    if not engine:
        compression, mode = vector.get("compression_level"), vector.get("mode")
        if compression == "4x":
            engine = "lucene"
        elif mode == "on_disk" or compression not in (None, "1x"):
            engine = "faiss"
        else:
            engine = "faiss" if created is not None and created[:2] >= (2, 18) else "nmslib"
    legacy_space = _setting(settings or {}, "knn.space_type")
    space = method.get("space_type") or vector.get("space_type") or legacy_space or "l2"
    return str(engine), str(space)


# ---------------------------------------------------------------------------------------------
# Documents


def encode_vectors(vectors: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(vectors, dtype="<f4").tobytes()).decode("ascii")


def decode_vectors(data: str, n: int, dim: int) -> np.ndarray:
    flat = np.frombuffer(base64.b64decode(data), dtype="<f4")
    if flat.size != n * dim:
        raise BackendError(f"stored vectors hold {flat.size} floats, expected {n} x {dim}")
    return flat.reshape(n, dim).astype(np.float32)


def paper_to_doc(ip: IndexedPaper) -> dict:
    """The engine document of one paper (`_id` = paper id)."""
    paper = ip.paper
    doc: dict[str, Any] = {
        "paper_id": paper.paper_id,
        "title": paper.title,
        "abstract": paper.abstract,
        "content_hash": paper.content_hash(),
        "n_sentences": len(paper.sentences),
        "vectors_b64": encode_vectors(ip.vectors),
        "metadata": dict(paper.metadata),
        **filter_fields(paper.metadata),  # meta_kw / meta_num: what metadata filters search
    }
    for i, (text, label) in enumerate(zip(paper.sentences, paper.facets)):
        facet = normalize_label(label)
        doc.setdefault(FACET_PATHS[facet], []).append(
            {"idx": i, "facet": facet, "text": text, "vector": [float(x) for x in ip.vectors[i]]}
        )
    return doc


def _merge_vectors(source: dict, stored: dict) -> None:
    """Put the indexed vectors of `stored` (nested `idx` + `vector`) into `source`'s sentence rows."""
    for path in FACET_PATHS.values():
        by_idx = {int(r["idx"]): r["vector"] for r in stored.get(path) or () if "idx" in r and r.get("vector") is not None}
        for row in source.get(path) or ():
            if int(row.get("idx", -1)) in by_idx:
                row["vector"] = by_idx[int(row["idx"])]


def doc_to_paper(source: dict, dim: int) -> IndexedPaper:
    """An IndexedPaper back from a stored `_source` (nested vectors may be absent: ES 9.2+ or source filtering)."""
    rows = sorted((s for path in FACET_PATHS.values() for s in source.get(path) or ()), key=lambda s: int(s["idx"]))
    paper = Paper(
        source["paper_id"],
        source.get("title") or "",
        [s.get("text") or "" for s in rows],
        [s.get("facet") or "unlabeled" for s in rows],
        dict(source.get("metadata") or {}),
    )
    n = len(rows)
    if source.get("vectors_b64") is not None:
        vectors = decode_vectors(source["vectors_b64"], n, dim)
    elif all("vector" in s for s in rows):  # written by another tool: fall back to the indexed vectors
        vectors = np.asarray([s["vector"] for s in rows], dtype=np.float32).reshape(n, dim)
    else:
        raise BackendError(f"paper {paper.paper_id}: stored document has no vectors_b64 and no sentence vectors")
    return IndexedPaper(paper, vectors)


# ---------------------------------------------------------------------------------------------
# Request bodies shared by both engines


#: Lucene's clause limit as both engines set it at its lowest: OpenSearch `indices.query.bool.max_clause_count`
#: (default 1024); Elasticsearch 8+ derives it from heap and thread pool, 1024 at least
BM25_MAX_CLAUSES = 1024
#: the `esqbe_en` tokenizer (`[^\p{L}\p{N}]+` splits): runs of letters and digits (`\w` minus `_` is exactly that in Python)
_WORD = re.compile(r"[^\W_]+")
#: `esqbe_max_39`: the engines' `length` filter counts UTF-16 code units
MAX_TOKEN_UTF16 = 39


def utf16_len(token: str) -> int:
    return len(token.encode("utf-16-le")) // 2


def analyzed_tokens(text: str) -> list[str]:
    """The query tokens the engines' `esqbe_en` analyzer makes, before stemming: one clause per token and field."""
    return [t.lower() for t in _WORD.findall(text) if utf16_len(t) <= MAX_TOKEN_UTF16]


def bm25_query(text: str, max_clauses: int = BM25_MAX_CLAUSES) -> dict:
    """BM25 over title + abstract (`most_fields`: the sum of both fields' scores), within the clause limit.

    A `multi_match` makes one term clause per analysed token and field, so a long query text (about 510+
    tokens over two fields) fails the whole search with too_many_clauses. Beyond the limit, each distinct
    token becomes one `multi_match` boosted by its count: BM25 is linear in the boost, so the scores are the
    same as the full query's while every token fits. If even the distinct tokens do not fit, the most frequent
    ones are kept (then the longest, a rough stand-in for rarity), within the limit."""
    plain = {"multi_match": {"query": text, "fields": list(BM25_FIELDS), "type": "most_fields"}}
    tokens = analyzed_tokens(text)
    per_token = len(BM25_FIELDS)
    if len(tokens) * per_token <= max_clauses:
        return plain
    counts = Counter(tokens)
    first = {t: i for i, t in reversed(list(enumerate(tokens)))}
    keep = sorted(counts, key=lambda t: (-counts[t], -utf16_len(t), first[t]))[: max(1, max_clauses // per_token)]
    keep.sort(key=first.__getitem__)  # in text order: a readable body
    should = []
    for token in keep:
        clause: dict[str, Any] = {"query": token, "fields": list(BM25_FIELDS), "type": "most_fields"}
        if counts[token] > 1:
            clause["boost"] = float(counts[token])
        should.append({"multi_match": clause})
    return {"bool": {"should": should}}


def bm25_body(text: str, size: int, restrict_to: Iterable[str] | None, exclude: Iterable[str],
              max_clauses: int = BM25_MAX_CLAUSES) -> dict:
    query: dict[str, Any] = {"must": [bm25_query(text, max_clauses)]}
    if restrict_to is not None:
        query["filter"] = [{"terms": {"paper_id": sorted(restrict_to)}}]
    if exclude:
        query["must_not"] = [{"terms": {"paper_id": sorted(exclude)}}]
    return {"size": size, "_source": False, "track_total_hits": False, "query": {"bool": query}}


def stats_body() -> dict:
    return {
        "size": 0,
        "track_total_hits": True,
        "aggs": {facet: {"nested": {"path": path}} for facet, path in FACET_PATHS.items()},
    }


def sample_body(n: int, seed: int) -> dict:
    """`n` documents in a seeded random order (random_score over `_seq_no`: the same order for the same
    seed while the index is unchanged), ids only, and the total count."""
    return {
        "size": n,
        "_source": False,
        "track_total_hits": True,
        "query": {"function_score": {"query": {"match_all": {}},
                                     "functions": [{"random_score": {"seed": seed, "field": "_seq_no"}}],
                                     "boost_mode": "replace"}},
    }


def facet_paths(facet: str | None) -> list[str]:
    """Nested paths a kNN searches: the facet's own, or all of them (no facet filter)."""
    if facet is None:
        return list(FACET_PATHS.values())
    label = normalize_label(facet)
    return [FACET_PATHS[label]]


# ---------------------------------------------------------------------------------------------
# The backend


class _RetryLater(Exception):
    """Some bulk items failed with a retryable status; the listed ids go again."""


class EngineBackend(Backend):
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
    def _make_client(self, url: str, **options) -> Any: ...

    @abstractmethod
    def _probe(self) -> EngineInfo:
        """GET / : which engine and version answers (and adapt the client to it)."""

    @abstractmethod
    def _knn_body(self, path: str, vector: list[float], k: int, num_candidates: int, restrict_to: list[str] | None) -> dict: ...

    @abstractmethod
    def _status(self, exc: BaseException) -> int | None:
        """HTTP status of a client exception (None for connection errors and non-client errors)."""

    @abstractmethod
    def _is_connection_error(self, exc: BaseException) -> bool: ...

    @abstractmethod
    def _streaming_bulk(self, actions: list[dict]) -> Iterator[tuple[bool, dict]]: ...

    # --- plumbing ------------------------------------------------------------------------------

    def _retryable(self, exc: BaseException) -> bool:
        if isinstance(exc, _ItemRetry):
            return True
        return self._is_connection_error(exc) or self._status(exc) in RETRY_STATUSES

    def _retrying(self):
        from tenacity import (
            Retrying,
            retry_if_exception,
            stop_after_attempt,
            wait_exponential,
        )

        return Retrying(
            retry=retry_if_exception(self._retryable),
            wait=wait_exponential(multiplier=self.retry_wait_initial, max=self.retry_wait_max),
            stop=stop_after_attempt(self.retry_attempts),
            reraise=True,
        )

    def _call(self, fn: Callable, *args, **kwargs):
        """One client call, retried on 429/5xx/connection errors with exponential backoff."""
        return self._retrying()(fn, *args, **kwargs)

    def _body(self, resp: Any) -> Any:
        return getattr(resp, "body", resp)

    def _error(self, what: str, exc: BaseException) -> BackendError:
        return BackendError(f"{self.name} at {self.url}, index {self.index!r}: {what} failed: {exc}")

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
                    f"{info} is too old: esqbe needs {self.engine} {low[0]}.{low[1]}+ (kNN over nested vectors with a parent filter)"
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
        return EngineInfo(self.engine, version, f"version unknown (GET / refused: 403; at least {version[0]}.{version[1]})", exact=False)

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

    def _bulk(self, actions: list[dict]) -> dict[str, tuple[bool, dict]]:
        """Send bulk actions (each with `_id`); retry items failing with 429/5xx and whole chunks failing
        on connection errors, waiting exponentially. Returns id -> (ok, item info) for every action."""
        from tenacity import (
            RetryError,
            Retrying,
            retry_if_exception_type,
            stop_after_attempt,
            wait_exponential,
        )

        pending = {a["_id"]: a for a in actions}
        results: dict[str, tuple[bool, dict]] = {}
        last_error: dict[str, str] = {}

        def send_round() -> None:
            nonlocal pending
            retry: dict[str, dict] = {}
            seen: set[str] = set()
            try:
                for ok, item in self._streaming_bulk(list(pending.values())):
                    _op, info = next(iter(item.items()))
                    pid = str(info.get("_id"))
                    seen.add(pid)
                    exc = info.get("exception")
                    if not ok and (info.get("status") in RETRY_STATUSES or (exc is not None and self._retryable(exc))):
                        retry[pid] = pending[pid]
                        last_error[pid] = _describe(info)
                    else:
                        results[pid] = (ok, info)
            except Exception as exc:
                if not self._retryable(exc):
                    raise self._error("bulk indexing", exc) from exc
                for pid, action in pending.items():
                    if pid not in seen:
                        retry[pid] = action
                        last_error[pid] = str(exc)
            pending = retry
            if pending:
                raise _RetryLater()

        try:
            for attempt in Retrying(
                retry=retry_if_exception_type(_RetryLater),
                wait=wait_exponential(multiplier=self.retry_wait_initial, max=self.retry_wait_max),
                stop=stop_after_attempt(self.retry_attempts),
            ):
                with attempt:
                    send_round()
        except RetryError:
            for pid in pending:
                results[pid] = (False, {"_id": pid, "error": f"gave up after {self.retry_attempts} tries: {last_error.get(pid)}"})
        return results

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
                    f"paper {ip.paper_id} has {ip.vectors.shape[1]}-d vectors but index {self.index!r} holds {meta.dim}-d ({meta.model})"
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
            num_candidates = min(10_000, max(k, self.num_candidates_factor * k, 100))
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
            h.update(f"\x00{request.filter!r}".encode("utf-8"))
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
        }

    def _engine_fusion(self) -> str:
        """What the engine itself could fuse with (reported, not used: client fusion keeps rankings equal)."""
        return "unknown"

    def close(self) -> None:
        close = getattr(self.client, "close", None)
        if close is not None:
            close()


class _ItemRetry(Exception):
    """One search inside `_msearch` failed with a retryable status."""

    def __init__(self, status: int, error: Any):
        super().__init__(f"{status}: {_reason(error)}")
        self.status_code = status


def _exc_reason(exc: BaseException) -> str:
    """A client exception's engine error, shortly: `type: reason` when the body holds one."""
    body = getattr(exc, "body", None)
    if body is None:
        body = getattr(exc, "info", None)  # opensearch-py
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return _reason(body["error"])
    return str(exc)[:300]


def _error_type(error: Any) -> str:
    return str(error.get("type", "")) if isinstance(error, dict) else ""


def _reason(error: Any) -> str:
    if isinstance(error, dict):
        cause = error.get("caused_by") or {}
        reason = f"{error.get('type', 'error')}: {error.get('reason', '')}"
        if isinstance(cause, dict) and cause.get("reason"):
            reason += f" (caused by {cause.get('type')}: {cause.get('reason')})"
        return reason
    return str(error)


def _describe(info: dict) -> str:
    status = info.get("status")
    text = _reason(info.get("error", info))
    return f"{status} {text}" if status not in (None, "N/A") else text


