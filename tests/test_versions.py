"""Versions told apart (esqbe.query.versions) on a real index: a re-titled copy of the query paper (a preprint and its
journal version) and a copy of a hit are marked `likely_version_of` and listed after the numbered hits, in the CLI's
JSON and text, on the page in Chromium and in the exports' notes; their scores are the ones they get alone; a watch
never reports a version of its example."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

import esqbe
from cli import main
from esqbe.query.versions import AMONG_HITS, VERSION_OVERLAP, overlap_matrix, sentence_overlap, split_versions

from .conftest import SAMPLE

RECORDS = [json.loads(line) for line in SAMPLE.read_text().splitlines()[:40]]
QID = RECORDS[0]["paper_id"]
K = 5


def _copy(record: dict, pid: str, title: str) -> dict:
    return {"id": pid, "title": title, "abstract": record["sentences"], "facets": record["labels"]}


@pytest.fixture(scope="module")
def index_copy(index_dir_30, encoder, tmp_path_factory):
    """The 30-paper index with a re-titled copy of the query paper and a copy of its best hit (this module's own
    `index_copy`: the page server of tests/conftest.py serves it)."""
    path = tmp_path_factory.mktemp("versions") / "index"
    shutil.copytree(index_dir_30, path)
    with esqbe.open_index(str(path), encoder=encoder, config=None) as index:
        best = index.query(QID, facet="method", k=1).hits[0].paper_id
        record = next(r for r in RECORDS if r["paper_id"] == best)
        source = path.parent / "versions.jsonl"
        source.write_text(json.dumps(_copy(RECORDS[0], "journal-version", "A Journal Version of the Query Paper"))
                          + "\n" + json.dumps(_copy(record, "hit-copy", "The Best Hit, Again")) + "\n")
        assert index.index_files([str(source)]).indexed == 2
    path.joinpath("best-hit").write_text(best)
    return path


def _query(path, *args) -> CliRunner:
    r = CliRunner().invoke(main, ["query", "--path", str(path), "--paper", QID, "--facet", "method", "-k", str(K),
                                  "--no-server", *args], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return r


def test_the_overlap_is_batched_and_means_nearly_the_same_sentences():
    rng = np.random.default_rng(0)

    def unit(n):
        x = rng.normal(size=(n, 16)).astype(np.float32)
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    papers = [unit(n) for n in (3, 1, 6, 4)]
    others = [unit(2), papers[2], np.zeros((0, 16), np.float32), unit(5)]
    got = overlap_matrix(papers, others, chunk=5)  # slices of a few sentences: the same as one product
    for i, a in enumerate(papers):
        for j, b in enumerate(others):
            want = -1.0 if not len(b) else min((a @ b.T).max(1).mean(), (a @ b.T).max(0).mean())
            assert got[i, j] == pytest.approx(want, abs=1e-6)
    assert sentence_overlap(papers[2], papers[2]) == pytest.approx(1.0, abs=1e-6)
    extra = np.concatenate([papers[2], unit(1)])  # one sentence added: no longer every sentence's twin
    assert sentence_overlap(extra, papers[2]) < sentence_overlap(papers[2], papers[2])
    numbered, versions = split_versions([papers[0], papers[2], extra, papers[3]], ["a", "b", "c", "d"],
                                        [("q", papers[3])], k=2, threshold=0.9)
    assert numbered == [0, 1] and versions == {}  # the first two: nothing repeats them
    numbered, versions = split_versions([papers[0], papers[2], papers[2], papers[3]], ["a", "b", "c", "d"],
                                        [("q", papers[3])], k=3, threshold=0.9)
    assert numbered == [0, 1] and set(versions) == {2, 3}  # c repeats b; d repeats the query; the list ran out
    assert versions[2][0] == "b" and versions[3][0] == "q"
    many = [unit(3) for _ in range(AMONG_HITS + 5)] + [papers[3]]  # past the hits compared with each other
    numbered, versions = split_versions(many, [str(i) for i in range(len(many))], [("q", papers[3])], k=len(many),
                                        threshold=0.9)
    assert numbered == list(range(len(many) - 1)) and versions == {len(many) - 1: ("q", pytest.approx(1.0))}


def test_a_retitled_copy_of_the_query_paper_is_marked_and_out_of_the_numbering(index_copy, encoder):
    best = index_copy.joinpath("best-hit").read_text()
    answer = json.loads(_query(index_copy, "--json").stdout)
    hits = answer["hits"]
    numbered = [h for h in hits if h["rank"] is not None]
    versions = [h for h in hits if h["rank"] is None]
    assert [h["rank"] for h in numbered] == list(range(1, K + 1)) and hits[:K] == numbered  # the versions after
    assert {h["paper_id"] for h in numbered}.isdisjoint({"journal-version", "hit-copy"})
    by_id = {h["paper_id"]: h for h in versions}
    assert by_id["journal-version"]["likely_version_of"] == QID
    assert by_id["journal-version"]["version_overlap"] >= VERSION_OVERLAP
    assert numbered[0]["paper_id"] == best and by_id["hit-copy"]["likely_version_of"] == best
    assert all(h["likely_version_of"] is None for h in numbered)
    # the mark is a presentation: each version's score is the one it gets alone
    with esqbe.open_index(str(index_copy), encoder=encoder, config=None, create=False) as index:
        for pid in ("journal-version", "hit-copy"):
            [alone] = index.query(QID, facet="method", restrict_to=[pid]).hits
            assert alone.score == pytest.approx(by_id[pid]["score"], abs=1e-6)
            assert alone.likely_version_of == (QID if pid == "journal-version" else None)  # no better hit to repeat
    text = _query(index_copy).stdout
    head, _, tail = text.partition("likely versions of the query or of a hit above")
    assert tail and "journal-version" not in head and "hit-copy" not in head
    assert f"  -. score {by_id['journal-version']['score']:.4f}" not in text  # a version has no rank, not "-."
    assert f"  - score {by_id['journal-version']['score']:.4f}" in tail
    assert f"likely a version of {QID} (nearly the same sentences" in tail
    assert f"likely a version of {best} (nearly the same sentences" in tail
    bib = _query(index_copy, "--format", "bibtex").stdout
    assert f"note = {{esqbe: likely a version of {QID} (nearly the same sentences)}}" in bib


def test_the_page_marks_a_version_and_leaves_it_unnumbered(page_server, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(page_server + f"/#paper={QID}&facet=method&k={K}")
    WebDriverWait(browser, 60).until(lambda b: b.find_elements(By.CSS_SELECTOR, "#hits .hit.version .version-mark"))
    items = browser.find_elements(By.CSS_SELECTOR, "#hits > li")
    kinds = ["head" if "versions-head" in i.get_attribute("class") else
             "version" if "version" in i.get_attribute("class").split() else "hit" for i in items]
    assert kinds == ["hit"] * K + ["head"] + ["version"] * (len(kinds) - K - 1), kinds
    version = browser.find_element(By.CSS_SELECTOR, '#hits .hit[data-paper-id="journal-version"]')
    mark = version.find_element(By.CSS_SELECTOR, ".version-mark")
    assert mark.get_attribute("data-version-of") == QID and "likely a version of" in mark.text
    assert version.find_element(By.CSS_SELECTOR, ".hit-rank").text == "–"
    ranks = [h.find_element(By.CSS_SELECTOR, ".hit-rank").text for h in browser.find_elements(By.CSS_SELECTOR,
                                                                                              "#hits .hit:not(.version)")]
    assert ranks == [f"{n}." for n in range(1, K + 1)]
    assert f"{K} papers (and " in browser.find_element(By.ID, "results-info").text


def test_a_watch_never_reports_a_version_of_its_example(index_dir_30, encoder, tmp_path):
    from esqbe.index.watches import add_watch, run_watches

    path = tmp_path / "ix"
    shutil.copytree(index_dir_30, path)
    with esqbe.open_index(str(path), encoder=encoder, config=None) as index:
        add_watch(index, "mine", paper_id=QID, facet="method", min_score=-1.0, k=40)
        source = tmp_path / "new.jsonl"
        fresh = [RECORDS[30], RECORDS[31]]
        source.write_text("".join(json.dumps(_copy(r, f"new-{i}", f"New paper {i}")) + "\n" for i, r in enumerate(fresh))
                          + json.dumps(_copy(RECORDS[0], "journal-version", "A Journal Version")) + "\n")
        index.index_files([str(source)])
        [run] = run_watches(index, dry_run=True)
        assert run.new_papers == 3 and sorted(m["paper_id"] for m in run.matches) == ["new-0", "new-1"], run.matches
        scored = index.query(QID, facet="method", restrict_to=["journal-version"]).hits[0]
        assert scored.score > max(m["score"] for m in run.matches)  # it passed the threshold, and was left out
