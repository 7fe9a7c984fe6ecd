"""The page in real headless Chromium, against a real server over a real index with metadata:

- every key of the address table (docs/serving.md) round-trips: opened, the page's state shows it, and the address the
  page writes back after the query holds it again;
- no download button before a query has hits;
- the active filters are in the query summary;
- a pasted text's sentences are all listed and clickable before any query and after a facet query;
- a hit's similarity is placed where the server put it, on the index's own matches (weak / fair / strong, its
  percentile), and against this query's best hit;
- the score line labels each number and says what it is."""
from __future__ import annotations

import json
import math
import re
from urllib.parse import parse_qsl, urlencode

import httpx
import pytest

from esqbe.server.app import create_app
from esqbe.server.options import ServeOptions

from .conftest import REPO, LiveServer
from .test_page_states import RECORDS, TEXT, _hits, _no_severe_log, _pressed, _wait

P0, P1, P2 = (r["id"] for r in RECORDS[:3])


@pytest.fixture(scope="module")
def server(encoder, tmp_path_factory):
    import esqbe

    root = tmp_path_factory.mktemp("page-address")
    (root / "papers.jsonl").write_text("\n".join(json.dumps(r) for r in RECORDS) + "\n")
    index = esqbe.open_index(str(root / "ix"), encoder=encoder, config=None)
    assert index.index_files([str(root / "papers.jsonl")]).indexed == 30
    index.close()
    with LiveServer(create_app(str(root / "ix"), config=None, encoder=encoder, options=ServeOptions(host="127.0.0.1"))) as url:
        yield url


def _documented_keys() -> list[str]:
    text = (REPO / "docs" / "serving.md").read_text()
    table = text.split("The page's address is the query", 1)[1].split("\n\n", 2)[1]
    return re.findall(r"^\| `(\w+)` \|", table, flags=re.M)


def _params(browser) -> list[tuple[str, str]]:
    return parse_qsl(browser.execute_script("return location.hash").lstrip("#"))


def _value(browser, element_id):
    from selenium.webdriver.common.by import By

    return browser.find_element(By.ID, element_id).get_attribute("value")


def test_every_documented_address_key_round_trips(server, browser):
    from selenium.webdriver.common.by import By

    keys = _documented_keys()
    assert set(keys) == {"paper", "text", "title", "facet", "sentences", "also", "not", "filters", "rescorer", "k", "view"}
    app_js = (REPO / "esqbe" / "server" / "static" / "app.js").read_text()
    for key in keys:  # the page reads each, and reads no other
        assert f'params.get("{key}")' in app_js or f'params.getAll("{key}")' in app_js, key
    assert set(re.findall(r'params\.get(?:All)?\("(\w+)"\)', app_js)) == set(keys)

    addresses = [
        [("paper", P0), ("facet", "method"), ("also", P1), ("also", P2), ("not", RECORDS[3]["id"]),
         ("filters", "year>=2011; venue in (ACL, EMNLP, NeurIPS)"), ("rescorer", "ts"), ("k", "7")],
        [("paper", P0), ("sentences", "0,2"), ("view", "graph")],
        [("text", TEXT), ("title", "Low-resource MT"), ("facet", "result")],
        [("text", TEXT), ("sentences", "1,2"), ("k", "5")],
    ]
    seen = set()
    for params in addresses:
        browser.get(server + "/#" + urlencode(params))
        _wait(browser, 90).until(lambda b: _hits(b) and b.find_element(By.ID, "run-query").is_enabled())
        given = dict(params)
        # the page's state shows each key
        if "paper" in given:
            assert browser.find_element(By.ID, "paper-id").text.removeprefix("id: ").startswith(given["paper"])
        if "text" in given:
            assert _value(browser, "text-input") == given["text"]
            assert _value(browser, "text-title") == given.get("title", "")
        if "facet" in given:
            pressed = browser.find_element(By.CSS_SELECTOR, f'.facet-btn[data-facet="{given["facet"]}"]')
            assert pressed.get_attribute("aria-pressed") == "true"
        if "sentences" in given:
            assert _pressed(browser) == [int(x) for x in given["sentences"].split(",")]
        also = [v for k, v in params if k == "also"]
        avoid = [v for k, v in params if k == "not"]
        assert [x.get_attribute("data-paper-id") for x in browser.find_elements(By.CSS_SELECTOR, "#also-list li")] == also
        assert [x.get_attribute("data-paper-id") for x in browser.find_elements(By.CSS_SELECTOR, "#avoid-list li")] == avoid
        assert _value(browser, "filters") == given.get("filters", "")
        assert _value(browser, "rescorer") == given.get("rescorer", "summax")
        assert _value(browser, "k") == given.get("k", "10")
        view = given.get("view", "list")  # the view the address names is the one pressed and shown
        assert browser.find_element(By.CSS_SELECTOR, f'.view-btn[data-view="{view}"]').get_attribute("aria-pressed") == "true"
        assert browser.find_element(By.ID, "graph-view").is_displayed() == (view == "graph")
        assert len(_hits(browser)) <= int(given.get("k", "10"))
        # and the address the page wrote back after running the query holds the same pairs
        assert sorted(_params(browser)) == sorted(params)
        seen |= set(given)
    assert seen == set(keys)
    assert not _no_severe_log(browser)


