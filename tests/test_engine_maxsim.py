"""Summax in the engine, the request side (esqbe.backends.engines.maxsim): per-facet multi-vector fields and the
engine's own MaxSim rescoring. Contract tests: the mapping and search bodies against the engines' official
specifications (tests/specs, strict), the Painless sources against the documented function signatures, and a
Python emulation of the documented MaxSim semantics that must reproduce esqbe's summax on a real embedded index.
The live tests need a running cluster (ESQBE_ES_URL / ESQBE_OS_URL) and skip here, saying so. No test here is an
integration test but those."""
from __future__ import annotations

import json
import os
import re
import uuid

import numpy as np
import pytest

import esqbe
from esqbe.backends.engines.maxsim import (
    check_painless,
    check_version,
    doc_fields,
    emulate_es,
    emulate_os,
    es_source,
    mapping_properties,
    mv_field,
    os_source,
    rescore_body,
    summax_from_score,
    unit,
)
from esqbe.domain import IndexedPaper, Paper
from esqbe.errors import BackendError
from esqbe.rescore.batches import CandidateBatch, QueryBatch, RescoreContext
from esqbe.rescore.rescorers import rescore_summax

from .fakes.specs import schema_errors

ENGINES = ("elasticsearch", "opensearch")
FACETS = ("background", "method", "result", None)


def _facet_view(ip: IndexedPaper, facet: str | None) -> tuple[list[int], np.ndarray]:
    """The paper's sentences of `facet` and their vectors as an engine index holds them: unit float32 (the
    embedded index keeps float16 copies, renormalised here)."""
    idx = [i for i, f in enumerate(ip.paper.facets) if facet is None or f == facet]
    return idx, unit(ip.vectors[idx])


@pytest.fixture(scope="module")
def papers(index_dir_30, encoder):
    with esqbe.open_index(str(index_dir_30), encoder=encoder, config=None, create=False) as index:
        return list(index.backend.get([p.paper.paper_id for p in index.iter_papers()]).values())


@pytest.mark.parametrize("engine", ENGINES)
def test_the_mapping_and_the_search_are_valid_for_the_official_specs(engine):
    from esqbe.backends.engines.mapping import index_body
    from esqbe.domain import IndexMeta

    body = index_body(engine, IndexMeta("m", 8, "contextual"))
    body["mappings"]["properties"].update(mapping_properties(engine, 8))
    assert not schema_errors(engine, "indices_create", body)
    q = np.eye(8, dtype=np.float32)[:3]
    for facet in FACETS:
        search = {"size": 10, "query": {"match": {"title": "graph neural networks"}},
                  "rescore": rescore_body(engine, facet, q, 100), "_source": ["paper_id"]}
        assert not schema_errors(engine, "search", search), facet
    bad = rescore_body(engine, "method", q, 100)
    bad["query"]["rescore_query_wieght"] = 1.0  # the strict cut catches a misspelt key
    assert schema_errors(engine, "search", {"rescore": bad})
    if engine == "elasticsearch":  # rank_vectors is a float field of the index's dims
        prop = mapping_properties(engine, 8)[mv_field("method")]
        assert prop == {"type": "rank_vectors", "dims": 8, "element_type": "float"}
        assert schema_errors(engine, "mapping_property", {**prop, "element_type": "half"})


@pytest.mark.parametrize("engine", ENGINES)
def test_the_painless_sources_call_the_documented_functions_as_documented(engine):
    source = es_source if engine == "elasticsearch" else os_source
    for facet in FACETS:
        assert check_painless(engine, source(mv_field(facet))) == []
    good = source("method_mv")
    for wrong in (good.replace("maxSimDotProduct", "maxSimCosine").replace("lateInteractionScore", "lateInteraction"),
                  good.replace("params.query_vectors, ", ""),
                  good.replace("'cosinesimil'", "'cosine'"),
                  good.replace("params.query_vectors", "params.query_vector")):
        if wrong != good:
            assert check_painless(engine, wrong), wrong
    # the script names the field as a literal: the documented form
    assert "'method_mv'" in rescore_body(engine, "method", np.eye(4)[:1], 10)["query"]["rescore_query"][
        "script_score"]["script"]["source"]


