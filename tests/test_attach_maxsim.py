"""Summax in the engine on an ATTACHED index (`esqbe attach`): with engine_facet_vectors the per-facet multi-vector fields are added
under `esqbe` (the mapping update) and written with every document (the bulk partial updates), and a query has the
engine score its window by MaxSim over them; without it nothing changes.

Contract tests, no engine running: the real attach code and the official clients send every request to the user-index
canned engine of test_attach_contract (partial updates merged, scrolls), extended here to answer the window search
by the documented MaxSim emulation (tests/fakes/engines.py) over the documents as attach wrote them; every body is
checked against the engines' strict specifications. NOT integration tests: the live one is in
test_attach_integration.py and skips without a cluster."""
from __future__ import annotations

import copy
import json
import re

import numpy as np
import pytest

from esqbe.backends.engines.attach import (
    ATTACHED_MV_FIELDS,
    MV_MARK,
    NAMESPACE,
    AttachedMixin,
    attach_mapping_body,
)
from esqbe.backends.engines.maxsim import check_painless, mapping_properties, mv_field, unit
from esqbe.errors import BackendError
from esqbe.index.api import Index
from esqbe.index.attach import run_attach
from esqbe.settings.config import Settings

from .conftest import SAMPLE
from .fakes.bodies import os_knn_specs, vectors_in
from .fakes.engines import INDEX, make_backend
from .fakes.specs import assert_valid
from .test_attach_contract import UserIndexEngine, _get
from .test_engine_maxsim import _same_hits, _window_bodies, _window_requests

EDGE = [("elasticsearch", "9.2.0"), ("opensearch", "3.5.0")]
N = 16


def _docs() -> dict[str, dict]:
    """The user's documents: real abstracts (so that the tagger finds every facet), their own ids and fields."""
    with open(SAMPLE, encoding="utf-8") as f:
        records = [json.loads(line) for _, line in zip(range(N), f)]
    return {f"d{i}": {"doc_no": f"N-{100 + i}", "title": r.get("title") or f"Paper {i}",
                      "abstract": " ".join(r["sentences"]), "year": 2010 + i, "lang": "en"}
            for i, r in enumerate(records)}


class WindowUserEngine(UserIndexEngine):
    """The user's index, whose window searches (an `ids` query with a MaxSim `rescore`) are answered by the canned
    engine's documented-MaxSim emulation (inside the `_msearch` that holds them), and whose first stage is answered from the documents attach wrote: kNN by
    the exact best cosine of the searched path's sentences, BM25 by the words shared with the title and abstract."""

    def __init__(self, engine, version):
        super().__init__(engine, version)
        self.sources = _docs()
        self.knn_hits = self._knn
        self.bm25_hits = self._bm25

    def window_source(self, src, includes, excludes):
        """`_source` filtering as the engines do it on the user's documents: a path's leaves through objects and
        through the rows of a nested field (esqbe.method_sentences.idx); excludes are never asked for back."""
        out: dict = {}
        for path in includes or ():
            _pick(src, path.split("."), out)
        assert not set(excludes) & set(includes or ())
        return out

    def _knn(self, body):
        (field, vector), = vectors_in(body)
        path = field.rsplit(".", 1)[0]
        k = body["knn"]["k"] if "knn" in body else next(s for _, s in os_knn_specs(body))["k"]
        q = np.asarray(vector, np.float32)
        best = {pid: max(float(np.dot(np.asarray(r["vector"], np.float32), q)) for r in _get(src, path))
                for pid, src in self.sources.items() if _get(src, path)}
        return [(pid, (1 + c) / 2) for pid, c in sorted(best.items(), key=lambda kv: (-kv[1], kv[0]))[:k]]

    def _bm25(self, body):
        words = set(re.findall(r"\w+", json.dumps(body["query"]["bool"]["must"]).lower()))
        found = {pid: len(words & set(re.findall(r"\w+", f"{s['title']} {s['abstract']}".lower())))
                 for pid, s in self.sources.items()}
        return sorted(((p, float(n)) for p, n in found.items() if n), key=lambda kv: (-kv[1], kv[0]))[: body["size"]]


