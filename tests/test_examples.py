"""A query of several examples and papers to avoid: `Index.query(examples=[...], avoid=[...])` on a real
embedded index with the real model; the single-paper query is the one-example query."""
from __future__ import annotations

import numpy as np
import pytest

from esqbe.core.limits import MAX_EXAMPLE_SENTENCES, MAX_EXAMPLES
from esqbe.query.combine import aggregate, avoid_penalty
from esqbe.query.results import PaperNotFoundError, QueryError, QueryTooLargeError

A, B, C, NO_RESULT = "csabstruct-train-0000", "csabstruct-train-0001", "csabstruct-train-0002", "csabstruct-train-0005"


def _ranking(result):
    return [(h.paper_id, round(h.score, 9)) for h in result.hits]


def test_one_example_is_the_single_paper_query(small_index):
    single = small_index.query(A, facet="method", k=15)
    composed = small_index.query(examples=[{"paper_id": A, "facet": "method"}], k=15)
    assert _ranking(single) == _ranking(composed)
    assert [[(m.query_index, m.candidate_index) for m in h.matches] for h in single.hits] == \
        [[(m.query_index, m.candidate_index) for m in h.matches] for h in composed.hits]
    by_default_facet = small_index.query(examples=[A], facet="method", k=15)
    assert _ranking(by_default_facet) == _ranking(single)
    chosen = small_index.query(A, sentences=[1, 3], k=5)
    assert _ranking(small_index.query(examples=[{"paper_id": A, "sentences": [1, 3]}], k=5)) == _ranking(chosen)


def test_several_examples_explain_each_hit_and_are_never_hits(small_index):
    result = small_index.query(examples=[A, {"paper_id": B, "sentences": [0, 2]}], avoid=[C], facet="method", k=40,
                               avoid_rule="rocchio")
    ids = [h.paper_id for h in result.hits]
    assert not {A, B, C} & set(ids)
    assert len(ids) == 40 - 3  # every other paper of the small index, ranked
    assert [e.paper_id for e in result.examples] == [A, B] and [a.paper_id for a in result.avoid] == [C]
    assert result.examples[1].indices == [0, 2] and result.examples[1].facet is None
    for h in result.hits:
        assert len(h.example_similarities) == 2 and all(s is not None for s in h.example_similarities)
        # mean aggregation, minus the Rocchio penalty: the hit's similarity is what the examples say less the avoided
        assert h.similarity == pytest.approx(np.mean(h.example_similarities) - h.avoided[0].penalty, abs=1e-6)
        assert h.avoided[0].paper_id == C and h.avoided[0].penalty == pytest.approx(0.5 * h.avoided[0].similarity)
        assert h.avoided[0].avoid_sentence in result.avoid[0].sentences
        assert {m.example for m in h.matches} <= {0, 1}
        for m in h.matches:  # each pair names its example's own sentence
            ex = result.examples[m.example]
            assert m.query_sentence == ex.paper.paper.sentences[m.query_index] and m.query_index in ex.indices
    assert {m.example for h in result.hits for m in h.matches} == {0, 1}
    data = result.to_dict()
    assert [e["paper_id"] for e in data["query"]["examples"]] == [A, B]
    assert data["query"]["avoid"][0]["paper_id"] == C
    assert [s["index"] for s in data["query"]["examples"][1]["sentences"]] == [0, 2]
    hit = data["hits"][0]
    assert len(hit["example_similarities"]) == 2 and hit["avoided"][0]["paper_id"] == C
    assert {"example", "query_index", "candidate_index"} <= set(hit["matches"][0])


def test_an_avoided_paper_pulls_down_what_resembles_it(small_index):
    plain = small_index.query(examples=[A], facet="method", k=40)
    nearest_to_c = small_index.query(C, facet="method", k=1).hits[0].paper_id
    assert nearest_to_c != A
    rank = {h.paper_id: h.rank for h in plain.hits}
    heavy = small_index.query(examples=[A], avoid=[C], facet="method", k=40, avoid_rule="rocchio", avoid_weight=4.0,
                              final_bm25_weight=0.0)
    heavy_rank = {h.paper_id: h.rank for h in heavy.hits}
    assert heavy_rank[nearest_to_c] > rank[nearest_to_c]
    # margin: only candidates closer to the avoided paper than to the examples lose anything
    margin = small_index.query(examples=[A], avoid=[C], facet="method", k=40, avoid_rule="margin",
                               final_bm25_weight=0.0)
    for h in margin.hits:
        closer = h.avoided[0].similarity > h.example_similarities[0]
        assert (h.avoided[0].penalty > 0) == closer


def test_a_text_is_one_more_example(small_index):
    text = small_index.get([B])[B].sentences
    result = small_index.query(examples=[{"paper_id": A, "facet": "method"}, {"text": text, "sentences": [0, 1]}], k=5)
    assert result.examples[1].indexed is False and result.to_dict()["query"]["examples"][1]["paper_id"] is None
    assert "encode" in result.timings
    assert A not in [h.paper_id for h in result.hits]


