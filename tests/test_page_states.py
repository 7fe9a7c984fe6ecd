"""The page's states in real headless Chromium, against a real server over a real index
whose labels the tagger predicted (so facet queries choose sentences by probability) and whose papers carry
metadata (year, venue, authors, ids; one paper's metadata is hostile):

- a new query paper never sits above the old query's hits, and hovering lights only the current query's sentences;
- an error (a bad link, a failed query) shows at the top, in view, with no stale hits below;
- a facet query marks exactly the sentences it uses, each with its label and probability;
- hits show year, venue, authors, DOI and safe links; filters, a pasted abstract and the paper count work.

The README's screenshots are made by tests/test_page_several.py; this one's lands in test-artifacts/."""
from __future__ import annotations

import json
import time

import httpx
import pytest

from esqbe.server.app import create_app
from esqbe.server.options import ServeOptions

from .conftest import REPO, SAMPLE, LiveServer

ROWS = [json.loads(line) for line in SAMPLE.read_text().splitlines()[:30]]
VENUES = ("ACL", "EMNLP", "NeurIPS")
HOSTILE = "csabstruct-train-0005"
TEXT = ("We study machine translation for low-resource languages. "
        "We train a transformer with back-translation on monolingual data. "
        "It improves BLEU by two points on four language pairs.")


def _record(i: int, r: dict) -> dict:
    rec = {"id": r["paper_id"], "title": f"Paper {i}: " + " ".join(r["sentences"][0].split()[:6]),
           "abstract": " ".join(r["sentences"]), "year": 2010 + i % 12, "venue": VENUES[i % 3],
           "authors": [f"Ada Author{i}", f"Bo Writer{i}", "Cy Third", "Di Fourth"],
           "external_ids": {"doi": f"10.1000/esqbe.{i}", "arxiv": f"2101.{i:05d}", "corpus_id": str(1000 + i)}}
    if i % 5 == 1:  # a reference manager's plain `url`: a link, never "open access"
        rec["url"] = f"https://example.org/paper/{i}"
    elif i % 5 == 2:  # the record says it is open (S2, OpenAlex, arXiv)
        rec["open_access_url"] = f"https://example.org/oa/{i}.pdf"
    if r["paper_id"] == HOSTILE:
        rec.update(title='<img src=x onerror="window.__pwned=1">Hostile', venue="<b>bold</b>",
                   s2_url="javascript:window.__pwned=1", open_access_url="javascript:alert(1)",
                   external_ids={"doi": '10.1000/x"><script>window.__pwned=1</script>'})
    return rec


RECORDS = [_record(i, r) for i, r in enumerate(ROWS)]
P0 = RECORDS[0]["id"]


@pytest.fixture(scope="module")
def server(encoder, tmp_path_factory):
    import esqbe

    root = tmp_path_factory.mktemp("page-states")
    (root / "papers.jsonl").write_text("\n".join(json.dumps(r) for r in RECORDS) + "\n")
    index = esqbe.open_index(str(root / "ix"), encoder=encoder, config=None)
    report = index.index_files([str(root / "papers.jsonl")])
    assert (report.indexed, report.tagged, report.errors) == (30, 30, [])
    index.close()
    with LiveServer(create_app(str(root / "ix"), config=None, encoder=encoder, options=ServeOptions(host="127.0.0.1"))) as url:
        yield url


def _wait(browser, seconds=60):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(browser, seconds)


def _hits(browser):
    from selenium.webdriver.common.by import By

    return browser.find_elements(By.CSS_SELECTOR, "#hits .hit")


def _pressed(browser):
    from selenium.webdriver.common.by import By

    return [int(b.get_attribute("data-index")) for b in browser.find_elements(By.CSS_SELECTOR, "#sentences .sentence")
            if b.get_attribute("aria-pressed") == "true"]


def _in_view(browser, element_id):
    return browser.execute_script(
        "const r = document.getElementById(arguments[0]).getBoundingClientRect();"
        "return r.height > 0 && r.top >= 0 && r.bottom <= window.innerHeight;", element_id)


def _no_severe_log(browser):
    return [e for e in browser.get_log("browser") if e["level"] == "SEVERE" and "favicon" not in e["message"]]


