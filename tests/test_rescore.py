"""Rescorers: hand-made vectors whose right ranking is obvious, padding, OT against POT, token matching."""
import os
import zlib

import numpy as np
import pytest

from esqbe.rescore.batches import CandidateBatch, QueryBatch, RescoreContext
from esqbe.rescore.registry import available_rescorers, make_rescorer
from esqbe.rescore.rescorers import (
    emd_loop,
    ot_marginals,
    pairwise_l2,
    round_to_marginals,
    sinkhorn_batched,
    strip_citation_markers,
    token_frequency_weights,
)

ot = pytest.importorskip("ot")
DIM = 16
VECTOR_RESCORERS = ("ts", "summax", "ot", "asym")


def unit(x):
    x = np.asarray(x, dtype=np.float64)
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def e(i, dim=DIM):
    v = np.zeros(dim, dtype=np.float32)
    v[i] = 1.0
    return v


def mix(cos, i, j):
    """A unit vector with cosine `cos` to e(i) (the rest along e(j), orthogonal to everything else)."""
    return (cos * e(i) + np.sqrt(1 - cos**2) * e(j)).astype(np.float32)


def query(*vectors, weights=None):
    return QueryBatch(vectors=np.stack(vectors), sentences=[f"q{i}" for i in range(len(vectors))], weights=weights)


def candidates(*sentence_lists, width=None, junk_padding=False, texts=None):
    """A CandidateBatch from per-candidate lists of sentence vectors (padded to `width`)."""
    n = len(sentence_lists)
    width = width or max(max((len(s) for s in sentence_lists), default=1), 1)
    dim = next((len(s[0]) for s in sentence_lists if len(s)), DIM)
    vectors = np.zeros((n, width, dim), dtype=np.float32)
    if junk_padding:  # masked slots must be ignored whatever they hold
        vectors[:] = unit(np.random.default_rng(7).normal(size=(n, width, dim)))
    mask = np.zeros((n, width), dtype=bool)
    for i, sents in enumerate(sentence_lists):
        if len(sents):
            vectors[i, : len(sents)] = np.stack(sents)
        mask[i, : len(sents)] = True
    texts = texts or [[f"c{i}.{j}" for j in range(len(s))] for i, s in enumerate(sentence_lists)]
    return CandidateBatch(ids=[f"p{i}" for i in range(n)], vectors=vectors, mask=mask, sentences=texts,
                          facets=[["unlabeled"] * len(s) for s in sentence_lists])


def rescore(name, q, c, **params):
    return make_rescorer(name, RescoreContext(), **params)(q, c)


# --- registry and parameters -------------------------------------------------------------------


def test_registry_lists_every_rescorer():
    assert {"none", "ts", "summax", "ot", "asym", "asym_token"} <= set(available_rescorers())
    assert make_rescorer("none") is None


def test_unknown_rescorer_names_the_choices():
    with pytest.raises(ValueError, match="unknown rescorer 'nope'.*asym_token"):
        make_rescorer("nope")


@pytest.mark.parametrize("name", ["ts", "summax", "ot", "asym", "asym_token"])
def test_unknown_parameter_is_an_error(name):
    with pytest.raises(ValueError, match="bogus"):
        make_rescorer(name, RescoreContext(encoder=FakeEncoder()), bogus=1)


@pytest.mark.parametrize("name, params, message", [
    ("ot", {"tau": 0}, "tau must be a positive number"),
    ("ot", {"lam": -1}, "lam must be a positive number"),
    ("ot", {"tau": "wide"}, "tau must be a number"),
    ("ot", {"exact": "maybe"}, "exact must be true or false"),
    ("ot", {"max_iter": 2.5}, "max_iter must be a whole number"),
    ("asym", {"d": 0}, "d must be a positive number"),
    ("asym_token", {"alpha": "nan"}, "alpha must be a positive number"),
])
def test_bad_parameter_values_are_errors(name, params, message):
    with pytest.raises(ValueError, match=message):
        make_rescorer(name, RescoreContext(encoder=FakeEncoder()), **params)


def test_parameters_given_as_strings_are_coerced():
    q, c = query(e(0)), candidates([e(0)], [e(1)])
    as_strings = rescore("ot", q, c, tau="0.5", lam="20", exact="true", max_iter="1000", tol="1e-4").scores
    np.testing.assert_allclose(as_strings, rescore("ot", q, c, exact=True).scores)
    np.testing.assert_allclose(rescore("asym", q, c, d="2").scores, rescore("asym", q, c, d=2).scores)


