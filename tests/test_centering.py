"""Vector centering before rescoring (esqbe.query.centering): the estimate, the query path, the cache."""
import numpy as np
import pytest

from esqbe.query import centering
from esqbe.settings.config import ConfigError

QID = "csabstruct-train-0000"


def test_estimate_recovers_the_common_mean_and_direction():
    rng = np.random.default_rng(0)
    common = np.zeros(16)
    common[3] = 1.0
    x = rng.normal(size=(2000, 16)) * 0.1 + 2.0 * common + np.outer(rng.normal(size=2000) * 3.0, np.eye(16)[7])
    d = centering.estimate(x, 1)
    assert np.allclose(d.mean, x.mean(0), atol=1e-5)
    assert abs(abs(float(d.top[0] @ np.eye(16)[7])) - 1.0) < 1e-3  # the direction of largest variance
    out = d.apply(x[:50])
    assert np.allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)
    assert np.abs(out @ d.top[0]).max() < 1e-5  # removed
    assert centering.estimate(x, 0).top.shape == (0, 16)
    with pytest.raises(ValueError, match="vector_centering"):
        centering.components("top9")


def test_rescoring_on_centred_vectors(small_index):
    """vector_centering=top1: summax over vectors with the index's mean and top direction removed
    (estimated from every paper of a small index); the first stage is unchanged."""
    be = small_index.backend
    ids = sorted(be.paper_ids())
    got = be.get(ids)
    d = centering.estimate(np.concatenate([got[i].vectors for i in ids]), 1)
    common = dict(facet="method", k=39, rescorer="summax", final_bm25_weight=0, candidate_facet="same")
    res = small_index.query(QID, vector_centering="top1", **common)
    plain = small_index.query(QID, **common)
    q = got[QID]
    idx = [i for i, _ in res.query_sentences]
    qv = d.apply(q.vectors[idx])
    checked = 0
    for h in res.hits:
        keep = got[h.paper_id].paper.facet_indices("method")
        if keep:
            sims = qv @ d.apply(got[h.paper_id].vectors[keep]).T
            assert h.score == pytest.approx(float(sims.max(axis=1).mean()), abs=1e-4)
            checked += 1
    assert checked >= 10
    assert [h.paper_id for h in res.hits] != [h.paper_id for h in plain.hits]  # it changes the ranking
    assert sorted((h.paper_id, h.first_stage_score) for h in res.hits) == sorted((h.paper_id, h.first_stage_score) for h in plain.hits)
    with pytest.raises(ConfigError, match="vector_centering"):
        small_index.query(QID, vector_centering="whiten", **common)


def test_cached_directions_are_dropped_after_a_tenth_of_the_corpus_is_written(small_index):
    be = small_index.backend
    first = centering.corpus_directions(be, "mean")
    assert centering.corpus_directions(be, "mean") is first  # cached
    assert first.corpus == len(be.paper_ids()) and first.papers == first.corpus  # a small index: every paper
    centering.written(be, 1)  # 1 of 40: kept
    assert centering.corpus_directions(be, "mean") is first
    centering.written(be, 4)  # 5 of 40 > 10%: estimated again
    again = centering.corpus_directions(be, "mean")
    assert again is not first and np.allclose(again.mean, first.mean)