def test_query_by_a_hit_replaces_the_hits_and_hover_lights_only_the_new_querys_sentences(server, browser):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    browser.get(server + f"/#paper={P0}&sentences=0,2")
    _wait(browser).until(lambda b: _hits(b))
    assert _pressed(browser) == [0, 2]
    old = [h.get_attribute("data-paper-id") for h in _hits(browser)]

    target = _hits(browser)[1]
    target_id = target.get_attribute("data-paper-id")
    link = target.find_element(By.CSS_SELECTOR, "a.query-next")
    matched = sorted({int(x.get_attribute("data-candidate-index")) for x in target.find_elements(By.CSS_SELECTOR, ".pair")})
    label = link.text
    link.click()
    # from the click on, no hit of the old query is on screen: only the new query's, once they come
    deadline = time.time() + 60
    while True:
        try:
            shown = [h.get_attribute("data-query-paper") for h in _hits(browser)]
            ready = browser.find_element(By.ID, "paper-id").text.removeprefix("id: ").startswith(target_id)
        except StaleElementReferenceException:  # the page re-drew the list while it was read: read it again
            continue
        assert set(shown) <= {target_id}, "hits of the old query under the new query paper"
        if shown and ready:
            break
        assert time.time() < deadline
        time.sleep(0.05)
    # the selection is the matched sentences, and the query ran with them
    assert label == f"Query by this paper's matched sentences [{', '.join(map(str, matched))}]"
    assert _pressed(browser) == matched and browser.find_element(By.ID, "run-query").is_enabled()
    want = httpx.post(server + "/query", json={"paper_id": target_id, "sentences": matched, "k": 10, "rescorer": "summax"},
                      timeout=60).json()
    assert [h.get_attribute("data-paper-id") for h in _hits(browser)] == [h["paper_id"] for h in want["hits"]] != old
    in_query = [int(b.get_attribute("data-index")) for b in browser.find_elements(By.CSS_SELECTOR, "#sentences .sentence.in-query")]
    assert in_query == matched
    # hovering a pair lights exactly its query sentence, one of the new query's
    for pair in _hits(browser)[0].find_elements(By.CSS_SELECTOR, ".pair"):
        ActionChains(browser).move_to_element(pair).perform()
        linked = [int(x.get_attribute("data-index")) for x in browser.find_elements(By.CSS_SELECTOR, "#sentences .sentence.linked")]
        assert linked == [int(pair.get_attribute("data-query-index"))] and linked[0] in matched
    assert not _no_severe_log(browser)


