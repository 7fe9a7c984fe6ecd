"""`Backend.search_text` (find a paper by title/abstract words, BM25): the same through every backend,
built on the first stage's BM25 alone (no vectors), so nothing engine-specific is needed for it."""
from __future__ import annotations

import json

import pytest

from .fakes.bodies import is_bm25, vectors_in
from .fakes.engines import VERSIONS, make_papers, ready_backend


@pytest.mark.parametrize("engine", ["elasticsearch", "opensearch"])
def test_engine_search_text_sends_one_bm25_search_and_no_knn(engine):
    backend, canned = ready_backend(engine, VERSIONS[engine][-1], make_papers(4))
    canned.bm25_hits = lambda body: [("p2", 7.5), ("p0", 3.0)]
    mgets = len(canned.sent("_mget"))
    assert backend.search_text("graphs topic", k=5) == [("p2", 7.5), ("p0", 3.0)]
    (sent,) = canned.sent("_msearch")
    bodies = sent["lines"][1::2]
    assert len(bodies) == 1 and is_bm25(bodies[0]) and not vectors_in(bodies[0])
    assert "graphs topic" in json.dumps(bodies[0])
    assert len(canned.sent("_mget")) == mgets  # ids and scores only; the caller fetches what it shows
    assert backend.search_text("   ", k=5) == [] and len(canned.sent("_msearch")) == 1


def test_embedded_search_text_finds_a_paper_by_its_words(small_index):
    target = small_index.backend.get(["csabstruct-train-0011"])["csabstruct-train-0011"].paper
    found = small_index.backend.search_text(" ".join(target.sentences[0].split()[:10]), k=3)
    assert found[0][0] == "csabstruct-train-0011" and found[0][1] > 0
    assert [s for _, s in found] == sorted((s for _, s in found), reverse=True)
    papers = small_index.search(target.sentences[0], k=3)
    assert papers[0][0].paper_id == "csabstruct-train-0011" and papers[0][0].sentences == target.sentences
    assert small_index.backend.search_text("zzzqqq", k=3) == []


def test_index_get_takes_one_id_or_a_list(small_index):
    """`open_index(p).get("some-id")` is that paper (it was read as the list of its characters: `{}`)."""
    one = small_index.get("csabstruct-train-0011")
    assert one is not None and one.paper_id == "csabstruct-train-0011" and one.sentences
    assert small_index.get("no-such-paper") is None
    many = small_index.get(["csabstruct-train-0011", "no-such-paper", "csabstruct-train-0012"])
    assert sorted(many) == ["csabstruct-train-0011", "csabstruct-train-0012"]
    assert many["csabstruct-train-0011"].sentences == one.sentences
    assert small_index.get(p for p in ["csabstruct-train-0012"]).keys() == {"csabstruct-train-0012"}
