"""Contract tests of the Elasticsearch and OpenSearch backends, with no engine running.

The real backend code and the real official clients (`elasticsearch`, `opensearch-py`) produce every
request; only the lowest layer is replaced: `RecordingNode` (elastic-transport node) and
`RecordingConnection` (opensearch-py connection) record the bytes the client would put on the wire and
answer with canned engine responses from `CannedEngine`. Nothing here searches anything: these are NOT
integration tests (those are in test_engine_integration.py and need a running engine).

What is checked:
- every index definition, search body and bulk action line against the engines' own API specifications
  (strict JSON Schemas in tests/specs/, cut from the official ES 9.5 / OpenSearch 3.5 specs);
- what the schemas cannot see: vector dimensions vs the model, every field a query names exists in the
  mapping with the right type, which engine features each version has (ES 8.11, 8.19, 9.2; OS 2.12, 2.19, 3.5);
- response parsing (hits -> Candidates, engine scores -> cosine), retries (429/5xx/connection errors then
  success), per-document bulk errors, model mismatch, idempotent re-runs.
"""
from __future__ import annotations

import base64
import hashlib
import itertools
import json
import re
import sys
from collections import defaultdict
from functools import lru_cache
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import numpy as np
import pytest

pytest.importorskip("jsonschema")
es_client = pytest.importorskip("elasticsearch")
os_client = pytest.importorskip("opensearchpy")

from elastic_transport import ApiResponseMeta, BaseNode, HttpHeaders  # noqa: E402
from elastic_transport import ConnectionError as ESConnectionError  # noqa: E402
from elastic_transport._node import NodeApiResponse  # noqa: E402
from jsonschema import Draft202012Validator  # noqa: E402
from opensearchpy.connection import Connection  # noqa: E402

from esqbe.backends.engines.documents import doc_to_paper, paper_to_doc
from esqbe.backends.engines.elasticsearch import (  # noqa: E402
    ElasticsearchBackend,
    compat_transport_class,
)
from esqbe.backends.engines.mapping import (
    FACET_PATHS,
    VECTOR_FIELDS,
    index_body,
    load_index_template,
)
from esqbe.backends.engines.opensearch import OpenSearchBackend  # noqa: E402
from esqbe.backends.engines.versions import (
    FEATURE_SINCE,
    FEATURES_USED,
    FEATURES_WHERE_SUPPORTED,
    EngineInfo,
    cosine_from_score,
    opensearch_vector_space,
    parse_version,
)
from esqbe.core.fusion import fuse, top_k  # noqa: E402
from esqbe.domain import FACET_LABELS, FirstStageRequest, IndexedPaper, IndexMeta, Paper  # noqa: E402
from esqbe.errors import BackendError, ModelMismatchError

SPECS = Path(__file__).parent / "specs"
SCHEMA_FILES = {
    "elasticsearch": SPECS / "elasticsearch-9.5-requests.strict.schema.json",
    "opensearch": SPECS / "opensearch-3.5-requests.strict.schema.json",
}
VERSIONS = {"elasticsearch": ["8.11.4", "8.19.5", "9.2.0"], "opensearch": ["2.12.0", "2.19.3", "3.5.0"]}
ENGINE_VERSIONS = [(e, v) for e, vs in VERSIONS.items() for v in vs]
INDEX = "papers"
DIM = 8
META = IndexMeta("test-encoder", DIM, "contextual")


# ------------------------------------------------------------------------------------------------
# schemas


@lru_cache(maxsize=None)
def _schema_doc(engine: str) -> dict:
    return json.loads(SCHEMA_FILES[engine].read_text(encoding="utf-8"))


@lru_cache(maxsize=None)
def validator(engine: str, key: str) -> Draft202012Validator:
    doc = _schema_doc(engine)
    return Draft202012Validator({"$schema": doc["$schema"], "$defs": doc["$defs"], **doc[key]})


def _leaves(errors):
    return [leaf for e in errors for leaf in (_leaves(e.context) if e.context else [e])]


def schema_errors(engine: str, key: str, body) -> list[str]:
    errors = sorted(_leaves(validator(engine, key).iter_errors(body)), key=lambda e: (-len(e.absolute_path), e.validator == "type"))
    return [f"{e.json_path}: {e.message[:200]}" for e in errors[:3]]


def assert_valid(engine: str, key: str, body) -> None:
    errors = schema_errors(engine, key, body)
    assert not errors, f"{engine} {key} body rejected by the spec: {errors}\n{json.dumps(body)[:600]}"


# ------------------------------------------------------------------------------------------------
# the canned engine behind the real clients


class CannedEngine:
    """Answers the real client's requests with canned engine responses and records them.

    It stores the index definition and the documents sent in bulk so that `_mapping` / `_mget` answer
    like an engine would; `_msearch` answers come from `self.knn_hits` / `self.bm25_hits` set by a test.
    `self.failures[endpoint]` queues failures (an HTTP status, or "connection") for the next calls.
    """

    def __init__(self, engine: str, version: str):
        self.engine = engine
        self.version = version
        self.requests: list[dict] = []
        self.mapping: dict | None = None
        self.settings: dict | None = None
        self.sources: dict[str, dict] = {}
        self.failures: dict[str, list] = defaultdict(list)
        self.bulk_item_status: dict[str, list[int]] = defaultdict(list)  # paper id -> statuses to answer first
        self.knn_hits = lambda body: []  # body -> [(id, score)]
        self.bm25_hits = lambda body: []
        self.omit_source_vectors = engine == "elasticsearch" and parse_version(version) >= (9, 2, 0)

    # -- security, as on a cluster with security on: `require_auth` = the one Authorization value accepted;
    # `forbidden` = endpoints the credentials lack the privilege for (403), e.g. "info" for a key without `monitor`
    require_auth: str | None = None
    forbidden: frozenset = frozenset()

    def _security(self, record):
        if self.require_auth is None:
            return None
        if record["headers"].get("authorization") != self.require_auth:
            return 401, {"error": {"root_cause": [{"type": "security_exception", "reason": "missing authentication credentials for REST request [/]"}],
                                   "type": "security_exception", "reason": "missing authentication credentials for REST request [/]"}, "status": 401}
        if record["endpoint"] in self.forbidden:
            reason = "action [cluster:monitor/main] is unauthorized for API key id [canned] of user [esqbe], this action is granted by the cluster privileges [monitor,manage,all]"
            return 403, {"error": {"root_cause": [{"type": "security_exception", "reason": reason}], "type": "security_exception", "reason": reason}, "status": 403}
        return None

    # -- recording helpers
    def sent(self, endpoint: str) -> list[dict]:
        return [r for r in self.requests if r["endpoint"] == endpoint]

    # -- dispatch
    def handle(self, method: str, target: str, headers: dict, body: bytes | None):
        parts = urlsplit(target)
        path = parts.path.rstrip("/") or "/"
        segs = [s for s in path.split("/") if s]
        endpoint = "info" if not segs else (segs[-1] if segs[-1].startswith("_") else "index")
        if len(segs) >= 2 and segs[0] == "_cat":
            endpoint = "_cat/" + segs[1]
        if len(segs) == 3 and segs[1] == "_doc":
            endpoint = "_doc"
        text = body.decode("utf-8") if isinstance(body, (bytes, bytearray)) else body
        lines = [json.loads(x) for x in text.splitlines() if x.strip()] if text else []
        record = {
            "method": method,
            "path": path,
            "params": {k: v[0] for k, v in parse_qs(parts.query).items()},
            "headers": {k.lower(): v for k, v in (headers or {}).items()},
            "endpoint": endpoint,
            "raw": text,
            "lines": lines,
        }
        self.requests.append(record)
        denied = self._security(record)
        if denied is not None:
            return denied
        if self.engine == "elasticsearch":
            # a server of major M rejects compatible-with=N for N > M (what elasticsearch-py 9 sends to 8.x)
            major = parse_version(self.version)[0]
            for key in ("accept", "content-type"):
                asked = re.search(r"compatible-with=(\d+)", record["headers"].get(key, ""))
                if asked and int(asked.group(1)) > major:
                    return 400, {"error": {"root_cause": [{"type": "media_type_header_exception", "reason": "Invalid media-type value on headers [Accept, Content-Type]"}],
                                           "type": "media_type_header_exception", "reason": "Invalid media-type value on headers [Accept, Content-Type]",
                                           "caused_by": {"type": "status_exception", "reason": f"{key} version must be either version {major} or {major - 1}, but found {asked.group(1)}."}},
                                 "status": 400}
        if self.failures[endpoint]:
            failure = self.failures[endpoint].pop(0)
            if failure == "connection":
                return "connection", None
            return failure, {"error": {"type": "canned_failure", "reason": f"canned {failure}"}, "status": failure}
        return getattr(self, "_" + endpoint.replace("/", "_").lstrip("_"))(method, segs, record)

    def _info(self, method, segs, record):
        version = {"number": self.version, "lucene_version": "9.x"}
        if self.engine == "opensearch":
            version["distribution"] = "opensearch"
        else:
            version["build_flavor"] = "default"
        return 200, {"name": "canned", "cluster_name": "canned", "version": version, "tagline": "canned"}

    def _index(self, method, segs, record):
        if method == "DELETE":
            self.mapping, self.settings, self.sources = None, None, {}
            return 200, {"acknowledged": True}
        if method == "PUT":
            body = record["lines"][0]
            self.mapping, self.settings = body["mappings"], body.get("settings")
            return 200, {"acknowledged": True, "shards_acknowledged": True, "index": segs[0]}
        return 405, {"error": "unexpected"}

    def _mapping(self, method, segs, record):
        if self.mapping is None:
            return 404, {"error": {"type": "index_not_found_exception", "reason": f"no such index [{segs[0]}]"}, "status": 404}
        return 200, {segs[0]: {"mappings": self.mapping}}

    def created_version_id(self) -> str:
        """`index.version.created` as the engine writes it (see version_from_created_setting)."""
        major, minor, rev = parse_version(self.version)
        if self.engine == "opensearch":
            return str((major * 1_000_000 + minor * 10_000 + rev * 100 + 99) ^ 0x08000000)
        if major >= 9:
            return str(major * 1_000_000 + 12_000 + minor)
        return str(8_500_000 + minor * 1000 if (major, minor) >= (8, 11) else major * 1_000_000 + minor * 10_000 + rev * 100 + 99)

    def _settings(self, method, segs, record):
        if self.mapping is None:
            return 404, {"error": {"type": "index_not_found_exception", "reason": f"no such index [{segs[0]}]"}, "status": 404}
        settings = json.loads(json.dumps((self.settings or {}).get("index", self.settings or {})))
        settings.update({"number_of_shards": "1", "provided_name": segs[0], "uuid": "canned",
                         "version": {"created": self.created_version_id()}})
        return 200, {segs[0]: {"settings": {"index": settings}}}

    def _doc(self, method, segs, record):
        pid = segs[2]
        if method in ("PUT", "POST"):
            existed = pid in self.sources
            self.sources[pid] = record["lines"][0]
            return (200 if existed else 201), {"_index": INDEX, "_id": pid, "result": "updated" if existed else "created"}
        if method == "DELETE":
            found = self.sources.pop(pid, None) is not None
            return (200 if found else 404), {"_index": INDEX, "_id": pid, "result": "deleted" if found else "not_found"}
        src = self.sources.get(pid)
        if src is None:
            return 404, {"_index": INDEX, "_id": pid, "found": False}
        return 200, {"_index": INDEX, "_id": pid, "found": True, "_source": filter_source(src, None, set(), self.omit_source_vectors)}

    def _refresh(self, method, segs, record):
        return 200, {"_shards": {"total": 1, "successful": 1, "failed": 0}}

    def _license(self, method, segs, record):
        return 200, {"license": {"type": "basic", "status": "active"}}

    def _cat_plugins(self, method, segs, record):
        return 200, [{"name": "node", "component": "opensearch-knn", "version": self.version}]

    def _mget(self, method, segs, record):
        if self.mapping is None:
            # What the engines answer (not a 404): 200, and per requested id a failure item holding the
            # IndexNotFoundException. Sources: elastic/elasticsearch
            # rest-api-spec/src/yamlRestTest/resources/rest-api-spec/test/mget/12_non_existent_index.yml (mget on a
            # missing index succeeds; docs.0.found is false; _index/_id echoed) and
            # server/src/main/java/org/elasticsearch/action/get/MultiGetResponse.java (Failure.toXContent:
            # _index, _id, then ElasticsearchException.generateFailureXContent -> "error"), raised per item by
            # TransportMultiGetAction when the index does not resolve; the same files in opensearch-project/OpenSearch
            # (rest-api-spec/src/main/resources/rest-api-spec/test/mget/12_non_existent_index.yml).
            name = segs[0]
            error = {"type": "index_not_found_exception", "reason": f"no such index [{name}]", "resource.type": "index_expression",
                     "resource.id": name, "index_uuid": "_na_", "index": name}
            return 200, {"docs": [{"_index": name, "_id": pid, "error": {"root_cause": [dict(error)], **error}}
                                  for pid in record["lines"][0]["ids"]]}
        includes = record["params"].get("_source_includes")
        excludes = set((record["params"].get("_source_excludes") or "").split(",")) - {""}
        docs = []
        for pid in record["lines"][0]["ids"]:
            src = self.sources.get(pid)
            if src is None:
                docs.append({"_index": INDEX, "_id": pid, "found": False})
                continue
            src = filter_source(src, includes.split(",") if includes else None, excludes, self.omit_source_vectors)
            docs.append({"_index": INDEX, "_id": pid, "_version": 1, "found": True, "_source": src})
        return 200, {"docs": docs}

    def _bulk(self, method, segs, record):
        items, lines, i = [], record["lines"], 0
        while i < len(lines):
            (op, meta), = lines[i].items()
            pid = meta["_id"]
            doc = lines[i + 1] if op in ("index", "create", "update") else None
            i += 2 if doc is not None else 1
            queued = self.bulk_item_status[pid]
            status = queued.pop(0) if queued else None
            if status is not None and status >= 300:
                items.append({op: {"_index": INDEX, "_id": pid, "status": status,
                                   "error": {"type": "canned_rejection", "reason": f"canned {status}"}}})
                continue
            if op == "delete":
                found = self.sources.pop(pid, None) is not None
                items.append({op: {"_index": INDEX, "_id": pid, "status": 200 if found else 404,
                                   "result": "deleted" if found else "not_found"}})
            else:
                existed = pid in self.sources
                self.sources[pid] = doc
                items.append({op: {"_index": INDEX, "_id": pid, "status": 200 if existed else 201,
                                   "result": "updated" if existed else "created", "_version": 1}})
        return 200, {"took": 1, "errors": any("error" in next(iter(x.values())) for x in items), "items": items}

    max_clause_count = 1024  # OpenSearch indices.query.bool.max_clause_count default; ES 8+: at least this

    def _msearch(self, method, segs, record):
        answers = []
        for body in record["lines"][1::2]:
            if lucene_clauses(body) > self.max_clause_count:
                reason = f"maxClauseCount is set to {self.max_clause_count}"
                answers.append({"error": {"root_cause": [{"type": "too_many_clauses", "reason": reason}],
                                          "type": "search_phase_execution_exception", "reason": "all shards failed",
                                          "caused_by": {"type": "too_many_clauses", "reason": reason}}, "status": 500})
                continue
            hits = self.bm25_hits(body) if _is_bm25(body) else self.knn_hits(body)
            answers.append({"took": 1, "timed_out": False, "status": 200,
                              "hits": {"max_score": None, "hits": [{"_index": INDEX, "_id": pid, "_score": s} for pid, s in hits]}})
        return 200, {"took": 1, "responses": answers}

    def _search(self, method, segs, record):
        body = record["lines"][0] if record["lines"] else {}
        ids = (body.get("query") or {}).get("ids", {}).get("values")
        if ids is not None:  # documents by id, with source filtering (ES: exclude_vectors: false rehydrates vectors)
            spec = body.get("_source") if isinstance(body.get("_source"), dict) else {}
            omit = self.omit_source_vectors and spec.get("exclude_vectors") is not False
            hits = [{"_index": INDEX, "_id": pid, "_score": 1.0, "_source": filter_source(self.sources[pid], spec.get("includes"), set(), omit)}
                    for pid in ids if pid in self.sources]
            return 200, {"hits": {"max_score": 1.0, "hits": hits}}
        functions = ((body.get("query") or {}).get("function_score") or {}).get("functions") or [{}]
        random_score = functions[0].get("random_score")
        if random_score is not None:  # a seeded random order: the same for the same seed, another for another
            seed = random_score["seed"]
            order = sorted(self.sources, key=lambda pid: hashlib.sha256(f"{seed}:{pid}".encode()).hexdigest())
            hits = [{"_index": INDEX, "_id": pid, "_score": 1.0} for pid in order[: body["size"]]]
            return 200, {"hits": {"total": {"value": len(self.sources), "relation": "eq"}, "hits": hits}}
        aggs = {facet: {"doc_count": 0} for facet in FACET_LABELS}
        for src in self.sources.values():
            for facet, path in FACET_PATHS.items():
                aggs[facet]["doc_count"] += len(src.get(path) or ())
        return 200, {"hits": {"total": {"value": len(self.sources), "relation": "eq"}, "hits": []}, "aggregations": aggs}