@pytest.mark.parametrize("facet", FACETS)
def test_the_emulated_engine_maxsim_reproduces_esqbes_summax_on_a_real_index(papers, facet):
    """For a query paper of the real index and every other paper: the engines' documented MaxSim over the fields
    esqbe would write (doc_fields), through the installed scripts' (1 + summax) / 2, turned back, equals esqbe's
    summax rescorer on the same sentences to float tolerance, and ranks the candidates the same way."""
    with_facet = [p for p in papers if _facet_view(p, facet)[0]]
    query, cands = with_facet[0], with_facet[1:]
    qidx, qv = _facet_view(query, facet)
    views = []
    for p in cands:
        idx, vec = _facet_view(p, facet)
        views.append(IndexedPaper(Paper(p.paper.paper_id, "", [p.paper.sentences[i] for i in idx],
                                        [p.paper.facets[i] for i in idx]), vec))
    esqbe_scores = rescore_summax(RescoreContext())(QueryBatch(qv, [query.paper.sentences[i] for i in qidx]),
                                                    CandidateBatch.from_papers(views)).scores
    assert len(cands) >= 5
    for emulate in (emulate_es, emulate_os):
        got = []
        for p in cands:
            stored = doc_fields(p.paper.facets, p.vectors)[mv_field(facet)]  # what the engine holds
            got.append(summax_from_score(emulate(qv.tolist(), stored)))
        np.testing.assert_allclose(got, esqbe_scores, atol=2e-6)
        assert list(np.argsort(-np.array(got), kind="stable")) == list(np.argsort(-esqbe_scores, kind="stable"))


def test_a_paper_without_the_facet_has_no_field():
    fields = doc_fields(["background", "method"], np.eye(4, dtype=np.float32)[:2])
    assert set(fields) == {"background_mv", "method_mv", "all_mv"} and fields["method_mv"] == [[0, 1, 0, 0]]


@pytest.mark.parametrize("engine,old,new", [("elasticsearch", "8.17.2", "8.18.0"), ("elasticsearch", "8.17.2", "9.0.0"),
                                            ("opensearch", "3.2.0", "3.3.0")])
def test_the_versions_that_have_each_function(engine, old, new):
    with pytest.raises(BackendError, match=r"needs .* (8\.18\.0|3\.3\.0) or later"):
        check_version(engine, old)
    check_version(engine, new)


# --- live: a running cluster -----------------------------------------------------------------------------------
LIVE = {"elasticsearch": "ESQBE_ES_URL", "opensearch": "ESQBE_OS_URL"}


@pytest.mark.integration
@pytest.mark.parametrize("engine", ENGINES)
def test_live_the_cluster_ranks_by_summax(engine, papers):
    url = os.environ.get(LIVE[engine])
    if not url:
        pytest.skip(f"no {engine} to run against: set {LIVE[engine]} to a running cluster's URL "
                    f"({engine} {'8.18+ with a trial licence' if engine == 'elasticsearch' else '3.3+'})")
    if engine == "elasticsearch":
        from elasticsearch import Elasticsearch as Client
    else:
        from opensearchpy import OpenSearch as Client
    client = Client(url)
    check_version(engine, client.info()["version"]["number"])
    name = f"esqbe-maxsim-{uuid.uuid4().hex[:8]}"
    dim = papers[0].vectors.shape[1]
    client.indices.create(index=name, body={"mappings": {"properties": {"paper_id": {"type": "keyword"},
                                                                        **mapping_properties(engine, dim)}}})
    try:
        for p in papers:
            client.index(index=name, id=p.paper.paper_id,
                         body={"paper_id": p.paper.paper_id, **doc_fields(p.paper.facets, p.vectors)})
        client.indices.refresh(index=name)
        query = papers[0]
        _, qv = _facet_view(query, "method")
        body = {"size": len(papers), "query": {"match_all": {}}, "rescore": rescore_body(engine, "method", qv, 100)}
        hits = client.search(index=name, body=body)["hits"]["hits"]
        got = {h["_id"]: summax_from_score(h["_score"]) for h in hits}
        for p in papers[1:]:
            idx, vec = _facet_view(p, "method")
            if idx:
                want = float((qv @ vec.T).max(axis=1).mean())
                assert got[p.paper.paper_id] == pytest.approx(want, abs=1e-5)
    finally:
        client.indices.delete(index=name)


