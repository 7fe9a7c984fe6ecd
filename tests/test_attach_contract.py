"""Contract tests of `esqbe attach` (esqbe's fields added to an index the user owns), with no engine running.

The real attach code and the official clients produce every request; the canned engine (tests/fakes/engines.py,
extended here with partial updates, scrolls and mapping updates that behave like an engine's) records them.
Every body is validated against the engines' strict schemas: the mapping update (as the `mappings` of an
index definition: the same TypeMapping object), the scroll search, each bulk `update` action and its
payload, the filtered first-stage searches, the reindex path's new index. And the user's own fields are
checked to be untouched after attaching, re-attaching and detaching. NOT integration tests: those are in
test_attach_integration.py and need a running engine.
"""
from __future__ import annotations

import copy
import json

import pytest

from esqbe.backends.engines.attach import (
    ATTACHED_LAYOUT,
    NAMESPACE,
    AttachedMixin,
    maybe_attached,
    user_field_resolver,
)
from esqbe.core.filters import FilterError  # noqa: E402
from esqbe.errors import BackendError  # noqa: E402
from esqbe.index.api import Index  # noqa: E402
from esqbe.index.attach import run_attach
from esqbe.settings.config import Settings  # noqa: E402

from .fakes.bodies import is_bm25, mapping_fields, os_knn_specs
from .fakes.engines import INDEX, CannedEngine, make_backend
from .fakes.specs import assert_valid
from .test_filters import _engine_eval

ABSTRACTS = [
    ("Graph neural networks for molecules", "Molecules are graphs. We propose a message passing network. It improves accuracy by 5 points."),
    ("Parsing with transformers", "Parsing is hard. We fine-tune a transformer encoder on treebanks. Results improve on ten languages."),
    ("Protein folding at scale", "Proteins fold in 3D. We train a large attention model on structures. Accuracy reaches experimental level."),
    ("Sparse retrieval revisited", "Retrieval needs speed. We use learned sparse vectors with an inverted index. Latency drops by half."),
    ("Dialogue state tracking", "Dialogue systems track state. We cast tracking as reading comprehension. Joint accuracy improves."),
    ("Image captioning with attention", "Captions describe images. We attend over regions while decoding. BLEU improves on COCO."),
]

SHARDS = {"total": 1, "successful": 1, "skipped": 0, "failed": 0}
USER_MAPPING = {
    "dynamic": "strict",
    "_meta": {"owner": "library-team", "version": 3},
    "properties": {
        "doc_no": {"type": "keyword"},
        "title": {"type": "text", "fields": {"raw": {"type": "keyword"}}},
        "abstract": {"type": "text"},
        "year": {"type": "integer"},
        "lang": {"type": "keyword"},
        "tags": {"type": "keyword"},
        "notes": {"type": "text"},
        "stats": {"type": "object", "properties": {"views": {"type": "long"}}},
    },
}


def user_docs():
    docs = {}
    for i, (title, abstract) in enumerate(ABSTRACTS):
        docs[f"d{i}"] = {"doc_no": f"N-{100 + i}", "title": title, "abstract": abstract, "year": 2015 + i,
                         "lang": "en" if i % 3 else "de", "tags": ["ml", f"t{i % 2}"], "notes": f"kept {i}",
                         "stats": {"views": 10 * i}}
    return docs


def _merge(dst: dict, src: dict) -> dict:
    for k, v in src.items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict):
            _merge(dst[k], v)
        else:
            dst[k] = copy.deepcopy(v)
    return dst


def _flat(src: dict, prefix="") -> dict:
    out = {}
    for k, v in src.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v if isinstance(v, list) else [v]
    out.setdefault("_id", [])
    return out


