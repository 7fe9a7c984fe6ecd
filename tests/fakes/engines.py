"""Engine fakes for the contract tests (tests/test_engine_contract.py, tests/test_attach_contract.py). No engine
runs: the real backend code and the official clients (`elasticsearch`, `opensearch-py`) produce every request,
and only the lowest layer is replaced. `RecordingNode` (an elastic-transport node) and `RecordingConnection`
(an opensearch-py connection) record the bytes a client would put on the wire and answer with the canned
responses of `CannedEngine` (tests/fakes/wire.py); `EngineHTTPServer` serves the same canned engine on a
loopback socket. tests/fakes/specs.py checks every body sent against the engines' own API specifications,
tests/fakes/bodies.py reads bodies as the engines would, tests/fakes/watching.py adds the companion watch index.
These are fakes that check request bodies, NOT integration tests (those need a running engine:
tests/test_engine_integration.py, tests/test_attach_integration.py)."""
from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections import defaultdict
from urllib.parse import parse_qs, urlsplit

import numpy as np
import pytest

es_client = pytest.importorskip("elasticsearch")
os_client = pytest.importorskip("opensearchpy")

from esqbe.backends.engines.elasticsearch import (  # noqa: E402
    ElasticsearchBackend,
    compat_transport_class,
)
from esqbe.backends.engines.mapping import FACET_PATHS  # noqa: E402
from esqbe.backends.engines.opensearch import OpenSearchBackend  # noqa: E402
from esqbe.backends.engines.versions import parse_version  # noqa: E402
from esqbe.domain import FACET_LABELS, FirstStageRequest, IndexedPaper, IndexMeta, Paper  # noqa: E402

from .bodies import filter_source, is_bm25, lucene_clauses  # noqa: E402
from .wire import RecordingConnection, RecordingNode  # noqa: E402

