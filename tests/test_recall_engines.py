"""`esqbe check recall` on Elasticsearch and OpenSearch, to contract (issue 23): the exact reference is a nested
`script_score` over every document, each body passing the engine's own request schema, and its hits make the
first stage's score model. No engine runs here (tests/fakes/engines.py); a live engine's integration test is
tests/test_engine_integration.py, skipped where no engine can be reached."""
from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pytest

from esqbe.backends.engines.mapping import FACET_PATHS  # noqa: E402
from esqbe.index.recall import check_recall  # noqa: E402
from tests.fakes.engines import ENGINE_VERSIONS, assert_valid, make_papers, ready_backend  # noqa: E402


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
