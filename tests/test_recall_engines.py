"""`esqbe check recall` on Elasticsearch and OpenSearch, to contract: the exact reference is a nested
`script_score` over every document, each body passing the engine's own request schema, and its hits make the
first stage's score model. No engine runs here (tests/fakes/engines.py); a live engine's integration test is
tests/test_engine_integration.py, skipped where no engine can be reached."""
from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pytest

from esqbe.backends.engines.mapping import FACET_PATHS  # noqa: E402
from esqbe.domain import FirstStageRequest  # noqa: E402
from esqbe.index.recall import check_recall  # noqa: E402
from tests.fakes.bodies import os_knn_specs, vectors_in  # noqa: E402
from tests.fakes.engines import ENGINE_VERSIONS, make_papers, ready_backend  # noqa: E402
from tests.fakes.specs import assert_valid  # noqa: E402


def _exact_from_body(body, by_path):
    """What an engine answers to the body: per document, 1 + the best cosine of its sentences under the path."""
    nested = body["query"]["nested"]
    script = nested["query"]["script_score"]["script"]
    vector = np.asarray(script["params"].get("query_vector") or script["params"]["query_value"], np.float32)
    best: dict[str, float] = {}
    for pid, vec in by_path[nested["path"]]:
        best[pid] = max(best.get(pid, -1.0), float(vec @ vector))
    return [(pid, 1.0 + c) for pid, c in sorted(best.items(), key=lambda kv: -kv[1])[: body["size"]]]


@pytest.mark.parametrize("engine,version", ENGINE_VERSIONS)
def test_exact_knn_bodies_pass_the_spec_and_give_the_first_stage_score_model(engine, version):
    papers = make_papers(8)
    backend, canned = ready_backend(engine, version, papers)
    by_path = defaultdict(list)
    for ip in papers:
        for i, facet in enumerate(ip.paper.facets):
            by_path[FACET_PATHS[facet]].append((ip.paper_id, ip.vectors[i]))
    canned.knn_hits = lambda body: _exact_from_body(body, by_path) if "script_score" in json.dumps(body) else []
    q = np.stack([papers[1].vectors[0], papers[5].vectors[1]])
    got = backend.exact_knn(q, 3, facet="method", exclude=frozenset({"p1"}))
    for record in canned.sent("_msearch"):
        for body in record["lines"][1::2]:
            assert_valid(engine, "search", body)
            assert "script_score" in body["query"]["nested"]["query"]
    want: dict[str, float] = defaultdict(float)
    for qv in q:
        per = {ip.paper_id: float((ip.vectors[ip.paper.facet_indices("method")] @ qv).max())
               for ip in papers if ip.paper_id != "p1" and ip.paper.facet_indices("method")}
        for pid, c in sorted(per.items(), key=lambda kv: (-kv[1], kv[0]))[:3]:
            want[pid] += c / len(q)
    assert {p: round(s, 4) for p, s in got.items()} == {p: round(s, 4) for p, s in want.items()}


@pytest.mark.parametrize("engine", ["elasticsearch", "opensearch"])
def test_check_recall_runs_on_an_engine(engine):
    """The engine's approximate answers (here: a canned kNN that misses every paper's best sentence but one's)
    against its exact ones: recall below 1, the setting named."""
    papers = make_papers(8)
    backend, canned = ready_backend(engine, ENGINE_VERSIONS[-1][1] if engine == "opensearch" else "9.2.0", papers)
    by_path = defaultdict(list)
    for ip in papers:
        for i, facet in enumerate(ip.paper.facets):
            by_path[FACET_PATHS[facet]].append((ip.paper_id, ip.vectors[i]))
    canned.knn_hits = lambda body: (_exact_from_body(body, by_path) if "script_score" in json.dumps(body)
                                    else [("p0", 1.0)])
    report = check_recall(backend, queries=4, facet="method", k=3)
    (f,) = report.facets
    assert report.backend == engine and f.queries >= 1
    assert f.setting.startswith("num_candidates")
    assert f.recall["@100"]["mean"] < 1.0


def _num_candidates(node) -> int | None:
    """What a kNN body asks the engine to consider: ES `num_candidates`, OpenSearch `ef_search` (else its k)."""
    if isinstance(node, list):
        return next((n for n in map(_num_candidates, node) if n is not None), None)
    if not isinstance(node, dict):
        return None
    knn = node.get("knn")
    if isinstance(knn, dict) and "num_candidates" in knn:
        return int(knn["num_candidates"])
    for _field, spec in os_knn_specs(node):
        if "vector" in spec:
            return int((spec.get("method_parameters") or {}).get("ef_search") or spec["k"])
    return next((n for n in map(_num_candidates, node.values()) if n is not None), None)