VERSIONS = {"elasticsearch": ["8.11.4", "8.19.5", "9.2.0"], "opensearch": ["2.12.0", "2.19.3", "3.5.0"]}
ENGINE_VERSIONS = [(e, v) for e, vs in VERSIONS.items() for v in vs]
INDEX = "papers"
DIM = 8
META = IndexMeta("test-encoder", DIM, "contextual")


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
        # the companion alias index (`<index>-esqbe-aliases`, esqbe.backends.engines.aliasstore): its definition as
        # sent (or "auto-created" where a document was written before it, as the engines' auto_create_index does),
        # its documents, and those written since its last refresh (a search, so `_delete_by_query`, does not see them)
        self.alias_definition: dict | str | None = None
        self.alias_docs: dict[str, dict] = {}
        self.alias_unrefreshed: set[str] = set()

    @staticmethod
    def _is_alias(segs) -> bool:
        return bool(segs) and segs[0].endswith("-esqbe-aliases")

    def _alias_missing(self, name: str):
        return 404, {"error": {"root_cause": [{"type": "index_not_found_exception", "reason": f"no such index [{name}]"}],
                               "type": "index_not_found_exception", "reason": f"no such index [{name}]"}, "status": 404}

    def _alias_write(self, op: str, name: str, doc_id: str, doc: dict) -> dict:
        """One write to the alias index as the engines answer it: `create` of an existing id is a 409."""
        if self.alias_definition is None:
            self.alias_definition = "auto-created"
        if op == "create" and doc_id in self.alias_docs:
            reason = f"[{doc_id}]: version conflict, document already exists (current version [1])"
            return {"_index": name, "_id": doc_id, "status": 409,
                    "error": {"type": "version_conflict_engine_exception", "reason": reason}}
        existed = doc_id in self.alias_docs
        self.alias_docs[doc_id] = doc
        self.alias_unrefreshed.add(doc_id)
        return {"_index": name, "_id": doc_id, "status": 200 if existed else 201,
                "result": "updated" if existed else "created", "_version": 1}

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
        if self._is_alias(segs):
            if method == "PUT":
                if self.alias_definition is not None:
                    reason = f"index [{segs[0]}/canned] already exists"
                    return 400, {"error": {"type": "resource_already_exists_exception", "reason": reason}, "status": 400}
                self.alias_definition = record["lines"][0]
                return 200, {"acknowledged": True, "shards_acknowledged": True, "index": segs[0]}
            if method == "DELETE":
                self.alias_definition, self.alias_docs = None, {}
                return 200, {"acknowledged": True}
            return 405, {"error": "unexpected"}
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
        if self._is_alias(segs):
            if method in ("PUT", "POST"):
                item = self._alias_write(record["params"].get("op_type", "index"), segs[0], pid, record["lines"][0])
                return item["status"], item
            if self.alias_definition is None:
                return self._alias_missing(segs[0])
            if pid not in self.alias_docs:
                return 404, {"_index": segs[0], "_id": pid, "found": False}
            return 200, {"_index": segs[0], "_id": pid, "_version": 1, "found": True,
                         "_source": json.loads(json.dumps(self.alias_docs[pid]))}
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
        if self._is_alias(segs):
            if self.alias_definition is None:
                return self._alias_missing(segs[0])
            self.alias_unrefreshed.clear()
        return 200, {"_shards": {"total": 1, "successful": 1, "failed": 0}}

    def _license(self, method, segs, record):
        return 200, {"license": {"type": "basic", "status": "active"}}

    def _cat_plugins(self, method, segs, record):
        return 200, [{"name": "node", "component": "opensearch-knn", "version": self.version}]

    def _mget(self, method, segs, record):
        if self._is_alias(segs) and self.alias_definition is not None:
            docs = [{"_index": segs[0], "_id": i, "_version": 1, "found": True, "_source": dict(self.alias_docs[i])}
                    if i in self.alias_docs else {"_index": segs[0], "_id": i, "found": False}
                    for i in record["lines"][0]["ids"]]
            return 200, {"docs": docs}
        if self.mapping is None or self._is_alias(segs):
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
            if self._is_alias([meta.get("_index") or (segs[0] if segs[0] != "_bulk" else "")]):
                items.append({op: self._alias_write(op, meta["_index"], pid, doc)})
                continue
            if op == "delete":
                found = self.sources.pop(pid, None) is not None
                items.append({op: {"_index": INDEX, "_id": pid, "status": 200 if found else 404,
                                   "result": "deleted" if found else "not_found"}})
            elif op == "update":  # a partial document: objects merged, anything else replaced; `noop` if unchanged
                if pid not in self.sources:
                    items.append({op: {"_index": INDEX, "_id": pid, "status": 404,
                                       "error": {"type": "document_missing_exception", "reason": "document missing"}}})
                    continue
                merged = _merge_doc(self.sources[pid], doc["doc"])
                result = "noop" if merged == self.sources[pid] else "updated"
                self.sources[pid] = merged
                items.append({op: {"_index": INDEX, "_id": pid, "status": 200, "result": result, "_version": 2}})
            else:
                existed = pid in self.sources
                self.sources[pid] = doc
                items.append({op: {"_index": INDEX, "_id": pid, "status": 200 if existed else 201,
                                   "result": "updated" if existed else "created", "_version": 1}})
        return 200, {"took": 1, "errors": any("error" in next(iter(x.values())) for x in items), "items": items}

    def _delete_by_query(self, method, segs, record):
        """On the alias index only: `terms: {paper_id: [...]}` or `match_all`, over the documents a refresh has made
        searchable."""
        assert self._is_alias(segs), segs
        if self.alias_definition is None:
            return self._alias_missing(segs[0])
        query = record["lines"][0]["query"]
        ids = set(query["terms"]["paper_id"]) if "terms" in query else None  # else match_all
        gone = [i for i, doc in self.alias_docs.items()
                if (ids is None or doc.get("paper_id") in ids) and i not in self.alias_unrefreshed]
        for i in gone:
            del self.alias_docs[i]
        return 200, {"took": 1, "timed_out": False, "total": len(gone), "deleted": len(gone), "batches": 1,
                     "version_conflicts": 0, "noops": 0, "failures": []}

    max_clause_count = 1024  # OpenSearch indices.query.bool.max_clause_count default; ES 8+: at least this

    def _msearch(self, method, segs, record):
        answers = []
        for body in record["lines"][1::2]:
            ids = (body.get("query") or {}).get("ids", {}).get("values")
            if ids is not None and "rescore" in body:  # a query's window, a search per part (maxsim.window_body)
                status, answer = self._maxsim_window(body, ids)
                answers.append({**answer, "status": status} if status == 200 else answer)
                continue
            if lucene_clauses(body) > self.max_clause_count:
                reason = f"maxClauseCount is set to {self.max_clause_count}"
                answers.append({"error": {"root_cause": [{"type": "too_many_clauses", "reason": reason}],
                                          "type": "search_phase_execution_exception", "reason": "all shards failed",
                                          "caused_by": {"type": "too_many_clauses", "reason": reason}}, "status": 500})
                continue
            hits = self.bm25_hits(body) if is_bm25(body) else self.knn_hits(body)
            answers.append({"took": 1, "timed_out": False, "status": 200,
                              "hits": {"max_score": None, "hits": [{"_index": INDEX, "_id": pid, "_score": s} for pid, s in hits]}})
        return 200, {"took": 1, "responses": answers}

    def _search(self, method, segs, record):
        body = record["lines"][0] if record["lines"] else {}
        ids = (body.get("query") or {}).get("ids", {}).get("values")
        if ids is not None and "rescore" in body:  # a window rescored by MaxSim (esqbe.backends.engines.maxsim)
            return self._maxsim_window(body, ids)
        if ids is not None:  # documents by id, with source filtering (ES: exclude_vectors: false rehydrates vectors)
            spec = body.get("_source") if isinstance(body.get("_source"), dict) else {}
            omit = self.omit_source_vectors and spec.get("exclude_vectors") is not False
            hits = [{"_index": INDEX, "_id": pid, "_score": 1.0, "_source": filter_source(self.sources[pid], spec.get("includes"), set(), omit)}
                    for pid in ids if pid in self.sources]
            return 200, {"hits": {"max_score": 1.0, "hits": hits}}
        if body.get("sort") == [{"paper_id": {"order": "asc"}}]:  # papers by id, a page after `search_after`
            after = (body.get("search_after") or [""])[0]
            order = sorted(pid for pid in self.sources if pid > after)[: body["size"]]
            includes = (body.get("_source") or {}).get("includes")
            hits = [{"_index": INDEX, "_id": pid, "_score": None, "sort": [pid],
                     "_source": filter_source(self.sources[pid], includes, set(), self.omit_source_vectors)}
                    for pid in order]
            return 200, {"hits": {"hits": hits}}
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


    #: a test's hook on a window search's answer (hits -> hits): hostile answers
    window_answer = staticmethod(lambda hits: hits)

    def window_source(self, src: dict, includes, excludes: set) -> dict:
        """A window hit's `_source`, filtered (a subclass holding other documents filters them its own way)."""
        return filter_source(src, includes, excludes, self.omit_source_vectors)

    def _maxsim_window(self, body, ids):
        """A window search answered as the engine's documented MaxSim would: each asked document that is stored
        matches the `ids` query (score 1), the first `window_size` are rescored by the script, evaluated by the
        documented semantics (maxsim.emulate_es / emulate_os) over the multi-vector field the script names, as the
        documents the backend wrote hold it; the first-stage score is kept x query_weight (0) where the rescore
        query does not match (ES: `exists` on the field; OS: the script's own 0.0). A script that calls anything but
        the documented function, or whose params.n is not the query's vector count, is refused (400), as a real
        engine would refuse or miscompute it. Scores are float32, as the engines answer them."""
        from esqbe.backends.engines.maxsim import check_painless, emulate_es, emulate_os

        spec = body["rescore"]
        score_spec = spec["query"]["rescore_query"]["script_score"]
        script = score_spec["script"]
        problems = check_painless(self.engine, script["source"])
        field = re.findall(r"'([\w.]+_mv)'", script["source"])
        # an attached index keeps the fields in its `esqbe` object: named by path (ES), or that object of `_source`
        # given to the function (OS)
        within = re.findall(r"params\._source\['(\w+)'\]", script["source"])
        params = script["params"]
        if problems or len(set(field)) != 1 or params.get("n") != len(params.get("query_vectors") or ()):
            reason = "; ".join(problems) or "the script names no one field, or params.n is not the vector count"
            return 400, {"error": {"type": "script_exception", "reason": reason}, "status": 400}
        emulate = emulate_es if self.engine == "elasticsearch" else emulate_os
        weights = spec["query"].get("query_weight", 1.0), spec["query"].get("rescore_query_weight", 1.0)
        hits = []
        for rank, pid in enumerate(p for p in ids if p in self.sources):
            src = self.sources[pid]
            score = 1.0
            if rank < spec["window_size"]:
                stored = src
                for part in [*within[:1], *field[0].split(".")]:
                    stored = stored.get(part) if isinstance(stored, dict) else None
                if stored:
                    score = weights[0] * score + weights[1] * emulate(params["query_vectors"], stored)
                else:
                    score = weights[0] * score
            source = body.get("_source") if isinstance(body.get("_source"), dict) else {}
            hits.append({"_index": INDEX, "_id": pid, "_score": float(np.float32(score)),
                         "_source": self.window_source(src, source.get("includes"), set(source.get("excludes") or ()))})
        hits.sort(key=lambda h: -h["_score"])
        hits = self.window_answer(hits[: body.get("size", 10)])
        return 200, {"hits": {"total": {"value": len(hits), "relation": "eq"}, "max_score": None, "hits": hits}}


def _merge_doc(source: dict, doc: dict) -> dict:
    """An update's partial `doc` applied as the engines do: objects merged key by key, other values replaced."""
    out = dict(source)
    for key, value in doc.items():
        out[key] = _merge_doc(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def make_backend(engine: str, version: str, aliases: bool = False, canned: CannedEngine | None = None,
                 **client_options):
    """The real backend on a real client whose lowest layer is the canned engine (`canned`, or a new CannedEngine).
    `aliases`: keep the alias index (esqbe.backends.engines.aliasstore) as the product does; off unless asked, so that
    a test counting a paper write's requests counts the paper index's (tests/test_engine_aliases.py asks)."""
    canned = canned if canned is not None else CannedEngine(engine, version)
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
    if not aliases:
        backend.keeps_aliases = False
    return backend, canned


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