def _pick(src, parts, out) -> None:
    head, rest = parts[0], parts[1:]
    if not isinstance(src, dict) or head not in src:
        return
    value = src[head]
    if not rest:
        out[head] = copy.deepcopy(value)
    elif isinstance(value, list):  # a nested field: the leaf of every row
        rows = out.setdefault(head, [{} for _ in value])
        for row, full in zip(rows, value):
            _pick(full, rest, row)
    else:
        _pick(value, rest, out.setdefault(head, {}))


def _user_index(engine, version, encoder, facet_vectors):
    backend, _ = make_backend(engine, version)
    canned = WindowUserEngine(engine, version)
    nodes = backend.client.transport.node_pool.all() if engine == "elasticsearch" else \
        backend.client.transport.connection_pool.connections
    for node in nodes:  # the real client's lowest layer, pointed at the user's index
        type(node).canned = canned
    backend.facet_vectors = facet_vectors
    settings = Settings(backend=engine, url="http://canned:9200", index=INDEX, commit_every=8,
                        engine_facet_vectors=facet_vectors)
    return Index(backend, settings, encoder=encoder), canned


def _attach(index, facets="predict"):
    return run_attach(index, "doc_no", ["title", "abstract"], facets=facets)


def _updates(canned, since=0):
    """(action, payload) of every bulk line sent since request `since`."""
    lines = [x for r in canned.requests[since:] if r["endpoint"] == "_bulk" for x in r["lines"]]
    return list(zip(lines[0::2], lines[1::2]))


@pytest.mark.parametrize("engine,version", EDGE)
def test_attach_with_the_setting_maps_and_writes_the_fields(engine, version, encoder):
    index, canned = _user_index(engine, version, encoder, True)
    before = copy.deepcopy(canned.sources)
    report = _attach(index)
    assert (report.indexed, report.errors) == (N, [])
    (put,) = [r for r in canned.sent("_mapping") if r["method"] == "PUT"]
    body = put["lines"][0]
    assert_valid(engine, "indices_create", {"mappings": body})
    added = body["properties"][NAMESPACE]["properties"]
    for field, spec in mapping_properties(engine, encoder.dim).items():
        assert added[field] == spec  # under `esqbe`, beside the nested sentences
    updates = _updates(canned)
    assert len(updates) == N
    for action, payload in updates:
        assert_valid(engine, "bulk_action", action)
        assert_valid(engine, "bulk_update_action_payload", payload)
        assert set(payload["doc"]) == {NAMESPACE}  # a partial update of esqbe's object alone
    for pid, src in canned.sources.items():
        assert {k: v for k, v in src.items() if k != NAMESPACE} == before[pid]  # the user's fields untouched
        ns = src[NAMESPACE]
        assert ns["source_hash"].endswith(MV_MARK)
        stored = index.backend.get([pid])[pid]
        np.testing.assert_allclose(np.array(ns[mv_field(None)]), unit(stored.vectors), atol=1e-6)
        for facet in ("background", "method", "result"):
            rows = [i for i, f in enumerate(stored.paper.facets) if f == facet]
            if rows:
                np.testing.assert_allclose(np.array(ns[mv_field(facet)]), unit(stored.vectors[rows]), atol=1e-6)
            else:
                assert mv_field(facet) not in ns
    assert any(mv_field("method") in s[NAMESPACE] for s in canned.sources.values())
    # reading papers never ships the multi-vector fields back
    mgets = [r for r in canned.sent("_mget") if "_source_excludes" in r["params"]]
    assert mgets and all(set(ATTACHED_MV_FIELDS) <= set(r["params"]["_source_excludes"].split(",")) for r in mgets)


