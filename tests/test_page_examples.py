"""The page's query set in real Chromium: two hits added as examples and one as "not like
this" in one click each; the new ranking is the server's for that set, the set is shown and editable, and the
address holds it (opening it again gives the same ranking)."""
from __future__ import annotations

import json
from urllib.parse import parse_qs

import httpx

from .conftest import SAMPLE

QID = json.loads(SAMPLE.read_text().splitlines()[0])["paper_id"]


def test_two_hits_as_examples_and_one_not_like_this(page_server, browser):
    server = page_server
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, 90)
    hits = lambda: [h.get_attribute("data-paper-id") for h in browser.find_elements(By.CSS_SELECTOR, "#hits .hit")]  # noqa: E731

    def settled(also, avoid):  # the answer to the query of this set is shown, and the address says the set
        def ready(b):
            params = parse_qs(b.execute_script("return location.hash").lstrip("#"))
            shown = hits()
            return (params.get("also", []) == also and params.get("not", []) == avoid and shown
                    and not set(also + avoid) & set(shown) and b.find_element(By.ID, "run-query").is_enabled())
        wait.until(ready)
        return hits()

    def expected(also, avoid):
        body = {"k": 10, "rescorer": "summax", "facet": "method", "examples": [{"paper_id": QID}]
                + [{"paper_id": p} for p in also]}
        if avoid:
            body["avoid"] = [{"paper_id": p} for p in avoid]
        r = httpx.post(server + "/query", json=body, timeout=60)
        assert r.status_code == 200, r.text
        return [h["paper_id"] for h in r.json()["hits"]]

    browser.get(f"{server}/#paper={QID}&facet=method")
    first = settled([], [])
    a, b = first[0], first[1]
    browser.find_element(By.CSS_SELECTOR, f'.hit[data-paper-id="{a}"] .add-example').click()
    second = settled([a], [])
    assert b in second
    browser.find_element(By.CSS_SELECTOR, f'.hit[data-paper-id="{b}"] .add-example').click()
    third = settled([a, b], [])
    c = third[0]
    browser.find_element(By.CSS_SELECTOR, f'.hit[data-paper-id="{c}"] .add-avoid').click()
    ranking = settled([a, b], [c])
    assert ranking == expected([a, b], [c]) and ranking != first
    # the set is visible
    assert [x.get_attribute("data-paper-id") for x in browser.find_elements(By.CSS_SELECTOR, "#also-list li")] == [a, b]
    assert [x.get_attribute("data-paper-id") for x in browser.find_elements(By.CSS_SELECTOR, "#avoid-list li")] == [c]
    assert browser.find_element(By.ID, "query-set").is_displayed()

    # the address reproduces it
    address = browser.current_url
    browser.get("about:blank")
    browser.get(address)
    assert settled([a, b], [c]) == ranking

    # and it is editable: one example removed, the query runs again without it
    browser.find_element(By.CSS_SELECTOR, f'#also-list li[data-paper-id="{a}"] .set-remove').click()
    assert settled([b], [c]) == expected([b], [c])