def lucene_clauses(node) -> int:
    """Leaf clauses a search body becomes in Lucene, counted as the engines' analyzer would split the text
    (one term clause per token and field of a match/multi_match; repeats counted, as the builder sees them)."""
    if isinstance(node, list):
        return sum(lucene_clauses(x) for x in node)
    if not isinstance(node, dict):
        return 0
    total = 0
    for key, value in node.items():
        if key == "multi_match":
            total += len(re.findall(r"[^\W_]+", value["query"])) * len(value["fields"])
        elif key == "match":
            (spec,) = value.values()
            total += len(re.findall(r"[^\W_]+", spec["query"] if isinstance(spec, dict) else spec))
        else:
            total += lucene_clauses(value)
    return total


def filter_source(src: dict, includes, excludes: set, omit_vectors: bool) -> dict:
    """`_source` filtering as the engines do it (top-level and `path.leaf` includes/excludes); `omit_vectors`:
    ES 9.2+ leaving dense_vector values out."""
    src = json.loads(json.dumps(src))
    if includes:
        wanted = {}
        for field in includes:
            path, _, leaf = field.partition(".")
            if path not in src:
                continue
            if not leaf:
                wanted[path] = src[path]
            else:
                rows = wanted.setdefault(path, [{} for _ in src[path]])
                for row, full in zip(rows, src[path]):
                    if leaf in full:
                        row[leaf] = full[leaf]
        src = wanted
    for field in set(excludes) | (set(VECTOR_FIELDS) if omit_vectors else set()):
        path, _, leaf = field.partition(".")
        for row in src.get(path) or ():
            row.pop(leaf, None)
    return src


def _is_bm25(body: dict) -> bool:
    return "multi_match" in json.dumps(body.get("query", {}))


class RecordingNode(BaseNode):
    """elastic-transport node: hands the request bytes to a CannedEngine instead of a socket."""

    canned: CannedEngine

    def perform_request(self, method, target, body=None, headers=None, request_timeout=None):
        sent = dict(self.headers)
        sent.update(headers or {})
        status, payload = self.canned.handle(method, target, sent, body)
        if status == "connection":
            raise ESConnectionError("canned: connection refused")
        meta = ApiResponseMeta(
            status=status,
            http_version="1.1",
            headers=HttpHeaders({"content-type": "application/json", "x-elastic-product": "Elasticsearch"}),
            duration=0.0,
            node=self.config,
        )
        return NodeApiResponse(meta, json.dumps(payload).encode("utf-8"))

    def close(self):
        pass


class RecordingConnection(Connection):
    """opensearch-py connection: hands the request bytes to a CannedEngine instead of a socket."""

    canned: CannedEngine

    def perform_request(self, method, url, params=None, body=None, timeout=None, ignore=(), headers=None):
        target = url
        if params:
            from urllib.parse import urlencode

            target = f"{url}?{urlencode(params)}"
        sent = dict(self.headers)
        sent.update(headers or {})
        status, payload = self.canned.handle(method, target, sent, body)
        if status == "connection":
            raise os_client.ConnectionError("N/A", "canned: connection refused", None)
        raw = json.dumps(payload)
        if not (200 <= status < 300) and status not in ignore:
            self._raise_error(status, raw, "application/json")
        return status, {"content-type": "application/json"}, raw

    def close(self):
        pass


class EngineHTTPServer:
    """A real HTTP server on 127.0.0.1 that answers like the engine (a CannedEngine behind it): the clients'
    own transports (urllib3 nodes / connections) put the request on a socket, so what is checked is what
    goes over the wire. `delays[endpoint]` queues seconds to wait before answering (request timeouts)."""

    def __init__(self, canned: CannedEngine):
        import http.server
        import threading
        import time

        self.canned = canned
        self.delays: dict[str, list[float]] = defaultdict(list)
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            wbufsize = 1 << 16  # one write per response (flushed by the handler): no Nagle/delayed-ACK stalls
            disable_nagle_algorithm = True

            def _answer(self):
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else None
                n = len(canned.requests)
                status, payload = canned.handle(self.command, self.path, dict(self.headers.items()), body)
                endpoint = canned.requests[n]["endpoint"] if len(canned.requests) > n else ""
                if server.delays[endpoint]:
                    time.sleep(server.delays[endpoint].pop(0))
                raw = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(raw)))
                if canned.engine == "elasticsearch":
                    self.send_header("x-elastic-product", "Elasticsearch")
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(raw)

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _answer

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def engine_server():
    """engine_server(engine, version) -> (server, canned); servers are stopped after the test."""
    servers = []

    def start(engine: str, version: str):
        server = EngineHTTPServer(CannedEngine(engine, version))
        servers.append(server)
        return server, server.canned

    yield start
    for server in servers:
        server.close()


def make_backend(engine: str, version: str, **client_options):
    """The real backend on a real client whose lowest layer is the canned engine."""
    canned = CannedEngine(engine, version)
    if engine == "elasticsearch":
        node = type("Node", (RecordingNode,), {"canned": canned})
        client = es_client.Elasticsearch(
            "http://canned:9200", node_class=node, transport_class=compat_transport_class(), max_retries=0, **client_options
        )
        backend = ElasticsearchBackend("http://canned:9200", INDEX, client=client)
    else:
        conn = type("Conn", (RecordingConnection,), {"canned": canned})
        client = os_client.OpenSearch(hosts=["http://canned:9200"], connection_class=conn, max_retries=0, **client_options)
        backend = OpenSearchBackend("http://canned:9200", INDEX, client=client)
    backend.retry_wait_initial = 0.0  # no sleeping in tests
    backend.retry_wait_max = 0.0
    return backend, canned


# ------------------------------------------------------------------------------------------------
# test data: small random papers


def make_papers(n: int = 6, dim: int = DIM, seed: int = 0) -> list[IndexedPaper]:
    rng = np.random.default_rng(seed)
    facets = ["background", "method", "result", "other", "unlabeled"]
    out = []
    for i in range(n):
        k = 3 + i % 3
        labels = [facets[(i + j) % 4] for j in range(k)]
        vecs = rng.normal(size=(k, dim)).astype(np.float32)
        vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
        paper = Paper(f"p{i}", f"Title {i} about graphs", [f"Sentence {j} of paper {i} on topic {j % 2}." for j in range(k)], labels)
        out.append(IndexedPaper(paper, vecs))
    return out


def request_variants(dim: int = DIM):
    rng = np.random.default_rng(1)
    q = rng.normal(size=(2, dim)).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    for facet, restrict, exclude in itertools.product((None, "method"), (None, frozenset({"p1", "p2", "p3"})), (frozenset(), frozenset({"p0"}))):
        name = f"facet={facet},restrict={'yes' if restrict else 'no'},exclude={'yes' if exclude else 'no'}"
        yield name, FirstStageRequest(text="graphs on topic", vectors=q, facet=facet, k=5, knn_k=4, bm25_k=4,
                                      restrict_to=restrict, exclude=exclude, with_papers=False)


def ready_backend(engine, version, papers=None):
    backend, canned = make_backend(engine, version)
    backend.ensure(META)
    if papers:
        backend.upsert(papers)
    return backend, canned


