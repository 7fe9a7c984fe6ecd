"""The page's Graph view in real Chromium, at 1440 and 420 px, against a real server (POST /graph) over a real index:

- the address opens the view (view=graph) and the view's switch writes it; the nodes are the query's hits in order,
  sized by score; the query's examples (diamonds) and papers to avoid (squares) are marked;
- hovering a link shows the sentence pair behind it, hovering a hit its title (hostile markup as text, never run);
- a click opens the hit's card (title, authors, links, + More like this / Not like this, which rerun the graph with the
  paper added), a double click makes it the query; colour by year shows the years' legend;
- at 420 px the graph fits the screen, with no sideways scrolling. Screenshots land in test-artifacts/."""
from __future__ import annotations

import json
from urllib.parse import parse_qs, urlencode

import httpx

from .conftest import REPO, SAMPLE

ROWS = [json.loads(line) for line in SAMPLE.read_text().splitlines()[:30]]
QID = ROWS[0]["paper_id"]
HOSTILE = '<img src=x onerror="window.__pwned=1">Hostile'
RICH = [{"id": r["paper_id"], "title": title, "abstract": r["sentences"], "facets": r["labels"],
         "metadata": {"year": year, "authors": [f"Ada Author{i}", "Bo Writer"], "external_ids": {"doi": f"10.1000/g.{i}"}}}
        for i, (r, title, year) in enumerate(zip(ROWS[1:4], ["Gaming and learning, a study", HOSTILE, "Trust online"],
                                                 [2012, 2016, 2020]), start=1)]


def _ids(browser, selector="#graph-svg .gnode"):
    from selenium.webdriver.common.by import By

    return [g.get_attribute("data-paper-id") for g in browser.find_elements(By.CSS_SELECTOR, selector)]


def _address(browser) -> dict:
    return parse_qs(browser.execute_script("return location.hash").lstrip("#"))


