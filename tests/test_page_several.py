"""A query of several examples and a paper to avoid on the page, in real Chromium at a desktop and a narrow width
(item 1): every matched pair names the example it is of (by short title), the avoided paper's matches show
as such, the set's chips show titles (the id in the tooltip), a hit shows its best two pairs with the rest one
click away, ten hits fit in a few screens, the Watches panel sits above the hits (and is a header button away), the
query paper's metadata shows labelled like a hit's. The screenshots are kept in test-artifacts/ (and the README's,
docs/page.png and docs/page-narrow.png, with `ESQBE_PAGE_SCREENSHOT=docs/page.png pytest tests/test_page_several.py`)."""
from __future__ import annotations

import os
import re
from urllib.parse import urlencode

import httpx

from .conftest import REPO
from .test_page_states import RECORDS, _hits, _no_severe_log, _wait, server  # noqa: F401  (the module's server)

P0, P1, P2 = (r["id"] for r in RECORDS[:3])
TITLES = {r["id"]: r["title"] for r in RECORDS}
SHOWN = 2  # the pairs a hit shows before "N more pairs" (app.js SHOWN_PAIRS)


def _short(title: str, n: int) -> str:
    """The page's shortTitle (app.js), for the test to compare with."""
    t = " ".join(title.split())
    if len(t) <= n:
        return t
    cut = re.sub(r"\s+\S*$", "", t[: n - 1])
    return (cut if len(cut) > n / 2 else t[: n - 1]) + "…"


