"""Pseudo-relevance feedback on sentence vectors: the Rocchio step itself, and through a real query."""
from __future__ import annotations

import numpy as np
import pytest

from esqbe.domain import IndexedPaper, Paper
from esqbe.query.prf import feedback_queries
from esqbe.rescore.batches import CandidateBatch


def _paper(pid, vecs):
    vecs = np.asarray(vecs, dtype=np.float32)
    return IndexedPaper(Paper(pid, pid, [f"s{i}" for i in range(len(vecs))], ["method"] * len(vecs), {}), vecs)


def test_rocchio_moves_each_query_sentence_toward_its_closest_sentences_in_the_top_papers():
    q = np.array([[1.0, 0.0, 0.0]], dtype=np.float32)
    batch = CandidateBatch.from_papers([
        _paper("top1", [[0.8, 0.6, 0.0], [0.0, 0.0, 1.0]]),  # its closest sentence to q: (0.8, 0.6, 0)
        _paper("top2", [[0.8, 0.0, 0.6]]),
        _paper("low", [[0.0, 1.0, 0.0]]),  # not in the top 2: ignored
    ])
    scores = np.array([0.9, 0.8, 0.1])
    moved = feedback_queries(q, batch, scores, docs=2, weight=0.5)
    expected = q[0] + 0.5 * np.array([0.8, 0.3, 0.3])
    assert np.allclose(moved[0], expected / np.linalg.norm(expected), atol=1e-6)
    assert np.linalg.norm(moved[0]) == pytest.approx(1.0)
    assert feedback_queries(q, batch, scores, docs=0, weight=0.5) is q  # off: unchanged
    assert np.allclose(feedback_queries(q, batch, np.array([np.nan, 0.8, 0.1]), docs=1, weight=1.0)[0],
                       np.array([1.8, 0.0, 0.6]) / np.linalg.norm([1.8, 0.0, 0.6]))  # unscored candidates skipped


def test_prf_through_a_query_changes_the_ranking_scores_and_is_off_by_default(small_index):
    from esqbe.errors import EsqbeError

    pid = next(iter(small_index.iter_papers())).paper_id
    plain = small_index.query(pid, facet="method", k=10)
    again = small_index.query(pid, facet="method", k=10, prf_docs=0)
    fed = small_index.query(pid, facet="method", k=10, prf_docs=3, prf_weight=0.5)
    assert [h.score for h in plain.hits] == [h.score for h in again.hits]
    assert [round(h.score, 6) for h in fed.hits] != [round(h.score, 6) for h in plain.hits]
    with pytest.raises(EsqbeError, match="prf_docs"):
        small_index.query(pid, facet="method", k=10, prf_docs=99)