@pytest.mark.parametrize("engine,version", EDGE)
def test_without_the_setting_nothing_is_added_and_python_rescores(engine, version, encoder):
    index, canned = _user_index(engine, version, encoder, False)
    mapping = copy.deepcopy(canned.mapping)
    _attach(index)
    (put,) = [r for r in canned.sent("_mapping") if r["method"] == "PUT"]
    meta = index.backend.meta()
    assert put["lines"][0] == attach_mapping_body(engine, meta, mapping, "doc_no", ["title", "abstract"])
    assert "_mv" not in json.dumps(put["lines"][0]) and "_mv" not in json.dumps(_updates(canned))
    assert not any(s[NAMESPACE]["source_hash"].endswith(MV_MARK) for s in canned.sources.values())
    index.backend.facet_vectors = True  # the setting at query time only: the index has no fields to score with
    before = len(canned.requests)
    result = index.query("d0", facet="method", k=5, place_hits=False)
    assert not _window_requests(canned.requests[before:])
    assert result.rescoring["where"] == "python" and "`esqbe attach`" in result.rescoring["why"]
    assert result.hits


@pytest.mark.parametrize("engine,version", EDGE)
@pytest.mark.parametrize("facet", ["method", None])
def test_a_query_on_the_attached_index_is_scored_in_the_engine_as_python_scores_it(engine, version, facet, encoder):
    index, canned = _user_index(engine, version, encoder, True)
    _attach(index)
    backend = index.backend
    assert isinstance(backend, AttachedMixin) and backend.window_scoring()[0]
    query = next(pid for pid, s in canned.sources.items() if facet is None or mv_field(facet) in s[NAMESPACE])
    before = len(canned.requests)
    in_engine = index.query(query, facet=facet, k=5, place_hits=False)
    (window,) = _window_requests(canned.requests[before:])
    (body,) = _window_bodies(window)
    assert_valid(engine, "search", body)
    script = body["rescore"]["query"]["rescore_query"]["script_score"]["script"]["source"]
    assert check_painless(engine, script) == []
    if engine == "elasticsearch":  # the field by its path in the user's document
        assert f"'{NAMESPACE}.{mv_field(facet)}'" in script
    else:  # lateInteractionScore is given esqbe's object of _source, the field a key of it
        assert f"'{mv_field(facet)}', params._source['{NAMESPACE}']" in script
    assert not {f for f in body["_source"]["includes"] if f.endswith(("vector", "_mv", "text", "b64"))}
    assert set(ATTACHED_MV_FIELDS) <= set(body["_source"]["excludes"])
    backend.facet_vectors = False
    before_python = len(canned.requests)
    in_python = index.query(query, facet=facet, k=5, place_hits=False)
    fetched = {pid for r in canned.requests[before_python:] if r["endpoint"] == "_mget" for pid in r["lines"][0]["ids"]}
    assert set(body["query"]["ids"]["values"]) == fetched - {query}  # the same window, by the documents' _id
    assert in_engine.rescoring["where"] == "backend" and in_engine.rescoring["in_python"] == 0
    assert in_python.rescoring["where"] == "python"
    assert len(in_engine.hits) == 5
    _same_hits(in_engine, in_python)


@pytest.mark.parametrize("engine,version", EDGE)
def test_reattaching_with_the_setting_keeps_the_fields_current(engine, version, encoder):
    """Attached without the setting, then re-attached with it: the fields are mapped and every document, its text
    unchanged, written again with them (scored in the engine from then on); a third run changes nothing; a document
    whose text changed gets the fields of its new text."""
    index, canned = _user_index(engine, version, encoder, False)
    _attach(index)
    index.backend.facet_vectors = True
    sent = len(canned.requests)
    again = _attach(index)
    assert (again.replaced, again.unchanged, again.errors) == (N, 0, [])
    assert all(mv_field(None) in s[NAMESPACE] for s in canned.sources.values())
    assert mv_field(None) in canned.mapping["properties"][NAMESPACE]["properties"]
    assert len(_updates(canned, sent)) == N
    sent = len(canned.requests)
    third = _attach(index)
    assert (third.unchanged, third.replaced) == (N, 0) and not _updates(canned, sent)
    canned.sources["d3"]["abstract"] += " We also release the code and data."
    fourth = _attach(index)
    assert (fourth.replaced, fourth.unchanged) == (1, N - 1)
    stored = index.backend.get(["d3"])["d3"]
    ns = canned.sources["d3"][NAMESPACE]
    assert len(ns[mv_field(None)]) == len(stored.paper.sentences) == ns["n_sentences"]
    np.testing.assert_allclose(np.array(ns[mv_field(None)]), unit(stored.vectors), atol=1e-6)