def test_several_examples_and_an_avoided_paper_read_at_a_glance(server, browser):  # noqa: F811
    from selenium.webdriver.common.by import By

    made = httpx.post(server + "/watches", json={"name": "parsers", "paper_id": P0, "facet": "method", "min_sim": 0.5})
    assert made.status_code == 200, made.text
    body = {"k": 10, "rescorer": "summax", "facet": "method", "with_sentences": True,
            "examples": [{"paper_id": P0}, {"paper_id": P1}, {"paper_id": P2}]}
    for record in RECORDS[3:]:  # a paper to avoid that pulls some hit down (closer to it than to the examples)
        P3 = record["id"]
        want = httpx.post(server + "/query", json={**body, "avoid": [{"paper_id": P3}]}, timeout=60).json()
        if len(want["hits"]) == 10 and any(a["penalty"] > 0 for h in want["hits"] for a in h["avoided"]):
            break
    else:
        raise AssertionError("no paper to avoid pulls a hit down")
    address = urlencode([("paper", P0), ("facet", "method"), ("also", P1), ("also", P2), ("not", P3)])
    shots = {}
    for name, size in (("desktop", (1440, 1100)), ("narrow", (420, 900))):
        browser.set_window_size(*size)
        browser.get("about:blank")
        browser.get(f"{server}/#{address}")
        _wait(browser, 90).until(lambda b: [h.get_attribute("data-paper-id") for h in _hits(b)]
                                 == [h["paper_id"] for h in want["hits"]])
        # the chips: titles, the id in the tooltip
        for list_id, ids in (("also-list", [P1, P2]), ("avoid-list", [P3])):
            chips = browser.find_elements(By.CSS_SELECTOR, f"#{list_id} .chip-title")
            assert [c.text for c in chips] == [_short(TITLES[i], 48) for i in ids]
            assert [c.get_attribute("title").split(" · ")[0] for c in chips] == [f"id: {i}" for i in ids]
        # the query paper's own metadata, labelled as a hit's
        meta = browser.find_element(By.CSS_SELECTOR, "#paper-meta .hit-meta").text
        assert f"Year: {RECORDS[0]['year']}" in meta and f"Venue: {RECORDS[0]['venue']}" in meta
        assert "Authors: Ada Author0" in meta and f"DOI: {RECORDS[0]['external_ids']['doi']}" in meta
        for hit, answer in zip(_hits(browser), want["hits"]):
            rows = hit.find_elements(By.CSS_SELECTOR, "tr.pair")
            assert len(rows) == len(answer["matches"])
            shown = [r for r in rows if r.is_displayed()]
            assert len(shown) == min(SHOWN, len(rows))  # the best ones
            weights = sorted((m["weight"] for m in answer["matches"]), reverse=True)
            assert [float(r.find_element(By.CSS_SELECTOR, "td.w strong").text) for r in shown] == \
                [round(w, 3) for w in weights[: len(shown)]]
            for row in shown:  # each pair names its example by its short title
                x = int(row.get_attribute("data-example"))
                label = row.find_element(By.CSS_SELECTOR, ".example-of")
                assert label.text == f"ex. {x + 1} “{_short(TITLES[[P0, P1, P2][x]], 32)}”"
                assert f"id {[P0, P1, P2][x]}" in label.get_attribute("title")
            if len(rows) > SHOWN:  # the rest one click away
                more = hit.find_element(By.CSS_SELECTOR, "button.more-pairs")
                assert more.text == f"{len(rows) - SHOWN} more pair{'s' if len(rows) > SHOWN + 1 else ''}"
                browser.execute_script("arguments[0].click()", more)
                assert all(r.is_displayed() for r in rows) and more.get_attribute("aria-expanded") == "true"
                browser.execute_script("arguments[0].click()", more)
                assert len([r for r in rows if r.is_displayed()]) == SHOWN
            pulled = [a for a in answer["avoided"] if a["penalty"] > 0]
            boxes = hit.find_elements(By.CSS_SELECTOR, ".avoided .avoided-pair")
            assert [b.get_attribute("data-paper-id") for b in boxes] == [a["paper_id"] for a in pulled]
            for box in boxes:  # named by title, marked as the avoided paper's match
                assert box.text.startswith(f"“{_short(TITLES[P3], 32)}” (score −")
                assert "Like a paper to avoid" in hit.find_element(By.CSS_SELECTOR, ".avoided").text
            # every field labelled: the id, the metadata, the scores
            assert hit.find_element(By.CSS_SELECTOR, ".hit-head .pid").text.startswith("id ")
            for cls in ("year", "venue", "authors", "doi"):
                field = hit.find_elements(By.CSS_SELECTOR, f".hit-meta .{cls} .field")
                assert len(field) == 1 and field[0].text.endswith(":")
        assert any(a["penalty"] > 0 for h in want["hits"] for a in h["avoided"])  # the test sees one
        assert any(m["example"] > 0 for h in want["hits"] for m in h["matches"][:SHOWN])
        # the Watches panel above the hits, and a header button away
        panel_top = browser.execute_script("return document.getElementById('watch-panel').getBoundingClientRect().top")
        first_hit_top = browser.execute_script("return document.querySelector('#hits .hit').getBoundingClientRect().top")
        assert panel_top < first_hit_top
        assert browser.find_element(By.ID, "watches-link").text == "Watches (1)"
        height = browser.execute_script("return document.getElementById('hits').getBoundingClientRect().height")
        viewport = browser.execute_script("return window.innerHeight")
        assert browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth + 1")  # no sideways
        (REPO / "test-artifacts").mkdir(exist_ok=True)
        browser.execute_script("document.querySelector('#hits .hit:nth-child(2)').scrollIntoView()")
        browser.save_screenshot(str(REPO / "test-artifacts" / f"page-several-{name}-hits.png"))
        if name == "desktop":  # ten hits in a few screens (~8,000 px tall before)
            assert height < 3.5 * viewport, (height, viewport)
        browser.execute_script("window.scrollTo(0, 0)")
        browser.find_element(By.ID, "watches-link").click()
        _wait(browser, 10).until(lambda b: b.execute_script(
            "const r = document.getElementById('watch-panel').getBoundingClientRect(); return r.top >= 0 && r.top < 200"))
        browser.execute_script("window.scrollTo(0, 0); document.getElementById('query-panel').scrollTop = 0")
        shots[name] = REPO / "test-artifacts" / f"page-several-{name}.png"
        if name == "desktop":  # the README's size, the first hit like the avoided paper in view beside the query's set
            browser.set_window_size(1240, 1000)
            browser.execute_script("document.querySelector('#hits .hit .avoided').closest('.hit').scrollIntoView({block: 'end'})")
        assert browser.save_screenshot(str(shots[name]))
        assert not _no_severe_log(browser)
    wanted = os.environ.get("ESQBE_PAGE_SCREENSHOT")
    if wanted:  # the README's pictures
        (REPO / wanted).write_bytes(shots["desktop"].read_bytes())
        (REPO / wanted.replace(".png", "-narrow.png")).write_bytes(shots["narrow"].read_bytes())