def test_the_graph_view(page_server, browser):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    server = page_server
    r = httpx.post(server + "/papers", json={"records": RICH}, timeout=120)
    assert r.status_code == 200 and r.json()["errors"] == 0, r.text
    body = {"paper_id": QID, "facet": "method", "k": 29}
    want = httpx.post(server + "/graph", json=body, timeout=60).json()
    listed = httpx.post(server + "/query", json=body, timeout=60).json()
    assert [n["id"] for n in want["nodes"]] == [h["paper_id"] for h in listed["hits"]]
    wait = WebDriverWait(browser, 90)

    def shown(ids):  # the graph of this query is drawn, and the page is ready for the next
        wait.until(lambda b: _ids(b) == ids and b.find_element(By.ID, "run-query").is_enabled())

    browser.set_window_size(1440, 1100)
    browser.get(server + "/#" + urlencode([("paper", QID), ("facet", "method"), ("k", "29"), ("view", "graph")]))
    shown([n["id"] for n in want["nodes"]])
    assert browser.find_element(By.CSS_SELECTOR, '.view-btn[data-view="graph"]').get_attribute("aria-pressed") == "true"
    assert not browser.find_element(By.ID, "hits").is_displayed() and browser.find_element(By.ID, "graph-svg").is_displayed()
    radii = [float(c.get_attribute("r")) for c in browser.find_elements(By.CSS_SELECTOR, "#graph-svg .gnode circle")]
    assert radii == sorted(radii, reverse=True) and radii[0] > radii[-1]  # size by score, the hits in rank order
    assert _ids(browser, "#graph-svg .anchor-mark.example") == [QID]
    assert len(browser.find_elements(By.CSS_SELECTOR, "#graph-svg .edge")) == len(want["edges"])

    # hover a link: the sentence pair that makes it
    tip = browser.find_element(By.ID, "graph-tip")
    for line in browser.find_elements(By.CSS_SELECTOR, "#graph-svg .edge-hit"):
        ActionChains(browser).move_to_element(line).perform()
        if tip.is_displayed() and " one way, " in tip.text:
            break
    edge = next(e for e in want["edges"] if (e["source"], e["target"]) ==
                (line.get_attribute("data-source"), line.get_attribute("data-target")))
    assert edge["pair"]["source_sentence"][:60] in tip.text and edge["pair"]["target_sentence"][:60] in tip.text
    assert f"weight {edge['weight']:.3f} ({edge['band']})" in tip.text
    # hover the hit whose title is markup: shown as text, never run
    hostile = browser.find_element(By.CSS_SELECTOR, f'#graph-svg .gnode[data-paper-id="{RICH[1]["id"]}"]')
    ActionChains(browser).move_to_element(hostile).perform()
    wait.until(lambda b: HOSTILE in tip.text)
    assert browser.execute_script("return window.__pwned === undefined")

    # click: the hit's card, as the list shows it
    rich = RICH[0]
    browser.find_element(By.CSS_SELECTOR, f'#graph-svg .gnode[data-paper-id="{rich["id"]}"]').click()
    card = browser.find_element(By.ID, "graph-card")
    wait.until(lambda b: card.is_displayed() and rich["title"] in card.text)
    assert "Authors: Ada Author1, Bo Writer" in card.text and "Year: 2012" in card.text
    doi = card.find_element(By.CSS_SELECTOR, "a.ext")
    assert doi.text == "DOI" and doi.get_attribute("href") == "https://doi.org/10.1000/g.1"
    # colour by year: the years' legend
    Select(browser.find_element(By.ID, "graph-colour")).select_by_value("year")
    legend = browser.find_element(By.ID, "graph-legend")
    assert legend.find_element(By.CSS_SELECTOR, ".year-low").text == "2012"
    assert legend.find_element(By.CSS_SELECTOR, ".year-high").text == "2020" and "no year" in legend.text
    browser.save_screenshot(str(_artifact("graph-desktop.png")))

    # + More like this, then Not like this: the graph of the new query, its examples and avoided paper marked
    card.find_element(By.CSS_SELECTOR, "button.add-example").click()
    wait.until(lambda b: _address(b).get("also") == [rich["id"]] and _address(b).get("view") == ["graph"]
               and _ids(b, "#graph-svg .anchor-mark.example") == [QID, rich["id"]]
               and b.find_element(By.ID, "run-query").is_enabled())
    assert rich["id"] not in _ids(browser)
    other = RICH[2]["id"]
    browser.find_element(By.CSS_SELECTOR, f'#graph-svg .gnode[data-paper-id="{other}"]').click()
    wait.until(lambda b: card.is_displayed() and RICH[2]["title"] in card.text)
    card.find_element(By.CSS_SELECTOR, "button.add-avoid").click()
    wait.until(lambda b: _address(b).get("not") == [other] and _ids(b, "#graph-svg .anchor-mark.avoid") == [other]
               and b.find_element(By.ID, "run-query").is_enabled())
    expect = httpx.post(server + "/graph", json={"examples": [{"paper_id": QID}, {"paper_id": rich["id"]}],
                                                 "avoid": [{"paper_id": other}], "facet": "method", "k": 29}, timeout=60)
    assert _ids(browser) == [n["id"] for n in expect.json()["nodes"]]

    # a double click makes a hit the query, in the graph view
    target = _ids(browser)[1]
    ActionChains(browser).double_click(
        browser.find_element(By.CSS_SELECTOR, f'#graph-svg .gnode[data-paper-id="{target}"]')).perform()
    wait.until(lambda b: _address(b).get("paper") == [target] and _address(b).get("view") == ["graph"])
    nodes = httpx.post(server + "/graph", json={"paper_id": target, "facet": "method", "k": 29}, timeout=60).json()["nodes"]
    shown([n["id"] for n in nodes])
    # the list again: the address forgets the view, the hits show
    browser.find_element(By.CSS_SELECTOR, '.view-btn[data-view="list"]').click()
    assert "view" not in _address(browser) and browser.find_element(By.ID, "hits").is_displayed()
    assert not browser.find_element(By.ID, "graph-view").is_displayed()

    # 420 px: the graph fits, nothing scrolls sideways
    browser.set_window_size(420, 900)
    browser.get(server + "/#" + urlencode([("paper", QID), ("facet", "method"), ("k", "29"), ("view", "graph")]))
    shown([n["id"] for n in want["nodes"]])
    assert browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth + 1")
    box = browser.execute_script("return document.getElementById('graph-svg').getBoundingClientRect().toJSON()")
    assert box["width"] <= 420 and box["height"] > 300
    inside = browser.execute_script("""const s = document.getElementById('graph-svg').getBoundingClientRect();
        return [...document.querySelectorAll('#graph-svg .gnode circle')].every((c) => { const r = c.getBoundingClientRect();
        return r.left >= s.left - 1 && r.right <= s.right + 1 && r.top >= s.top - 1 && r.bottom <= s.bottom + 1; });""")
    assert inside
    browser.execute_script("document.querySelector('.results-head').scrollIntoView()")
    browser.save_screenshot(str(_artifact("graph-narrow.png")))
    severe = [e for e in browser.get_log("browser") if e["level"] == "SEVERE" and "favicon" not in e["message"]]
    assert not severe, severe


def _artifact(name: str):
    (REPO / "test-artifacts").mkdir(exist_ok=True)
    return REPO / "test-artifacts" / name
