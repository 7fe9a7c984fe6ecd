"""A watch's Atom feed (issue 37, item 3) from a real server on 127.0.0.1, parsed by a real feed parser (feedparser):
every field checked, whatever markup, control characters or XML-invalid characters the papers hold; on a private
server the feed's secret URL works, is revocable, and never reaches the access log."""
from __future__ import annotations

import json
import logging
import shutil

import httpx
import pytest

import esqbe
from esqbe.index.watches import add_watch, get_watch, revoke_feed_key, run_watches
from esqbe.server.app import create_app
from esqbe.server.options import ServeOptions

from .conftest import SAMPLE, LiveServer

feedparser = pytest.importorskip("feedparser")

QUERY = "csabstruct-train-0000"
TITLES = [
    "<script>alert('x')</script> & <b>bold</b> ]]> &amp; a study",
    "control \x1b[31mred\x1b[0m, a bell \x07, a nul \x00 and C1 \x9b2J in a title",
    "invalid XML: \ufffe \uffff \x0b \x0c \ud7ff\ue000 kept around them",
    "Plain title with unicode: Schrödinger's λ-calculus — 数学",
    "",  # no title: the entry is titled by its id
]


def _new_records(n: int) -> list[dict]:
    out = []
    for i, line in enumerate(SAMPLE.read_text().splitlines()[30 : 30 + n]):
        src = json.loads(line)
        rec = {"id": f"new-{i}", "title": TITLES[i % len(TITLES)], "abstract": src["sentences"], "facets": src["labels"]}
        rec.update(metadata={
            "year": 2020 + i, "venue": f"Venue <{i}> & \x1b co",
            "authors": [{"name": f"Ada <b>{i}</b> Lovelace\x07"}, "Alan Turing"],
            "external_ids": {"doi": f"10.1234/abc{i} <x>", "arxiv": f"2401.0000{i}"},
            "open_access_url": "javascript:alert(1)" if i % 2 else f"https://example.org/paper/{i}.pdf"})
        out.append(rec)
    return out


def _clean(text: str) -> str:
    from esqbe.server.feeds import xml_text

    return xml_text(text).strip()


@pytest.fixture(scope="module")
def watched(tmp_path_factory, index_dir_30, encoder):
    """A copy of the 30-paper index with watch `feed` (min_sim -1, k 100: every new paper matches), two runs: three
    new papers found at t=1000, two at t=2000."""
    path = tmp_path_factory.mktemp("feeds") / "ix"
    shutil.copytree(index_dir_30, path)
    records = _new_records(5)
    with esqbe.open_index(str(path), encoder=encoder, config=None) as index:
        add_watch(index, "feed", paper_id=QUERY, facet="method", min_sim=-1.0, k=100)
        for start, stop, when in ((0, 3, 1000.0), (3, 5, 2000.0)):
            src = path.parent / f"new{start}.jsonl"
            src.write_text("".join(json.dumps(r) + "\n" for r in records[start:stop]))
            assert index.index_files([str(src)]).indexed == stop - start
            assert len(run_watches(index, now=when)[0].matches) == stop - start
    return path, records


