"""Integration tests of metadata filters and `esqbe attach` on a real Elasticsearch / OpenSearch.

The cluster comes from test_engine_integration's `cluster` fixture (ESQBE_ES_URL / ESQBE_OS_URL, or docker
with the images present); without one every test here is skipped with the reason. Each test uses fresh
index names and deletes them.
"""
from __future__ import annotations

import itertools
import json
import uuid

import pytest
from click.testing import CliRunner

from .test_engine_integration import SAMPLE, cluster  # noqa: F401  (the fixture)

pytestmark = pytest.mark.integration
N = 40
VENUES = ["ACL", "EMNLP", "NAACL", "ICML"]


def _records():
    with open(SAMPLE, encoding="utf-8") as f:
        return [json.loads(line) for line in itertools.islice(f, N)]


@pytest.fixture(scope="module")
def user_index(cluster):  # noqa: F811
    """The user's own index: their mapping and fields, esqbe not involved."""
    import esqbe

    kind, url = cluster
    name = f"esqbe-user-{uuid.uuid4().hex[:10]}"
    handle = esqbe.open_index(None, backend=kind, url=url, index="unused")
    client = handle.backend.client
    settings = {"index": {"number_of_shards": 1, "number_of_replicas": 0, **({"knn": True} if kind == "opensearch" else {})}}
    mappings = {"_meta": {"owner": "library"}, "properties": {
        "doc_no": {"type": "keyword"}, "title": {"type": "text"}, "abstract": {"type": "text"},
        "year": {"type": "integer"}, "lang": {"type": "keyword"}, "venue": {"type": "keyword"},
        "notes": {"type": "text"}, "stats": {"properties": {"views": {"type": "long"}}}}}
    client.indices.create(index=name, body={"settings": settings, "mappings": mappings})
    docs = {}
    for i, r in enumerate(_records()):
        docs[f"u{i}"] = {"doc_no": f"N-{i}", "title": f"Paper {i}", "abstract": " ".join(r["sentences"]),
                         "year": 2010 + i % 12, "lang": "en" if i % 3 else "de", "venue": VENUES[i % 4],
                         "notes": f"note {i}", "stats": {"views": i}}
    for doc_id, doc in docs.items():
        client.index(index=name, id=doc_id, body=doc)
    client.indices.refresh(index=name)
    try:
        yield kind, url, name, client, docs
    finally:
        client.indices.delete(index=name, ignore_unavailable=True)
        handle.close()