@pytest.mark.integration
@pytest.mark.parametrize("engine", ENGINES)
def test_live_a_query_with_the_setting_is_ranked_by_the_cluster(engine, papers, index_dir_30, encoder):
    """`Index.query` on a real cluster with engine_facet_vectors: the window scored by the cluster's own MaxSim
    equals, in ranking and scores, the same query rescored in Python (the setting off) on the same first stage."""
    url = os.environ.get(LIVE[engine])
    if not url:
        pytest.skip(f"no {engine} to run against: set {LIVE[engine]} to a running cluster's URL "
                    f"({engine} {'8.18+ with a trial licence' if engine == 'elasticsearch' else '3.3+'})")
    from esqbe.index.api import Index
    from esqbe.index.open import open_backend
    from esqbe.settings.config import load_settings

    with esqbe.open_index(str(index_dir_30), encoder=encoder, config=None, create=False) as embedded:
        meta = embedded.backend.meta()
    settings = load_settings(None).replace(backend=engine, url=url, index=f"esqbe-maxsim-q-{uuid.uuid4().hex[:8]}",
                                           engine_facet_vectors=True)
    backend = open_backend(settings, create=True)
    try:
        backend.ensure(meta)
        backend.upsert([IndexedPaper(p.paper, unit(p.vectors)) for p in papers])
        index = Index(backend, settings)
        query = next(p for p in papers if "method" in p.paper.facets).paper.paper_id
        assert_ranked_in_the_cluster_as_in_python(index, query)
    finally:
        backend.client.indices.delete(index=settings.index)
        backend.close()


# --- the setting: an engine index esqbe creates carries the fields ---------------------------------------------------
@pytest.mark.parametrize("engine,version", [("elasticsearch", "9.2.0"), ("opensearch", "3.5.0")])
def test_the_setting_writes_the_fields_into_the_mapping_and_every_paper(engine, version):
    from esqbe.index.open import open_backend
    from esqbe.settings.config import load_settings

    from .fakes.engines import META, CannedEngine, make_papers
    from .fakes.wire import EngineHTTPServer

    server = EngineHTTPServer(CannedEngine(engine, version))
    try:
        settings = load_settings(None).replace(backend=engine, url=server.url, index="papers",
                                               engine_facet_vectors=True)
        backend = open_backend(settings, create=True)
        backend.ensure(META)
        papers = make_papers()
        backend.upsert(papers)
        backend.close()
        create = next(r for r in server.canned.requests if r["method"] == "PUT" and r["path"] == "/papers")
        body = create["lines"][0]
        assert set(mapping_properties(engine, META.dim)) <= set(body["mappings"]["properties"])
        assert not schema_errors(engine, "indices_create", body)
        docs = [x for r in server.canned.requests if r["endpoint"] == "_bulk" for x in r["lines"]
                if "content_hash" in x]  # papers, not the alias index's keys
        assert len(docs) == len(papers)
        for ip, doc in zip(papers, docs):
            np.testing.assert_allclose(np.array(doc["all_mv"]), unit(ip.vectors), atol=1e-6)
            for facet in ("background", "method", "result"):
                n = sum(1 for f in ip.paper.facets if f == facet)
                assert len(doc.get(mv_field(facet), [])) == n
    finally:
        server.close()


