"""Querying a real small index: facets, chosen sentences, text queries, rescorers, errors."""
from __future__ import annotations

import json

import numpy as np
import pytest

import esqbe
from esqbe.query.results import QueryError

from .conftest import SAMPLE

FIRST = json.loads(SAMPLE.read_text().splitlines()[0])
QID = FIRST["paper_id"]


def test_facet_query_uses_the_facet_sentences_and_excludes_the_query_paper(small_index):
    result = small_index.query(QID, facet="method", k=5)
    method_idx = [i for i, lab in enumerate(FIRST["labels"]) if lab == "method"]
    assert [i for i, _ in result.query_sentences] == method_idx
    assert len(result.hits) == 5
    assert QID not in [h.paper_id for h in result.hits]
    assert [h.rank for h in result.hits] == [1, 2, 3, 4, 5]
    scores = [h.score for h in result.hits]
    assert scores == sorted(scores, reverse=True)
    for h in result.hits:
        assert h.matches, "every hit explains itself with a matched sentence pair"
        m = h.matches[0]
        assert m.query_index in method_idx
        assert m.candidate_sentence in small_index.backend.get([h.paper_id])[h.paper_id].paper.sentences


def test_summax_score_is_mean_best_cosine(small_index):
    result = small_index.query(QID, facet="background", k=3, rescorer="summax", candidate_facet="all", final_bm25_weight=0)
    q = small_index.backend.get([QID])[QID]
    idx = [i for i, _ in result.query_sentences]
    for h in result.hits:
        c = small_index.backend.get([h.paper_id])[h.paper_id]
        expected = (q.vectors[idx] @ c.vectors.T).max(axis=1).mean()
        assert h.score == pytest.approx(expected, abs=1e-5)


def test_ts_score_is_best_single_pair(small_index):
    result = small_index.query(QID, facet="method", k=3, rescorer="ts", candidate_facet="all", final_bm25_weight=0)
    q = small_index.backend.get([QID])[QID]
    idx = [i for i, _ in result.query_sentences]
    for h in result.hits:
        c = small_index.backend.get([h.paper_id])[h.paper_id]
        assert h.score == pytest.approx((q.vectors[idx] @ c.vectors.T).max(), abs=1e-5)


def test_a_paper_finds_its_own_sentences_first(small_index):
    """Definition 2 with a text query: a paper's own abstract, given as text, scores that paper highest; it is the
    text's likely version (esqbe.query.versions), listed after the 3 numbered hits."""
    other = small_index.backend.get(["csabstruct-train-0007"])["csabstruct-train-0007"]
    result = small_index.query(text=list(other.paper.sentences), k=3)
    best = max(result.hits, key=lambda h: h.score)
    assert best.paper_id == "csabstruct-train-0007" and best.score > 0.95
    assert (best.rank, best.likely_version_of) == (None, "(text)") and result.hits[-1] is best
    assert [h.rank for h in result.hits[:3]] == [1, 2, 3]


def test_same_facet_query_matches_candidate_sentences_of_that_facet(small_index):
    """candidate_facet=same: the matched candidate sentence carries the query's facet, and a
    candidate without any such sentence ranks below every candidate that has one (before BM25 fusion)."""
    result = small_index.query(QID, facet="result", k=39, final_bm25_weight=0, candidate_facet="same", bm25_text="abstract")
    has = [("result" in small_index.backend.get([h.paper_id])[h.paper_id].paper.facets) for h in result.hits]
    assert any(has) and not all(has)
    assert has == sorted(has, reverse=True)
    for h, ok in zip(result.hits, has):
        if ok:
            assert all(m.candidate_facet == "result" for m in h.matches)
    idx = [i for i, _ in result.query_sentences]
    q = small_index.backend.get([QID])[QID]
    top = small_index.backend.get([result.hits[0].paper_id])[result.hits[0].paper_id]
    rows = [i for i, f in enumerate(top.paper.facets) if f == "result"]
    assert result.hits[0].score == pytest.approx((q.vectors[idx] @ top.vectors[rows].T).max(1).mean(), abs=1e-5)


def test_chosen_sentences_query(small_index):
    result = small_index.query(QID, sentences=[0, 2], k=4)
    assert [i for i, _ in result.query_sentences] == [0, 2]
    assert {m.query_index for h in result.hits for m in h.matches} <= {0, 2}


def test_candidate_facet_same_only_matches_that_facet_in_first_stage(small_index):
    result = small_index.query(QID, facet="result", k=5, candidate_facet="same", rescorer="none")
    for h in result.hits:
        if h.knn:
            stored = small_index.backend.get([h.paper_id])[h.paper_id].paper
            assert "result" in stored.facets