def test_asym_token_needs_an_encoder():
    with pytest.raises(ValueError, match="needs an encoder"):
        make_rescorer("asym_token", RescoreContext())


@pytest.mark.parametrize("name", VECTOR_RESCORERS)
def test_a_query_without_sentences_is_refused_or_empty_batches_pass(name):
    c = candidates([e(0)])
    if name in ("ot", "asym"):
        with pytest.raises(ValueError, match="no sentences"):
            rescore(name, QueryBatch(vectors=np.zeros((0, DIM), np.float32), sentences=[]), c)
    empty = CandidateBatch.from_papers([])
    assert len(empty) == 0
    if name in ("ot", "asym"):
        assert rescore(name, query(e(0)), empty).scores.shape == (0,)


# --- rankings that are obvious by construction ----------------------------------------------------------


def test_candidate_holding_the_query_sentences_ranks_first():
    q = query(e(0), e(1))
    c = candidates(
        [e(5), e(1), e(0)],  # both query sentences, in another order, plus one unrelated
        [e(0), e(6), e(7)],  # one of them
        [mix(0.6, 0, 8), mix(0.6, 1, 9)],  # loose paraphrases of both
        [e(10), e(11)],  # nothing
    )
    for name in ("summax", "ot", "asym"):
        order = list(np.argsort(-rescore(name, q, c).scores))
        assert order[0] == 0 and order[-1] == 3, name
    ts = rescore("ts", q, c).scores
    assert ts[0] == pytest.approx(1.0) and ts[1] == pytest.approx(1.0) and ts[3] < ts[2] < 1.0  # one exact pair suffices
    summax = rescore("summax", q, c).scores
    assert summax[0] == pytest.approx(1.0) and summax[1] == pytest.approx(0.5)


def test_asym_ignores_extra_candidate_sentences_while_ot_penalises_them():
    q = query(e(0), e(1))
    c = candidates([e(0), e(1)], [e(0), e(1), e(2), e(3), e(4)])
    asym = rescore("asym", q, c).scores
    assert asym[0] == pytest.approx(1.0) and asym[1] == pytest.approx(asym[0])
    for exact in (False, True):
        dist = rescore("ot", q, c, exact=exact).scores
        assert dist[0] == pytest.approx(0.0, abs=1e-6) and dist[1] < dist[0] - 0.05, exact


def test_asym_exponent_trades_coverage_for_exact_matches():
    q = query(e(0), e(1))
    c = candidates(
        [mix(0.7, 0, 2), mix(0.7, 1, 3)],  # covers both query sentences moderately: 0.7, 0.7
        [e(0), mix(0.3, 1, 4)],  # one exact match, the other barely: 1.0, 0.3
    )
    d1 = rescore("asym", q, c, d=1).scores
    d4 = rescore("asym", q, c, d=4).scores
    np.testing.assert_allclose(d1, [0.7, 0.65], atol=1e-6)
    np.testing.assert_allclose(d4, [0.7**4, (1 + 0.3**4) / 2], atol=1e-6)
    assert d1[0] > d1[1] and d4[1] > d4[0]


def test_asym_clips_negative_cosines_and_uses_query_weights():
    q = query(e(0), e(1))
    c = candidates([-e(0), -e(1)], [e(0), e(2)], [e(1), e(2)])
    assert rescore("asym", q, c).scores[0] == 0.0
    weighted = rescore("asym", query(e(0), e(1), weights=np.array([3.0, 1.0])), c).scores
    np.testing.assert_allclose(weighted, [0.0, 0.75, 0.25], atol=1e-6)
    with pytest.raises(ValueError, match="weights"):
        rescore("asym", query(e(0), e(1), weights=np.array([1.0])), c)


def test_matches_name_the_pairs_that_matched():
    q = query(e(0), e(1))
    c = candidates([e(5), e(1), e(0)])
    assert rescore("ts", q, c).matches[0][0][:2] in ((0, 2), (1, 1))
    asym = rescore("asym", q, c).matches[0]
    assert sorted(mt[:2] for mt in asym) == [(0, 2), (1, 1)] and all(mt[2] == pytest.approx(1.0) for mt in asym)
    ot_matches = rescore("ot", q, c).matches[0]
    assert {mt[:2] for mt in ot_matches[:2]} == {(0, 2), (1, 1)}
    assert ot_matches[0][2] >= ot_matches[-1][2]


