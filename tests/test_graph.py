"""A query's hits as a graph (esqbe.query.graph): `Index.graph`, `esqbe graph` and POST /graph, over real indexes.

- the nodes are exactly the query's hits: same ids, order, scores and bands as `Index.query` with the same arguments;
- an edge's weight is the rescorer's own similarity of the two papers alone, each way, averaged (summax and ts by the
  batched segment reductions, another rescorer run per hit): the same from `pair_similarity` on the two papers and
  from another query's graph that holds them too; the batched pairs equal a per-pair reference (property test);
- each hit keeps its strongest 5 edges at fair or above, and no other edge is drawn;
- groups are said only where the hits split (synthetic graphs of known shape; a query too narrow says so);
- identical calls give identical graphs, positions included;
- GraphML reads back in networkx with its types; the SVG parses as XML, one circle per hit, hostile text as text;
- `esqbe graph` (text, --json, --format graphml -o FILE, k past 100 refused) and POST /graph (JSON, files, 422).
"""
from __future__ import annotations

import json
import time

import httpx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from esqbe.query.graph import EDGES_PER_NODE, MAX_GRAPH_HITS, find_groups, pair_similarity

QID = "csabstruct-train-0000"


def _without_timings(d: dict) -> dict:
    d = json.loads(json.dumps(d))
    d.pop("timings_ms")
    d["result"].pop("timings_ms")
    return d


def test_the_nodes_are_the_querys_hits_and_identical_calls_give_identical_graphs(small_index):
    listed = small_index.query(QID, facet="method", k=12)
    graph = small_index.graph(QID, facet="method", k=12)
    assert [n["id"] for n in graph.nodes] == [h.paper_id for h in listed.hits]
    assert [(n["rank"], n["score"], n["band"], n["percentile"]) for n in graph.nodes] == \
        [(h.rank, h.score, h.band, h.percentile) for h in listed.hits]
    d = graph.to_dict()
    assert [h["paper_id"] for h in d["result"]["hits"]] == [n["id"] for n in d["nodes"]]
    assert all(0.0 <= n["x"] <= 1.0 and 0.0 <= n["y"] <= 1.0 for n in d["nodes"])
    assert [a["role"] for a in d["anchors"]] == ["example"] and d["anchors"][0]["paper_id"] == QID
    assert _without_timings(d) == _without_timings(small_index.graph(QID, facet="method", k=12).to_dict())


@pytest.mark.parametrize("rescorer", ["summax", "asym"])
def test_an_edge_weighs_what_the_two_papers_alone_give(small_index, rescorer):
    """summax through the batched segment reductions, asym through the rescorer run once per hit: each edge's weight is
    `pair_similarity` of its two papers (the rescorer itself, on those two alone), and another query's graph that holds
    the same two hits weighs their edge the same (to float32's precision: a product's rounding depends on its shape)."""
    first = small_index.graph(QID, facet="method", k=15, rescorer=rescorer)
    other_q = first.nodes[0]["id"]
    second = small_index.graph(other_q, facet="method", k=15, rescorer=rescorer)
    settings_ = small_index.settings.replace(rescorer=rescorer, rescorer_params={})
    papers = small_index.backend.get([n["id"] for n in first.nodes])
    assert first.edges, "the query's hits are linked"
    for e in first.edges[:6]:
        alone = pair_similarity(papers[e["source"]], papers[e["target"]], "method", settings_)
        assert e["weight"] == pytest.approx(alone, abs=2e-6)
        assert e["weight"] == pytest.approx((e["forward"] + e["backward"]) / 2, abs=1e-5)
        pair = e["pair"]
        assert pair["source_sentence"] == papers[e["source"]].paper.sentences[pair["source_index"]]
        assert pair["target_sentence"] == papers[e["target"]].paper.sentences[pair["target_index"]]
    mine = {frozenset((e["source"], e["target"])): e["weight"] for e in first.edges}
    theirs = {frozenset((e["source"], e["target"])): e["weight"] for e in second.edges}
    shared = set(mine) & set(theirs)
    assert shared, "the two graphs share an edge"
    for pair in shared:
        assert mine[pair] == pytest.approx(theirs[pair], abs=2e-6)