def test_restrict_to_ranks_the_whole_pool_and_nothing_else(small_index):
    pool = [f"csabstruct-train-{i:04d}" for i in (3, 9, 12, 30, 31)]
    result = small_index.query(QID, facet="method", restrict_to=pool, k=2)
    assert sorted(h.paper_id for h in result.hits) == sorted(pool)


def test_query_errors_are_precise(small_index):
    with pytest.raises(QueryError, match="not in the index"):
        small_index.query("no-such-paper", facet="method")
    with pytest.raises(QueryError, match="sentences 0..8"):
        small_index.query(QID, sentences=[0, 99])
    with pytest.raises(QueryError, match="either a facet or sentence"):
        small_index.query(QID, facet="method", sentences=[0])
    with pytest.raises(ValueError, match="unknown rescorer"):
        small_index.query(QID, facet="method", rescorer="nope")
    no_result = next(p for p, ip in small_index.backend.get([f"csabstruct-train-{i:04d}" for i in range(40)]).items()
                     if "result" not in ip.paper.facets)
    with pytest.raises(QueryError, match="no sentence labelled 'result'"):
        small_index.query(no_result, facet="result")


def test_unlabeled_paper_facet_query_says_so(tmp_path, encoder, write_jsonl):
    src = write_jsonl("p.jsonl", [
        {"id": "u1", "title": "Graph cuts", "abstract": "We study graph cuts. We propose a new solver. It is fast."},
        {"id": "u2", "title": "Parsing", "abstract": "Parsing is hard. We use a neural parser. Accuracy improves."},
    ])
    index = esqbe.open_index(str(tmp_path / "ix"), encoder=encoder)
    index.index_files([str(src)], facets="none")
    assert index.backend.get(["u1"])["u1"].paper.facets == ["unlabeled"] * 3
    with pytest.raises(QueryError, match="no facet labels"):
        index.query("u1", facet="method")
    assert index.query("u1", sentences=[1]).hits[0].paper_id == "u2"


def test_query_on_an_empty_index(tmp_path):
    index = esqbe.open_index(str(tmp_path / "empty"))
    with pytest.raises(QueryError, match="index is empty"):
        index.query("x", facet="method")


def test_abstract_weight_fuses_whole_abstract_similarity(small_index):
    """abstract_weight=1: the ranking is by the cosine of mean query-facet vector and mean candidate vector."""
    result = small_index.query(QID, facet="method", k=5, rescorer="summax", final_bm25_weight=0, abstract_weight=1.0)
    q = small_index.backend.get([QID])[QID]
    qv = q.vectors[[i for i, _ in result.query_sentences]].mean(axis=0)
    qv /= np.linalg.norm(qv)
    ids = [h.paper_id for h in result.hits]
    cands = small_index.backend.get(ids)
    sims = [float(cands[p].vectors.mean(axis=0) @ qv / np.linalg.norm(cands[p].vectors.mean(axis=0))) for p in ids]
    assert sims == sorted(sims, reverse=True)
    # the full ranking: nothing outside the hits is closer than the last hit
    everything = small_index.query(QID, facet="method", k=39, final_bm25_weight=0, abstract_weight=1.0)
    assert [h.paper_id for h in everything.hits[:5]] == ids
    with pytest.raises(QueryError, match="sum to at most 1"):
        small_index.query(QID, facet="method", final_bm25_weight=0.5, abstract_weight=0.6)


def test_facet_settings_apply_to_their_facet_only(small_index):
    from esqbe.index.api import Index

    tuned = Index(small_index.backend, small_index.settings.replace(
        facet_settings={"method": {"rescorer": "ts", "final_bm25_weight": 0.0, "candidate_facet": "all"}}), small_index.encoder)
    plain_ts = small_index.query(QID, facet="method", k=5, rescorer="ts", final_bm25_weight=0.0, candidate_facet="all")
    method = tuned.query(QID, facet="method", k=5)
    assert method.rescorer == "ts"
    assert [(h.paper_id, h.score) for h in method.hits] == [(h.paper_id, h.score) for h in plain_ts.hits]
    assert tuned.query(QID, facet="result", k=5).rescorer == small_index.settings.rescorer
    # a per-call setting wins over the facet's entry
    assert tuned.query(QID, facet="method", k=5, rescorer="summax").rescorer == "summax"
    for bad, msg in (({"methods": {"k": 3}}, "unknown facet"), ({"method": {"model": "x"}}, "cannot be set per facet")):
        broken = Index(small_index.backend, small_index.settings.replace(facet_settings=bad), small_index.encoder)
        with pytest.raises(QueryError, match=msg):
            broken.query(QID, facet="method", k=3)