def test_aggregation_rules():
    sims = np.array([[0.9, 0.5, 0.1], [0.1, 0.5, 0.2]])
    assert aggregate(sims, "mean").tolist() == pytest.approx([0.5, 0.5, 0.15])
    assert aggregate(sims, "max").tolist() == pytest.approx([0.9, 0.5, 0.2])
    for rule in ("mean", "max"):  # one example: itself, whatever the rule
        assert aggregate(sims[:1], rule).tolist() == sims[0].tolist()
    with pytest.raises(QueryError, match="example_aggregate"):
        aggregate(sims, "median")
    score, avoided = np.array([0.5, 0.5]), np.array([[0.7, 0.2]])
    assert avoid_penalty(score, avoided, "rocchio", 0.5).tolist() == pytest.approx([0.35, 0.1])
    assert avoid_penalty(score, avoided, "margin", 1.0).tolist() == pytest.approx([0.2, 0.0])


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(examples=[]), QueryError, "at least one example"),
    (dict(examples=[A, A]), QueryError, f"paper {A} given twice"),
    (dict(examples=[A], avoid=[C, C]), QueryError, "twice as papers to avoid"),
    (dict(examples=[A, B], avoid=[B]), QueryError, f"{B} both an example and to avoid"),
    (dict(examples=[A, "nope-1"], avoid=["nope-2"]), PaperNotFoundError, "nope-1, nope-2 are not in the index"),
    (dict(examples=[A] * (MAX_EXAMPLES + 1)), QueryError, f"at most {MAX_EXAMPLES}"),
    (dict(examples=[A], avoid=[NO_RESULT], facet="result"), QueryError, f"{NO_RESULT} has no sentence labelled 'result'"),
    (dict(examples=[{"paper_id": A, "facet": "method", "sentences": [0]}]), QueryError, "either a facet or sentence"),
    (dict(examples=[{"paper_id": A, "page": 2}]), QueryError, "unknown field"),
    (dict(examples=[A], avoid=[{"text": "A text."}]), QueryError, "not a text"),
    (dict(paper_id=A, examples=[B]), QueryError, "not both"),
])
def test_bad_examples_are_refused_before_any_work(small_index, kwargs, error, message):
    with pytest.raises(error, match=message):
        small_index.query(**kwargs)


def test_the_examples_sentences_together_are_bounded(small_index):
    ids = [f"csabstruct-train-{i:04d}" for i in range(MAX_EXAMPLES)]  # every sentence of 16 papers: > the cap
    with pytest.raises(QueryTooLargeError, match=f"at most {MAX_EXAMPLE_SENTENCES}"):
        small_index.query(examples=ids)
    assert small_index.query(examples=ids[:4], facet="method", k=3).hits  # within the cap: answered


def test_one_first_stage_request_and_one_candidate_batch_per_query(small_index, monkeypatch):
    """The cost stays bounded: the examples' sentences go to the first stage in one request (their union), and the
    candidates are batched once per facet view, whatever the number of examples and avoided papers. The score's
    BM25 adds at most two BM25-only look-ups (the query text's best BM25 in the index; the candidates BM25's top k
    missed), never a kNN."""
    import esqbe.query.combine as combine

    requests, batches = [], []
    first_stage, from_papers = small_index.backend.first_stage, combine.CandidateBatch.from_papers
    monkeypatch.setattr(small_index.backend, "first_stage", lambda req: requests.append(req) or first_stage(req))
    monkeypatch.setattr(combine.CandidateBatch, "from_papers",
                        staticmethod(lambda *a, **kw: batches.append(1) or from_papers(*a, **kw)))
    ids = [f"csabstruct-train-{i:04d}" for i in range(6)]
    small_index.similarity_scale(wait=True)  # measured first (its own queries), so that only this query is counted
    requests.clear(), batches.clear()
    result = small_index.query(examples=ids[:5], avoid=ids[5:], facet="method", k=5)
    assert len(batches) == 1 and 1 <= len(requests) <= 3
    assert all(r.knn_k == 0 and r.vectors.shape[0] == 0 and not r.with_papers for r in requests[1:])
    assert sum(r.knn_k == 0 and r.k == 1 and r.restrict_to is None and not r.exclude for r in requests[1:]) == 1
    union = sum(len(e.indices) for e in result.examples)
    assert requests[0].vectors.shape[0] == union and request_excludes(requests[0], ids)
    assert requests[0].facet == "method"
    # several examples search the ANN with less effort per sentence (their candidates share one cap); one does not
    assert requests[0].ann_effort == small_index.settings.examples_ann_effort < 1
    assert small_index.query(examples=ids[:5], avoid=ids[5:], facet="method", k=5, examples_ann_effort=0.25).hits
    assert [r.ann_effort for r in requests if r.knn_k][-1] == 0.25
    small_index.query(ids[0], facet="method", k=5)
    assert [r.ann_effort for r in requests if r.knn_k][-1] == 1.0


def request_excludes(request, ids) -> bool:
    return set(ids) <= set(request.exclude)