class UserIndexEngine(CannedEngine):
    """A canned engine holding the user's index: mapping updates merge, bulk `update`s are partial,
    scrolls page through the documents, searches evaluate the filters they are sent."""

    def __init__(self, engine, version, knn_setting=True):
        super().__init__(engine, version)
        self.mapping = copy.deepcopy(USER_MAPPING)
        self.sources = user_docs()
        self.knn_setting = knn_setting
        self.created: dict[str, dict] = {}

    def _mapping(self, method, segs, record):
        if method == "PUT":
            body = record["lines"][0]
            if "_meta" in body:
                self.mapping["_meta"] = body["_meta"]  # engines replace _meta as a whole
            _merge(self.mapping.setdefault("properties", {}), body.get("properties", {}))
            return 200, {"acknowledged": True}
        return super()._mapping(method, segs, record)

    def _settings(self, method, segs, record):
        index = {"number_of_shards": "1", "analysis": {"analyzer": {"mine": {"type": "standard"}}}}
        if self.knn_setting and self.engine == "opensearch":
            index["knn"] = "true"
        return 200, {segs[0]: {"settings": {"index": index}}}

    def _index(self, method, segs, record):
        if segs[:2] == ["_search", "scroll"]:
            if method == "DELETE":
                return 200, {"succeeded": True, "num_freed": 1}
            return 200, {"_scroll_id": "s1", "_shards": SHARDS, "hits": {"total": {"value": len(self.sources), "relation": "eq"}, "hits": []}}
        if method == "PUT":
            self.created[segs[0]] = record["lines"][0]
            self.mapping = copy.deepcopy(record["lines"][0]["mappings"])  # later requests name the new index
            return 200, {"acknowledged": True, "shards_acknowledged": True, "index": segs[0]}
        return super()._index(method, segs, record)

    def _reindex(self, method, segs, record):
        return 200, {"took": 1, "total": len(self.sources), "created": len(self.sources), "failures": []}

    def _aliases(self, method, segs, record):
        return 200, {"acknowledged": True}

    def _mget(self, method, segs, record):
        includes = [x for x in (record["params"].get("_source_includes") or "").split(",") if x]
        excludes = [x for x in (record["params"].get("_source_excludes") or "").split(",") if x]
        docs = []
        for pid in record["lines"][0]["ids"]:
            if pid not in self.sources:
                docs.append({"_index": INDEX, "_id": pid, "found": False})
                continue
            docs.append({"_index": INDEX, "_id": pid, "found": True, "_source": _filter_source(self.sources[pid], includes, excludes)})
        return 200, {"docs": docs}

    def _bulk(self, method, segs, record):
        items, lines, i = [], record["lines"], 0
        while i < len(lines):
            (op, meta), = lines[i].items()
            payload = lines[i + 1] if op in ("index", "create", "update") else None
            i += 2 if payload is not None else 1
            pid = meta["_id"]
            if op != "update" or pid not in self.sources:
                items.append({op: {"_index": INDEX, "_id": pid, "status": 404 if op == "update" else 400,
                                   "error": {"type": "unexpected", "reason": f"attach must only send partial updates of existing docs ({op})"}}})
                continue
            if "doc" in payload:
                _merge(self.sources[pid], payload["doc"])
            elif payload.get("script", {}).get("source") == f"ctx._source.remove('{NAMESPACE}')":
                self.sources[pid].pop(NAMESPACE, None)
            items.append({op: {"_index": INDEX, "_id": pid, "status": 200, "result": "updated", "_version": 2}})
        return 200, {"took": 1, "errors": any("error" in next(iter(x.values())) for x in items), "items": items}

    def _search(self, method, segs, record):
        body = record["lines"][0] if record["lines"] else {}
        if "scroll" in record["params"]:
            hits = [{"_index": INDEX, "_id": pid, "_score": None, "_source": _filter_source(src, body["_source"]["includes"], [])}
                    for pid, src in self.sources.items()]
            return 200, {"_scroll_id": "s1", "_shards": SHARDS, "hits": {"total": {"value": len(hits), "relation": "eq"}, "hits": hits}}
        if "aggs" in body:
            aggs = {k: {"doc_count": sum(len(_get(src, v["nested"]["path"]) or ()) for src in self.sources.values())} for k, v in body["aggs"].items()}
            n = sum(1 for src in self.sources.values() if NAMESPACE in src)
            return 200, {"hits": {"total": {"value": n, "relation": "eq"}, "hits": []}, "aggregations": aggs}
        clauses = body["query"]["bool"].get("filter", [])
        ids = self.matching(clauses)
        return 200, {"hits": {"total": {"value": len(ids), "relation": "eq"},
                              "hits": [{"_index": INDEX, "_id": p, "_score": None, "_source": self.sources[p]} for p in ids[: body.get("size", 10)]]}}

    def matching(self, clauses) -> list[str]:
        out = []
        for pid, src in self.sources.items():
            doc = _flat(src)
            doc["_id"] = [pid]
            if all(_engine_eval(_ids_as_terms(c), doc) for c in clauses):
                out.append(pid)
        return sorted(out)