@pytest.mark.parametrize("engine,version", [("elasticsearch", "8.11.4"), ("opensearch", "2.19.3")])
def test_the_setting_on_a_cluster_without_the_function_is_refused_naming_the_version(engine, version):
    from esqbe.index.open import open_backend
    from esqbe.settings.config import load_settings

    from .fakes.engines import META, CannedEngine
    from .fakes.wire import EngineHTTPServer

    server = EngineHTTPServer(CannedEngine(engine, version))
    try:
        settings = load_settings(None).replace(backend=engine, url=server.url, index="papers",
                                               engine_facet_vectors=True)
        backend = open_backend(settings, create=True)
        with pytest.raises(BackendError, match=rf"{engine} {re.escape(version)} cannot rank by aspect.*needs"):
            backend.ensure(META)
        assert not [r for r in server.canned.requests if r["method"] == "PUT"]  # nothing created
    finally:
        server.close()


# --- the query path: summax scored in the engine ------------------------------------------------
# `Index.query` on an engine backend (the canned engine: a mocked client that records what is sent and answers the
# window search by running the documented MaxSim emulation over the documents it stores) against the same query
# with the setting off, which rescores in Python on the candidates' fetched vectors: the same first stage, so the same
# candidates; the hits must agree in ranking, scores and matched sentences.
EDGE = [("elasticsearch", "9.2.0"), ("opensearch", "3.5.0")]


@pytest.fixture(scope="module")
def real_meta(index_dir_30, encoder):
    with esqbe.open_index(str(index_dir_30), encoder=encoder, config=None, create=False) as index:
        return index.backend.meta()


def _engine_index(engine, version, papers, meta, **settings):
    """An esqbe index on the canned engine holding `papers` (unit float32 vectors, as the encoder writes them) with
    the multi-vector fields, its first stage answered from the stored documents: BM25 by the words a document's
    title and abstract share with the query text, kNN by the exact best cosine of the path's sentences."""
    from esqbe.index.api import Index
    from esqbe.settings.config import Settings

    from .fakes.bodies import os_knn_specs, vectors_in
    from .fakes.engines import make_backend

    backend, canned = make_backend(engine, version)
    backend.facet_vectors = True
    backend.ensure(meta)
    backend.upsert(papers)

    def knn_hits(body):
        (field, vector), = vectors_in(body)
        path = field.split(".")[0]
        k = body["knn"]["k"] if "knn" in body else next(s for _, s in os_knn_specs(body))["k"]
        q = np.asarray(vector, np.float32)
        best = {pid: max(float(np.dot(np.asarray(r["vector"], np.float32), q)) for r in src[path])
                for pid, src in canned.sources.items() if src.get(path)}
        return [(pid, (1 + c) / 2) for pid, c in sorted(best.items(), key=lambda kv: (-kv[1], kv[0]))[:k]]

    def bm25_hits(body):
        words = set(re.findall(r"\w+", json.dumps(body["query"]).lower()))
        found = {pid: len(words & set(re.findall(r"\w+", f"{s['title']} {s['abstract']}".lower())))
                 for pid, s in canned.sources.items()}
        return sorted(((p, float(n)) for p, n in found.items() if n), key=lambda kv: (-kv[1], kv[0]))[: body["size"]]

    canned.knn_hits, canned.bm25_hits = knn_hits, bm25_hits
    return Index(backend, Settings().replace(**settings)), canned


@pytest.fixture(scope="module")
def unit_papers(papers):
    return [IndexedPaper(p.paper, unit(p.vectors)) for p in papers]


def _both(index, **query):
    """The query with the setting on (in the engine) and off (in Python), on the same index and first stage."""
    index.backend.facet_vectors = True
    engine = index.query(place_hits=False, **query)
    index.backend.facet_vectors = False
    python = index.query(place_hits=False, **query)
    index.backend.facet_vectors = True
    return engine, python


def assert_ranked_in_the_cluster_as_in_python(index, paper_id: str) -> None:
    """A live cluster's check: the paper's method query scored in the engine ranks and scores as Python does."""
    in_cluster, in_python = _both(index, paper_id=paper_id, facet="method", k=10)
    assert in_cluster.rescoring["where"] == "backend" and in_python.rescoring["where"] == "python"
    _same_hits(in_cluster, in_python)


