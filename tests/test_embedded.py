"""The embedded backend on its own: storage, crash healing, BM25, exact and ANN kNN (no model needed)."""
from __future__ import annotations

import sqlite3

import numpy as np
import pytest

from esqbe.backends.embedded.backend import EmbeddedBackend
from esqbe.domain import FirstStageRequest, IndexedPaper, IndexMeta, Paper
from esqbe.errors import BackendError, ModelMismatchError

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
    # vectors are stored as float16: within half a float16 step of what was written
    assert np.allclose(got["p003"].vectors, papers[3].vectors, atol=1e-3)
    assert got["p003"].vectors.dtype == np.float32
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
    reader = EmbeddedBackend(tmp_path / "ix")
    assert reader.text_index.searcher().num_docs == 4  # readers never repair (they need no lock)
    assert reader.knn(_papers(6)[1].vectors[:1], 3)  # the papers are there for kNN all the same
    healed = EmbeddedBackend(tmp_path / "ix")
    healed.delete([])  # any write takes the write lock and heals first
    assert healed.text_index.searcher().num_docs == 6
    reader.bm25("study", 10)
    assert reader.text_index.searcher().num_docs == 6  # and readers see it on their next query
    assert "p001" in healed.bm25("study 1 part", 10)


def test_bm25_restrict_and_exclude(backend):
    backend.upsert(_papers(12))
    hits = backend.bm25("graph", 20)
    assert hits and all(backend.get([p])[p].paper.abstract.lower().count("graph") or "Graph" in backend.get([p])[p].paper.title for p in hits)
    only = backend.bm25("graph", 20, restrict_to=frozenset({"p000", "p011"}))
    assert set(only) <= {"p000", "p011"}
    # a paper's BM25 is the same restricted or not (the id set is a filter, it adds nothing to the score)
    assert only and all(abs(only[p] - hits[p]) < 1e-6 for p in only)
    assert "p000" not in backend.bm25("graph", 20, exclude=frozenset({"p000"}))
    assert backend.bm25("+-()[]{}:^~*!", 5) == {}  # query syntax never reaches the parser


def test_bm25_scores_as_the_query_parser_less_the_commonest_terms(backend):
    """bm25() builds the query itself (one term query per analysed word and field, no parser): with every
    term kept (bm25_max_df 1.0) it must score exactly as tantivy's query parser does; by default the terms
    in more than a fifth of the papers are dropped, but never below the BM25_MIN_TERMS rarest."""
    from esqbe.backends.embedded.textindex import BM25_MIN_TERMS, _query_terms

    rare = "kappa lambda sigma omega delta theta gamma zeta iota rho".split()
    assert _query_terms(" ".join(rare)) == rare  # words the stemmer leaves alone: one term each
    rng = np.random.default_rng(0)
    papers = []
    for i in range(40):  # "study" and "part" in every paper, "alpha" in half, each rare word in two
        sents = ["A study in part one.", f"Alpha {rare[i % 10]} results." if i % 2 else f"Plain {rare[i % 10]} results."]
        v = rng.normal(size=(2, DIM)).astype(np.float32)
        papers.append(IndexedPaper(Paper(f"q{i:03d}", f"Paper {i}", sents, ["background", "result"]),
                                   v / np.linalg.norm(v, axis=1, keepdims=True)))
    backend.upsert(papers)
    index = backend.text_index
    searcher = index.searcher()

    def parser(words):
        hits = searcher.search(index.parse_query(" ".join(words), ["title", "abstract"]), limit=50).hits
        return {searcher.doc(a)["paper_id"][0]: s for s, a in hits}

    def same(a, b):
        return a.keys() == b.keys() and all(abs(a[p] - b[p]) < 1e-5 for p in a)

    text = "Study, part (alpha) studies: " + " ".join(rare)
    words = ["study", "part", "alpha", "studies", *rare]
    backend.configure(bm25_max_df=1.0)
    assert same(backend.bm25(text, 50), parser(words))
    backend.configure(bm25_max_df=0.2)
    assert BM25_MIN_TERMS < len(rare)
    assert same(backend.bm25(text, 50), parser(rare))  # study/studies (one term), part, alpha dropped
    # too few selective terms: the rarest common ones are kept up to BM25_MIN_TERMS (alpha, then study)
    few = rare[: BM25_MIN_TERMS - 2]
    assert same(backend.bm25("study part alpha " + " ".join(few), 50), parser([*few, "alpha", "study"]))
    # bm25_max_terms: a long query keeps its most selective terms only (ties in the text's order)
    backend.configure(bm25_max_df=1.0, bm25_max_terms=BM25_MIN_TERMS)
    assert same(backend.bm25(text, 50), parser(rare[:BM25_MIN_TERMS]))
    backend.configure(bm25_max_df=0.2, bm25_max_terms=0)
    assert same(backend.bm25(text, 50), parser(rare))
    # a short query keeps everything
    assert same(backend.bm25("study part alpha", 50), parser(["study", "part", "alpha"]))


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
        assert got[pid] == pytest.approx(want[pid], abs=2e-3)  # float16 storage