# --- padding, empty candidates --------------------------------------------------------------------------


@pytest.mark.parametrize("name", VECTOR_RESCORERS)
def test_padded_candidate_scores_as_unpadded(name):
    rng = np.random.default_rng(1)
    q = query(*unit(rng.normal(size=(3, DIM))))
    short = list(unit(rng.normal(size=(2, DIM))))
    long = list(unit(rng.normal(size=(9, DIM))))
    alone = rescore(name, q, candidates(short))
    batched = rescore(name, q, candidates(long, short, width=12, junk_padding=True))
    assert batched.scores[1] == pytest.approx(alone.scores[0], abs=1e-6)
    assert [mt[:2] for mt in batched.matches[1]] == [mt[:2] for mt in alone.matches[0]]
    np.testing.assert_allclose([mt[2] for mt in batched.matches[1]], [mt[2] for mt in alone.matches[0]], atol=1e-6)
    assert all(c_idx < 2 for _, c_idx, _ in batched.matches[1])


@pytest.mark.parametrize("name", ["ot", "asym"])
def test_candidate_without_sentences_scores_minus_infinity(name):
    out = rescore(name, query(e(0)), candidates([e(0)], []))
    assert out.scores[1] == -np.inf and out.matches[1] == [] and np.isfinite(out.scores[0])


# --- optimal transport ----------------------------------------------------------------------------------


def padded_problems(seed, n=12, m=4, width=7, dim=8):
    rng = np.random.default_rng(seed)
    q = unit(rng.normal(size=(m, dim)))
    vectors = unit(rng.normal(size=(n, width, dim)) + 0.8 * q[rng.integers(0, m, size=(n, width))])
    mask = np.arange(width)[None, :] < rng.integers(1, width + 1, size=n)[:, None]
    vectors[~mask] = 0.0
    dist = pairwise_l2(q, vectors)
    a, b = ot_marginals(dist, mask, 0.5)
    return q, vectors, mask, dist, a, b


def test_pairwise_l2_matches_pot_distances():
    q, vectors, mask, dist, _, _ = padded_problems(0)
    for k in range(len(vectors)):
        np.testing.assert_allclose(dist[k][:, mask[k]], ot.dist(q.astype(np.float64), vectors[k][mask[k]].astype(np.float64),
                                                                metric="euclidean"), atol=1e-6)


def test_marginals_follow_nearest_neighbour_distances():
    _, _, mask, dist, a, b = padded_problems(1)
    np.testing.assert_allclose(a.sum(axis=1), 1.0)
    np.testing.assert_allclose(b.sum(axis=1), 1.0)
    assert (b[~mask] == 0).all() and (b[mask] > 0).all()
    k = 0
    s_q = dist[k][:, mask[k]].min(axis=1)
    np.testing.assert_allclose(a[k], np.exp(-s_q / 0.5) / np.exp(-s_q / 0.5).sum())
    _, uniform = ot_marginals(dist, mask, 1e9)
    np.testing.assert_allclose(uniform[k][mask[k]], 1.0 / mask[k].sum())


@pytest.mark.parametrize("reg", [0.5, 0.05, 0.01])
def test_batched_sinkhorn_equals_pot_per_pair(reg):
    _, _, mask, dist, a, b = padded_problems(2)
    plans = sinkhorn_batched(a, b, dist, reg, stopThr=1e-12, numItermax=100000)
    log_plans = sinkhorn_batched(a, b, dist, reg, stopThr=1e-12, numItermax=100000, method="log")
    np.testing.assert_allclose(plans, log_plans, atol=1e-12)
    for k in range(len(dist)):
        cols = mask[k]
        ref = ot.sinkhorn(a[k], b[k][cols], dist[k][:, cols], reg, stopThr=1e-12, numItermax=100000)
        np.testing.assert_allclose(plans[k][:, cols], ref, atol=1e-9)
        assert (plans[k][:, ~cols] == 0).all()