def _same_hits(engine, python):
    assert [h.paper_id for h in engine.hits] == [h.paper_id for h in python.hits]
    for a, b in zip(engine.hits, python.hits):
        assert a.score == pytest.approx(b.score, abs=1e-5), a.paper_id
        assert (a.similarity is None) == (b.similarity is None)
        if a.similarity is not None:
            assert a.similarity == pytest.approx(b.similarity, abs=1e-5)
        assert [x for x in a.example_similarities if x is None] == [x for x in b.example_similarities if x is None]
        np.testing.assert_allclose([x for x in a.example_similarities if x is not None],
                                   [x for x in b.example_similarities if x is not None], atol=1e-5)
        assert [(m.example, m.query_index, m.candidate_index) for m in a.matches] == \
               [(m.example, m.query_index, m.candidate_index) for m in b.matches]
        assert [(v.avoid_index, v.candidate_index) for v in a.avoided] == [(v.avoid_index, v.candidate_index)
                                                                            for v in b.avoided]


def _window_bodies(request) -> list[dict]:
    """The window searches (an `ids` query rescored by MaxSim) in one `_msearch` request."""
    return [b for b in request["lines"][1::2] if "rescore" in b and "ids" in (b.get("query") or {})]


def _lookup_bodies(request) -> list[dict]:
    """The BM25 look-ups riding in a window's `_msearch` (esqbe.query.combine.bm25_lookups)."""
    return [b for b in request["lines"][1::2] if b not in _window_bodies(request)]


def _window_requests(requests) -> list[dict]:
    """The requests that scored a query's window in the engine: `_msearch`es holding window searches."""
    return [r for r in requests if r["endpoint"] == "_msearch" and _window_bodies(r)]


@pytest.mark.parametrize("engine,version", EDGE)
@pytest.mark.parametrize("facet", ["method", "background", None])
def test_a_query_is_scored_in_the_engine_as_python_scores_it(engine, version, facet, unit_papers, real_meta):
    """One window search over exactly the first stage's ids, valid for the strict spec, no vector coming back,
    and only the shown hits' vectors fetched; the hits equal the Python path's to float tolerance."""
    from .fakes.specs import assert_valid

    index, canned = _engine_index(engine, version, unit_papers, real_meta)
    query = next(p for p in unit_papers if facet is None or facet in p.paper.facets).paper_id
    before = len(canned.requests)
    engine_result = index.query(query, facet=facet, k=5, place_hits=False)
    sent = canned.requests[before:]
    (window,) = _window_requests(sent)
    (body,) = _window_bodies(window)
    # the query paper and the shown hits fetched (`_mget`); the first stage one `_msearch`, the window's MaxSim and
    # the BM25 look-ups of the score (here the index-wide reference alone) another; no search of its own per part
    assert [r["endpoint"] for r in sent if r["endpoint"] != "_mapping"] == ["_mget", "_msearch", "_msearch", "_mget"]
    (reference,) = _lookup_bodies(window)
    assert reference["size"] == 1 and "filter" not in reference["query"]["bool"]  # nothing restricted
    assert_valid(engine, "search", body)
    assert check_painless(engine, body["rescore"]["query"]["rescore_query"]["script_score"]["script"]["source"]) == []
    assert mv_field(facet) in json.dumps(body["rescore"])
    # exactly the fused window: what the first stage gives the rescorer without the setting
    index.backend.facet_vectors = False
    before_python = len(canned.requests)
    python_result = index.query(query, facet=facet, k=5, place_hits=False)
    fetched = {pid for r in canned.requests[before_python:] if r["endpoint"] == "_mget" for pid in r["lines"][0]["ids"]}
    assert set(body["query"]["ids"]["values"]) == fetched - {query}
    assert len(fetched - {query}) > 5
    # nothing of a vector in the window's answer; only the hits' papers fetched whole
    excluded = set(body["_source"]["excludes"])
    assert {"vectors_b64", *mapping_properties(engine, real_meta.dim)} <= excluded
    assert not {f for f in body["_source"]["includes"] if f.endswith(("vector", "_mv", "text", "b64"))}
    got = {pid for r in sent if r["endpoint"] == "_mget" for pid in r["lines"][0]["ids"]}
    assert got - {query} == {h.paper_id for h in engine_result.hits}
    assert engine_result.rescoring["where"] == "backend" and engine_result.rescoring["in_python"] == 0
    assert python_result.rescoring["where"] == "python" and "engine_facet_vectors is off" in python_result.rescoring["why"]
    _same_hits(engine_result, python_result)
    assert engine_result.to_dict()["rescoring"]["in_backend"] == len(body["query"]["ids"]["values"])


