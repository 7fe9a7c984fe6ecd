"""Elasticsearch 8.11 to 9.x backend (official `elasticsearch` client, `pip install 'esqbe[elasticsearch]'`).

kNN: the top-level `knn` section on one facet path's `vector` (works from 8.11; the `knn` query clause
needs 8.12), `filter` on the parent's `paper_id` for re-ranking pools. Basic licence only: the BM25
search and the kNN searches go in one `_msearch` and are fused on the client. Layout, retries and
parsing: `engine_common`.

Client and server majors: elasticsearch-py 9.x sends `compatible-with=9` media types, which an 8.x
server rejects (elasticsearch-py #2923). The backend asks the server's version with plain JSON first and,
when the server is older than the client, sends `compatible-with=<server major>` instead.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from functools import cache
from typing import Any

from ...errors import BackendError
from .common import EngineBackend
from .mapping import FACET_PATHS, VECTOR_SOURCE_FIELDS
from .versions import EngineInfo, parse_version

PIP_HINT = "pip install 'esqbe[elasticsearch]'"


def _client_module():
    try:
        import elasticsearch
    except ImportError as exc:
        raise BackendError(f"the elasticsearch backend needs the official client: {PIP_HINT}") from exc
    return elasticsearch


_COMPAT = re.compile(r"compatible-with=\d+")
_VND_TO_PLAIN = re.compile(r"application/vnd\.elasticsearch\+([\w-]+)\s*;\s*compatible-with=\d+")


def indexed_vectors_search_body(ids: list[str]) -> dict:
    """Search body that returns the nested sentence vectors of `ids`, rehydrated into `_source`."""
    return {"size": len(ids), "track_total_hits": False, "query": {"ids": {"values": ids}},
            "_source": {"includes": list(VECTOR_SOURCE_FIELDS), "exclude_vectors": False}}


def _has_vectors(source: dict) -> bool:
    return all("vector" in row for path in FACET_PATHS.values() for row in source.get(path) or ())


def _is_media_type_rejection(status: int, body: Any) -> bool:
    """An older server refusing the client's `compatible-with=N` (400 media_type_header_exception)."""
    if status != 400 or not isinstance(body, dict) or not isinstance(body.get("error"), dict):
        return False
    return "media_type_header_exception" in (body["error"].get("type", ""), *(
        c.get("type", "") for c in body["error"].get("root_cause") or () if isinstance(c, dict)))


@cache
def compat_transport_class():
    """A Transport that rewrites `compatible-with=N` to the server's major once it is known.

    `plain_json` (set around the version probe): plain `application/json`, which every major accepts.
    `detect_major` (set when the version cannot be read, GET / answering 403): on the first
    media_type_header_exception the server is taken to be one major older and the request is sent again."""
    from elastic_transport import HttpHeaders, Transport

    class CompatTransport(Transport):
        compat_major: int | None = None
        plain_json: bool = False
        detect_major: int | None = None  # the client's major, while the server's is unknown

        def _rewrite(self, headers):
            if not headers or (self.compat_major is None and not self.plain_json):
                return headers
            headers = HttpHeaders(headers)
            for key in ("accept", "content-type"):
                value = headers.get(key)
                if value and "compatible-with=" in value:
                    if self.plain_json:
                        headers[key] = _VND_TO_PLAIN.sub(r"application/\1", value)
                    else:
                        headers[key] = _COMPAT.sub(f"compatible-with={self.compat_major}", value)
            return headers

        def perform_request(self, method, target, *, headers=None, **kwargs):
            resp = super().perform_request(method, target, headers=self._rewrite(headers), **kwargs)
            if (self.detect_major is not None and self.compat_major is None
                    and _is_media_type_rejection(resp.meta.status, resp.body)):
                self.compat_major = self.detect_major - 1
                resp = super().perform_request(method, target, headers=self._rewrite(headers), **kwargs)
            return resp

    return CompatTransport


