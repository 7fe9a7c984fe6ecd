"""Watches of several examples and papers to avoid (on the query of several examples): `esqbe watch add` takes
`esqbe query`'s --paper ID[:FACET|:sentences=I,J] (repeated) and --not; POST /watches takes `examples` and `avoid`;
the watch keeps its own copy of every part's sentences and vectors; a run reports new papers by the combined
similarity the query itself ranks with. The real commands (in this process; test_watches.py runs them as
processes), a real server on 127.0.0.1, the real model."""
from __future__ import annotations

import json
import re
import shutil

import httpx
import numpy as np
import pytest

import esqbe
from esqbe.index.watches import add_watch, get_watch, run_watches
from esqbe.server.app import create_app
from esqbe.server.options import ServeOptions

from .conftest import SAMPLE, LiveServer, esqbe_cli

A, B, C = "csabstruct-train-0000", "csabstruct-train-0001", "csabstruct-train-0002"


def _new_papers(tmp_path, start: int = 30, n: int = 10) -> str:
    path = tmp_path / f"new{start}.jsonl"
    path.write_text("".join(line + "\n" for line in SAMPLE.read_text().splitlines()[start : start + n]))
    return str(path)


def _hits_by_id(hits) -> dict[str, dict]:
    return {h["paper_id"]: h for h in hits}