@pytest.mark.parametrize("engine,version", EDGE)
def test_the_bm25_look_ups_ride_in_the_window_request(engine, version, unit_papers, real_meta):
    """With a first stage whose BM25 reaches only its 3 best (k no more than that, or the list would reach k), the candidates the kNN alone brought get their BM25 by a
    look-up restricted to their ids: it and the index-wide reference go in the window's `_msearch` (each with the
    shard-copy preference `first_stage` would give it), and the hits equal the Python path's, whose look-ups are
    first stages of their own."""
    from .fakes.bodies import is_bm25

    index, canned = _engine_index(engine, version, unit_papers, real_meta, bm25_k=3)
    query = unit_papers[0].paper_id
    before = len(canned.requests)
    engine_result, python_result = _both(index, paper_id=query, facet="method", k=3)  # k past bm25_k would raise it
    sent = [r for r in canned.requests[before:] if r["endpoint"] != "_mapping"]
    (window,) = _window_requests(sent)
    reference, restricted = _lookup_bodies(window)
    assert is_bm25(reference) and is_bm25(restricted) and reference["size"] == 1
    unscored = set(restricted["query"]["bool"]["filter"][0]["terms"]["paper_id"])
    window_ids = set(_window_bodies(window)[0]["query"]["ids"]["values"])
    assert unscored and unscored < window_ids and len(window_ids - unscored) <= 3
    headers = window["lines"][0::2]
    assert all("preference" not in h for h in headers[:1]) and all(h["preference"].startswith("esqbe-")
                                                                    for h in headers[1:])
    python_sent = [r for r in canned.requests if r["endpoint"] == "_msearch"][-2:]  # the Python path's own look-ups
    assert [b for r in python_sent for b in r["lines"][1::2]] == [reference, restricted]
    assert [r["lines"][0] for r in python_sent] == headers[1:]
    assert any(h.bm25 > 0 and h.paper_id in unscored for h in engine_result.hits)
    _same_hits(engine_result, python_result)


@pytest.mark.parametrize("engine,version", EDGE)
def test_several_examples_and_a_paper_to_avoid_are_scored_in_the_engine(engine, version, unit_papers, real_meta):
    index, canned = _engine_index(engine, version, unit_papers, real_meta, example_aggregate="max",
                                   avoid_rule="rocchio")
    with_method = [p.paper_id for p in unit_papers if "method" in p.paper.facets]
    before = len(canned.requests)
    engine_result, python_result = _both(index, examples=with_method[:2], avoid=with_method[2:3], facet="method", k=6)
    (window,) = _window_requests(canned.requests[before:])  # one request, with the setting on only ...
    assert len(_window_bodies(window)) == 3  # ... holding a search per example and per avoided paper
    assert all(h.avoided and h.avoided[0].penalty != 0 for h in python_result.hits)
    _same_hits(engine_result, python_result)