class ElasticsearchBackend(EngineBackend):
    """Papers in an Elasticsearch index (8.11+, basic licence is enough)."""

    name = "elasticsearch"
    engine = "elasticsearch"

    def _make_client(self, url: str, *, api_key, username, password, ca_certs, verify_certs, request_timeout) -> Any:
        es = _client_module()
        options: dict[str, Any] = {
            "request_timeout": request_timeout,
            "max_retries": 0,  # esqbe retries (tenacity, exponential backoff) so that waits are bounded and tested
            "retry_on_timeout": False,
            "transport_class": compat_transport_class(),
        }
        if api_key:
            options["api_key"] = api_key
        if username:
            options["basic_auth"] = (username, password or "")
        if ca_certs:
            options["ca_certs"] = ca_certs
        if not verify_certs:
            options["verify_certs"] = False
            options["ssl_show_warn"] = False
        try:
            return es.Elasticsearch(url, **options)
        except ValueError as exc:
            raise BackendError(f"elasticsearch: bad connection settings for {url!r}: {exc}") from exc

    def _probe(self) -> EngineInfo:
        """GET / through the client's normal request path (its stored Authorization header and request
        timeout), in plain JSON so that every server major accepts it."""
        es = _client_module()
        transport = self.client.transport
        compat = hasattr(type(transport), "compat_major")
        if compat:
            transport.plain_json = True
        try:
            resp = self.client.perform_request("GET", "/", headers={"accept": "application/json"})
        except es.UnsupportedProductError as exc:
            version = (exc.body or {}).get("version", {}) if isinstance(exc.body, dict) else {}
            if version.get("distribution") == "opensearch":
                raise BackendError(f"{self.url} is OpenSearch {version.get('number')}: use --backend opensearch") from exc
            raise BackendError(f"{self.url} does not answer like Elasticsearch (no X-Elastic-Product header)") from exc
        except es.ApiError as exc:
            if _is_media_type_rejection(self._status(exc) or 0, getattr(exc, "body", None)):
                raise BackendError(
                    f"elasticsearch-py {es.__versionstr__} cannot talk to the (older) Elasticsearch at {self.url}; "
                    "install the client of the server's major (pip install 'elasticsearch>=8.11,<9' for 8.x) "
                    "or let esqbe build the client"
                ) from exc
            raise
        finally:
            if compat:
                transport.plain_json = False
        body = self._body(resp)
        version = body.get("version", {}) if isinstance(body, dict) else {}
        if version.get("distribution") == "opensearch":
            raise BackendError(f"{self.url} is OpenSearch {version.get('number')}: use --backend opensearch")
        info = EngineInfo("elasticsearch", parse_version(version.get("number", "0")), str(version.get("number", "?")))
        client_major = int(es.__versionstr__.split(".")[0])
        if info.version[0] < client_major:
            if compat:
                transport.compat_major = info.version[0]
            else:
                raise BackendError(
                    f"elasticsearch-py {es.__versionstr__} cannot talk to Elasticsearch {info.number}; "
                    f"install a matching client (pip install 'elasticsearch>={info.version[0]},<{info.version[0] + 1}') "
                    "or let esqbe build the client"
                )
        return info

    def _on_version_unknown(self) -> None:
        """GET / refused: keep the client's compatibility headers and step one major down on the first
        media_type_header_exception (an 8.x server answering a 9.x client)."""
        transport = self.client.transport
        if hasattr(type(transport), "detect_major"):
            transport.detect_major = int(_client_module().__versionstr__.split(".")[0])

    def _indexed_vectors(self, ids) -> dict[str, dict]:
        """ES 9.2+ leaves `dense_vector` values out of `_source` (index.mapping.exclude_source_vectors), and
        `_mget` cannot ask for them back: a search by id with `_source.exclude_vectors: false` (8.19, 9.1+)
        rehydrates them. Older versions keep them in `_source`, where `_mget` reads them."""
        info = self.info()
        if not info.has("source_exclude_vectors_param"):
            found = super()._indexed_vectors(ids)
            if info.exact or all(_has_vectors(src) for src in found.values()):
                return found
            # version unknown (GET / refused): the server may be one that leaves vectors out; ask it to put them back
            try:
                return self._search_indexed_vectors(ids)
            except BackendError:
                return found  # 8.11-9.0 reject exclude_vectors: the _mget answer is all there is
        return self._search_indexed_vectors(ids)

    def _search_indexed_vectors(self, ids) -> dict[str, dict]:
        out: dict[str, dict] = {}
        ids = list(ids)
        for start in range(0, len(ids), self.mget_batch):
            body = indexed_vectors_search_body(ids[start : start + self.mget_batch])
            try:
                resp = self._body(self._call(self.client.search, index=self.index, body=body))
            except Exception as exc:
                raise self._error("fetching indexed vectors", exc) from exc
            out.update({hit["_id"]: hit.get("_source") or {} for hit in resp.get("hits", {}).get("hits", [])})
        return out

    def _knn_body(self, path, vector, k, num_candidates, restrict_to) -> dict:
        knn: dict[str, Any] = {"field": f"{path}.vector", "query_vector": vector, "k": k, "num_candidates": num_candidates}
        if restrict_to is not None:
            knn["filter"] = [{"terms": {"paper_id": restrict_to}}]
        return {"size": k, "_source": False, "track_total_hits": False, "knn": knn}

    def _status(self, exc: BaseException) -> int | None:
        meta = getattr(exc, "meta", None)
        status = getattr(meta, "status", None)
        if isinstance(status, int):
            return status
        status = getattr(exc, "status_code", None)
        return status if isinstance(status, int) else None

    def _is_connection_error(self, exc: BaseException) -> bool:
        try:
            from elastic_transport import ConnectionError as TransportConnectionError
            from elastic_transport import ConnectionTimeout
        except ImportError:  # pragma: no cover
            return False
        return isinstance(exc, (TransportConnectionError, ConnectionTimeout))

    def _streaming_bulk(self, actions: list[dict]) -> Iterable[tuple[bool, dict]]:
        from elasticsearch.helpers import streaming_bulk

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
            licence = self._body(self.client.license.get()).get("license", {})
        except Exception:
            return "unknown (licence not readable)"
        kind = licence.get("type", "?")
        if kind in ("enterprise", "trial") and licence.get("status") == "active" and self.info().version[:2] >= (8, 14):
            return f"rrf/linear retrievers available ({kind} licence)"
        return f"none on a {kind} licence (rrf/linear retrievers need enterprise or trial)"