def _export_shown(browser) -> bool:
    from selenium.webdriver.common.by import By

    buttons = browser.find_elements(By.CSS_SELECTOR, "#export .export-btn, #watch-query")
    assert len(buttons) == 5
    return any(b.is_displayed() for b in buttons)


def test_no_download_buttons_before_a_query_has_hits(server, browser):
    from selenium.webdriver.common.by import By

    browser.get(server + "/")
    _wait(browser).until(lambda b: b.find_element(By.ID, "paper-count").text)
    assert not _export_shown(browser)  # the page as opened
    browser.get(server + f"/#paper={P0}")  # a query paper, no query yet
    _wait(browser).until(lambda b: b.find_element(By.ID, "paper-id").text.removeprefix("id: ").startswith(P0))
    assert not _export_shown(browser)
    browser.get(server + f"/#paper={P0}&facet=method&filters=year%3E%3D3000")  # a query without hits
    _wait(browser).until(lambda b: "No similar paper" in b.find_element(By.ID, "results-info").text)
    assert not _export_shown(browser)
    browser.get(server + f"/#paper={P0}&facet=method")  # hits: now they can be downloaded
    _wait(browser).until(lambda b: _hits(b) and _export_shown(b))


def test_the_active_filters_are_in_the_query_summary(server, browser):
    from selenium.webdriver.common.by import By

    info = lambda: browser.find_element(By.ID, "results-info").text  # noqa: E731
    browser.get(server + f"/#paper={P0}&facet=method")
    _wait(browser).until(lambda b: _hits(b) and "papers" in info())
    assert "filters" not in info()
    browser.find_element(By.ID, "filters").send_keys("year>=2011; venue in (ACL, EMNLP)\n")
    _wait(browser).until(lambda b: "filters: year>=2011; venue in (ACL, EMNLP)" in info())
    assert re.match(r"\d+ papers · filters: year>=2011; venue in \(ACL, EMNLP\) · rescorer summax", info()), info()
    browser.get(server + f"/#paper={P0}&facet=method&filters=year%3E%3D3000")  # none pass: the summary says which
    _wait(browser).until(lambda b: info() == "No similar paper found with filters: year>=3000.")


def test_a_pasted_texts_sentences_are_all_listed_and_clickable(server, browser):
    """Before any query, and after a facet query that used only some of them."""
    from selenium.webdriver.common.by import By

    everything = httpx.post(server + "/query", json={"text": TEXT, "k": 1}, timeout=60).json()["query"]["sentences"]
    result = httpx.post(server + "/query", json={"text": TEXT, "k": 10, "facet": "result"}, timeout=60).json()
    used = [s["index"] for s in result["query"]["sentences"]]
    assert len(everything) == 3 and len(used) < 3, "the facet query must leave a sentence out for this test to mean anything"
    listed = lambda: [(int(b.get_attribute("data-index")), b.text) for b in  # noqa: E731
                      browser.find_elements(By.CSS_SELECTOR, "#sentences .sentence")]
    want = [s["index"] for s in everything]

    browser.get(server + "/")
    browser.find_element(By.CSS_SELECTOR, "#text-query summary").click()
    browser.find_element(By.ID, "text-input").send_keys(TEXT)
    browser.find_element(By.ID, "use-text").click()
    _wait(browser).until(lambda b: [i for i, _ in listed()] == want)  # no query run yet
    assert not _hits(browser)
    for (_i, text), s in zip(listed(), everything):
        assert s["text"] in text
    browser.find_elements(By.CSS_SELECTOR, "#sentences .sentence")[2].click()
    assert _pressed(browser) == [2]

    browser.find_element(By.CSS_SELECTOR, '.facet-btn[data-facet="result"]').click()
    browser.find_element(By.ID, "run-query").click()
    ids = [h["paper_id"] for h in result["hits"]]
    _wait(browser).until(lambda b: [h.get_attribute("data-paper-id") for h in _hits(b)] == ids)
    assert [i for i, _ in listed()] == want  # all, not only the facet query's
    left_out = next(i for i in want if i not in used)
    browser.find_element(By.CSS_SELECTOR, f'#sentences .sentence[data-index="{left_out}"]').click()
    assert _pressed(browser) == [left_out]
    browser.find_element(By.ID, "run-query").click()
    mine = httpx.post(server + "/query", json={"text": TEXT, "k": 10, "sentences": [left_out]}, timeout=60).json()
    _wait(browser).until(lambda b: [h.get_attribute("data-paper-id") for h in _hits(b)] == [h["paper_id"] for h in mine["hits"]])
    assert f"sentences={left_out}" in browser.current_url
    assert not _no_severe_log(browser)