@pytest.mark.parametrize("engine,version", EDGE)
def test_papers_the_engine_cannot_score_as_python_does_are_scored_in_python(engine, version, unit_papers, real_meta):
    """candidate_facet auto: a paper whose labels the tagger predicted is matched over every sentence with a penalty,
    which the engine's MaxSim cannot do; a paper written before the fields has none. Both are scored in Python, the
    rest in the engine, and the hits still equal the Python path's."""
    soft = [IndexedPaper(Paper(p.paper.paper_id, p.paper.title, p.paper.sentences, p.paper.facets,
                               {**p.paper.metadata, "facets_predicted": True,
                                "facet_probs": [[0.1, 0.6, 0.2, 0.1] if f == "method" else [0.4, 0.3, 0.2, 0.1]
                                                for f in p.paper.facets]}), p.vectors)
            if i % 3 == 1 else p for i, p in enumerate(unit_papers)]
    index, canned = _engine_index(engine, version, soft, real_meta)
    stale = [p.paper_id for i, p in enumerate(soft) if i % 3 == 2]
    for pid in stale:  # as `esqbe index` wrote them before the setting
        for field in mapping_properties(engine, real_meta.dim):
            canned.sources[pid].pop(field, None)
    query = next(p for p in soft[3:] if "method" in p.paper.facets and "facet_probs" not in p.paper.metadata)
    before = len(canned.requests)
    engine_result, python_result = _both(index, paper_id=query.paper_id, facet="method", k=8)
    (window,) = _window_requests(canned.requests[before:])
    (body,) = _window_bodies(window)
    ids = set(body["query"]["ids"]["values"])
    by_id = {p.paper_id: p for p in soft}
    predicted = {pid for pid in ids if "facet_probs" in by_id[pid].paper.metadata}
    unscored = {pid for pid in ids & set(stale) if "method" in by_id[pid].paper.facets}
    note = engine_result.rescoring
    assert predicted and unscored and note["in_python"] == len(predicted | unscored)
    assert note["where"] == "backend" and note["in_backend"] == len(ids) - note["in_python"] > 0
    assert "predicted" in note["why"]
    _same_hits(engine_result, python_result)


@pytest.mark.parametrize("settings,why", [({"rescorer": "ot"}, "rescorer ot"),
                                          ({"vector_centering": "mean"}, "vector_centering"),
                                          ({"abstract_weight": 0.2}, "abstract_weight"),
                                          ({"candidate_facet": "soft"}, "candidate_facet soft")])
def test_what_the_engine_cannot_do_runs_in_python_and_says_why(settings, why, unit_papers, real_meta):
    index, canned = _engine_index("elasticsearch", "9.2.0", unit_papers, real_meta, **settings)
    query = next(p for p in unit_papers if "method" in p.paper.facets).paper_id
    before = len(canned.requests)
    result = index.query(query, facet="method", k=5, place_hits=False)
    assert not _window_requests(canned.requests[before:])
    assert result.rescoring["where"] == "python" and why in result.rescoring["why"]
    assert result.to_dict()["rescoring"] == result.rescoring and result.hits


@pytest.mark.parametrize("engine,version", EDGE)
@pytest.mark.parametrize("hostile,match", [
    (lambda hits: [*hits, {**hits[0], "_id": "not-asked"}], "not asked for"),
    (lambda hits: [*hits, hits[0]], "twice"),
    (lambda hits: [{**hits[0], "_score": None}, *hits[1:]], "scored paper"),
    (lambda hits: [{**hits[0], "_score": "0.7"}, *hits[1:]], "scored paper"),
    (lambda hits: [{**hits[0], "_score": 1.5}, *hits[1:]], r"\[0, 1\]"),
    (lambda hits: [{**hits[0], "_score": -0.25}, *hits[1:]], r"\[0, 1\]"),
    (lambda hits: [{k: v for k, v in hits[0].items() if k != "_id"}, *hits[1:]], "not asked for"),
])
def test_a_hostile_window_answer_is_refused(engine, version, hostile, match, unit_papers, real_meta):
    index, canned = _engine_index(engine, version, unit_papers, real_meta)
    canned.window_answer = hostile
    query = next(p for p in unit_papers if "method" in p.paper.facets).paper_id
    with pytest.raises(BackendError, match=match):
        index.query(query, facet="method", k=5, place_hits=False)