def test_big_batches_and_the_slow_tail_agree_with_pot():
    """Big active batches take the einsum path, the last few problems the matmul path: same plans."""
    _, _, mask, dist, a, b = padded_problems(13, n=70)
    plans, log = sinkhorn_batched(a, b, dist, 0.05, stopThr=1e-10, numItermax=100000, log=True)
    assert log["niter"].max() > log["niter"].min()  # some problems outlived the big batch
    np.testing.assert_allclose(plans, sinkhorn_batched(a, b, dist, 0.05, stopThr=1e-10, numItermax=100000, method="log"), atol=1e-12)
    for k in range(0, 70, 7):
        cols = mask[k]
        np.testing.assert_allclose(plans[k][:, cols], ot.sinkhorn(a[k], b[k][cols], dist[k][:, cols], 0.05, stopThr=1e-10,
                                                                   numItermax=100000), atol=1e-9)


def test_sinkhorn_stays_finite_for_tiny_reg_and_tiny_masses():
    rng = np.random.default_rng(3)
    M = 2 * rng.random((4, 3, 4))
    a = rng.dirichlet(np.ones(3), size=4)
    b = rng.dirichlet(np.ones(4), size=4)
    a[:, 0] = 1e-300  # the scaling updates underflow here: the exact log-domain fallback takes over
    a /= a.sum(axis=1, keepdims=True)
    for reg in (1e-2, 1e-3):  # exp(-M / reg) underflows to 0 for reg=1e-3
        plans, log = sinkhorn_batched(a, b, M, reg, stopThr=1e-9, numItermax=100000, log=True)
        assert np.isfinite(plans).all() and (log["err"] < 1e-9).all()
        np.testing.assert_allclose(plans, sinkhorn_batched(a, b, M, reg, stopThr=1e-9, numItermax=100000, method="log"), atol=1e-12)
        np.testing.assert_allclose(plans.sum(axis=1), b, atol=1e-12)


def test_sinkhorn_refuses_bad_shapes_and_empty_problems():
    with pytest.raises(ValueError, match="expected"):
        sinkhorn_batched(np.ones((2, 3)) / 3, np.ones((2, 4)) / 4, np.zeros((2, 4, 3)), 0.1)
    with pytest.raises(ValueError, match="mass on both sides"):
        sinkhorn_batched(np.ones((1, 2)) / 2, np.zeros((1, 3)), np.zeros((1, 2, 3)), 0.1)


def test_sinkhorn_stops_each_problem_on_its_own():
    _, _, _, dist, a, b = padded_problems(4)
    _, log = sinkhorn_batched(a, b, dist, 0.05, stopThr=1e-6, log=True)
    assert (log["err"] < 1e-6).all() and log["niter"].min() >= 10 and (log["niter"] % 10 == 0).all()
    _, capped = sinkhorn_batched(a, b, dist, 0.05, stopThr=1e-14, numItermax=25, log=True)
    assert (capped["niter"] <= 25).all() and (capped["niter"][capped["err"] >= 1e-14] == 25).all()


def test_rounding_puts_an_unconverged_plan_on_the_marginals():
    _, _, mask, dist, a, b = padded_problems(7)
    rough, log = sinkhorn_batched(a, b, dist, 0.01, numItermax=2, check_every=1, log=True)
    assert log["err"].max() > 1e-3
    fixed = round_to_marginals(rough, a, b)
    assert (fixed >= 0).all() and (fixed[np.broadcast_to(~mask[:, None, :], fixed.shape)] == 0).all()
    np.testing.assert_allclose(fixed.sum(axis=2), a, atol=1e-12)
    np.testing.assert_allclose(fixed.sum(axis=1), b, atol=1e-12)
    moved = np.abs(fixed - rough).sum(axis=(1, 2))
    col_err = np.abs(rough.sum(axis=1) - b).sum(axis=1)
    assert (moved <= 2 * (log["err"] + col_err) + 1e-12).all()
    converged = sinkhorn_batched(a, b, dist, 0.05, stopThr=1e-12)
    np.testing.assert_allclose(round_to_marginals(converged, a, b), converged, atol=1e-11)


def test_exact_emd_matches_pot():
    _, _, mask, dist, a, b = padded_problems(5)
    plans = emd_loop(a, b, dist)
    for k in range(len(dist)):
        cols = mask[k]
        np.testing.assert_allclose(plans[k][:, cols], ot.emd(a[k], b[k][cols], dist[k][:, cols]), atol=1e-12)