def test_soft_candidate_facets_penalise_other_facets(small_index):
    """candidate_facet=soft: summax over all candidate sentences, a sentence of another facet losing
    facet_penalty (hard labels: probability 0 or 1); penalty 0 is `all`, a huge penalty is `same`."""
    q = small_index.backend.get([QID])[QID]
    common = dict(facet="method", k=39, rescorer="summax", final_bm25_weight=0)
    soft = small_index.query(QID, candidate_facet="soft", facet_penalty=0.2, **common)
    idx = [i for i, _ in soft.query_sentences]
    for h in soft.hits[:5]:
        c = small_index.backend.get([h.paper_id])[h.paper_id]
        pen = np.array([0.0 if f == "method" else 0.2 for f in c.paper.facets])
        expected = ((q.vectors[idx] @ c.vectors.T) - pen[None, :]).max(axis=1).mean()
        assert h.score == pytest.approx(expected, abs=1e-5)
    zero = small_index.query(QID, candidate_facet="soft", facet_penalty=0.0, **common)
    assert [h.paper_id for h in zero.hits] == [h.paper_id for h in small_index.query(QID, candidate_facet="all", **common).hits]
    from esqbe.settings.config import ConfigError

    with pytest.raises((QueryError, ConfigError), match="facet_penalty"):  # settings are checked where given
        small_index.query(QID, candidate_facet="soft", facet_penalty=-1, **common)


def test_auto_candidate_facets_are_soft_for_predicted_labels_and_same_for_given(tmp_path, encoder, sample_lines):
    """candidate_facet=auto (the default): a candidate whose labels the tagger predicted is matched with
    all its sentences, another facet's sentence losing facet_penalty x (1 - p(facet)); one with given
    labels only with its sentences of the query's facet. A query paper with predicted labels contributes
    the sentences whose facet probability reaches query_facet_threshold."""
    import json

    import esqbe
    from esqbe.query.search import facet_probability

    rows = [json.loads(line) for line in sample_lines[:24]]
    given = rows[:12]
    plain = [{"id": r["paper_id"], "title": r.get("title", ""), "abstract": " ".join(r["sentences"])} for r in rows[12:]]
    for name, part in (("given.jsonl", given), ("plain.jsonl", plain)):
        (tmp_path / name).write_text("\n".join(json.dumps(r) for r in part) + "\n")
    index = esqbe.open_index(str(tmp_path / "ix"), encoder=encoder, config=None)
    report = index.index_files([str(tmp_path / "given.jsonl"), str(tmp_path / "plain.jsonl")])
    assert (report.indexed, report.tagged, report.errors) == (24, len(plain), [])
    assert index.settings.candidate_facet == "auto" and index.settings.query_facet_threshold == 0.3

    def expected(query, idx, pid, soft):
        c = index.backend.get([pid])[pid]
        if soft:
            sims = query.vectors[idx] @ c.vectors.T - 0.2 * (1 - facet_probability(c.paper, "method"))[None, :]
        else:
            keep = c.paper.facet_indices("method")
            if not keep:
                return None
            sims = query.vectors[idx] @ c.vectors[keep].T
        return float(sims.max(axis=1).mean())

    common = dict(facet="method", k=23, rescorer="summax", final_bm25_weight=0)
    for qid in (given[0]["paper_id"], plain[0]["id"]):
        q = index.backend.get([qid])[qid]
        res = index.query(qid, **common)
        idx = [i for i, _ in res.query_sentences]
        if qid == plain[0]["id"]:  # predicted labels: every sentence with p(method) >= 0.3
            p = facet_probability(q.paper, "method")
            assert idx == ([i for i in range(len(p)) if p[i] >= 0.3] or [int(np.argmax(p))])
        else:
            assert idx == q.paper.facet_indices("method")
        kinds = set()
        for h in res.hits:
            soft = "facet_probs" in h.metadata
            want = expected(q, idx, h.paper_id, soft)
            if want is not None:
                kinds.add(soft)
                assert h.score == pytest.approx(want, abs=1e-5), (qid, h.paper_id, soft)
        assert kinds == {True, False}  # both kinds of candidate were ranked
    index.close()