def test_the_feed_parses_and_says_every_field(watched, encoder):
    path, records = watched
    by_id = {r["id"]: r for r in records}
    with LiveServer(create_app(str(path), config=None, options=ServeOptions(host="127.0.0.1"), encoder=encoder)) as url:
        r = httpx.get(url + "/watches/feed.atom")
        assert r.status_code == 200 and r.headers["content-type"].startswith("application/atom+xml")
        assert httpx.get(url + "/watches/nope.atom").status_code == 404
        assert len(feedparser.parse(httpx.get(url + "/watches/feed.atom?limit=2").content).entries) == 2
        assert httpx.get(url + "/watches/feed.atom?limit=100000").status_code == 422
    with esqbe.open_index(str(path), config=None, create=False) as index:
        stored = {pid: p.title for pid, p in index.get(list(by_id)).items()}
    assert "<script>" in stored["new-0"] and "\x1b" in stored["new-1"] and "\ufffe" in stored["new-2"]
    feed = feedparser.parse(r.content)
    assert not feed.bozo, feed.get("bozo_exception")
    assert feed.version == "atom10" and feed.feed.title == "esqbe watch feed"
    assert [e.updated_parsed.tm_year for e in feed.entries] == [1970] * 5
    found = [e.id.rsplit(":", 1)[1] for e in feed.entries]
    assert set(found[:2]) == {"new-3", "new-4"} and set(found[2:]) == {"new-0", "new-1", "new-2"}  # newest first
    assert [e.updated for e in feed.entries] == ["1970-01-01T00:33:20Z"] * 2 + ["1970-01-01T00:16:40Z"] * 3
    for entry, pid in zip(feed.entries, found):
        rec = by_id[pid]
        assert entry.title == (_clean(stored[pid]) or pid)
        assert "\x1b" not in entry.title and "\x00" not in entry.title
        assert [a.name for a in entry.authors] == [_clean(f"Ada <b>{pid[-1]}</b> Lovelace\x07"), "Alan Turing"]
        hrefs = {link.title: link.href for link in entry.links}
        assert hrefs["DOI"] == f"https://doi.org/10.1234/abc{pid[-1]}%20%3Cx%3E"
        assert hrefs["arXiv"] == f"https://arxiv.org/abs/2401.0000{pid[-1]}"
        assert ("open access" in hrefs) == (int(pid[-1]) % 2 == 0)  # a javascript: URL is never a link
        assert not any(h.startswith("javascript") for h in hrefs.values())
        assert entry.tags[0].term == _clean(f"Venue <{pid[-1]}> & \x1b co")
        summary = entry.summary
        assert summary.startswith(f"{2020 + int(pid[-1])} · Venue <{pid[-1]}>") and "similarity " in summary
        assert "query [" in summary and "~ [" in summary
        assert any(_clean(s)[:40] in summary for s in rec["abstract"])  # a matched sentence of the paper


def test_a_private_feed_has_a_secret_url_that_is_revocable_and_never_logged(watched, encoder):
    path, _ = watched
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    access = logging.getLogger("uvicorn.access")
    handler = Keep()
    options = ServeOptions(host="127.0.0.1", token="the-bearer-token", private=True)
    with LiveServer(create_app(str(path), config=None, options=options, encoder=encoder)) as url:
        access.setLevel(logging.INFO)
        access.addHandler(handler)
        try:
            with esqbe.open_index(str(path), config=None, create=False) as index:
                key = get_watch(index, "feed").feed_key
            assert httpx.get(url + "/watches/feed.atom").status_code == 401
            assert httpx.get(url + "/watches/feed.atom?key=wrong").status_code == 401
            assert httpx.get(url + f"/watches/nope.atom?key={key}").status_code == 401  # no telling which exist
            assert httpx.get(url + "/query").status_code in (401, 405)  # the rest stays behind the token
            ok = httpx.get(url + f"/watches/feed.atom?key={key}")
            assert ok.status_code == 200 and not feedparser.parse(ok.content).bozo
            assert httpx.get(url + "/watches/feed.atom",
                             headers={"Authorization": "Bearer the-bearer-token"}).status_code == 200
            with esqbe.open_index(str(path), config=None, create=False) as index:
                new = revoke_feed_key(index, "feed")
            assert httpx.get(url + f"/watches/feed.atom?key={key}").status_code == 401
            assert httpx.get(url + f"/watches/feed.atom?key={new}").status_code == 200
        finally:
            access.removeHandler(handler)
    feed_lines = [line for line in lines if "/watches/feed.atom" in line]
    assert len(feed_lines) >= 6, lines
    assert not any(key in line or new in line for line in lines)


