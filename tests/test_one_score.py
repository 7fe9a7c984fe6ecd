""" one score that a researcher and an engine can trust, on a real index of 120 sample abstracts with the
real model.

- over many random queries (a paper's facet or chosen sentences, a text, several examples and papers to avoid, a
  filter, shallow first stages): the headline number (`score`) never rises down the list, the percentile never
  rises and the band never improves; the JSON carries the same order;
- a paper's score is the same whatever else was found: `Index.rerank` of a query's top 30 shuffled, of subsets of
  it, and of them with unrelated papers added, gives each document exactly the query's score for that paper, in the
  same order;
- watches threshold that score: without a number a watch keeps the index's strong matches (and says so), `min_sim`
  is min_score's old name, and a taken name is refused before any other check."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest

BAND_ORDER = {"strong": 2, "fair": 1, "weak": 0, None: -1}


@pytest.fixture(scope="module")
def index120(tmp_path_factory, encoder, sample_lines):
    import esqbe

    path = tmp_path_factory.mktemp("one-score") / "index"
    src = path.parent / "papers.jsonl"
    src.write_text("\n".join(sample_lines[:120]) + "\n")
    index = esqbe.open_index(str(path), encoder=encoder, config=None)
    assert index.index_files([str(src)]).indexed == 120
    yield index
    index.close()


def _facets(paper) -> list[str]:
    return sorted({f for f in paper.facets if f in ("background", "method", "result")})


def _random_query(index, rng: random.Random, ids: list[str]) -> dict:
    pid = rng.choice(ids)
    paper = index.get([pid])[pid]
    kind = rng.choice(["facet", "sentences", "text", "examples", "filter"])
    q: dict = {"k": rng.choice([5, 10, 20, 40]), "bm25_k": rng.choice([5, 20, 100]), "knn_k": rng.choice([5, 20, 100])}
    facets = _facets(paper)
    if kind == "sentences" or not facets:
        n = len(paper.sentences)
        q.update(paper_id=pid, sentences=sorted(rng.sample(range(n), min(n, rng.randint(1, 3)))))
    elif kind == "text":
        q.update(text=" ".join(paper.sentences))
    elif kind == "examples":
        others = rng.sample([i for i in ids if i != pid], 3)
        q.update(examples=[pid, others[0]], avoid=[others[1]], facet=None)
    else:
        q.update(paper_id=pid, facet=rng.choice(facets))
        if kind == "filter":
            q["filters"] = "year>=0" if rng.random() < 0.5 else None
    return q


def test_the_headline_number_never_rises_and_the_band_never_improves_down_the_list(index120):
    rng = random.Random(48)
    ids = index120.backend.paper_ids()
    seen_bands = set()
    for _ in range(40):
        q = _random_query(index120, rng, ids)
        try:
            result = index120.query(**q)
        except Exception as e:  # a random filter no paper satisfies is an error, not a test failure
            if "filter" in str(e).lower() or "year" in str(e).lower():
                continue
            raise
        assert result.scale is not None and result.score is not None
        numbered = [h for h in result.hits if h.rank is not None]  # (likely versions follow them, unnumbered)
        assert result.hits[: len(numbered)] == numbered and all(h.likely_version_of for h in result.hits[len(numbered):])
        scores = [h.score for h in numbered]
        assert all(np.isfinite([h.score for h in result.hits])), q
        assert all(a >= b for a, b in zip(scores, scores[1:])), (q, scores)
        bands = [BAND_ORDER[h.band] for h in numbered]
        assert all(a >= b for a, b in zip(bands, bands[1:])), (q, [h.band for h in numbered])
        pcts = [h.percentile for h in numbered if h.percentile is not None]
        assert all(a >= b for a, b in zip(pcts, pcts[1:])), (q, pcts)
        seen_bands |= {h.band for h in result.hits}
        data = json.loads(json.dumps(result.to_dict()))  # what --json and POST /query print
        assert [h["score"] for h in data["hits"]] == pytest.approx([h.score for h in result.hits])
        assert [h["rank"] for h in data["hits"]] == [*range(1, len(scores) + 1), *[None] * (len(result.hits) - len(scores))]
        assert data["score"]["formula"] and data["hits"][0]["parts"]["similarity"] is not None or \
            data["hits"][0]["similarity"] is None
    assert {"strong", "weak"} <= seen_bands  # the bands were exercised, not all None


def _score_of(result) -> dict[str, float]:
    return {h.paper_id: h.score for h in result.hits}


def test_rerank_scores_each_paper_as_the_query_does(index120):
    rng = random.Random(7)
    ids = index120.backend.paper_ids()
    overrides = {"bm25_k": 10, "knn_k": 10}  # shallow first stages: many candidates come from one list only
    checked = 0
    for pid in rng.sample(ids, 8):
        facets = _facets(index120.get([pid])[pid])
        if not facets:
            continue
        facet = facets[0]
        query = f"paper:{pid} facet:{facet}"
        full = index120.query(pid, facet=facet, k=119, **overrides)  # every paper the query reaches, scored
        want = _score_of(full)
        top30 = [h.paper_id for h in full.hits[:30]]
        rest = [h.paper_id for h in full.hits[30:]]
        shuffled = rng.sample(top30, len(top30))
        subsets = [shuffled, shuffled[:12], shuffled[5:9], shuffled[-1:],
                   shuffled[:10] + rng.sample(rest, min(8, len(rest))),  # unrelated papers added
                   rng.sample(rest, min(5, len(rest))) + shuffled[20:]]
        for docs in [d for d in subsets if d]:
            got = index120.rerank(query, docs, **overrides)
            assert not got.unknown and not got.unranked
            for doc, score in zip(docs, got.scores):
                assert score == pytest.approx(want[doc], abs=1e-6), (pid, facet, doc, len(docs))
            by_rerank = [d for _, d in sorted(zip(got.scores, docs), key=lambda x: -x[0])]
            by_query = [h.paper_id for h in full.hits if h.paper_id in set(docs)]
            assert [want[d] for d in by_rerank] == pytest.approx([want[d] for d in by_query], abs=1e-6)
            checked += 1
    assert checked >= 20


def test_a_filtered_query_scores_a_paper_as_the_unfiltered_one(index120):
    ids = index120.backend.paper_ids()
    pid = ids[3]
    facet = _facets(index120.get([pid])[pid])[0]
    whole = _score_of(index120.query(pid, facet=facet, k=119))
    pool = ids[40:70]
    part = index120.query(pid, facet=facet, restrict_to=pool)
    both = [h for h in part.hits if h.paper_id in whole]  # the whole query's first stage may not reach every paper
    assert len(both) >= 20
    for h in both:
        assert h.score == pytest.approx(whole[h.paper_id], abs=1e-6)


def test_watches_threshold_the_score_and_default_to_the_index_s_strong_matches(index120, tmp_path):
    import shutil

    import esqbe
    from esqbe.index.watches import WatchError, WatchExistsError, add_watch, get_watch, strong_cut, watch_settings

    path = tmp_path / "w"
    shutil.copytree(index120.settings.path, path)
    with esqbe.open_index(str(path), encoder=index120.encoder, config=None, create=False) as index:
        pid = index.backend.paper_ids()[0]
        facet = _facets(index.get([pid])[pid])[0]
        watch, result = add_watch(index, "strong-one", paper_id=pid, facet=facet)
        assert watch.min_score is None and "strong" in watch.threshold
        cut = strong_cut(index, watch_settings(index, get_watch(index, "strong-one")))
        assert cut is not None
        strong = [h for h in result.hits if h.band == "strong"]
        assert strong and all(h.score >= cut - 1e-9 for h in strong)
        old, _ = add_watch(index, "old-flag", paper_id=pid, facet=facet, min_sim=0.25)
        assert old.min_score == 0.25 and old.to_dict()["min_sim"] == 0.25
        with pytest.raises(WatchError, match="not both"):
            add_watch(index, "both", paper_id=pid, facet=facet, min_score=0.2, min_sim=0.3)
        # a taken name is refused before anything else: not the bad threshold, the unknown paper or the bad filter
        with pytest.raises(WatchExistsError):
            add_watch(index, "strong-one", paper_id="no-such-paper", facet=facet, min_score=7.0, filters="nokey=1")


def test_watch_add_needs_no_number_and_watch_show_says_what_it_keeps(index120, tmp_path):
    import shutil

    from click.testing import CliRunner

    from cli import main

    path = str(tmp_path / "c")
    shutil.copytree(index120.settings.path, path)
    pid = index120.backend.paper_ids()[1]
    facet = _facets(index120.get([pid])[pid])[0]
    add = CliRunner().invoke(main, ["watch", "add", "plain", "--path", path, "--paper", pid, "--facet", facet])
    assert add.exit_code == 0, add.output
    assert "threshold: strong matches (score >= 0." in add.output
    show = CliRunner().invoke(main, ["watch", "show", "plain", "--path", path])
    assert show.exit_code == 0 and "threshold: strong matches (score >= 0." in show.output, show.output
    old = CliRunner().invoke(main, ["watch", "add", "old", "--path", path, "--paper", pid, "--facet", facet,
                                    "--min-sim", "0.3", "--json"])
    assert old.exit_code == 0, old.output
    made = json.loads(old.output)
    assert made["min_score"] == 0.3 and made["threshold"] == "score >= 0.3"
    again = CliRunner().invoke(main, ["watch", "add", "old", "--path", path, "--paper", "nope", "--min-score", "9"])
    assert again.exit_code != 0 and "exists already" in again.output