# ------------------------------------------------------------------------------------------------
# mapping-side helpers: what the schemas cannot see


def mapping_fields(mapping: dict) -> dict[str, dict]:
    """Flattened field name -> field mapping (nested paths included)."""
    out = {}

    def walk(props, prefix):
        for name, spec in props.items():
            full = f"{prefix}{name}"
            out[full] = spec
            if "properties" in spec:
                walk(spec["properties"], full + ".")

    walk(mapping["properties"], "")
    return out


def referenced_fields(node, out=None) -> set[str]:
    """Every field name a search body refers to."""
    out = set() if out is None else out
    if isinstance(node, list):
        for x in node:
            referenced_fields(x, out)
    elif isinstance(node, dict):
        for key, value in node.items():
            if key == "knn" and isinstance(value, dict) and "field" in value:  # ES top-level knn
                out.add(value["field"])
                referenced_fields(value.get("filter"), out)
            elif key == "knn" and isinstance(value, dict):  # OpenSearch knn query: {field: {...}}
                for field, spec in value.items():
                    out.add(field)
                    referenced_fields(spec.get("filter"), out)
            elif key == "nested" and isinstance(value, dict):
                out.add(value["path"])
                referenced_fields(value.get("query"), out)
            elif key in ("term", "terms", "match", "match_phrase", "range", "prefix"):
                out.update(k for k in value if k not in ("boost", "_name"))
            elif key == "multi_match":
                out.update(f.split("^")[0] for f in value["fields"])
            elif key == "exists":
                out.add(value["field"])
            else:
                referenced_fields(value, out)
    return out


def vectors_in(node, out=None) -> list[tuple[str, list]]:
    """(field, query vector) pairs in a search body."""
    out = [] if out is None else out
    if isinstance(node, list):
        for x in node:
            vectors_in(x, out)
    elif isinstance(node, dict):
        if isinstance(node.get("knn"), dict) and "query_vector" in node["knn"]:
            out.append((node["knn"]["field"], node["knn"]["query_vector"]))
        elif isinstance(node.get("knn"), dict):
            for field, spec in node["knn"].items():
                if isinstance(spec, dict) and "vector" in spec:
                    out.append((field, spec["vector"]))
        for v in node.values():
            vectors_in(v, out)
    return out


def features_in(body: dict, engine: str) -> set[str]:
    """Version-gated engine features a search body uses (see FEATURE_SINCE)."""
    text = json.dumps(body)
    used = set()
    knn_filters = []
    if engine == "elasticsearch":
        if "knn" in body:
            used.add("nested_knn")
            knn_filters = [body["knn"].get("filter")]
            if "inner_hits" in body["knn"]:
                used.add("knn_inner_hits")
        if '"knn"' in json.dumps(body.get("query", {})):
            used.add("knn_query_dsl")
        if "exclude_vectors" in text:
            used.add("source_exclude_vectors_param")
    else:
        if '"knn"' in text:
            used.add("nested_knn")
        if "expand_nested_docs" in text:
            used.add("expand_nested_docs")
        if '"hybrid"' in text:
            used.add("hybrid_query")
        if "method_parameters" in text:
            used.add("knn_method_parameters")
        knn_filters = [spec.get("filter") for _, spec in _os_knn_specs(body)]
    for flt in knn_filters:
        if flt is None:
            continue
        fields = referenced_fields(flt)  # parent fields are top-level names; nested ones are dotted paths
        if any("." in f for f in fields) or '"nested"' in json.dumps(flt):
            used.add("knn_nested_filter" if engine == "elasticsearch" else "knn_nested_filter_wrapped")
        if any("." not in f for f in fields):
            used.add("knn_parent_filter")
    if "retriever" in body or "rank" in body:
        used.add("rrf_retriever")
    return used


def _os_knn_specs(node):
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "knn" and isinstance(value, dict):
                yield from ((f, s) for f, s in value.items() if isinstance(s, dict))
            else:
                yield from _os_knn_specs(value)
    elif isinstance(node, list):
        for x in node:
            yield from _os_knn_specs(x)


# ------------------------------------------------------------------------------------------------
# index definitions


@pytest.mark.parametrize("engine", ["elasticsearch", "opensearch"])
def test_shipped_mapping_files_are_valid_index_definitions(engine):
    body = load_index_template(engine)
    assert_valid(engine, "indices_create", body)
    other = "opensearch" if engine == "elasticsearch" else "elasticsearch"
    assert schema_errors(other, "indices_create", body), f"the {engine} mapping should not pass as {other}'s"


@pytest.mark.parametrize("engine", ["elasticsearch", "opensearch"])
def test_mapping_layout_one_nested_path_per_facet(engine):
    mapping = load_index_template(engine)["mappings"]
    fields = mapping_fields(mapping)
    vector_type = "dense_vector" if engine == "elasticsearch" else "knn_vector"
    for facet, path in FACET_PATHS.items():
        assert fields[path]["type"] == "nested"
        assert fields[f"{path}.idx"]["type"] == "integer"
        assert fields[f"{path}.facet"]["type"] == "keyword"
        assert fields[f"{path}.text"]["type"] == "text"
        assert fields[f"{path}.vector"]["type"] == vector_type
        # every facet path is mapped the same way
        assert fields[path] == fields[FACET_PATHS["background"]]
    assert set(FACET_PATHS) == set(FACET_LABELS)
    for name, kind in [("paper_id", "keyword"), ("content_hash", "keyword"), ("title", "text"), ("abstract", "text"), ("vectors_b64", "binary")]:
        assert fields[name]["type"] == kind
    assert mapping["dynamic"] == "strict"
    if engine == "elasticsearch":
        vector = fields["method_sentences.vector"]
        assert vector["similarity"] == "cosine" and vector["index"] is True
        assert vector["index_options"]["type"] == "hnsw"  # unquantized: scores are exact cosines, like the embedded backend
    else:
        method = fields["method_sentences.vector"]["method"]
        assert (method["engine"], method["space_type"], method["name"]) == ("lucene", "cosinesimil", "hnsw")
        assert load_index_template(engine)["settings"]["index"]["knn"] is True


@pytest.mark.parametrize("engine", ["elasticsearch", "opensearch"])
def test_text_fields_use_a_defined_analyzer_like_the_embedded_bm25(engine):
    """Schemas cannot see that an analyzer a field names is defined; BM25 parity wants tantivy's en_stem
    (split on non-alphanumerics, drop tokens of 40+ bytes, lowercase, Snowball English = porter2)."""
    body = load_index_template(engine)
    analysis = body["settings"]["index"]["analysis"]
    for name, spec in mapping_fields(body["mappings"]).items():
        if spec.get("type") == "text":
            assert spec.get("analyzer") == "esqbe_en", name
    analyzer = analysis["analyzer"]["esqbe_en"]
    assert analyzer["tokenizer"] in analysis["tokenizer"]
    assert all(f in analysis["filter"] or f == "lowercase" for f in analyzer["filter"])
    assert analysis["tokenizer"][analyzer["tokenizer"]]["pattern"] == "[^\\p{L}\\p{N}]+"
    assert [analysis["filter"].get(f, {}).get("language") for f in analyzer["filter"]][-1] == "porter2"


@pytest.mark.parametrize("engine", ["elasticsearch", "opensearch"])
@pytest.mark.parametrize("dim", [384, 768])
def test_index_body_fills_the_model_dimension_and_meta(engine, dim):
    meta = IndexMeta("sentence-transformers/all-mpnet-base-v2", dim, "independent")
    body = index_body(engine, meta)
    assert_valid(engine, "indices_create", body)
    fields = mapping_fields(body["mappings"])
    key = "dims" if engine == "elasticsearch" else "dimension"
    assert {fields[f][key] for f in VECTOR_FIELDS} == {dim}
    assert IndexMeta.from_dict(body["mappings"]["_meta"]) == meta
    assert load_index_template(engine)["mappings"]["_meta"]["model"] != meta.model  # the template is not mutated


@pytest.mark.parametrize("engine,version", ENGINE_VERSIONS)
def test_ensure_sends_a_valid_index_definition(engine, version):
    backend, canned = make_backend(engine, version)
    assert backend.meta() is None
    backend.ensure(META)
    (put,) = [r for r in canned.requests if r["method"] == "PUT"]
    assert put["path"] == f"/{INDEX}"
    body = put["lines"][0]
    assert_valid(engine, "indices_create", body)
    assert body == index_body(engine, META)
    assert backend.meta() == META
    backend.ensure(META)  # idempotent: no second PUT
    assert len([r for r in canned.requests if r["method"] == "PUT"]) == 1


# ------------------------------------------------------------------------------------------------
# model mismatch


@pytest.mark.parametrize("engine", ["elasticsearch", "opensearch"])
def test_ensure_with_another_model_raises_model_mismatch(engine):
    backend, _ = ready_backend(engine, VERSIONS[engine][-1])
    with pytest.raises(ModelMismatchError, match="test-encoder"):
        backend.ensure(IndexMeta("other-model", DIM))
    with pytest.raises(ModelMismatchError):
        backend.ensure(IndexMeta("test-encoder", DIM, "independent"))


@pytest.mark.parametrize("engine", ["elasticsearch", "opensearch"])
def test_query_time_checks_the_index_model(engine):
    backend, canned = ready_backend(engine, VERSIONS[engine][0], make_papers(3))
    request = FirstStageRequest(text="x", vectors=np.ones((1, DIM + 1), np.float32))
    with pytest.raises(ModelMismatchError, match=f"{DIM}-d"):
        backend.first_stage(request)
    # a second process that expects another model, on the same index
    other, _ = make_backend(engine, VERSIONS[engine][0])
    other.client = backend.client
    other._expected = IndexMeta("other-model", DIM)
    with pytest.raises(ModelMismatchError, match="other-model"):
        other.first_stage(FirstStageRequest(text="x", vectors=np.ones((1, DIM), np.float32)))
    with pytest.raises(ModelMismatchError):
        backend.upsert([IndexedPaper(Paper("z", "t", ["a"], ["method"]), np.ones((1, DIM + 2), np.float32))])
    assert not canned.sent("_msearch")


@pytest.mark.parametrize("engine", ["elasticsearch", "opensearch"])
def test_foreign_index_without_esqbe_meta_is_refused(engine):
    backend, canned = make_backend(engine, VERSIONS[engine][-1])
    canned.mapping = {"properties": {"title": {"type": "text"}}}
    with pytest.raises(BackendError, match="not an esqbe index"):
        backend.meta()


# ------------------------------------------------------------------------------------------------
# search bodies