def test_text_query_sentences_follow_the_taggers_probabilities(small_index):
    """A query text is labelled by the tagger like an unlabelled paper: its sentences with p(facet) >=
    query_facet_threshold form a facet query (0: its hard labels)."""
    from esqbe.domain import Paper
    from esqbe.query.search import facet_probability

    q = small_index.backend.get([QID])[QID].paper
    labels, probs = small_index.tagger.tag_with_probabilities([Paper("query", "", list(q.sentences))])
    text = Paper("query", "", list(q.sentences), labels[0], {"facet_probs": probs[0]})
    checked = 0
    for facet in ("background", "method", "result"):
        p = facet_probability(text, facet)
        soft = [i for i in range(len(p)) if p[i] >= 0.3]
        hard = [i for i, f in enumerate(labels[0]) if f == facet]
        if soft:
            res = small_index.query(text=list(q.sentences), facet=facet, k=3)
            assert [i for i, _ in res.query_sentences] == soft
            checked += 1
        if hard:
            res = small_index.query(text=list(q.sentences), facet=facet, k=3, query_facet_threshold=0)
            assert [i for i, _ in res.query_sentences] == hard
        elif not soft:
            with pytest.raises(QueryError, match=f"has no {facet} sentence"):
                small_index.query(text=list(q.sentences), facet=facet, k=3)
    assert checked >= 2


def test_soft_labels_come_from_the_taggers_probabilities():
    from esqbe.domain import Paper
    from esqbe.query.search import facet_probability

    p = Paper("p", "", ["a.", "b."], ["method", "result"], {"facet_probs": [[0.1, 0.6, 0.2, 0.1], [0.0, 0.3, 0.7, 0.0]]})
    assert facet_probability(p, "method").tolist() == [0.6, 0.3]
    p.metadata["facet_probs"] = [[0.1]]  # malformed: the hard labels decide
    assert facet_probability(p, "method").tolist() == [1.0, 0.0]


def test_bm25_text_facet_scores_the_candidates_facet_sentences(small_index):
    """bm25_text=facet: BM25 over each candidate's sentences of the query's facet; a candidate whose
    only match is outside that facet gets no BM25 score."""
    res = small_index.query(QID, facet="method", k=39, rescorer="none", fusion="bm25", bm25_text="facet", final_bm25_weight=0)
    whole = small_index.query(QID, facet="method", k=39, rescorer="none", fusion="bm25", final_bm25_weight=0, bm25_text="abstract")
    assert [h.bm25 for h in res.hits] != [h.bm25 for h in whole.hits]
    q = small_index.backend.get([QID])[QID].paper
    words = {w.lower().strip(".,;:()") for i in q.facet_indices("method") for w in q.sentences[i].split()}
    for h in res.hits:
        if h.bm25 > 0:
            c = small_index.backend.get([h.paper_id])[h.paper_id].paper
            text = " ".join(c.sentences[i] for i in c.facet_indices("method")).lower()
            assert text and any(w and w in text for w in words)
    from esqbe.settings.config import ConfigError

    with pytest.raises((QueryError, ConfigError), match="bm25_text"):  # settings are checked where given
        small_index.query(QID, facet="method", bm25_text="title")


def test_k_past_the_first_stage_lists_reaches_k_and_fewer_hits_say_why(small_index, tmp_path):
    """k past knn_k and bm25_k: each list reaches k, so k hits come back where the index holds them (the lists stopped
    at their own depth and the query returned fewer, unsaid); fewer than k (a small index) is said, in the JSON's
    notes and on stderr."""
    from click.testing import CliRunner

    from cli import main

    shallow = small_index.query(QID, k=20, knn_k=3, bm25_k=3, candidate_facet="all")
    assert len(shallow.hits) == 20 and not shallow.notes, (len(shallow.hits), shallow.notes)
    deep = small_index.query(QID, k=20, candidate_facet="all")
    assert {h.paper_id: h.score for h in shallow.hits} == pytest.approx({h.paper_id: h.score for h in deep.hits},
                                                                        abs=1e-6)  # the same papers, the same scores
    r = CliRunner().invoke(main, ["query", "--path", small_index.settings.path, "--paper", QID, "-k", "250", "--json",
                                  "--no-server"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    answer = json.loads(r.stdout)
    assert len(answer["hits"]) == 39
    [note] = answer["notes"]
    assert note.startswith("39 hit(s) of the 250 asked: the first stage found no more candidates (the index holds 40 "
                           "paper(s); 1 excluded"), note
    assert f"esqbe: note: {note}" in r.stderr
