"""Issue 52 items 1-2, the request side (esqbe.backends.engines.maxsim): per-facet multi-vector fields and the
engine's own MaxSim rescoring. Contract tests: the mapping and search bodies against the engines' official
specifications (tests/specs, strict), the Painless sources against the documented function signatures, and a
Python emulation of the documented MaxSim semantics that must reproduce esqbe's summax on a real embedded index.
The live tests need a running cluster (ESQBE_ES_URL / ESQBE_OS_URL) and skip here, saying so. No test here is an
integration test but those."""
from __future__ import annotations

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

from .fakes.engines import schema_errors

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


# --- the setting: an engine index esqbe creates carries the fields ---------------------------------------------------
@pytest.mark.parametrize("engine,version", [("elasticsearch", "9.2.0"), ("opensearch", "3.5.0")])
def test_the_setting_writes_the_fields_into_the_mapping_and_every_paper(engine, version):
    from esqbe.index.open import open_backend
    from esqbe.settings.config import load_settings

    from .fakes.engines import META, CannedEngine, EngineHTTPServer, make_papers

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

    from .fakes.engines import META, CannedEngine, EngineHTTPServer

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