def test_ann_path_agrees_with_exact(tmp_path):
    """A corpus forced onto the ANN path (IVF per facet, exact re-scoring) finds what exact search finds."""
    b = EmbeddedBackend(tmp_path / "ix", exact_threshold=0, merge_threshold=0)
    b.ensure(IndexMeta("m", DIM))
    papers = _papers(300, seed=3)
    b.upsert(papers)
    built = b.optimize()
    assert set(built) >= {"method", "background"}
    assert list((tmp_path / "ix" / "ann").glob("method-*.faiss"))
    b.close()
    reader = EmbeddedBackend(tmp_path / "ix", nprobe=1024)  # every list visited: the ANN must equal exact
    for qi in (10, 77):
        q = papers[qi].vectors[:2]
        for facet in ("method", None):
            a = reader.knn(q, 10, facet=facet)
            e = reader.knn(q, 10, facet=facet, exact=True)
            assert a.keys() == e.keys()
            assert all(a[p] == pytest.approx(e[p], abs=1e-6) for p in e)  # ANN hits are re-scored exactly
    assert reader.stats()["knn"]["method"].startswith("ivf-sq8")
    few = EmbeddedBackend(tmp_path / "ix", nprobe=2)  # fewer lists: fewer papers reached, only of the facet
    a = few.knn(papers[10].vectors[:1], 10, facet="method")
    assert a and all("method" in ip.paper.facets for ip in papers if ip.paper_id in a)


def test_writes_after_the_ann_are_visible_at_once(tmp_path):
    """Adds go to the exact-searched delta, deletes and replacements are masked, all before any merge."""
    b = EmbeddedBackend(tmp_path / "ix", exact_threshold=0, merge_threshold=10**9)
    b.ensure(IndexMeta("m", DIM))
    papers = _papers(200, seed=5)
    b.upsert(papers[:150])
    b.optimize(force=True)
    reader = EmbeddedBackend(tmp_path / "ix", nprobe=1024)
    q = papers[160].vectors[:1]
    assert "p160" not in reader.knn(q, 5)
    b.upsert(papers[150:])  # lands in the delta, no rebuild
    assert max(reader.knn(q, 5).items(), key=lambda kv: kv[1])[0] == "p160"
    q2 = papers[20].vectors[:1]
    assert max(reader.knn(q2, 5).items(), key=lambda kv: kv[1])[0] == "p020"  # found through the ANN
    b.delete(["p020", "p160"])
    assert "p020" not in reader.knn(q2, 50) and "p160" not in reader.knn(q, 50)
    assert "p020" not in reader.get(["p020"])
    moved = IndexedPaper(papers[30].paper, papers[100].vectors[: len(papers[30].paper.sentences)] if len(papers[100].paper.sentences) >= len(papers[30].paper.sentences) else np.resize(papers[100].vectors, papers[30].vectors.shape))
    moved.paper.sentences[0] = "replaced text."
    assert b.upsert([moved]).replaced == 1
    got = reader.get(["p030"])["p030"]
    assert np.allclose(got.vectors, moved.vectors, atol=1e-3)
    assert reader.stats()["papers"] == 198
    b.close()


def test_allowed_papers_restrict_the_knn(tmp_path):
    b = EmbeddedBackend(tmp_path / "ix", exact_threshold=0, merge_threshold=0)
    b.ensure(IndexMeta("m", DIM))
    papers = _papers(200, seed=7)
    b.upsert(papers)
    b.optimize()
    q = papers[3].vectors[:1]
    few = frozenset({"p001", "p050", "p199"})
    assert set(b.knn(q, 10, restrict_to=few)) <= few
    allowed = b.pnos([f"p{i:03d}" for i in range(0, 200, 2)])
    got = b.knn(q, 10, allowed=allowed, facet="method")
    assert got and all(int(p[1:]) % 2 == 0 for p in got)
    assert got.keys() == b.knn(q, 10, allowed=allowed, facet="method", exact=True).keys() or len(got) >= 8
    assert "p004" not in b.knn(q, 10, exclude=frozenset({"p004"}))
    b.close()


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


def test_first_stage_reads_the_knn_papers_while_bm25_runs(backend):
    """While BM25 is still running, the first stage reads the kNN's best papers early: the candidates, their
    scores and the papers they carry are exactly those read after BM25, and the fused top k are all carried."""
    import time

    papers = _papers(40)
    backend.upsert(papers)
    by_id = {p.paper.paper_id: p for p in papers}
    req = FirstStageRequest(text="graph parser study", vectors=papers[3].vectors[:2], k=12, exclude=frozenset({"p003"}))
    fast = backend.first_stage(req)
    reads: list[list[str]] = []
    real_bm25, real_get = backend._bm25, backend.get

    def slow_bm25(*a, **kw):  # the real BM25, finishing after the kNN
        time.sleep(0.3)
        return real_bm25(*a, **kw)

    def counting_get(ids):
        reads.append(list(ids))
        return real_get(ids)

    backend._bm25, backend.get = slow_bm25, counting_get
    try:
        slow = backend.first_stage(req)
    finally:
        del backend._bm25, backend.get
    from esqbe.core.fusion import top_k

    knn = backend.knn(req.vectors, req.knn_k, exclude=req.exclude)
    assert reads[0] == [pid for pid, _ in top_k(knn, 12)]  # the kNN's 12 best, read before BM25 ended
    assert reads[0] != [c.paper_id for c in fast]  # (not the fused list that is read after BM25)
    assert [(c.paper_id, c.score, c.bm25, c.knn) for c in slow] == [(c.paper_id, c.score, c.bm25, c.knn) for c in fast]
    for c in slow:
        assert c.paper is not None and c.paper.paper.sentences == by_id[c.paper_id].paper.sentences
        assert np.array_equal(c.paper.vectors, by_id[c.paper_id].vectors.astype(np.float16).astype(np.float32))
    assert {c.paper_id for c in slow} <= {pid for ids in reads for pid in ids}