def _placed(server, rescorer: str, k: int) -> dict:
    """POST /query's answer once the rescorer's scale is the index's own (the server measures a rescorer's scale the
    first time a query asks for it, on a thread of its own; the default one's before it says it is ready)."""
    import time

    deadline = time.monotonic() + 90
    while True:
        body = httpx.post(server + "/query", json={"paper_id": P0, "facet": "method", "k": k, "rescorer": rescorer},
                          timeout=60).json()
        if body["scale"]["source"] == "index" or time.monotonic() > deadline:
            return body
        time.sleep(0.2)


def _chips_follow_the_answer(browser, want: dict) -> None:
    from selenium.webdriver.common.by import By

    hits = want["hits"]
    best = max(h["score"] for h in hits)  # the band is placed on the score that orders the hits
    for element, hit in zip(_hits(browser), hits):
        assert element.get_attribute("data-paper-id") == hit["paper_id"]
        chip = element.find_element(By.CSS_SELECTOR, ".strength")
        title = chip.get_attribute("title")
        assert chip.text == f"{hit['band']} match" and chip.get_attribute("data-scale") == "index"
        assert f"score {hit['score']:.3f}" in title and f"best hit: {best:.3f}" in title
        assert f"higher than {math.floor(hit['percentile'])}% of this index's matches" in title
        assert want["scale"]["description"] in title
        assert ("weak" in element.get_attribute("class").split()) == (hit["band"] == "weak")


def test_a_weak_match_looks_weak(server, browser):
    """Each hit's band is the one the server placed it in on the index's own matches (its percentile in the tooltip);
    a weak hit is drawn as weak; a rescorer on another scale (ot: minus a transport cost) gets the bands of its own
    scale, and the rescorer `none` (no similarity) none."""
    from selenium.webdriver.common.by import By

    readme = " ".join((REPO / "docs" / "querying.md").read_text().split())
    assert "higher than 92% of this index's matches" in readme
    want = _placed(server, "summax", 29)
    assert want["scale"]["source"] == "index" and want["scale"]["papers"] == 30
    bands = [h["band"] for h in want["hits"]]
    assert "weak" in bands and "strong" in bands, bands  # the query shows both ends
    browser.get(server + f"/#paper={P0}&facet=method&k=29")
    _wait(browser, 90).until(lambda b: len(_hits(b)) == 29)
    _chips_follow_the_answer(browser, want)
    weak = next(e for e, b in zip(_hits(browser), bands) if b == "weak")
    strong = next(e for e, b in zip(_hits(browser), bands) if b == "strong")
    colour = lambda e: e.find_element(By.CSS_SELECTOR, ".strength").value_of_css_property("background-color")  # noqa: E731
    assert colour(weak) != colour(strong)  # they do not look alike

    ot = _placed(server, "ot", 10)  # similarities below 0, far from any cosine scale: placed on the index's own
    assert ot["scale"]["source"] == "index" and ot["scale"]["rescorer"] == "ot", ot["scale"]
    assert all(h["similarity"] < 0 for h in ot["hits"]) and {h["band"] for h in ot["hits"]} - {"weak"}
    browser.get(server + f"/#paper={P0}&facet=method&rescorer=ot")
    _wait(browser, 90).until(lambda b: _hits(b) and "transport" in b.find_element(By.ID, "results-info").text)
    _chips_follow_the_answer(browser, ot)

    browser.get(server + f"/#paper={P0}&facet=method&rescorer=none")
    _wait(browser, 90).until(lambda b: _hits(b) and "rescorer none" in b.find_element(By.ID, "results-info").text)
    assert not browser.find_elements(By.CSS_SELECTOR, "#hits .strength")
    assert not _no_severe_log(browser)


def test_the_score_line_names_and_explains_each_number(server, browser):
    from selenium.webdriver.common.by import By

    want = httpx.post(server + "/query", json={"paper_id": P0, "facet": "method", "k": 10}, timeout=60).json()
    browser.get(server + f"/#paper={P0}&facet=method")
    _wait(browser, 90).until(lambda b: len(_hits(b)) == len(want["hits"]))
    first, hit = _hits(browser)[0], want["hits"][0]
    expected = {".score-main": f"score {hit['score']:.3f}", ".similarity": f"{hit['similarity']:.3f}",
                ".score-bm25": f"word match (bm25) {hit['bm25']:.1f}", ".score-knn": f"sentence kNN {hit['knn']:.3f}"}
    for selector, text in expected.items():
        assert first.find_element(By.CSS_SELECTOR, f".scores {selector}").text == text
    # the headline number comes first, before its band and its parts
    assert first.find_element(By.CSS_SELECTOR, ".scores > span").get_attribute("class") == "score-main"
    titles = {s: first.find_element(By.CSS_SELECTOR, f".scores {s}").get_attribute("title")
              for s in (".score-main", ".score-bm25", ".score-knn")}
    assert want["score"]["formula"] in titles[".score-main"] and "BM25" in titles[".score-main"]
    assert "title and abstract" in titles[".score-bm25"]
    assert "cosine" in titles[".score-knn"]
    similarity = first.find_element(By.CSS_SELECTOR, ".scores .similarity").find_element(By.XPATH, "..")
    assert similarity.get_attribute("title") == f"similarity (part of the score): {want['similarity']}"
