"""Contract tests of metadata filters on the Elasticsearch and OpenSearch backends (no engine running).

The real backends and official clients produce every request (see test_engine_contract.py); the canned
engine behind them stores the bulk documents and, for searches, evaluates the filter clauses it receives
over the stored `meta_kw` / `meta_num` fields with a small interpreter of the query DSL subset esqbe emits
(the same one tests/test_filters.py checks against the Python meaning). Checked: every body against the
engines' strict schemas, every filter field against the mapping's dynamic templates, that the filter is
inside the kNN (a pre-filter) on every version that can run it, the id resolution on OpenSearch < 3.5,
and that the candidates all satisfy the filter.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from esqbe.backends.engines.filters import MAX_RESOLVED_IDS
from esqbe.core.filters import (
    MetadataFilter,
    coerce_filters,
    matches,
    only_terms,
    to_query_dsl,
)
from esqbe.domain import FirstStageRequest

from .fakes.bodies import is_bm25, mapping_fields, os_knn_specs
from .fakes.engines import DIM, ENGINE_VERSIONS, INDEX, make_papers, ready_backend
from .fakes.specs import assert_valid
from .test_filters import _engine_eval

VENUES = ["ACL", "EMNLP", "NAACL"]


def papers_with_metadata(n=30):
    papers = make_papers(n)
    for i, ip in enumerate(papers):
        meta = {"format": "jsonl", "venue": VENUES[i % 3], "authors": [{"name": f"A{i % 4}", "id": str(i % 4)}]}
        if i % 5:
            meta["year"] = 2010 + i % 12
        if i % 4 == 0:
            meta["external_ids"] = {"doi": f"10.1/{i}"}
        ip.paper.metadata = meta
    return papers


def flat(source: dict) -> dict:
    doc = {"paper_id": [source["paper_id"]]}
    for root in ("meta_kw", "meta_num"):
        for k, v in (source.get(root) or {}).items():
            doc[f"{root}.{k}"] = v
    return doc


def allowed_by(canned, clauses) -> list[str]:
    return sorted(pid for pid, src in canned.sources.items() if all(_engine_eval(c, flat(src)) for c in clauses))


def filtering_engine(canned):
    """Make the canned engine answer searches by evaluating the filters it is sent."""

    def knn_hits(body):
        if "knn" in body:  # Elasticsearch top-level knn
            flt = body["knn"].get("filter", [])
            k = body["knn"]["k"]
        else:
            (spec,) = [s for _, s in os_knn_specs(body)]
            flt = [spec["filter"]] if "filter" in spec else []
            k = spec["k"]
            outer = body["query"].get("bool", {}).get("filter", [])  # a post-filter, if any
            flt = flt + outer
        ids = allowed_by(canned, flt)[:k]
        return [(pid, 0.99 - 0.01 * n) for n, pid in enumerate(ids)]

    def bm25_hits(body):
        return [(pid, 5.0 - 0.1 * n) for n, pid in enumerate(allowed_by(canned, body["query"]["bool"].get("filter", [])))]

    def search(method, segs, record):
        body = record["lines"][0]
        if "aggs" in body:
            return type(canned)._search(canned, method, segs, record)
        ids = allowed_by(canned, body["query"]["bool"]["filter"])
        return 200, {"hits": {"total": {"value": len(ids), "relation": "eq"}, "hits": [{"_index": INDEX, "_id": p, "_score": None} for p in ids[: body["size"]]]}}

    canned.knn_hits = knn_hits
    canned.bm25_hits = bm25_hits
    canned._search = search


FILTERS = [["year>=2015"], ["venue in (ACL, EMNLP)"], ["venue=ACL"], ["author!=A1"], ["external_ids.doi exists"],
           ["year not exists"], ["year<2013", "venue=NAACL"], ["author_id in (2, 3)"],
           ["venue~=acl"], ["author^=a", "venue^=Em"]]  # any case, prefix (term/prefix, case_insensitive)


def _query(facet=None, restrict=None, flt=None):
    rng = np.random.default_rng(4)
    q = rng.normal(size=(2, DIM)).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    return FirstStageRequest(text="graphs on topic", vectors=q, facet=facet, k=30, knn_k=30, bm25_k=30, restrict_to=restrict,
                             filter=flt, with_papers=True)


@pytest.mark.parametrize("engine,version", ENGINE_VERSIONS)
@pytest.mark.parametrize("conds", FILTERS, ids=[";".join(c) for c in FILTERS])
def test_filtered_first_stage_bodies_and_results(engine, version, conds):
    papers = papers_with_metadata()
    backend, canned = ready_backend(engine, version, papers)
    filtering_engine(canned)
    fields = mapping_fields(canned.mapping)
    flt = MetadataFilter(coerce_filters(conds))
    expected = {ip.paper_id for ip in papers if matches(ip.paper.metadata, flt.conditions)}
    for facet in (None, "method"):
        before_msearch, before_search = len(canned.sent("_msearch")), len(canned.sent("_search"))
        got = backend.first_stage(_query(facet=facet, flt=flt))
        assert {c.paper_id for c in got} == expected  # every allowed paper, nothing else
        for c in got:
            assert matches(c.paper.paper.metadata, flt.conditions)  # metadata comes back with the hit
        resolved = canned.sent("_search")[before_search:]
        (sent,) = canned.sent("_msearch")[before_msearch:]
        bodies = sent["lines"][1::2]
        for body in bodies + [r["lines"][0] for r in resolved]:
            assert_valid(engine, "search", body)
            for field in _filter_fields(body):
                root = field.split(".")[0]
                assert root in fields and fields[root]["type"] == "object" and fields[root]["dynamic"] == "true", field
        knn = [b for b in bodies if not is_bm25(b)]
        (bm25,) = [b for b in bodies if is_bm25(b)]
        old_os = engine == "opensearch" and tuple(map(int, version.split(".")[:2])) < (3, 5)
        plain_terms = only_terms(to_query_dsl(flt))  # venue=ACL, venue in (...): a term/terms, runs everywhere
        if old_os and not plain_terms:
            # resolved to ids first, then a terms filter on paper_id inside the kNN, like a re-ranking pool
            assert len(resolved) == 1 and resolved[0]["path"] == f"/{INDEX}/_search"
            for b in knn:
                (spec,) = [s for _, s in os_knn_specs(b)]
                assert set(spec["filter"]["terms"]["paper_id"]) == expected
            assert bm25["query"]["bool"]["filter"][0]["terms"]["paper_id"] == sorted(expected)
        else:
            assert not resolved
            for b in knn:  # the metadata filter is the kNN's own filter: pre-filtering
                spec = b["knn"] if engine == "elasticsearch" else next(s for _, s in os_knn_specs(b))
                assert "meta_" in json.dumps(spec["filter"])
                assert "bool" not in b.get("query", {})  # no post-filter around the kNN
                # parent-level fields only (meta_kw.* / meta_num.* are object paths of the paper, not nested)
                assert '"nested"' not in json.dumps(spec["filter"])
            assert "meta_" in json.dumps(bm25["query"]["bool"]["filter"])


def _filter_fields(body) -> set[str]:
    out = set()

    def walk(node):
        if isinstance(node, dict):
            for k, v in node.items():
                if k in ("term", "terms", "range") and isinstance(v, dict):
                    out.update(f for f in v if f.startswith("meta_"))
                elif k == "exists":
                    out.add(v["field"])
                else:
                    walk(v)
        elif isinstance(node, list):
            for x in node:
                walk(x)

    walk(body)
    return out


@pytest.mark.parametrize("engine,version", [("elasticsearch", "8.11.4"), ("opensearch", "2.12.0"), ("opensearch", "3.5.0")])
def test_filter_and_pool_intersect(engine, version):
    papers = papers_with_metadata()
    backend, canned = ready_backend(engine, version, papers)
    filtering_engine(canned)
    pool = frozenset(ip.paper_id for ip in papers[:12])
    flt = MetadataFilter(coerce_filters(["year>=2014"]))
    got = backend.first_stage(_query(restrict=pool, flt=flt))
    assert {c.paper_id for c in got} == {ip.paper_id for ip in papers[:12] if matches(ip.paper.metadata, flt.conditions)}


def test_wide_filter_on_old_opensearch_falls_back_to_a_post_filter(monkeypatch):
    import esqbe.backends.engines.search as ec

    monkeypatch.setattr(ec, "MAX_RESOLVED_IDS", 3)
    papers = papers_with_metadata()
    backend, canned = ready_backend("opensearch", "2.19.3", papers)
    filtering_engine(canned)
    flt = MetadataFilter(coerce_filters(["year>=2012"]))
    got = backend.first_stage(_query(flt=flt))
    assert {c.paper_id for c in got} == {ip.paper_id for ip in papers if matches(ip.paper.metadata, flt.conditions)}
    (sent,) = canned.sent("_msearch")
    for b in sent["lines"][1::2]:
        if not is_bm25(b):
            assert_valid("opensearch", "search", b)
            assert "meta_num.year" in json.dumps(b["query"]["bool"]["filter"])  # around the kNN: documented limit


@pytest.mark.parametrize("engine,version", ENGINE_VERSIONS)
def test_documents_carry_filterable_metadata_matching_the_templates(engine, version):
    papers = papers_with_metadata(6)
    backend, canned = ready_backend(engine, version, papers)
    (bulk,) = canned.sent("_bulk")
    templates = {next(iter(t)): next(iter(t.values())) for t in canned.mapping["dynamic_templates"]}
    for source, ip in zip(bulk["lines"][1::2], papers):
        assert source["metadata"] == ip.paper.metadata  # stored as given, returned with hits
        assert source["meta_kw"]["venue"] == [ip.paper.metadata["venue"]]
        assert source["meta_kw"]["authors.name"] == [a["name"] for a in ip.paper.metadata["authors"]]
        if "year" in ip.paper.metadata:
            assert source["meta_num"]["year"] == [float(ip.paper.metadata["year"])]
        for v in source["meta_kw"].values():
            assert all(isinstance(x, str) for x in v)  # -> match_mapping_type string -> keyword
        for v in source.get("meta_num", {}).values():
            assert all(isinstance(x, float) for x in v)  # -> match_mapping_type double -> double
    assert templates["esqbe_meta_kw"]["mapping"]["type"] == "keyword"
    assert templates["esqbe_meta_num_double"]["mapping"]["type"] == "double"
    assert MAX_RESOLVED_IDS <= 10_000  # within the default index.max_result_window
