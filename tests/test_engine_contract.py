"""Contract tests of the Elasticsearch and OpenSearch backends, with no engine running.

The real backend code and the real official clients (`elasticsearch`, `opensearch-py`) produce every
request; only the lowest layer is replaced, by the fakes in tests/fakes/engines.py: `RecordingNode`
(elastic-transport node) and `RecordingConnection` (opensearch-py connection) record the bytes the client
would put on the wire and answer with canned engine responses from `CannedEngine`. Nothing here searches
anything: these are NOT integration tests (those are in test_engine_integration.py and need a running engine).
The same fakes over a loopback socket are in test_engine_http.py; the compose files' checks in
test_compose_files.py.

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
import json
import re
import sys
from collections import defaultdict
from dataclasses import replace

import numpy as np
import pytest

pytest.importorskip("jsonschema")
es_client = pytest.importorskip("elasticsearch")
os_client = pytest.importorskip("opensearchpy")

from esqbe.backends.engines.documents import doc_to_paper, paper_to_doc  # noqa: E402
from esqbe.backends.engines.elasticsearch import (  # noqa: E402
    ElasticsearchBackend,
    compat_transport_class,
)
from esqbe.backends.engines.mapping import (  # noqa: E402
    FACET_PATHS,
    VECTOR_FIELDS,
    index_body,
    load_index_template,
)
from esqbe.backends.engines.maxsim import MV_FIELDS  # noqa: E402
from esqbe.backends.engines.opensearch import OpenSearchBackend  # noqa: E402
from esqbe.backends.engines.versions import (  # noqa: E402
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
from esqbe.errors import BackendError, ModelMismatchError  # noqa: E402

from .fakes.bodies import (  # noqa: E402
    features_in,
    is_bm25,
    lucene_clauses,
    mapping_fields,
    os_knn_specs,
    referenced_fields,
    vectors_in,
)
from .fakes.engines import (  # noqa: E402
    DIM,
    ENGINE_VERSIONS,
    INDEX,
    META,
    VERSIONS,
    CannedEngine,
    make_backend,
    make_papers,
    ready_backend,
    request_variants,
)
from .fakes.specs import assert_valid, schema_errors  # noqa: E402
from .fakes.wire import RecordingNode  # noqa: E402

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
    for _facet, path in FACET_PATHS.items():
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


@pytest.mark.parametrize("engine,version", ENGINE_VERSIONS)
def test_the_encoder_runtime_is_kept_in_the_mapping_meta_and_checked_on_writes(engine, version):
    # the runtime (torch-fp32, onnx-int8, ...) is part of the model identity in _meta, as in the
    # embedded index's meta; an index made before runtimes were recorded is taken as torch-fp32
    backend, canned = make_backend(engine, version)
    int8 = IndexMeta("test-encoder", DIM, "contextual", runtime="onnx-int8")
    backend.ensure(int8)
    (put,) = [r for r in canned.requests if r["method"] == "PUT"]
    assert_valid(engine, "indices_create", put["lines"][0])
    assert put["lines"][0]["mappings"]["_meta"]["runtime"] == "onnx-int8"
    assert backend.meta() == int8
    backend.ensure(replace(int8, runtime=None))  # a requested meta without a runtime (a query) is not checked for it
    with pytest.raises(ModelMismatchError, match="onnx-int8.*torch-fp32.*--encoder-backend onnx-int8"):
        backend.ensure(replace(int8, runtime="torch-fp32"))
    old, _ = ready_backend(engine, version)  # META has no runtime: an index from before
    assert old.meta().runtime is None and old.meta().effective_runtime == "torch-fp32"
    old.ensure(replace(META, runtime="torch-fp32"))
    with pytest.raises(ModelMismatchError, match="assumed"):
        old.ensure(replace(META, runtime="onnx-int8"))


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
        knn = [b for b in bodies if not is_bm25(b)]
        bm25 = [b for b in bodies if is_bm25(b)]
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
            spec = b["knn"] if engine == "elasticsearch" else next(s for _, s in os_knn_specs(b))
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
        for _name, request in request_variants():
            backend.first_stage(request)
        seen[version] = [_without_search_width(r["lines"]) for r in canned.sent("_msearch")]
    first, *rest = seen.values()
    assert all(r == first for r in rest)


def _without_search_width(lines):
    out = json.loads(json.dumps(lines))
    for body in out[1::2]:
        for _, spec in os_knn_specs(body):
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


@pytest.mark.parametrize("engine,version", ENGINE_VERSIONS)
def test_a_papers_sources_are_updated_in_place(engine, version):
    """A record of another file merged into a stored paper without changing it (esqbe.index.merge): its sources
    are sent as a bulk partial update, valid by the spec, that leaves the rest of the document as it was."""
    papers = make_papers(2)
    backend, canned = ready_backend(engine, version, papers)
    before = json.loads(json.dumps(canned.sources["p1"]))
    sources = [{"file": "a.bib", "format": "bibtex"}, {"file": "b.ris", "format": "ris"}]
    assert backend.update_sources({"p1": sources}) == 1
    assert backend.update_sources({"p1": sources}) == 0  # the engine's noop: nothing changed
    action, body = canned.sent("_bulk")[-1]["lines"]
    assert_valid(engine, "bulk_action", action)
    assert_valid(engine, "bulk_update_action_payload", body)
    assert action == {"update": {"_index": INDEX, "_id": "p1"}} and body == {"doc": {"metadata": {"sources": sources}}}
    after = canned.sources["p1"]
    assert after["metadata"] == {**before["metadata"], "sources": sources}
    assert {k: v for k, v in after.items() if k != "metadata"} == {k: v for k, v in before.items() if k != "metadata"}
    assert backend.get(["p1"])["p1"].paper.metadata["sources"] == sources


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
        ranked = sorted(best.items(), key=lambda kv: -kv[1])[: (body["knn"]["k"] if "knn" in body else next(s for _, s in os_knn_specs(body))["k"])]
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
    assert set(mget["params"]["_source_excludes"].split(",")) == {*VECTOR_FIELDS, *MV_FIELDS}


@pytest.mark.parametrize("engine", ["elasticsearch", "opensearch"])
def test_facet_filter_maps_objective_to_background_path(engine):
    backend, canned = ready_backend(engine, VERSIONS[engine][0], make_papers(2))
    backend.first_stage(FirstStageRequest(text="", vectors=np.ones((1, DIM), np.float32), facet="objective", with_papers=False))
    (sent,) = canned.sent("_msearch")
    assert {f.split(".")[0] for b in sent["lines"][1::2] for f, _ in vectors_in(b)} == {"background_sentences"}
    assert not any(is_bm25(b) for b in sent["lines"][1::2])  # no text: no BM25 search


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
# _mget on a missing index answers 200 with per-document index_not_found_exception


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
# a stable `preference` on _msearch (scores must not depend on which copy answers)


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
# BM25 within the clause limit (OpenSearch keeps max_clause_count at 1024)

WORDS = [f"w{i}x{chr(97 + i % 26)}{chr(97 + i // 26 % 26)}" for i in range(2000)]


def _bm25_of(canned) -> dict:
    (body,) = [b for b in canned.sent("_msearch")[-1]["lines"][1::2] if is_bm25(b)]
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
# OpenSearch score conversion from the mapping's engine and the cluster version

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
# OpenSearch gets the candidate factor (ef_search) where the version has it


@pytest.mark.parametrize("version,expected", [
    ("2.12.0", "k"), ("2.15.0", "k"), ("2.16.0", "ef_search"), ("2.19.3", "ef_search"), ("3.5.0", "ef_search"),
])
def test_opensearch_knn_searches_as_wide_as_elasticsearch(version, expected):
    backend, canned = ready_backend("opensearch", version, make_papers(3))
    backend.first_stage(FirstStageRequest(text="", vectors=np.ones((1, DIM), np.float32), knn_k=10, with_papers=False))
    for body in canned.sent("_msearch")[-1]["lines"][1::2]:
        assert_valid("opensearch", "search", body)
        (_, spec), = os_knn_specs(body)
        assert body["size"] == 10
        if expected == "ef_search":
            assert spec["method_parameters"] == {"ef_search": 100} and spec["k"] == 10
        else:
            assert spec["k"] == 100 and "method_parameters" not in spec  # 2.12-2.15 reject method_parameters


# ------------------------------------------------------------------------------------------------
# documents without vectors_b64 (written by another tool) fall back to the indexed vectors


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
    assert set(first["params"]["_source_excludes"].split(",")) == {*VECTOR_FIELDS, *MV_FIELDS}  # the usual fetch stays lean
    if engine == "elasticsearch" and parse_version(version) >= (8, 19, 0):
        (search,) = [r for r in canned.sent("_search") if "ids" in r["lines"][0].get("query", {})]
        assert_valid(engine, "search", search["lines"][0])
        assert search["lines"][0]["query"]["ids"]["values"] == ["p1", "p3"]
        assert search["lines"][0]["_source"]["exclude_vectors"] is False
    else:
        again = canned.sent("_mget")[-1]
        assert again["lines"][0] == {"ids": ["p1", "p3"]} and "vector" in again["params"]["_source_includes"]


# ------------------------------------------------------------------------------------------------
# the long-token rule of the engines' analyzer (documented divergence from tantivy)


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


@pytest.mark.parametrize("engine,version", [ENGINE_VERSIONS[0], ENGINE_VERSIONS[-1]])
def test_a_query_of_several_examples_is_one_msearch_over_their_sentences(engine, version):
    """ the examples' sentences together go to the engine in one _msearch (a kNN search per sentence,
    one BM25 search), every example and avoided paper excluded; the bodies pass the spec as any other."""
    from esqbe.index.api import Index
    from esqbe.settings.config import Settings

    papers = make_papers()
    backend, canned = ready_backend(engine, version, papers)
    before = len(canned.sent("_msearch"))
    result = Index(backend, Settings()).query(examples=["p0", "p1"], avoid=["p2"], facet="method", k=3)
    (sent,) = canned.sent("_msearch")[before:]
    bodies = sent["lines"][1::2]
    for body in bodies:
        assert_valid(engine, "search", body)
    union = sum(1 for p in papers[:2] for f in p.paper.facets if f == "method")
    assert len([b for b in bodies if not is_bm25(b)]) == union == sum(len(e.indices) for e in result.examples)
    (bm25,) = [b for b in bodies if is_bm25(b)]
    assert {"p0", "p1", "p2"} <= set(re.findall(r"p\d", json.dumps(bm25["query"]["bool"]["must_not"])))
    assert not {"p0", "p1", "p2"} & {h.paper_id for h in result.hits}