@pytest.mark.parametrize("engine,version", ENGINE_VERSIONS)
def test_first_stage_bodies_pass_the_spec_and_the_mapping(engine, version):
    backend, canned = ready_backend(engine, version, make_papers())
    mapping = canned.mapping
    fields = mapping_fields(mapping)
    vector_type = "dense_vector" if engine == "elasticsearch" else "knn_vector"
    dim_key = "dims" if engine == "elasticsearch" else "dimension"
    info = EngineInfo(engine, parse_version(version), version)
    for name, request in request_variants():
        before = len(canned.sent("_msearch"))
        backend.first_stage(request)
        (sent,) = canned.sent("_msearch")[before:]
        headers, bodies = sent["lines"][0::2], sent["lines"][1::2]
        # the index is in the URL; every search of one query goes to the same shard copies
        assert all(h == {"preference": backend.preference_for(request)} for h in headers), name
        assert sent["path"] == f"/{INDEX}/_msearch"
        for body in bodies:
            assert_valid(engine, "search", body)
            for field in referenced_fields(body):
                assert field in fields, f"{name}: {field} is not in the mapping"
            for field, vector in vectors_in(body):
                assert fields[field]["type"] == vector_type
                assert len(vector) == fields[field][dim_key] == DIM
            used = features_in(body, engine)
            missing = {f for f in used if not info.has(f)}
            assert not missing, f"{engine} {version} lacks {missing} used by {name}"
            assert used <= FEATURES_USED[engine] | FEATURES_WHERE_SUPPORTED[engine] | {"knn_parent_filter"}
            assert body["size"] >= 1 and body["_source"] is False
        knn = [b for b in bodies if not _is_bm25(b)]
        bm25 = [b for b in bodies if _is_bm25(b)]
        assert len(bm25) == 1
        paths = {field.split(".")[0] for b in knn for field, _ in vectors_in(b)}
        # facet filter = the facet's own path; no facet = every facet path
        assert paths == ({"method_sentences"} if request.facet else set(FACET_PATHS.values())), name
        assert len(knn) == len(request.vectors) * len(paths)
        for b in knn:
            filters = referenced_fields(b) - {f for f in referenced_fields(b) if f.endswith(".vector") or f.endswith("_sentences")}
            if request.restrict_to is not None:
                assert filters == {"paper_id"}, name
                assert set(json.dumps(b).split('"paper_id": ')[1].split("]")[0].strip("[").replace('"', "").split(", ")) == set(request.restrict_to)
            else:
                assert filters == set(), name
            # exclusions are dropped on the client; the kNN asks for that many more hits
            spec = b["knn"] if engine == "elasticsearch" else next(s for _, s in _os_knn_specs(b))
            wanted = request.knn_k + len(request.exclude)
            if engine == "elasticsearch":
                assert spec["k"] == wanted and spec["num_candidates"] == max(100, 4 * wanted)
            elif info.has("knn_method_parameters"):
                assert spec["k"] == b["size"] == wanted and spec["method_parameters"] == {"ef_search": max(100, 4 * wanted)}
            else:  # before 2.16: ef = k on the Lucene engine, so k is the candidate count and size the k best
                assert spec["k"] == max(100, 4 * wanted) and b["size"] == wanted and "method_parameters" not in spec
        bool_query = bm25[0]["query"]["bool"]
        assert ("filter" in bool_query) == (request.restrict_to is not None)
        assert ("must_not" in bool_query) == bool(request.exclude)


@pytest.mark.parametrize("engine", ["elasticsearch", "opensearch"])
def test_bodies_do_not_depend_on_the_engine_version(engine):
    """One set of bodies serves every supported version (per-facet paths need no version-gated feature);
    on OpenSearch only the HNSW search width is sent differently (ef_search from 2.16, a larger k before)."""
    seen = {}
    for version in VERSIONS[engine]:
        backend, canned = ready_backend(engine, version, make_papers())
        for name, request in request_variants():
            backend.first_stage(request)
        seen[version] = [_without_search_width(r["lines"]) for r in canned.sent("_msearch")]
    first, *rest = seen.values()
    assert all(r == first for r in rest)


def _without_search_width(lines):
    out = json.loads(json.dumps(lines))
    for body in out[1::2]:
        for _, spec in _os_knn_specs(body):
            spec.pop("method_parameters", None)
            spec["k"] = body["size"]
    return out


@pytest.mark.parametrize("engine,version", ENGINE_VERSIONS)
def test_feature_table_matches_the_version_matrix(engine, version):
    info = EngineInfo(engine, parse_version(version), version)
    for feature in FEATURES_USED[engine]:
        assert info.has(feature), f"{engine} {version} must have {feature}"
    v = parse_version(version)[:2]
    if engine == "elasticsearch":
        assert info.has("knn_nested_filter") == (v >= (9, 2))
        assert info.has("knn_inner_hits") == (v >= (8, 13))
        assert info.has("vectors_out_of_source_by_default") == (v >= (9, 2))
        assert info.has("source_exclude_vectors_param") == (v == (8, 19) or v >= (9, 1))
    else:
        assert info.has("expand_nested_docs") == (v >= (2, 19))
        assert info.has("knn_nested_filter_wrapped") == (v >= (3, 5))
        assert info.has("unified_cosine_score") == (v >= (2, 19))
        assert info.has("knn_method_parameters") == (v >= (2, 16))
    assert all(engine_ in ("elasticsearch", "opensearch") for engine_, _ in FEATURE_SINCE)


def test_feature_detection_sees_version_gated_syntax():
    """The checker above would notice a body that needs a newer engine."""
    es_nested_filter = {"knn": {"field": "sentences.vector", "query_vector": [0.1], "k": 1, "num_candidates": 1,
                                "filter": [{"term": {"sentences.facet": "method"}}], "inner_hits": {}}}
    assert {"knn_nested_filter", "knn_inner_hits"} <= features_in(es_nested_filter, "elasticsearch")
    assert not EngineInfo("elasticsearch", (8, 11, 0), "8.11.0").has("knn_nested_filter")
    os_wrapped = {"query": {"nested": {"path": "sentences", "query": {"knn": {"sentences.vector": {
        "vector": [0.1], "k": 1, "expand_nested_docs": True,
        "filter": {"nested": {"path": "sentences", "query": {"term": {"sentences.facet": "method"}}}}}}}}}}
    assert {"expand_nested_docs", "knn_nested_filter_wrapped"} <= features_in(os_wrapped, "opensearch")


@pytest.mark.parametrize("engine", ["elasticsearch", "opensearch"])
def test_stats_body_is_valid_and_counts_per_facet(engine):
    papers = make_papers()
    backend, canned = ready_backend(engine, VERSIONS[engine][-1], papers)
    stats = backend.stats()
    (sent,) = canned.sent("_search")
    assert_valid(engine, "search", sent["lines"][0])
    for field in referenced_fields(sent["lines"][0]) | {a["nested"]["path"] for a in sent["lines"][0]["aggs"].values()}:
        assert field in mapping_fields(canned.mapping)
    assert stats["papers"] == len(papers)
    assert stats["sentences"] == sum(len(p.paper.sentences) for p in papers)
    assert stats["sentences_by_facet"]["method"] == sum(p.paper.facets.count("method") for p in papers)
    assert (stats["model"], stats["dim"]) == (META.model, META.dim)
    assert "client" in stats["fusion"]


@pytest.mark.parametrize("engine", ["elasticsearch", "opensearch"])
def test_sample_papers_body_is_valid_and_centering_works_on_an_engine(engine):
    """vector_centering reads a seeded random sample of papers (random_score) and their vectors through
    the backend interface: the body passes the spec, and the directions match the papers' own."""
    from esqbe.query import centering

    papers = make_papers()
    backend, canned = ready_backend(engine, VERSIONS[engine][-1], papers)
    ids, total = backend.sample_papers(3, seed=7)
    (sent,) = canned.sent("_search")
    assert_valid(engine, "search", sent["lines"][0])
    assert total == len(papers) and len(ids) == 3 and set(ids) <= {p.paper_id for p in papers}
    assert backend.sample_papers(3, seed=7)[0] == ids
    directions = centering.corpus_directions(backend, "top1", sample=len(papers))
    want = centering.estimate(np.concatenate([p.vectors for p in sorted(papers, key=lambda p: p.paper_id)]), 1)
    assert np.allclose(directions.mean, want.mean, atol=1e-3)  # the documents' vectors are stored in float16
    assert abs(abs(float(directions.top[0] @ want.top[0])) - 1) < 1e-2
    assert directions.corpus == len(papers)


# ------------------------------------------------------------------------------------------------
# bulk lines


@pytest.mark.parametrize("engine,version", ENGINE_VERSIONS)
def test_bulk_lines_pass_the_spec_and_the_mapping(engine, version):
    papers = make_papers()
    backend, canned = ready_backend(engine, version)
    result = backend.upsert(papers)
    assert (result.added, result.replaced, result.unchanged, result.errors) == (len(papers), 0, 0, [])
    (bulk,) = canned.sent("_bulk")
    assert bulk["raw"].endswith("\n")  # NDJSON framing
    fields = mapping_fields(canned.mapping)
    dim_key = "dims" if engine == "elasticsearch" else "dimension"
    actions, sources = bulk["lines"][0::2], bulk["lines"][1::2]
    assert len(actions) == len(papers)
    for action, source, ip in zip(actions, sources, papers):
        assert_valid(engine, "bulk_action", action)
        assert action == {"index": {"_index": INDEX, "_id": ip.paper_id}}  # id = paper id: re-runs replace
        # dynamic: strict -- every field sent must be mapped
        for key, value in source.items():
            assert key in fields, key
            if fields[key]["type"] == "nested":
                for row in value:
                    assert set(row) <= set(fields[key]["properties"])
                    assert len(row["vector"]) == fields[f"{key}.vector"][dim_key]
                    assert row["facet"] == key[: -len("_sentences")]
        assert source["content_hash"] == ip.paper.content_hash()
        decoded = np.frombuffer(base64.b64decode(source["vectors_b64"]), "<f4").reshape(len(ip.paper.sentences), DIM)
        assert np.array_equal(decoded, ip.vectors)
    assert canned.sent("_refresh"), "upsert must refresh at the end"