@pytest.mark.parametrize("seed", range(8))
def test_sinkhorn_and_exact_rank_alike(seed):
    """Candidates drift further from the query; Sinkhorn orders every pair that exact OT separates clearly."""
    rng = np.random.default_rng(seed)
    m = int(rng.integers(1, 4))
    q = unit(rng.normal(size=(m, DIM)))
    cands = [list(unit(q + 0.15 * k * rng.normal(size=(m, DIM)))) + list(unit(rng.normal(size=(int(rng.integers(0, 3)), DIM))))
             for k in range(6)]
    c = candidates(*cands)
    qb = QueryBatch(vectors=q, sentences=[""] * m)
    approx = rescore("ot", qb, c).scores
    exact = rescore("ot", qb, c, exact=True).scores
    assert np.argmax(approx) == np.argmax(exact) == 0
    for i in range(6):
        for j in range(6):
            if exact[i] > exact[j] + 0.02:
                assert approx[i] > approx[j], (i, j, approx, exact)
    assert np.corrcoef(approx, exact)[0, 1] > 0.99


@pytest.mark.parametrize("exact", [False, True])
def test_ot_plans_are_consistent_with_marginals_scores_and_matches(exact):
    q, vectors, mask, dist, a, b = padded_problems(6)
    c = candidates(*[list(vectors[i][mask[i]]) for i in range(len(vectors))])
    out = rescore("ot", QueryBatch(vectors=q, sentences=[""] * len(q)), c, exact=exact)
    plans = out.plans
    assert plans.shape == dist.shape
    np.testing.assert_allclose(plans.sum(axis=1), b, atol=1e-9)  # columns exact
    np.testing.assert_allclose(plans.sum(axis=2), a, atol=1e-9)  # rows too: Sinkhorn's plans are rounded
    assert (plans[np.broadcast_to(~mask[:, None, :], plans.shape)] == 0).all()
    np.testing.assert_allclose(out.scores, -(dist * plans).sum(axis=(1, 2)), atol=1e-9)
    for i, matches in enumerate(out.matches):
        m, k = len(q), int(mask[i].sum())
        assert 1 <= len(matches) <= m + k - 1
        masses = [mt[2] for mt in matches]
        assert masses == sorted(masses, reverse=True) and masses[0] == pytest.approx(plans[i].max())
        for qi, ci, mass in matches:
            assert 0 <= qi < m and 0 <= ci < k and mass == pytest.approx(plans[i, qi, ci])
        if exact:
            assert (plans[i] > 1e-12).sum() <= m + k - 1  # a vertex of the transport polytope
            assert sum(masses) == pytest.approx(1.0)


def test_ot_tau_controls_marginals():
    """Also a near-diagonal problem Sinkhorn converges on very slowly: the plan still meets its marginals."""
    q = query(e(0), e(1))
    c = candidates([e(0), mix(0.2, 1, 2)])
    sharp = rescore("ot", q, c, tau=0.1).plans[0].sum(axis=1)
    flat = rescore("ot", q, c, tau=1e6).plans[0].sum(axis=1)
    assert sharp[0] > 0.99 and flat == pytest.approx([0.5, 0.5], abs=1e-4)


# --- token-level asymmetric matching ------------------------------------------------------------------


class FakeEncoder:
    """Whitespace tokens, lower-cased; each word a fixed unit vector (chosen, or random per word)."""

    def __init__(self, vocab=None, dim=DIM):
        self.vocab = dict(vocab or {})
        self.dim = dim
        self.calls = []

    def vector(self, word):
        if word not in self.vocab:
            rng = np.random.default_rng(zlib.crc32(word.encode()))
            self.vocab[word] = 3 * rng.normal(size=self.dim)  # not unit: the rescorer normalises
        return np.asarray(self.vocab[word], dtype=np.float32)

    def token_vectors(self, texts, *, max_tokens=100):
        self.calls.append((list(texts), max_tokens))
        out = []
        for text in texts:
            toks = text.lower().replace(".", " ").split()[:max_tokens]
            out.append((toks, np.stack([self.vector(t) for t in toks]) if toks else np.zeros((0, self.dim), np.float32)))
        return out


class FakeBackend:
    def __init__(self, counts):
        self.counts = counts

    def token_counts(self):
        return None if self.counts is None else (dict(self.counts), sum(self.counts.values()))