def _ids_as_terms(clause):
    return json.loads(json.dumps(clause))


def _get(src, path):
    node = src
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _filter_source(src: dict, includes: list[str], excludes: list[str]) -> dict:
    src = copy.deepcopy(src)
    if includes:
        flat_keep = {}
        for inc in includes:
            value = _get(src, inc)
            if value is not None:
                node = flat_keep
                parts = inc.split(".")
                for part in parts[:-1]:
                    node = node.setdefault(part, {})
                node[parts[-1]] = value
        src = flat_keep
    for exc in excludes:  # e.g. esqbe.method_sentences.vector: drop from every nested row
        parts = exc.split(".")
        rows = _get(src, ".".join(parts[:-1]))
        for row in rows or ():
            if isinstance(row, dict):
                row.pop(parts[-1], None)
    return src


def user_backend(engine, version, knn_setting=True):
    backend, _ = make_backend(engine, version)
    canned = UserIndexEngine(engine, version, knn_setting)
    # point the real client's lowest layer at the user-index engine
    if engine == "elasticsearch":
        for node in backend.client.transport.node_pool.all():
            type(node).canned = canned
    else:
        for conn in backend.client.transport.connection_pool.connections:
            type(conn).canned = canned
    return backend, canned


ATTACH_VERSIONS = [("elasticsearch", "8.11.4"), ("elasticsearch", "9.2.0"), ("opensearch", "2.12.0"), ("opensearch", "3.5.0")]


@pytest.fixture
def settings():
    return Settings(backend="elasticsearch", url="http://canned:9200", index=INDEX, facets="none", commit_every=4)


def attach(engine, version, encoder, settings, **kwargs):
    backend, canned = user_backend(engine, version, kwargs.pop("knn_setting", True))
    index = Index(backend, settings.replace(backend=engine), encoder=encoder)
    report = run_attach(index, "doc_no", ["title", "abstract"], facets="none", **kwargs)
    return index, canned, report


@pytest.mark.parametrize("engine,version", ATTACH_VERSIONS)
def test_attach_sends_valid_bodies_and_leaves_user_fields_untouched(engine, version, encoder, settings):
    before = copy.deepcopy(user_docs())
    index, canned, report = attach(engine, version, encoder, settings)
    assert (report.documents, report.indexed, report.errors) == (6, 6, [])

    # 1. the mapping update: a valid TypeMapping adding only `esqbe`, keeping the user's _meta keys
    (put,) = [r for r in canned.sent("_mapping") if r["method"] == "PUT"]
    assert put["path"] == f"/{INDEX}/_mapping"
    body = put["lines"][0]
    assert_valid(engine, "indices_create", {"mappings": body})
    assert set(body) == {"_meta", "properties"} and set(body["properties"]) == {NAMESPACE}
    assert body["_meta"]["owner"] == "library-team" and body["_meta"]["version"] == 3
    assert body["_meta"][NAMESPACE]["esqbe_layout"] == ATTACHED_LAYOUT
    assert body["_meta"][NAMESPACE]["model"] == encoder.name and body["_meta"][NAMESPACE]["dim"] == encoder.dim
    fields = mapping_fields(canned.mapping)
    dim_key = "dims" if engine == "elasticsearch" else "dimension"
    for facet in ("background", "method", "result", "other", "unlabeled"):
        assert fields[f"esqbe.{facet}_sentences"]["type"] == "nested"
        assert fields[f"esqbe.{facet}_sentences.vector"][dim_key] == encoder.dim

    # 2. the scroll over the documents asks only for what attaching needs
    (scroll,) = [r for r in canned.sent("_search") if "scroll" in r["params"]]
    assert_valid(engine, "search", scroll["lines"][0])
    assert scroll["lines"][0]["_source"]["includes"] == ["doc_no", "title", "abstract", "esqbe.source_hash"]

    # 3. every bulk line is a partial update holding `esqbe` only
    lines = [line for r in canned.sent("_bulk") for line in r["lines"]]
    actions, payloads = lines[0::2], lines[1::2]
    assert len(actions) == 6
    for action, payload in zip(actions, payloads):
        assert_valid(engine, "bulk_action", action)
        assert_valid(engine, "bulk_update_action_payload", payload)
        assert set(action) == {"update"} and set(payload) == {"doc"} and set(payload["doc"]) == {NAMESPACE}
        for key, _value in payload["doc"][NAMESPACE].items():
            assert f"esqbe.{key}" in fields, key  # the user's mapping may be strict: every field is mapped

    # 4. the user's fields survive, byte for byte
    for pid, src in canned.sources.items():
        assert {k: v for k, v in src.items() if k != NAMESPACE} == before[pid]
        assert src[NAMESPACE]["n_sentences"] == 3
    # 5. stats count the attached documents
    stats = index.stats()
    assert stats["papers"] == 6 and stats["layout"] == ATTACHED_LAYOUT and stats["text_fields"] == ["title", "abstract"]