@pytest.mark.parametrize("engine", ["elasticsearch", "opensearch"])
def test_bulk_batches_are_sized_by_bytes(engine):
    papers = make_papers(12)
    backend, canned = ready_backend(engine, VERSIONS[engine][-1])
    one = len(json.dumps(paper_to_doc(papers[0])))
    backend.max_chunk_bytes = 3 * one
    backend.upsert(papers)
    sent = canned.sent("_bulk")
    assert len(sent) >= 4
    assert all(len(r["raw"].encode()) <= 3 * one + 4096 for r in sent)
    assert sum(len(r["lines"]) // 2 for r in sent) == len(papers)


@pytest.mark.parametrize("engine", ["elasticsearch", "opensearch"])
def test_rerun_is_idempotent_and_counts_added_replaced_unchanged(engine):
    papers = make_papers(4)
    backend, canned = ready_backend(engine, VERSIONS[engine][-1])
    assert backend.upsert(papers).added == 4
    again = backend.upsert(papers)
    assert (again.added, again.replaced, again.unchanged) == (0, 0, 4)
    assert len(canned.sent("_bulk")) == 1  # unchanged papers are not sent again
    changed = IndexedPaper(Paper("p1", "A new title", papers[1].paper.sentences, papers[1].paper.facets), papers[1].vectors)
    third = backend.upsert([changed, *make_papers(6)[4:]])
    assert (third.added, third.replaced, third.unchanged) == (2, 1, 0)
    assert len(canned.sources) == 6
    assert backend.content_hashes(["p1", "nope"]) == {"p1": changed.paper.content_hash()}


@pytest.mark.parametrize("engine", ["elasticsearch", "opensearch"])
def test_per_document_bulk_errors_are_reported(engine):
    papers = make_papers(4)
    backend, canned = ready_backend(engine, VERSIONS[engine][-1])
    canned.bulk_item_status["p2"] = [400]
    result = backend.upsert(papers)
    assert (result.added, len(result.errors)) == (3, 1)
    assert result.errors[0].startswith("p2: 400") and "canned_rejection" in result.errors[0]
    assert len(canned.sent("_bulk")) == 1  # a 400 is not retried


@pytest.mark.parametrize("engine", ["elasticsearch", "opensearch"])
def test_bulk_retries_429_items_then_succeeds(engine):
    papers = make_papers(4)
    backend, canned = ready_backend(engine, VERSIONS[engine][-1])
    canned.bulk_item_status["p1"] = [429, 503]
    result = backend.upsert(papers)
    assert (result.added, result.errors) == (4, [])
    sent = canned.sent("_bulk")
    assert [len(r["lines"]) // 2 for r in sent] == [4, 1, 1]  # only the rejected document goes again
    assert all(r["lines"][0]["index"]["_id"] == "p1" for r in sent[1:])


@pytest.mark.parametrize("engine", ["elasticsearch", "opensearch"])
@pytest.mark.parametrize("failure", [429, 502, "connection"])
def test_bulk_retries_whole_request_failures(engine, failure):
    papers = make_papers(3)
    backend, canned = ready_backend(engine, VERSIONS[engine][-1])
    canned.failures["_bulk"] = [failure, failure]
    result = backend.upsert(papers)
    assert (result.added, result.errors) == (3, [])
    assert len(canned.sent("_bulk")) == 3


@pytest.mark.parametrize("engine", ["elasticsearch", "opensearch"])
def test_bulk_gives_up_after_the_retry_budget(engine):
    backend, canned = ready_backend(engine, VERSIONS[engine][-1])
    backend.retry_attempts = 3
    canned.bulk_item_status["p0"] = [429] * 10
    result = backend.upsert(make_papers(2))
    assert result.added == 1
    assert len(result.errors) == 1 and "gave up after 3 tries" in result.errors[0] and "429" in result.errors[0]
    assert len(canned.sent("_bulk")) == 3


@pytest.mark.parametrize("engine", ["elasticsearch", "opensearch"])
def test_delete_counts_existing_papers(engine):
    backend, canned = ready_backend(engine, VERSIONS[engine][-1], make_papers(3))
    assert backend.delete(["p0", "p2", "missing"]) == 2
    bulk = canned.sent("_bulk")[-1]
    for line in bulk["lines"]:
        assert_valid(engine, "bulk_action", line)
    assert set(canned.sources) == {"p1"}


# ------------------------------------------------------------------------------------------------
# retries of searches


@pytest.mark.parametrize("engine", ["elasticsearch", "opensearch"])
@pytest.mark.parametrize("failure", [429, 503, "connection"])
def test_search_retries_then_succeeds(engine, failure):
    backend, canned = ready_backend(engine, VERSIONS[engine][-1], make_papers(3))
    canned.failures["_msearch"] = [failure]
    canned.bm25_hits = lambda body: [("p1", 2.0)]
    out = backend.first_stage(FirstStageRequest(text="graphs", vectors=np.ones((1, DIM), np.float32) / np.sqrt(DIM), with_papers=False))
    assert [c.paper_id for c in out] == ["p1"]
    assert len(canned.sent("_msearch")) == 2


@pytest.mark.parametrize("engine", ["elasticsearch", "opensearch"])
def test_search_item_429_inside_msearch_is_retried(engine):
    backend, canned = ready_backend(engine, VERSIONS[engine][-1], make_papers(3))
    calls = []
    original = canned._msearch

    def flaky(method, segs, record):
        status, body = original(method, segs, record)
        calls.append(1)
        if len(calls) == 1:
            body["responses"][0] = {"error": {"type": "es_rejected_execution_exception", "reason": "queue full"}, "status": 429}
        return status, body

    canned._msearch = flaky
    backend.first_stage(FirstStageRequest(text="graphs", vectors=np.ones((1, DIM), np.float32), with_papers=False))
    assert len(calls) == 2


@pytest.mark.parametrize("engine", ["elasticsearch", "opensearch"])
def test_search_client_errors_are_not_retried(engine):
    backend, canned = ready_backend(engine, VERSIONS[engine][-1], make_papers(3))
    canned.failures["_msearch"] = [400]
    with pytest.raises(BackendError, match="searching failed"):
        backend.first_stage(FirstStageRequest(text="graphs", vectors=np.ones((1, DIM), np.float32), with_papers=False))
    assert len(canned.sent("_msearch")) == 1


# ------------------------------------------------------------------------------------------------
# response parsing


@pytest.mark.parametrize("engine,version", ENGINE_VERSIONS)
def test_hits_become_candidates_with_cosines(engine, version):
    papers = make_papers(5)
    backend, canned = ready_backend(engine, version, papers)
    q = np.stack([papers[0].vectors[0], papers[3].vectors[1]])
    # canned kNN answers: per (query sentence, path), the stored sentences' exact cosines as engine scores
    by_path = defaultdict(list)
    for ip in papers:
        for i, facet in enumerate(ip.paper.facets):
            by_path[FACET_PATHS[facet]].append((ip.paper_id, ip.vectors[i]))

    def knn_hits(body):
        (field, vector), = vectors_in(body)
        path = field.split(".")[0]
        best = {}
        for pid, vec in by_path[path]:
            best[pid] = max(best.get(pid, -1.0), float(np.dot(vec, np.asarray(vector, np.float32))))
        ranked = sorted(best.items(), key=lambda kv: -kv[1])[: (body["knn"]["k"] if "knn" in body else next(s for _, s in _os_knn_specs(body))["k"])]
        return [(pid, (1.0 + cos) / 2.0) for pid, cos in ranked]  # both engines' cosine score

    canned.knn_hits = knn_hits
    canned.bm25_hits = lambda body: [("p2", 7.5), ("p0", 3.0), ("p4", 1.0)]
    request = FirstStageRequest(text="graphs", vectors=q, facet=None, k=4, knn_k=3, bm25_k=3, exclude=frozenset({"p4"}))
    out = backend.first_stage(request)

    # expected: the definition, computed from the vectors directly
    expected_knn = defaultdict(float)
    for qv in q:
        per_paper = {ip.paper_id: float((ip.vectors @ qv).max()) for ip in papers if ip.paper_id != "p4"}
        for pid, cos in sorted(per_paper.items(), key=lambda kv: (-kv[1], kv[0]))[:3]:
            expected_knn[pid] += cos / len(q)
    expected_bm25 = {"p2": 7.5, "p0": 3.0}
    expected = top_k(fuse(expected_bm25, dict(expected_knn), "rrf"), 4)
    assert [(c.paper_id, pytest.approx(c.score)) for c in out] == [(pid, pytest.approx(s)) for pid, s in expected]
    for c in out:
        assert c.knn == pytest.approx(expected_knn.get(c.paper_id, 0.0), abs=1e-6)
        assert c.bm25 == expected_bm25.get(c.paper_id, 0.0)
        # the rescorers get every sentence with its facet, text and exact vector
        ip = next(p for p in papers if p.paper_id == c.paper_id)
        assert c.paper.paper.sentences == ip.paper.sentences
        assert c.paper.paper.facets == ip.paper.facets
        assert c.paper.paper.title == ip.paper.title
        assert np.array_equal(c.paper.vectors, ip.vectors)
    assert "p4" not in {c.paper_id for c in out}
    # the papers come from one _mget that leaves the indexed vectors out of _source
    (mget,) = canned.sent("_mget")[-1:]
    assert set(mget["params"]["_source_excludes"].split(",")) == set(VECTOR_FIELDS)


@pytest.mark.parametrize("engine", ["elasticsearch", "opensearch"])
def test_facet_filter_maps_objective_to_background_path(engine):
    backend, canned = ready_backend(engine, VERSIONS[engine][0], make_papers(2))
    backend.first_stage(FirstStageRequest(text="", vectors=np.ones((1, DIM), np.float32), facet="objective", with_papers=False))
    (sent,) = canned.sent("_msearch")
    assert {f.split(".")[0] for b in sent["lines"][1::2] for f, _ in vectors_in(b)} == {"background_sentences"}
    assert not any(_is_bm25(b) for b in sent["lines"][1::2])  # no text: no BM25 search


@pytest.mark.parametrize("engine", ["elasticsearch", "opensearch"])
def test_empty_restrict_to_asks_nothing(engine):
    backend, canned = ready_backend(engine, VERSIONS[engine][0], make_papers(2))
    assert backend.first_stage(FirstStageRequest(text="x", vectors=np.ones((1, DIM), np.float32), restrict_to=frozenset())) == []
    assert not canned.sent("_msearch")


def test_score_to_cosine_conversion():
    for cos in (-1.0, -0.3, 0.0, 0.42, 1.0):
        es_score = (1 + cos) / 2  # dense_vector similarity: cosine
        assert cosine_from_score(es_score, "elasticsearch") == pytest.approx(cos)
        assert cosine_from_score(es_score, "opensearch", "lucene", (2, 12, 0)) == pytest.approx(cos)
        assert cosine_from_score(es_score, "opensearch", "faiss", (2, 19, 0)) == pytest.approx(cos)
        assert cosine_from_score(1 / (2 - cos), "opensearch", "nmslib", (2, 12, 0)) == pytest.approx(cos)
    assert cosine_from_score(1.0000001, "elasticsearch") == 1.0


@pytest.mark.parametrize("engine", ["elasticsearch", "opensearch"])
def test_get_rebuilds_papers_without_source_vectors(engine):
    """ES 9.2+ leaves vectors out of _source; the rescorers' vectors come from vectors_b64, bit for bit."""
    papers = make_papers(3)
    version = "9.2.0" if engine == "elasticsearch" else "3.5.0"
    backend, canned = ready_backend(engine, version, papers)
    canned.omit_source_vectors = True
    got = backend.get(["p2", "p0", "absent"])
    assert set(got) == {"p0", "p2"}
    for pid, ip in got.items():
        original = papers[int(pid[1:])]
        assert np.array_equal(ip.vectors, original.vectors) and ip.vectors.dtype == np.float32
        assert ip.paper.sentences == original.paper.sentences and ip.paper.facets == original.paper.facets


def test_document_round_trip_and_fallback_to_nested_vectors():
    ip = make_papers(1)[0]
    doc = paper_to_doc(ip)
    assert doc_to_paper(doc, DIM).paper.to_dict() == ip.paper.to_dict()
    del doc["vectors_b64"]  # a document written by another tool
    assert np.allclose(doc_to_paper(doc, DIM).vectors, ip.vectors)
    for path in FACET_PATHS.values():
        for row in doc.get(path, []):
            row.pop("vector")
    with pytest.raises(BackendError, match="no vectors_b64"):
        doc_to_paper(doc, DIM)


# ------------------------------------------------------------------------------------------------
# clients: versions, auth, imports


@pytest.mark.parametrize("version,major", [("8.11.4", 8), ("8.19.5", 8), ("9.2.0", 9)])
def test_es_client_speaks_the_server_major(version, major):
    """elasticsearch-py 9 sends compatible-with=9, which 8.x rejects: the backend sends the server's major."""
    backend, canned = ready_backend("elasticsearch", version, make_papers(1))
    client_major = int(es_client.__versionstr__.split(".")[0])
    expected = min(major, client_major)
    for r in canned.requests:
        if r["endpoint"] == "info":
            assert "compatible-with" not in r["headers"].get("accept", "")  # the probe asks in plain JSON
            continue
        for key in ("accept", "content-type"):
            if "compatible-with" in r["headers"].get(key, ""):
                assert r["headers"][key].endswith(f"compatible-with={expected}"), (r["path"], r["headers"][key])


def test_es_client_without_compat_transport_refuses_an_older_server():
    canned = CannedEngine("elasticsearch", "8.11.0")
    node = type("Node", (RecordingNode,), {"canned": canned})
    client = es_client.Elasticsearch("http://canned:9200", node_class=node, max_retries=0)
    backend = ElasticsearchBackend("http://canned:9200", INDEX, client=client)
    if int(es_client.__versionstr__.split(".")[0]) > 8:
        with pytest.raises(BackendError, match=r"cannot talk to the \(older\) Elasticsearch"):
            backend.meta()


@pytest.mark.parametrize("engine,version", [("elasticsearch", "8.10.2"), ("opensearch", "2.11.1")])
def test_too_old_engines_are_refused(engine, version):
    backend, _ = make_backend(engine, version)
    with pytest.raises(BackendError, match="too old"):
        backend.meta()


@pytest.mark.parametrize("engine,other", [("elasticsearch", "opensearch"), ("opensearch", "elasticsearch")])
def test_wrong_engine_behind_the_url_is_named(engine, other):
    backend, canned = make_backend(engine, "9.2.0" if engine == "elasticsearch" else "3.5.0")
    canned.engine = other
    with pytest.raises(BackendError, match=f"--backend {other}"):
        backend.meta()


def test_es_client_options_from_constructor():
    certifi = pytest.importorskip("certifi")
    key = ElasticsearchBackend("https://es.example:9200", "papers", api_key="a2V5OnNlY3JldA==", request_timeout=7,
                               ca_certs=certifi.where())
    assert key.client._headers["authorization"] == "ApiKey a2V5OnNlY3JldA=="
    assert key.client._request_timeout == 7
    assert isinstance(key.client.transport, compat_transport_class())
    node = next(iter(key.client.transport.node_pool.all()))
    assert (node.config.scheme, node.config.ca_certs) == ("https", certifi.where())
    basic = ElasticsearchBackend("http://localhost:9200", "papers", username="elastic", password="pw")
    assert basic.client._headers["authorization"] == "Basic " + base64.b64encode(b"elastic:pw").decode()
    unverified = ElasticsearchBackend("https://es.example:9200", "papers", verify_certs=False)
    assert next(iter(unverified.client.transport.node_pool.all())).config.verify_certs is False


def test_os_client_options_from_constructor():
    certifi = pytest.importorskip("certifi")
    basic = OpenSearchBackend("https://os.example:9200", "papers", username="admin", password="pw", request_timeout=7,
                              ca_certs=certifi.where())
    conn = basic.client.transport.get_connection()
    assert conn.host == "https://os.example:9200" and conn.timeout == 7
    assert conn.headers["authorization"] == "Basic " + base64.b64encode(b"admin:pw").decode()
    assert basic.client.transport.kwargs["ca_certs"] == certifi.where()
    key = OpenSearchBackend("http://localhost:9200", "papers", api_key="tok")
    assert key.client.transport.get_connection().headers["authorization"] == "ApiKey tok"
    unverified = OpenSearchBackend("https://os.example:9200", "papers", verify_certs=False)
    assert unverified.client.transport.kwargs["verify_certs"] is False


@pytest.mark.parametrize("module,cls,extra", [
    ("elasticsearch", ElasticsearchBackend, "esqbe[elasticsearch]"),
    ("opensearchpy", OpenSearchBackend, "esqbe[opensearch]"),
])
def test_missing_client_names_the_pip_extra(monkeypatch, module, cls, extra):
    monkeypatch.setitem(sys.modules, module, None)  # import fails as if not installed
    with pytest.raises(BackendError, match=re.escape(f"pip install '{extra}'")):
        cls("http://localhost:9200", "papers")


@pytest.mark.parametrize("engine", ["elasticsearch", "opensearch"])
def test_missing_index_is_reported_not_created_by_bulk(engine):
    backend, canned = make_backend(engine, VERSIONS[engine][-1])
    with pytest.raises(BackendError, match="does not exist"):
        backend.upsert(make_papers(1))
    assert not canned.sent("_bulk")


# ------------------------------------------------------------------------------------------------
# the compose files users start (static checks; starting them is the integration tests' job)

DOCKER = Path(__file__).resolve().parents[1] / "docker"
COMPOSE = sorted(p for p in DOCKER.glob("*.yml") if "secured" not in p.name)
SECURED = sorted(DOCKER.glob("*-secured.yml"))


def test_compose_files_exist_for_both_engines_and_topologies():
    names = {p.name for p in COMPOSE}
    assert {"elasticsearch-single-node.yml", "elasticsearch-three-nodes.yml",
            "opensearch-single-node.yml", "opensearch-three-nodes.yml"} <= names


@pytest.mark.parametrize("path", COMPOSE, ids=lambda p: p.name)
def test_compose_files_bind_localhost_with_security_off(path):
    yaml = pytest.importorskip("yaml")
    spec = yaml.safe_load(path.read_text())
    services = spec["services"]
    published = [p for s in services.values() for p in s.get("ports", [])]
    assert len(published) == 1 and published[0].startswith("127.0.0.1:"), published
    for name, service in services.items():
        env = dict(e.split("=", 1) for e in service["environment"])
        if "elasticsearch" in service["image"]:
            assert env["xpack.security.enabled"] == "false"
            assert "-Xms" in env["ES_JAVA_OPTS"]
        else:
            assert env["DISABLE_SECURITY_PLUGIN"] == "true" and env["DISABLE_INSTALL_DEMO_CONFIG"] == "true"
            assert "-Xms" in env["OPENSEARCH_JAVA_OPTS"]
        if len(services) == 1:
            assert env["discovery.type"] == "single-node"
        else:
            assert len(services) == 3 and "discovery.seed_hosts" in env
            key = "cluster.initial_master_nodes" if "elasticsearch" in service["image"] else "cluster.initial_cluster_manager_nodes"
            assert set(env[key].split(",")) == set(services)


# ------------------------------------------------------------------------------------------------
# issue 10, item 9: an API key and a username at once are refused on both backends


@pytest.mark.parametrize("cls", [ElasticsearchBackend, OpenSearchBackend])
def test_api_key_and_username_together_are_refused(cls):
    """opensearch-py used to keep only the basic auth (it lower-cases the custom header, then http_auth
    overwrites `authorization`) and elasticsearch-py raises a ValueError: both now get the same clear error."""
    with pytest.raises(BackendError, match="both an API key and a username"):
        cls("http://127.0.0.1:9", "papers", api_key="a2V5OnNlY3JldA==", username="elastic", password="pw")


@pytest.mark.parametrize("backend", ["elasticsearch", "opensearch"])
def test_cli_reports_api_key_and_username_as_one_error_line(backend):
    from click.testing import CliRunner

    from cli import main

    result = CliRunner().invoke(main, ["stats", "--backend", backend, "--url", "http://127.0.0.1:9", "--index", "papers",
                                       "--api-key", "a2V5OnNlY3JldA==", "--username", "elastic", "--password", "pw"])
    assert result.exit_code == 1, result.output
    assert "both an API key and a username" in result.output
    assert "Traceback" not in result.output


# ------------------------------------------------------------------------------------------------
# issue 10, item 1: credentials on every request (the version probe included), over a real socket

ES_KEY = base64.b64encode(b"esqbe-id:esqbe-secret").decode()
AUTH_CASES = [
    ("elasticsearch", "9.2.0", {"api_key": ES_KEY}, f"ApiKey {ES_KEY}"),
    ("elasticsearch", "8.19.5", {"username": "elastic", "password": "pw"}, "Basic " + base64.b64encode(b"elastic:pw").decode()),
    ("opensearch", "3.5.0", {"username": "admin", "password": "pw"}, "Basic " + base64.b64encode(b"admin:pw").decode()),
    ("opensearch", "2.19.3", {"api_key": "os-key"}, "ApiKey os-key"),
]


def _http_backend(server, engine, **options):
    cls = ElasticsearchBackend if engine == "elasticsearch" else OpenSearchBackend
    backend = cls(server.url, INDEX, **options)
    backend.retry_wait_initial = backend.retry_wait_max = 0.0
    return backend


def _full_session(backend):
    """What `esqbe index`, `query`, `stats` and `delete` send, in order."""
    papers = make_papers(4)
    backend.ensure(META)
    backend.upsert(papers)
    out = backend.first_stage(FirstStageRequest(text="graphs", vectors=papers[0].vectors, k=3))
    backend.stats()
    backend.delete(["p3"])
    return out


@pytest.mark.parametrize("engine,version,options,expected", AUTH_CASES, ids=lambda x: x if isinstance(x, str) else None)
def test_every_request_carries_the_configured_authorization(engine_server, engine, version, options, expected):
    server, canned = engine_server(engine, version)
    canned.require_auth = expected  # anything else answers 401, as a cluster with security on does
    canned.bm25_hits = lambda body: [("p1", 2.0), ("p2", 1.0)]
    backend = _http_backend(server, engine, **options)
    out = _full_session(backend)
    assert [c.paper_id for c in out][:2] == ["p1", "p2"] and out[0].paper is not None
    assert canned.requests[0]["endpoint"] == "info"  # the version probe is the first request
    assert {r["endpoint"] for r in canned.requests} >= {"info", "_mapping", "index", "_mget", "_bulk", "_refresh", "_msearch", "_search"}
    assert [r["path"] for r in canned.requests if r["headers"].get("authorization") != expected] == []
    backend.close()


@pytest.mark.parametrize("engine,version", [("elasticsearch", "9.2.0"), ("opensearch", "3.5.0")])
def test_wrong_credentials_fail_at_once_with_a_clear_error(engine_server, engine, version):
    server, canned = engine_server(engine, version)
    canned.require_auth = "Basic " + base64.b64encode(b"elastic:right").decode()
    backend = _http_backend(server, engine, username="elastic", password="wrong")
    with pytest.raises(BackendError, match=r"authentication failed \(401\)"):
        backend.meta()
    assert len(canned.requests) == 1  # a 401 is not retried


@pytest.mark.parametrize("engine,version", [("elasticsearch", "9.2.0"), ("opensearch", "3.5.0")])
def test_version_probe_is_retried_on_429_and_503(engine_server, engine, version):
    server, canned = engine_server(engine, version)
    canned.failures["info"] = [429, 503, 429, 503]  # more than the transport's own 3 retries: esqbe's backoff retries
    backend = _http_backend(server, engine)
    assert backend.meta() is None
    assert [r["endpoint"] for r in canned.requests] == ["info"] * 5 + ["_mapping"]
    assert str(backend.info()) == f"{engine} {version}"


@pytest.mark.parametrize("engine,version", [("elasticsearch", "9.2.0"), ("opensearch", "3.5.0")])
def test_version_probe_uses_the_request_timeout(engine_server, engine, version):
    """A probe past `request_timeout` is cut off and tried again (it used to wait the transport's default)."""
    server, canned = engine_server(engine, version)
    server.delays["info"] = [1.5]
    backend = _http_backend(server, engine, request_timeout=0.3)
    assert backend.meta() is None
    assert [r["endpoint"] for r in canned.requests][:2] == ["info", "info"]


@pytest.mark.parametrize("engine,version,created", [
    ("elasticsearch", "9.2.0", (9, 0, 0)),
    ("elasticsearch", "8.19.5", (8, 11, 0)),  # a 9.x client and an 8.x server: compatibility found by trying
    ("opensearch", "2.19.3", (2, 19, 3)),
])
def test_least_privilege_key_without_monitor_still_works(engine_server, caplog, engine, version, created):
    """A key with read/write/view_index_metadata/create_index on the esqbe index only: GET / answers 403."""
    key = "ApiKey bGVhc3Q6cHJpdmlsZWdl"
    server, canned = engine_server(engine, version)
    canned.require_auth = key
    canned.forbidden = frozenset({"info", "_license", "_cat/plugins"})
    canned.bm25_hits = lambda body: [("p1", 2.0)]
    options = {"api_key": key.split()[1]}
    first = _http_backend(server, engine, **options)
    with caplog.at_level("WARNING", logger="esqbe.backends"):
        out = _full_session(first)
    assert [c.paper_id for c in out] == ["p1"]
    assert "GET / answered 403" in caplog.text and "monitor" in caplog.text
    info = first.info()
    assert not info.exact and info.version[:2] == (8, 11) if engine == "elasticsearch" else info.version[:2] == (2, 12)
    assert "version unknown" in first.stats()["engine"]
    # a later session on the existing index reads the lower bound from the index's creation version
    second = _http_backend(server, engine, **options)
    assert second.meta() == META
    assert second.info().version == created and not second.info().exact
    if engine == "elasticsearch":
        client_major = int(es_client.__versionstr__.split(".")[0])
        server_major = parse_version(version)[0]
        last = canned.requests[-1]["headers"]["accept"]
        assert f"compatible-with={min(client_major, server_major)}" in last


# ------------------------------------------------------------------------------------------------
# issue 10, item 6: _mget on a missing index answers 200 with per-document index_not_found_exception


@pytest.mark.parametrize("engine", ["elasticsearch", "opensearch"])
def test_mget_on_a_missing_index_means_nothing_stored(engine):
    """`esqbe index` asks for the stored content hashes before the first paper is written; on a new cluster
    the index does not exist yet and the engine answers 200 with one failure item per id."""
    backend, canned = make_backend(engine, VERSIONS[engine][-1])
    assert backend.content_hashes(["p0", "p1"]) == {}
    (mget,) = canned.sent("_mget")
    assert mget["lines"][0] == {"ids": ["p0", "p1"]}


@pytest.mark.parametrize("engine", ["elasticsearch", "opensearch"])
def test_mget_other_per_document_errors_still_raise(engine):
    backend, canned = ready_backend(engine, VERSIONS[engine][-1], make_papers(2))
    original = canned._mget

    def shard_failure(method, segs, record):
        status, body = original(method, segs, record)
        body["docs"][0] = {"_index": INDEX, "_id": "p0", "error": {"type": "no_shard_available_action_exception", "reason": "No shard available"}}
        return status, body

    canned._mget = shard_failure
    with pytest.raises(BackendError, match="no_shard_available_action_exception"):
        backend.content_hashes(["p0", "p1"])


# ------------------------------------------------------------------------------------------------
# issue 10, item 5: a stable `preference` on _msearch (scores must not depend on which copy answers)


@pytest.mark.parametrize("engine", ["elasticsearch", "opensearch"])
def test_msearch_sends_a_stable_preference_per_query(engine):
    backend, canned = ready_backend(engine, VERSIONS[engine][-1], make_papers(3))
    q = make_papers(1)[0].vectors
    same = [FirstStageRequest(text="graphs on topic", vectors=q.copy(), facet="method", with_papers=False) for _ in range(2)]
    other = FirstStageRequest(text="other words", vectors=q, facet="method", with_papers=False)
    for request in (*same, other):
        backend.first_stage(request)
    prefs = []
    for sent in canned.sent("_msearch"):
        values = {h.get("preference") for h in sent["lines"][0::2]}
        assert len(values) == 1, values  # one copy per query: BM25 and kNN see the same statistics
        prefs.append(values.pop())
    assert prefs[0] == prefs[1] and prefs[0] != prefs[2]
    assert all(p and not p.startswith("_") for p in prefs)
    # a second process (another session) sends the same preference for the same query
    again, canned2 = ready_backend(engine, VERSIONS[engine][-1], make_papers(3))
    again.first_stage(same[0])
    assert canned2.sent("_msearch")[0]["lines"][0]["preference"] == prefs[0]
    backend.preference = "my-session"  # configurable, e.g. one per user session
    backend.first_stage(other)
    assert {h["preference"] for h in canned.sent("_msearch")[-1]["lines"][0::2]} == {"my-session"}


# ------------------------------------------------------------------------------------------------
# issue 10, item 3: BM25 within the clause limit (OpenSearch keeps max_clause_count at 1024)

WORDS = [f"w{i}x{chr(97 + i % 26)}{chr(97 + i // 26 % 26)}" for i in range(2000)]


def _bm25_of(canned) -> dict:
    (body,) = [b for b in canned.sent("_msearch")[-1]["lines"][1::2] if _is_bm25(b)]
    return body


@pytest.mark.parametrize("engine", ["elasticsearch", "opensearch"])
def test_600_token_query_stays_under_the_clause_limit(engine):
    """600 distinct tokens x 2 fields = 1200 clauses: the whole first stage used to fail with too_many_clauses."""
    backend, canned = ready_backend(engine, VERSIONS[engine][0], make_papers(3))
    canned.bm25_hits = lambda body: [("p1", 5.0)]
    text = " ".join(WORDS[:600])
    out = backend.first_stage(FirstStageRequest(text=text, vectors=np.ones((1, DIM), np.float32), with_papers=False))
    assert "p1" in {c.paper_id for c in out}
    body = _bm25_of(canned)
    assert_valid(engine, "search", body)
    assert lucene_clauses(body) <= 1024
    kept = [c["multi_match"]["query"] for c in body["query"]["bool"]["must"][0]["bool"]["should"]]
    assert len(kept) == 512 and set(kept) <= set(WORDS[:600])
    assert referenced_fields(body) - {"paper_id"} == {"title", "abstract"}


@pytest.mark.parametrize("engine", ["elasticsearch", "opensearch"])
def test_long_query_with_repeats_keeps_bm25_exact(engine):
    """600 tokens, 150 distinct: one boosted clause per distinct token; BM25 is linear in the boost, so the
    score is the full query's (every token counted as often as it occurs)."""
    backend, canned = ready_backend(engine, VERSIONS[engine][-1], make_papers(3))
    rng = np.random.default_rng(3)
    tokens = [WORDS[i] for i in rng.integers(0, 150, size=600)]
    tokens[:150] = WORDS[:150]  # every one of the 150 occurs
    text = " ".join(t.capitalize() if i % 7 == 0 else t for i, t in enumerate(tokens)) + ". " + "x" * 45
    backend.first_stage(FirstStageRequest(text=text, vectors=np.ones((1, DIM), np.float32), with_papers=False))
    body = _bm25_of(canned)
    assert_valid(engine, "search", body)
    assert lucene_clauses(body) <= 1024
    weights = {c["multi_match"]["query"]: c["multi_match"].get("boost", 1.0) for c in body["query"]["bool"]["must"][0]["bool"]["should"]}
    from collections import Counter
    assert weights == {t: float(n) for t, n in Counter(tokens).items()}  # lower-cased, the 45-char token dropped
    assert all(c["multi_match"]["type"] == "most_fields" for c in body["query"]["bool"]["must"][0]["bool"]["should"])


@pytest.mark.parametrize("engine", ["elasticsearch", "opensearch"])
def test_short_queries_keep_the_plain_multi_match(engine):
    backend, canned = ready_backend(engine, VERSIONS[engine][-1], make_papers(3))
    text = " ".join(WORDS[:400])  # 800 clauses: within the limit
    backend.first_stage(FirstStageRequest(text=text, vectors=np.ones((1, DIM), np.float32), with_papers=False))
    assert _bm25_of(canned)["query"]["bool"]["must"] == [{"multi_match": {"query": text, "fields": ["title", "abstract"], "type": "most_fields"}}]


# ------------------------------------------------------------------------------------------------
# issue 10, item 8: OpenSearch score conversion from the mapping's engine and the cluster version

COSINES = (-0.9, -0.3, 0.0, 0.42, 0.97, 1.0)


@pytest.mark.parametrize("engine,space_engine,version,formula", [
    ("elasticsearch", "lucene", (8, 11, 0), "half"),
    ("elasticsearch", "lucene", (9, 2, 0), "half"),
    ("opensearch", "lucene", (2, 12, 0), "half"),  # Lucene's VectorSimilarityFunction.COSINE
    ("opensearch", "lucene", (3, 5, 0), "half"),
    ("opensearch", "nmslib", (2, 12, 0), "nmslib"),  # SpaceType.COSINESIMIL: 1 / (1 + (1 - cos)) before 2.19
    ("opensearch", "nmslib", (2, 18, 0), "nmslib"),
    ("opensearch", "nmslib", (2, 19, 0), "half"),  # one formula for every engine (k-NN #2357)
    ("opensearch", "nmslib", (3, 5, 0), "half"),
    ("opensearch", "faiss", (2, 19, 0), "half"),  # faiss has cosinesimil only from 2.19 (k-NN #2376)
    ("opensearch", "faiss", (3, 5, 0), "half"),
])
def test_cosine_formula_per_engine_and_version(engine, space_engine, version, formula):
    for cos in COSINES:
        score = (1 + cos) / 2 if formula == "half" else 1 / (2 - cos)
        assert cosine_from_score(score, engine, space_engine, version) == pytest.approx(cos, abs=1e-6)


def test_faiss_cosine_has_no_pre_2_19_branch():
    """faiss could not index cosinesimil before 2.19, so its scores are always (1 + cos) / 2: the old
    "faiss before 2.19" branch was dead code and would have misread a (1 + cos) / 2 score."""
    assert cosine_from_score(0.71, "opensearch", "faiss", (2, 18, 0)) == pytest.approx(0.42)


@pytest.mark.parametrize("vector,created,settings,expected", [
    ({"type": "knn_vector", "dimension": 8, "method": {"name": "hnsw", "space_type": "cosinesimil", "engine": "lucene"}}, (2, 12, 0), None, ("lucene", "cosinesimil")),
    ({"type": "knn_vector", "dimension": 8, "method": {"name": "hnsw", "space_type": "cosinesimil", "engine": "faiss"}}, (2, 19, 0), None, ("faiss", "cosinesimil")),
    ({"type": "knn_vector", "dimension": 8, "method": {"name": "hnsw", "space_type": "cosinesimil"}}, (2, 17, 1), None, ("nmslib", "cosinesimil")),
    ({"type": "knn_vector", "dimension": 8, "method": {"name": "hnsw", "space_type": "cosinesimil"}}, (2, 18, 0), None, ("faiss", "cosinesimil")),
    ({"type": "knn_vector", "dimension": 8, "space_type": "cosinesimil"}, (3, 5, 0), None, ("faiss", "cosinesimil")),
    ({"type": "knn_vector", "dimension": 8, "space_type": "cosinesimil", "engine": "lucene"}, (3, 5, 0), None, ("lucene", "cosinesimil")),
    ({"type": "knn_vector", "dimension": 8, "space_type": "cosinesimil", "compression_level": "4x"}, (3, 5, 0), None, ("lucene", "cosinesimil")),
    ({"type": "knn_vector", "dimension": 8, "space_type": "cosinesimil", "mode": "on_disk"}, (2, 17, 0), None, ("faiss", "cosinesimil")),
    ({"type": "knn_vector", "dimension": 8}, (2, 13, 0), {"knn": {"space_type": "cosinesimil"}}, ("nmslib", "cosinesimil")),  # legacy mapping
    ({"type": "knn_vector", "dimension": 8}, (2, 11, 0), {"knn": "true", "knn.space_type": "cosinesimil"}, ("nmslib", "cosinesimil")),
    ({"type": "knn_vector", "dimension": 8}, (2, 19, 0), {}, ("faiss", "l2")),
])
def test_opensearch_engine_and_space_are_read_as_the_plugin_resolves_them(vector, created, settings, expected):
    assert opensearch_vector_space(vector, created, settings) == expected


def _foreign_opensearch_index(version, vector_spec, settings_extra=None):
    backend, canned = ready_backend("opensearch", version, make_papers(5))
    for path in FACET_PATHS.values():
        canned.mapping["properties"][path]["properties"]["vector"] = dict(vector_spec)
    canned.settings = {"index": {**canned.settings["index"], **(settings_extra or {})}}
    fresh = OpenSearchBackend("http://canned:9200", INDEX, client=backend.client)  # a new session reads the mapping
    fresh.retry_wait_initial = fresh.retry_wait_max = 0.0
    return fresh, canned


@pytest.mark.parametrize("version,vector_spec,settings_extra,score", [
    ("2.17.0", {"type": "knn_vector", "dimension": DIM}, {"knn": {"space_type": "cosinesimil"}}, lambda c: 1 / (2 - c)),  # nmslib default
    ("2.17.0", {"type": "knn_vector", "dimension": DIM, "method": {"name": "hnsw", "space_type": "cosinesimil"}}, None, lambda c: 1 / (2 - c)),
    ("2.19.3", {"type": "knn_vector", "dimension": DIM, "method": {"name": "hnsw", "space_type": "cosinesimil"}}, None, lambda c: (1 + c) / 2),  # faiss default
    ("3.5.0", {"type": "knn_vector", "dimension": DIM, "space_type": "cosinesimil"}, None, lambda c: (1 + c) / 2),
])
def test_opensearch_index_not_created_by_esqbe_gives_exact_cosines(version, vector_spec, settings_extra, score):
    """An index whose mapping names no engine: the default engine of its creation version decides the formula
    (the code used to assume lucene, reading 1 / (2 - cos) scores of nmslib as (1 + cos) / 2)."""
    backend, canned = _foreign_opensearch_index(version, vector_spec, settings_extra)
    papers = make_papers(5)
    q = papers[2].vectors[:1]
    cos = {ip.paper_id: float((ip.vectors @ q[0]).max()) for ip in papers}
    canned.knn_hits = lambda body: [(pid, score(c)) for pid, c in sorted(cos.items(), key=lambda kv: -kv[1])]
    out = backend.first_stage(FirstStageRequest(text="", vectors=q, fusion="knn", k=5, with_papers=False))
    assert {c.paper_id: round(c.knn, 5) for c in out} == {pid: round(c, 5) for pid, c in cos.items()}


def test_opensearch_index_with_another_space_type_is_refused():
    backend, _ = _foreign_opensearch_index("3.5.0", {"type": "knn_vector", "dimension": DIM, "space_type": "l2", "engine": "faiss"})
    with pytest.raises(BackendError, match="space_type 'l2'.*cosinesimil"):
        backend.first_stage(FirstStageRequest(text="", vectors=np.ones((1, DIM), np.float32), with_papers=False))


# ------------------------------------------------------------------------------------------------
# issue 10, item 4: OpenSearch gets the candidate factor (ef_search) where the version has it


@pytest.mark.parametrize("version,expected", [
    ("2.12.0", "k"), ("2.15.0", "k"), ("2.16.0", "ef_search"), ("2.19.3", "ef_search"), ("3.5.0", "ef_search"),
])
def test_opensearch_knn_searches_as_wide_as_elasticsearch(version, expected):
    backend, canned = ready_backend("opensearch", version, make_papers(3))
    backend.first_stage(FirstStageRequest(text="", vectors=np.ones((1, DIM), np.float32), knn_k=10, with_papers=False))
    for body in canned.sent("_msearch")[-1]["lines"][1::2]:
        assert_valid("opensearch", "search", body)
        (_, spec), = _os_knn_specs(body)
        assert body["size"] == 10
        if expected == "ef_search":
            assert spec["method_parameters"] == {"ef_search": 100} and spec["k"] == 10
        else:
            assert spec["k"] == 100 and "method_parameters" not in spec  # 2.12-2.15 reject method_parameters


# ------------------------------------------------------------------------------------------------
# issue 10, item 7: documents without vectors_b64 (written by another tool) fall back to the indexed vectors


@pytest.mark.parametrize("engine,version", ENGINE_VERSIONS)
def test_get_falls_back_to_indexed_vectors_without_vectors_b64(engine, version):
    papers = make_papers(4)
    backend, canned = ready_backend(engine, version, papers)
    for pid in ("p1", "p3"):
        del canned.sources[pid]["vectors_b64"]  # as another tool would write them
    got = backend.get(["p0", "p1", "p3"])
    for pid in ("p0", "p1", "p3"):
        original = papers[int(pid[1:])]
        assert np.array_equal(got[pid].vectors, original.vectors), pid
        assert got[pid].paper.sentences == original.paper.sentences
    first = canned.sent("_mget")[-2 if not (engine == "elasticsearch" and parse_version(version) >= (8, 19, 0)) else -1]
    assert set(first["params"]["_source_excludes"].split(",")) == set(VECTOR_FIELDS)  # the usual fetch stays lean
    if engine == "elasticsearch" and parse_version(version) >= (8, 19, 0):
        (search,) = [r for r in canned.sent("_search") if "ids" in r["lines"][0].get("query", {})]
        assert_valid(engine, "search", search["lines"][0])
        assert search["lines"][0]["query"]["ids"]["values"] == ["p1", "p3"]
        assert search["lines"][0]["_source"]["exclude_vectors"] is False
    else:
        again = canned.sent("_mget")[-1]
        assert again["lines"][0] == {"ids": ["p1", "p3"]} and "vector" in again["params"]["_source_includes"]


# ------------------------------------------------------------------------------------------------
# issue 10, item 10: the long-token rule of the engines' analyzer (documented divergence from tantivy)


def test_engine_length_filter_counts_utf16_units_and_differs_from_tantivy_on_non_ascii(tmp_path):
    """The engines' `length` filter (max 39) counts UTF-16 code units; the embedded tantivy `en_stem`
    drops tokens of 40+ UTF-8 *bytes* (RemoveLongFilter(40)). They agree on ASCII; a long non-ASCII token
    (25 Cyrillic letters = 50 bytes) is searchable in the engines and not in the embedded index. This pins
    what docs/engines.md says (BM25 parity); aligning would mean changing the embedded tokenizer."""
    for engine in ("elasticsearch", "opensearch"):
        analysis = load_index_template(engine)["settings"]["index"]["analysis"]
        assert analysis["filter"]["esqbe_max_39"] == {"type": "length", "max": 39}
        assert analysis["analyzer"]["esqbe_en"]["filter"][0] == "esqbe_max_39"
    from esqbe.backends.engines.bodies import analyzed_tokens

    cyrillic, a39, a40, astral = "ж" * 25, "a" * 39, "b" * 40, "x" * 30 + "\U0001d400" * 5  # 𝐀: 2 UTF-16 units
    engine_kept = set(analyzed_tokens(f"{cyrillic} {a39} {a40} {astral}"))
    assert engine_kept == {cyrillic, a39}  # the astral word is 40 UTF-16 units: dropped, like the engines do
    tantivy = pytest.importorskip("tantivy")
    sb = tantivy.SchemaBuilder()
    sb.add_text_field("t", tokenizer_name="en_stem")
    schema = sb.build()
    index = tantivy.Index(schema, path=str(tmp_path))
    writer = index.writer(15_000_000, 1)
    writer.add_document(tantivy.Document(t=f"{cyrillic} {a39} {a40}"))
    writer.commit()
    index.reload()
    found = {w for w in (cyrillic, a39, a40) if index.searcher().search(tantivy.Query.term_query(schema, "t", w), 1).count}
    assert found == {a39}  # tantivy: the 50-byte Cyrillic token is gone, the engines keep it


# ------------------------------------------------------------------------------------------------
# issue 10, item 2: the secured compose files (static checks; tests/test_engine_secured.py starts them)


def test_secured_compose_files_exist_for_both_engines():
    assert {p.name for p in SECURED} == {"elasticsearch-secured.yml", "opensearch-secured.yml"}


@pytest.mark.parametrize("path", SECURED, ids=lambda p: p.name)
def test_secured_compose_files_turn_security_and_tls_on(path):
    yaml = pytest.importorskip("yaml")
    import shutil
    import subprocess

    spec = yaml.safe_load(path.read_text())
    services = spec["services"]
    published = [p for s in services.values() for p in s.get("ports", [])]
    assert len(published) == 1 and published[0].startswith("127.0.0.1:"), published
    node = next(s for s in services.values() if s.get("ports"))
    env = dict(e.split("=", 1) for e in node["environment"])
    assert env["discovery.type"] == "single-node"
    # the setup container makes the certificates first; the node starts only after it succeeded
    assert node["depends_on"]["setup"]["condition"] == "service_completed_successfully"
    setup = services["setup"]
    script = DOCKER / "secured" / Path(next(a for a in setup.get("command") or setup.get("entrypoint") if a.endswith(".sh"))).name
    assert script.is_file() and "./secured:/esqbe:ro" in setup["volumes"]
    if shutil.which("bash"):
        assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    text = script.read_text()
    if "elasticsearch" in node["image"]:
        assert env["xpack.security.enabled"] == "true"
        assert env["xpack.security.http.ssl.enabled"] == env["xpack.security.transport.ssl.enabled"] == "true"
        assert env["ELASTIC_PASSWORD"].startswith("${ESQBE_ES_PASSWORD:?")  # no default password
        for key in ("key", "certificate", "certificate_authorities"):
            assert env[f"xpack.security.http.ssl.{key}"] in ("certs/es01/es01.key", "certs/es01/es01.crt", "certs/ca/ca.crt")
        assert "elasticsearch-certutil ca" in text and "elasticsearch-certutil cert" in text and "name: es01" in text
        key_service = services["api-key"]
        assert key_service["depends_on"]["es01"]["condition"] == "service_healthy"
        key_script = (DOCKER / "secured" / "es-api-key.sh").read_text()
        assert '"cluster":[]' in key_script  # least privilege: no cluster privilege, so GET / answers 403
        for privilege in ("create_index", "view_index_metadata", "read", "write", "maintenance"):
            assert f'"{privilege}"' in key_script
    else:
        assert "DISABLE_SECURITY_PLUGIN" not in env and env["DISABLE_INSTALL_DEMO_CONFIG"] == "true"
        assert env["plugins.security.ssl.http.enabled"] == "true"
        assert env["plugins.security.nodes_dn"] == "CN=os01" and '-dname "CN=os01"' in text
        for layer in ("transport", "http"):
            assert env[f"plugins.security.ssl.{layer}.keystore_filepath"] == "esqbe-certs/node.p12"
            assert env[f"plugins.security.ssl.{layer}.truststore_filepath"] == "esqbe-certs/truststore.p12"
        assert "node.p12" in text and "truststore.p12" in text and "hash.sh" in text
        assert "certs:/usr/share/opensearch/config/esqbe-certs" in node["volumes"]
    assert node["healthcheck"]["test"][1].count("--cacert") == 1


# ------------------------------------------------------------------------------------------------
# the CLI end to end over HTTP with a least-privilege API key (what tests/test_engine_secured.py runs on a real
# secured cluster), against the engine-like server whose kNN answers are exact cosines


def exact_knn_hits(canned: CannedEngine):
    """kNN answers computed from the stored documents: per paper, the best cosine of the searched path's
    sentences, as the engines score it ((1 + cos) / 2), best first, `k` (or `size`) of them."""

    def answer(body):
        (field, vector), = vectors_in(body)
        path = field.split(".")[0]
        q = np.asarray(vector, dtype=np.float32)
        best = {}
        for pid, src in canned.sources.items():
            rows = [r["vector"] for r in src.get(path) or ()]
            if rows:
                best[pid] = float((np.asarray(rows, dtype=np.float32) @ q).max())
        spec = body["knn"] if "knn" in body else next(s for _, s in _os_knn_specs(body))
        flt = json.dumps(spec.get("filter") or {})
        ranked = sorted(((pid, c) for pid, c in best.items() if not spec.get("filter") or f'"{pid}"' in flt), key=lambda kv: -kv[1])
        return [(pid, (1 + c) / 2) for pid, c in ranked[: min(spec["k"], body["size"])]]

    return answer


@pytest.mark.parametrize("engine,version", [("elasticsearch", "8.19.5")])  # one engine: it loads the model (~10 s)
def test_cli_index_query_rescore_with_a_least_privilege_key_over_http(engine_server, tmp_path, engine, version):
    """The CLI path of the secured integration test, here against a server that demands the key on every
    request and refuses GET / (no monitor privilege); with kNN-only fusion the ranking must be the embedded
    backend's, scores included (exact kNN on both sides; the canned engine has no BM25, so BM25 is left out
    of the fusion and of the final score)."""
    from tests.test_engine_secured import _cli, index_query_rescore

    from .conftest import SAMPLE

    lines = SAMPLE.read_text(encoding="utf-8").splitlines()[:8]
    sample = tmp_path / "sample.jsonl"
    sample.write_text("\n".join(lines) + "\n", encoding="utf-8")
    ids = [json.loads(line)["paper_id"] for line in lines]
    key = base64.b64encode(b"least:privilege").decode()
    server, canned = engine_server(engine, version)
    canned.require_auth = f"ApiKey {key}"
    canned.forbidden = frozenset({"info", "_license", "_cat/plugins"})
    canned.knn_hits = exact_knn_hits(canned)
    result, stats = index_query_rescore(engine, server.url, ["--api-key", key], sample, ids, index="esqbe-it",
                                        query_args=("--fusion", "knn", "--bm25-weight", "0"))
    assert stats["papers"] == len(ids) and "version unknown" in stats["engine"]
    assert {r["headers"].get("authorization") for r in canned.requests} == {f"ApiKey {key}"}
    embedded = _cli("index", "--path", str(tmp_path / "embedded"), "--json", str(sample))
    assert embedded.exit_code == 0, embedded.output
    ref = _cli("query", "--path", str(tmp_path / "embedded"), "--paper", ids[0], "--facet", "method", "--rescorer", "summax",
               "-k", "5", "--json", "--fusion", "knn", "--bm25-weight", "0")
    want = json.loads(ref.output[ref.output.index("{"):])["hits"]
    assert [h["paper_id"] for h in result["hits"]] == [h["paper_id"] for h in want], ([(h["paper_id"], h["score"]) for h in result["hits"]], [(h["paper_id"], h["score"]) for h in want])
    # same ranking; scores agree to float16 precision (the embedded backend keeps float16 rows, the engine a float32 copy)
    assert [h["score"] for h in result["hits"]] == pytest.approx([h["score"] for h in want], abs=1e-3)


def test_vectors_fallback_with_unknown_version_asks_es_to_rehydrate(engine_server):
    """A least-privilege key on ES 9.2 (GET / refused, index created by 9.x: version known only as >= 9.0):
    the _mget answer lacks the vectors, so the search with exclude_vectors: false is tried."""
    key = "ApiKey bGVhc3Q6cHJpdmlsZWdl"
    server, canned = engine_server("elasticsearch", "9.2.0")
    canned.require_auth, canned.forbidden = key, frozenset({"info"})
    papers = make_papers(3)
    backend = _http_backend(server, "elasticsearch", api_key=key.split()[1])
    backend.ensure(META)
    backend.upsert(papers)
    del canned.sources["p1"]["vectors_b64"]
    fresh = _http_backend(server, "elasticsearch", api_key=key.split()[1])
    got = fresh.get(["p1"])
    assert not fresh.info().exact
    assert np.array_equal(got["p1"].vectors, papers[1].vectors)
