"""The embedded backend on its own: storage, crash healing, BM25, exact and ANN kNN (no model needed)."""
from __future__ import annotations

import sqlite3

import numpy as np
import pytest

from esqbe.backends.base import BackendError, FirstStageRequest, IndexedPaper, IndexMeta, ModelMismatchError
from esqbe.backends.embedded import EmbeddedBackend
from esqbe.papers import Paper

DIM = 16
WORDS = "graph parser neural cuts sentiment translation vision speech retrieval ranking kernel bayesian".split()


def _papers(n, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        k = int(rng.integers(2, 6))
        sents = [f"{WORDS[(i + j) % len(WORDS)]} study {i} part {j}." for j in range(k)]
        facets = [("background", "method", "result", "other")[j % 4] for j in range(k)]
        v = rng.normal(size=(k, DIM)).astype(np.float32)
        v /= np.linalg.norm(v, axis=1, keepdims=True)
        out.append(IndexedPaper(Paper(f"p{i:03d}", f"Title {WORDS[i % len(WORDS)]}", sents, facets), v,
                                {WORDS[(i + j) % len(WORDS)]: 1 for j in range(k)}))
    return out


@pytest.fixture
def backend(tmp_path):
    b = EmbeddedBackend(tmp_path / "ix")
    b.ensure(IndexMeta("test-model", DIM))
    yield b
    b.close()


def test_roundtrip_and_reopen(tmp_path, backend):
    papers = _papers(10)
    assert backend.upsert(papers).added == 10
    backend.close()
    b = EmbeddedBackend(tmp_path / "ix")
    got = b.get(["p003", "nope"])
    assert list(got) == ["p003"]
    assert got["p003"].paper.sentences == papers[3].paper.sentences
    assert np.array_equal(got["p003"].vectors, papers[3].vectors)
    assert b.meta() == IndexMeta("test-model", DIM)
    with pytest.raises(ModelMismatchError):
        b.ensure(IndexMeta("other", DIM))


def test_writes_need_meta_and_matching_dims(tmp_path):
    b = EmbeddedBackend(tmp_path / "fresh")
    with pytest.raises(BackendError, match="ensure"):
        b.upsert(_papers(1))
    b.ensure(IndexMeta("m", DIM + 1))
    with pytest.raises(BackendError, match="16-d, index is 17-d"):
        b.upsert(_papers(1))
    with pytest.raises(BackendError, match="no index"):
        EmbeddedBackend(tmp_path / "absent", create=False)


def test_token_counts_follow_upserts_and_deletes(backend):
    papers = _papers(4)
    backend.upsert(papers)
    counts, total = backend.token_counts()
    assert total == sum(sum(p.token_counts.values()) for p in papers)
    backend.delete(["p000"])
    counts2, total2 = backend.token_counts()
    assert total2 == total - sum(papers[0].token_counts.values())
    replaced = IndexedPaper(papers[1].paper, papers[1].vectors, {"zzz": 5})
    replaced.paper.sentences[0] = "changed."
    assert backend.upsert([replaced]).replaced == 1
    counts3, _ = backend.token_counts()
    assert counts3["zzz"] == 5


def test_text_index_heals_after_a_crash_between_stores(tmp_path, backend):
    backend.upsert(_papers(6))
    backend.close()
    # simulate a kill after the SQLite commit but before tantivy's: mark papers as not yet in the text index,
    # and remove them from tantivy
    import tantivy

    b = EmbeddedBackend(tmp_path / "ix")
    w = b.text_index.writer(heap_size=15_000_000, num_threads=1)
    for pid in ("p001", "p002"):
        w.delete_documents_by_term("paper_id", pid)
    w.commit()
    w.wait_merging_threads()
    del w
    b.close()
    with sqlite3.connect(tmp_path / "ix" / "papers.sqlite") as con:
        con.execute("UPDATE papers SET text_indexed = 0 WHERE paper_id IN ('p001', 'p002')")
    healed = EmbeddedBackend(tmp_path / "ix")
    assert healed.text_index.searcher().num_docs == 6
    assert "p001" in healed.bm25("study 1 part", 10)


def test_bm25_restrict_and_exclude(backend):
    backend.upsert(_papers(12))
    hits = backend.bm25("graph", 20)
    assert hits and all(backend.get([p])[p].paper.abstract.lower().count("graph") or "Graph" in backend.get([p])[p].paper.title for p in hits)
    only = backend.bm25("graph", 20, restrict_to=frozenset({"p000", "p011"}))
    assert set(only) <= {"p000", "p011"}
    assert "p000" not in backend.bm25("graph", 20, exclude=frozenset({"p000"}))
    assert backend.bm25("+-()[]{}:^~*!", 5) == {}  # query syntax never reaches the parser


def _exact_knn(papers, q, facet, k):
    """Reference: per query sentence, best cosine per paper over sentences of `facet`, top k papers."""
    totals = {}
    for j in range(len(q)):
        best = {}
        for p in papers:
            rows = [i for i, f in enumerate(p.paper.facets) if facet is None or f == facet]
            if rows:
                best[p.paper_id] = float((p.vectors[rows] @ q[j]).max())
        for pid, s in sorted(best.items(), key=lambda kv: -kv[1])[:k]:
            totals[pid] = totals.get(pid, 0.0) + s
    return {p: s / len(q) for p, s in totals.items()}


@pytest.mark.parametrize("facet", [None, "method"])
def test_exact_knn_matches_brute_force(backend, facet):
    papers = _papers(40)
    backend.upsert(papers)
    q = papers[5].vectors[:2]
    got = backend.knn(q, 7, facet=facet)
    want = _exact_knn(papers, q, facet, 7)
    assert got.keys() == want.keys()
    for pid in want:
        assert got[pid] == pytest.approx(want[pid], abs=1e-5)


def test_hnsw_path_agrees_with_exact_and_is_cached(tmp_path):
    exact = EmbeddedBackend(tmp_path / "ix")
    exact.ensure(IndexMeta("m", DIM))
    papers = _papers(150, seed=3)
    exact.upsert(papers)
    ann = EmbeddedBackend(tmp_path / "ix", exact_threshold=0)
    q = papers[10].vectors[:1]
    a, e = ann.knn(q, 10, facet="method"), exact.knn(q, 10, facet="method")
    assert len(set(a) & set(e)) >= 9  # HNSW recall on a tiny index is near perfect
    top_a = max(a, key=a.get)
    assert top_a == max(e, key=e.get)
    stored = [ip for ip in papers if ip.paper_id in a]
    assert all("method" in ip.paper.facets for ip in stored)
    assert list((tmp_path / "ix").glob("ann-*.faiss"))


def test_first_stage_fuses_and_carries_papers(backend):
    papers = _papers(20)
    backend.upsert(papers)
    req = FirstStageRequest(text="graph parser", vectors=papers[0].vectors[:1], k=5, exclude=frozenset({"p000"}))
    cands = backend.first_stage(req)
    assert len(cands) == 5 and "p000" not in [c.paper_id for c in cands]
    assert all(c.paper is not None and c.paper.vectors.shape[1] == DIM for c in cands)
    assert [c.score for c in cands] == sorted((c.score for c in cands), reverse=True)
    knn_only = backend.first_stage(FirstStageRequest(text="", vectors=papers[0].vectors[:1], k=3, fusion="knn"))
    assert knn_only[0].paper_id == "p000"  # a paper's own sentence is its nearest neighbour