def test_each_hit_keeps_its_strongest_fair_edges_and_no_other(small_index):
    graph = small_index.graph(QID, facet="method", k=12)
    ids = [n["id"] for n in graph.nodes]
    papers = small_index.backend.get(ids)
    scale = small_index.similarity_scale()
    k = len(ids)
    w = np.full((k, k), -np.inf)
    for a in range(k):  # every pair from the two papers alone (the reference, not the batched path)
        for b in range(a + 1, k):
            w[a, b] = w[b, a] = pair_similarity(papers[ids[a]], papers[ids[b]], "method", small_index.settings)
    fair = np.array([[scale.place(x)[1] in ("fair", "strong") if np.isfinite(x) else False for x in row] for row in w])
    drawn = {frozenset((e["source"], e["target"])) for e in graph.edges}
    wanted = set()
    for a in range(k):
        best = sorted((b for b in range(k) if fair[a, b]), key=lambda b: (-w[a, b], b))[:EDGES_PER_NODE]
        wanted |= {frozenset((ids[a], ids[b])) for b in best}
    assert drawn == wanted
    assert all(e["band"] in ("fair", "strong") for e in graph.edges)
    assert [n["degree"] for n in graph.nodes] == [sum(ids[n] in p for p in drawn) for n in range(k)]


def _clique(members, weight=0.8):
    return [(a, b, weight) for i, a in enumerate(members) for b in members[i + 1:]]


def test_groups_are_said_only_where_the_hits_split(small_index):
    two = _clique(list(range(6))) + _clique(list(range(6, 12))) + [(5, 6, 0.4)]
    groups, info = find_groups(12, two)
    assert info["status"] == "grouped" and sorted(map(sorted, groups)) == [list(range(6)), list(range(6, 12))]
    assert info["modularity"] > info["null_modularity_max"]
    groups, info = find_groups(12, _clique(list(range(12))))  # one neighbourhood: every hit as like every other
    assert (groups, info["status"]) == ([], "no_split") and "no groups" in info["note"]
    import networkx as nx

    noise = nx.random_regular_graph(4, 16, seed=0)  # Louvain splits any graph; a random one's split is no stronger
    groups, info = find_groups(16, [(a, b, 0.5) for a, b in noise.edges()])  # than its shuffles': no groups
    assert (groups, info["status"]) == ([], "no_split") and "shuffled" in info["note"]
    groups, info = find_groups(12, _clique(list(range(5))))  # too few hits linked
    assert (groups, info["status"]) == ([], "too_few") and "5 of the 12 hits" in info["note"]
    narrow = small_index.graph(QID, facet="method", k=5)  # a query too narrow for groups says so
    assert narrow.groups == [] and narrow.grouping["status"] == "too_few"
    assert "groups need at least 8 linked hits" in narrow.grouping["note"]