@pytest.mark.parametrize("engine,version", EDGE)
def test_a_hostile_answer_to_one_part_of_the_window_is_refused_naming_it(engine, version, unit_papers, real_meta):
    """Two examples and a paper to avoid are three searches in the window's one `_msearch`: the second answered
    with a paper it was not asked for, or failing outright (a 400 no retry mends), is refused naming that part; so is
    the BM25 look-up that rides in the same request."""
    index, canned = _engine_index(engine, version, unit_papers, real_meta)
    with_method = [p.paper_id for p in unit_papers if "method" in p.paper.facets]
    calls = []

    def second_is_hostile(hits):
        calls.append(1)
        return [*hits, {**hits[0], "_id": "not-asked"}] if len(calls) == 2 else hits

    canned.window_answer = second_is_hostile
    with pytest.raises(BackendError, match="part 2 of 3.*not asked for"):
        index.query(examples=with_method[:2], avoid=with_method[2:3], facet="method", k=5, place_hits=False)
    assert len(calls) == 3  # all three parts were in the one request
    real = type(canned)._maxsim_window
    calls.clear()

    def second_fails(body, ids):
        calls.append(1)
        if len(calls) == 2:
            return 400, {"error": {"type": "script_exception", "reason": "compile error"}, "status": 400}
        return real(canned, body, ids)

    canned.window_answer = staticmethod(lambda hits: hits)
    canned._maxsim_window = second_fails
    with pytest.raises(BackendError, match=r"part 2 of 3\) \(400\).*compile error"):
        index.query(examples=with_method[:2], avoid=with_method[2:3], facet="method", k=5, place_hits=False)
    del canned._maxsim_window
    real_msearch = canned._msearch

    def lookup_fails(method, segs, record):  # the BM25 look-up riding in the window's request
        status, answer = real_msearch(method, segs, record)
        bodies = record["lines"][1::2]
        if any("rescore" in b for b in bodies):
            answer["responses"][-1] = {"error": {"type": "query_shard_exception", "reason": "bad look-up"},
                                       "status": 400}
        return status, answer

    canned._msearch = lookup_fails
    with pytest.raises(BackendError, match=r"look-up 1 of 1\) \(400\).*bad look-up"):
        index.query(examples=with_method[:2], avoid=with_method[2:3], facet="method", k=5, place_hits=False)


def test_the_window_body_holds_the_ids_and_the_rescore_as_wide():
    from esqbe.backends.engines.maxsim import WINDOW_MAX, window_body

    q = np.eye(4, dtype=np.float32)[:2] * 3.0  # sent unit length
    body = window_body("elasticsearch", ["a", "b", "c"], "result", q, ["paper_id"], ["vectors_b64"])
    assert body["size"] == 3 == body["rescore"]["window_size"] and body["query"] == {"ids": {"values": ["a", "b", "c"]}}
    sent = body["rescore"]["query"]["rescore_query"]["script_score"]["script"]["params"]["query_vectors"]
    np.testing.assert_allclose(np.linalg.norm(sent, axis=1), 1.0, atol=1e-6)
    with pytest.raises(ValueError):
        window_body("elasticsearch", [str(i) for i in range(WINDOW_MAX + 1)], None, q, [], [])


@pytest.mark.parametrize("engine,version", [("elasticsearch", "8.17.2"), ("opensearch", "3.2.0")])
def test_a_query_with_the_setting_on_a_cluster_without_the_function_names_the_version(engine, version, unit_papers,
                                                                                     real_meta):
    """An index that carries the fields (restored from a newer cluster, say) on a cluster too old for MaxSim: the
    query is refused naming the version that has the function, before anything is searched."""
    from esqbe.index.api import Index
    from esqbe.settings.config import Settings

    from .fakes.engines import make_backend

    backend, canned = make_backend(engine, version)
    backend.ensure(real_meta)
    backend.upsert(unit_papers[:5])
    canned.mapping["properties"].update(mapping_properties(engine, real_meta.dim))
    backend._mapping = None  # a new session reads the mapping
    backend.facet_vectors = True
    before = len(canned.requests)
    with pytest.raises(BackendError, match=rf"{engine} {re.escape(version)} cannot rank by aspect.*needs"):
        Index(backend, Settings()).query(unit_papers[0].paper.paper_id, facet="method", k=3, place_hits=False)
    assert not [r for r in canned.requests[before:] if r["endpoint"] in ("_msearch", "_search")]
