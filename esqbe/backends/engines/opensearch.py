"""OpenSearch 2.12 to 3.x backend (official `opensearch-py` client, `pip install 'esqbe[opensearch]'`).

kNN: `nested` + `knn` on one facet path's `knn_vector` (lucene engine, cosinesimil), `filter` on the
parent's `paper_id` for re-ranking pools (a term/terms on a parent field works from 2.12; 3.5 runs
every kNN filter in parent scope). BM25 and kNN go in one `_msearch` and are fused on the client, so
rankings equal the embedded backend's; the neural-search `hybrid` query is detected and reported only.
Layout, retries and parsing: `engine_common`.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ...errors import BackendError
from .common import EngineBackend
from .versions import EngineInfo, opensearch_vector_space, parse_version

PIP_HINT = "pip install 'esqbe[opensearch]'"


def _client_module():
    try:
        import opensearchpy
    except ImportError as exc:
        raise BackendError(f"the opensearch backend needs the official client: {PIP_HINT}") from exc
    return opensearchpy


class OpenSearchBackend(EngineBackend):
    """Papers in an OpenSearch index (2.12+, k-NN plugin)."""

    name = "opensearch"
    engine = "opensearch"

    def _make_client(self, url: str, *, api_key, username, password, ca_certs, verify_certs, request_timeout) -> Any:
        osp = _client_module()
        options: dict[str, Any] = {
            "timeout": request_timeout,
            "max_retries": 0,  # esqbe retries (tenacity, exponential backoff)
            "retry_on_timeout": False,
            "verify_certs": verify_certs,
            "ssl_show_warn": verify_certs,
        }
        if username:
            options["http_auth"] = (username, password or "")
        if api_key:
            # the security plugin's API keys (OpenSearch 3.7+) authenticate with this header; older
            # versions take basic auth (or a gateway in front that reads it)
            options["headers"] = {"Authorization": f"ApiKey {api_key}"}
        if ca_certs:
            options["ca_certs"] = ca_certs
        try:
            return osp.OpenSearch(hosts=[url], **options)
        except (ValueError, osp.ImproperlyConfigured) as exc:
            raise BackendError(f"opensearch: bad connection settings for {url!r}: {exc}") from exc

    def _probe(self) -> EngineInfo:
        body = self.client.info()
        version = body.get("version", {})
        if version.get("distribution") != "opensearch":
            raise BackendError(f"{self.url} is Elasticsearch {version.get('number')}: use --backend elasticsearch")
        return EngineInfo("opensearch", parse_version(version.get("number", "0")), str(version.get("number", "?")))

    def _vector_space(self) -> tuple[str, str]:
        """The k-NN library and space type of the vector fields, from the mapping (and, when it names no
        engine, the version the index was created with): decides how hit scores become cosines."""
        vector = self._vector_mapping()
        method = vector.get("method") or {}
        named = (method.get("engine") or vector.get("engine")) and (method.get("space_type") or vector.get("space_type"))
        settings = None if named else self._index_settings()  # defaults depend on the creation version
        created = self._created_version() if settings is not None else None
        engine, space = opensearch_vector_space(vector, created, settings)
        if space != "cosinesimil":
            raise BackendError(
                f"index {self.index!r}: the sentence vectors use space_type {space!r} ({engine}); esqbe reads kNN "
                "scores as cosine similarities and needs `cosinesimil` (mappings/opensearch.json): rebuild the index"
            )
        return engine, space

    def _knn_body(self, path, vector, k, num_candidates, restrict_to) -> dict:
        """`num_candidates` (the same candidate factor as Elasticsearch's) becomes the HNSW search width:
        `method_parameters.ef_search` from 2.16; before that the Lucene engine searches with ef = k, so k
        itself is raised to `num_candidates` and `size` keeps the k best (what 2.16-3.4 do with ef_search:
        Lucene k = max(k, ef_search), cut to `size`)."""
        knn: dict[str, Any] = {"vector": vector, "k": k}
        if num_candidates > k:
            if self.info().has("knn_method_parameters"):
                knn["method_parameters"] = {"ef_search": num_candidates}
            else:
                knn["k"] = num_candidates
        if restrict_to is not None:
            knn["filter"] = {"terms": {"paper_id": restrict_to}}
        return {
            "size": k,
            "_source": False,
            "track_total_hits": False,
            "query": {"nested": {"path": path, "score_mode": "max", "query": {"knn": {f"{path}.vector": knn}}}},
        }

    def _status(self, exc: BaseException) -> int | None:
        status = getattr(exc, "status_code", None)
        return status if isinstance(status, int) else None

    def _is_connection_error(self, exc: BaseException) -> bool:
        osp = _client_module()
        return isinstance(exc, osp.ConnectionError)  # ConnectionTimeout is a subclass

    def _streaming_bulk(self, actions: list[dict]) -> Iterable[tuple[bool, dict]]:
        from opensearchpy.helpers import streaming_bulk

        return streaming_bulk(
            self.client,
            actions,
            chunk_size=self.chunk_size,
            max_chunk_bytes=self.max_chunk_bytes,
            raise_on_error=False,
            raise_on_exception=False,
            max_retries=0,  # retried by EngineBackend._bulk, item by item
        )

    def _engine_fusion(self) -> str:
        try:
            plugins = self._body(self.client.cat.plugins(format="json"))
        except Exception:
            return "unknown (plugins not readable)"
        names = {p.get("component") for p in plugins if isinstance(p, dict)}
        if "opensearch-neural-search" not in names:
            return "none (neural-search plugin not installed)"
        v = self.info().version[:2]
        methods = ["hybrid query + normalization-processor"] + (["score-ranker-processor (rrf)"] if v >= (2, 19) else [])
        return "available: " + ", ".join(methods)