@settings(max_examples=40, deadline=None)
@given(counts=st.lists(st.tuples(st.integers(0, 4), st.integers(0, 4)), min_size=2, max_size=7), seed=st.integers(0, 99))
def test_the_batched_pairs_are_the_per_pair_maths(counts, seed):
    """The segment reductions (one product, no loop over pairs) against the rescorer's own maths, pair by pair, for hits
    with any number of sentences on either side (none included)."""
    from esqbe.query.graph import HitSides, best_pairs, best_per_hit, directed_similarities

    rng = np.random.default_rng(seed)
    k, d = len(counts), 8

    def unit(n):
        v = rng.normal(size=(n, d)).astype(np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    q = [unit(nq) for nq, _ in counts]
    c = [unit(nc) for _, nc in counts]
    bias = [rng.uniform(-0.2, 0, size=nc).astype(np.float32) for _, nc in counts]
    sides = HitSides(np.concatenate(q), np.repeat(np.arange(k), [len(x) for x in q]),
                     np.concatenate([np.arange(len(x)) for x in q]), np.concatenate(c),
                     np.repeat(np.arange(k), [len(x) for x in c]), np.concatenate([np.arange(len(x)) for x in c]),
                     np.concatenate(bias), [False] * k, [], None, [list(range(len(x))) for x in q], [])
    best, which = best_per_hit(sides, k)
    summax = directed_similarities(sides, best, k, "summax")
    ts = directed_similarities(sides, best, k, "ts")
    top, qi, ci = best_pairs(sides, best, which, k)
    for a in range(k):
        for b in range(k):
            if not len(q[a]) or not len(c[b]):
                assert summax[a, b] == ts[a, b] == -1.0 and qi[a, b] == ci[a, b] == -1
                continue
            sims = q[a] @ c[b].T + bias[b][None, :]
            assert summax[a, b] == pytest.approx(sims.max(axis=1).mean(), abs=1e-6)
            assert ts[a, b] == pytest.approx(sims.max(), abs=1e-6)
            assert sims[qi[a, b], ci[a, b]] == pytest.approx(sims.max(), abs=1e-6)


def test_graphml_reads_back_typed_and_the_svg_is_xml_holding_every_hit(hostile_index_dir):
    """Over papers whose titles, sentences and metadata carry terminal escapes and markup (tests/conftest.py)."""
    import io

    import networkx as nx
    from lxml import etree

    import esqbe
    from esqbe.query.graph_formats import to_graphml, to_svg

    with esqbe.open_index(str(hostile_index_dir), create=False, config=None) as index:
        d = index.graph("paper-0", facet="method", k=9).to_dict()
    g = nx.read_graphml(io.StringIO(to_graphml(d)))
    hits = [n for n, a in g.nodes(data=True) if a["role"] == "hit"]
    assert hits == [n["id"] for n in d["nodes"]]
    for n in d["nodes"]:
        got = g.nodes[n["id"]]
        assert type(got["rank"]) is int and got["rank"] == n["rank"]
        assert type(got["score"]) is float and got["score"] == pytest.approx(n["score"])
        assert ("year" in got) == (n["year"] is not None) and (n["year"] is None or type(got["year"]) is int)
        assert "\x1b" not in got["label"] and "\x07" not in got["label"]
    assert len([e for e in g.edges(data=True) if e[2]["kind"] == "similar"]) == len(d["edges"])
    assert all(type(a["weight"]) is float for _, _, a in g.edges(data=True))
    svg = to_svg(d)
    root = etree.fromstring(svg.encode("utf-8"))  # strict: one control character or stray markup and it fails
    ns = {"s": "http://www.w3.org/2000/svg"}
    assert len(root.findall(".//s:g[@class='nodes']/s:g[@class='node']", ns)) == len(d["nodes"])
    assert not root.findall(".//s:script", ns) and not root.findall(".//s:a", ns)
    tips = [t.text for t in root.iter("{http://www.w3.org/2000/svg}title")]
    assert any("study" in (t or "") and "=HYPERLINK" in (t or "") for t in tips)  # a hostile title, as text


def test_esqbe_graph_prints_writes_and_refuses(hostile_index_dir, tmp_path):
    from click.testing import CliRunner

    from cli import main

    run = lambda *a: CliRunner().invoke(main, ["graph", "--path", str(hostile_index_dir), "--paper", "paper-0",  # noqa: E731
                                               "--facet", "method", *map(str, a)])
    r = run("-k", "6")
    assert r.exit_code == 0, r.output
    assert "graph of the 6 hits of paper paper-0, facet method, rescorer summax" in r.output
    assert "groups: no groups:" in r.output and "\x1b" not in r.output
    r = run("-k", "6", "--json")
    d = json.loads(r.output)
    assert len(d["nodes"]) == 6 and {"edges", "groups", "grouping", "anchors", "layout", "result"} <= set(d)
    out = tmp_path / "g.graphml"
    r = run("-k", "6", "--format", "graphml", "-o", out)
    assert r.exit_code == 0 and out.read_text().startswith("<?xml") and "wrote the graph of 6 hits" in r.output
    r = run("-k", str(MAX_GRAPH_HITS + 1))
    assert r.exit_code != 0 and f"a graph has at most {MAX_GRAPH_HITS} hits" in r.output and "Traceback" not in r.output
    helped = " ".join(CliRunner().invoke(main, ["graph", "--help"]).output.split())  # the help says the rule's figures
    assert f"k at most {MAX_GRAPH_HITS};" in helped and f"keeps its {EDGES_PER_NODE} strongest links" in helped


def test_post_graph_answers_the_graph_and_its_files(hostile_server):
    from esqbe.server.middleware import is_write

    assert not is_write("POST", "/graph")  # a read, as POST /query: no token asked where reads are open
    body = {"paper_id": "paper-0", "facet": "method", "k": 7}
    listed = httpx.post(hostile_server + "/query", json=body, timeout=60).json()
    r = httpx.post(hostile_server + "/graph", json=body, timeout=60)
    assert r.status_code == 200, r.text
    d = r.json()
    assert [n["id"] for n in d["nodes"]] == [h["paper_id"] for h in listed["hits"]]
    assert [n["score"] for n in d["nodes"]] == [h["score"] for h in listed["hits"]]
    for fmt, kind in (("graphml", "application/graphml+xml"), ("svg", "image/svg+xml")):
        r = httpx.post(hostile_server + "/graph", json={**body, "format": fmt}, timeout=60)
        assert r.status_code == 200 and r.headers["content-type"].startswith(kind)
        assert r.headers["content-disposition"] == f'attachment; filename="esqbe-graph.{fmt}"'
    r = httpx.post(hostile_server + "/graph", json={**body, "k": MAX_GRAPH_HITS + 1}, timeout=60)
    assert r.status_code == 422 and "k" in r.json()["error"]["message"]


def test_thirty_hits_and_their_435_pairs_within_a_second_warm(small_index):
    small_index.graph(QID, facet="method", k=30)  # warm: the scale measured, the pages read
    best = min(_timed(lambda: small_index.graph(QID, facet="method", k=30)) for _ in range(3))
    graph = small_index.graph(QID, facet="method", k=30)
    assert len(graph.nodes) == 30 and graph.edge_rule["pairs"] == 435
    assert best < 1.0, best  # benchmarks/bench_graph.py measures it (docs/performance.md)


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t