def test_attach_keeps_every_user_field_and_queries_with_filters(user_index):
    from cli import main

    kind, url, name, client, docs = user_index
    runner = CliRunner()
    base = ["--backend", kind, "--url", url, "--index", name]
    r = runner.invoke(main, ["attach", *base, "--id-field", "doc_no", "--text-fields", "title,abstract", "--json"],
                      catch_exceptions=False)
    assert r.exit_code == 0, r.output
    summary = json.loads(r.output)
    assert summary["documents"] == N and summary["indexed"] == N and not summary["errors"]
    mapping = next(iter(client.indices.get_mapping(index=name).values()))["mappings"]
    assert mapping["_meta"]["owner"] == "library" and mapping["_meta"]["esqbe"]["text_fields"] == ["title", "abstract"]
    for doc_id, doc in docs.items():
        src = client.get(index=name, id=doc_id)["_source"]
        assert {k: v for k, v in src.items() if k != "esqbe"} == doc  # untouched
        assert src["esqbe"]["n_sentences"] >= 1

    r = runner.invoke(main, ["attach", *base, "--id-field", "doc_no", "--text-fields", "title,abstract", "--json"],
                      catch_exceptions=False)
    assert json.loads(r.output)["unchanged"] == N  # re-running changes nothing

    r = runner.invoke(main, ["query", *base, "--paper", "N-1", "--sentences", "0,1", "-k", "40", "--json",
                             "--filter", "year>=2014", "--filter", "venue in (ACL, EMNLP)",
                             "--engine-filter", '{"term": {"lang": "en"}}'], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    hits = json.loads(r.output)["hits"]
    expected = {d for d, doc in docs.items() if doc["year"] >= 2014 and doc["venue"] in ("ACL", "EMNLP") and doc["lang"] == "en"} - {"u1"}
    assert {h["paper_id"] for h in hits} == expected
    assert all(h["metadata"]["lang"] == "en" for h in hits)


def test_filtered_first_stage_matches_the_embedded_backend(cluster, tmp_path):  # noqa: F811
    import esqbe

    kind, url = cluster
    src = tmp_path / "papers.jsonl"
    with open(src, "w") as f:
        for i, r in enumerate(_records()):
            f.write(json.dumps({"id": r["paper_id"], "title": f"Paper {i}", "abstract": r["sentences"], "facets": r["labels"],
                                "year": 2010 + i % 12, "venue": VENUES[i % 4], "authors": [f"A{i % 5}"]}) + "\n")
    name = f"esqbe-test-{uuid.uuid4().hex[:10]}"
    embedded = esqbe.open_index(str(tmp_path / "embedded"))
    engine = esqbe.open_index(None, backend=kind, url=url, index=name)
    try:
        embedded.index_files([str(src)])
        engine.index_files([str(src)])
        qid = _records()[0]["paper_id"]
        for filters in (["year>=2015"], ["venue in (ACL, EMNLP)"], ["author!=A1"], ["year=2011", "venue=EMNLP"]):
            a = embedded.query(qid, facet="method", k=N, filters=filters)
            b = engine.query(qid, facet="method", k=N, filters=filters)
            assert {h.paper_id for h in a.hits} == {h.paper_id for h in b.hits}, filters
            assert all(h.metadata == embedded.backend.get([h.paper_id])[h.paper_id].paper.metadata for h in b.hits)
    finally:
        engine.backend.client.indices.delete(index=name, ignore_unavailable=True)
        engine.close()
        embedded.close()


def test_attach_with_facet_vectors_ranks_by_aspect_in_the_cluster(cluster, monkeypatch):  # noqa: F811
    """`ESQBE_ENGINE_FACET_VECTORS=true esqbe attach` on a cluster with MaxSim (ES 8.18+ with a licence that allows
    rank_vectors, OS 3.3+): the fields are mapped under `esqbe` and written, the user's fields stay as they were, and a
    query scored by the cluster equals, in ranking and scores, the same query rescored in Python."""
    import esqbe
    from cli import main
    from esqbe.backends.engines.maxsim import check_version, mv_field

    from .test_engine_maxsim import assert_ranked_in_the_cluster_as_in_python

    kind, url = cluster
    handle = esqbe.open_index(None, backend=kind, url=url, index="unused")
    client = handle.backend.client
    try:
        check_version(kind, client.info()["version"]["number"])
    except Exception as exc:  # noqa: BLE001 (the reason is the skip's)
        handle.close()
        pytest.skip(str(exc))
    name = f"esqbe-user-mv-{uuid.uuid4().hex[:10]}"
    settings = {"index": {"number_of_shards": 1, "number_of_replicas": 0, **({"knn": True} if kind == "opensearch" else {})}}
    client.indices.create(index=name, body={"settings": settings, "mappings": {"properties": {
        "doc_no": {"type": "keyword"}, "title": {"type": "text"}, "abstract": {"type": "text"}}}})
    docs = {f"u{i}": {"doc_no": f"N-{i}", "title": f"Paper {i}", "abstract": " ".join(r["sentences"])}
            for i, r in enumerate(_records())}
    try:
        for doc_id, doc in docs.items():
            client.index(index=name, id=doc_id, body=doc)
        client.indices.refresh(index=name)
        monkeypatch.setenv("ESQBE_ENGINE_FACET_VECTORS", "true")
        r = CliRunner().invoke(main, ["attach", "--backend", kind, "--url", url, "--index", name, "--id-field", "doc_no",
                                      "--text-fields", "title,abstract", "--json"], catch_exceptions=False)
        assert r.exit_code == 0, r.output
        assert json.loads(r.output)["indexed"] == N
        for doc_id, doc in docs.items():
            src = client.get(index=name, id=doc_id)["_source"]
            assert {k: v for k, v in src.items() if k != "esqbe"} == doc
            assert mv_field(None) in src["esqbe"]
        with esqbe.open_index(None, backend=kind, url=url, index=name) as index:
            assert index.backend.facet_vectors
            query = next(d for d in docs if "method" in index.backend.get([d])[d].paper.facets)
            assert_ranked_in_the_cluster_as_in_python(index, query)
    finally:
        client.indices.delete(index=name, ignore_unavailable=True)
        handle.close()