def _approximate_engine(canned, papers, visible_per_candidate: float):
    """A canned engine whose kNN sees only the first num_candidates x `visible_per_candidate` papers (a fixed order),
    answering exactly among those; `script_score` (exact) sees all. Mapping updates replace `_meta`, as engines do."""
    by_path = defaultdict(list)
    for ip in papers:
        for i, facet in enumerate(ip.paper.facets):
            by_path[FACET_PATHS[facet]].append((ip.paper_id, ip.vectors[i]))
    order = sorted(ip.paper_id for ip in papers)

    def knn_hits(body):
        if "script_score" in json.dumps(body):
            return _exact_from_body(body, by_path)
        seen = set(order[: max(1, int(_num_candidates(body) * visible_per_candidate))])
        text = json.dumps(body)
        path = next(p for p in by_path if f'"{p}' in text)
        vector = np.asarray(vectors_in(body)[0][1], np.float32)
        best: dict[str, float] = {}
        for pid, vec in by_path[path]:
            if pid in seen:
                best[pid] = max(best.get(pid, -1.0), float(vec @ vector))
        return [(pid, 1.0 + c if canned.engine == "opensearch" else (1.0 + c) / 2)
                for pid, c in sorted(best.items(), key=lambda kv: -kv[1])[:200]]

    canned.knn_hits = knn_hits
    get_mapping = canned._mapping

    def mapping(method, segs, record):
        if method == "PUT":
            canned.mapping["_meta"] = record["lines"][0]["_meta"]
            return 200, {"acknowledged": True}
        return get_mapping(method, segs, record)

    canned._mapping = mapping


@pytest.mark.parametrize("engine,version", [("elasticsearch", "9.2.0"), ("opensearch", "3.5.0"), ("opensearch", "2.12.0")])
def test_engine_calibration_stores_num_candidates_in_meta_and_queries_use_it(engine, version):
    """A kNN that sees more papers the more candidates it is given: calibration picks the smallest factor reaching
    the target against exact script_score search, stores it in the mapping's `_meta` (a valid mapping update that
    keeps esqbe's keys), the search bodies then ask for factor x k candidates, stats show it, a fixed factor wins."""
    from esqbe.backends.engines.calibrate import FACTOR_LADDER

    papers = make_papers(40)
    backend, canned = ready_backend(engine, version, papers)
    _approximate_engine(canned, papers, visible_per_candidate=40 / 800)  # all 40 papers need 800 candidates
    cal = backend.calibrate_knn(0.95)
    (put,) = [r for r in canned.sent("_mapping") if r["method"] == "PUT"]
    assert_valid(engine, "indices_create", {"mappings": put["lines"][0]})
    meta = put["lines"][0]["_meta"]
    assert meta["model"] == "test-encoder" and meta["esqbe_layout"] == "facet-nested/1"  # esqbe's keys kept
    assert set(meta["knn_calibration"]) == set(cal) == {"background", "method", "result"}
    for facet, c in cal.items():
        # k = 100 (+1 excluded): 6 x 101 = 606 candidates see 30 of 40 papers; 8 x 101 see them all
        assert c["num_candidates_factor"] == 8 and c["recall"] >= 0.95 and c["statistic"] == "mean", (facet, c)
        assert FACTOR_LADDER.index(8) > 0
    canned.requests.clear()
    q = papers[3].vectors[papers[3].paper.facet_indices("method")]
    backend.first_stage(FirstStageRequest(text="", vectors=q, facet="method", k=100, knn_k=100, bm25_k=0,
                                          exclude=frozenset({"p3"}), fusion="knn", with_papers=False))
    sent = [b for r in canned.sent("_msearch") for b in r["lines"][1::2]]
    assert sent and {_num_candidates(b) for b in sent} == {8 * 101}
    for body in sent:
        assert_valid(engine, "search", body)
    stats = backend.stats()
    assert stats["knn_calibration"]["method"]["num_candidates_factor"] == 8
    assert stats["knn"]["method"] == "num_candidates 8 x k (calibrated)"
    assert backend.calibrate_knn(0.95) is None  # not due again: same target, same papers
    backend.num_candidates_factor = 2  # fixed by the caller: wins over the calibration
    assert backend.knn_setting("method") == "num_candidates 2 x k (fixed)"
    canned.requests.clear()
    backend.first_stage(FirstStageRequest(text="", vectors=q, facet="method", k=100, knn_k=100, bm25_k=0,
                                          exclude=frozenset({"p3"}), fusion="knn", with_papers=False))
    assert {_num_candidates(b) for r in canned.sent("_msearch") for b in r["lines"][1::2]} == {2 * 101}


def test_engine_calibration_p10_needs_at_least_the_means_factor():
    papers = make_papers(40)
    backend, canned = ready_backend("elasticsearch", "9.2.0", papers)
    _approximate_engine(canned, papers, visible_per_candidate=40 / 700)
    from esqbe.backends.engines.calibrate import calibrate

    mean = calibrate(backend, target=0.8, statistic="mean")
    p10 = calibrate(backend, target=0.8, statistic="p10")
    for facet in mean:
        assert p10[facet]["p10"] >= 0.8 and p10[facet]["num_candidates_factor"] >= mean[facet]["num_candidates_factor"]
    assert backend.knn_setting("method") == "num_candidates 4 x k (default)"  # calibrate() alone stores nothing