def test_watch_add_takes_several_examples_and_papers_to_avoid_and_a_run_ranks_as_the_query(tmp_path, index_dir_30,
                                                                                          encoder):
    path = tmp_path / "ix"
    shutil.copytree(index_dir_30, path)
    base = ("--path", path)
    add = esqbe_cli("watch", "add", "combo", *base, "--paper", A, "--paper", f"{B}:sentences=0,2", "--facet", "method",
                 "--not", f"{C}:result", "--min-sim", "-1", "-k", "100", "--avoid-weight", "1.5", "--json")
    assert add.returncode == 0, add.stderr
    made = json.loads(add.stdout)
    assert [e["paper_id"] for e in made["examples"]] == [A, B] and [a["paper_id"] for a in made["avoid"]] == [C]
    assert made["examples"][1]["chosen"] == [0, 2] and made["avoid"][0]["facet"] == "result"
    assert made["settings"]["avoid_weight"] == 1.5
    with esqbe.open_index(str(path), encoder=encoder, config=None, create=False) as index:
        # its own copy: each part's sentences as the query chose them, and their vectors row for row
        direct_now = index.query(examples=[A, {"paper_id": B, "sentences": [0, 2]}],
                                 avoid=[{"paper_id": C, "facet": "result"}], facet="method", k=100, avoid_weight=1.5)
        watch = get_watch(index, "combo")
        parts = [*direct_now.examples, *direct_now.avoid]
        assert [[s for _, s in p["sentences"]] for p in (*watch.examples, *watch.avoid)] == [p.sentences for p in parts]
        assert np.array_equal(watch.vectors, np.concatenate([p.paper.vectors[p.indices] for p in parts]))
        # a second watch of the same query through the library, with a threshold in the middle of what it finds
        sims = sorted(h.score for h in direct_now.hits)  # the threshold is on the score the hits are ordered by
        middle = sims[len(sims) // 2]
        add_watch(index, "half", examples=[A, {"paper_id": B, "sentences": [0, 2]}],
                  avoid=[{"paper_id": C, "facet": "result"}], facet="method", k=100, avoid_weight=1.5,
                  min_sim=middle)

    assert esqbe_cli("index", *base, _new_papers(tmp_path)).returncode == 0
    with esqbe.open_index(str(path), encoder=encoder, config=None, create=False) as index:
        direct = index.query(examples=[A, {"paper_id": B, "sentences": [0, 2]}],
                             avoid=[{"paper_id": C, "facet": "result"}], facet="method", k=100, avoid_weight=1.5)
        new_ids = {json.loads(line)["paper_id"] for line in SAMPLE.read_text().splitlines()[30:40]}
        # the examples and the avoided paper changed afterwards: the watch runs on its own copy
        index.delete_papers([A, C])
    run = esqbe_cli("watch", "run", *base, "--json")
    assert run.returncode == 0, run.stderr
    runs = {r["name"]: r for r in json.loads(run.stdout)}
    want = {h.paper_id: h for h in direct.hits if h.paper_id in new_ids}
    found = _hits_by_id(runs["combo"]["matches"])
    assert set(found) == set(want) == new_ids  # min_sim -1, k 100: every new paper
    for pid, hit in found.items():  # the combined similarity, each example's and the avoided paper's, as the query
        assert hit["similarity"] == pytest.approx(want[pid].similarity, abs=1e-5)
        assert hit["example_similarities"] == pytest.approx(want[pid].example_similarities, abs=1e-5)
        assert hit["avoided"][0]["paper_id"] == C
        assert hit["avoided"][0]["penalty"] == pytest.approx(want[pid].avoided[0].penalty, abs=1e-5)
        # matched pairs name each example's own sentence numbers (B's are 0 and 2)
        assert {m["query_index"] for m in hit["matches"] if m["example"] == 1} <= {0, 2}
    assert any(h.avoided[0].penalty > 0 for h in want.values())  # the avoided paper did pull some down
    half = {m["paper_id"] for m in runs["half"]["matches"]}
    assert half == {pid for pid, h in want.items() if h.score >= middle} and 0 < len(half) < len(want)

    text = esqbe_cli("watch", "run", *base, "--dry-run")  # nothing new since: the text says so; then one more paper
    assert text.returncode == 0 and "watch combo: 0 new paper(s)" in text.stdout, text.stderr
    assert esqbe_cli("index", *base, _new_papers(tmp_path, 40, 1)).returncode == 0
    text = esqbe_cli("watch", "run", "combo", *base, "--dry-run")
    assert "watch combo: 1 new paper(s), 1 match(es)" in text.stdout, text.stdout
    assert re.search(r"\n +example [12] query \[\d+\] ", text.stdout), text.stdout  # which example each pair is of
    show = esqbe_cli("watch", "show", "combo", *base)
    assert show.returncode == 0 and f"not like paper {C}, facet result" in show.stdout, show.stderr
    listed = esqbe_cli("watch", "list", *base)
    assert f"paper {A}, facet method; paper {B}, chosen sentences; not paper {C}, facet result" in listed.stdout


def test_watch_add_refuses_what_the_query_refuses(tmp_path, index_dir_30):
    path = tmp_path / "ix"
    shutil.copytree(index_dir_30, path)
    for args, words in (((("--paper", A), ("--paper", A)), "given twice as examples"),
                        ((("--paper", A), ("--not", A)), "both an example and to avoid"),
                        ((("--paper", A), ("--paper", B), ("--sentences", "0,1")), "choose sentences per paper"),
                        ((("--paper", A), ("--not", f"{C}:sentences=1")), "takes a facet"),
                        ((("--paper", A), ("--not", "no-such-paper")), "no-such-paper is not in the index")):
        flags = [x for pair in args for x in pair]
        bad = esqbe_cli("watch", "add", "w", "--path", path, *flags, "--min-sim", "0.5")
        assert bad.returncode != 0 and words in bad.stderr and "Traceback" not in bad.stderr, (flags, bad.stderr)
    assert esqbe_cli("watch", "list", "--path", path).stdout.startswith("no watches")


def test_post_watches_takes_examples_and_avoid_on_a_real_server(tmp_path, index_dir_30, encoder, browser):
    feedparser = pytest.importorskip("feedparser")
    path = tmp_path / "ix"
    shutil.copytree(index_dir_30, path)
    body = {"name": "web", "min_sim": -1.0, "k": 100, "facet": "method",
            "examples": [{"paper_id": A}, {"text": "We train a parser with a neural network. It is evaluated on "
                                                   "treebanks.", "title": "A parser", "sentences": [0, 1]}],
            "avoid": [{"paper_id": C}]}
    with LiveServer(create_app(str(path), config=None, options=ServeOptions(host="127.0.0.1"), encoder=encoder)) as url:
        r = httpx.post(url + "/watches", json=body, timeout=120)
        assert r.status_code == 200, r.text
        made = r.json()
        assert [e["paper_id"] for e in made["examples"]] == [A, None] and made["avoid"][0]["paper_id"] == C
        assert made["examples"][1]["title"] == "A parser" and made["feed"].startswith("watches/web.atom?key=")
        for bad, status, words in (
                ({**body, "name": "t", "avoid": [{"paper_id": A}]}, 400, "both an example and to avoid"),
                ({**body, "name": "t", "examples": [{"paper_id": A}, {"paper_id": A}]}, 400, "given twice"),
                ({**body, "name": "t", "avoid": [{"text": "x"}]}, 422, ""),
                ({**body, "name": "t", "examples": [{"paper_id": A, "facet": "method", "sentences": [0]}]}, 422, ""),
                ({**body, "name": "t", "examples": [{"text": "A sentence. " * 2000}]}, 413, "2000 sentences; at most 64"),
                ({**body, "name": "web"}, 409, "exists already")):
            r = httpx.post(url + "/watches", json=bad, timeout=120)
            assert r.status_code == status and words in r.text, (bad, r.status_code, r.text)
        listed = httpx.get(url + "/watches").json()
        assert [w["name"] for w in listed] == ["web"] and listed[0]["avoid"][0]["paper_id"] == C
        # a single paper with papers to avoid needs no `examples`
        r = httpx.post(url + "/watches", json={"name": "one", "paper_id": B, "facet": "method", "min_sim": -1.0,
                                               "avoid": [{"paper_id": C}]}, timeout=120)
        assert r.status_code == 200 and r.json()["examples"][0]["paper_id"] == B, r.text
        with esqbe.open_index(str(path), encoder=encoder, config=None) as index:
            index.index_files([_new_papers(tmp_path, 30, 4)])
            runs = {r.name: r for r in run_watches(index, now=5000.0)}
            web = get_watch(index, "web")
        assert len(runs["web"].matches) == 4 and all(len(m["example_similarities"]) == 2 for m in runs["web"].matches)
        assert web.vectors.shape[0] == sum(len(p["sentences"]) for p in (*web.examples, *web.avoid))
        feed = feedparser.parse(httpx.get(url + "/watches/web.atom").content)
        assert not feed.bozo and len(feed.entries) == 4
        assert feed.feed.subtitle == (f"papers like “paper {A}” in its method, “A parser”; unlike “paper {C}” "
                                      "in its method, score >= -1")  # titles (these papers have none)
        # the page's watch list names every example and the paper to avoid (real Chromium)
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support import expected_conditions as EC
        from selenium.webdriver.support.ui import WebDriverWait

        browser.get(url + "/")
        listed = WebDriverWait(browser, 60).until(
            EC.visibility_of_element_located((By.CSS_SELECTOR, '#watch-list .watch[data-watch="web"]')))
        assert f"paper {A}, method; text “A parser”; not paper {C}, method, score >= -1" in listed.text, listed.text
        assert "4 found" in listed.text
        # a paper with a title is named by it, cut at a word past 60 characters, as the feed names it
        src = json.loads(SAMPLE.read_text().splitlines()[40])
        title = "Scientific papers <b>faceted</b> by background, method and result, and found again by example"
        (tmp_path / "titled.jsonl").write_text(json.dumps({"id": "titled", "title": title, "abstract": src["sentences"],
                                                          "facets": src["labels"]}) + "\n")
        with esqbe.open_index(str(path), encoder=encoder, config=None) as index:
            index.index_files([str(tmp_path / "titled.jsonl")])
        r = httpx.post(url + "/watches", json={"name": "named", "paper_id": "titled", "facet": "method", "min_sim": -1.0},
                       timeout=120)
        assert r.status_code == 200, r.text
        browser.get(url + "/")
        named = WebDriverWait(browser, 60).until(
            EC.visibility_of_element_located((By.CSS_SELECTOR, '#watch-list .watch[data-watch="named"]')))
        short = "Scientific papers <b>faceted</b> by background, method and…"
        assert f"“{short}”, method, score >= -1" in named.text and "paper titled" not in named.text, named.text
        feed = feedparser.parse(httpx.get(url + "/" + r.json()["feed"]).content)
        assert feed.feed.subtitle == f"papers like “{short}” in its method, score >= -1"