def text_batch(*candidate_texts):
    """CandidateBatch carrying texts; vectors are irrelevant to asym_token."""
    return candidates(*[[e(0)] * len(t) for t in candidate_texts], texts=[list(t) for t in candidate_texts])


def token_rescore(query_texts, cands, encoder=None, backend=None, **params):
    encoder = encoder or FakeEncoder()
    r = make_rescorer("asym_token", RescoreContext(encoder=encoder, backend=backend), **params)
    return r(QueryBatch(vectors=np.stack([e(0)] * len(query_texts)), sentences=list(query_texts)), cands)


def test_asym_token_identical_sentence_scores_one_and_extra_words_cost_nothing():
    cands = text_batch(["graph neural network"], ["we train a graph neural network today"], ["cooking pasta recipes"])
    out = token_rescore(["graph neural network"], cands)
    assert out.scores[0] == pytest.approx(1.0) and out.scores[1] == pytest.approx(1.0)
    assert out.scores[2] < 0.5
    assert out.matches[1] == [(0, 0, pytest.approx(1.0))]


def test_asym_token_frequent_tokens_weigh_less():
    vocab = {w: e(i) for i, w in enumerate(["the", "graph", "a", "cat"])}
    cands = text_batch(["a graph"], ["the cat"])
    counts = {"the": 1000, "graph": 1, "a": 500, "cat": 1}
    out = token_rescore(["the graph"], cands, encoder=FakeEncoder(vocab), backend=FakeBackend(counts))
    p_the, p_graph = 1000 / 1502, 1 / 1502
    w_the, w_graph = 1e-4 / (1e-4 + p_the), 1e-4 / (1e-4 + p_graph)
    np.testing.assert_allclose(out.scores, [w_graph / (w_the + w_graph), w_the / (w_the + w_graph)])
    assert out.scores[0] > 0.99 > 0.01 > out.scores[1]
    np.testing.assert_allclose(token_frequency_weights(["the", "unseen"], counts, 1502, 1e-4), [w_the, 1.0])


def test_asym_token_estimates_frequencies_from_the_call_without_backend_counts():
    vocab = {w: e(i) for i, w in enumerate(["the", "graph", "cat", "dog"])}
    cands = text_batch(["the graph"], ["the cat"], ["the dog"])
    for backend in (None, FakeBackend(None)):
        out = token_rescore(["the graph"], cands, encoder=FakeEncoder(vocab), backend=backend)
        # distinct texts: "the graph" (query and first candidate), "the cat", "the dog": p = 3/6 and 1/6
        w_the, w_graph = 1e-4 / (1e-4 + 3 / 6), 1e-4 / (1e-4 + 1 / 6)
        np.testing.assert_allclose(out.scores, [1.0, w_the / (w_the + w_graph), w_the / (w_the + w_graph)])


def test_asym_token_exponent_and_mean_over_query_sentences():
    vocab = {"alpha": e(0), "beta": e(1), "near": mix(0.5, 0, 2)}
    cands = text_batch(["near"], ["alpha"])
    for d in (1, 4):
        out = token_rescore(["alpha", "beta"], cands, encoder=FakeEncoder(vocab), d=d)
        np.testing.assert_allclose(out.scores, [(0.5**d + 0) / 2, (1 + 0) / 2], atol=1e-6)


def test_asym_token_strips_citations_truncates_and_encodes_each_text_once():
    enc = FakeEncoder()
    cands = text_batch(["graph networks [12] work", "same text"], ["same text", "graph networks (Kipf and Welling, 2017) work"])
    token_rescore(["graph networks work (Smith et al., 2010)."], cands, encoder=enc, max_tokens=7)
    (texts, max_tokens), = enc.calls
    assert max_tokens == 7
    assert sorted(texts) == sorted(["graph networks work.", "graph networks work", "same text"])


def test_asym_token_padding_and_empty_candidates():
    counts = FakeBackend({"graph": 3, "network": 5, "a": 50, "of": 40, "roads": 2})  # fixed p(w): the batch must not matter
    solo = token_rescore(["graph network"], text_batch(["a network of roads"]), backend=counts)
    cands = text_batch(["x y z", "w", "v", "u"], ["a network of roads"], [])
    both = token_rescore(["graph network"], cands, backend=counts)
    assert both.scores[1] == pytest.approx(solo.scores[0])
    assert both.scores[2] == -np.inf and both.matches[2] == []
    # a sentence that is only a citation marker leaves no tokens: it matches nothing
    assert token_rescore(["graph"], text_batch(["[3]"])).scores[0] == 0.0
    assert token_rescore(["(Smith, 2010)"], text_batch(["graph"])).scores[0] == 0.0