def test_the_page_lists_the_watches_and_their_latest_matches_in_chromium(watched, encoder, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    path, _ = watched
    with esqbe.open_index(str(path), config=None, create=False) as index:
        stored = {pid: p.title for pid, p in index.get([f"new-{i}" for i in range(5)]).items()}
    with LiveServer(create_app(str(path), config=None, options=ServeOptions(host="127.0.0.1"), encoder=encoder)) as url:
        listing = httpx.get(url + "/watches?latest=3").json()
        assert [w["name"] for w in listing] == ["feed"] and len(listing[0]["latest"]) == 3
        assert "feed_key" not in listing[0] and listing[0]["feed"] == "watches/feed.atom"
        wait = WebDriverWait(browser, 60)
        browser.get(url + "/")
        wait.until(EC.visibility_of_element_located((By.ID, "watch-panel")))
        watch = browser.find_element(By.CSS_SELECTOR, '#watch-list .watch[data-watch="feed"]')
        link = watch.find_element(By.CSS_SELECTOR, "a.watch-name")
        assert link.text == "feed" and link.get_attribute("href") == url + "/watches/feed.atom"
        assert "paper " + QUERY in watch.text and "5 found" in watch.text and "score >= -1" in watch.text
        items = watch.find_elements(By.CSS_SELECTOR, ".watch-match")
        assert len(items) == 5  # the page asks for the latest five: the newest first
        assert {i.get_attribute("data-paper-id") for i in items[:2]} == {"new-3", "new-4"}
        for item in items:  # hostile titles shown as text, never as markup
            pid = item.get_attribute("data-paper-id")
            a = item.find_element(By.TAG_NAME, "a")
            assert a.get_attribute("textContent") == (stored[pid] or pid)
            assert not item.find_elements(By.TAG_NAME, "script") and not item.find_elements(By.TAG_NAME, "b")
        first = items[0]
        first.find_element(By.TAG_NAME, "a").click()  # a match is a query paper a click away
        wait.until(EC.text_to_be_present_in_element((By.ID, "paper-id"), first.get_attribute("data-paper-id")))
        assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]


def test_watch_this_query_on_the_page_saves_a_watch_in_chromium(tmp_path, index_dir_30, encoder, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    path = tmp_path / "ix"
    shutil.copytree(index_dir_30, path)
    with LiveServer(create_app(str(path), config=None, options=ServeOptions(host="127.0.0.1"), encoder=encoder)) as url:
        bad = httpx.post(url + "/watches", json={"paper_id": QUERY, "facet": "method", "name": "../x", "min_sim": 0.5})
        assert bad.status_code == 422
        nan = httpx.post(url + "/watches", content=b'{"paper_id": "%s", "name": "x", "min_sim": NaN}' % QUERY.encode(),
                         headers={"Content-Type": "application/json"})
        assert nan.status_code == 422
        several = httpx.post(url + "/watches", json={"examples": [{"paper_id": QUERY}], "avoid": [{"paper_id": QUERY}],
                                                     "facet": "method", "name": "several", "min_sim": 0.5})
        assert several.status_code == 400 and "both an example and to avoid" in several.text  # as POST /query
        assert "several" not in httpx.get(url + "/watches").text
        wait = WebDriverWait(browser, 60)
        browser.get(url + f"/#paper={QUERY}&facet=method&k=5")
        wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, "#hits li")))
        assert browser.find_element(By.ID, "watch-panel").get_attribute("hidden") is not None  # no watches yet
        browser.find_element(By.ID, "watch-query").click()
        wait.until(EC.alert_is_present()).send_keys("page-watch")
        browser.switch_to.alert.accept()
        wait.until(EC.alert_is_present()).send_keys("0.25")
        browser.switch_to.alert.accept()
        listed = wait.until(EC.visibility_of_element_located((By.CSS_SELECTOR, '#watch-list .watch[data-watch="page-watch"]')))
        assert "paper " + QUERY in listed.text and "method" in listed.text and "score >= 0.25" in listed.text
        assert "nothing found yet" in listed.text
        info = browser.find_element(By.ID, "watch-info")
        assert "page-watch" in info.text and "watches/page-watch.atom?key=" in info.find_element(
            By.TAG_NAME, "a").get_attribute("href")
        browser.find_element(By.ID, "watch-query").click()  # the same name again: said, not saved twice
        wait.until(EC.alert_is_present()).send_keys("page-watch")
        browser.switch_to.alert.accept()
        wait.until(EC.alert_is_present()).accept()
        wait.until(EC.text_to_be_present_in_element((By.ID, "error"), "exists already"))
    with esqbe.open_index(str(path), config=None, create=False) as index:
        watch = get_watch(index, "page-watch")
    assert watch.min_score == 0.25 and watch.query["facet"] == "method" and watch.settings["k"] == 5
    assert watch.query["paper_id"] == QUERY and watch.vectors.shape[0] == len(watch.query["sentences"])