@pytest.mark.parametrize("engine,version", [("elasticsearch", "8.19.5"), ("opensearch", "3.5.0")])
def test_reattach_changes_only_documents_whose_text_changed(engine, version, encoder, settings):
    index, canned, report = attach(engine, version, encoder, settings)
    bulks = len(canned.sent("_bulk"))
    again = run_attach(index, "doc_no", ["title", "abstract"], facets="none")
    assert (again.unchanged, again.indexed, again.replaced) == (6, 0, 0)
    assert len(canned.sent("_bulk")) == bulks  # nothing sent
    canned.sources["d2"]["abstract"] += " A new sentence."
    third = run_attach(index, "doc_no", ["title", "abstract"], facets="none")
    assert (third.unchanged, third.replaced) == (5, 1)
    assert canned.sources["d2"][NAMESPACE]["n_sentences"] == 4 and canned.sources["d2"]["notes"] == "kept 2"


@pytest.mark.parametrize("engine,version", ATTACH_VERSIONS)
def test_queries_on_an_attached_index(engine, version, encoder, settings):
    index, canned, _ = attach(engine, version, encoder, settings)
    backend = index.backend
    assert isinstance(backend, AttachedMixin)

    def knn_hits(body):
        spec = body["knn"] if "knn" in body else next(s for _, s in os_knn_specs(body))
        flt = spec.get("filter", [])
        flt = flt if isinstance(flt, list) else [flt]
        ids = canned.matching(flt)[: spec["k"]]
        return [(pid, 0.99 - 0.01 * n) for n, pid in enumerate(ids)]

    canned.knn_hits = knn_hits
    canned.bm25_hits = lambda body: [(p, 3.0) for p in canned.matching(body["query"]["bool"].get("filter", []))]
    backend.facet_vectors = True  # engine_facet_vectors: an attached index has no multi-vector fields to score with
    result = index.query("N-100", sentences=[1], k=10, rescorer="summax",  # the user's own id field works as --paper
                         filters=["year>=2017", "tags in (t0, t1)"], engine_filter={"term": {"lang": "en"}})
    assert result.rescoring["where"] == "python" and "attached" in result.rescoring["why"]
    got = {h.paper_id for h in result.hits}
    expected = {pid for pid, s in canned.sources.items() if s["year"] >= 2017 and s["lang"] == "en"} - {"d0"}
    assert got == expected
    for h in result.hits:
        assert h.metadata["lang"] == "en" and h.metadata["doc_no"].startswith("N-")  # the user's fields with the hit
        assert h.matches and h.matches[0].candidate_sentence
    # the first stage's _msearch (the one with kNN searches; the score's look-up of the query's best BM25 in the whole
    # index, unfiltered by design, comes after it)
    (sent,) = [r for r in canned.sent("_msearch") if any("knn" in json.dumps(b) for b in r["lines"][1::2])][-1:]
    old_os = engine == "opensearch" and version < "3.5"
    if old_os:  # resolved to the allowed ids first (OpenSearch < 3.5 runs only term/terms inside a nested kNN)
        resolve = [r for r in canned.sent("_search") if "scroll" not in r["params"] and "aggs" not in r["lines"][0]]
        body = resolve[-1]["lines"][0]
        assert_valid(engine, "search", body)
        assert '"lang": "en"' in json.dumps(body) and "meta_" not in json.dumps(body)
    for body in sent["lines"][1::2]:
        assert_valid(engine, "search", body)
        text = json.dumps(body)
        if old_os:
            assert sorted(expected) == sorted(next(c["terms"]["_id"] for c in body["query"]["bool"]["filter"] if "terms" in c)) \
                if is_bm25(body) else True
        else:
            assert '"lang": "en"' in text and '"year"' in text and '"tags"' in text  # user's own fields, no meta_*
        assert "meta_" not in text
        if not is_bm25(body):
            spec = body["knn"] if engine == "elasticsearch" else next(s for _, s in os_knn_specs(body))
            assert "filter" in spec  # pre-filter inside the kNN
            assert next(iter(spec)) if engine == "opensearch" else spec["field"].startswith("esqbe.")
        else:
            assert body["query"]["bool"]["must"][0]["multi_match"]["fields"] == ["title", "abstract"]