def test_citation_markers():
    cases = {
        "As shown before (Smith et al., 2010; Jones and Lee, 2011a), it works.": "As shown before, it works.",
        "Graph nets [12] and trees [3, 5-7] help.": "Graph nets and trees help.",
        "Kipf and Welling (2017) propose GCNs (e.g., Hamilton, 2017).": "Kipf and Welling propose GCNs.",
        "We use a CNN (LeCun, 1998) with (ReLU) units in 2010.": "We use a CNN with (ReLU) units in 2010.",
        "Results (see Section 2) hold (in 2019).": "Results (see Section 2) hold (in 2019).",
    }
    for raw, clean in cases.items():
        assert strip_citation_markers(raw) == clean


# --- the real default model ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def encoder():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from esqbe.encode.encoder import Encoder
    from esqbe.encode.identity import ModelNotFoundError

    try:
        return Encoder.load()
    except (ModelNotFoundError, ImportError) as err:  # pragma: no cover - depends on the install
        pytest.skip(f"default model not available: {err}")


def test_asym_token_with_the_default_model_prefers_the_paraphrase(encoder):
    from esqbe.domain import Paper

    cited = "Word embeddings trained on large corpora capture semantic similarity between words (Mikolov et al., 2013)."
    cands = text_batch(
        ["The weather in the mountains was cold.", "Vector representations of words learned from big text collections reflect how similar their meanings are [4]."],
        ["We measure the thermal conductivity of copper at low temperatures.", "Samples were annealed for two hours."],
    )
    corpus = [Paper(paper_id=str(i), title="", sentences=list(s), facets=["unlabeled"] * len(s)) for i, s in enumerate(cands.sentences)]
    counts = {}
    for paper in corpus:
        for tok, n in encoder.token_counts(paper).items():
            counts[tok] = counts.get(tok, 0) + n
    for backend, d in ((None, 4), (FakeBackend(counts), 1)):  # each call encodes: keep it to two
        out = token_rescore([cited], cands, encoder=encoder, backend=backend, d=d)
        assert 0 < out.scores[1] < out.scores[0] <= 1, (backend, d, out.scores)
        assert out.matches[0][0][:2] == (0, 1)  # the paraphrase, not the weather sentence


def test_token_vectors_are_kept_by_text_within_their_bound(encoder):
    """asym_token encodes candidate sentences at query time; a text the encoder encoded before is not encoded again
    (the same vectors, read-only), and past `token_cache_bytes` the least recently used text is dropped first."""
    from esqbe.encode.encoder import TOKEN_CACHE_BYTES

    texts = ["Graph neural networks propagate node features along edges.", "We anneal the samples for two hours."]
    rows = []
    real = encoder._runner

    def counting(enc, flag):
        rows.append(len(enc["input_ids"]))
        return real(enc, flag)

    encoder._runner = counting
    encoder.forget_token_vectors()
    try:
        first = encoder.token_vectors(texts)
        assert sum(rows) == 2
        again = encoder.token_vectors([texts[1], texts[0], texts[1]])
        assert sum(rows) == 2  # nothing encoded again
        assert again[0][1] is first[1][1] and again[2][1] is first[1][1] and again[1][0] == first[0][0]
        with pytest.raises(ValueError):
            again[0][1][0, 0] = 1.0  # shared: nobody may change it
        encoder.token_cache_bytes = encoder._token_cache_held  # room for these two only
        encoder.token_vectors(["Copper."])  # shorter than either: the least recently used (texts[0]) makes room
        assert sum(rows) == 3
        encoder.token_vectors([texts[1]])
        assert sum(rows) == 3  # still kept
        np.testing.assert_allclose(encoder.token_vectors([texts[0]])[0][1], first[0][1], atol=1e-4)  # encoded again
        assert sum(rows) == 4
    finally:
        encoder._runner = real
        encoder.token_cache_bytes = TOKEN_CACHE_BYTES