@pytest.mark.parametrize("engine,version", [("elasticsearch", "8.17.2"), ("opensearch", "3.2.0")])
def test_the_setting_on_a_cluster_without_maxsim_is_refused_before_the_mapping_changes(engine, version, encoder):
    index, canned = _user_index(engine, version, encoder, True)
    with pytest.raises(BackendError, match=rf"{engine} {re.escape(version)} cannot rank by aspect.*needs"):
        _attach(index)
    assert not [r for r in canned.requests if r["method"] == "PUT" or r["endpoint"] == "_bulk"]


def test_the_cli_honours_the_environment_setting(encoder, monkeypatch):
    """`ESQBE_ENGINE_FACET_VECTORS=true esqbe attach` (the setting has no flag): the fields are mapped and written."""
    from click.testing import CliRunner

    from cli import main

    from .fakes.wire import EngineHTTPServer

    canned = WindowUserEngine("elasticsearch", "9.2.0")
    server = EngineHTTPServer(canned)
    monkeypatch.setenv("ESQBE_ENGINE_FACET_VECTORS", "true")
    try:
        r = CliRunner().invoke(main, ["attach", "--backend", "elasticsearch", "--url", server.url, "--index", INDEX,
                                      "--id-field", "doc_no", "--text-fields", "title,abstract", "--facets", "none",
                                      "--json"], catch_exceptions=False)
    finally:
        server.close()
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["indexed"] == N
    (put,) = [x for x in canned.sent("_mapping") if x["method"] == "PUT"]
    assert mv_field(None) in put["lines"][0]["properties"][NAMESPACE]["properties"]
    assert all(mv_field(None) in s[NAMESPACE] for s in canned.sources.values())


@pytest.mark.parametrize("engine,version", EDGE)
@pytest.mark.parametrize("facet_vectors", [False, True])
def test_a_facet_the_new_text_loses_leaves_nothing_behind(engine, version, facet_vectors, encoder):
    """A partial update merges `esqbe` key by key: a document whose new text has no sentence of a facet it had gets
    that facet's sentences cleared (null), so what esqbe reads back, and queries match, is the new text alone."""
    from esqbe.backends.engines.mapping import FACET_PATHS

    index, canned = _user_index(engine, version, encoder, facet_vectors)
    _attach(index)
    doc = next(d for d, s in canned.sources.items()
               if len({f for f in FACET_PATHS.values() if s[NAMESPACE].get(f)}) >= 3)
    had = {f for f in FACET_PATHS.values() if canned.sources[doc][NAMESPACE].get(f)}
    canned.sources[doc]["abstract"] = "We study the problem."
    sent = len(canned.requests)
    again = _attach(index)
    assert (again.replaced, again.errors) == (1, [])
    ((_, payload),) = _updates(canned, sent)
    now = {f for f in FACET_PATHS.values() if canned.sources[doc][NAMESPACE].get(f)}
    assert len(now) == 1 and now < had  # one sentence now: the facets it lost were cleared
    assert all(payload["doc"][NAMESPACE][f] is None for f in set(FACET_PATHS.values()) - now)
    stored = index.backend.get([doc])[doc]
    assert stored.paper.sentences == ["We study the problem."] and stored.vectors.shape[0] == 1
    assert canned.sources[doc][NAMESPACE]["n_sentences"] == 1