def test_filters_on_the_users_mapping_and_their_errors():
    resolve = user_field_resolver(INDEX, USER_MAPPING)
    assert resolve("year") == [("year", "num")]
    assert resolve("lang") == [("lang", "kw")]
    assert resolve("title") == [("title.raw", "kw")]  # a text field's keyword sub-field
    assert resolve("stats.views") == [("stats.views", "num")]
    with pytest.raises(FilterError, match="has no such field"):
        resolve("venue")
    with pytest.raises(FilterError, match="text field without a keyword sub-field"):
        resolve("notes")


def test_opensearch_index_without_knn_is_refused_with_the_way_out(encoder, settings):
    with pytest.raises(BackendError, match="index.knn: true.*--reindex-to"):
        attach("opensearch", "2.19.3", encoder, settings, knn_setting=False)


def test_reindex_to_a_knn_index(encoder, settings):
    index, canned, report = attach("opensearch", "2.19.3", encoder, settings, knn_setting=False, reindex_to="papers-esqbe")
    create = canned.created["papers-esqbe"]
    assert_valid("opensearch", "indices_create", create)
    assert create["settings"]["index"]["knn"] is True
    assert create["settings"]["index"]["analysis"] == {"analyzer": {"mine": {"type": "standard"}}}
    assert set(create["mappings"]["properties"]) == set(USER_MAPPING["properties"]) | {NAMESPACE}
    (reindex,) = canned.sent("_reindex")
    assert reindex["lines"][0] == {"source": {"index": INDEX}, "dest": {"index": "papers-esqbe"}}
    assert report.reindex == {"created": "papers-esqbe", "from": INDEX, "alias_moved": False}


def test_delete_removes_only_esqbes_fields(encoder, settings):
    index, canned, _ = attach("elasticsearch", "9.2.0", encoder, settings)
    assert index.delete(["d1", "nope"]) == 1
    lines = canned.sent("_bulk")[-1]["lines"]
    assert_valid("elasticsearch", "bulk_update_action_payload", lines[1])
    assert NAMESPACE not in canned.sources["d1"] and canned.sources["d1"]["notes"] == "kept 1"
    assert NAMESPACE in canned.sources["d2"]


def test_open_backend_recognises_an_attached_index(encoder, settings):
    index, canned, _ = attach("elasticsearch", "9.2.0", encoder, settings)
    plain, _ = make_backend("elasticsearch", "9.2.0")
    plain.client = index.backend.client
    plain._mapping = None
    assert isinstance(maybe_attached(plain), AttachedMixin)
    fresh, _ = make_backend("elasticsearch", "9.2.0")  # an esqbe-made (or absent) index stays as it is
    assert not isinstance(maybe_attached(fresh), AttachedMixin)