def test_a_bad_link_after_hits_clears_them_and_shows_the_error_in_view(server, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC

    browser.get(server + f"/#paper={P0}&facet=method")
    _wait(browser).until(lambda b: _hits(b))
    browser.execute_script("window.scrollTo(0, 0)")  # the eye on the query panel, as after a click there
    browser.execute_script("location.hash = 'paper=doesnotexist'")
    _wait(browser).until(EC.text_to_be_present_in_element((By.ID, "error"), "Paper doesnotexist is not in the index."))
    assert _in_view(browser, "error")
    assert not _hits(browser) and browser.find_element(By.ID, "results-info").text == "No query."
    assert not browser.find_element(By.ID, "query-paper").is_displayed()  # no old query paper either

    browser.execute_script(f"location.hash = 'paper={P0}&facet=methods'")
    _wait(browser).until(EC.text_to_be_present_in_element((By.ID, "error"), "Unknown facet “methods”"))
    assert _in_view(browser, "error") and not _hits(browser)


def test_a_failed_query_shows_its_error_in_view_with_no_stale_hits(server, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC

    browser.get(server + f"/#paper={P0}&facet=method")
    _wait(browser).until(lambda b: _hits(b))
    browser.execute_script("window.scrollTo(0, 0)")  # the eye on the query panel, as after a click there
    n = len(ROWS[0]["sentences"])
    browser.execute_script(f"location.hash = 'paper={P0}&sentences=0,{n + 5}'")
    _wait(browser).until(EC.text_to_be_present_in_element((By.ID, "error"), f"no sentence {n + 5}"))
    assert _in_view(browser, "error")
    assert not _hits(browser)
    assert browser.find_element(By.ID, "results-info").text == "The query failed: see the message above."
    # a filter the server refuses: the same place
    browser.execute_script(f"location.hash = 'paper={P0}&facet=method'")
    _wait(browser).until(lambda b: _hits(b))
    assert not browser.find_element(By.ID, "error").is_displayed()  # the next good query cleared it
    browser.find_element(By.ID, "filters").send_keys("year>>2015\n")
    _wait(browser).until(lambda b: b.find_element(By.ID, "error").is_displayed())
    assert _in_view(browser, "error") and not _hits(browser)


def _soft_case(server):
    """A paper and facet whose query takes a sentence labelled with another facet (its predicted p >= 0.3)."""
    for r in RECORDS:
        paper = httpx.get(server + f"/papers/{r['id']}", timeout=60).json()
        for facet, q in paper["facet_queries"].items():
            other = [s for s in q["sentences"] if s["facet"] != facet]
            if other:
                return paper, facet, q, other
    pytest.fail("no paper of the sample has a facet query that takes a sentence labelled otherwise")


def test_a_facet_query_marks_exactly_its_sentences_with_label_and_probability(server, browser):
    from selenium.webdriver.common.by import By

    paper, facet, q, other = _soft_case(server)
    pid = paper["paper_id"]
    want = httpx.post(server + "/query", json={"paper_id": pid, "facet": facet, "k": 10}, timeout=60).json()["query"]
    assert [s["index"] for s in q["sentences"]] == [s["index"] for s in want["sentences"]]  # the page's marks = the query

    browser.get(server + f"/#paper={pid}")
    _wait(browser).until(lambda b: b.find_element(By.ID, "paper-id").text.removeprefix("id: ").startswith(pid))
    browser.find_element(By.CSS_SELECTOR, f'.facet-btn[data-facet="{facet}"]').click()
    assert _pressed(browser) == [s["index"] for s in q["sentences"]]
    info = browser.find_element(By.ID, "selection-info").text
    assert f"p({facet}) >= 0.3" in info
    for s in other:
        assert f"[{s['index']}] is labelled {s['facet']}" in info
        button = browser.find_element(By.CSS_SELECTOR, f'#sentences .sentence[data-index="{s["index"]}"]')
        assert button.find_element(By.CSS_SELECTOR, ".tag").text.lower() == s["facet"]
        assert button.find_element(By.CSS_SELECTOR, ".why").text == f"p({facet}) {s['probability']:.2f}"
    browser.find_element(By.ID, "run-query").click()
    _wait(browser).until(lambda b: _hits(b))
    marked = [int(b.get_attribute("data-index")) for b in browser.find_elements(By.CSS_SELECTOR, "#sentences .sentence.in-query")]
    assert marked == [s["index"] for s in want["sentences"]]
    assert not _no_severe_log(browser)


def test_hits_show_metadata_and_safe_links_and_the_page_has_filters_text_queries_and_a_count(server, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC

    browser.get(server + "/")
    _wait(browser).until(EC.text_to_be_present_in_element((By.ID, "paper-count"), "30 papers in the index"))

    browser.execute_script(f"location.hash = 'paper={P0}&facet=method'")
    _wait(browser).until(lambda b: len(_hits(b)) == 10)
    browser.find_element(By.ID, "k").clear()
    browser.find_element(By.ID, "k").send_keys("29")
    browser.find_element(By.ID, "run-query").click()
    _wait(browser).until(lambda b: len(_hits(b)) == 29)
    by_id = {r["id"]: r for r in RECORDS}
    for hit in _hits(browser):
        rec = by_id[hit.get_attribute("data-paper-id")]
        meta = hit.find_element(By.CSS_SELECTOR, ".hit-meta")
        links = {a.text: a.get_attribute("href") for a in meta.find_elements(By.CSS_SELECTOR, "a")}
        if rec["id"] == HOSTILE:  # text, not HTML; no javascript: link; the DOI stays inside its address
            assert hit.find_element(By.CSS_SELECTOR, ".hit-title").text == rec["title"]
            assert meta.find_element(By.CSS_SELECTOR, ".venue").text == "Venue: <b>bold</b>"
            assert set(links) == {"DOI"}
            assert links["DOI"] == "https://doi.org/10.1000/x%22%3E%3Cscript%3Ewindow.__pwned%3D1%3C/script%3E"  # "/" kept: it separates a DOI
            continue
        i = RECORDS.index(rec)
        # each field labelled
        assert meta.find_element(By.CSS_SELECTOR, ".year").text == f"Year: {rec['year']}"
        assert meta.find_element(By.CSS_SELECTOR, ".venue").text == f"Venue: {rec['venue']}"
        assert meta.find_element(By.CSS_SELECTOR, ".authors").text == f"Authors: Ada Author{i}, Bo Writer{i} et al."
        assert meta.find_element(By.CSS_SELECTOR, ".doi").text == f"DOI: 10.1000/esqbe.{i}"
        want = {"S2": f"https://api.semanticscholar.org/CorpusID:{1000 + i}",
                "arXiv": f"https://arxiv.org/abs/2101.{i:05d}", "DOI": f"https://doi.org/10.1000/esqbe.{i}"}
        want.update({1: {"link": f"https://example.org/paper/{i}"},
                     2: {"open access": f"https://example.org/oa/{i}.pdf"}}.get(i % 5, {}))
        assert links == want
    assert not browser.find_elements(By.CSS_SELECTOR, 'a[href^="javascript"], #hits img, #hits b, #hits script')
    assert browser.execute_script("return window.__pwned") is None

    # filters: the hits are the API's for the same filter
    browser.find_element(By.ID, "filters").send_keys("year>=2016; venue in (ACL, EMNLP)\n")
    want = httpx.post(server + "/query", json={"paper_id": P0, "facet": "method", "k": 29, "rescorer": "summax",
                                               "filters": ["year>=2016", "venue in (ACL, EMNLP)"]}, timeout=60).json()
    assert want["hits"] and len(want["hits"]) < 29
    _wait(browser).until(lambda b: [h.get_attribute("data-paper-id") for h in _hits(b)] == [h["paper_id"] for h in want["hits"]])
    for hit in _hits(browser):
        assert int(hit.find_element(By.CSS_SELECTOR, ".year").text.removeprefix("Year: ")) >= 2016
    browser.find_element(By.ID, "filters").clear()

    # the README's screenshot: a facet query with its hits, metadata and matched pairs
    browser.find_element(By.ID, "k").clear()
    browser.find_element(By.ID, "k").send_keys("5")
    browser.find_element(By.ID, "run-query").click()
    _wait(browser).until(lambda b: len(_hits(b)) == 5)
    browser.set_window_size(1240, 860)  # the README's size: under 300 KB as a PNG
    browser.execute_script("window.scrollTo(0, 0); document.getElementById('query-panel').scrollTop = 0")
    (REPO / "test-artifacts").mkdir(exist_ok=True)
    for out in [REPO / "test-artifacts" / "page-hits.png", tmp_path / "page-hits.png"]:
        assert browser.save_screenshot(str(out))
        assert out.stat().st_size < 300_000, out
    browser.set_window_size(1440, 1100)

    # a pasted abstract: every sentence first, then two of them chosen by index
    browser.find_element(By.CSS_SELECTOR, "#text-query summary").click()
    browser.find_element(By.ID, "text-input").send_keys(TEXT)
    browser.find_element(By.ID, "use-text").click()
    _wait(browser).until(lambda b: not _hits(b) and b.find_element(By.ID, "paper-title").text == "(pasted text)")
    browser.find_element(By.ID, "run-query").click()
    _wait(browser).until(lambda b: len(_hits(b)) == 5)
    sentences = browser.find_elements(By.CSS_SELECTOR, "#sentences .sentence")
    assert [s.get_attribute("data-index") for s in sentences] == ["0", "1", "2"]
    sentences[0].click()
    sentences[2].click()
    browser.find_element(By.ID, "run-query").click()
    want = httpx.post(server + "/query", json={"text": TEXT, "sentences": [0, 2], "k": 5, "rescorer": "summax"},
                      timeout=60).json()
    _wait(browser).until(lambda b: [h.get_attribute("data-paper-id") for h in _hits(b)] == [h["paper_id"] for h in want["hits"]])
    assert {h.get_attribute("data-query-paper") for h in _hits(browser)} == {"(text)"}
    assert not _no_severe_log(browser)


def test_the_hits_download_as_csv_bibtex_and_ris(server, browser, tmp_path):
    """The page's download buttons post the last query with "format" (h24b's POST /query export) and save the
    answer as the attachment it names."""
    from selenium.webdriver.common.by import By

    fields = httpx.get(server + "/openapi.json", timeout=60).json()["components"]["schemas"]["QueryRequest"]["properties"]
    if "format" not in fields:
        pytest.skip("this server has no POST /query \"format\" (the export) yet")
    browser.execute_cdp_cmd("Page.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(tmp_path)})
    browser.get(server + f"/#paper={P0}&facet=method")
    _wait(browser).until(lambda b: _hits(b))
    body = browser.execute_script("return state.lastQuery")
    for fmt in ("csv", "bibtex", "ris", "csl-json"):
        before = set(tmp_path.iterdir())
        browser.find_element(By.CSS_SELECTOR, f'.export-btn[data-format="{fmt}"]').click()
        def new_files(_, before=before):
            return [p for p in set(tmp_path.iterdir()) - before if not p.name.endswith((".crdownload", ".tmp"))]

        _wait(browser, 30).until(new_files)
        [saved] = new_files(None)
        want = httpx.post(server + "/query", json={**body, "format": fmt}, timeout=60)
        assert want.status_code == 200 and saved.read_bytes() == want.content
        assert f'filename="{saved.name}"' in want.headers["content-disposition"]
    assert not browser.find_element(By.ID, "error").is_displayed()


def _reopen(browser, url):
    """The address opened afresh, as a bookmark or a link a colleague sent."""
    browser.get("about:blank")
    browser.get(url)


def test_the_address_reproduces_the_query_filters_and_text_included(server, browser):
    """A link to the page reproduces the query: the paper, its facet or sentences,
    the filters, the hit count, and a pasted text with its title."""
    from selenium.webdriver.common.by import By

    browser.get(server + f"/#paper={P0}&facet=method")
    _wait(browser).until(lambda b: _hits(b))
    browser.find_element(By.ID, "k").clear()
    browser.find_element(By.ID, "k").send_keys("7")
    browser.find_element(By.ID, "filters").send_keys("year>=2014; venue in (ACL, EMNLP)\n")
    want = httpx.post(server + "/query", json={"paper_id": P0, "facet": "method", "k": 7, "rescorer": "summax",
                                               "filters": ["year>=2014", "venue in (ACL, EMNLP)"]}, timeout=60).json()
    ids = [h["paper_id"] for h in want["hits"]]
    _wait(browser).until(lambda b: [h.get_attribute("data-paper-id") for h in _hits(b)] == ids)
    url = browser.current_url
    # a hit's "query by this paper" link keeps the filters and the count too
    nxt = _hits(browser)[0].find_element(By.CSS_SELECTOR, "a.query-next").get_attribute("href")
    assert "filters=" in nxt and "k=7" in nxt

    _reopen(browser, url)
    _wait(browser).until(lambda b: [h.get_attribute("data-paper-id") for h in _hits(b)] == ids)
    assert browser.find_element(By.ID, "filters").get_attribute("value") == "year>=2014; venue in (ACL, EMNLP)"
    assert browser.find_element(By.ID, "k").get_attribute("value") == "7"

    # a pasted text, two of its sentences chosen, and a title: the address carries them
    browser.get(server + "/")
    browser.find_element(By.CSS_SELECTOR, "#text-query summary").click()
    browser.find_element(By.ID, "text-title").send_keys("Low-resource MT")
    browser.find_element(By.ID, "text-input").send_keys(TEXT)
    browser.find_element(By.ID, "use-text").click()
    browser.find_element(By.ID, "run-query").click()
    _wait(browser).until(lambda b: len(_hits(b)) == 10)
    sentences = browser.find_elements(By.CSS_SELECTOR, "#sentences .sentence")
    sentences[1].click()
    sentences[2].click()
    browser.find_element(By.ID, "run-query").click()
    want = httpx.post(server + "/query", json={"text": TEXT, "title": "Low-resource MT", "sentences": [1, 2], "k": 10,
                                               "rescorer": "summax"}, timeout=60).json()
    ids = [h["paper_id"] for h in want["hits"]]
    _wait(browser).until(lambda b: [h.get_attribute("data-paper-id") for h in _hits(b)] == ids)
    url = browser.current_url
    assert "text=" in url and "sentences=1%2C2" in url
    _reopen(browser, url)
    _wait(browser).until(lambda b: [h.get_attribute("data-paper-id") for h in _hits(b)] == ids)
    assert browser.find_element(By.ID, "text-input").get_attribute("value") == TEXT
    assert browser.find_element(By.ID, "text-title").get_attribute("value") == "Low-resource MT"
    assert _pressed(browser) == [1, 2]
    assert not _no_severe_log(browser)


def test_a_text_query_without_facet_shows_the_tagger_labels_and_probabilities(server, browser):
    """A pasted text queried with every sentence shows what the tagger made of
    each (label and probability, as for a paper), not "unlabeled"."""
    from selenium.webdriver.common.by import By

    want = httpx.post(server + "/query", json={"text": TEXT, "k": 5}, timeout=60).json()["query"]["sentences"]
    assert all(s["facet"] in ("background", "method", "result", "other") and s["probabilities"] for s in want)
    browser.get(server + "/")
    browser.find_element(By.CSS_SELECTOR, "#text-query summary").click()
    browser.find_element(By.ID, "text-input").send_keys(TEXT)
    browser.find_element(By.ID, "use-text").click()
    browser.find_element(By.ID, "run-query").click()
    _wait(browser).until(lambda b: len(_hits(b)) == 10)
    buttons = browser.find_elements(By.CSS_SELECTOR, "#sentences .sentence")
    assert len(buttons) == len(want)
    for button, s in zip(buttons, want):
        assert button.find_element(By.CSS_SELECTOR, ".tag").text.lower() == s["facet"]
        assert button.find_element(By.CSS_SELECTOR, ".why").text == f"p({s['facet']}) {s['probabilities'][s['facet']]:.2f}"
    assert "unlabeled" not in browser.find_element(By.ID, "sentences").text.lower()
    assert not _no_severe_log(browser)
